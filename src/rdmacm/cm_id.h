// An rdma_cm_id and the connection state behind it. Every field after `abi`
// is guarded by the CmService mutex; the application reads `abi` (verbs, qp,
// route, ...) directly, as with librdmacm.
#pragma once

#include <rdma/rdma_cma.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/container_of.h"
#include "rdmacm/cm_devices.h"
#include "rdmacm/sockaddr_util.h"

namespace uroce::rdmacm {

class EventChannel;
struct CmId;

using Clock = std::chrono::steady_clock;

// What a pending timer of an id is for.
enum class TimerKind : uint8_t {
  kNone,
  kRequestRetry,  // rdma_connect: the REQ / SIDR_REQ again after a REJ "invalid service ID" (kRefusedGraceMs)
  kRep,
  kDreq,
  kTimewait,
  kSidr,
  kResend,     // the last REQ / REP / DREQ / SIDR_REQ again (its own slot: CmId::resend_timer)
  kNeighbour,  // rdma_resolve_addr: look at the next hop's neighbour state again
};

// Pending timers, earliest first; an id holds the position of its one timer so
// that cancelling it is cheap and leaves nothing behind.
struct TimerEntry {
  CmId* id;
  TimerKind kind;
};
using TimerMap = std::multimap<Clock::time_point, TimerEntry>;

// The id's place in the IB CM / rdma_cm life cycle (kernel cma.c and cm.c
// states, merged).
enum class CmState : uint8_t {
  kIdle,           // created, possibly bound
  kAddrQuery,      // rdma_resolve_addr: waiting for the next hop's neighbour entry
  kAddrResolved,   //
  kRouteQuery,     // rdma_resolve_route (answered at once: RoCE has no SA to ask)
  kRouteResolved,  //
  kListen,         //
  kReqSent,        // active: REQ sent
  kRepRcvd,        // active, no QP attached: CONNECT_RESPONSE delivered, waiting for rdma_establish
  kReqRcvd,        // passive: REQ received, CONNECT_REQUEST queued
  kRepSent,        // passive: REP sent, waiting for the RTU
  kEstablished,    //
  kDreqSent,       // rdma_disconnect sent a DREQ, waiting for the DREP
  kDreqRcvd,       // DREQ received (DISCONNECTED delivered), waiting for rdma_disconnect
  kTimewait,       // disconnected; TIMEWAIT_EXIT follows
  kSidrReqSent,    // UD: SIDR_REQ sent
  kClosed,         // rejected, failed, or after TIMEWAIT_EXIT: only rdma_destroy_id is useful
};
const char* state_name(CmState s);

// What the two sides agreed on (or proposed), in the terms of the IB CM.
struct Connection {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint64_t transaction_id = 0;  // of the REQ (REP and RTU reuse it), or the SIDR_REQ
  uint64_t dreq_tid = 0;        // of the DREQ received (the DREP reuses it)
  uint32_t local_qpn = 0;
  uint32_t remote_qpn = 0;
  uint32_t local_psn = 0;   // own starting PSN (sent in REQ / REP): the QP's rq_psn (rdma_cm's convention)
  uint32_t remote_psn = 0;  // the peer's: the QP's sq_psn
  uint32_t remote_qkey = 0;
  uint16_t remote_lid = 0;  // the peer's UDP port
  ibv_gid remote_gid{};
  ibv_mtu path_mtu = IBV_MTU_1024;
  uint8_t responder_resources = 0;       // own: the QP's max_dest_rd_atomic
  uint8_t peer_responder_resources = 0;  // passive: what the REQ offered (bounds own initiator depth)
  uint8_t initiator_depth = 0;           // own: the QP's max_rd_atomic
  uint8_t retry_count = 7;
  uint8_t rnr_retry_count = 7;
  uint8_t local_ack_timeout = 0;  // the QP's timeout
  bool flow_control = false;
  bool srq = false;
  bool remote_known = false;  // REQ (passive) or REP (active) seen: RTR attributes exist
  bool params_known = false;  // REQ sent or received: INIT access flags exist
  bool disconnect_reported = false;
};

struct CmId {
  rdma_cm_id abi{};  // first: what the application holds

