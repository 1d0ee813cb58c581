#include "engine/host_relay.h"

#include <cstring>

#include "engine/engine_context.h"
#include "engine/host_registry.h"
#include "wire/byte_order.h"

namespace uroce::engine {

namespace {

// Prefix of a relayed datagram (host byte order: both ends are on this host).
struct HostRelayHeader {
  uint8_t marker;  // kHostRelayMarker
  uint8_t version;
  uint8_t gso_index;  // the datagram's place in its GRO batch (its likely IP identification)
  uint8_t reserved;
  uint32_t src_ip;  // the datagram as it arrived: sender, our address and port
  uint32_t dst_ip;
  uint16_t src_port;
  uint16_t dst_port;
};
static_assert(sizeof(HostRelayHeader) == 16 && sizeof(HostRelayHeader) <= TxBatch::kMaxHeader);
constexpr uint8_t kHostRelayVersion = 1;
constexpr uint32_t kLoopback = 0x7F000001;
constexpr size_t kBthDestQpOffset = 5;

}  // namespace

int64_t dest_qpn_of(const transport::RxDatagram& d) {
  if (d.len < kBthDestQpOffset + 3) return -1;
  const uint8_t* q = d.data + kBthDestQpOffset;
  return int64_t(uint32_t(q[0]) << 16 | uint32_t(q[1]) << 8 | q[2]);
}

bool relay_to_slot(EngineContext& ctx, const transport::RxDatagram& d, unsigned slot, TxBatch& tx) {
  HostRegistry* registry = ctx.host_registry();
  uint16_t port = registry ? registry->port_of(slot) : 0;
  if (port == 0 || d.len > TxBatch::kMaxPayload) {
    ctx.stats.rx_no_qp.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  uint8_t* h = tx.begin_packet(transport::Endpoint{kLoopback, port}, kLoopback, sizeof(HostRelayHeader));
  HostRelayHeader rh{kHostRelayMarker, kHostRelayVersion, d.gso_index, 0,
                     d.src.ip,         d.dst_ip,          d.src.port,  d.dst_port ? d.dst_port : ctx.lid()};
  std::memcpy(h, &rh, sizeof rh);
  tx.add_payload(d.data, d.len);
  tx.end_datagram();
  ctx.stats.tx_host_relayed.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool unwrap_host_relay(EngineContext& ctx, transport::RxDatagram& d) {
  HostRelayHeader rh;
  if (d.len <= sizeof rh || d.src.ip != kLoopback) {
    ctx.stats.rx_malformed.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  std::memcpy(&rh, d.data, sizeof rh);
  if (rh.version != kHostRelayVersion) {
    ctx.stats.rx_malformed.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  d.data += sizeof rh;
  d.len -= uint32_t(sizeof rh);
  d.src = transport::Endpoint{rh.src_ip, rh.src_port};
  d.dst_ip = rh.dst_ip;
  d.dst_port = rh.dst_port;
  d.gso_index = rh.gso_index;
  ctx.stats.rx_host_relayed.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace uroce::engine
