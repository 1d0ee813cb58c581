// Completer (IBA 9.7.5.1, rxe_comp.c): ACK/NAK/READ responses -> send
// completions, plus the local ACK timeout, the RNR timer, the tail-loss
// probes and the congestion window.
//
// Each response walks an explicit state machine (CompState); every state is
// one small function named after the IBA check it performs or the outcome it
// produces. The completer asks things of the requester only through the QP's
// RequesterLink (roles.h).
#include <algorithm>
#include <iterator>

#include "core/context.h"
#include "core/cq.h"
#include "core/log.h"
#include "core/wr_opcode.h"
#include "engine/ack.h"
#include "engine/ack_board.h"
#include "engine/engine_context.h"
#include "engine/roles.h"
#include "wire/psn.h"

namespace uroce::engine {

namespace {

using wire::Operation;

// --- retries and resends ---------------------------------------------------------

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

core::SendWqe* oldest_pending(EngineQp& qp) {
  for (uint32_t i = qp.sq.retired; i != qp.sq.posted; ++i) {
    core::SendWqe& w = qp.sq.at(i);
    if (!w.completed) return &w;
  }
  return nullptr;
}

// The PSN of the first response a started READ or atomic `w` still awaits.
uint32_t first_missing(const EngineQp& qp, const core::SendWqe& w) {
  return wire::psn_add(w.first_psn, qp.comp.read_offset / qp.path.mtu);
}

// A resend: a go-back-N, a probe or an RNR retry.
void count_retransmit(EngineQp& qp) {
  qp.engine()->stats.tx_retransmits.fetch_add(1, std::memory_order_relaxed);
  qp.count(&QpCounters::retransmits);
}

// The oldest WQE fails with `status`; the QP goes to ERR, which flushes the
// others (IBA 10.3.1).
void fail_oldest(EngineQp& qp, ibv_wc_status status) {
  if (core::SendWqe* w = oldest_pending(qp)) complete_send_wqe(qp, *w, status);
  qp.enter_error();
}

// --- the local ACK timer and the tail-loss probes --------------------------------

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

// Forward progress: the retry budget is restored (as rxe's reset_retry_counters).
void progress(EngineQp& qp, Clock::time_point now) {
  qp.timers.backoff = 0;
  qp.comp.retry_left = qp.attr.retry_cnt;
  qp.comp.rnr_retry_left = qp.attr.rnr_retry;
  qp.comp.rewound = false;
  restart_timer(qp, now);
}

// A local ACK timeout's resend: the oldest unacknowledged packet, or the
// oldest READ's (atomic's) request for what is still missing. The requester
// then holds after it (TimeoutUndo) until an answer tells whether the
// originals behind it were lost or only late (undo_spurious_timeout).
void go_back_n(EngineQp& qp, const RequesterLink& req) {
  count_retransmit(qp);
  qp.timers.probe_open = false;  // duplicates answered from here on are the window's
  CompleterState& c = qp.comp;
  c.rewound = false;
  core::SendWqe* w = oldest_pending(qp);
  bool request = w && core::is_read_or_atomic(w->opcode) && w->started;
  uint32_t from = request ? first_missing(qp, *w) : c.unacked_psn;
  c.timeout.open = true;
  c.timeout.psn = from;
  c.timeout.end = request ? wire::psn_add(w->last_psn, 1) : wire::psn_add(from, 1);
  c.timeout.answered_alone = !request;
  req.rewind_asking(from);
  req.resume();
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
// (read_gap), by an ACK past the READ (acknowledge_before), and
// otherwise by the local ACK timeout (IBA 9.7.6.1.3), as on a NIC.
void probe_tail(EngineQp& qp, const RequesterLink& req) {
  if (req.reads_outstanding()) return;
  const bool first = qp.timers.probes++ == 0;
  const uint32_t psn = first ? wire::psn_add(req.next_psn(), wire::kPsnMask) : qp.comp.unacked_psn;  // the newest
  count_retransmit(qp);
  note_needed_probe(qp.timers, qp.comp.unacked_psn);
  qp.timers.probe_psn = psn;
  qp.timers.probe_open = true;
  req.resend_one(psn);
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

// --- the congestion window -------------------------------------------------------

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

// A loss (sequence NAK; local ACK timeout, collapse_window): the window halves, once for
// all the losses of one window (those before recover_psn, the PSN the
// requester had reached), as TCP's NewReno. Half of what was in flight
// rather than of cwnd (RFC 5681's FlightSize), since slow start may have
// grown cwnd far past what the path holds by the time the loss is known
// (but not below half of kInitialCwnd for a QP with less in flight).
void shrink_window(EngineQp& qp, const RequesterLink& req) {
  CompleterState& c = qp.comp;
  if (c.recovering) return;
  uint32_t in_flight = uint32_t(std::max(wire::psn_diff(req.sent_end(), c.unacked_psn), 0));
  c.ssthresh = std::max(std::min(c.cwnd, std::max(in_flight, kInitialCwnd)) / 2, kMinCwnd);
  c.cwnd = c.ssthresh;
  c.cwnd_credit = 0;
  c.recovering = true;
  c.recover_psn = req.sent_end();
}

// A local ACK timeout: ssthresh as for any loss, but the window restarts
// from kLossWindow and grows back by slow start, as TCP's after its
// retransmission timer (RFC 5681 3.1: "no more than the loss window, LW,
// which equals 1 full-sized segment"). A timeout mostly means a peer that
// stopped for a while, not a window lost: the kernel's rxe in a guest starved
// of CPU acknowledged nothing for 70-330 ms at a time, and each timeout that
// re-sent a halved window (~100 packets) into its backlog drew ~100 duplicate
// requests (11 % of a run's packets) and an ACK for each. The one packet
// re-sent now is answered, behind the backlog, with an ACK of everything the
// peer holds (catch_up then skips it); a real loss is re-sent in a few round
// trips of slow start.
// What it changes is kept for undo_spurious_timeout (the first timeout's, when
// several come before an answer).
void collapse_window(EngineQp& qp, const RequesterLink& req) {
  CompleterState& c = qp.comp;
  if (!c.timeout.open) {
    c.timeout.cwnd = c.cwnd;
    c.timeout.ssthresh = c.ssthresh;
    c.timeout.recovering = c.recovering;
    c.timeout.rtt = qp.timers.rtt;
  }
  shrink_window(qp, req);
  c.cwnd = kLossWindow;
  c.cwnd_credit = 0;
}

// The first answer past what a local ACK timeout re-sent tells that the
// timeout was spurious (RFC 4015's Eifel detection, by PSN rather than
// timestamp): it acknowledges originals that were never re-sent, so they were
// only late. The window then comes back (RFC 4015's response) and the
// requester goes on after the newest packet it sent, instead of re-sending
// the rest of the window into the peer's backlog. An ACK of just the re-sent
// packet says the originals after it were lost: the hold ends and they are
// re-sent in slow start. A READ's (atomic's) responses within its range may
// answer the original or the resend, so its hold lasts until an answer past
// it, a NAK, the next timeout, or nothing left outstanding. The round-trip sample the resend discarded
// times an original, so it counts again: without it, a peer answering
// ~800 ms behind its backlog (rxe in a starved guest) timed out every 67 ms,
// each timeout discarding the sample that would have lengthened the timer.
// Returns whether it undid the timeout.
bool undo_spurious_timeout(EngineQp& qp, const RequesterLink& req, Clock::time_point now) {
  CompleterState& c = qp.comp;
  TimeoutUndo& u = c.timeout;
  if (!u.open) return false;
  if (wire::psn_diff(c.unacked_psn, u.end) <= 0) {
    if (u.answered_alone || c.unacked_psn == req.sent_end()) u.open = false;
    return false;
  }
  u.open = false;
  c.cwnd = u.cwnd;
  c.ssthresh = u.ssthresh;
  c.recovering = u.recovering;
  req.rewind(req.sent_end());
  if (u.rtt.active && u.rtt.psn != u.psn) {
    qp.timers.rtt = u.rtt;
    sample_rtt(qp, c.unacked_psn, now);
  }
  return true;
}

// A sequence NAK. Within a recovery, a NAK for a later PSN than the last one
// means a resent packet was lost in turn (the responder took the resends up to
// it: the originals behind the first loss had reached it, and been discarded,
// before them): the queue that dropped the first is still full, and the window
// halves again, as TCP's does when a retransmission is lost.
void shrink_window_on_nak(EngineQp& qp, const RequesterLink& req, uint32_t psn) {
  CompleterState& c = qp.comp;
  if (c.recovering && wire::psn_diff(psn, c.nak_psn) > 0) c.recovering = false;
  c.nak_psn = psn;
  shrink_window(qp, req);
}

// A loss shown (a NAK, a READ response past a gap) or an RNR NAK: the requester
// goes back to `psn`, and a local ACK timeout's hold (TimeoutUndo) ends, since
// the answer it waited for has come.
void rewind_after_answer(EngineQp& qp, const RequesterLink& req, uint32_t psn) {
  qp.comp.timeout.open = false;
  req.rewind(psn);
}

// --- the response state machine --------------------------------------------------

// rxe's comp_state, for uroce's completer: ACKs are cumulative here (one
// acknowledges every WQE it covers in one state, acknowledge_before), and a
// READ response is checked in three steps.
enum class CompState : uint8_t {
  kCheckQpState,  // responses are taken in RTS and SQD only
  kCheckPsn,      // an outstanding PSN, else a ghost
  kCheckAck,      // what answers: the opcode, then the AETH's syndrome
  kWriteSend,     // ACK: the SEND/WRITE WQEs it covers complete (rxe: WRITE_SEND, COMP_ACK)
  kNak,           // NAK: its code says which error
  kGetWqe,        // READ response or atomic ACK: the oldest WQE, which it must answer
  kCheckReadPsn,  // READ response: the one expected, a duplicate, or past a gap
  kCheckReadOp,   // READ response: its place in the message and its length
  kRead,          // READ response: scattered into the local SGEs
  kAtomic,        // ATOMIC ACKNOWLEDGE: the original value scattered
  kUpdateComp,    // the response's PSN acknowledged
  kReadPart,      // a READ answered in part: its timer and credits
  kCompWqe,       // the READ's or atomic's last response: the WQE completes
  kResume,        // the requester sends what the window now allows (and what was rewound)
  kReadGap,       // READ responses lost: asked for again from the first missing one
  kErrorRetry,    // sequence NAK: go back N, from the retry_cnt budget
  kRnrRetry,      // RNR NAK: wait the RNR timer, from the rnr_retry budget
  kError,         // the oldest WQE fails with Response::status, the QP goes to ERR
  kDuplicate,     // a READ response already scattered: dropped
  kGhost,         // answers nothing outstanding: dropped
  kDropState,     // the QP takes no responses in its state: dropped
  kDone,
};

[[maybe_unused]] constexpr const char* kCompStateNames[] = {
    "CHECK_QP_STATE", "CHECK_PSN",     "CHECK_ACK",  "WRITE_SEND",  "NAK",         "GET_WQE",
    "CHECK_READ_PSN", "CHECK_READ_OP", "READ",       "ATOMIC",      "UPDATE_COMP", "READ_PART",
    "COMP_WQE",       "RESUME",        "READ_GAP",   "ERROR_RETRY", "RNR_RETRY",   "ERROR",
    "DUPLICATE",      "GHOST",         "DROP_STATE", "DONE"};
static_assert(std::size(kCompStateNames) == size_t(CompState::kDone) + 1);

// What the state functions share while one response is processed.
struct Response {
  EngineQp& qp;
  const wire::PacketView& pkt;
  RequesterLink requester;
  uint32_t psn;
  Operation op;
  // The response's own time, not its burst's (check_ack): a burst may take
  // milliseconds (a sanitizer build), and progress dated from its start would
  // leave the tail-loss probe already due at its end (a spurious resend).
  Clock::time_point now{};
  bool read = false;                      // a READ response (else, from kGetWqe on, an atomic ACK)
  bool ends = false;                      // a READ response that ends a request (LAST/ONLY)
  uint32_t index = 0;                     // kGetWqe on: the oldest WQE's SQ index
  core::SendWqe* wqe = nullptr;           // and the WQE
  uint32_t expected = 0;                  // READ: the PSN of the first missing response
  ibv_wc_status status = IBV_WC_SUCCESS;  // kError's
  bool from_board = false;                // a same-host ACK word (completer_receive_board)
};

// Everything before `psn` is acknowledged — a response acknowledges every
// request before its own PSN (roce-facts §2.3) — so SEND/WRITE WQEs whose
// last PSN precedes it complete. Stops at a READ that has not completed; if
// the response passed such a READ, its responses were lost and the READ is
// retried.
void acknowledge_before(Response& r, uint32_t psn) {
  EngineQp& qp = r.qp;
  sample_rtt(qp, psn, r.now);
  bool advanced = false;
  for (uint32_t i = qp.sq.retired; i != qp.sq.posted; ++i) {
    core::SendWqe& w = qp.sq.at(i);
    if (!w.started) break;
    if (w.completed) continue;
    if (core::is_read_or_atomic(w.opcode)) {
      // Only the READ's (atomic's) own responses acknowledge it: PSNs from its first
      // missing response on are not acknowledged, whatever `psn` says.
      uint32_t missing = first_missing(qp, w);
      if (wire::psn_diff(psn, missing) > 0) {
        if (r.from_board) {
          // The READ's responses may still be in the ring behind the word.
          qp.board.behind_read.store(true, std::memory_order_relaxed);
        } else if (wire::psn_diff(w.last_psn, psn) < 0 && !qp.comp.rewound) {
          // The response passed the whole READ: its responses were lost.
          qp.comp.rewound = true;
          rewind_after_answer(qp, r.requester, missing);
        }
        psn = missing;
      }
      break;
    }
    if (wire::psn_diff(w.last_psn, psn) >= 0) break;  // not fully acknowledged
    complete_send_wqe(qp, w, IBV_WC_SUCCESS);
    advanced = true;
  }
  bool undone = false;
  if (int32_t acked = wire::psn_diff(psn, qp.comp.unacked_psn); acked > 0) {
    qp.comp.unacked_psn = psn;
    undone = undo_spurious_timeout(qp, r.requester, r.now);
    if (!undone) grow_window(qp.comp, uint32_t(acked));
    advanced = true;
  }
  retire_send_wqes(qp);
  if (!undone) r.requester.catch_up();
  if (advanced) progress(qp, r.now);
}

CompState check_qp_state(Response& r) {
  ibv_qp_state st = r.qp.state();
  return st == IBV_QPS_RTS || st == IBV_QPS_SQD ? CompState::kCheckPsn : CompState::kDropState;
}

// IBA 9.7.5.1 (rxe_comp.c check_psn): a response is for a PSN that is
// outstanding — sent and not yet acknowledged — or it is a ghost, dropped:
// it answers nothing we sent (a forged or misdirected packet, or one so late
// that its PSN was acknowledged since). A plain ACK may also repeat the last
// acknowledged PSN (the answer to a duplicate, C9-105). A NAK names the PSN
// the responder expects (sequence error) or the request it refused: one that
// is outstanding. A spurious probe is told first: its answer is such an ACK.
CompState check_psn(Response& r) {
  note_spurious_probe(r.qp, r.pkt);
  if (wire::psn_diff(r.psn, r.requester.sent_end()) >= 0) return CompState::kGhost;  // never sent
  bool plain_ack = r.op == Operation::kAcknowledge && r.pkt.aeth().type() == wire::AckType::kAck;
  int32_t behind = wire::psn_diff(r.psn, r.qp.comp.unacked_psn);
  bool ghost = plain_ack ? behind < -1 : behind < 0;
  return ghost ? CompState::kGhost : CompState::kCheckAck;
}

// READ responses (FIRST/LAST/ONLY carry an AETH, but a NAK comes as an
// ACKNOWLEDGE) and atomic ACKs answer the oldest WQE; an ACKNOWLEDGE's AETH
// says ACK, RNR NAK or NAK (IBA 9.7.5.1; a reserved syndrome is ignored).
CompState check_ack(Response& r) {
  r.now = Clock::now();
  if (r.op == Operation::kAtomicAcknowledge) return CompState::kGetWqe;
  if (r.pkt.info->flags & wire::kOpReadResponse) {
    r.read = true;
    return CompState::kGetWqe;
  }
  switch (r.pkt.aeth().type()) {
    case wire::AckType::kAck:
      return CompState::kWriteSend;
    case wire::AckType::kRnrNak:
      return CompState::kRnrRetry;
    case wire::AckType::kNak:
      return CompState::kNak;
    default:
      return CompState::kDone;
  }
}

// An ACK acknowledges its own PSN too; the window it opens is filled.
CompState write_send(Response& r) {
  acknowledge_before(r, wire::psn_add(r.psn, 1));
  return CompState::kResume;
}

// A NAK acknowledges what precedes its PSN (roce-facts §2.3). A sequence
// error is retried; the others fail the WQE with the status of their class
// (an unknown code as a remote operational error, as rxe maps it).
CompState nak(Response& r) {
  acknowledge_before(r, r.psn);
  switch (wire::NakCode(r.pkt.aeth().code())) {
    case wire::NakCode::kPsnSeqError:
      return CompState::kErrorRetry;
    case wire::NakCode::kInvalidRequest:
      r.status = IBV_WC_REM_INV_REQ_ERR;
      break;
    case wire::NakCode::kRemoteAccess:
      r.status = IBV_WC_REM_ACCESS_ERR;
      break;
    default:
      r.status = IBV_WC_REM_OP_ERR;
      break;
  }
  return CompState::kError;
}

// READ responses and atomic ACKs answer the oldest WQE, which must be the
// started, uncompleted READ (atomic, of the response's PSN); anything else
// answers a later request, past a READ whose responses were lost.
CompState get_wqe(Response& r) {
  EngineQp& qp = r.qp;
  acknowledge_before(r, r.psn);
  if (qp.state() == IBV_QPS_ERR || qp.sq.retired == qp.sq.posted) return CompState::kDone;
  r.index = qp.sq.retired;
  r.wqe = &qp.sq.at(r.index);
  const core::SendWqe& w = *r.wqe;
  if (!w.started || w.completed) return CompState::kResume;
  if (r.read) return w.opcode == IBV_WR_RDMA_READ ? CompState::kCheckReadPsn : CompState::kResume;
  return core::is_atomic(w.opcode) && w.first_psn == r.psn ? CompState::kAtomic : CompState::kResume;
}

// READ responses take consecutive PSNs from the request's (IBA 9.7.5.1.3):
// one before the first missing is a duplicate, one past it tells of a loss.
CompState check_read_psn(Response& r) {
  r.expected = first_missing(r.qp, *r.wqe);
  int32_t d = wire::psn_diff(r.psn, r.expected);
  if (d < 0) return CompState::kDuplicate;
  return d > 0 ? CompState::kReadGap : CompState::kCheckReadOp;
}

// At offset 0 the response must start a message. Past it, MIDDLE/LAST
// continue a request and FIRST/ONLY answer the next one: the WQE's next part
// (send_read_request) or a re-request, which restart there. Only the WQE's
// last response may be shorter than the MTU: a part ends at a multiple of it.
CompState check_read_op(Response& r) {
  const uint32_t mtu = r.qp.path.mtu;
  const uint32_t offset = r.qp.comp.read_offset;
  bool starts = r.op == Operation::kReadResponseFirst || r.op == Operation::kReadResponseOnly;
  r.ends = r.op == Operation::kReadResponseLast || r.op == Operation::kReadResponseOnly;
  uint32_t remaining = r.wqe->length - offset;
  bool full = r.pkt.payload_len == mtu && remaining > mtu;
  bool size_ok = full || (r.ends && r.pkt.payload_len == remaining);
  if ((offset == 0 && !starts) || !size_ok) {
    r.status = IBV_WC_BAD_RESP_ERR;
    return CompState::kError;
  }
  return CompState::kRead;
}

// Scatters a READ response (or an atomic's original value) into the WQE's
// local buffers; a local protection error if they no longer allow it.
bool scatter(Response& r, uint32_t offset, const uint8_t* data, uint32_t len) {
  EngineQp& qp = r.qp;
  if (qp.ctx->mrs.scatter(qp.pd, qp.sq.sges(r.index), r.wqe->num_sge, offset, data, len)) return true;
  r.status = IBV_WC_LOC_PROT_ERR;
  return false;
}

CompState do_read(Response& r) {
  if (!scatter(r, r.qp.comp.read_offset, r.pkt.payload(), r.pkt.payload_len)) return CompState::kError;
  r.qp.comp.read_offset += r.pkt.payload_len;
  return CompState::kUpdateComp;
}

// ATOMIC_ACKNOWLEDGE: the original remote value goes to the 8-byte local
// buffer (host byte order).
CompState do_atomic(Response& r) {
  uint64_t orig = r.pkt.atomic_ack_eth().orig();
  if (!scatter(r, 0, reinterpret_cast<const uint8_t*>(&orig), sizeof orig)) return CompState::kError;
  return CompState::kUpdateComp;
}

CompState update_comp(Response& r) {
  CompleterState& c = r.qp.comp;
  c.unacked_psn = wire::psn_add(r.psn, 1);
  if (!undo_spurious_timeout(r.qp, r.requester, r.now)) grow_window(c, 1);
  if (!r.read) return CompState::kCompWqe;
  if (c.read_offset != r.wqe->length) return CompState::kReadPart;
  c.read_offset = 0;
  return CompState::kCompWqe;
}

// Progress within a READ; at a part's end its credit and the window have
// room for the next.
CompState read_part(Response& r) {
  progress(r.qp, r.now);
  if (!r.ends) return CompState::kDone;
  r.requester.read_part_done();
  return CompState::kResume;
}

// The last response of a READ or atomic: the WQE completes, and its credit
// (max_rd_atomic) is free for the requester.
CompState comp_wqe(Response& r) {
  EngineQp& qp = r.qp;
  r.requester.read_done();
  complete_send_wqe(qp, *r.wqe, IBV_WC_SUCCESS);
  retire_send_wqes(qp);
  r.requester.catch_up();
  progress(qp, r.now);
  return CompState::kResume;
}

// What the response changed (an open window, a returned credit, a rewind)
// the requester acts on now. A READ response or atomic ACK for a later
// request than the oldest WQE comes here too: the requester resends what
// acknowledge_before rewound.
CompState resume(Response& r) {
  r.requester.resume();
  return CompState::kDone;
}

// A READ response was lost: ask again from the first missing one, once per loss.
CompState read_gap(Response& r) {
  if (r.qp.comp.rewound) return CompState::kDone;
  r.qp.comp.rewound = true;
  rewind_after_answer(r.qp, r.requester, r.expected);
  return CompState::kResume;
}

// The responder missed packets (NAK 0x60): go back to the PSN it expects, as
// long as retry_cnt allows (roce-facts §2.3), else RETRY_EXC_ERR.
CompState error_retry(Response& r) {
  EngineQp& qp = r.qp;
  qp.count(&QpCounters::rcvd_seq_err);
  qp.engine()->stats.rx_seq_naks.fetch_add(1, std::memory_order_relaxed);
  if (!take_retry(qp.attr.retry_cnt, qp.comp.retry_left)) {
    r.status = IBV_WC_RETRY_EXC_ERR;
    return CompState::kError;
  }
  shrink_window_on_nak(qp, r.requester, r.psn);
  count_retransmit(qp);
  rewind_after_answer(qp, r.requester, r.psn);
  return CompState::kResume;
}

// RNR NAK (IBA 9.7.5.2.8): what precedes its PSN is acknowledged; the
// requester waits the encoded time and then resends from it, as long as
// rnr_retry allows, else RNR_RETRY_EXC_ERR.
CompState rnr_retry(Response& r) {
  EngineQp& qp = r.qp;
  acknowledge_before(r, r.psn);
  qp.count(&QpCounters::rcvd_rnr_err);
  qp.engine()->stats.rx_rnr_naks.fetch_add(1, std::memory_order_relaxed);
  if (!take_retry(qp.attr.rnr_retry, qp.comp.rnr_retry_left)) {
    r.status = IBV_WC_RNR_RETRY_EXC_ERR;
    return CompState::kError;
  }
  rewind_after_answer(qp, r.requester, r.psn);
  qp.timers.rnr_armed = true;
  qp.timers.rnr_deadline = r.now + std::chrono::microseconds(kRnrTimerUs[r.pkt.aeth().code()]);
  qp.engine()->timer_armed();
  qp.timers.retransmit_armed = false;  // the RNR timer runs instead
  return CompState::kDone;
}

CompState do_error(Response& r) {
  fail_oldest(r.qp, r.status);
  return CompState::kDone;
}

CompState count_drop(Response& r, std::atomic<uint64_t> PortCounters::*counter) {
  (r.qp.engine()->stats.*counter).fetch_add(1, std::memory_order_relaxed);
  return CompState::kDone;
}

CompState step(CompState s, Response& r) {
  switch (s) {
    case CompState::kCheckQpState:
      return check_qp_state(r);
    case CompState::kCheckPsn:
      return check_psn(r);
    case CompState::kCheckAck:
      return check_ack(r);
    case CompState::kWriteSend:
      return write_send(r);
    case CompState::kNak:
      return nak(r);
    case CompState::kGetWqe:
      return get_wqe(r);
    case CompState::kCheckReadPsn:
      return check_read_psn(r);
    case CompState::kCheckReadOp:
      return check_read_op(r);
    case CompState::kRead:
      return do_read(r);
    case CompState::kAtomic:
      return do_atomic(r);
    case CompState::kUpdateComp:
      return update_comp(r);
    case CompState::kReadPart:
      return read_part(r);
    case CompState::kCompWqe:
      return comp_wqe(r);
    case CompState::kResume:
      return resume(r);
    case CompState::kReadGap:
      return read_gap(r);
    case CompState::kErrorRetry:
      return error_retry(r);
    case CompState::kRnrRetry:
      return rnr_retry(r);
    case CompState::kError:
      return do_error(r);
    case CompState::kGhost:
      return count_drop(r, &PortCounters::rx_ghost);
    case CompState::kDropState:
      return count_drop(r, &PortCounters::rx_dropped_state);
    case CompState::kDuplicate:
    case CompState::kDone:
      return CompState::kDone;
  }
  return CompState::kDone;
}

// --- timer events ----------------------------------------------------------------

// The RNR timer ran out: the requester resends from the NAKed PSN.
void rnr_timer_expired(EngineQp& qp, const RequesterLink& req) {
  qp.timers.rnr_armed = false;
  count_retransmit(qp);
  req.resume();
}

// Before the local ACK timeout, a tail-loss probe when one is due; the
// interval doubles, up to half the timeout.
void maybe_probe(EngineQp& qp, const RequesterLink& req, Clock::time_point now) {
  QpTimers& t = qp.timers;
  // After a local ACK timeout, none until progress (as TCP sends no loss
  // probe after its retransmission timer): the peer is slow or gone, and each
  // probe is a duplicate for its backlog.
  if (t.backoff > 0) return;
  if (now < t.probe_deadline || t.probe_interval * 2 >= qp.local_ack_timeout()) return;
  probe_tail(qp, req);
  t.probe_interval *= 2;
  t.probe_deadline = now + t.probe_interval;
}

// Local ACK timeout (IBA 9.7.6.1.3): retry from the oldest unacknowledged PSN
// as long as retry_cnt allows, else RETRY_EXC_ERR.
void ack_timeout(EngineQp& qp, const RequesterLink& req) {
  qp.count(&QpCounters::local_ack_timeout_err);
  qp.engine()->stats.timeouts.fetch_add(1, std::memory_order_relaxed);
  if (!take_retry(qp.attr.retry_cnt, qp.comp.retry_left)) return fail_oldest(qp, IBV_WC_RETRY_EXC_ERR);
  collapse_window(qp, req);
  ++qp.timers.backoff;
  qp.delivery.recheck();  // a same-host peer may have gone away
  go_back_n(qp, req);
  restart_timer(qp, Clock::now());  // from when the resend left, not from the tick's `now`
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

namespace {
void run_completer(EngineQp& qp, const wire::PacketView& pkt, TxBatch& tx, bool from_board) {
  Response r{qp, pkt, RequesterLink(qp, tx), pkt.bth().psn(), wire::operation_of(pkt.bth().opcode())};
  r.from_board = from_board;
  CompState s = CompState::kCheckQpState;
  while (s != CompState::kDone) {
    if (s >= CompState::kErrorRetry && s <= CompState::kError)
      LOG_DEBUG("qp %u completer %s: %s psn %u unacked %u status %d", qp.qp_num(), kCompStateNames[unsigned(s)],
                wire::opcode_name(pkt.bth().opcode()), r.psn, qp.comp.unacked_psn, int(r.status));
    s = step(s, r);
  }
}
}  // namespace

void completer_receive(EngineQp& qp, const wire::PacketView& pkt, TxBatch& tx) { run_completer(qp, pkt, tx, false); }

// The ACKNOWLEDGE packet the word stands for, bare as through shared memory,
// built on the stack: every check the packet would pass through runs on it.
void completer_receive_board(EngineQp& qp, const BoardAck& ack, TxBatch& tx) {
  constexpr uint8_t kOpcode = wire::make_opcode(wire::Service::kRc, wire::Operation::kAcknowledge);
  const wire::OpcodeInfo& info = wire::opcode_info(kOpcode);
  uint8_t bytes[kAckPacketBytes] = {};
  wire::Bth(bytes).fill(kOpcode, false, 0, wire::kDefaultPkey, qp.qp_num(), false, ack.psn);
  wire::Aeth(bytes + info.offset[unsigned(wire::Hdr::kAeth)]).fill(wire::kAckNoCredit, ack.msn);
  // (What parse would find: the opcode's own layout, no payload.)
  static_assert(kAckPacketBytes == wire::opcode_info(kOpcode).header_len + wire::kIcrcSize);
  wire::PacketView pkt{bytes, sizeof bytes, &info, 0};
  qp.board.behind_read.store(false, std::memory_order_relaxed);  // unless it passes a READ unanswered
  run_completer(qp, pkt, tx, true);
}

void completer_receive_cnp(EngineQp& qp) {
  qp.engine()->stats.rx_cnps.fetch_add(1, std::memory_order_relaxed);
  if (qp.type != IBV_QPT_RC && qp.type != IBV_QPT_XRC_SEND) return;
  shrink_window(qp, RequesterLink(qp, TxBatch::local()));  // reads only: this thread's batch stays as it is
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
  const RequesterLink req(qp, tx);
  if (qp.timers.rnr_armed && now >= qp.timers.rnr_deadline) rnr_timer_expired(qp, req);
  if (!qp.timers.retransmit_armed) return;
  if (!has_outstanding(qp)) {
    completer_stop_timer(qp);
  } else if (now < qp.timers.retransmit_deadline) {
    maybe_probe(qp, req, now);
  } else {
    ack_timeout(qp, req);
  }
}

}  // namespace uroce::engine
