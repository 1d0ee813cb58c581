// The IBA roles acting on a QP (one file each), called with the QP's mutex held.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <mutex>

#include "base/fast_mutex.h"
#include "engine/clock.h"
#include "engine/tx_batch.h"
#include "transport/datagram.h"
#include "wire/headers.h"

namespace uroce::core {
struct SendWqe;
}

namespace uroce::engine {

// Declared, not included: engine_qp.cc calls the roles.
class EngineQp;
struct BoardAck;
struct MailRecord;

// Requester (requester.cc): turns send WQEs into request packets while the
// PSN window and the read/atomic credits allow. Returns the clock read that
// stamped what it sent (stamp_sent), or none (Clock::time_point{}).
Clock::time_point requester_run(EngineQp& qp, TxBatch& tx);
// A post (verbs; caller holds qp.mu): a lone packet through shared memory
// written straight into the peer's ring (requester.cc, send_lone_packet);
// else requester_run, unless the QP streams (kCoalescePackets): then the new
// WQEs go with the next ACK's run. Returns the clock read that stamped what
// the post sent, or none (Clock::time_point{}).
Clock::time_point requester_post(EngineQp& qp);
// The end of a post (verbs; `lock` holds qp.mu and is released here). A post
// that sent jumbo packets takes a receive turn right after: the stream's ACKs
// are then taken, and its next jumbos sent, by the posting thread, not by
// the progress thread, which would otherwise find them waiting while this
// thread copies, and copy beside it from a third thread on two CPUs
// (measured: ib_write_bw 1 MiB 14 -> 23-26 GB/s).
void requester_after_post(EngineQp& qp, std::unique_lock<base::FastMutex>& lock);

// Responder (responder.cc): one incoming request packet.
// `from` and `to_ip` address the datagram (UD: the GRH and the completion's slid).
void responder_receive(EngineQp& qp, const wire::PacketView& pkt, const transport::Endpoint& from,
                       const transport::IpAddress& to_ip, TxBatch& tx);
// A same-host mailbox record (mailbox.h) at the head of the QP's mailbox:
// taken (delivered, acknowledged, completed; or, without a receive WQE that
// holds it, run through the state machine as its packet: an RNR NAK as rxe
// sends, an error), dropped (a duplicate: a packet with its PSN got there
// first) or left where it is (earlier PSNs missing, a QP that does not
// receive now), to be looked at again.
enum class MailTake : uint8_t { kTaken, kDropped, kLeft };
MailTake responder_take_mail(EngineQp& qp, const MailRecord& r, TxBatch& tx);
// Sends the coalesced ACK, if one is pending.
void responder_flush_ack(EngineQp& qp, TxBatch& tx);
// At the end of a burst with requests for an RC QP: whether the application
// answers them on this QP (a ping-pong), so that the ACK may wait for its
// reply and go with it in the same system call. Called once per such burst.
bool responder_reply_expected(EngineQp& qp);
// Pushes the QP's deferred receive completions (EngineQp::deferred) to their
// CQs. Only once the ACKs covering them have been handed to the transport.
void responder_release_completions(EngineQp& qp);
// ACK before completion in one call: the pending ACK, a flush of the batch,
// then the deferred completions. Before any receive completion is pushed
// directly (flushes on the way to ERR), so that CQ order holds.
void responder_publish(EngineQp& qp, TxBatch& tx);
// Sends up to `budget` READ response packets of the QP's queued streams;
// true while some remain (the caller comes back for them).
bool responder_send_reads(EngineQp& qp, TxBatch& tx, uint32_t budget);

// The completer's requests to the requester (design §5: cross-role signals go
// through one per-QP place). completer.cc reaches the requester only through
// this — go back N, resend one packet, resume sending, move past what is
// acknowledged, return a READ's credit — and reads of RequesterState only what
// it offers. One names a QP and the batch its packets join, for one response
// or timer tick; each request acts at once, in the order made, since what the
// completer decides next (the outstanding requests, the window) depends on it.
// Defined in requester.cc, which owns RequesterState.
class RequesterLink {
 public:
  RequesterLink(EngineQp& qp, TxBatch& tx) : qp_(qp), tx_(tx) {}

  // Sends what the window, the credits and the fences allow (requester_run).
  void resume() const;
  // Go-back-N: the next request packet sent will be `psn` again (never an
  // acknowledged one: a late NAK may name it).
  void rewind(uint32_t psn) const;
  // A local ACK timeout's go-back-N: as rewind, and the packet `psn` asks for
  // an ACK (a responder answers a duplicate only when asked or at a
  // message's end, and the requester holds after it).
  void rewind_asking(uint32_t psn) const;
  // A tail-loss probe: the packet `psn` (outstanding) sent again, alone and
  // with AckReq; the requester then goes on from where it was.
  void resend_one(uint32_t psn) const;
  // After an ACK: moves the requester past PSNs that are already acknowledged.
  void catch_up() const;
  // The last response of a READ or atomic arrived: its credit (max_rd_atomic)
  // is free again.
  void read_done() const;
  // A READ's part other than its last was answered in full: its request's
  // max_rd_atomic credit is free for the next.
  void read_part_done() const;

  // The PSN of the next request packet.
  uint32_t next_psn() const;
  // One past the newest PSN ever sent (a rewind does not lower it).
  uint32_t sent_end() const;
  // Whether a READ or atomic WQE is started and not completed.
  bool reads_outstanding() const;

 private:
  EngineQp& qp_;
  TxBatch& tx_;
};

// Completer (completer.cc): one incoming response (ACK/NAK/READ response),
// walked through the completer's states.
void completer_receive(EngineQp& qp, const wire::PacketView& pkt, TxBatch& tx);
// A same-host ACK read from the board (board_watch.h): handled as the ACK
// packet it stands for, except that it never passes a READ or atomic whose
// responses have not come (they may still be on their way: it then sets
// qp.board.behind_read to be read again).
void completer_receive_board(EngineQp& qp, const BoardAck& ack, TxBatch& tx);
// A CNP for this QP (ecn.h): the reaction point's cut. An RC requester's
// congestion window halves, once per window as for a loss (nothing is resent);
// other QPs only count it.
void completer_receive_cnp(EngineQp& qp);
// Local ACK timeout and RNR timer.
void completer_check_timers(EngineQp& qp, Clock::time_point now, TxBatch& tx);
// The local ACK timer (IBA 9.7.6.1.3) and the RNR timer are the completer's:
// the requester starts the former when it has sent requests (no effect while
// it runs, on an unreliable QP or with attr.timeout 0); the QP stops both on
// its way to ERR.
void completer_start_timer(EngineQp& qp, Clock::time_point now);
void completer_stop_timer(EngineQp& qp);

// Completion helpers shared by the roles.
void complete_send_wqe(EngineQp& qp, core::SendWqe& w, ibv_wc_status status);
// Retires completed WQEs from the head of the send queue, in order.
void retire_send_wqes(EngineQp& qp);

}  // namespace uroce::engine
