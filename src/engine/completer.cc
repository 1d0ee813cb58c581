// Completer (IBA 9.7.5.1, rxe_comp.c): ACK/NAK/READ responses -> send
// completions, plus the local ACK timeout and the RNR timer.
#include <algorithm>

#include "core/context.h"
#include "core/cq.h"
#include "core/wr_opcode.h"
#include "engine/engine_context.h"
#include "engine/roles.h"
#include "wire/psn.h"

namespace uroce::engine {

namespace {

using wire::Operation;

// RNR NAK timer codes in microseconds (roce-facts §2.4).
constexpr uint32_t kRnrTimerUs[32] = {655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
                                      480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
                                      20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};

// Takes one retry from the budget `left` of a QP attribute `count` (retry_cnt,
// rnr_retry; 7 means retry forever, as rxe reads it); false when the budget is
// spent (the oldest WQE then fails with the matching "retry exceeded" status).
bool take_retry(uint8_t count, uint8_t& left) {
  if (count == 7) return true;
  if (left == 0) return false;
  --left;
  return true;
}

// A request is outstanding while a started WQE awaits its acknowledgement or
// response. (Not `unacked_psn != req.psn`: after a rewind the requester's PSN
// may equal the oldest unacknowledged one with requests still outstanding.)
bool has_outstanding(EngineQp& qp) {
  for (uint32_t i = qp.sq.retired; i != qp.sq.posted; ++i) {
    const core::SendWqe& w = qp.sq.at(i);
    if (!w.started) return false;
    if (!w.completed) return true;
  }
  return false;
}

// The local ACK timer's length. The QP's timeout T (IBA 9.7.6.1.3) is the
// least wait ("the minimum timeout that a QP waits for ACK/NACK", as
// RDMAmojo's ibv_modify_qp puts it): uroce waits longer when the peer
// answers slower than T allows — the measured round trip, srtt + 4 rttvar
// as TCP's RTO, doubled on each timeout without progress — and at most 4 T,
// so a dead peer is still found within (retry_cnt + 1) x 4 T. The kernel's
// rxe under qemu, starved of CPU, acknowledged 64 KiB later than perftest's
// 67 ms: each timeout resent a window it already held (11,092 duplicates in
// one ib_write_bw run).
Clock::duration ack_timer_length(const EngineQp& qp) {
  const Clock::duration t = qp.local_ack_timeout();
  const QpTimers& timers = qp.timers;
  Clock::duration wait = std::max(t, timers.srtt + 4 * timers.rttvar) * (1u << std::min(timers.backoff, 2u));
  return std::min(wait, 4 * t);
}

// The local ACK timer (IBA 9.7.6.1.3) with its tail-loss probes: armed from
// `now` for a reliable QP with a timeout (attr.timeout 0: none). The timers
// (QpTimers) are written in this file only.
void arm_timer(EngineQp& qp, Clock::time_point now) {
  qp.timers.retransmit_armed = true;
  qp.timers.retransmit_deadline = now + ack_timer_length(qp);
  restart_probes(qp.timers, now);
  qp.engine()->timer_armed();
}

// Progress: the timer runs again from now while requests are outstanding.
void restart_timer(EngineQp& qp, Clock::time_point now) {
  if (has_outstanding(qp) && qp.attr.timeout != 0) {
    arm_timer(qp, now);
  } else {
    qp.timers.retransmit_armed = false;
    restart_probes(qp.timers, now);
  }
}

// The acknowledgement of every PSN before `psn` ends the round-trip sample if
// it covers the sampled packet: srtt and rttvar as TCP's (RFC 6298 2.2-2.3).
void sample_rtt(EngineQp& qp, uint32_t psn, Clock::time_point now) {
  RttSample& s = qp.timers.rtt;
  if (!s.active || wire::psn_diff(psn, s.psn) <= 0) return;
  s.active = false;
  Clock::duration rtt = now - s.sent;
  QpTimers& t = qp.timers;
  if (t.srtt.count() == 0) {
    t.srtt = rtt;
    t.rttvar = rtt / 2;
    return;
  }
  Clock::duration err = rtt > t.srtt ? rtt - t.srtt : t.srtt - rtt;
  t.rttvar = (3 * t.rttvar + err) / 4;
  t.srtt = (7 * t.srtt + rtt) / 8;
}

// `acked` more PSNs acknowledged: the congestion window grows (slow start
// below ssthresh, else +1 per window's worth), up to kMaxCwnd.
void grow_window(CompleterState& c, uint32_t acked) {
  if (c.recovering && wire::psn_diff(c.unacked_psn, c.recover_psn) >= 0) c.recovering = false;
  if (c.cwnd < c.ssthresh) {
    c.cwnd = std::min(c.cwnd + acked, c.ssthresh);
  } else {
    c.cwnd_credit += acked;
    if (c.cwnd_credit >= c.cwnd) {
      c.cwnd_credit -= c.cwnd;
      ++c.cwnd;
    }
  }
  c.cwnd = std::min(c.cwnd, kMaxCwnd);
}

// A loss (sequence NAK, local ACK timeout): the window halves, once for
// all the losses of one window (those before recover_psn, the PSN the
// requester had reached), as TCP's NewReno. Half of what was in flight
// rather than of cwnd (RFC 5681's FlightSize), since slow start may have
// grown cwnd far past what the path holds by the time the loss is known
// (but not below half of kInitialCwnd for a QP with less in flight).
void shrink_window(EngineQp& qp) {
  CompleterState& c = qp.comp;
  if (c.recovering) return;
  uint32_t in_flight = uint32_t(std::max(wire::psn_diff(qp.req.psn_end, c.unacked_psn), 0));
  c.ssthresh = std::max(std::min(c.cwnd, std::max(in_flight, kInitialCwnd)) / 2, kMinCwnd);
  c.cwnd = c.ssthresh;
  c.cwnd_credit = 0;
  c.recovering = true;
  c.recover_psn = qp.req.psn_end;
}

// A sequence NAK. Within a recovery, a NAK for a later PSN than the last one
// means a resent packet was lost in turn (the responder took the resends up to
// it: the originals behind the first loss had reached it, and been discarded,
// before them): the queue that dropped the first is still full, and the window
// halves again, as TCP's does when a retransmission is lost.
void shrink_window_on_nak(EngineQp& qp, uint32_t psn) {
  CompleterState& c = qp.comp;
  if (c.recovering && wire::psn_diff(psn, c.nak_psn) > 0) c.recovering = false;
  c.nak_psn = psn;
  shrink_window(qp);
}

}  // namespace

void completer_receive_cnp(EngineQp& qp) {
  qp.engine()->stats.rx_cnps.fetch_add(1, std::memory_order_relaxed);
  if (qp.type == IBV_QPT_RC || qp.type == IBV_QPT_XRC_SEND) shrink_window(qp);
}

namespace {

core::SendWqe* oldest_pending(EngineQp& qp) {
  for (uint32_t i = qp.sq.retired; i != qp.sq.posted; ++i) {
    core::SendWqe& w = qp.sq.at(i);
    if (!w.completed) return &w;
  }
  return nullptr;
}

// A resend: a go-back-N, a probe or an RNR retry.
void count_retransmit(EngineQp& qp) {
  qp.engine()->stats.tx_retransmits.fetch_add(1, std::memory_order_relaxed);
  qp.count(&QpCounters::retransmits);
}

// Resends from the oldest unacknowledged PSN (or the first missing READ
// response).
void go_back_n(EngineQp& qp, TxBatch& tx) {
  count_retransmit(qp);
  qp.timers.probe_open = false;  // duplicates answered from here on are the window's
  qp.comp.rewound = false;
  core::SendWqe* w = oldest_pending(qp);
  uint32_t from = qp.comp.unacked_psn;
  if (w && core::is_read_or_atomic(w->opcode) && w->started)
    from = wire::psn_add(w->first_psn, qp.comp.read_offset / qp.path.mtu);
  requester_rewind(qp, from);
  requester_run(qp, tx);
}

// The previous probe was acknowledged and drew no second ACK: it was needed
// (a loss), so the floor a spurious one raised comes down again, halving to
// kFirstProbeInterval. Without this, duplicated packets (a network that
// duplicates ACKs) would raise it for good: one needed probe in ten judged
// spurious then leaves it near kFirstProbeInterval.
void note_needed_probe(QpTimers& t, uint32_t unacked_psn) {
  if (!t.probe_open || wire::psn_diff(unacked_psn, t.probe_psn) <= 0) return;
  t.probe_floor = std::max(t.probe_floor / 2, kFirstProbeInterval);
}

// Tail-loss probe (like TCP's TLP), for SENDs and WRITEs only, one packet
// with AckReq each. The first after progress resends the newest packet: the
// responder answers a duplicate with an ACK of all it has (C9-105:
// duplicates are acknowledged), a packet past a hole with a sequence NAK,
// and a lost last packet with its ACK. Later ones resend the oldest
// unacknowledged packet: after a hole whose NAK was lost the responder stays
// silent (one NAK per gap, roce-facts §4.2) until the missing packet itself
// arrives. Never a window of duplicates: a peer whose ACKs are merely late
// (the kernel's rxe under qemu takes milliseconds) was sent 17,920 of them
// in one ib_write_bw run when later probes went back N.
// While a READ or atomic is outstanding there is no probe: the responder
// executes a duplicate READ again (roce-facts §4.2: its responses are re-sent
// from the duplicate's PSN) and replays an atomic's saved result, so a
// probe sent while it is still working (a slow responder: the kernel's rxe
// answers a 64 KiB READ after ~7 ms) adds work it must do before it can
// answer, and re-sent windows of READs livelocked it. Their losses are found
// by a sequence NAK (a later request arrived), by a response past a gap
// (on_read_response), by an ACK past the READ (acknowledge_before), and
// otherwise by the local ACK timeout (IBA 9.7.6.1.3), as on a NIC.
void probe_tail(EngineQp& qp, TxBatch& tx) {
  if (qp.req.reads_outstanding > 0) return;
  const bool first = qp.timers.probes++ == 0;
  const uint32_t psn = first ? wire::psn_add(qp.req.psn, wire::kPsnMask) : qp.comp.unacked_psn;  // newest: req.psn - 1
  count_retransmit(qp);
  note_needed_probe(qp.timers, qp.comp.unacked_psn);
  qp.timers.probe_psn = psn;
  qp.timers.probe_open = true;
  requester_resend_one(qp, psn, tx);
}

// A plain ACK that acknowledges nothing new but covers the last probe's PSN
// is the answer to a duplicate (C9-105): the original had arrived too and the
// probe was spurious (TCP's D-SACK in RFC 2883 tells the same). The QP then
// waits twice as long before its next first probe, up to kMaxProbeFloor.
void note_spurious_probe(EngineQp& qp, const wire::PacketView& pkt) {
  QpTimers& t = qp.timers;
  if (!t.probe_open || wire::operation_of(pkt.bth().opcode()) != Operation::kAcknowledge ||
      pkt.aeth().type() != wire::AckType::kAck)
    return;
  uint32_t psn = pkt.bth().psn();
  if (wire::psn_diff(psn, t.probe_psn) < 0 || wire::psn_diff(psn, qp.comp.unacked_psn) >= 0) return;
  t.probe_open = false;
  t.probe_floor = std::min(2 * t.probe_floor, kMaxProbeFloor);
}

// Forward progress: the retry budget is restored (as rxe's reset_retry_counters).
void progress(EngineQp& qp, Clock::time_point now) {
  qp.timers.backoff = 0;
  qp.comp.retry_left = qp.attr.retry_cnt;
  qp.comp.rnr_retry_left = qp.attr.rnr_retry;
  qp.comp.rewound = false;
  restart_timer(qp, now);
}

// Everything before `psn` is acknowledged: complete SEND/WRITE WQEs whose last
// PSN precedes it. Stops at a READ that has not completed; if the ACK passed
// such a READ, its responses were lost and the READ is retried.
// `now`: the response's time (one clock read for the RTT sample, the timer
// and whatever else the response does).
void acknowledge_before(EngineQp& qp, uint32_t psn, Clock::time_point now) {
  sample_rtt(qp, psn, now);
  bool advanced = false;
  for (uint32_t i = qp.sq.retired; i != qp.sq.posted; ++i) {
    core::SendWqe& w = qp.sq.at(i);
    if (!w.started) break;
    if (w.completed) continue;
    if (core::is_read_or_atomic(w.opcode)) {
      // Only the READ's (atomic's) own responses acknowledge it: PSNs from its first
      // missing response on are not acknowledged, whatever `psn` says.
      uint32_t missing = wire::psn_add(w.first_psn, qp.comp.read_offset / qp.path.mtu);
      if (wire::psn_diff(psn, missing) > 0) {
        if (wire::psn_diff(w.last_psn, psn) < 0 && !qp.comp.rewound) {
          // The ACK passed the whole READ: its responses were lost.
          qp.comp.rewound = true;
          requester_rewind(qp, missing);
        }
        psn = missing;
      }
      break;
    }
    if (wire::psn_diff(w.last_psn, psn) >= 0) break;  // not fully acknowledged
    complete_send_wqe(qp, w, IBV_WC_SUCCESS);
    advanced = true;
  }
  if (int32_t acked = wire::psn_diff(psn, qp.comp.unacked_psn); acked > 0) {
    qp.comp.unacked_psn = psn;
    grow_window(qp.comp, uint32_t(acked));
    advanced = true;
  }
  retire_send_wqes(qp);
  requester_catch_up(qp);
  if (advanced) progress(qp, now);
}

void fail_oldest(EngineQp& qp, ibv_wc_status status) {
  if (core::SendWqe* w = oldest_pending(qp)) complete_send_wqe(qp, *w, status);
  qp.enter_error();
}

void on_nak(EngineQp& qp, uint32_t psn, wire::Aeth aeth, TxBatch& tx, Clock::time_point now) {
  acknowledge_before(qp, psn, now);
  switch (wire::NakCode(aeth.code())) {
    case wire::NakCode::kPsnSeqError:
      qp.count(&QpCounters::rcvd_seq_err);
      qp.engine()->stats.rx_seq_naks.fetch_add(1, std::memory_order_relaxed);
      // The responder missed packets: go back to the PSN it expects.
      if (!take_retry(qp.attr.retry_cnt, qp.comp.retry_left)) return fail_oldest(qp, IBV_WC_RETRY_EXC_ERR);
      shrink_window_on_nak(qp, psn);
      count_retransmit(qp);
      requester_rewind(qp, psn);
      requester_run(qp, tx);
      return;
    case wire::NakCode::kInvalidRequest:
      return fail_oldest(qp, IBV_WC_REM_INV_REQ_ERR);
    case wire::NakCode::kRemoteAccess:
      return fail_oldest(qp, IBV_WC_REM_ACCESS_ERR);
    default:
      return fail_oldest(qp, IBV_WC_REM_OP_ERR);
  }
}

void on_rnr_nak(EngineQp& qp, uint32_t psn, wire::Aeth aeth, Clock::time_point now) {
  acknowledge_before(qp, psn, now);
  qp.count(&QpCounters::rcvd_rnr_err);
  qp.engine()->stats.rx_rnr_naks.fetch_add(1, std::memory_order_relaxed);
  if (!take_retry(qp.attr.rnr_retry, qp.comp.rnr_retry_left)) return fail_oldest(qp, IBV_WC_RNR_RETRY_EXC_ERR);
  requester_rewind(qp, psn);
  qp.timers.rnr_armed = true;
  qp.timers.rnr_deadline = now + std::chrono::microseconds(kRnrTimerUs[aeth.code()]);
  qp.engine()->timer_armed();
  qp.timers.retransmit_armed = false;  // the RNR timer runs instead
}

void on_ack(EngineQp& qp, const wire::PacketView& pkt, TxBatch& tx, Clock::time_point now) {
  uint32_t psn = pkt.bth().psn();
  wire::Aeth aeth = pkt.aeth();
  switch (aeth.type()) {
    case wire::AckType::kAck:
      acknowledge_before(qp, wire::psn_add(psn, 1), now);
      requester_run(qp, tx);
      return;
    case wire::AckType::kRnrNak:
      return on_rnr_nak(qp, psn, aeth, now);
    case wire::AckType::kNak:
      return on_nak(qp, psn, aeth, tx, now);
    default:
      return;  // reserved syndrome: ignore
  }
}

// Scatters a READ response (or an atomic's original value) into the WQE's local buffers.
bool scatter(EngineQp& qp, uint32_t index, uint32_t offset, const uint8_t* data, uint32_t len) {
  return qp.ctx->mrs.scatter(qp.pd, qp.sq.sges(index), qp.sq.at(index).num_sge, offset, data, len);
}

// The last response of a READ or atomic: the WQE completes, and its credit
// (max_rd_atomic) is free for the requester.
void finish_response(EngineQp& qp, core::SendWqe& w, TxBatch& tx, Clock::time_point now) {
  requester_read_done(qp);
  complete_send_wqe(qp, w, IBV_WC_SUCCESS);
  retire_send_wqes(qp);
  requester_catch_up(qp);
  progress(qp, now);
  requester_run(qp, tx);
}

void on_read_response(EngineQp& qp, const wire::PacketView& pkt, TxBatch& tx, Clock::time_point now) {
  uint32_t psn = pkt.bth().psn();
  acknowledge_before(qp, psn, now);
  if (qp.state() == IBV_QPS_ERR) return;
  uint32_t index = qp.sq.retired;
  if (index == qp.sq.posted) return;
  core::SendWqe& w = qp.sq.at(index);
  if (w.opcode != IBV_WR_RDMA_READ || !w.started || w.completed) {
    requester_run(qp, tx);  // a response for a later request: resend what acknowledge_before rewound
    return;
  }
  uint32_t mtu = qp.path.mtu;
  uint32_t expected = wire::psn_add(w.first_psn, qp.comp.read_offset / mtu);
  int32_t d = wire::psn_diff(psn, expected);
  if (d < 0) return;  // duplicate response
  if (d > 0) {
    // A response was lost: ask again from the first missing one.
    if (!qp.comp.rewound) {
      qp.comp.rewound = true;
      requester_rewind(qp, expected);
      requester_run(qp, tx);
    }
    return;
  }
  Operation op = wire::operation_of(pkt.bth().opcode());
  // At offset 0 the response must start a message. Past it, MIDDLE/LAST
  // continue a request and FIRST/ONLY answer the next one: the WQE's next
  // part (send_read_request) or a re-request, which restart there. Only the
  // WQE's last response may be shorter than the MTU: a part ends at a
  // multiple of it.
  bool first_expected = qp.comp.read_offset == 0;
  bool starts = op == Operation::kReadResponseFirst || op == Operation::kReadResponseOnly;
  bool ends = op == Operation::kReadResponseLast || op == Operation::kReadResponseOnly;
  uint32_t remaining = w.length - qp.comp.read_offset;
  bool full = pkt.payload_len == mtu && remaining > mtu;
  bool size_ok = full || (ends && pkt.payload_len == remaining);
  if ((first_expected && !starts) || !size_ok) return fail_oldest(qp, IBV_WC_BAD_RESP_ERR);
  if (!scatter(qp, index, qp.comp.read_offset, pkt.payload(), pkt.payload_len))
    return fail_oldest(qp, IBV_WC_LOC_PROT_ERR);
  qp.comp.read_offset += pkt.payload_len;
  qp.comp.unacked_psn = wire::psn_add(psn, 1);
  grow_window(qp.comp, 1);
  if (qp.comp.read_offset == w.length) {
    qp.comp.read_offset = 0;
    finish_response(qp, w, tx, now);
  } else {
    progress(qp, now);
    if (ends) {  // a part's end: its credit and the window have room for the next
      requester_read_part_done(qp);
      requester_run(qp, tx);
    }
  }
}

// ATOMIC_ACKNOWLEDGE: the original remote value goes to the 8-byte local
// buffer (host byte order), and the atomic completes.
void on_atomic_ack(EngineQp& qp, const wire::PacketView& pkt, TxBatch& tx, Clock::time_point now) {
  uint32_t psn = pkt.bth().psn();
  acknowledge_before(qp, psn, now);
  if (qp.state() == IBV_QPS_ERR) return;
  uint32_t index = qp.sq.retired;
  if (index == qp.sq.posted) return;
  core::SendWqe& w = qp.sq.at(index);
  if (!core::is_atomic(w.opcode) || !w.started || w.completed || w.first_psn != psn) {
    requester_run(qp, tx);  // a response for a later request: resend what acknowledge_before rewound
    return;
  }
  uint64_t orig = pkt.atomic_ack_eth().orig();
  if (!scatter(qp, index, 0, reinterpret_cast<const uint8_t*>(&orig), sizeof orig))
    return fail_oldest(qp, IBV_WC_LOC_PROT_ERR);
  qp.comp.unacked_psn = wire::psn_add(psn, 1);
  grow_window(qp.comp, 1);
  finish_response(qp, w, tx, now);
}

// IBA 9.7.5.1 (rxe_comp.c check_psn): a response is for a PSN that is
// outstanding — sent and not yet acknowledged — or it is a ghost, dropped:
// it answers nothing we sent (a forged or misdirected packet, or one so late
// that its PSN was acknowledged since). A plain ACK may also repeat the last
// acknowledged PSN (the answer to a duplicate). A NAK names the PSN the
// responder expects (sequence error) or the request it refused: one that is
// outstanding.
bool is_ghost(const EngineQp& qp, const wire::PacketView& pkt) {
  uint32_t psn = pkt.bth().psn();
  if (wire::psn_diff(psn, qp.req.psn_end) >= 0) return true;  // never sent
  bool plain_ack =
      wire::operation_of(pkt.bth().opcode()) == Operation::kAcknowledge && pkt.aeth().type() == wire::AckType::kAck;
  int32_t behind = wire::psn_diff(psn, qp.comp.unacked_psn);
  return plain_ack ? behind < -1 : behind < 0;
}

}  // namespace

void complete_send_wqe(EngineQp& /*qp*/, core::SendWqe& w, ibv_wc_status status) {
  w.completed = true;
  w.status = status;
}

void retire_send_wqes(EngineQp& qp) {
  while (qp.sq.retired != qp.sq.posted) {
    core::SendWqe& w = qp.sq.at(qp.sq.retired);
    if (!w.completed) break;
    if ((w.signaled || w.status != IBV_WC_SUCCESS) && qp.send_cq) {
      ibv_wc wc{};
      wc.wr_id = w.wr_id;
      wc.status = w.status;
      wc.opcode = core::wr_opcode_info(w.opcode).wc_opcode;
      wc.byte_len = core::is_read_or_atomic(w.opcode) ? w.length : 0;
      wc.qp_num = qp.qp_num();
      qp.send_cq->push(wc, true);
    }
    ++qp.sq.retired;
  }
}

void completer_receive(EngineQp& qp, const wire::PacketView& pkt, TxBatch& tx) {
  if (qp.state() != IBV_QPS_RTS && qp.state() != IBV_QPS_SQD) {
    qp.engine()->stats.rx_dropped_state.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  note_spurious_probe(qp, pkt);
  if (is_ghost(qp, pkt)) {
    qp.engine()->stats.rx_ghost.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // The response's own time, not its burst's: a burst may take milliseconds
  // (a sanitizer build), and progress dated from its start would leave the
  // tail-loss probe already due at its end (a spurious resend).
  auto now = Clock::now();
  if (wire::operation_of(pkt.bth().opcode()) == Operation::kAtomicAcknowledge) {
    on_atomic_ack(qp, pkt, tx, now);
  } else if (pkt.info->flags & wire::kOpReadResponse) {
    // FIRST/LAST/ONLY carry an AETH; a NAK arrives as an ACKNOWLEDGE.
    on_read_response(qp, pkt, tx, now);
  } else {
    on_ack(qp, pkt, tx, now);
  }
}

void completer_start_timer(EngineQp& qp, Clock::time_point now) {
  if (!is_reliable(qp.type) || qp.attr.timeout == 0 || qp.timers.retransmit_armed) return;
  arm_timer(qp, now);
}

void completer_stop_timer(EngineQp& qp) {
  qp.timers.retransmit_armed = false;
  qp.timers.rnr_armed = false;
}

void completer_check_timers(EngineQp& qp, Clock::time_point now, TxBatch& tx) {
  if (qp.state() != IBV_QPS_RTS) return;
  if (qp.timers.rnr_armed && now >= qp.timers.rnr_deadline) {
    qp.timers.rnr_armed = false;
    count_retransmit(qp);
    requester_run(qp, tx);
  }
  if (!qp.timers.retransmit_armed) return;
  if (!has_outstanding(qp)) {
    completer_stop_timer(qp);
    return;
  }
  if (now < qp.timers.retransmit_deadline) {
    if (now >= qp.timers.probe_deadline && qp.timers.probe_interval * 2 < qp.local_ack_timeout()) {
      probe_tail(qp, tx);
      qp.timers.probe_interval *= 2;
      qp.timers.probe_deadline = now + qp.timers.probe_interval;
    }
    return;
  }
  // Local ACK timeout (IBA 9.7.6.1.3): retry from the oldest unacknowledged PSN.
  qp.count(&QpCounters::local_ack_timeout_err);
  qp.engine()->stats.timeouts.fetch_add(1, std::memory_order_relaxed);
  if (!take_retry(qp.attr.retry_cnt, qp.comp.retry_left)) return fail_oldest(qp, IBV_WC_RETRY_EXC_ERR);
  shrink_window(qp);
  ++qp.timers.backoff;
  qp.delivery.recheck();  // a same-host peer may have gone away
  go_back_n(qp, tx);
  restart_timer(qp, Clock::now());  // from when the resend left, not from the tick's `now`
}

}  // namespace uroce::engine
