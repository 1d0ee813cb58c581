// librdmacm C ABI: QPs and SRQs on an id, and rdma_init_qp_attr. The CQs and
// completion channels rdma_create_qp makes when the application gives none
// carry the id as their context: rdma_get_send_comp/rdma_get_recv_comp
// (inline in <rdma/rdma_verbs.h>) assert exactly that.
#include <fcntl.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstring>

#include "rdmacm/api_util.h"
#include "rdmacm/cm_service.h"

using uroce::rdmacm::cm_call;
using uroce::rdmacm::CmId;
using uroce::rdmacm::CmService;
using uroce::verbs::abi_guard;

namespace {

void destroy_cqs(rdma_cm_id* id) {
  if (id->recv_cq) {
    ibv_destroy_cq(id->recv_cq);
    if (id->send_cq && id->send_cq != id->recv_cq) ibv_destroy_cq(id->send_cq);
  } else if (id->send_cq) {
    ibv_destroy_cq(id->send_cq);
  }
  id->recv_cq = id->send_cq = nullptr;
  if (id->recv_cq_channel) {
    ibv_destroy_comp_channel(id->recv_cq_channel);
    if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
      ibv_destroy_comp_channel(id->send_cq_channel);
  } else if (id->send_cq_channel) {
    ibv_destroy_comp_channel(id->send_cq_channel);
  }
  id->recv_cq_channel = id->send_cq_channel = nullptr;
}

// Returns an errno.
int create_cq(rdma_cm_id* id, uint32_t size, ibv_comp_channel** channel, ibv_cq** cq) {
  *channel = ibv_create_comp_channel(id->verbs);
  if (!*channel) return errno ? errno : ENOMEM;
  *cq = ibv_create_cq(id->verbs, int(size), id, *channel, 0);
  if (!*cq) return errno ? errno : ENOMEM;
  return 0;
}

int create_cqs(rdma_cm_id* id, uint32_t send_size, uint32_t recv_size) {
  int err = 0;
  if (recv_size) err = create_cq(id, recv_size, &id->recv_cq_channel, &id->recv_cq);
  if (!err && send_size) err = create_cq(id, send_size, &id->send_cq_channel, &id->send_cq);
  if (err) destroy_cqs(id);
  return err;
}

// Moves a new QP to where librdmacm leaves it: INIT for connected QPs (the CM
// takes it further), RTS with the UDP Q_Key for UD.
int init_new_qp(CmId* cm, ibv_qp* qp) {
  auto& s = CmService::get();
  const ibv_qp_state states_ud[] = {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
  const size_t n = cm->abi.qp_type == IBV_QPT_UD ? 3 : 1;
  for (size_t i = 0; i < n; ++i) {
    ibv_qp_attr attr{};
    attr.qp_state = states_ud[i];
    int mask = 0;
    {
      std::lock_guard lock(s.mu);
      if (int err = s.init_qp_attr(cm, &attr, &mask)) return err;
    }
    if (int err = ibv_modify_qp(qp, &attr, mask)) return err;
  }
  return 0;
}

// The XRC domain librdmacm gives XRC ids that bring none (ucma_get_xrcd): one
// per device, private (no file), opened on first use. Null + errno.
ibv_xrcd* device_xrcd(CmId* cm) {
  auto& s = CmService::get();
  std::lock_guard lock(s.mu);
  uroce::rdmacm::CmDevice* dev = cm->port.device;
  if (!dev) {
    errno = EINVAL;
    return nullptr;
  }
  if (!dev->xrcd) {
    ibv_xrcd_init_attr a{};
    a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    a.fd = -1;
    a.oflags = O_CREAT;
    dev->xrcd = ibv_open_xrcd(dev->verbs, &a);
  }
  return dev->xrcd;
}

}  // namespace

UROCE_API int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
  return cm_call([&] {
    if (!id || !attr) return EINVAL;
    if (id->qp || !id->verbs) return EINVAL;
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
      attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
      attr->pd = id->pd;
    } else if (attr->pd->context != id->verbs) {
      return EINVAL;
    }
    if ((id->recv_cq && attr->recv_cq && id->recv_cq != attr->recv_cq) ||
        (id->send_cq && attr->send_cq && id->send_cq != attr->send_cq))
      return EINVAL;
    const bool made_cqs = !attr->send_cq || !attr->recv_cq;
    if (int err = create_cqs(id, attr->send_cq || id->send_cq ? 0 : attr->cap.max_send_wr,
                             attr->recv_cq || id->recv_cq ? 0 : attr->cap.max_recv_wr))
      return err;
    if (!attr->send_cq) attr->send_cq = id->send_cq;
    if (!attr->recv_cq) attr->recv_cq = id->recv_cq;
    if (id->srq && !attr->srq) attr->srq = id->srq;
    if (attr->qp_type == IBV_QPT_XRC_RECV && (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd)) {
      // An XRC target lives in a domain, not a PD (its receives are the XRC SRQs').
      attr->xrcd = device_xrcd(CmId::from(id));
      if (!attr->xrcd) {
        int err = errno ? errno : ENOMEM;
        if (made_cqs) destroy_cqs(id);
        return err;
      }
      attr->comp_mask |= IBV_QP_INIT_ATTR_XRCD;
    }
    ibv_qp* qp = ibv_create_qp_ex(id->verbs, attr);
    if (!qp) {
      int err = errno ? errno : ENOMEM;
      if (made_cqs) destroy_cqs(id);
      return err;
    }
    CmId* cm = CmId::from(id);
    if (int err = init_new_qp(cm, qp)) {
      ibv_destroy_qp(qp);
      if (made_cqs) destroy_cqs(id);
      return err;
    }
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    if (qp->pd) id->pd = qp->pd;  // an XRC target has none: the id keeps the device's
    id->qp = qp;                  // from now on the CM programs it (rdma_accept, REP)
    return 0;
  });
}

