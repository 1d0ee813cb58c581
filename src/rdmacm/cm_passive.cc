// The passive side: rdma_listen, a REQ (CONNECT_REQUEST and its new id),
// rdma_accept (QP to RTS, then REP), the RTU, rdma_reject.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/device.h"
#include "core/limits.h"
#include "core/log.h"
#include "rdmacm/cm_service.h"

namespace uroce::rdmacm {

int CmService::listen(CmId* id, int backlog) {
  if (id->state != CmState::kIdle) return EINVAL;
  id->backlog = backlog > 0 && backlog < kMaxBacklog ? backlog : kMaxBacklog;
  if (!id->bound) {
    // As the kernel: listening on an unbound id binds it to any address.
    if (int err = open_bound_socket(id, 0, 0)) return err;
    id->bound = true;
    set_route_addresses(id);
  }
  // The engines pass the REQs for the id's port to its socket (cm_gsi.cc).
  // A listener on the wildcard (or loopback) attaches no device, but a REQ
  // over QP1 from another host reaches it only through an engine of this host
  // at the RoCE port: with none open (the first uroce process on the host
  // listening on ::), nobody would receive it. As the kernel's rdma_listen on
  // any address listens on every device (cma_listen_on_all), every device is
  // opened, and id->verbs stays NULL. Without one, only this host's peers
  // (whose own engine holds the port) can connect.
  if (!id->port.device) {
    if (auto devs = cm_devices(); !devs.ok())
      LOG_INFO("rdma_cm: listener on port %u: no device open (%s): only peers on this host reach it over QP1",
               id->src_port, strerror(devs.err()));
  }
  id->state = CmState::kListen;
  ensure_thread();
  return 0;
}

void CmService::reject_request(const RequestOrigin& from, uint64_t tid, const ReqMessage& req, RejReason reason) {
  RejMessage rej;
  rej.remote_comm_id = req.local_comm_id;
  rej.message_rejected = RejectedMessage::kReq;
  rej.reason = uint16_t(reason);
  refuse_request(from, rej, tid);
}

void CmService::refuse_request(const RequestOrigin& from, const CmMessage& answer, uint64_t tid) {
  send_gsi_from(from.local_ip, from.gsi_reply, answer, tid);
}

namespace {
// The peer as the cma header of its request names it (the sender itself when
// the header has the wildcard), with the interface of a link-local address,
// which the header does not carry.
transport::IpAddress peer_address(const CmaIpHeader& h, const RequestOrigin& from) {
  transport::IpAddress a = h.src_ip.unspecified() ? from.peer_ip : h.src_ip;
  if (a.link_local()) a.scope = a.bytes == from.peer_ip.bytes ? from.peer_ip.scope : from.local_ip.scope;
  return a;
}
}  // namespace

CmId* CmService::new_passive_id(const RequestOrigin& from, const CmaIpHeader& hdr, const DevicePort& dp) {
  CmId* l = from.listener;
  // A synchronous listener's new ids get channels of their own (rdma_get_request).
  EventChannel* channel = l->sync ? EventChannel::create() : l->channel();
  if (!channel) return nullptr;
  CmId* child = create_id(channel, l->sync, l->abi.context, l->abi.ps, l->abi.qp_type);
  child->port = dp;
  child->abi.verbs = dp.device->verbs;
  child->abi.pd = dp.device->pd;
  child->abi.port_num = 1;
  child->bound = true;
  child->src_ip = from.local_ip;
  child->src_port = l->src_port;
  child->dst_ip = peer_address(hdr, from);
  child->dst_port = hdr.src_port;
  child->tos = l->tos;
  child->ack_timeout = l->ack_timeout;
  child->conn.local_comm_id = new_comm_id(child);
  child->from_request = true;
  go_over_gsi(child, from.gsi_reply);
  return child;
}

bool CmService::backlog_full(const CmId* l) {
  if (l->requests_queued < l->backlog) return false;
  ++requests_over_backlog_;
  log_limited(core::LogLevel::kInfo,
              "rdma_cm: listener %llu: backlog of %d requests full, request dropped (%llu so far)",
              (unsigned long long)l->serial, l->backlog, (unsigned long long)requests_over_backlog_);
  return true;
}

void CmService::on_req(const RequestOrigin& from, uint64_t tid, const ReqMessage& req) {
  CmId* l = from.listener;
  if (l->state != CmState::kListen || l->destroying) {
    reject_request(from, tid, req, RejReason::kInvalidServiceId);
    return;
  }
  if (service_id_port_space(req.service_id) != uint16_t(l->abi.ps) || service_id_port(req.service_id) != l->src_port) {
    reject_request(from, tid, req, RejReason::kInvalidServiceId);
    return;
  }
  const uint8_t want_transport = transport_of(l->abi.qp_type);
  if (l->abi.qp_type == IBV_QPT_UD || req.transport_type != want_transport) {
    reject_request(from, tid, req, RejReason::kInvalidTransportType);
    return;
  }
  auto hdr = decode_cma_header(std::span<const uint8_t, kCmaHeaderSize>(req.private_data.data(), kCmaHeaderSize));
  auto dp = device_for_ip(from.local_ip);
  if (!hdr || !dp.ok()) {
    reject_request(from, tid, req, hdr ? RejReason::kInvalidGid : RejReason::kConsumerDefined);
    return;
  }
  if (backlog_full(l)) return;  // its CM sends it again
  CmId* child = new_passive_id(from, *hdr, *dp);
  if (!child) {
    reject_request(from, tid, req, RejReason::kNoQp);
    return;
  }
  const CmDevice& dev = *dp->device;
  Connection& c = child->conn;
  c.remote_comm_id = req.local_comm_id;
  c.transaction_id = tid;
  c.remote_qpn = req.local_qpn;
  c.remote_psn = req.starting_psn;
  c.remote_lid = req.primary_local_lid;
  c.remote_gid = req.primary_local_gid;
  c.path_mtu = ibv_mtu(std::clamp<uint8_t>(req.path_mtu, IBV_MTU_256, uint8_t(dev.max_mtu)));
  c.retry_count = req.retry_count;
  c.rnr_retry_count = req.rnr_retry_count;  // the passive side adopts the REQ's
  c.local_ack_timeout = child->ack_timeout.value_or(req.primary_local_ack_timeout);
  c.flow_control = req.flow_control;
  c.responder_resources = std::min(req.initiator_depth, dev.max_responder_resources);
  c.initiator_depth = std::min(req.responder_resources, dev.max_initiator_depth);
  c.peer_responder_resources = req.responder_resources;
  c.local_psn = new_psn();
  c.params_known = true;
  c.remote_known = true;
  if (!child->tos) child->tos = req.primary_traffic_class;

  set_route_addresses(child);
  // The peer's GID as it announced it (normally the address it sent from).
  child->abi.route.addr.addr.ibaddr.dgid = c.remote_gid;
  fill_path_record(child);
  child->state = CmState::kReqRcvd;

  EventParams p;
  p.private_data = req.private_data.data() + kCmaHeaderSize;
  p.private_data_len = kReqPrivateSize - kCmaHeaderSize;
  p.responder_resources = req.initiator_depth;  // seen from this side, as the kernel CM reports them
  p.initiator_depth = req.responder_resources;
  p.flow_control = req.flow_control;
  p.retry_count = req.retry_count;
  p.rnr_retry_count = req.rnr_retry_count;
  p.srq = req.srq;
  p.qp_num = req.local_qpn;
  queue_connect_request(l, child, p);
}

int CmService::accept(CmId* id, const rdma_conn_param* param) {
  if (id->abi.qp_type == IBV_QPT_UD) {
    if (id->state != CmState::kReqRcvd) return EINVAL;
    if (param && param->private_data_len > kSidrRepPrivateSize) return EINVAL;
    // answered in cm_sidr.cc
    return accept_ud(id, param);
  }
  if (id->state != CmState::kReqRcvd) return EINVAL;
  const CmDevice& dev = *id->port.device;
  if (!id->abi.qp && !param) return EINVAL;
  if (param && (!conn_resource_valid(param->responder_resources, dev.max_responder_resources) ||
                !conn_resource_valid(param->initiator_depth, dev.max_initiator_depth)))
    return EINVAL;
  if (param && param->private_data_len > kRepPrivateSize) return EINVAL;

  Connection& c = id->conn;
  if (param && param->initiator_depth != RDMA_MAX_INIT_DEPTH) c.initiator_depth = param->initiator_depth;
  if (param && param->responder_resources != RDMA_MAX_RESP_RES) c.responder_resources = param->responder_resources;
  // Never more outstanding READs/atomics than the active side will serve.
  c.initiator_depth = std::min(c.initiator_depth, c.peer_responder_resources);
  c.local_qpn = id->abi.qp ? id->abi.qp->qp_num : param->qp_num;
  c.srq = id->abi.qp ? id->abi.qp->srq != nullptr : param->srq != 0;
  // As librdmacm: the QP reaches RTS before the REP leaves (roce-facts §7.4).
  if (id->abi.qp) {
    if (int err = program_qp_rts(id)) {
      qp_to_error(id);
      return err;
    }
  }
  RepMessage rep;
  rep.local_comm_id = c.local_comm_id;
  rep.remote_comm_id = c.remote_comm_id;
  rep.local_qpn = c.local_qpn;
  rep.starting_psn = c.local_psn;
  rep.responder_resources = c.responder_resources;
  rep.initiator_depth = c.initiator_depth;
  rep.target_ack_delay = core::kLocalCaAckDelay;  // the device's local_ca_ack_delay
  rep.flow_control = param && param->flow_control;
  rep.rnr_retry_count = param ? std::min<uint8_t>(param->rnr_retry_count, 7) : 7;
  rep.srq = c.srq;
  rep.local_ca_guid = __builtin_bswap64(dev.guid_be);
  if (param && param->private_data && param->private_data_len)
    std::memcpy(rep.private_data.data(), param->private_data, param->private_data_len);
  if (send_mad(id, rep, c.transaction_id) != 0) {
    peer_gone(id, ECONNRESET);
    return 0;
  }
  id->state = CmState::kRepSent;
  arm_timer(id, TimerKind::kRep, kRepTimeoutMs);
  return 0;
}

void CmService::on_rtu(CmId* id) {
  if (id->state != CmState::kRepSent) return;
  cancel_timer(id);
  id->state = CmState::kEstablished;
  queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
}

int CmService::notify(CmId* id, ibv_event_type event) {
  // Traffic that arrives before the RTU establishes the connection (IBA 12.9.8.3).
  if (event == IBV_EVENT_COMM_EST && id->state == CmState::kRepSent) on_rtu(id);
  return 0;
}

int CmService::reject(CmId* id, const void* private_data, uint8_t len, RejReason reason) {
  if (id->state != CmState::kReqRcvd) return EINVAL;
  if (id->abi.qp_type == IBV_QPT_UD) {
    if (len > kSidrRepPrivateSize) return EINVAL;
    return reject_ud(id, private_data, len);
  }
  if (len > kRejPrivateSize) return EINVAL;
  RejMessage rej;
  rej.local_comm_id = id->conn.local_comm_id;
  rej.remote_comm_id = id->conn.remote_comm_id;
  rej.message_rejected = RejectedMessage::kReq;
  rej.reason = uint16_t(reason);
  if (private_data && len) std::memcpy(rej.private_data.data(), private_data, len);
  (void)send_mad(id, rej, id->conn.transaction_id);
  id->state = CmState::kClosed;
  return 0;
}

}  // namespace uroce::rdmacm
