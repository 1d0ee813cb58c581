#include "engine/engine_qp.h"

#include "core/context.h"
#include "core/cq.h"
#include "core/srq.h"
#include "engine/roles.h"
#include "engine/tx_batch.h"
#include "engine/xrc_target.h"

namespace uroce::engine {

Clock::duration EngineQp::local_ack_timeout() const {
  // 4.096 us * 2^timeout (roce-facts §4.4); 0 means no timer.
  return std::chrono::nanoseconds(uint64_t(4096) << attr.timeout);
}

void EngineQp::count_sent_in_burst(uint32_t bytes) {
  if (bytes == 0) return;
  counters->count_sent(bytes);
  ++unpublished_packets;
  unpublished_bytes += bytes;
}

core::Cq* EngineQp::recv_completion_cq() const { return srq && srq->xrc_cq ? srq->xrc_cq : recv_cq; }

void EngineQp::raise_event(ibv_event_type type) {
  // XRC targets: every handle on the QP, in whatever process, gets it.
  if (xrc || relay_proxy) return xrc_target_defer_event(type);
  ibv_async_event ev{};
  ev.element.qp = &ibqp.qp_base;
  ev.event_type = type;
  ctx->raise_async_event(ev);
}

// IBA 10.3.1 (QP and EE Context States, the Affiliated Asynchronous Last WQE
// Reached Event): a QP on an SRQ that enters ERR reports that no more of the
// SRQ's WQEs will be consumed through it.
void EngineQp::raise_last_wqe_reached() {
  if (srq) raise_event(IBV_EVENT_QP_LAST_WQE_REACHED);
}

void EngineQp::flush_send_queue() {
  // Every outstanding WQE completes with FLUSH_ERR, signaled or not (IBA
  // 10.3.1: errors are always reported).
  for (uint32_t i = sq.retired; i != sq.posted; ++i) {
    core::SendWqe& w = sq.at(i);
    if (!w.completed) complete_send_wqe(*this, w, IBV_WC_WR_FLUSH_ERR);
  }
  retire_send_wqes(*this);
  req.index = sq.posted;
  req.offset = 0;
  req.reads_outstanding = 0;
  req.read_requests = 0;
  completer_stop_timer(*this);
}

void EngineQp::flush_recv_queue() {
  // Completions of messages already received come first, after their ACK.
  responder_publish(*this, TxBatch::local());
  resp.read_count = 0;  // READ responses not yet sent are abandoned
  core::Cq* cq = recv_completion_cq();
  if (!cq) {
    resp.have_rwqe = false;  // an XRC target outside a request: see docs, "XRC"
    return;
  }
  if (srq) {
    // The SRQ's WQEs belong to every QP on it: only the one this QP took is flushed.
    if (resp.have_rwqe) {
      ibv_wc wc{};
      wc.wr_id = resp.srq_wqe.wr_id;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.opcode = IBV_WC_RECV;
      wc.qp_num = qp_num();
      cq->push(wc, true);
    }
    resp.have_rwqe = false;
    return;
  }
  for (; rq.consumed != rq.posted; ++rq.consumed) {
    ibv_wc wc{};
    wc.wr_id = rq.at(rq.consumed).wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qp_num();
    cq->push(wc, true);
  }
  resp.have_rwqe = false;
}

}  // namespace uroce::engine
