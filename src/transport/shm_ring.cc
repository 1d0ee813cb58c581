#include "transport/shm_ring.h"

#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <utility>

namespace uroce::transport {

struct ShmRing::Header {
  uint64_t magic;
  uint64_t capacity;
  uint64_t stamp_key;                      // chosen by create (RecordHeader::stamp)
  alignas(64) std::atomic<uint64_t> head;  // producer
  alignas(64) std::atomic<uint64_t> tail;  // consumer
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shared between processes: the atomics must be lock-free");

// The stamp comes first and is stored last, with release, right after the
// fields: the consumer looks only at the stamp where its tail is, so the line
// that tells it a record is there is taken from the producer once, complete
// and with the record's first bytes (ring_floor: 0.17 -> 0.12 us a one-way,
// the head's line and a header written early no longer crossing on the way).
struct ShmRing::RecordHeader {
  uint64_t stamp;  // record_stamp(position) once complete, wrap_stamp(position): skip to the start
  Fields fields;
};

namespace {
constexpr uint64_t kMagic = 0x75726f63'6552696fULL;  // "urocReIo" (records stamped)

constexpr uint64_t align_up(uint64_t n) { return (n + ShmRing::kAlign - 1) & ~uint64_t(ShmRing::kAlign - 1); }

// A key unlike the one an earlier ring over the same memory had (whose
// stamps are still there).
uint64_t new_stamp_key(uint64_t old) {
  uint64_t key = 0;
  if (getrandom(&key, sizeof key, GRND_NONBLOCK) != sizeof key)
    key = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ULL;
  return key == old ? ~key : key;
}

uint64_t load_stamp(const uint8_t* at) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(at), __ATOMIC_ACQUIRE);
}
void store_stamp(uint8_t* at, uint64_t stamp) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(at), stamp, __ATOMIC_RELEASE);
}
}  // namespace

ShmRing::ShmRing(Header* h, uint8_t* data, uint32_t capacity)
    : hdr_(h), data_(data), capacity_(capacity), stamp_key_(h->stamp_key) {}

ShmRing ShmRing::create(void* mem, size_t bytes) {
  static_assert(sizeof(Header) <= kHeaderBytes);
  static_assert(sizeof(RecordHeader) % kAlign == 0);
  if (!mem || bytes < kHeaderBytes + 4096) return ShmRing();
  // Not constructed over (a placement new would also write `magic` plainly,
  // which a peer may be reading): the memory is zero or this ring's own.
  auto* h = static_cast<Header*>(mem);
  __atomic_store_n(&h->magic, uint64_t(0), __ATOMIC_RELAXED);
  uint32_t cap = uint32_t(std::min<size_t>(bytes - kHeaderBytes, 1u << 30) & ~size_t(kAlign - 1));
  h->capacity = cap;
  h->stamp_key = new_stamp_key(h->stamp_key);
  h->head.store(0, std::memory_order_relaxed);
  h->tail.store(0, std::memory_order_relaxed);
  __atomic_store_n(&h->magic, kMagic, __ATOMIC_RELEASE);  // last: the ring is laid out
  return ShmRing(h, static_cast<uint8_t*>(mem) + kHeaderBytes, cap);
}

ShmRing ShmRing::attach(void* mem, size_t bytes) {
  if (!mem || bytes < kHeaderBytes + 4096) return ShmRing();
  auto* h = static_cast<Header*>(mem);
  uint32_t cap = uint32_t(std::min<size_t>(bytes - kHeaderBytes, 1u << 30) & ~size_t(kAlign - 1));
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kMagic || h->capacity != cap) return ShmRing();
  ShmRing r(h, static_cast<uint8_t*>(mem) + kHeaderBytes, cap);
  r.head_ = h->head.load(std::memory_order_acquire);
  r.tail_ = h->tail.load(std::memory_order_acquire);
  if (r.head_ % kAlign || r.tail_ % kAlign || r.head_ - r.tail_ > cap) r.corrupt_ = true;
  r.head_off_ = uint32_t(r.head_ % cap);
  r.tail_off_ = uint32_t(r.tail_ % cap);
  return r;
}

bool ShmRing::push(const Meta& meta, const uint8_t* const* parts, const uint32_t* part_lens, unsigned nparts,
                   uint32_t align_at) {
  uint64_t len = 0;
  for (unsigned i = 0; i < nparts; ++i) len += part_lens[i];
  uint8_t* p = len <= max_record() ? reserve(meta, uint32_t(len), align_at) : nullptr;
  if (!p) return false;
  for (unsigned i = 0; i < nparts; ++i) {
    if (part_lens[i] == 0) continue;  // an empty part may have no address
    std::memcpy(p, parts[i], part_lens[i]);
    p += part_lens[i];
  }
  publish();
  return true;
}

