#include "engine/xrc_target.h"

#include <unistd.h>

#include <array>
#include <cstring>
#include <mutex>

#include "core/config.h"
#include "core/srq.h"
#include "engine/engine_context.h"
#include "engine/ip_flow.h"
#include "engine/roles.h"
#include "transport/envelope.h"
#include "wire/icrc.h"

namespace uroce::engine {

namespace {

// Prefix of a relayed request (host byte order: both ends are on this host).
struct RelayHeader {
  uint8_t marker;  // Envelope::kXrcRelay
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
constexpr uint8_t kRelayMarker = uint8_t(transport::Envelope::kXrcRelay);
constexpr uint32_t kLoopback = transport::kEnvelopeLoopback;

// An event of a target QP for the handles of another process's context
// (host byte order, as RelayHeader).
struct EventNotice {
  uint8_t marker;      // Envelope::kXrcRelay
  uint8_t version;     // kEventVersion
  uint16_t home_port;  // the target QP
  uint32_t qp_num;
  uint32_t slot_index;
  uint32_t event_type;  // ibv_event_type
  uint64_t domain_dev;
  uint64_t domain_ino;
};
static_assert(sizeof(EventNotice) == 32 && sizeof(EventNotice) <= TxBatch::kMaxHeader);
constexpr uint8_t kEventVersion = 2;

// Events raised while a request runs (the responder is synchronous: one
// request at a time per thread), sent when it is done.
constexpr unsigned kMaxDeferredEvents = 4;
thread_local std::array<ibv_event_type, kMaxDeferredEvents> t_events;
thread_local unsigned t_event_count = 0;

void raise_on_handle(EngineQp& handle, void* type) {
  ibv_async_event ev{};
  ev.element.qp = &handle.ibqp.qp_base;
  ev.event_type = *static_cast<ibv_event_type*>(type);
  handle.ctx->raise_async_event(ev);
}

// Sends the deferred events of a request on `slot`'s QP to every context
// holding a handle on it (caller holds the slot's lock).
void flush_events(XrcDomain& domain, TargetSlot& slot, uint32_t index, TxBatch& tx) {
  const uint32_t self = uint32_t(getpid());
  for (unsigned i = 0; i < t_event_count; ++i) {
    ibv_event_type type = t_events[i];
    for (const TargetHolder& h : slot.holders) {
      if (h.count == 0) continue;
      if (h.pid == self) {
        domain.for_local_handles(index, slot.home_port, slot.qp_num, h.port, raise_on_handle, &type);
        continue;
      }
      uint8_t* p = tx.begin_packet(transport::Endpoint{kLoopback, h.port}, kLoopback, sizeof(EventNotice));
      EventNotice n{kRelayMarker, kEventVersion,  slot.home_port,   slot.qp_num,
                    index,        uint32_t(type), domain.key().dev, domain.key().ino};
      std::memcpy(p, &n, sizeof n);
      tx.end_datagram();
    }
  }
  t_event_count = 0;
}

// The QP's attributes and our own path to its initiator, from the slot
// (caller holds the slot's lock).
void load_from_slot(EngineQp& q, const TargetSlot& slot, uint16_t our_port) {
  q.attr = slot.qp_attr;
  q.set_state(slot.qp_attr.qp_state);
  const TargetPath& p = slot.path;
  q.path.dst = transport::Endpoint{p.dst_ip, p.dst_port};
  q.path.src_ip = p.src_ip;
  q.path.mtu = p.mtu;
  q.path.flow = ip_flow(p.src_ip, p.dst_ip, our_port, p.dst_port);
}

// Runs one request on a target's shared state with `q`: the target QP itself
// (in its own context, attributes already loaded) or the context's relay
// proxy (loaded here). `srq` is the SRQ the request names, or null when it
// names none of the target's domain (the responder NAKs that as an invalid
// request).
void run_on_slot(EngineQp& q, XrcDomain& domain, TargetSlot& slot, uint32_t index, core::Srq* srq,
                 const wire::PacketView& pkt, const transport::Endpoint& from, const transport::IpAddress& to_ip,
                 TxBatch& tx) {
  q.set_state(slot.qp_attr.qp_state);
  q.resp = slot.resp;
  q.srq = srq;
  t_event_count = 0;
  responder_receive(q, pkt, from, to_ip, tx);
  // Answers go out now, READ responses whole: the state is not ours after this.
  responder_send_reads(q, tx, UINT32_MAX);
  responder_flush_ack(q, tx);
  responder_publish(q, tx);
  q.srq = nullptr;
  slot.resp = q.resp;
  if (slot.qp_attr.qp_state != q.attr.qp_state) {  // a responder error: ERR for every handle
    slot.qp_attr.qp_state = slot.qp_attr.cur_qp_state = q.attr.qp_state;
    ++slot.attr_gen;
    if (q.xrc) q.xrc->attr_gen = slot.attr_gen;
  }
  flush_events(domain, slot, index, tx);
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

// The slot holds the handle's QP, which a live process holds a handle on.
bool handle_valid(const XrcTarget& t) { return slot_holds(*t.slot, t.home_port, t.qp_num); }

}  // namespace

XrcDomain* xrc_domain_of(const core::Srq* srq) {
  return srq && srq->xrcd ? static_cast<const EngineXrcd*>(srq->xrcd)->domain.get() : nullptr;
}

int xrc_target_attach(EngineQp& qp, EngineXrcd& xrcd) {
  auto t = std::make_unique<XrcTarget>();
  uint16_t port = qp.engine()->lid();
  t->xrcd = &xrcd;
  t->domain = xrcd.domain;
  t->slot = t->domain->allocate_slot(qp.qp_num(), port, qp.attr, &t->slot_index);
  if (!t->slot) return ENOMEM;
  t->home_port = port;
  t->qp_num = qp.qp_num();
  xrcd.users.fetch_add(1);
  t->domain->add_local_handle(XrcDomain::LocalHandle{&qp, t->slot_index, port, qp.qp_num(), port});
  qp.xrc = t.release();
  return 0;
}

void xrc_target_detach(EngineQp& qp) {
  if (!qp.xrc) return;
  XrcTarget* t = qp.xrc;
  t->domain->remove_local_handle(&qp);
  if (!t->opened) t->domain->release_slot(t->slot, t->home_port, t->qp_num);
  if (t->xrcd) t->xrcd->users.fetch_sub(1);
  delete t;
  qp.xrc = nullptr;
}

core::Result<EngineQp*> xrc_target_open(EngineContext& ctx, EngineXrcd& xrcd, uint32_t qp_num, void* qp_context) {
  auto t = std::make_unique<XrcTarget>();
  // Caps as create_target gives a target QP: it has no queues of its own.
  auto qp = std::make_unique<EngineQp>(&ctx, nullptr, nullptr, nullptr, IBV_QPT_XRC_RECV, core::QpCaps{1, 1, 1, 1, 0},
                                       false, qp_num, qp_context);
  t->xrcd = &xrcd;
  t->domain = xrcd.domain;
  t->opened = true;
  t->qp_num = qp_num;
  auto target = t->domain->open_target(qp_num, ctx.lid());
  if (!target.ok()) return core::Result<EngineQp*>::error(target.err());
  t->slot = target->slot;
  t->slot_index = target->index;
  t->home_port = target->home_port;
  // rdma-core reports an opened QP's state as unknown until it is queried.
  qp->ibqp.qp_base.state = IBV_QPS_UNKNOWN;
  xrcd.users.fetch_add(1);
  t->domain->add_local_handle(XrcDomain::LocalHandle{qp.get(), t->slot_index, t->home_port, qp_num, ctx.lid()});
  qp->xrc = t.release();
  ctx.track_xrc_handle(qp.get(), true);
  return qp.release();
}

HandleClose xrc_target_close(EngineQp& qp) {
  XrcTarget& t = *qp.xrc;
  EngineContext& ctx = *qp.engine();
  t.domain->remove_local_handle(&qp);
  bool gone = t.domain->drop_handle(t.slot, t.home_port, t.qp_num, ctx.lid());
  if (t.opened) {
    ctx.track_xrc_handle(&qp, false);
    xrc_target_detach(qp);
    return HandleClose::kHandleOnly;
  }
  if (gone) return HandleClose::kDestroyQp;
  // Other handles remain: the QP stays registered and answering; the domain
  // handle it was created with may be closed now. Under the QP's lock: the
  // receive path reads handle_closed (xrc_target_sync) while it answers.
  {
    std::lock_guard ql(qp.mu);
    t.xrcd->users.fetch_sub(1);
    t.xrcd = nullptr;
    t.handle_closed = true;
  }
  ctx.keep_xrc_target(&qp);
  return HandleClose::kQpKept;
}

int xrc_target_modify(EngineQp& qp, const ibv_qp_attr& a, int mask) {
  XrcTarget& t = *qp.xrc;
  EngineContext& ctx = *qp.engine();
  TargetSlot& s = *t.slot;
  SlotLock l(s);
  if (!handle_valid(t)) return EIO;
  ibv_qp_attr next = s.qp_attr;
  ibv_qp_state before = next.qp_state;
  if (int e = core::modify_qp_attrs(IBV_QPT_XRC_RECV, ctx, next, a, mask)) return e;
  if (mask & (IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN)) {
    Path p = resolve_connected_path(ctx, next);
    s.path = TargetPath{p.mtu, p.dst.ip.v4(), p.dst.port, p.src_ip.v4()};  // shared by processes: IPv4 only
  }
  ibv_qp_state after = next.qp_state;
  // A fresh responder at RTR (IBA 10.3.1), none at RESET. ERR flushes
  // nothing: a target has no receive queue (see docs, "XRC").
  if (after != before && (after == IBV_QPS_RTR || after == IBV_QPS_RESET)) {
    s.resp = ResponderState{};
    if (after == IBV_QPS_RTR) {
      s.resp.epsn = next.rq_psn;
      s.resp.resource_count = next.max_dest_rd_atomic ? next.max_dest_rd_atomic : 1;
    }
  }
  s.qp_attr = next;
  ++s.attr_gen;
  qp.ibqp.qp_base.state = after;
  if (!t.opened) {
    load_from_slot(qp, s, ctx.lid());
    t.attr_gen = s.attr_gen;
    qp.counters->state.store(after, std::memory_order_relaxed);
    qp.counters->dest_qpn.store(next.dest_qp_num, std::memory_order_relaxed);
  }
  return 0;
}

int xrc_target_query(EngineQp& qp, ibv_qp_attr* attr, ibv_qp_init_attr* init) {
  XrcTarget& t = *qp.xrc;
  {
    SlotLock l(*t.slot);
    if (!handle_valid(t)) return EIO;
    qp.attr = t.slot->qp_attr;  // an opened handle's copy is only this
  }
  qp.set_state(qp.attr.qp_state);
  qp.query(attr, init);
  return 0;
}

bool xrc_target_sync(EngineQp& qp) {
  XrcTarget& t = *qp.xrc;
  TargetSlot& s = *t.slot;
  SlotLock l(s);
  if (s.owner_pid == 0 || s.home_port != t.home_port || s.qp_num != t.qp_num) return false;
  if (t.handle_closed && live_holders(s) == 0) return false;
  if (s.attr_gen != t.attr_gen) {
    load_from_slot(qp, s, qp.engine()->lid());
    t.attr_gen = s.attr_gen;
    qp.counters->state.store(s.qp_attr.qp_state, std::memory_order_relaxed);
    qp.counters->dest_qpn.store(s.qp_attr.dest_qp_num, std::memory_order_relaxed);
  }
  return true;
}

bool xrc_target_unheld(EngineQp& qp) {
  XrcTarget& t = *qp.xrc;
  {
    SlotLock l(*t.slot);
    if (t.slot->owner_pid != 0 && t.slot->home_port == t.home_port && t.slot->qp_num == t.qp_num &&
        live_holders(*t.slot) > 0)
      return false;
  }
  return true;  // xrc_target_detach frees the slot if it is still ours
}

void xrc_target_defer_event(ibv_event_type type) {
  if (t_event_count < kMaxDeferredEvents) t_events[t_event_count++] = type;
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
  run_on_slot(qp, *qp.xrc->domain, slot, qp.xrc->slot_index, srq, pkt, d.src, d.dst_ip, tx);
}

namespace {

// An event notice from another process: raised on this context's handles.
void event_receive(EngineContext& ctx, const transport::RxDatagram& d) {
  EventNotice n;
  if (d.len != sizeof n) {
    ctx.stats.rx_malformed.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::memcpy(&n, d.data, sizeof n);
  std::shared_ptr<XrcDomain> domain = XrcDomain::find(XrcDomainKey{n.domain_dev, n.domain_ino});
  if (!domain) return;  // closed here meanwhile
  auto type = ibv_event_type(n.event_type);
  domain->for_local_handles(n.slot_index, n.home_port, n.qp_num, ctx.lid(), raise_on_handle, &type);
}

}  // namespace

void xrc_relay_receive(EngineContext& ctx, const transport::RxDatagram& d, TxBatch& tx) {
  RelayHeader rh;
  wire::PacketView pkt;
  // Only this host's processes relay (the loopback), in this build's format.
  if (d.len >= 2 && d.src.ip == kLoopback && d.data[1] == kEventVersion) return event_receive(ctx, d);
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
  proxy.ibqp.qp_base.qp_num = slot->qp_num;
  load_from_slot(proxy, *slot, ctx.lid());
  run_on_slot(proxy, *domain, *slot, rh.slot_index, srq, pkt, transport::Endpoint{rh.from_ip, rh.from_port}, rh.to_ip,
              tx);
}

}  // namespace uroce::engine
