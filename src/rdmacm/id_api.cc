// librdmacm C ABI: event channels and events, ids, binding, resolution,
// listening, options, ports and devices.
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "rdmacm/api_util.h"
#include "rdmacm/cm_service.h"
#include "rdmacm/sockaddr_util.h"

using uroce::rdmacm::abi_result;
using uroce::rdmacm::cm_call;
using uroce::rdmacm::CmEvent;
using uroce::rdmacm::CmId;
using uroce::rdmacm::CmService;
using uroce::rdmacm::EventChannel;
using uroce::verbs::abi_guard;

namespace uroce::rdmacm {

// rdma_create_id with an explicit QP type (rdma_create_ep uses the
// rdma_addrinfo's). A null channel makes a synchronous id with its own.
int create_id(rdma_event_channel* channel, rdma_cm_id** out, void* context, rdma_port_space ps, ibv_qp_type qp_type) {
  if (!out) return EINVAL;
  switch (ps) {
    case RDMA_PS_TCP:
    case RDMA_PS_UDP:
    case RDMA_PS_IB:
    case RDMA_PS_IPOIB:
      break;
    default:
      return EINVAL;
  }
  EventChannel* ch = channel ? EventChannel::from(channel) : EventChannel::create();
  if (!ch) return errno;
  auto& s = CmService::get();
  std::lock_guard lock(s.mu);
  *out = &s.create_id(ch, channel == nullptr, context, ps, qp_type)->abi;
  return 0;
}

}  // namespace uroce::rdmacm

UROCE_API rdma_event_channel* rdma_create_event_channel(void) {
  return abi_guard<rdma_event_channel*>(nullptr, []() -> rdma_event_channel* {
    EventChannel* c = EventChannel::create();
    return c ? &c->abi : nullptr;
  });
}

UROCE_API void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (!channel) return;
  abi_guard([&] {
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    EventChannel::from(channel)->destroy();
  });
}

UROCE_API int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  return cm_call([&] {
    if (!channel || !event) return EINVAL;
    CmEvent* e = nullptr;
    if (int err = CmService::get().get_event(EventChannel::from(channel), &e)) return err;
    *event = &e->ev;
    return 0;
  });
}

UROCE_API int rdma_ack_cm_event(rdma_cm_event* event) {
  return cm_call([&] {
    if (!event) return EINVAL;
    CmService::get().ack_event(CmEvent::from(event));
    return 0;
  });
}

UROCE_API int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) {
  return cm_call([&] {
    const ibv_qp_type qp_type = (ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB) ? IBV_QPT_UD : IBV_QPT_RC;
    return uroce::rdmacm::create_id(channel, id, context, ps, qp_type);
  });
}

UROCE_API int rdma_destroy_id(rdma_cm_id* id) {
  return cm_call([&] {
    if (!id) return EINVAL;
    auto& s = CmService::get();
    if (id->event) {
      s.ack_event(CmEvent::from(id->event));
      id->event = nullptr;
    }
    std::unique_lock lock(s.mu);
    uroce::rdmacm::leave_all_multicast(CmId::from(id));
    s.destroy_id(CmId::from(id), lock);
    return 0;
  });
}

UROCE_API int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  return cm_call([&] {
    if (!id || !uroce::rdmacm::sockaddr_len(addr)) return EINVAL;
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    return s.bind(CmId::from(id), addr);
  });
}

UROCE_API int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms) {
  return cm_call([&] {
    if (!id || !uroce::rdmacm::sockaddr_len(dst_addr)) return EINVAL;
    if (src_addr && !uroce::rdmacm::sockaddr_len(src_addr)) return EINVAL;
    auto& s = CmService::get();
    {
      std::lock_guard lock(s.mu);
      if (int err = s.resolve_addr(CmId::from(id), src_addr, dst_addr, timeout_ms)) return err;
    }
    return s.complete_sync(CmId::from(id));
  });
}

