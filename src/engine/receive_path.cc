// The engine's receive path (docs/architecture.md, "Where a received
// datagram goes"): a burst of datagrams, each dispatched by kind, parsed and
// checked, and given to what its destination QP number names, then settled
// (ACKs, then the receive completions). EngineContext members, apart from
// engine_context.cc so that the context does not include the receivers it
// dispatches to (gsi, host_delivery, xrc_target), which include it back.
#include <cstdint>
#include <vector>

#include "core/config.h"
#include "engine/ecn.h"
#include "engine/engine_context.h"
#include "engine/gsi.h"
#include "engine/host_delivery.h"
#include "engine/roles.h"
#include "engine/tx_batch.h"
#include "engine/xrc_target.h"
#include "host/host_registry.h"
#include "host/host_relay.h"
#include "transport/envelope.h"
#include "transport/step_probe.h"
#include "wire/headers.h"
#include "wire/icrc.h"

namespace uroce::engine {

void EngineContext::process_burst(std::span<transport::RxDatagram> burst, Turn turn, Clock::time_point now,
                                  bool board_moved) {
  TxBatch& tx = TxBatch::local();
  tx.use(transport_.get());
  TxBatch::BurstScope in_burst(tx);  // flushed below
  std::shared_lock lock(qps_.mu());
  RxBurst rx{tx, now, board_moved};
  for (auto& d : burst) {
    dispatch(d, rx);
    // A CM message takes its place among the data (gsi.h): what came before
    // it completes first, what comes after it completes after its event.
    if (gsi_inbox.pending()) {
      settle_burst(rx, turn);
      gsi_inbox.deliver();
    }
  }
  // Written only here, by the receive turn's holder (rx_mu_): no locked add.
  QpCounters::add_owned(stats.rx_packets, burst.size());
  QpCounters::add_owned(stats.rx_bytes, rx.bytes);
  settle_burst(rx, turn);
}

// The ACK an application turn leaves for the application's next post
// (settle_burst): deferred_acks_ sends it if no post comes first.
void EngineContext::defer_ack(EngineQp& qp, RxBurst& burst) {
  if (qp.in_ack_list) return;
  if (deferred_acks_.empty()) acks_deferred_at_ = burst.now();
  qp.in_ack_list = true;
  deferred_acks_.push_back(&qp);
  deferred_ack_count_.store(deferred_acks_.size(), std::memory_order_relaxed);
}

// The end of a touched QP's burst (caller holds qp.mu): its held receive
// completions released, and the QP off the touched list.
void EngineContext::release_touched(EngineQp& qp) {
  qp.in_touched_list = false;
  responder_release_completions(qp);
}

void EngineContext::settle_burst(RxBurst& burst, Turn turn) {
  TxBatch& tx = burst.tx;
  // Same-host ACK words first (board_watch.h): the send completions they make
  // come before this burst's receive completions, and before a CM event
  // that came after them (a DREQ after the last ACK: gsi.h).
  board_watch_.take(tx, burst.board_moved);
  // ACK coalescing: one ACK per QP per burst, covering every request in it.
  // An RC QP's ACK may wait instead for the application's next post on the
  // QP, which sends it in the same system call as the reply that usually
  // follows (before the reply if it covers a receive, else behind it:
  // requester_run), or for the next turn (deferred_acks_; one comes within a
  // timer tick). It waits
  // - in an application's turn, when it would go through a socket (a word
  //   on the board or a ring record costs no system call);
  // - in any turn, when the application answers on the QP
  //   (responder_reply_expected): a WRITE ping-pong whose target spins on
  //   memory then takes the reply with the ACK in the peer's poll, and
  //   neither side's progress thread is woken again.
  for (EngineQp* qp : touched_) {
    std::lock_guard ql(qp->mu);
    bool rc_ack = qp->type == IBV_QPT_RC && qp->resp.ack_pending;
    bool reply_expected = rc_ack && responder_reply_expected(*qp);
    bool wait_for_post = turn == Turn::kApplication && !qp->delivery.through_memory();
    if (rc_ack && (wait_for_post || reply_expected))
      defer_ack(*qp, burst);
    else
      responder_flush_ack(*qp, tx);
    // ACK before completion (but see above): the QP's receive completions become visible
    // once the ACK covering them has left. It has if nothing waits in the batch (none sent,
    // deferred, or written in place in the peer's ring); else after the flush below.
    if (tx.pending() == 0) release_touched(*qp);
  }
  tx.flush();
  for (EngineQp* qp : touched_) {
    if (!qp->in_touched_list) continue;
    std::lock_guard ql(qp->mu);
    release_touched(*qp);
  }
  touched_.clear();
  transport::step_probe::stamp(transport::step_probe::Step::kSettled);
}

namespace {
// RC, UC and XRC packets are heard only from the path the QP was connected to
// (rxe's check_addr): the datagram's source must be the remote GID's address
// and its destination the QP's source GID's. The UDP source port is flow
// entropy in RoCEv2 and is not checked. Before RTR there is no path: the
// roles drop such packets by state.
bool from_connected_path(const EngineQp& qp, const transport::RxDatagram& d) {
  if (qp.type == IBV_QPT_UD) return true;  // checked by Q_Key
  ibv_qp_state st = qp.state();
  if (st == IBV_QPS_RESET || st == IBV_QPS_INIT) return true;
  return d.src.ip == qp.path.dst.ip && d.dst_ip == qp.path.src_ip;
}
}  // namespace

namespace {
// The ICRC check (docs/architecture.md, "ICRC"). Over IPv4 the sender's
// identification and DF bit are covered but unseen: the packet's place in its
// GRO batch is tried first, then what its sender may have used
// (wire::icrc_ipv4_received_ok).
bool icrc_ok(const transport::RxDatagram& d, const wire::PacketView& pkt, uint16_t local_port) {
  uint16_t dst_port = d.dst_port ? d.dst_port : local_port;
  if (!d.src.ip.is_v4()) {  // IPv6: no hidden field (traffic class, flow label, hop limit are masked)
    wire::Ipv6Flow flow{d.src.ip.bytes, d.dst_ip.bytes, d.src.port, dst_port};
    return wire::icrc_ipv6(flow, d.data, d.len) == pkt.icrc_wire();
  }
  wire::Ipv4Flow flow{d.src.ip.v4(), d.dst_ip.v4(), d.src.port, dst_port, d.gso_index};
  return wire::icrc_ipv4_received_ok(flow, d.data, d.len, pkt.icrc_wire());
}
}  // namespace

// A same-host jumbo packet (ShmTransport::send_jumbo) is an RC SEND or WRITE
// request for a QP of this engine: it is never relayed, and nothing else may
// come as one (it has no ICRC).
bool EngineContext::jumbo_ok(const wire::PacketView& pkt) const {
  uint8_t opcode = pkt.bth().opcode();
  bool request = (pkt.info->flags & (wire::kOpSend | wire::kOpWrite)) && !(pkt.info->flags & wire::kOpResponse);
  uint32_t qpn = pkt.bth().dest_qp();
  return request && wire::service_of(opcode) == wire::Service::kRc && qpn != kMulticastQpn &&
         (!registry_ || host::qpn_slot(qpn) == registry_->slot());
}

// A same-host bare packet (TxDatagram::bare) is an RC or UC packet a QP's
// Delivery sent straight to the engine that owns its peer QP: it is never
// relayed, and nothing else comes without an ICRC.
bool EngineContext::bare_ok(const wire::PacketView& pkt) const {
  wire::Service service = wire::service_of(pkt.bth().opcode());
  uint32_t qpn = pkt.bth().dest_qp();
  return (service == wire::Service::kRc || service == wire::Service::kUc) && qpn != kMulticastQpn && qpn != kGsiQpn &&
         (!registry_ || host::qpn_slot(qpn) == registry_->slot());
}

// Host delivery (host_delivery.h): a RoCE packet for a QP of another engine
// of this host (its number's slot) is passed on to that engine. True when
// it is ours.
bool EngineContext::ours_or_relayed(const transport::RxDatagram& d, TxBatch& tx) {
  int64_t qpn = host::dest_qpn_of(d);
  unsigned slot = qpn < 0 ? 0 : host::qpn_slot(uint32_t(qpn));
  if (slot < host::kFirstHostSlot || slot > host::kLastHostSlot || slot == registry_->slot()) return true;
  relay_to_slot(*this, d, slot, tx);
  return false;
}

// One datagram of a burst, by kind (transport/envelope.h): a RoCE packet
// (the common case) is ours or passed on to its engine; a relayed one is
// unwrapped once (a stale slot then ends as no_qp); an XRC relay goes to its
// handler; a doorbell never comes here (the transport swallows it).
void EngineContext::dispatch(transport::RxDatagram& d, RxBurst& burst) {
  if (d.truncated) return count(stats.rx_malformed);
  switch (transport::envelope_of(d)) {
    case transport::Envelope::kNone:
      if (registry_ && !d.jumbo && !d.bare && !ours_or_relayed(d, burst.tx)) return;
      break;
    case transport::Envelope::kHostRelay:
      if (!registry_) return count(stats.rx_malformed);
      if (!unwrap_host_relay(*this, d)) return;  // (counted)
      break;
    case transport::Envelope::kXrcRelay:
      return xrc_relay_receive(*this, d, burst.tx);
    case transport::Envelope::kDoorbell:
      return count(stats.rx_malformed);
  }
  receive_packet(d, burst);
}

// A RoCE packet for this engine: parsed and checked, then to what its
// destination QP number names (CNP, multicast, QP1, a QP, a tombstone).
void EngineContext::receive_packet(transport::RxDatagram& d, RxBurst& burst) {
  wire::PacketView pkt;
  if (wire::PacketView::parse(d.data, d.len, pkt) != wire::ParseError::kNone || (d.jumbo && !jumbo_ok(pkt)) ||
      (d.bare && !bare_ok(pkt)))
    return count(stats.rx_malformed);
  if (!d.jumbo && !d.bare && core::config().icrc_check && !icrc_ok(d, pkt, lid())) return count(stats.rx_bad_icrc);
  pkt.jumbo = d.jumbo;
  uint32_t qpn = pkt.bth().dest_qp();
  if (pkt.bth().opcode() == wire::kOpCnp) return receive_cnp(d, pkt);
  if (qpn == kMulticastQpn) return deliver_multicast(d, pkt, burst);
  if (qpn == kGsiQpn) return gsi_receive(*this, d, pkt);
  if (EngineQp* qp = qps_.find(qpn)) return deliver_to_qp(*qp, d, pkt, burst);
  if (!tombstones_.any() || !tombstones_.answer(d, pkt, burst.tx, stats)) count(stats.rx_no_qp);
}

// A packet for `qp`: checked against the QP (service, XRC handles, path),
// counted, and run by the role it is for.
void EngineContext::deliver_to_qp(EngineQp& qp, const transport::RxDatagram& d, const wire::PacketView& pkt,
                                  RxBurst& burst) {
  // rxe: the opcode's service must match the QP type.
  // XRC: initiators only take responses, targets only requests.
  bool response = pkt.info->flags & wire::kOpResponse;
  if (wire::service_of(pkt.bth().opcode()) != service_of_qp(qp.type) || (qp.type == IBV_QPT_XRC_SEND && !response) ||
      (qp.type == IBV_QPT_XRC_RECV && response))
    return count(stats.rx_wrong_service);
  std::lock_guard ql(qp.mu);
  if (qp.xrc && !xrc_target_sync(qp)) return count(stats.rx_no_qp);  // an XRC target whose last handle is gone
  if (!from_connected_path(qp, d)) return count(stats.rx_bad_path);
  qp.counters->count_received(d.len);
  burst.bytes += d.len;
  if (d.ce && qp.type != IBV_QPT_UD)
    answer_congestion_mark(qp, burst.tx, burst.now(), stats);  // a burst's marks: one CNP
  if (qp.type == IBV_QPT_XRC_RECV) return xrc_target_receive(qp, pkt, d, burst.tx);
  if (response) {
    completer_receive(qp, pkt, burst.tx);
    return transport::step_probe::stamp(transport::step_probe::Step::kCompleter);
  }
  responder_receive(qp, pkt, d.src, d.dst_ip, burst.tx);
  transport::step_probe::stamp(transport::step_probe::Step::kResponder);
  note_responder_work(qp);
}

// After the responder ran: a QP with an ACK or completions waiting joins the
// burst's touched list (settle_burst), one with READ responses to send the
// reading list (send_reads).
void EngineContext::note_responder_work(EngineQp& qp) {
  if ((qp.resp.ack_pending || qp.deferred_count) && !qp.in_touched_list) {
    qp.in_touched_list = true;
    touched_.push_back(&qp);
  }
  if (qp.resp.read_count && !qp.in_read_list) {
    qp.in_read_list = true;
    reading_.push_back(&qp);
    reading_count_.store(reading_.size(), std::memory_order_relaxed);
  }
}

// A CNP (ecn.h): to a QP of ours that sends on the path it came from, else
// dropped as any packet for no QP or from elsewhere.
void EngineContext::receive_cnp(const transport::RxDatagram& d, const wire::PacketView& pkt) {
  EngineQp* found = qps_.find(pkt.bth().dest_qp());
  if (!found || found->type == IBV_QPT_UD) {
    stats.rx_no_qp.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  EngineQp& qp = *found;
  std::lock_guard ql(qp.mu);
  if (!from_connected_path(qp, d)) {
    stats.rx_bad_path.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  completer_receive_cnp(qp);
}

// A multicast packet (IBA 10.5.2.4: DQPN 0xFFFFFF) goes to every UD QP of
// this engine attached to its destination group, each consuming a receive
// WQE of its own (the progress thread or poller holds qps_.mu() shared).
void EngineContext::deliver_multicast(transport::RxDatagram& d, const wire::PacketView& pkt, RxBurst& burst) {
  const std::vector<EngineQp*>* members = qps_.mcast_members(d.dst_ip);
  if (!members || wire::service_of(pkt.bth().opcode()) != wire::Service::kUd) return count(stats.rx_no_qp);
  for (EngineQp* qp : *members) {
    std::lock_guard ql(qp->mu);
    qp->counters->count_received(d.len);
    responder_receive(*qp, pkt, d.src, d.dst_ip, burst.tx);
    note_responder_work(*qp);  // (a UD QP: receive completions only)
  }
}

}  // namespace uroce::engine
