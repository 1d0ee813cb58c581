// UD "connections" (RDMA_PS_UDP / IBV_QPT_UD): SIDR_REQ -> SIDR_REP, which
// tells the active side the remote QPN and Q_Key (0x01234567); nothing more
// is exchanged.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/device.h"
#include "rdmacm/cm_service.h"

namespace uroce::rdmacm {

void CmService::send_sidr_req(CmId* id) {
  SidrReqMessage req;
  req.request_id = id->conn.local_comm_id;
  req.service_id = service_id(uint16_t(id->abi.ps), id->dst_port);
  CmaIpHeader hdr{id->src_port, id->src_ip, id->dst_ip};
  encode_cma_header(hdr, std::span<uint8_t, kCmaHeaderSize>(req.private_data.data(), kCmaHeaderSize));
  std::memcpy(req.private_data.data() + kCmaHeaderSize, id->pending_private, id->pending_private_len);
  if (send_mad(id, req, id->conn.transaction_id) != 0) peer_gone(id, ECONNRESET);
}

void CmService::refuse_sidr(const RequestOrigin& from, uint64_t tid, const SidrReqMessage& req, SidrStatus status) {
  SidrRepMessage rep;
  rep.request_id = req.request_id;
  rep.status = status;
  rep.service_id = req.service_id;
  refuse_request(from, rep, tid);
}

void CmService::on_sidr_req(const RequestOrigin& from, uint64_t tid, const SidrReqMessage& req) {
  CmId* l = from.listener;
  if (l->state != CmState::kListen || l->destroying || l->abi.qp_type != IBV_QPT_UD ||
      service_id_port_space(req.service_id) != uint16_t(l->abi.ps) || service_id_port(req.service_id) != l->src_port) {
    refuse_sidr(from, tid, req, SidrStatus::kSidUnsupported);
    return;
  }
  auto hdr = decode_cma_header(std::span<const uint8_t, kCmaHeaderSize>(req.private_data.data(), kCmaHeaderSize));
  auto dp = device_for_ip(from.local_ip);
  CmId* child = hdr && dp.ok() ? new_passive_id(from, *hdr, *dp) : nullptr;
  if (!child) {
    refuse_sidr(from, tid, req, SidrStatus::kRejected);
    return;
  }
  child->conn.remote_comm_id = req.request_id;
  child->conn.transaction_id = tid;
  child->conn.params_known = true;
  set_route_addresses(child);
  fill_path_record(child);
  child->state = CmState::kReqRcvd;
  EventParams p;
  p.ud = true;
  p.private_data = req.private_data.data() + kCmaHeaderSize;
  p.private_data_len = kSidrReqPrivateSize - kCmaHeaderSize;
  queue_connect_request(l, child, p);
}

int CmService::accept_ud(CmId* id, const rdma_conn_param* param) {
  if (!id->abi.qp && !param) return EINVAL;
  SidrRepMessage rep;
  rep.request_id = id->conn.remote_comm_id;
  rep.status = SidrStatus::kSuccess;
  rep.qpn = id->abi.qp ? id->abi.qp->qp_num : param->qp_num;
  rep.service_id = service_id(uint16_t(id->abi.ps), id->src_port);
  rep.qkey = RDMA_UDP_QKEY;
  if (param && param->private_data && param->private_data_len)
    std::memcpy(rep.private_data.data(), param->private_data, param->private_data_len);
  (void)send_mad(id, rep, id->conn.transaction_id);
  id->state = CmState::kClosed;  // nothing more to exchange for UD
  return 0;
}

int CmService::reject_ud(CmId* id, const void* private_data, uint8_t len) {
  SidrRepMessage rep;
  rep.request_id = id->conn.remote_comm_id;
  rep.status = SidrStatus::kRejected;
  rep.service_id = service_id(uint16_t(id->abi.ps), id->src_port);
  if (private_data && len) std::memcpy(rep.private_data.data(), private_data, len);
  (void)send_mad(id, rep, id->conn.transaction_id);
  id->state = CmState::kClosed;
  return 0;
}

void CmService::on_sidr_rep(CmId* id, const SidrRepMessage& rep) {
  cancel_timer(id);
  id->state = CmState::kClosed;
  EventParams p;
  p.ud = true;
  p.private_data = rep.private_data.data();
  p.private_data_len = rep.private_data.size();
  if (rep.status != SidrStatus::kSuccess) {
    queue_event(id, RDMA_CM_EVENT_UNREACHABLE, int(rep.status), p);
    return;
  }
  // The address handle that reaches the peer's QP.
  p.ah_attr.is_global = 1;
  p.ah_attr.grh.dgid = id->abi.route.addr.addr.ibaddr.dgid;
  p.ah_attr.grh.sgid_index = id->port.gid_index;
  p.ah_attr.grh.hop_limit = kHopLimit;
  p.ah_attr.grh.traffic_class = id->tos.value_or(0);
  p.ah_attr.dlid = id->conn.remote_lid;
  p.ah_attr.port_num = 1;
  p.qp_num = rep.qpn;
  p.qkey = rep.qkey;
  queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, p);
}

}  // namespace uroce::rdmacm
