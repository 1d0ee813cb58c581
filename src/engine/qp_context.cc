// The EngineQp members that act on the QP's engine (EngineContext): a
// modify's reactions (the connected path, the Delivery, direct placement,
// the counters, the requester at RTS), the way to ERR, and the port's
// counters of what the QP sends. Apart from engine_qp.cc, which keeps the
// QP's own state and does not include the context that holds the QP.
#include "core/ah.h"
#include "core/cq.h"
#include "core/device.h"
#include "core/guarded_access.h"
#include "engine/engine_context.h"
#include "engine/engine_qp.h"
#include "engine/ip_flow.h"
#include "engine/roles.h"
#include "engine/tx_batch.h"
#include "engine/xrc_target.h"
#include "host/direct_placement.h"

namespace uroce::engine {

EngineContext* EngineQp::engine() const { return static_cast<EngineContext*>(ctx); }

void EngineQp::count_sent(uint32_t bytes) {
  if (bytes == 0) return;
  counters->count_sent(bytes);
  Stats& s = engine()->stats;
  s.tx_packets.fetch_add(1, std::memory_order_relaxed);
  s.tx_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

void EngineQp::publish_sent() {
  if (unpublished_packets == 0) return;
  Stats& s = engine()->stats;
  s.tx_packets.fetch_add(unpublished_packets, std::memory_order_relaxed);
  s.tx_bytes.fetch_add(unpublished_bytes, std::memory_order_relaxed);
  unpublished_packets = unpublished_bytes = 0;
}

Path resolve_connected_path(EngineContext& ctx, const ibv_qp_attr& attr) {
  // IPv4-mapped or IPv6 GIDs; a link-local one goes out of its source GID's interface.
  Path path;
  const core::HostAddress* src = ctx.gid_address(attr.ah_attr.grh.sgid_index);
  uint32_t scope = src ? src->scope() : 0;
  path.src_ip = src ? ip_of(src->gid, scope) : transport::IpAddress{};
  path.dst = ctx.direct_endpoint(
      transport::Endpoint{ip_of(attr.ah_attr.grh.dgid, scope), core::roce_udp_port(attr.ah_attr.dlid)},
      attr.dest_qp_num);
  path.mtu = core::mtu_bytes(attr.path_mtu);
  path.flow = ip_flow(path.src_ip, path.dst.ip, ctx.lid(), path.dst.port);
  return path;
}

namespace {

// The peer's mailbox (mailbox.h), for an RC QP whose packets go bare to a
// process of this host; whether the peer opened it for this QP is read at
// each post (requester.cc, send_mail), by guarded accesses: the fault
// guard is armed here for a QP that sends from inline bytes only.
void attach_peer_mailbox(EngineQp& qp) {
  qp.mail_tx = MailboxSender{};
  if (qp.type != IBV_QPT_RC || !qp.delivery.through_memory() || qp.delivery.icrc() != TxBatch::Icrc::kOmit) return;
  core::arm_fault_guard();
  uint32_t cell = mailbox_cell(qp.attr.dest_qp_num);
  if (!qp.engine()->transport().peer_mailbox(qp.path.dst, cell, &qp.mail_tx.peer)) qp.mail_tx = MailboxSender{};
}

// A modify's path: the connected one resolved again when the address
// vector, MTU or destination QP change, and the QP's Delivery decided (again)
// with it or when the QP goes to RTR.
void follow_path(EngineQp& qp, int mask, ibv_qp_state before, ibv_qp_state after) {
  bool path_changed = (mask & (IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN)) && qp.type != IBV_QPT_UD;
  if (path_changed) qp.path = resolve_connected_path(*qp.engine(), qp.attr);
  // UD: no connected path; messages go by address handle, one packet each.
  if (qp.type == IBV_QPT_UD) qp.path.mtu = core::mtu_bytes(qp.ctx->active_mtu());
  if (path_changed || (after == IBV_QPS_RTR && before != IBV_QPS_RTR)) {
    qp.delivery.decide(qp.engine()->transport(), qp.engine()->placement(), qp.type, qp.path.dst);
    attach_peer_mailbox(qp);
  }
}

}  // namespace

int EngineQp::modify(const ibv_qp_attr& a, int mask) {
  // XRC targets (and handles on them): the attributes are the domain's.
  if (xrc) return xrc_target_modify(*this, a, mask);
  ibv_qp_state before = state();
  if (int e = apply_modify(a, mask)) return e;
  ibv_qp_state after = state();

  follow_path(*this, mask, before, after);
  if (host::DirectPlacement* dp = engine()->placement()) dp->sync_qp(*this, relay_proxy);
  counters->state.store(after, std::memory_order_relaxed);
  counters->dest_qpn.store(attr.dest_qp_num, std::memory_order_relaxed);
  if (after == before) return 0;

  switch (after) {
    case IBV_QPS_RESET:
      // Queues and in-flight state are discarded without completions, and
      // the completions still queued for the QP with them (as mlx5).
      if (send_cq) send_cq->discard_qp(qp_num());
      if (recv_cq && recv_cq != send_cq) recv_cq->discard_qp(qp_num());
      sq.posted = sq.retired = 0;
      rq.posted = rq.consumed = 0;
      req = RequesterState{};
      comp = CompleterState{};
      resp = ResponderState{};
      timers = QpTimers{};
      deferred_count = 0;
      Mailboxes::close(*this);
      break;
    case IBV_QPS_RTR:
      engine()->board_watch().join(*this);  // same-host ACKs to this requester: a clean cell
      engine()->mailboxes().open(*this);    // same-host SENDs to this responder
      resp = ResponderState{};
      resp.epsn = attr.rq_psn;
      resp.resource_count = attr.max_dest_rd_atomic ? attr.max_dest_rd_atomic : 1;
      break;
    case IBV_QPS_RTS:
      if (before == IBV_QPS_RTR) {
        req = RequesterState{};
        req.index = sq.retired;
        req.psn = attr.sq_psn;
        req.psn_end = attr.sq_psn;
        comp = CompleterState{};
        comp.unacked_psn = attr.sq_psn;
        comp.retry_left = attr.retry_cnt;
        comp.rnr_retry_left = attr.rnr_retry;
      }
      // WRs posted before RTS (not allowed) or during SQD start now.
      requester_run(*this, TxBatch::local());
      break;
    case IBV_QPS_ERR:
      Mailboxes::close(*this);
      flush_send_queue();
      flush_recv_queue();
      raise_last_wqe_reached();
      break;
    default:
      break;
  }
  return 0;
}

void EngineQp::enter_error() {
  if (state() == IBV_QPS_ERR) return;
  set_state(IBV_QPS_ERR);
  counters->state.store(IBV_QPS_ERR, std::memory_order_relaxed);
  if (host::DirectPlacement* dp = engine()->placement()) dp->withdraw_qp(qp_num());
  completer_stop_timer(*this);
  Mailboxes::close(*this);
  engine()->count_sender(*this, false);
  flush_send_queue();
  flush_recv_queue();
  raise_last_wqe_reached();
}

}  // namespace uroce::engine