UROCE_API int rdma_resolve_route(rdma_cm_id* id, int timeout_ms) {
  return cm_call([&] {
    if (!id) return EINVAL;
    auto& s = CmService::get();
    {
      std::lock_guard lock(s.mu);
      if (int err = s.resolve_route(CmId::from(id), timeout_ms)) return err;
    }
    return s.complete_sync(CmId::from(id));
  });
}

UROCE_API int rdma_listen(rdma_cm_id* id, int backlog) {
  return cm_call([&] {
    if (!id) return EINVAL;
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    return s.listen(CmId::from(id), backlog);
  });
}

UROCE_API int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  return cm_call([&] {
    if (!id) return EINVAL;
    auto& s = CmService::get();
    CmId* cm = CmId::from(id);
    {
      std::lock_guard lock(s.mu);
      if (cm->sync && !channel) return EINVAL;
    }
    EventChannel* to = channel ? EventChannel::from(channel) : EventChannel::create();
    if (!to) return errno;
    std::unique_lock lock(s.mu);
    s.migrate_id(cm, to, channel == nullptr, lock);
    return 0;
  });
}

UROCE_API int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  return cm_call([&] {
    if (!id || !optval) return EINVAL;
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    CmId* cm = CmId::from(id);
    if (level == RDMA_OPTION_ID) {
      switch (optname) {
        case RDMA_OPTION_ID_TOS:
          if (optlen != sizeof(uint8_t)) return EINVAL;
          cm->tos = *static_cast<uint8_t*>(optval);
          return 0;
        case RDMA_OPTION_ID_REUSEADDR:
          if (optlen != sizeof(int)) return EINVAL;
          cm->reuseaddr = *static_cast<int*>(optval) != 0;
          return 0;
        case RDMA_OPTION_ID_AFONLY:
          if (optlen != sizeof(int)) return EINVAL;
          cm->afonly = *static_cast<int*>(optval) != 0;
          return 0;
        case RDMA_OPTION_ID_ACK_TIMEOUT: {
          if (optlen != sizeof(uint8_t)) return EINVAL;
          uint8_t t = *static_cast<uint8_t*>(optval);
          if (t > 31) return EINVAL;
          cm->ack_timeout = t;
          return 0;
        }
        default:
          return ENOSYS;
      }
    }
    if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH) {
      // A path record supplied by the application replaces route resolution.
      if (optlen == 0 || optlen % sizeof(ibv_path_data) != 0) return EINVAL;
      return s.resolve_route(cm, 0);
    }
    return ENOSYS;
  });
}

namespace {
__be16 sockaddr_port_be(const sockaddr* a) {
  if (a->sa_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(a)->sin_port;
  if (a->sa_family == AF_INET6) return reinterpret_cast<const sockaddr_in6*>(a)->sin6_port;
  return 0;
}
}  // namespace

UROCE_API __be16 rdma_get_src_port(rdma_cm_id* id) { return id ? sockaddr_port_be(&id->route.addr.src_addr) : 0; }

UROCE_API __be16 rdma_get_dst_port(rdma_cm_id* id) { return id ? sockaddr_port_be(&id->route.addr.dst_addr) : 0; }

UROCE_API ibv_context** rdma_get_devices(int* num_devices) {
  if (num_devices) *num_devices = 0;
  return abi_guard<ibv_context**>(nullptr, [&]() -> ibv_context** {
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    auto devs = uroce::rdmacm::cm_devices();
    if (!devs.ok()) {
      errno = devs.err();
      return nullptr;
    }
    auto** list = static_cast<ibv_context**>(calloc(devs->size() + 1, sizeof(ibv_context*)));
    if (!list) {
      errno = ENOMEM;
      return nullptr;
    }
    for (size_t i = 0; i < devs->size(); ++i) list[i] = (*devs)[i]->verbs;
    if (num_devices) *num_devices = int(devs->size());
    return list;
  });
}

UROCE_API void rdma_free_devices(ibv_context** list) { free(list); }

UROCE_API const char* rdma_event_str(rdma_cm_event_type event) {
  switch (event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR:
      return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE:
      return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED:
      return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED:
      return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED:
      return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN:
      return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR:
      return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE:
      return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
  }
  return "UNKNOWN EVENT";
}
