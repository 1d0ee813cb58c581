// The IBA roles acting on a QP (one file each), called with the QP's mutex held.
#pragma once

#include <mutex>

#include "engine/engine_qp.h"
#include "engine/tx_batch.h"
#include "wire/headers.h"

namespace uroce::engine {

// Requester (requester.cc): turns send WQEs into request packets while the
// PSN window and the read/atomic credits allow.
void requester_run(EngineQp& qp, TxBatch& tx);
// A post (verbs): requester_run, unless the QP streams (requester.cc,
// kCoalescePackets): then the new WQEs go with the next ACK's run.
void requester_post(EngineQp& qp, TxBatch& tx);
// The started, not yet completed WQE holding `psn` (the first in send-queue
// order), or null; `*index` is its position, or else where the search ended
// (the first WQE not started yet).
core::SendWqe* requester_wqe_at(EngineQp& qp, uint32_t psn, uint32_t* index);
// Go-back-N: the next request packet sent will be `psn` again.
void requester_rewind(EngineQp& qp, uint32_t psn);
// The next request packet sent carries AckReq (a tail-loss probe).
void requester_force_ack_req(EngineQp& qp);
// A tail-loss probe: the packet `psn` (outstanding) sent again, alone and
// with AckReq; the requester then goes on from where it was.
void requester_resend_one(EngineQp& qp, uint32_t psn, TxBatch& tx);
// After an ACK: moves the requester past PSNs that are already acknowledged.
void requester_catch_up(EngineQp& qp);
// The last response of a READ or atomic arrived: its credit (max_rd_atomic)
// is free again.
void requester_read_done(EngineQp& qp);
// A READ's part other than its last was answered in full: its request's
// max_rd_atomic credit is free for the next.
void requester_read_part_done(EngineQp& qp);
// The end of a post (verbs; `lock` holds qp.mu and is released here). A post
// that sent jumbo packets takes a receive turn right after: the stream's ACKs
// are then taken, and its next jumbos sent, by the posting thread, not by
// the progress thread, which would otherwise find them waiting while this
// thread copies, and copy beside it from a third thread on two CPUs
// (measured: ib_write_bw 1 MiB 14 -> 23-26 GB/s).
void requester_after_post(EngineQp& qp, std::unique_lock<std::mutex>& lock);

// Responder (responder.cc): one incoming request packet.
// `from` and `to_ip` address the datagram (UD: the GRH and the completion's slid).
void responder_receive(EngineQp& qp, const wire::PacketView& pkt, const transport::Endpoint& from,
                       const transport::IpAddress& to_ip, TxBatch& tx);
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

// Completer (completer.cc): one incoming response (ACK/NAK/READ response).
void completer_receive(EngineQp& qp, const wire::PacketView& pkt, TxBatch& tx);
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
