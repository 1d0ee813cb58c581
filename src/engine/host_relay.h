// Delivery by QP number behind the host's RoCE port (design §3, "one RoCE
// address per host").
//
// Every engine of a host joins UDP 4791 (SO_REUSEPORT), so a datagram sent
// there reaches one of them, chosen by the kernel from its flow. QP numbers
// say which engine owns the QP: qpn >> 16 is the owner's slot in the host
// registry (host_registry.h). An engine that receives a packet for another
// slot forwards it, unchanged and prefixed with a HostRelayHeader that keeps
// the datagram's addresses (the ICRC and the path checks need them), to the
// owner's private port on 127.0.0.1. The owner receives it as if it had
// arrived directly. The hop is as lossy as the network, so RC's reliability
// covers it; a packet for a slot with no live owner is dropped and counted.
#pragma once

#include <cstdint>

#include "engine/tx_batch.h"
#include "transport/datagram.h"

namespace uroce::engine {

class EngineContext;

// First byte of a relayed datagram: no opcode uroce accepts (0xFE is
// manufacturer-specific; the XRC relay has 0xFF).
inline constexpr uint8_t kHostRelayMarker = 0xFE;
inline bool is_host_relay(const transport::RxDatagram& d) { return d.len > 0 && d.data[0] == kHostRelayMarker; }

// The destination QP of a RoCE packet (BTH bytes 5-7), or -1 when too short.
int64_t dest_qpn_of(const transport::RxDatagram& d);

// Forwards `d` to the engine of the host's slot `slot` (not ours); false,
// counted as rx_no_qp, when that slot has no live owner.
bool relay_to_slot(EngineContext& ctx, const transport::RxDatagram& d, unsigned slot, TxBatch& tx);

// Unwraps a relayed datagram in place into the datagram it carries, with its
// original addresses. False (counted as malformed) unless it came from this
// host's loopback in this build's format.
bool unwrap_host_relay(EngineContext& ctx, transport::RxDatagram& d);

}  // namespace uroce::engine
