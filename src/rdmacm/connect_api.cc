// librdmacm C ABI: connecting, accepting, rejecting, disconnecting, and ECE.
#include <rdma/rdma_cma.h>

#include <cerrno>

#include "rdmacm/api_util.h"
#include "rdmacm/cm_service.h"

using uroce::rdmacm::cm_call;
using uroce::rdmacm::CmEvent;
using uroce::rdmacm::CmId;
using uroce::rdmacm::CmService;
using uroce::rdmacm::RejReason;

UROCE_API int rdma_connect(rdma_cm_id* id, rdma_conn_param* conn_param) {
  return cm_call([&] {
    if (!id) return EINVAL;
    auto& s = CmService::get();
    {
      std::lock_guard lock(s.mu);
      if (int err = s.connect(CmId::from(id), conn_param)) return err;
    }
    return s.complete_sync(CmId::from(id));
  });
}

UROCE_API int rdma_accept(rdma_cm_id* id, rdma_conn_param* conn_param) {
  return cm_call([&] {
    if (!id) return EINVAL;
    auto& s = CmService::get();
    CmId* cm = CmId::from(id);
    bool sync = false;
    {
      std::lock_guard lock(s.mu);
      if (int err = s.accept(cm, conn_param)) return err;
      sync = cm->sync;
    }
    if (id->qp_type == IBV_QPT_UD) {
      // No RTU for UD: nothing to wait for; the CONNECT_REQUEST is done with.
      if (sync && id->event) {
        s.ack_event(CmEvent::from(id->event));
        id->event = nullptr;
      }
      return 0;
    }
    return s.complete_sync(cm);
  });
}

UROCE_API int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return cm_call([&] {
    if (!id) return EINVAL;
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    return s.reject(CmId::from(id), private_data, private_data_len, RejReason::kConsumerDefined);
  });
}

UROCE_API int rdma_reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return cm_call([&] {
    if (!id) return EINVAL;
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    return s.reject(CmId::from(id), private_data, private_data_len, RejReason::kVendorOptionNotSupported);
  });
}

UROCE_API int rdma_disconnect(rdma_cm_id* id) {
  return cm_call([&] {
    if (!id) return EINVAL;
    auto& s = CmService::get();
    {
      std::lock_guard lock(s.mu);
      if (int err = s.disconnect(CmId::from(id))) return err;
    }
    return s.complete_sync(CmId::from(id));
  });
}

UROCE_API int rdma_establish(rdma_cm_id* id) {
  return cm_call([&] {
    if (!id) return EINVAL;
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    return s.establish(CmId::from(id));
  });
}

UROCE_API int rdma_notify(rdma_cm_id* id, ibv_event_type event) {
  return cm_call([&] {
    if (!id) return EINVAL;
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    return s.notify(CmId::from(id), event);
  });
}

// ECE (enhanced connection establishment) options are vendor-specific and
// uroce has none: the local options are kept, and no peer ever offers any.
UROCE_API int rdma_set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
  return cm_call([&] {
    if (!id || !ece || ece->comp_mask) return EINVAL;
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    CmId* cm = CmId::from(id);
    cm->ece_vendor_id = ece->vendor_id;
    cm->ece_options = ece->options;
    return 0;
  });
}

UROCE_API int rdma_get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
  return cm_call([&] {
    if (!id || !ece) return EINVAL;
    *ece = ibv_ece{};
    return 0;
  });
}
