#include "engine/xrc_target.h"

#include <cstring>
#include <mutex>

#include "core/config.h"
#include "core/srq.h"
#include "engine/engine_context.h"
#include "engine/ip_flow.h"
#include "engine/roles.h"
#include "wire/icrc.h"

namespace uroce::engine {

namespace {

// Prefix of a relayed request (host byte order: both ends are on this host).
struct RelayHeader {
  uint8_t marker;  // kRelayMarker
  uint8_t version;
  uint16_t home_port;  // the target QP's context (its LID)
  uint32_t qp_num;     // the target QP
  uint32_t slot_index;
  uint32_t from_ip;  // the request's datagram: sender and our address
  uint32_t to_ip;
  uint16_t from_port;
  uint16_t to_port;  // the UDP port the request arrived at (the home port's or the host's)
  uint64_t domain_dev;
  uint64_t domain_ino;
};
static_assert(sizeof(RelayHeader) == 40 && sizeof(RelayHeader) <= TxBatch::kMaxHeader);
constexpr uint8_t kRelayVersion = 1;
constexpr uint32_t kLoopback = 0x7F000001;

// Runs one request on a target's shared state with `q`: the target QP itself
// (in its own context) or the context's relay proxy. `srq` is the SRQ the
// request names, or null when it names none of the target's domain (the
// responder NAKs that as an invalid request).
void run_on_slot(EngineQp& q, TargetSlot& slot, core::Srq* srq, const wire::PacketView& pkt,
                 const transport::Endpoint& from, const transport::IpAddress& to_ip, TxBatch& tx) {
  q.attr.qp_state = ibv_qp_state(slot.attrs.state);
  q.ibqp.qp_base.state = q.attr.qp_state;
  q.resp = slot.resp;
  q.srq = srq;
  responder_receive(q, pkt, from, to_ip, tx);
  // Answers go out now, READ responses whole: the state is not ours after this.
  responder_send_reads(q, tx, UINT32_MAX);
  responder_flush_ack(q, tx);
  responder_publish(q, tx);
  q.srq = nullptr;
  slot.resp = q.resp;
  slot.attrs.state = q.attr.qp_state;
}

// Gives the relay proxy the target's attributes and our own path to its initiator.
void load_proxy(EngineQp& proxy, const TargetSlot& slot, uint16_t our_port) {
  const TargetAttrs& a = slot.attrs;
  proxy.ibqp.qp_base.qp_num = slot.qp_num;
  proxy.attr.dest_qp_num = a.dest_qp_num;
  proxy.attr.qp_access_flags = a.access;
  proxy.attr.max_dest_rd_atomic = uint8_t(a.max_dest_rd_atomic);
  proxy.attr.min_rnr_timer = uint8_t(a.min_rnr_timer);
  proxy.path.dst = transport::Endpoint{a.dst_ip, a.dst_port};
  proxy.path.src_ip = a.src_ip;
  proxy.path.mtu = a.mtu;
  proxy.path.flow = ip_flow(a.src_ip, a.dst_ip, our_port, a.dst_port);
}

// The SRQ `srq_num` of this context if it is an XRC SRQ of `domain`.
core::Srq* local_srq(EngineContext& ctx, uint32_t srq_num, const XrcDomain* domain) {
  core::Srq* srq = ctx.find_xrc_srq(srq_num);
  return srq && xrc_domain_of(srq) == domain ? srq : nullptr;
}

void relay(EngineQp& qp, const transport::RxDatagram& d, uint16_t owner_port, TxBatch& tx) {
  const XrcTarget& t = *qp.xrc;
  uint8_t* h = tx.begin_packet(transport::Endpoint{kLoopback, owner_port}, kLoopback, sizeof(RelayHeader));
  // The relay between processes carries IPv4 addresses only (an XRC target
  // shared by processes of one host: IPv4).
  RelayHeader rh{kRelayMarker,
                 kRelayVersion,
                 qp.engine()->lid(),
                 qp.qp_num(),
                 t.slot_index,
                 d.src.ip.v4(),
                 d.dst_ip.v4(),
                 d.src.port,
                 d.dst_port ? d.dst_port : qp.engine()->lid(),
                 t.domain->key().dev,
                 t.domain->key().ino};
  std::memcpy(h, &rh, sizeof rh);
  tx.add_payload(d.data, d.len);
  tx.end_datagram();
  qp.engine()->stats.tx_xrc_relayed.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

XrcDomain* xrc_domain_of(const core::Srq* srq) {
  return srq && srq->xrcd ? static_cast<const EngineXrcd*>(srq->xrcd)->domain.get() : nullptr;
}

int xrc_target_attach(EngineQp& qp, EngineXrcd& xrcd) {
  auto t = std::make_unique<XrcTarget>();
  t->xrcd = &xrcd;
  t->domain = xrcd.domain;
  t->slot = t->domain->allocate_slot(qp.qp_num(), qp.engine()->lid(), &t->slot_index);
  if (!t->slot) return ENOMEM;
  xrcd.users.fetch_add(1);
  qp.xrc = t.release();
  return 0;
}

void xrc_target_detach(EngineQp& qp) {
  if (!qp.xrc) return;
  qp.xrc->domain->release_slot(qp.xrc->slot);
  qp.xrc->xrcd->users.fetch_sub(1);
  delete qp.xrc;
  qp.xrc = nullptr;
}

namespace {
void set_state(EngineQp& qp, ibv_qp_state st) {
  qp.attr.qp_state = qp.attr.cur_qp_state = st;
  qp.ibqp.qp_base.state = st;
}
}  // namespace

void xrc_target_sync_state(EngineQp& qp) {
  TargetSlot& s = *qp.xrc->slot;
  SlotLock l(s);
  if (s.attrs.state == IBV_QPS_ERR) set_state(qp, IBV_QPS_ERR);
}

void xrc_target_publish(EngineQp& qp, bool reset_responder) {
  TargetSlot& s = *qp.xrc->slot;
  SlotLock l(s);
  TargetAttrs& a = s.attrs;
  // An error found meanwhile by another process's responder stands: only a
  // modify to RESET leaves ERR (IBA 10.3.1).
  if (a.state == IBV_QPS_ERR && qp.attr.qp_state != IBV_QPS_RESET) set_state(qp, IBV_QPS_ERR);
  a.state = qp.attr.qp_state;
  a.dest_qp_num = qp.attr.dest_qp_num;
  a.access = qp.attr.qp_access_flags;
  a.max_dest_rd_atomic = qp.attr.max_dest_rd_atomic;
  a.min_rnr_timer = qp.attr.min_rnr_timer;
  a.mtu = qp.path.mtu;
  a.dst_ip = qp.path.dst.ip.v4();  // shared with other processes: IPv4 only
  a.dst_port = qp.path.dst.port;
  a.src_ip = qp.path.src_ip.v4();
  if (reset_responder) s.resp = qp.resp;
}

void xrc_target_receive(EngineQp& qp, const wire::PacketView& pkt, const transport::RxDatagram& d, TxBatch& tx) {
  uint32_t srq_num = pkt.xrceth().srq_num();
  EngineContext& ctx = *qp.engine();
  uint16_t owner = xrc_srq_port(srq_num);
  // Only requests for SRQs the domain has are relayed (the rest are NAKed
  // here), so a peer cannot make us send to arbitrary local ports.
  if (owner != ctx.lid() && qp.xrc->domain->has_srq(srq_num)) {
    relay(qp, d, owner, tx);
    return;
  }
  TargetSlot& slot = *qp.xrc->slot;
  core::Srq* srq = owner == ctx.lid() ? local_srq(ctx, srq_num, qp.xrc->domain.get()) : nullptr;
  SlotLock l(slot);
  run_on_slot(qp, slot, srq, pkt, d.src, d.dst_ip, tx);
}

void xrc_relay_receive(EngineContext& ctx, const transport::RxDatagram& d, TxBatch& tx) {
  RelayHeader rh;
  wire::PacketView pkt;
  // Only this host's processes relay (the loopback), in this build's format.
  if (d.len < sizeof rh || d.src.ip != kLoopback) {
    ctx.stats.rx_malformed.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::memcpy(&rh, d.data, sizeof rh);
  const uint8_t* inner = d.data + sizeof rh;
  uint32_t inner_len = d.len - uint32_t(sizeof rh);
  if (rh.version != kRelayVersion ||
      wire::PacketView::parse(const_cast<uint8_t*>(inner), inner_len, pkt) != wire::ParseError::kNone ||
      !pkt.info->has(wire::Hdr::kXrceth)) {
    ctx.stats.rx_malformed.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // The relay hop is a network hop too: the request's own ICRC still holds.
  if (core::config().icrc_check) {
    wire::Ipv4Flow flow{rh.from_ip, rh.to_ip, rh.from_port, rh.to_port};
    if (!wire::icrc_ipv4_matches(flow, inner, inner_len, pkt.icrc_wire())) {
      ctx.stats.rx_bad_icrc.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  std::shared_ptr<XrcDomain> domain = XrcDomain::find(XrcDomainKey{rh.domain_dev, rh.domain_ino});
  TargetSlot* slot = domain ? domain->find_slot(rh.slot_index, rh.home_port, rh.qp_num) : nullptr;
  if (!slot) {  // no such domain open here, or the target QP is gone
    ctx.stats.rx_no_qp.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  core::Srq* srq = local_srq(ctx, pkt.xrceth().srq_num(), domain.get());
  EngineQp& proxy = ctx.relay_proxy();
  std::lock_guard ql(proxy.mu);
  SlotLock l(*slot);
  if (slot->home_port != rh.home_port || slot->qp_num != rh.qp_num) return;  // destroyed meanwhile
  load_proxy(proxy, *slot, ctx.lid());
  run_on_slot(proxy, *slot, srq, pkt, transport::Endpoint{rh.from_ip, rh.from_port}, rh.to_ip, tx);
}

}  // namespace uroce::engine
