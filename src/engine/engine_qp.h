// The engine's view of a QP: the verbs-level core::Qp plus the state of the
// three IBA roles acting on it (design §5). Each role owns its own state
// struct; the only cross-role signals are the explicit calls declared in
// roles.h (the completer's requests to the requester all go through
// RequesterLink; the timers in QpTimers are the completer's).
//
// Lock contract: everything here is guarded by core::Qp::mu.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <type_traits>

#include "core/limits.h"
#include "core/qp.h"
#include "engine/clock.h"
#include "engine/delivery.h"
#include "engine/live_counters.h"
#include "engine/mailbox.h"
#include "transport/datagram.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace uroce::engine {

class EngineContext;
struct XrcTarget;

// The transport service of a QP type's packets (the opcode's upper bits).
inline wire::Service service_of_qp(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_UC:
      return wire::Service::kUc;
    case IBV_QPT_UD:
      return wire::Service::kUd;
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV:
      return wire::Service::kXrc;
    default:
      return wire::Service::kRc;
  }
}

// The opcode of operation `op` in the service of a QP type (XRC responses,
// like RC ones, carry no XRCETH: the opcode table says which headers follow).
inline uint8_t opcode_of_qp(ibv_qp_type t, wire::Operation op) { return wire::make_opcode(service_of_qp(t), op); }

// RC and XRC are the reliable services: ACKs, retransmission, duplicate
// detection (IBA 9.7); UC and UD are not.
inline bool is_reliable(ibv_qp_type t) { return t == IBV_QPT_RC || t == IBV_QPT_XRC_SEND || t == IBV_QPT_XRC_RECV; }

// Where the QP's packets go (RC/UC: fixed at RTR from the address vector).
struct Path {
  transport::Endpoint dst;
  transport::IpAddress src_ip;
  uint32_t mtu = 1024;
  wire::IpFlow flow;  // for the ICRC of packets we send on this path
};

// The path of a connected QP with attributes `attr` (at RTR: the address
// vector, destination QP and path MTU), as context `ctx` sends on it.
Path resolve_connected_path(EngineContext& ctx, const ibv_qp_attr& attr);

struct RequesterState {
  uint32_t index = 0;   // SQ index of the WQE being transmitted
  uint32_t offset = 0;  // bytes of that WQE already packetized
  uint32_t psn = 0;     // PSN of the next packet
  // One past the newest PSN ever sent (a rewind does not lower it): responses
  // for PSNs from here on answer nothing we sent — ghosts (completer.cc).
  uint32_t psn_end = 0;
  uint32_t pkts_since_ack_req = 0;
  // AckReq on every this many packets of a message at least: half the QP's
  // share of the window (at most 64), so that an ACK is on its way back
  // before the window is full (requester.cc, send_burst).
  uint32_t ack_req_every = 64;
  uint32_t reads_outstanding = 0;  // READ WQEs started and not completed (RequesterLink::read_done)
  // READ and atomic requests sent and not yet answered in full, which
  // max_rd_atomic bounds: each part of a READ is one (send_read_request).
  uint32_t read_requests = 0;
  bool counted_sending = false;  // counted in EngineContext::senders()
  bool single_packet = false;    // RequesterLink::resend_one: the run sends one packet
  bool jumbo_sent = false;       // by the current post (requester_after_post)
};

// The congestion window of a path through a socket, in PSNs (completer.cc,
// grow_window / shrink_window): it starts at rxe's window (128), grows by
// the PSNs acknowledged up to kMaxCwnd while nothing is lost (slow start
// below ssthresh, then about one PSN per window), and halves — once per
// window of loss, and again when a resent packet is lost — on a sequence NAK
// or a local ACK timeout, to kMinCwnd at least; a local ACK timeout then
// restarts it from kLossWindow (completer.cc, collapse_window). The requester
// sends at most min(its share of the window, cwnd).
inline constexpr uint32_t kInitialCwnd = 128;
inline constexpr uint32_t kMinCwnd = 32;
inline constexpr uint32_t kMaxCwnd = 1024;
inline constexpr uint32_t kLossWindow = 1;

