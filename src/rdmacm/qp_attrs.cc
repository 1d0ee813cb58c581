// QP attributes derived from the CM exchange (roce-facts §7.4, the kernel's
// cm_init_qp_*_attr): what rdma_init_qp_attr returns and what the CM itself
// applies to an id's QP during rdma_accept and on a REP. QPs are changed only
// through the public verbs API.
#include <cerrno>
#include <cstring>

#include "core/device.h"
#include "rdmacm/cm_service.h"

namespace uroce::rdmacm {

int CmService::init_qp_attr(const CmId* id, ibv_qp_attr* attr, int* mask) const {
  const ibv_qp_state want = attr->qp_state;
  if (!id->port.device) return EINVAL;
  const Connection& c = id->conn;
  // The attached QP's own type wins over the id's (an RC id may carry a UC QP).
  const ibv_qp_type type = id->abi.qp ? id->abi.qp->qp_type : id->abi.qp_type;
  const bool ud = type == IBV_QPT_UD;
  // XRC initiators and targets are RC send and receive halves (IBA 9.8).
  const bool rc = type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND || type == IBV_QPT_XRC_RECV;
  std::memset(attr, 0, sizeof *attr);
  attr->qp_state = want;
  switch (want) {
    case IBV_QPS_INIT:
      attr->pkey_index = 0;
      attr->port_num = 1;
      *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      if (ud) {
        attr->qkey = RDMA_UDP_QKEY;
        *mask |= IBV_QP_QKEY;
      } else {
        // Before the REQ the kernel grants no remote access; after it,
        // writes always, reads and atomics if this side serves any.
        if (c.params_known) {
          attr->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
          if (rc && c.responder_resources) attr->qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        }
        *mask |= IBV_QP_ACCESS_FLAGS;
      }
      return 0;
    case IBV_QPS_RTR:
      *mask = IBV_QP_STATE;
      if (ud) return 0;
      if (!c.remote_known) return EINVAL;
      attr->ah_attr.is_global = 1;
      attr->ah_attr.grh.dgid = id->abi.route.addr.addr.ibaddr.dgid;
      attr->ah_attr.grh.sgid_index = id->port.gid_index;
      attr->ah_attr.grh.hop_limit = kHopLimit;
      attr->ah_attr.grh.traffic_class = id->tos.value_or(0);
      attr->ah_attr.dlid = c.remote_lid;  // LID = the peer's UDP port (design §3)
      attr->ah_attr.port_num = 1;
      attr->path_mtu = c.path_mtu;
      attr->dest_qp_num = c.remote_qpn;
      // rdma_cm's convention (the kernel's rdma_init_qp_attr, which sets rq_psn
      // to the id's seq_num, the starting PSN of its own REQ or REP): each side
      // announces the PSN it will receive from, and sends from the peer's.
      attr->rq_psn = c.local_psn;
      *mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (rc && type != IBV_QPT_XRC_SEND) {  // an initiator has no receive side
        attr->max_dest_rd_atomic = c.responder_resources;
        attr->min_rnr_timer = 0;  // as the kernel CM (roce-facts §7.4)
        *mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
      return 0;
    case IBV_QPS_RTS:
      *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
      if (ud) return 0;  // sq_psn 0
      if (!c.remote_known) return EINVAL;
      attr->sq_psn = c.remote_psn;     // the peer's announced starting PSN (see RTR)
      if (type == IBV_QPT_XRC_RECV) {  // a target sends only responses
        attr->timeout = c.local_ack_timeout;
        *mask |= IBV_QP_TIMEOUT;
      } else if (rc) {
        attr->timeout = c.local_ack_timeout;
        attr->retry_cnt = c.retry_count;
        attr->rnr_retry = c.rnr_retry_count;
        attr->max_rd_atomic = c.initiator_depth;
        *mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      }
      return 0;
    default:
      return EINVAL;
  }
}

int CmService::program_qp_rts(CmId* id) {
  ibv_qp* qp = id->abi.qp;
  if (!qp) return 0;
  // INIT -> INIT first: the access flags depend on the negotiated resources.
  // An XRC target only receives: RTR is as far as it goes (as ibv_xsrq_pingpong).
  for (ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
    if (s == IBV_QPS_RTS && qp->qp_type == IBV_QPT_XRC_RECV) break;
    ibv_qp_attr attr{};
    attr.qp_state = s;
    int mask = 0;
    if (int err = init_qp_attr(id, &attr, &mask)) return err;
    if (int err = ibv_modify_qp(qp, &attr, mask)) return err;
  }
  return 0;
}

void CmService::qp_to_error(CmId* id) {
  if (!id->abi.qp) return;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  (void)ibv_modify_qp(id->abi.qp, &attr, IBV_QP_STATE);
}

}  // namespace uroce::rdmacm
