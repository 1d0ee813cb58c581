// A burst of outgoing packets under construction (one per thread).
//
// Packets are built one after the other in one buffer (the arena): headers
// in place, then the payload, then pad and ICRC, the next packet right
// behind. flush() hands the burst to the transport in one call, each GSO
// message gathered from as few buffers as its bytes allow — one when they
// all lie in the arena; every transport has copied the bytes when it
// returns. Nothing here allocates after construction.
//
// Payload from registered memory is copied into the arena. Through shared
// memory, inside a ReferenceScope, a piece of at least kMinReference bytes
// is referenced where it lies instead, and the packet is gathered from the
// arena and the region (the ring's copy is then the only one). The scope's
// end flushes such packets, and it ends before the MR table's lock is
// released, so a region deregistered after that is never read (the MR
// lifetime rule, core/mr.h). On-demand-paging regions, and pages made
// unreadable after registration, are always copied (core/mr_access.h: only
// the fault-tolerant copy may read them). Through a
// socket payload is always copied: the kernel's copy from a gather list
// costs per buffer, far more than copying here (measured with UDP GSO on
// loopback, 15 segments of 4124 bytes a message: one buffer 12.1 GB/s, one
// per segment 7.5, three per segment 7.5, copied here into one 10.3).
//
// GSO: consecutive packets to the same destination whose lengths allow it
// (all equal, the last possibly shorter; at most 64 and 64 KiB) form one GSO
// message, which the kernel sends as one datagram per packet. Packet k of a
// message gets its ICRC computed with IP identification k, the one it carries
// on the wire if the message is split (wire/icrc.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "transport/datagram.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace uroce::core {
struct Mr;
}

namespace uroce::engine {

class TxBatch {
 public:
  static constexpr unsigned kMaxPackets = 64;
  static constexpr unsigned kMaxHeader = 64;
  // Largest payload of one datagram: a path MTU of 4096, or a relayed XRC
  // request (a whole received datagram) of up to the transport's 9216 bytes.
  static constexpr unsigned kMaxPayload = 9216;
  static constexpr unsigned kMaxPacketBytes = kMaxHeader + kMaxPayload + 8;  // + pad + ICRC
  // Referenced rather than copied from this size on, through shared memory.
  static constexpr uint32_t kMinReference = 1024;
  // A packet's first payload piece from registered memory of this size or
  // more is stored into the arena by the ICRC's pass over the packet
  // (wire::CopyIn: the payload is read once, not copied and then read again).
  // That pass comes in end_packet, which the caller reaches under the same
  // MR table lock as add_payload_from (the lifetime rule).
  static constexpr uint32_t kMinDeferredCopy = 256;
  static_assert(kMinReference >= kMinDeferredCopy, "add_payload_from probes a piece read in place at this size on");

  // While one lives, add_payload_from may reference registered memory; its
  // end flushes the packets that do. Declare it after the guard of the MR
  // table's lock, so that it ends first (see above).
  class ReferenceScope {
   public:
    explicit ReferenceScope(TxBatch& tx) : tx_(tx), outer_(tx.references_ok_) { tx.references_ok_ = true; }
    ~ReferenceScope() {
      if (tx_.referenced_) tx_.flush();
      tx_.references_ok_ = outer_;
    }
    ReferenceScope(const ReferenceScope&) = delete;
    ReferenceScope& operator=(const ReferenceScope&) = delete;

   private:
    TxBatch& tx_;
    bool outer_;
  };

  // Open while a receive turn processes a burst (EngineContext::process_burst),
  // which flushes at its end: until then the requester may leave a stream's
  // packets pending (requester_run), so that the bursts that several QPs'
  // ACKs release leave in one system call, not one each.
  class BurstScope {
   public:
    explicit BurstScope(TxBatch& tx) : tx_(tx), outer_(tx.in_burst_) { tx.in_burst_ = true; }
    ~BurstScope() { tx_.in_burst_ = outer_; }
    BurstScope(const BurstScope&) = delete;
    BurstScope& operator=(const BurstScope&) = delete;

   private:
    TxBatch& tx_;
    bool outer_;
  };

  TxBatch();

  // The calling thread's batch. Once the thread's own is destroyed (a thread
  // that calls exit() destroys its thread_local objects before the exit
  // handlers run, and those may still send: send_acks_at_exit), a batch kept
  // for the rest of the process's life, for the exiting thread.
  static TxBatch& local();

  // Flushes pending packets first if they belong to another transport.
  void use(transport::DatagramTransport* t);

