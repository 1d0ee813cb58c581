// The active side: rdma_connect (REQ), the REP and its QP programming, RTU,
// rdma_establish, and a REJ.
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/device.h"
#include "core/log.h"
#include "rdmacm/cm_service.h"

namespace uroce::rdmacm {

namespace {

uint32_t random_psn() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != sizeof v) v = uint32_t(Clock::now().time_since_epoch().count());
  return v & 0xFFFFFF;
}

uint8_t resource_value(uint8_t v, uint8_t max) { return v == RDMA_MAX_RESP_RES ? max : v; }

}  // namespace

uint32_t new_psn() { return random_psn(); }

int CmService::connect(CmId* id, const rdma_conn_param* param) {
  if (id->abi.qp_type == IBV_QPT_UD) {
    if (id->state != CmState::kRouteResolved) return EINVAL;
    if (param && param->private_data_len > kSidrReqPrivateSize - kCmaHeaderSize) return EINVAL;
    id->conn.local_comm_id = new_comm_id(id);
    id->conn.transaction_id = next_tid_++;
    id->pending_private_len = 0;
    if (param && param->private_data && param->private_data_len) {
      std::memcpy(id->pending_private, param->private_data, param->private_data_len);
      id->pending_private_len = param->private_data_len;
    }
    id->state = CmState::kSidrReqSent;
    id->refused_grace_end = Clock::now() + std::chrono::milliseconds(kRefusedGraceMs);
    request_over_gsi(id);
    return 0;
  }
  if (id->state != CmState::kRouteResolved) return EINVAL;
  const CmDevice& dev = *id->port.device;
  if (!id->abi.qp && !param) return EINVAL;
  if (param && (!conn_resource_valid(param->responder_resources, dev.max_responder_resources) ||
                !conn_resource_valid(param->initiator_depth, dev.max_initiator_depth)))
    return EINVAL;
  // 56 bytes: the REQ's 92 less the cma header (roce-facts §7.7).
  if (param && param->private_data_len > kReqPrivateSize - kCmaHeaderSize) return EINVAL;

  Connection& c = id->conn;
  c.local_comm_id = new_comm_id(id);
  c.transaction_id = next_tid_++;
  c.local_qpn = id->abi.qp ? id->abi.qp->qp_num : param->qp_num;
  c.srq = id->abi.qp ? id->abi.qp->srq != nullptr : param->srq != 0;
  c.local_psn = random_psn();
  c.responder_resources =
      param ? resource_value(param->responder_resources, dev.max_responder_resources) : dev.max_responder_resources;
  c.initiator_depth = param ? resource_value(param->initiator_depth, dev.max_initiator_depth) : dev.max_initiator_depth;
  c.retry_count = param ? std::min<uint8_t>(param->retry_count, 7) : 7;
  c.rnr_retry_count = param ? std::min<uint8_t>(param->rnr_retry_count, 7) : 7;
  c.flow_control = param && param->flow_control;
  c.local_ack_timeout = id->ack_timeout.value_or(kDefaultAckTimeout);
  c.params_known = true;
  id->pending_private_len = 0;
  if (param && param->private_data && param->private_data_len) {
    std::memcpy(id->pending_private, param->private_data, param->private_data_len);
    id->pending_private_len = param->private_data_len;
  }
  id->state = CmState::kReqSent;
  id->refused_grace_end = Clock::now() + std::chrono::milliseconds(kRefusedGraceMs);
  request_over_gsi(id);
  return 0;
}

