// uroce's internal datagrams: what the processes of one host send each other
// over the loopback, beside the RoCE packets, through the same sockets.
//
// An internal datagram is told from a RoCE packet by its first byte, its
// kind: a value no RoCE packet uroce accepts begins with (BTH opcodes
// 0xC0-0xFF are manufacturer-specific in IBA's OpCode field, and uroce takes
// none of them). Every kind but the doorbell puts a version byte second, so
// that two builds on one host refuse each other's formats. The kinds:
//   kDoorbell   one byte: wake up, the same-host path has records
//               (shm_transport.h), swallowed by the transport;
//   kHostRelay  a datagram for another engine's QP behind the host's port,
//               passed on with its addresses (host/host_relay.h);
//   kXrcRelay   an XRC request relayed to the process running its target QP,
//               or an event notice for another process's handles on it
//               (engine/xrc_target.h).
// Each is sent from and to this host's loopback (kEnvelopeLoopback); a
// receiver drops one that came from elsewhere as malformed.
#pragma once

#include <cstdint>

#include "transport/datagram.h"

namespace uroce::transport {

enum class Envelope : uint8_t {
  kNone = 0,  // not an internal datagram (a classification, never written)
  kDoorbell = 0xFD,
  kHostRelay = 0xFE,
  kXrcRelay = 0xFF,
};
inline constexpr uint8_t kFirstEnvelope = 0xFD;

// The address internal datagrams are sent from and to: 127.0.0.1.
inline constexpr uint32_t kEnvelopeLoopback = 0x7F000001;

// The kind of a received datagram: kNone for a RoCE packet, an empty
// datagram and a same-host jumbo packet (always RoCE: send_jumbo).
inline Envelope envelope_of(const RxDatagram& d) {
  if (d.len == 0 || d.jumbo || d.data[0] < kFirstEnvelope) return Envelope::kNone;
  return Envelope(d.data[0]);
}

// Whether a datagram about to be sent is an internal one (its first byte a kind).
inline bool is_envelope(const TxDatagram& d) {
  return d.iovcnt > 0 && d.iov[0].iov_len > 0 && static_cast<const uint8_t*>(d.iov[0].iov_base)[0] >= kFirstEnvelope;
}

}  // namespace uroce::transport