  // Whether a packet gets its ICRC: always, but for a connected QP's
  // packets to a peer reached through the same-host ring (Delivery::icrc),
  // which go bare (transport::TxDatagram::bare): its room is left zero.
  enum class Icrc : uint8_t { kCompute, kOmit };
  // Starts a packet of `header_len` bytes (BTH + extended headers) to `dst`,
  // returned zeroed for the caller to fill. Flushes first when the batch is
  // full.
  uint8_t* begin_packet(const transport::Endpoint& dst, const transport::IpAddress& src_ip, unsigned header_len);
  // The same, for a packet whose ending (`icrc`, as end_packet will be
  // given it) and payload length are known at its start. One that goes bare
  // (Icrc::kOmit) is built in place in the peer's ring when the batch is
  // empty and the transport has room for it there
  // (DatagramTransport::reserve_bare), and leaves at end_packet, with no copy
  // and no flush (the same-host one-way: docs/architecture.md, "The floors
  // under a one-way"). Until its end or abort the ring is locked: nothing
  // else may be sent from this thread in between.
  uint8_t* begin_packet(const transport::Endpoint& dst, const transport::IpAddress& src_ip, unsigned header_len,
                        Icrc icrc, uint32_t payload_len);
  // Appends (copies) payload. False, and the packet is dropped at its end,
  // when it would exceed kMaxPayload (in place: the length it was begun with).
  bool add_payload(const uint8_t* data, uint32_t len);
  // Appends payload read from registered memory `mr`, copied or referenced
  // (above). False if the memory cannot be read; the caller then abandons the
  // packet.
  bool add_payload_from(const core::Mr& mr, const uint8_t* data, uint32_t len);
  // Pads the payload to 4 bytes (PadCnt in the BTH must already say so) and
  // appends the ICRC computed for `flow`. Returns the packet's length (0:
  // dropped, the batch had no room).
  uint32_t end_packet(const wire::IpFlow& flow, Icrc icrc = Icrc::kCompute);
  // Ends the packet as it is: no pad, no ICRC (uroce-internal datagrams).
  void end_datagram();
  // Drops the packet begun last (nothing of it is sent).
  void abort_packet() {
    if (in_place_.data) transport_->abandon_bare(in_place_);
  }

  void flush();
  unsigned pending() const { return count_; }
  // Whether the transport takes GSO messages (of more than one packet).
  bool gso() const { return max_segments_ > 1; }
  bool references_memory() const { return referenced_; }
  bool in_burst() const { return in_burst_; }

 private:
  // Packets [first, first + count) to one destination, sent as one datagram
  // (count 1) or one GSO message of `segment`-byte segments, gathered from
  // the pieces from first_piece on.
  struct Run {
    transport::Endpoint dst;
    transport::IpAddress src_ip;
    unsigned first;
    unsigned first_piece;
    unsigned pieces;
    unsigned count;
    uint32_t segment;
    uint32_t bytes;
    bool open;  // a further packet of `segment` bytes or fewer may join
    bool bare;  // its packets carry no ICRC
  };

  // The packet being built: in a ring (begin_packet with Icrc::kOmit), or in the arena.
  uint8_t* packet() { return in_place_.data ? in_place_.data : arena_.get() + arena_used_; }
  // A packet's header (zeroed, at `h`) and state, wherever it is built.
  uint8_t* start_packet(uint8_t* h, const transport::Endpoint& dst, const transport::IpAddress& src_ip,
                        unsigned header_len, uint32_t payload_limit);
  // The in-place packet's payload (copied now) and end (the pad and the
  // ICRC's zeroed room).
  bool add_in_place(const core::Mr* mr, const uint8_t* data, uint32_t len);
  uint32_t end_in_place();
  // Places the packet being built (`len` bytes) in a run; returns its index
  // in the run (its IP identification). `joinable`: false for datagrams that
  // must go alone.
  unsigned place(uint32_t len, bool joinable, bool bare = false);
  void finish();
  // Whether `len` more payload bytes fit the packet (payload_limit_); if
  // not, it is dropped at its end.
  bool room_for_payload(uint32_t len);
  // Appends `len` bytes just written at the packet's end in the arena to its
  // pieces.
  void grow_arena_piece(uint32_t len);
  // Whether payload to `dst` may be referenced: through shared memory (asked
  // of the transport once per destination and flush).
  bool may_reference(const transport::Endpoint& dst);
  // Joins the pieces of run `r` that lie one after the other in memory.
  void coalesce(Run& r);
  // Stores the packet's deferred payload copy now (no ICRC pass to do it).
  void store_deferred_copy();
  // Segments a GSO message may have: the transport's limit, within the IP
  // identifications a receiver tries (wire::kMaxGsoIpId).
  void refresh_gso_limit();

  transport::DatagramTransport* transport_ = nullptr;
  unsigned max_segments_ = 1;  // the transport's GSO limit
  unsigned count_ = 0;
  unsigned header_len_ = 0;     // of the packet being built
  uint32_t payload_len_ = 0;    // of the packet being built
  size_t arena_used_ = 0;       // bytes of the finished packets in the arena
  uint32_t packet_used_ = 0;    // bytes of the packet being built in the arena
  unsigned first_piece_ = 0;    // of the packet being built
  unsigned piece_count_ = 0;    // pieces of the finished packets and the one being built
  unsigned done_pieces_ = 0;    // pieces of the finished packets
  bool references_ok_ = false;  // a ReferenceScope is open
  bool referenced_ = false;     // a pending packet references registered memory
  bool in_burst_ = false;       // a BurstScope is open
  bool memory_known_ = false;   // memory_dst_ and memory_path_ answer for this flush
  bool memory_path_ = false;    // memory_dst_ is reached through shared memory
  transport::Endpoint memory_dst_;
  wire::CopyIn copy_;                     // the packet's payload copy left to the ICRC's pass (src null: none)
  bool overflow_ = false;                 // the packet being built is dropped at its end
  transport::Endpoint dst_;               // of the packet being built
  transport::IpAddress src_ip_;           // of the packet being built
  transport::BareSlot in_place_;          // the packet being built in a ring (data null: none)
  uint32_t payload_limit_ = kMaxPayload;  // of the packet being built (in place: its reserved length)
  unsigned run_count_ = 0;
  std::array<Run, kMaxPackets> runs_;
  std::array<iovec, kMaxPackets * transport::kMaxPacketPieces> pieces_;
  std::array<transport::TxDatagram, kMaxPackets> datagrams_;  // one per run, at flush
  std::unique_ptr<uint8_t[]> arena_;                          // kMaxPackets * kMaxPacketBytes
};

}  // namespace uroce::engine