// The round-trip sample in flight: a new (never resent) packet with AckReq,
// timed until its acknowledgement. The requester starts and stamps it
// (requester.cc), the completer ends it into srtt (sample_rtt), a rewind
// discards it (Karn: a resent packet's ACK times nothing).
struct RttSample {
  bool active = false;
  bool unstamped = false;  // started by this post: requester_run stamps `sent` once it is built
  uint32_t psn = 0;
  Clock::time_point sent{};
};

// A local ACK timeout's resend, [psn, end), while the requester holds after
// it, and what the timeout changed, until an answer tells whether the
// originals were lost or only late (completer.cc, undo_spurious_timeout).
struct TimeoutUndo {
  bool open = false;            // the requester sends nothing from `end` on
  bool answered_alone = false;  // a SEND/WRITE packet: its own ACK says the rest was lost
  uint32_t psn = 0;
  uint32_t end = 0;
  uint32_t cwnd = 0;
  uint32_t ssthresh = 0;
  bool recovering = false;
  RttSample rtt;  // the sample the resend discarded (Karn), good again if undone
};

struct CompleterState {
  uint32_t unacked_psn = 0;  // oldest PSN not yet acknowledged
  uint32_t read_offset = 0;  // bytes of the oldest READ already scattered
  uint8_t retry_left = 0;
  uint8_t rnr_retry_left = 0;
  bool rewound = false;  // go-back-N already requested for unacked_psn
  uint32_t cwnd = kInitialCwnd;
  uint32_t ssthresh = kMaxCwnd;
  uint32_t cwnd_credit = 0;  // PSNs acknowledged towards the next +1 above ssthresh
  uint32_t recover_psn = 0;  // a loss before this PSN does not shrink the window again
  uint32_t nak_psn = 0;      // the last sequence NAK's (completer.cc, shrink_window_on_nak)
  bool recovering = false;
  TimeoutUndo timeout;
};

// A saved READ (or, later, ATOMIC) context for duplicate replay (C9-110; the
// responder keeps max_dest_rd_atomic of them, as rxe's resp.resources).
struct ResponderResource {
  bool valid = false;
  uint32_t first_psn = 0;
  uint32_t last_psn = 0;
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
  bool atomic = false;  // an atomic's saved result, replayed for its duplicates
  uint64_t orig = 0;
};

enum class InMessage : uint8_t { kNone, kSend, kWrite };

// A READ response stream not yet sent in full. The responder produces READ
// responses in bounded slices (responder_send_reads), interleaved with other
// work, so a large READ never holds the QP or the MR table for the whole
// message; the streams of one QP go out in request (PSN) order.
struct ReadJob {
  uint32_t psn = 0;  // PSN of the READ request = of its first response
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
  uint32_t sent = 0;  // bytes already sent
};

// Trivially copyable (fixed arrays, no pointers): an XRC target QP keeps it in
// the XRC domain's shared memory (xrc_domain.h), where whichever process owns
// the addressed SRQ runs the responder on it.
struct ResponderState {
  uint32_t epsn = 0;      // expected PSN
  uint32_t msn = 0;       // messages completed
  bool nak_sent = false;  // one sequence NAK per gap (as rxe's sent_psn_nak)
  InMessage in_message = InMessage::kNone;
  bool have_rwqe = false;  // receive WQE taken for the current message
  uint32_t recv_offset = 0;
  core::RecvWqe srq_wqe;  // QPs on an SRQ: the WQE taken from it
  uint32_t srq_num = 0;   // XRC: the SRQ that WQE came from
  std::array<core::Sge, core::kMaxSrqSge> srq_sges{};
  uint64_t write_va = 0;
  uint32_t write_rkey = 0;
  uint32_t write_remaining = 0;
  uint32_t write_length = 0;
  bool ack_pending = false;  // coalesced ACK to send at the end of the burst
  uint32_t ack_psn = 0;
  // The pending ACK covers a message that completed a receive WQE (SEND,
  // WRITE with immediate): ACK before completion, so it leaves before any
  // reply the application posts (requester_run).
  bool ack_covers_receive = false;
  uint32_t sq_posted_seen = 0;  // the send queue's post count at the last burst of requests
  std::array<ResponderResource, core::kMaxRdAtomic> resource_slots{};
  uint32_t resource_count = 1;  // max_dest_rd_atomic (at least 1), set at RTR
  uint32_t next_resource = 0;
  // READ response streams still to send, oldest first (a ring of
  // resource_count: one per READ the requester may have outstanding).
  std::array<ReadJob, core::kMaxRdAtomic> read_jobs{};
  uint32_t read_head = 0;
  uint32_t read_count = 0;

