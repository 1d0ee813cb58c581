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

// The prefix of a relayed IPv6 datagram: the same with IPv6 addresses (and
// the interfaces of link-local ones).
struct HostRelayHeader6 {
  uint8_t marker;   // kHostRelayMarker
  uint8_t version;  // kHostRelayVersion6
  uint8_t gso_index;
  uint8_t reserved;
  uint16_t src_port;
  uint16_t dst_port;
  uint8_t src_ip[16];
  uint8_t dst_ip[16];
  uint32_t src_scope;
  uint32_t dst_scope;
};
static_assert(sizeof(HostRelayHeader6) == 48 && sizeof(HostRelayHeader6) <= TxBatch::kMaxHeader);
constexpr uint8_t kHostRelayVersion6 = 2;
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
  uint16_t dst_port = d.dst_port ? d.dst_port : ctx.lid();
  if (!d.src.ip.is_v4()) {
    uint8_t* h = tx.begin_packet(transport::Endpoint{kLoopback, port}, kLoopback, sizeof(HostRelayHeader6));
    HostRelayHeader6 rh{kHostRelayMarker, kHostRelayVersion6, d.gso_index, 0, d.src.port, dst_port, {}, {},
                        d.src.ip.scope,   d.dst_ip.scope};
    std::memcpy(rh.src_ip, d.src.ip.bytes.data(), 16);
    std::memcpy(rh.dst_ip, d.dst_ip.bytes.data(), 16);
    std::memcpy(h, &rh, sizeof rh);
  } else {
    uint8_t* h = tx.begin_packet(transport::Endpoint{kLoopback, port}, kLoopback, sizeof(HostRelayHeader));
    HostRelayHeader rh{kHostRelayMarker, kHostRelayVersion, d.gso_index, 0,
                       d.src.ip.v4(),    d.dst_ip.v4(),     d.src.port,  dst_port};
    std::memcpy(h, &rh, sizeof rh);
  }
  tx.add_payload(d.data, d.len);
  tx.end_datagram();
  ctx.stats.tx_host_relayed.fetch_add(1, std::memory_order_relaxed);
  return true;
}

namespace {

bool unwrap_host_relay6(EngineContext& ctx, transport::RxDatagram& d) {
  HostRelayHeader6 rh;
  if (d.len <= sizeof rh) {
    ctx.stats.rx_malformed.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  std::memcpy(&rh, d.data, sizeof rh);
  d.data += sizeof rh;
  d.len -= uint32_t(sizeof rh);
  d.src = transport::Endpoint{transport::IpAddress::from_bytes(rh.src_ip, rh.src_scope), rh.src_port};
  d.dst_ip = transport::IpAddress::from_bytes(rh.dst_ip, rh.dst_scope);
  d.dst_port = rh.dst_port;
  d.gso_index = rh.gso_index;
  ctx.stats.rx_host_relayed.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

bool unwrap_host_relay(EngineContext& ctx, transport::RxDatagram& d) {
  HostRelayHeader rh;
  if (d.len <= sizeof rh || d.src.ip != kLoopback) {
    ctx.stats.rx_malformed.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  std::memcpy(&rh, d.data, sizeof rh);
  if (rh.version == kHostRelayVersion6) return unwrap_host_relay6(ctx, d);
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
