// librdmacm C ABI: rdma_getaddrinfo and the synchronous endpoint calls
// (rdma_create_ep, rdma_get_request, rdma_destroy_ep) that the classic
// <rdma/rdma_verbs.h> programs are written with.
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "rdmacm/api_util.h"
#include "rdmacm/cm_service.h"

using uroce::rdmacm::cm_call;
using uroce::rdmacm::CmEvent;
using uroce::rdmacm::CmId;
using uroce::rdmacm::CmService;
using uroce::verbs::abi_guard;

namespace uroce::rdmacm {
int create_id(rdma_event_channel* channel, rdma_cm_id** out, void* context, rdma_port_space ps, ibv_qp_type qp_type);
}

namespace {

int copy_addr(sockaddr** dst, socklen_t* dst_len, const sockaddr* src, socklen_t len) {
  *dst = static_cast<sockaddr*>(malloc(len));
  if (!*dst) return ENOMEM;
  std::memcpy(*dst, src, len);
  *dst_len = len;
  return 0;
}

addrinfo to_addrinfo_hints(const rdma_addrinfo& h) {
  addrinfo ai{};
  if (h.ai_flags & RAI_PASSIVE) ai.ai_flags |= AI_PASSIVE;
  if (h.ai_flags & RAI_NUMERICHOST) ai.ai_flags |= AI_NUMERICHOST;
  if (h.ai_family != AF_IB) ai.ai_family = h.ai_family;
  switch (h.ai_qp_type) {
    case IBV_QPT_RC:
    case IBV_QPT_UC:
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV:
      ai.ai_socktype = SOCK_STREAM;
      break;
    case IBV_QPT_UD:
      ai.ai_socktype = SOCK_DGRAM;
      break;
    default:
      break;
  }
  switch (h.ai_port_space) {
    case RDMA_PS_TCP:
      ai.ai_protocol = IPPROTO_TCP;
      break;
    case RDMA_PS_UDP:
    case RDMA_PS_IPOIB:
      ai.ai_protocol = IPPROTO_UDP;
      break;
    case RDMA_PS_IB:
      if (ai.ai_socktype == SOCK_STREAM) ai.ai_protocol = IPPROTO_TCP;
      if (ai.ai_socktype == SOCK_DGRAM) ai.ai_protocol = IPPROTO_UDP;
      break;
    default:
      break;
  }
  return ai;
}

// Fills `rai` from the first getaddrinfo answer; returns an EAI_* code or an errno.
int resolve(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo* rai) {
  addrinfo* res = nullptr;
  int ret;
  if (hints) {
    addrinfo h = to_addrinfo_hints(*hints);
    ret = getaddrinfo(node, service, &h, &res);
  } else {
    ret = getaddrinfo(node, service, nullptr, &res);
  }
  if (ret) return ret;
  if (hints && hints->ai_qp_type) {
    rai->ai_qp_type = hints->ai_qp_type;
  } else {
    rai->ai_qp_type = res->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD : IBV_QPT_RC;
  }
  if (hints && hints->ai_port_space) {
    rai->ai_port_space = hints->ai_port_space;
  } else {
    rai->ai_port_space = res->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP : RDMA_PS_TCP;
  }
  rai->ai_family = res->ai_family;
  if (res->ai_flags & AI_PASSIVE) {
    rai->ai_flags = RAI_PASSIVE;
    if (res->ai_canonname) rai->ai_src_canonname = strdup(res->ai_canonname);
    ret = copy_addr(&rai->ai_src_addr, &rai->ai_src_len, res->ai_addr, res->ai_addrlen);
  } else {
    if (res->ai_canonname) rai->ai_dst_canonname = strdup(res->ai_canonname);
    ret = copy_addr(&rai->ai_dst_addr, &rai->ai_dst_len, res->ai_addr, res->ai_addrlen);
  }
  freeaddrinfo(res);
  return ret;
}

}  // namespace

UROCE_API void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    free(res->ai_connect);
    free(res->ai_route);
    free(res->ai_src_canonname);
    free(res->ai_dst_canonname);
    free(res->ai_src_addr);
    free(res->ai_dst_addr);
    free(res);
    res = next;
  }
}