  std::span<ResponderResource> resources() { return {resource_slots.data(), resource_count}; }
};
static_assert(std::is_trivially_copyable_v<ResponderState>);

// The shortest wait before a tail-loss probe, and how far a QP raises it
// when its probes turn out spurious (completer.cc, note_spurious_probe).
inline constexpr Clock::duration kFirstProbeInterval = std::chrono::milliseconds(2);
inline constexpr Clock::duration kMaxProbeFloor = std::chrono::milliseconds(64);

struct QpTimers {
  bool retransmit_armed = false;            // QpTimers: written by completer.cc only (roles.h), reset with the QP
  Clock::time_point retransmit_deadline{};  // local ACK timeout (IBA 9.7.6.1.3)
  // RNR NAK received (IBA 9.7.5.2.8): the requester pauses until rnr_deadline.
  bool rnr_armed = false;
  Clock::time_point rnr_deadline{};
  // Tail-loss probe: the newest packet is resent well before the local ACK
  // timeout when nothing was acknowledged for a while (the lost packet was the
  // last one, or its ACK/NAK was lost); see probe_tail in completer.cc. Probes
  // do not use up retry_cnt. The interval doubles until progress.
  Clock::time_point probe_deadline{};
  Clock::duration probe_interval{};
  unsigned probes = 0;  // probes since the last progress
  // The first probe's floor: kFirstProbeInterval, doubled (up to
  // kMaxProbeFloor) each time a probe proves spurious: a second ACK covers
  // the probed PSN, so both the original and the probe had arrived. A peer
  // that answers in bursts milliseconds apart (the kernel's rxe in a paused
  // guest) is then waited for; on a lossy link probes find real losses and
  // the floor stays low. `probe_psn` is the last probe's PSN while no
  // duplicate answer to it has been seen (`probe_open`).
  Clock::duration probe_floor = kFirstProbeInterval;
  uint32_t probe_psn = 0;
  bool probe_open = false;
  // Smoothed round trip from request to acknowledgement and its mean
  // deviation (0: no sample yet). The first probe waits
  // max(probe_floor, 3 x srtt, srtt + 4 x rttvar): when a peer's ACKs
  // queue behind a deep socket buffer (many QPs streaming at once) or a peer
  // answers at a varying pace, a fixed 2 ms would resend data that is only late.
  Clock::duration srtt{};
  Clock::duration rttvar{};
  RttSample rtt;
  unsigned backoff = 0;  // local ACK timeouts since the last progress (completer.cc, ack_timer_length)
};

inline Clock::duration first_probe_interval(const QpTimers& t) {
  return std::max({t.probe_floor, 3 * t.srtt, t.srtt + 4 * t.rttvar});
}

// Progress (or a first outstanding request): the next probe is the first one again.
inline void restart_probes(QpTimers& t, Clock::time_point now) {
  t.probes = 0;
  t.probe_interval = first_probe_interval(t);
  t.probe_deadline = now + t.probe_interval;
}

// Whether a timer of the QP is armed (the progress thread must keep ticking).
inline bool timer_pending(const QpTimers& t) { return t.retransmit_armed || t.rnr_armed; }

// A receive completion of a reliable QP waiting for the ACK of its message to
// leave (see EngineQp::deferred).
struct DeferredCompletion {
  core::Cq* cq = nullptr;
  ibv_wc wc{};
  bool solicited = false;
};

