// A ring of datagrams in memory shared by two processes: the building block of
// the same-host path (design §3: traffic between processes of one host does
// not go through UDP). One producer and one consumer; the ring knows nothing
// of RDMA and nothing of the segment it lives in.
//
// Layout: a 256-byte header, then `capacity` bytes of records. A record is an
// 8-byte-aligned RecordHeader (a stamp, then the record's length, pad and
// Meta) followed by its pad (so that a chosen byte of the record starts a
// cache line; usually none) and its bytes; a record that would not fit before
// the end of the data area is preceded by a wrap marker (a stamp alone) and
// starts at offset 0.
//
// Lock and memory-order contract (like rdma-core's rxe_queue.h, with the
// consumer watching the record's own line instead of the producer's index):
// - A record's stamp is written only by the producer, last, with release:
//   its header's fields and then its stamp are stored together by publish(),
//   after the record's bytes. The consumer loads the stamp at its tail with
//   acquire; the record is there when the stamp names that position
//   (record_stamp), and a wrap marker when it names it as one (wrap_stamp).
// - head (bytes produced) is written only by the producer, with seq_cst
//   after the stamp (a release, and ordered before the producer's look at
//   whether the consumer waits); only has_records and empty_seq_cst read it
//   (a consumer about to block, and threads without the receive turn).
// - tail (bytes consumed) is written only by the consumer, with release after
//   it is done with the record; the producer reads it with acquire, and only
//   when the tail it read last leaves too little room for a record.
// - Neither side trusts the other's words: a tail that is not 8-aligned,
//   moves backwards or claims more than the capacity, and a record whose
//   length or pad does not fit, mark the ring corrupt on the side that saw
//   it, which then stops using it. No read or write ever leaves the data area
//   (every offset is taken modulo the capacity this side was given, never the
//   one in shared memory).
// - Record bytes may still be changed by a misbehaving peer while they are
//   read: a consumer copies what it must check before it checks it.
// Producer and consumer each need their own lock if several threads use one
// side.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace uroce::transport {

class ShmRing {
 public:
  static constexpr size_t kHeaderBytes = 256;
  static constexpr uint32_t kAlign = 8;
  static constexpr uint32_t kLineBytes = 64;
  static constexpr uint32_t kNoAlign = 0xFFFFFFFF;

  // What a record carries besides its bytes (the datagram's addressing).
  struct Meta {
    uint32_t src_ip = 0;
    uint32_t dst_ip = 0;
    uint16_t src_port = 0;
    uint16_t dst_port = 0;
    uint16_t ip_id = 0;  // the IP identification its ICRC was computed with
    uint16_t flags = 0;  // ShmTransport's record kinds (kJumboRecord)
  };
  struct Record {
    const uint8_t* data = nullptr;  // in shared memory
    uint32_t len = 0;
    Meta meta;
  };

  ShmRing() = default;
  // Lays out an empty ring over `bytes` bytes at `mem` (the creator; the
  // memory is zero or the ring's own).
  static ShmRing create(void* mem, size_t bytes);
  // Attaches to a ring that `create` laid out over the same `bytes`; an
  // invalid ring (nullptr mem, bad magic or size) when it is not one.
  static ShmRing attach(void* mem, size_t bytes);
  bool valid() const { return hdr_ != nullptr; }
  bool corrupt() const { return corrupt_; }
  uint32_t capacity() const { return capacity_; }
  // The largest record len a ring of this capacity takes.
  uint32_t max_record() const { return capacity_ / 4; }

  // Producer: copies `len` bytes gathered from `parts` (lengths `part_lens`)
  // as one record; false when the ring has no room now (or is corrupt, or the
  // record is larger than max_record). With `align_at`, the record's byte
  // align_at lands on a kLineBytes boundary (the record is preceded by up to
  // kLineBytes - 1 bytes of pad, which its header records).
  bool push(const Meta& meta, const uint8_t* const* parts, const uint32_t* part_lens, unsigned nparts,
            uint32_t align_at = kNoAlign);

  // Producer, in two steps: a record of `len` bytes written in place.
  // reserve returns where its bytes go (null when push would return false);
  // publish() writes its header and stamp, and the consumer sees nothing of
  // it before. A reservation not published is dropped: the next reserve
  // takes its room.
  uint8_t* reserve(const Meta& meta, uint32_t len, uint32_t align_at = kNoAlign);
  void publish();
  // Consumer: the oldest record, false when there is none (or the ring is
  // corrupt). `r.data` stays valid until pop().
  bool peek(Record* r);
  void pop();
  // Consumer: whether a record is there (seq_cst: for a consumer that has
  // just announced it is about to block, see ShmTransport::wait).
  bool empty_seq_cst() const;
  // Whether the ring laid out at `mem` holds records, from its shared words
  // alone (any thread; a hint: a corrupt ring may say yes).
  static bool has_records(const void* mem);

 private:
  struct Header;
  struct RecordHeader;
  struct Fields {  // a record header's, after its stamp
    uint32_t len;  // the record's bytes
    uint32_t pad;  // bytes between the header and the record's (< kLineBytes)
    Meta meta;
  };
  ShmRing(Header* h, uint8_t* data, uint32_t capacity);  // (takes the header's stamp key)
  // Where the producer's or the consumer's position lies in the data (the
  // positions count bytes from the ring's creation; the offsets are kept
  // beside them, so that no push or peek divides by the capacity).
  uint8_t* head_at() const { return data_ + head_off_; }
  uint8_t* tail_at() const { return data_ + tail_off_; }
  // `pos` advanced by `n` (n <= capacity_ - off: records never straddle the end).
  void advance(uint64_t& pos, uint32_t& off, uint64_t n) {
    pos += n;
    off += uint32_t(n);
    if (off >= capacity_) off -= capacity_;
  }
  bool room_for(uint64_t need);  // producer: `need` bytes free from head_ on
  void stamp_marker();           // producer: the reserved wrap marker's stamp, if any
  // A record's stamp names its position (8-aligned: bits 0-2 say which kind),
  // under the ring's key: zero memory, a stamp of an earlier lap or ring and,
  // but with odds of 2^-64, a payload's bytes left where a header now starts
  // are never the stamp the consumer waits for.
  uint64_t record_stamp(uint64_t pos) const { return (pos | 1) ^ stamp_key_; }
  uint64_t wrap_stamp(uint64_t pos) const { return (pos | 3) ^ stamp_key_; }

  Header* hdr_ = nullptr;
  uint8_t* data_ = nullptr;
  uint32_t capacity_ = 0;
  uint64_t stamp_key_ = 0;  // the header's, read once
  bool corrupt_ = false;
  // The producer's and the consumer's own positions (authoritative for
  // their side; the shared words only publish them).
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
  uint32_t head_off_ = 0;  // head_ % capacity_
  uint32_t tail_off_ = 0;  // tail_ % capacity_
  // The producer's last read of the shared tail (a lower bound of the
  // consumer's: room it shows is there).
  uint64_t tail_seen_ = 0;
  bool tail_read_ = false;
  uint64_t reserved_ = 0;  // bytes the reserved record takes (publish adds them to head_)
  uint32_t peeked_ = 0;    // bytes the record returned by peek() occupies (0: none)
  // A wrap marker reserved and not yet stamped (publish stamps it).
  uint8_t* marker_at_ = nullptr;
  uint64_t marker_pos_ = 0;
  Fields pending_{};  // the reserved record's header, written by publish()
};

}  // namespace uroce::transport