// As librdmacm: one answer (the first), and on failure -1 with errno set to
// the getaddrinfo (EAI_*) code or the errno.
UROCE_API int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res) {
  if ((!node && !service && !hints) || !res) {
    errno = EINVAL;
    return -1;
  }
  auto* rai = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  if (!rai) {
    errno = ENOMEM;
    return -1;
  }
  int ret = 0;
  if (node || service) {
    ret = resolve(node, service, hints, rai);
  } else {
    rai->ai_flags = hints->ai_flags;
    rai->ai_family = hints->ai_family;
    rai->ai_qp_type = hints->ai_qp_type;
    rai->ai_port_space = hints->ai_port_space;
    if (hints->ai_dst_len) ret = copy_addr(&rai->ai_dst_addr, &rai->ai_dst_len, hints->ai_dst_addr, hints->ai_dst_len);
  }
  if (!ret && !rai->ai_src_len && hints && hints->ai_src_len)
    ret = copy_addr(&rai->ai_src_addr, &rai->ai_src_len, hints->ai_src_addr, hints->ai_src_len);
  if (ret) {
    rdma_freeaddrinfo(rai);
    errno = ret;
    return -1;
  }
  *res = rai;
  return 0;
}

UROCE_API void rdma_destroy_ep(rdma_cm_id* id) {
  if (!id) return;
  if (id->qp) rdma_destroy_qp(id);
  if (id->srq) rdma_destroy_srq(id);
  rdma_destroy_id(id);
}

UROCE_API int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!id || !res) {
    errno = EINVAL;
    return -1;
  }
  rdma_cm_id* cm_id = nullptr;
  int ret = cm_call([&] {
    return uroce::rdmacm::create_id(nullptr, &cm_id, nullptr, rdma_port_space(res->ai_port_space),
                                    ibv_qp_type(res->ai_qp_type));
  });
  if (ret) return ret;
  if (res->ai_flags & RAI_PASSIVE) {
    ret = rdma_bind_addr(cm_id, res->ai_src_addr);
    if (!ret) {
      if (pd) cm_id->pd = pd;
      if (qp_init_attr) {
        // rdma_get_request creates each new id's QP with these.
        auto attr = std::make_unique<ibv_qp_init_attr>(*qp_init_attr);
        attr->qp_type = ibv_qp_type(res->ai_qp_type);
        auto& s = CmService::get();
        std::lock_guard lock(s.mu);
        CmId::from(cm_id)->ep_qp_init_attr = std::move(attr);
      }
    }
  } else {
    ret = rdma_resolve_addr(cm_id, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (!ret) ret = rdma_resolve_route(cm_id, 2000);
    if (!ret && qp_init_attr) {
      qp_init_attr->qp_type = ibv_qp_type(res->ai_qp_type);
      ret = rdma_create_qp(cm_id, pd, qp_init_attr);
    }
  }
  if (ret) {
    int err = errno;
    rdma_destroy_ep(cm_id);
    errno = err;
    return ret;
  }
  *id = cm_id;
  return 0;
}

UROCE_API int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (!listen || !id) {
    errno = EINVAL;
    return -1;
  }
  return abi_guard<int>(-1, [&] {
    auto& s = CmService::get();
    CmId* l = CmId::from(listen);
    ibv_qp_init_attr* ep_attr = nullptr;
    {
      std::lock_guard lock(s.mu);
      if (!l->sync) {
        errno = EINVAL;
        return -1;
      }
      ep_attr = l->ep_qp_init_attr.get();
    }
    if (listen->event) {
      s.ack_event(CmEvent::from(listen->event));
      listen->event = nullptr;
    }
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(listen->channel, &event)) return -1;
    int err = 0;
    if (event->status) {
      err = event->status < 0 ? -event->status : event->status;
    } else if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      err = EINVAL;
    } else if (ep_attr) {
      ibv_qp_init_attr attr = *ep_attr;
      if (rdma_create_qp(event->id, listen->pd, &attr)) err = errno;
    }
    if (err) {
      listen->event = event;  // acknowledged by the next call or rdma_destroy_id
      errno = err;
      return -1;
    }
    *id = event->id;
    (*id)->event = event;
    return 0;
  });
}
