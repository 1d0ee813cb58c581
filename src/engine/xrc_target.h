// XRC target QPs (IBV_QPT_XRC_RECV) and the XRC relay.
//
// A target QP has no receive queue, PD or CQ of its own: each request names an
// XRC SRQ of the target's domain (XRCETH), and the receive, the memory access
// checks (that SRQ's PD) and the completion (that SRQ's CQ) are the SRQ's. The
// SRQ number says which device context owns the SRQ: srq_num = (UDP port << 8)
// | index. When that is the context the request arrived at, the responder runs
// here on the target's state; otherwise the request is relayed, unchanged and
// prefixed with a RelayHeader, to the owner's UDP port on the loopback, and the
// owner runs the responder on the same state — kept in the domain's shared
// memory (xrc_domain.h) — and answers the initiator itself. The relay is as
// lossy as the network: a lost relay is a lost request, which the initiator
// retransmits; the PSN checks on the shared state keep everything exactly-once.
//
// Handles (ibv_open_qp): any context that opened the domain can open a handle
// on a target QP by number; its attributes are the slot's (every handle
// queries and modifies the same QP), its events reach every handle, and the QP
// lives while some handle does — in the context that created it, which keeps
// it after its own handle is destroyed (EngineContext::keep_xrc_target).
#pragma once

#include <memory>

#include "core/result.h"
#include "core/xrcd.h"
#include "engine/tx_batch.h"
#include "engine/xrc_domain.h"
#include "transport/datagram.h"
#include "wire/headers.h"

namespace uroce::core {
class Srq;
}

namespace uroce::engine {

class EngineContext;
class EngineQp;  // declared, not included: engine_qp.cc calls the handles

struct EngineXrcd : core::Xrcd {
  std::shared_ptr<XrcDomain> domain;
};

// What a target QP, or an ibv_open_qp handle on one, holds of its domain
// (EngineQp::xrc). The QP itself is the EngineQp its creator's context
// registered (it answers the requests); an opened handle is an EngineQp of
// the opener's context that no context registers: it only names the slot.
struct XrcTarget {
  EngineXrcd* xrcd = nullptr;  // the handle's domain handle (null once the creator's handle is destroyed)
  std::shared_ptr<XrcDomain> domain;
  TargetSlot* slot = nullptr;
  uint32_t slot_index = 0;
  uint16_t home_port = 0;  // the target QP: its context's port and its number
  uint32_t qp_num = 0;
  bool opened = false;  // an ibv_open_qp handle, not the QP itself
  // The QP itself, kept for other handles after its creator's was destroyed
  // (written and read under EngineQp::mu).
  bool handle_closed = false;
  uint32_t attr_gen = 0;  // the slot's attributes the QP itself last loaded
};

inline constexpr uint32_t kXrcSrqsPerContext = 256;
inline uint16_t xrc_srq_port(uint32_t srq_num) { return uint16_t(srq_num >> 8); }
inline uint32_t xrc_srq_index(uint32_t srq_num) { return srq_num & 0xFF; }

// Creates the target state of a new target QP in `xrcd`'s domain, the
// creator's handle included; ENOMEM when the domain has no free slot.
[[nodiscard]] int xrc_target_attach(EngineQp& qp, EngineXrcd& xrcd);
// Frees the slot if it still holds the QP; drops the domain handle's use.
void xrc_target_detach(EngineQp& qp);

// ibv_open_qp: a new handle in `ctx` on target QP `qp_num` of `xrcd`'s domain,
// whatever process or context created it. EINVAL when the domain has no such
// target QP, ENOMEM.
[[nodiscard]] core::Result<EngineQp*> xrc_target_open(EngineContext& ctx, EngineXrcd& xrcd, uint32_t qp_num,
                                                      void* qp_context);

// ibv_destroy_qp of a handle: drops its reference (ib_close_qp).
enum class HandleClose {
  kHandleOnly,  // an opened handle: delete it, nothing else
  kQpKept,      // the creator's handle: other handles remain, its context keeps the QP
  kDestroyQp,   // the creator's handle and the last one: destroy the QP as usual
};
HandleClose xrc_target_close(EngineQp& qp);

// ibv_modify_qp / ibv_query_qp on any handle of a target QP (caller holds
// qp.mu): the attributes are the slot's, shared by every handle. EIO when the
// QP no longer exists (its creator's context was closed or its process ended).
[[nodiscard]] int xrc_target_modify(EngineQp& qp, const ibv_qp_attr& a, int mask);
[[nodiscard]] int xrc_target_query(EngineQp& qp, ibv_qp_attr* attr, ibv_qp_init_attr* init);

// The QP itself, before it handles a packet (caller holds qp.mu): reloads
// attributes another handle changed; false when the QP is gone (its last
// handle was destroyed): the packet finds no QP.
bool xrc_target_sync(EngineQp& qp);
// A QP kept for other handles: true once none is held by a live process (its
// slot is then freed) — the context may reclaim it (xrc_target_detach).
bool xrc_target_unheld(EngineQp& qp);

// A request packet for target QP `qp` arrived (caller holds qp.mu).
void xrc_target_receive(EngineQp& qp, const wire::PacketView& pkt, const transport::RxDatagram& d, TxBatch& tx);

// EngineQp::raise_event of a target QP, or of the relay proxy running one:
// delivered, when the request is done, to every handle on the QP, in this
// process and in others (an event datagram to their context's port).
void xrc_target_defer_event(ibv_event_type type);

// Relayed requests and event notices: internal datagrams of kind kXrcRelay
// (transport/envelope.h).
void xrc_relay_receive(EngineContext& ctx, const transport::RxDatagram& d, TxBatch& tx);

// The XRC domain an SRQ belongs to (nullptr for other SRQs).
XrcDomain* xrc_domain_of(const core::Srq* srq);

}  // namespace uroce::engine
