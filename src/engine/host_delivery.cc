#include "engine/host_delivery.h"

#include "engine/engine_context.h"
#include "engine/tx_batch.h"
#include "host/host_registry.h"
#include "host/host_relay.h"
#include "transport/envelope.h"

namespace uroce::engine {

static_assert(host::kMaxRelayHeader <= TxBatch::kMaxHeader);

bool relay_to_slot(EngineContext& ctx, const transport::RxDatagram& d, unsigned slot, TxBatch& tx) {
  host::HostRegistry* registry = ctx.host_registry();
  uint16_t port = registry ? registry->port_of(slot) : 0;
  if (port == 0 || d.len > TxBatch::kMaxPayload) {
    ctx.stats.rx_no_qp.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const uint32_t loopback = transport::kEnvelopeLoopback;
  uint8_t* h = tx.begin_packet(transport::Endpoint{loopback, port}, loopback, host::relay_header_size(d));
  host::write_relay_header(d, d.dst_port ? d.dst_port : ctx.lid(), h);
  tx.add_payload(d.data, d.len);
  tx.end_datagram();
  ctx.stats.tx_host_relayed.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool unwrap_host_relay(EngineContext& ctx, transport::RxDatagram& d) {
  if (!host::unwrap_relay(d)) {
    ctx.stats.rx_malformed.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  ctx.stats.rx_host_relayed.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace uroce::engine
