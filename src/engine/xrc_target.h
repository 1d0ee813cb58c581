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
#pragma once

#include <memory>

#include "core/xrcd.h"
#include "engine/engine_qp.h"
#include "engine/tx_batch.h"
#include "engine/xrc_domain.h"
#include "transport/datagram.h"
#include "wire/headers.h"

namespace uroce::core {
class Srq;
}

namespace uroce::engine {

class EngineContext;

struct EngineXrcd : core::Xrcd {
  std::shared_ptr<XrcDomain> domain;
};

// What a target QP holds of its domain (EngineQp::xrc).
struct XrcTarget {
  EngineXrcd* xrcd = nullptr;
  std::shared_ptr<XrcDomain> domain;
  TargetSlot* slot = nullptr;
  uint32_t slot_index = 0;
};

inline constexpr uint32_t kXrcSrqsPerContext = 256;
inline uint16_t xrc_srq_port(uint32_t srq_num) { return uint16_t(srq_num >> 8); }
inline uint32_t xrc_srq_index(uint32_t srq_num) { return srq_num & 0xFF; }

// Creates the target state of a new target QP in `xrcd`'s domain; ENOMEM when
// the domain has no free slot.
[[nodiscard]] int xrc_target_attach(EngineQp& qp, EngineXrcd& xrcd);
void xrc_target_detach(EngineQp& qp);
// Copies the target QP's attributes (and, when `reset_responder`, its fresh
// responder state) to the shared slot. Caller holds qp.mu.
void xrc_target_publish(EngineQp& qp, bool reset_responder);

// Takes an ERR state that a responder in another process gave the target
// QP (caller holds qp.mu; before a query or a modify).
void xrc_target_sync_state(EngineQp& qp);

// A request packet for target QP `qp` arrived (caller holds qp.mu).
void xrc_target_receive(EngineQp& qp, const wire::PacketView& pkt, const transport::RxDatagram& d, TxBatch& tx);

// Relayed requests: recognized by their first byte, which no BTH opcode uroce
// accepts has (0xFF is manufacturer-specific).
inline constexpr uint8_t kRelayMarker = 0xFF;
inline bool is_xrc_relay(const transport::RxDatagram& d) { return d.len > 0 && d.data[0] == kRelayMarker; }
void xrc_relay_receive(EngineContext& ctx, const transport::RxDatagram& d, TxBatch& tx);

// The XRC domain an SRQ belongs to (nullptr for other SRQs).
XrcDomain* xrc_domain_of(const core::Srq* srq);

}  // namespace uroce::engine
