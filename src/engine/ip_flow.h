// Addresses across the layers: a GID (core, verbs) as a transport address,
// and the ICRC's flow (wire/icrc.h) of a packet between transport addresses.
// The other way, an address's GID, is core::ip_to_gid (core/device.h), which
// rdmacm uses too: rdmacm does not include the engine (docs/architecture.md,
// "Layers").
#pragma once

#include <infiniband/verbs.h>

#include <cstring>

#include "transport/datagram.h"
#include "wire/icrc.h"

namespace uroce::engine {

// A GID's address; `scope`: the interface of a link-local IPv6 one (the
// source GID's). The zero GID (no address vector yet) is IPv4 0.0.0.0.
inline transport::IpAddress ip_of(const ibv_gid& gid, uint32_t scope = 0) {
  static const ibv_gid kZero{};
  if (std::memcmp(gid.raw, kZero.raw, 16) == 0) return transport::IpAddress{};
  return transport::IpAddress::from_bytes(gid.raw, scope);
}

// The flow of packets from `src` to `dst` (over IPv6 unless both are IPv4).
inline wire::IpFlow ip_flow(const transport::IpAddress& src, const transport::IpAddress& dst, uint16_t src_port,
                            uint16_t dst_port) {
  if (src.is_v4() && dst.is_v4()) return wire::Ipv4Flow{src.v4(), dst.v4(), src_port, dst_port};
  return wire::IpFlow(wire::Ipv6Flow{src.bytes, dst.bytes, src_port, dst_port});
}

}  // namespace uroce::engine
