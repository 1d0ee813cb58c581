// QP1, the General Service Interface (design §6; roce-facts.md §7.1): the
// host's one management QP, which carries the IB CM's MADs as UD SEND_ONLY
// packets with Q_Key 0x80010000 from and to QPN 1 at UDP 4791, as the
// kernel's CM sends them over rxe or a NIC.
//
// A host has one QP1 and many processes. Every engine of the host shares
// UDP 4791, so a MAD reaches whichever engine the kernel picks; the engine
// routes it to the process it is for, as it routes data packets by QPN:
//   - a REQ or SIDR_REQ by its service ID: the rdma_cm port in its low 16
//     bits names the listener, whose CM holds a UDP socket bound to that port
//     at the address the REQ was sent to (the host-wide reservation of the
//     port, as the kernel reserves it). The engine passes the MAD there in a
//     GsiEnvelope; with no such socket it answers as the host's CM would
//     (REJ "invalid service ID", SIDR_REP "service ID not supported").
//   - every other CM MAD by the communication ID it names as the receiver's
//     (uroce's communication IDs carry their engine's host slot in the top
//     8 bits): this engine's go to the process's sink, the connection
//     manager; another slot's through the host relay (host/host_relay.h).
// Order: a MAD reaches the sink in its place among a burst's packets (those
// before it have completed, those after it have not), and a MAD leaves after
// the ACKs the engine still owes its peers: a CM event neither overtakes the
// data before it (a DISCONNECTED before the completion of the last SEND
// acknowledged before the DREQ) nor falls behind the data after it.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "core/config.h"
#include "engine/gsi_inbox.h"
#include "transport/datagram.h"
#include "wire/headers.h"

namespace uroce::engine {

class EngineContext;

inline constexpr uint32_t kGsiQpn = 1;

// Where the MADs this process owns go: its connection manager (rdmacm/),
// which sets it once. Called from an engine's receiving thread, which holds
// the engine's receive turn, in the MAD's place among the burst's data: the
// sink must not send, block or call into the engine (it may queue an event,
// or queue the MAD for later). A process without one drops them (counted
// rx_gsi_dropped).
using GsiSink = void (*)(const GsiMad&);
void set_gsi_sink(GsiSink sink);

// The host slot that owns a communication ID uroce chose (0: an engine
// without a slot); `random` fills the other 24 bits.
inline constexpr uint32_t make_comm_id(unsigned slot, uint32_t random) {
  return uint32_t(slot) << 24 | (random & 0xFFFFFF);
}
inline constexpr unsigned comm_id_slot(uint32_t comm_id) { return comm_id >> 24; }

// Receives a packet for QPN 1 (dispatch, after the ICRC check): anything but
// a UD SEND_ONLY of one MAD with the GSI Q_Key is dropped and counted; a MAD
// is routed as above. MADs for the sink wait in the engine's gsi_inbox until
// process_burst delivers them, right after the packet that brought them.
void gsi_receive(EngineContext& ctx, const transport::RxDatagram& d, const wire::PacketView& pkt);

// Sends one MAD from QP1 to QP1 at `dst` (a peer's 4791, or a uroce engine's
// private port), from `src_ip`, after the ACKs the engine owes. 0 or an errno
// (EINVAL: no route for that address pair; ENOBUFS: the batch dropped it).
[[nodiscard]] int gsi_send(EngineContext& ctx, const transport::Endpoint& dst, const transport::IpAddress& src_ip,
                           std::span<const uint8_t, kMadBytes> mad);

// The same for the connection manager, which knows a device by its verbs
// context (a uroce one: EINVAL otherwise, and slot 0).
[[nodiscard]] int gsi_send(ibv_context* verbs, const transport::Endpoint& dst, const transport::IpAddress& src_ip,
                           std::span<const uint8_t, kMadBytes> mad);
// The host slot of the engine behind `verbs` (0 when it has none): the top
// byte of the communication IDs chosen for connections on that device.
unsigned gsi_slot(ibv_context* verbs);

// Whether the uroce engine whose private UDP port is `port` still owns host
// slot `slot` (host/host_registry.h: the slot's lock dies with its process, and a
// new owner has another port). What the kernel learns when a process's
// files close, the CM learns here for a peer on this host: its process is
// gone. True when it cannot be told (no registry, slot 0): a peer elsewhere.
bool gsi_engine_alive(ibv_context* verbs, unsigned slot, uint16_t port);

// Where a CM MAD from `src` is answered: a uroce engine's private port (below
// the RoCE source ports) is the peer's own, which reaches it along the path
// of its data; any other sender is a host's QP1 at the RoCE port (4791, or
// UROCE_PORT where the hosts agree on another).
inline transport::Endpoint gsi_reply_endpoint(const transport::Endpoint& src) {
  return transport::Endpoint{src.ip,
                             src.port != 0 && src.port < wire::kRoceSourcePortMin ? src.port : core::config().udp_port};
}

// A REQ or SIDR_REQ passed by an engine to the listener's socket: a magic,
// the addresses the MAD came with, and the MAD.
inline constexpr size_t kGsiEnvelopeBytes = 8 + 2 * (16 + 4) + 2 + 4 + kMadBytes;
void encode_gsi_envelope(const GsiMad& m, std::span<uint8_t, kGsiEnvelopeBytes> out);
// nullopt unless `in` is exactly an envelope of this build.
std::optional<GsiMad> decode_gsi_envelope(std::span<const uint8_t> in);

}  // namespace uroce::engine