void CmService::send_req(CmId* id) {
  const CmDevice& dev = *id->port.device;
  const Connection& c = id->conn;
  ReqMessage req;
  req.local_comm_id = c.local_comm_id;
  req.service_id = service_id(uint16_t(id->abi.ps), id->dst_port);
  req.local_ca_guid = __builtin_bswap64(dev.guid_be);
  req.local_qpn = c.local_qpn;
  req.responder_resources = c.responder_resources;
  req.initiator_depth = c.initiator_depth;
  req.remote_cm_response_timeout = kCmResponseTimeout;
  req.transport_type = transport_of(id->abi.qp_type);
  req.flow_control = c.flow_control;
  req.starting_psn = c.local_psn;
  req.local_cm_response_timeout = kCmResponseTimeout;
  req.retry_count = c.retry_count;
  req.path_mtu = uint8_t(c.path_mtu);
  req.rnr_retry_count = c.rnr_retry_count;
  req.max_cm_retries = kMaxCmRetries;
  req.srq = c.srq;
  req.primary_local_lid = dev.lid;
  req.primary_remote_lid = c.remote_lid;
  req.primary_local_gid = core::ip_to_gid(id->src_ip.bytes);
  req.primary_remote_gid = core::ip_to_gid(id->dst_ip.bytes);
  req.primary_traffic_class = id->tos.value_or(0);
  req.primary_hop_limit = kHopLimit;
  req.primary_local_ack_timeout = c.local_ack_timeout;
  CmaIpHeader hdr{id->src_port, id->src_ip, id->dst_ip};
  encode_cma_header(hdr, std::span<uint8_t, kCmaHeaderSize>(req.private_data.data(), kCmaHeaderSize));
  std::memcpy(req.private_data.data() + kCmaHeaderSize, id->pending_private, id->pending_private_len);
  if (send_mad(id, req, c.transaction_id) != 0) {
    peer_gone(id, ECONNRESET);
    return;
  }
  arm_timer(id, TimerKind::kRep, kRepTimeoutMs);
}

void CmService::on_rep(CmId* id, const RepMessage& rep) {
  cancel_timer(id);
  Connection& c = id->conn;
  c.remote_comm_id = rep.local_comm_id;
  c.remote_qpn = rep.local_qpn;
  c.remote_psn = rep.starting_psn;
  // Never more outstanding READs/atomics than the peer will serve.
  c.initiator_depth = std::min(c.initiator_depth, rep.responder_resources);
  c.rnr_retry_count = rep.rnr_retry_count;  // the active side adopts the REP's
  c.remote_known = true;
  EventParams p;
  p.private_data = rep.private_data.data();
  p.private_data_len = rep.private_data.size();
  p.responder_resources = rep.initiator_depth;  // seen from this side, as the kernel CM reports them
  p.initiator_depth = rep.responder_resources;
  p.flow_control = rep.flow_control;
  p.rnr_retry_count = rep.rnr_retry_count;
  p.srq = rep.srq;
  p.qp_num = rep.local_qpn;
  if (!id->abi.qp) {
    // The application programs its QP and calls rdma_establish.
    id->state = CmState::kRepRcvd;
    queue_event(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, p);
    arm_timer(id, TimerKind::kRep, kRepTimeoutMs);
    return;
  }
  if (int err = program_qp_rts(id)) {
    LOG_WARN("rdma_cm: programming QP %u after REP failed: %s", c.local_qpn, strerror(err));
    qp_to_error(id);
    RejMessage rej;
    rej.local_comm_id = c.local_comm_id;
    rej.remote_comm_id = c.remote_comm_id;
    rej.message_rejected = RejectedMessage::kRep;
    rej.reason = uint16_t(RejReason::kConsumerDefined);
    (void)send_mad(id, rej, c.transaction_id);
    id->state = CmState::kClosed;
    queue_event(id, RDMA_CM_EVENT_CONNECT_ERROR, -err, p);
    return;
  }
  RtuMessage rtu;
  rtu.local_comm_id = c.local_comm_id;
  rtu.remote_comm_id = c.remote_comm_id;
  (void)send_mad(id, rtu, c.transaction_id);
  id->state = CmState::kEstablished;
  queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, p);
}

int CmService::establish(CmId* id) {
  if (id->abi.qp || id->state != CmState::kRepRcvd) return EINVAL;
  cancel_timer(id);
  RtuMessage rtu;
  rtu.local_comm_id = id->conn.local_comm_id;
  rtu.remote_comm_id = id->conn.remote_comm_id;
  (void)send_mad(id, rtu, id->conn.transaction_id);
  id->state = CmState::kEstablished;
  return 0;
}

void CmService::on_rej(CmId* id, const RejMessage& rej) {
  switch (id->state) {
    case CmState::kReqSent:
    case CmState::kRepRcvd:
    case CmState::kReqRcvd:
    case CmState::kRepSent:
      break;
    default:
      return;
  }
  cancel_timer(id);
  qp_to_error(id);
  id->state = CmState::kClosed;
  EventParams p;
  p.private_data = rej.private_data.data();
  p.private_data_len = rej.private_data.size();
  queue_event(id, RDMA_CM_EVENT_REJECTED, rej.reason, p);
}

}  // namespace uroce::rdmacm