uint8_t* ShmRing::reserve(const Meta& meta, uint32_t len, uint32_t align_at) {
  if (!hdr_ || corrupt_ || len > max_record()) return nullptr;
  // Where the record would start, and the pad that puts its byte `align_at`
  // on a cache line (a copy into the ring then stores whole lines).
  auto pad_at = [&](const uint8_t* where) -> uint32_t {
    if (align_at == kNoAlign) return 0;
    uint64_t addr = reinterpret_cast<uintptr_t>(where) + sizeof(RecordHeader) + align_at;
    return uint32_t((kLineBytes - addr % kLineBytes) % kLineBytes);
  };
  uint32_t pad = pad_at(head_at());
  uint64_t need = sizeof(RecordHeader) + align_up(pad + len);
  uint64_t to_end = capacity_ - head_off_;
  uint64_t wrap = to_end < need ? to_end : 0;  // a record never straddles the end
  if (wrap) {
    pad = pad_at(data_);  // the record starts the data again
    need = sizeof(RecordHeader) + align_up(pad + len);
  }
  if (!room_for(wrap + need)) return nullptr;
  if (wrap) {
    // to_end >= 8 always (positions are 8-aligned): room for the marker's
    // stamp. Stamped by publish(); a reservation dropped leaves the next
    // record after the marker, which is then published with it.
    stamp_marker();  // (an earlier dropped reservation's: it comes first)
    marker_at_ = head_at();
    marker_pos_ = head_;
    advance(head_, head_off_, wrap);
  }
  uint8_t* p = head_at();
  pending_ = {len, pad, meta};
  reserved_ = need;
  return p + sizeof(RecordHeader) + pad;
}

void ShmRing::stamp_marker() {
  if (!marker_at_) return;
  store_stamp(marker_at_, wrap_stamp(marker_pos_));
  marker_at_ = nullptr;
}

// The consumer's tail is read only when the one last read leaves too little
// room (or was never read): its line then stays with the consumer, which
// writes it after every record, instead of crossing to this core at every
// push (a cache miss in each same-host message's path).
bool ShmRing::room_for(uint64_t need) {
  if (tail_read_ && capacity_ - (head_ - tail_seen_) >= need) return true;
  uint64_t tail = hdr_->tail.load(std::memory_order_acquire);
  if (tail % kAlign || tail > head_ || head_ - tail > capacity_ || tail < tail_seen_) {
    corrupt_ = true;
    return false;
  }
  tail_seen_ = tail;
  tail_read_ = true;
  return capacity_ - (head_ - tail) >= need;
}

void ShmRing::publish() {
  stamp_marker();
  // The header's words, then its stamp: stored together, so that the line
  // the consumer watches is taken from it once, complete.
  uint8_t* p = head_at();
  std::memcpy(p + sizeof(uint64_t), &pending_, sizeof pending_);
  store_stamp(p, record_stamp(head_));
  advance(head_, head_off_, std::exchange(reserved_, 0));
  // seq_cst (not only release): a consumer about to block announces it, then
  // looks at the head; a producer stores the head, then looks for that
  // announcement (ShmTransport) — one of the two sees the other.
  hdr_->head.store(head_, std::memory_order_seq_cst);
}

bool ShmRing::peek(Record* r) {
  if (!hdr_ || corrupt_) return false;
  for (;;) {
    uint64_t stamp = load_stamp(tail_at());
    uint64_t to_end = capacity_ - tail_off_;
    if (stamp == wrap_stamp(tail_)) {  // skip to the start
      advance(tail_, tail_off_, to_end);
      hdr_->tail.store(tail_, std::memory_order_release);
      continue;
    }
    if (stamp != record_stamp(tail_)) return false;
    RecordHeader rh;
    std::memcpy(&rh, tail_at(), sizeof rh);  // a local copy: checked, then used
    uint64_t need = sizeof(RecordHeader) + align_up(uint64_t(rh.fields.pad) + rh.fields.len);
    if (rh.fields.len > max_record() || rh.fields.pad >= kLineBytes || need > to_end) {
      corrupt_ = true;
      return false;
    }
    r->data = tail_at() + sizeof(RecordHeader) + rh.fields.pad;
    r->len = rh.fields.len;
    r->meta = rh.fields.meta;
    peeked_ = uint32_t(need);
    return true;
  }
}

void ShmRing::pop() {
  if (!peeked_) return;
  advance(tail_, tail_off_, std::exchange(peeked_, 0));
  hdr_->tail.store(tail_, std::memory_order_release);
}

bool ShmRing::has_records(const void* mem) {
  const auto* h = static_cast<const Header*>(mem);
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kMagic) return false;
  return h->head.load(std::memory_order_seq_cst) != h->tail.load(std::memory_order_seq_cst);
}

bool ShmRing::empty_seq_cst() const { return !hdr_ || corrupt_ || hdr_->head.load(std::memory_order_seq_cst) == tail_; }

}  // namespace uroce::transport
