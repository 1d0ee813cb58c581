// Delivery by QP number behind the host's RoCE port (design §3, "one RoCE
// address per host").
//
// Every engine of a host joins UDP 4791 (SO_REUSEPORT), so a datagram sent
// there reaches one of them, chosen by the kernel from its flow. QP numbers
// say which engine owns the QP: qpn >> 16 is the owner's slot in the host
// registry (host_registry.h). An engine that receives a packet for another
// slot forwards it, unchanged and prefixed with a HostRelayHeader that keeps
// the datagram's addresses (the ICRC and the path checks need them), to the
// owner's private port on 127.0.0.1: an internal datagram of kind
// kHostRelay (transport/envelope.h). The owner receives it as if it had
// arrived directly. The hop is as lossy as the network, so RC's reliability
// covers it; a packet for a slot with no live owner is dropped and counted.
#pragma once

#include <cstdint>

#include "transport/datagram.h"

namespace uroce::host {

// The largest relay header (an IPv6 datagram's).
inline constexpr unsigned kMaxRelayHeader = 48;

// The destination QP of a RoCE packet (BTH bytes 5-7), or -1 when too short.
int64_t dest_qpn_of(const transport::RxDatagram& d);

// The size of the header that carries `d` to another engine of the host
// (kMaxRelayHeader at most), and the header itself, written to `out`:
// `d`'s addresses, `dst_port` the UDP port it arrived at. The sender puts
// `d` unchanged behind it (the engine's relay_to_slot).
unsigned relay_header_size(const transport::RxDatagram& d);
void write_relay_header(const transport::RxDatagram& d, uint16_t dst_port, uint8_t* out);

// Unwraps a relayed datagram in place into the datagram it carries, with its
// original addresses. False (malformed) unless it came from this host's
// loopback in this build's format.
[[nodiscard]] bool unwrap_relay(transport::RxDatagram& d);

}  // namespace uroce::host