UROCE_API int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!id || !qp_init_attr) {
    errno = EINVAL;
    return -1;
  }
  ibv_qp_init_attr_ex ex{};
  std::memcpy(&ex, qp_init_attr, sizeof *qp_init_attr);
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd ? pd : id->pd;
  int ret = rdma_create_qp_ex(id, &ex);
  std::memcpy(qp_init_attr, &ex, sizeof *qp_init_attr);
  return ret;
}

UROCE_API void rdma_destroy_qp(rdma_cm_id* id) {
  if (!id) return;
  abi_guard([&] {
    ibv_qp* qp;
    {
      auto& s = CmService::get();
      std::lock_guard lock(s.mu);
      qp = id->qp;
      id->qp = nullptr;
    }
    if (qp) ibv_destroy_qp(qp);
    destroy_cqs(id);
  });
}

UROCE_API int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  return cm_call([&] {
    if (!id || !qp_attr || !qp_attr_mask) return EINVAL;
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    return s.init_qp_attr(CmId::from(id), qp_attr, qp_attr_mask);
  });
}

UROCE_API int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  return cm_call([&] {
    if (!id || !attr || !id->verbs) return EINVAL;
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) return EINVAL;
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
      attr->pd = id->pd;
      attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    bool made_cq = false;
    if (attr->srq_type == IBV_SRQT_XRC) {
      // As librdmacm: the device's XRC domain, and the id's receive CQ (made
      // here if the id has none) for the SRQ's completions.
      if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd) {
        attr->xrcd = device_xrcd(CmId::from(id));
        if (!attr->xrcd) return errno ? errno : ENOMEM;
        attr->comp_mask |= IBV_SRQ_INIT_ATTR_XRCD;
      }
      if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq) {
        if (!id->recv_cq) {
          if (int err = create_cqs(id, 0, attr->attr.max_wr)) return err;
          made_cq = true;
        }
        attr->cq = id->recv_cq;
        attr->comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
      }
    }
    ibv_srq* srq = ibv_create_srq_ex(id->verbs, attr);
    if (!srq) {
      int err = errno ? errno : ENOMEM;
      if (made_cq) destroy_cqs(id);
      return err;
    }
    if (!id->pd) id->pd = attr->pd;
    id->srq = srq;
    return 0;
  });
}

UROCE_API int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!id || !attr) {
    errno = EINVAL;
    return -1;
  }
  ibv_srq_init_attr_ex ex{};
  std::memcpy(&ex, attr, sizeof *attr);
  ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  // An XRC target id gets an XRC SRQ (librdmacm's rdma_create_srq does the same).
  ex.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
  ex.pd = pd;
  int ret = rdma_create_srq_ex(id, &ex);
  std::memcpy(attr, &ex, sizeof *attr);
  return ret;
}

UROCE_API void rdma_destroy_srq(rdma_cm_id* id) {
  if (!id) return;
  abi_guard([&] {
    if (id->srq) ibv_destroy_srq(id->srq);
    id->srq = nullptr;
    destroy_cqs(id);
  });
}