class EngineQp : public core::Qp {
 public:
  using core::Qp::Qp;
  static constexpr unsigned kMaxDeferred = 64;

  EngineContext* engine() const;

  Path path;
  Delivery delivery;  // how requests reach the peer, decided at RTR (delivery.h)
  RequesterState req;
  CompleterState comp;
  ResponderState resp;
  QpTimers timers;
  // The notification point (ecn.h): when this QP last answered a packet marked
  // Congestion Experienced with a CNP.
  Clock::time_point cnp_sent_at{};
  // Written and read by the receive turn's holder only (rx_mu_: the progress
  // thread or a polling application thread). In touched_ until settle_burst
  // releases the QP's completions; in reading_ while READ responses are pending.
  bool in_touched_list = false;
  bool in_read_list = false;
  // In EngineContext::deferred_acks_: an application turn left the ACK of
  // this RC QP's responder pending (written under mu and the receive turn;
  // read under mu). requester_run sends it before the QP's next request.
  bool in_ack_list = false;
  // Same-host ACKs on the board (board_watch.h), written under mu: the QP's
  // cell's word last read, whether that word waits for a READ's responses
  // (both also read without mu by the receive turn, to skip unchanged cells
  // unlocked), and whether the QP is in its engine's BoardWatch.
  struct BoardState {
    std::atomic<uint64_t> seen{0};
    std::atomic<bool> behind_read{false};
    bool watched = false;
  } board;
  // ACK before completion: a reliable QP's receive completions are held here
  // until the ACK that covers their message has been handed to the transport
  // (responder_publish), so that a reply the application sends in reaction
  // can never reach the peer before the peer's own request is acknowledged —
  // as on hardware, where the NIC acknowledges on receipt. (In an application
  // thread's own receive turn they are released at once, and the ACK goes
  // first in the application's next post on the QP: in_ack_list.)
  std::array<DeferredCompletion, kMaxDeferred> deferred{};
  // Same-host mailboxes (mailbox.h): this QP's short SENDs to its peer's
  // mailbox, and its own mailbox for its peer's.
  MailboxSender mail_tx;
  MailboxReceiver mail_rx;
  uint32_t deferred_count = 0;
  XrcTarget* xrc = nullptr;  // XRC target QPs: their shared state (xrc_target.h)
  bool relay_proxy = false;  // the context's stand-in for other processes' targets
  // Live counters (live_counters.h): the QP's entry while it is registered.
  QpCounters* counters = &LiveCounters::unlisted();
  uint64_t unpublished_packets = 0;  // count_sent_in_burst, for the port's totals
  uint64_t unpublished_bytes = 0;

  // Modify with the engine's reactions to the new state (caller holds mu).
  int modify(const ibv_qp_attr& a, int mask);
  // Moves the QP to ERR and flushes both queues (IBA 10.3.1).
  void enter_error();
  // Queues an asynchronous event about this QP (ibv_get_async_event).
  void raise_event(ibv_event_type type);
  void raise_last_wqe_reached();
  // Completes every outstanding WQE with IBV_WC_WR_FLUSH_ERR.
  void flush_send_queue();
  void flush_recv_queue();

  // Counts a packet built for this QP (`bytes` 0: dropped, not counted) and
  // one event of `counter`, in the QP's entry and the port's totals.
  void count_sent(uint32_t bytes);
  // The same for a packet of a requester burst, whose port totals are added
  // once, by publish_sent at the burst's end (caller holds mu): the port's
  // counters take atomic adds, and two a packet — each waiting for the
  // ICRC's stores to drain — cost ~2 % of a stream's CPU.
  void count_sent_in_burst(uint32_t bytes);
  void publish_sent();
  void count(std::atomic<uint64_t> QpCounters::*counter) {
    (counters->*counter).fetch_add(1, std::memory_order_relaxed);
  }

  Clock::duration local_ack_timeout() const;
  // Where receive completions go: the receive CQ, or an XRC SRQ's own CQ.
  core::Cq* recv_completion_cq() const;
};

}  // namespace uroce::engine
