#include "host/host_relay.h"

#include <cstring>

#include "transport/envelope.h"

namespace uroce::host {

namespace {

// Prefix of a relayed datagram (host byte order: both ends are on this host).
struct HostRelayHeader {
  uint8_t marker;  // Envelope::kHostRelay
  uint8_t version;
  uint8_t gso_index;  // the datagram's place in its GRO batch (its likely IP identification)
  uint8_t reserved;
  uint32_t src_ip;  // the datagram as it arrived: sender, our address and port
  uint32_t dst_ip;
  uint16_t src_port;
  uint16_t dst_port;
};
static_assert(sizeof(HostRelayHeader) == 16 && sizeof(HostRelayHeader) <= kMaxRelayHeader);
constexpr uint8_t kHostRelayVersion = 1;

// The prefix of a relayed IPv6 datagram: the same with IPv6 addresses (and
// the interfaces of link-local ones).
struct HostRelayHeader6 {
  uint8_t marker;   // Envelope::kHostRelay
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
static_assert(sizeof(HostRelayHeader6) == 48 && sizeof(HostRelayHeader6) <= kMaxRelayHeader);
constexpr uint8_t kHostRelayVersion6 = 2;
constexpr uint8_t kMarker = uint8_t(transport::Envelope::kHostRelay);
constexpr size_t kBthDestQpOffset = 5;

}  // namespace

int64_t dest_qpn_of(const transport::RxDatagram& d) {
  if (d.len < kBthDestQpOffset + 3) return -1;
  const uint8_t* q = d.data + kBthDestQpOffset;
  return int64_t(uint32_t(q[0]) << 16 | uint32_t(q[1]) << 8 | q[2]);
}

unsigned relay_header_size(const transport::RxDatagram& d) {
  return d.src.ip.is_v4() ? sizeof(HostRelayHeader) : sizeof(HostRelayHeader6);
}

void write_relay_header(const transport::RxDatagram& d, uint16_t dst_port, uint8_t* out) {
  if (!d.src.ip.is_v4()) {
    HostRelayHeader6 rh{kMarker, kHostRelayVersion6, d.gso_index,   0, d.src.port, dst_port, {},
                        {},      d.src.ip.scope,     d.dst_ip.scope};
    std::memcpy(rh.src_ip, d.src.ip.bytes.data(), 16);
    std::memcpy(rh.dst_ip, d.dst_ip.bytes.data(), 16);
    std::memcpy(out, &rh, sizeof rh);
  } else {
    HostRelayHeader rh{kMarker, kHostRelayVersion, d.gso_index, 0, d.src.ip.v4(), d.dst_ip.v4(), d.src.port, dst_port};
    std::memcpy(out, &rh, sizeof rh);
  }
}

namespace {

bool unwrap_relay6(transport::RxDatagram& d) {
  HostRelayHeader6 rh;
  if (d.len <= sizeof rh) return false;
  std::memcpy(&rh, d.data, sizeof rh);
  d.data += sizeof rh;
  d.len -= uint32_t(sizeof rh);
  d.src = transport::Endpoint{transport::IpAddress::from_bytes(rh.src_ip, rh.src_scope), rh.src_port};
  d.dst_ip = transport::IpAddress::from_bytes(rh.dst_ip, rh.dst_scope);
  d.dst_port = rh.dst_port;
  d.gso_index = rh.gso_index;
  return true;
}

}  // namespace

bool unwrap_relay(transport::RxDatagram& d) {
  HostRelayHeader rh;
  if (d.len <= sizeof rh || d.src.ip != transport::kEnvelopeLoopback) return false;
  std::memcpy(&rh, d.data, sizeof rh);
  if (rh.version == kHostRelayVersion6) return unwrap_relay6(d);
  if (rh.version != kHostRelayVersion) return false;
  d.data += sizeof rh;
  d.len -= uint32_t(sizeof rh);
  d.src = transport::Endpoint{rh.src_ip, rh.src_port};
  d.dst_ip = rh.dst_ip;
  d.dst_port = rh.dst_port;
  d.gso_index = rh.gso_index;
  return true;
}

}  // namespace uroce::host
