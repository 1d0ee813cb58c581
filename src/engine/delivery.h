// How a QP's requests reach its peer, decided once for the QP when it goes
// to RTR (EngineQp::modify) rather than for every work request: the
// requester asks the QP's Delivery and never looks at the transport.
//
// - Through a socket (UDP: a peer on another host, UROCE_SHM=0, no shared
//   memory to the peer): a window of kSocketWindowPsns, bounded by the
//   congestion window (CompleterState::cwnd), and a post to an RC stream
//   waits for the next ACK to send it (coalesce_from: one system call for
//   the WQEs posted meanwhile).
// - Through the same-host shared-memory ring: a window of kWindowPsns
//   (1024 MTU packets would fill the sender's 4 MiB ring), no congestion
//   window, every post sent at once (no system call to save). Large RC
//   SEND/WRITEs may go as jumbo packets (jumbo_limit), and RC/UC WRITE/READ
//   may be placed straight into the peer's memory (placement,
//   host/direct_placement.h).
//
// The path is decided again where the engine notices that a same-host peer
// may have gone away — the transport no longer takes a jumbo to it as local
// (send_jumbo), a local ACK timeout (completer.cc) — and every kRecheckPosts
// posts (count_post), so that a peer that is gone stops holding the
// same-host choices. A stale answer costs speed, never
// correctness: packets to a peer that is gone fall back to the socket in the
// transport itself.
//
// UD QPs have no connected path (their packets go by address handle): their
// Delivery is the socket's, used for no choice.
#pragma once

#include <infiniband/verbs.h>
#include <sys/uio.h>

#include <cstdint>

#include "engine/tx_batch.h"
#include "transport/datagram.h"

namespace uroce::host {
class DirectPlacement;
}  // namespace uroce::host

namespace uroce::engine {

enum class DeliveryPath : uint8_t { kSocket, kSharedMemory };

class Delivery {
 public:
  // At most 512 unacknowledged PSNs (rxe: 128; 2 MiB at MTU 4096 keeps a
  // 5 GB/s stream going through ~400 us of ACK delay), shared by the
  // context's QPs that have requests in flight (requester.cc, window_share).
  // Through a socket 1024: eight streaming QPs then keep shares of 128 and
  // send bursts of 64 packets, one system call each, as one QP does (with
  // 512, bursts of 32: ib_write_bw 1 MiB -q 8 made 7.5 sendmmsg a MiB where
  // -q 1 made 4, its receiver 13 recvmmsg where -q 1 made 10). Through
  // shared memory the window stays 512: 1024 MTU packets would fill a
  // sender's 4 MiB ring.
  static constexpr uint32_t kWindowPsns = 512;
  static constexpr uint32_t kSocketWindowPsns = 1024;
  // A post to an RC QP with at least this many request packets
  // unacknowledged (a stream) through a socket sends nothing itself: the
  // next ACK's handling runs the requester (completer.cc, on_ack), and sends
  // the WQEs posted meanwhile in one burst — GSO messages of up to 64
  // packets, one system call — rather than one system call per post. If no
  // ACK comes, the retransmit timer that guards the packets in flight runs
  // it. A QP with fewer in flight (a ping-pong, a few requests at a time)
  // sends at once, as does one whose packets go through shared memory (no
  // system call to save, and waiting for the ACK cost 6-12 % there).
  static constexpr uint32_t kCoalescePackets = 16;
  static constexpr uint32_t kRecheckPosts = 256;

  // Decides for a QP of `type` whose connected path leads to `dst`, as
  // `transport` reaches it now, with the engine's direct `placement` (or
  // null); at RTR, or when the path changes (caller holds the QP's lock).
  void decide(transport::DatagramTransport& transport, host::DirectPlacement* placement, ibv_qp_type type,
              const transport::Endpoint& dst);

  DeliveryPath path() const { return path_; }
  bool through_memory() const { return path_ == DeliveryPath::kSharedMemory; }
  uint32_t window_psns() const { return through_memory() ? kWindowPsns : kSocketWindowPsns; }
  // Whether the congestion window bounds what is in flight.
  bool congestion_controlled() const { return !through_memory(); }
  // Packets in flight from which a post to an RC stream waits for the next
  // ACK; 0: never.
  uint32_t coalesce_from() const { return through_memory() ? 0 : kCoalescePackets; }
  // The largest jumbo payload the peer takes (0: no jumbo packets: not RC,
  // not through shared memory, or UROCE_SHM_JUMBO=0).
  uint32_t jumbo_limit() const { return jumbo_limit_; }
  // Whether the QP's packets carry their ICRC: not through shared memory
  // (RC/UC), where nothing corrupts them and the peer is a process of the
  // same user, which takes a ring's packet without checking it (~30 ns a
  // packet each way, in a same-host one-way's path). Kept where packets are
  // captured (UROCE_PCAP) or faults injected (UROCE_FAULT corrupts bytes).
  TxBatch::Icrc icrc() const { return bare_ && through_memory() ? TxBatch::Icrc::kOmit : TxBatch::Icrc::kCompute; }
  // Stores an RC responder's ACK word in the peer requester's board cell
  // (engine/ack_board.h) instead of sending an ACKNOWLEDGE packet: only
  // through shared memory and where ACKs may go bare (icrc()); false when the
  // packet must go.
  bool post_ack_word(uint32_t cell, uint64_t word) {
    return acks_on_board_ && through_memory() && transport_->post_board(dst_, cell, word);
  }
  // A record of `len` bytes for a bare packet, written in place in the peer's
  // ring (DatagramTransport::reserve_bare; data null when it cannot be: not
  // through shared memory now, or a full ring), then committed or abandoned.
  // Only where packets go bare (icrc() is kOmit).
  bool reserve_bare(const transport::IpAddress& src_ip, uint32_t len, transport::BareSlot& slot) {
    return transport_->reserve_bare(dst_, src_ip, len, slot);
  }
  void commit_bare(transport::BareSlot& slot) { transport_->commit_bare(slot); }
  void abandon_bare(transport::BareSlot& slot) { transport_->abandon_bare(slot); }
  // Same-host direct placement of WRITE/READ (RC/UC), or null.
  host::DirectPlacement* placement() const { return placement_; }

  // Sends `iov` as one jumbo packet to the peer (DatagramTransport::send_jumbo);
  // kNotLocal re-decides the path (the peer went away).
  transport::JumboSend send_jumbo(const transport::IpAddress& src_ip, const iovec* iov, unsigned iovcnt);
  // A post to the QP: every kRecheckPosts, the path is asked again.
  void count_post();
  // Asks the transport again how the peer is reached (a local ACK timeout:
  // the peer may have gone away).
  void recheck();

 private:
  transport::DatagramTransport* transport_ = nullptr;
  transport::Endpoint dst_{};
  host::DirectPlacement* placement_ = nullptr;
  DeliveryPath path_ = DeliveryPath::kSocket;
  bool jumbo_allowed_ = false;  // RC with jumbo packets configured
  bool bare_ = false;           // RC/UC, neither captured nor faulty: icrc()
  bool acks_on_board_ = false;  // RC and bare: post_ack_word
  uint32_t jumbo_limit_ = 0;
  uint32_t posts_left_ = kRecheckPosts;
};

}  // namespace uroce::engine
