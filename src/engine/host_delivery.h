// The engine's side of delivery by QP number behind the host's port
// (host/host_relay.h: the relay header and the rules): a datagram for
// another slot's QP is sent on to its engine in a TxBatch, and a datagram
// relayed to this engine is unwrapped; both are counted in the engine's
// statistics.
#pragma once

#include "transport/datagram.h"

namespace uroce::engine {

class EngineContext;
class TxBatch;

// Forwards `d` to the engine of the host's slot `slot` (not ours); false,
// counted as rx_no_qp, when that slot has no live owner.
bool relay_to_slot(EngineContext& ctx, const transport::RxDatagram& d, unsigned slot, TxBatch& tx);

// Unwraps a relayed datagram in place (host::unwrap_relay); false, counted
// as malformed, when it is not one of this host's relays.
bool unwrap_host_relay(EngineContext& ctx, transport::RxDatagram& d);

}  // namespace uroce::engine