  static CmId* from(rdma_cm_id* id) { return UROCE_CONTAINER_OF(id, CmId, abi); }
  EventChannel* channel() const;

  uint64_t serial = 0;  // never reused: names the id in log messages
  CmState state = CmState::kIdle;
  bool sync = false;  // created without a channel: operations wait for their event
  bool destroying = false;
  int events_delivered = 0;
  int events_acked = 0;
  // A listener's backlog (rdma_listen's, as the kernel's ucma bounds it) and
  // its CONNECT_REQUESTs queued and not yet delivered (cm_passive.cc).
  int backlog = 0;
  int requests_queued = 0;

  // Addressing (ports in host byte order); the ABI copies are in abi.route.
  DevicePort port;  // device is null until the id is bound to an address or resolved
  bool bound = false;
  transport::IpAddress src_ip;  // 0.0.0.0 or ::: wildcard (:: takes IPv4 peers too unless afonly)
  uint16_t src_port = 0;
  transport::IpAddress dst_ip;
  uint16_t dst_port = 0;
  // The UDP socket at the id's address and rdma_cm port (a bound id's: it
  // holds the port on the host); the engine that receives a REQ or SIDR_REQ
  // on QP1 for that port passes it there (cm_gsi.cc).
  int sock = -1;
  uint64_t sock_token = 0;
  // The peer's CM is reached over QP1 (engine/gsi.h): its MADs go to
  // `gsi_peer`; the REQ, REP, DREQ or SIDR_REQ that waits for an answer is
  // sent again until it comes. False until a request is sent or received.
  bool over_gsi = false;
  transport::Endpoint gsi_peer;
  // The last REQ / REP / DREQ / SIDR_REQ sent (resent until answered), or the
  // last REJ or SIDR_REP (sent again to a copy of the peer's request).
  std::array<uint8_t, 256> last_request{};
  bool from_request = false;  // a listener's new id: its peer's request copies are answered (request_memory.h)
  int resend_ms = 0;
  int resolve_timeout_ms = 0;
  // rdma_resolve_addr (neighbour.h): the next hop whose neighbour
  // entry must become valid on interface `resolve_ifindex` before the deadline,
  // and the current interval between looks at it.
  transport::IpAddress resolve_hop;
  int resolve_ifindex = 0;
  Clock::time_point resolve_deadline{};
  int resolve_poll_ms = 0;
  // Until when rdma_connect sends its request again after a REJ "invalid
  // service ID" (see kRefusedGraceMs).
  Clock::time_point refused_grace_end{};

  // Options (rdma_set_option).
  std::optional<uint8_t> tos;
  std::optional<uint8_t> ack_timeout;
  bool reuseaddr = false;
  bool afonly = false;

  Connection conn;
  // Private data of the REQ (or SIDR_REQ): kept, since the request is built
  // again when it is sent again within rdma_connect's grace period.
  uint8_t pending_private[256] = {};
  uint8_t pending_private_len = 0;

  // rdma_create_ep on a passive id: attributes for the QPs rdma_get_request creates.
  std::unique_ptr<ibv_qp_init_attr> ep_qp_init_attr;
  // Local ECE (rdma_set_local_ece), offered in REQ/REP.
  uint32_t ece_vendor_id = 0;
  uint32_t ece_options = 0;

  // Multicast groups joined (multicast_api.cc): the IPv4 group, and the QP
  // attached to it (null for a send-only join or an id without a QP).
  struct Multicast {
    uint32_t group;
    ibv_qp* attached_qp;
  };
  std::vector<Multicast> multicast;

  // Pending timer (see CmService::arm_timer), and the resend timer.
  std::optional<TimerMap::iterator> timer;
  std::optional<TimerMap::iterator> resend_timer;
};

}  // namespace uroce::rdmacm
