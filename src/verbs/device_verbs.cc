// Devices and contexts: ibv_get_device_list … ibv_query_pkey.
#include <infiniband/verbs.h>
#include <net/if.h>
#include <pthread.h>
#include <signal.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/device.h"
#include "core/guarded_access.h"
#include "engine/engine_context.h"
#include "verbs/export.h"
#include "verbs/import.h"
#include "verbs/ops.h"

#undef ibv_get_device_list
#undef ibv_query_port

using uroce::core::Device;
using uroce::engine::EngineContext;
using uroce::verbs::abi_guard;
using uroce::verbs::abi_guard_errno;
using uroce::verbs::abi_guard_neg_errno;

UROCE_API ibv_device** ibv_get_device_list(int* num_devices) {
  return abi_guard<ibv_device**>(nullptr, [&]() -> ibv_device** {
    auto devs = uroce::core::devices();
    auto** list = static_cast<ibv_device**>(std::calloc(devs.size() + 1, sizeof(ibv_device*)));
    if (!list) {
      errno = ENOMEM;
      return nullptr;
    }
    for (size_t i = 0; i < devs.size(); ++i) list[i] = &devs[i]->ibdev;
    if (num_devices) *num_devices = int(devs.size());
    return list;
  });
}

UROCE_API void ibv_free_device_list(ibv_device** list) { std::free(list); }

UROCE_API const char* ibv_get_device_name(ibv_device* device) { return device ? device->name : nullptr; }

UROCE_API __be64 ibv_get_device_guid(ibv_device* device) {
  return device ? __builtin_bswap64(Device::from(device)->guid) : 0;
}

UROCE_API int ibv_get_device_index(ibv_device* device) {
  return abi_guard<int>(-1, [&] {
    auto devs = uroce::core::devices();
    for (size_t i = 0; i < devs.size(); ++i)
      if (&devs[i]->ibdev == device) return int(i);
    return -1;
  });
}

namespace {

// Blocks the calling thread's signals while it lives (all but those of a
// fault: core::blockable_signals), errno kept.
class SignalsBlocked {
 public:
  SignalsBlocked() {
    sigset_t all;
    uroce::core::blockable_signals(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old_);
  }
  ~SignalsBlocked() {
    int saved = errno;
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    errno = saved;
  }
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t old_;
};

// Opens the engine with the signals blocked, so that its progress thread
// inherits the mask: signals are the application's and must reach its
// threads, e.g. to interrupt a blocking ibv_get_cq_event with EINTR (a
// process-directed signal goes to any thread that does not block it).
EngineContext* open_context(Device* device) {
  SignalsBlocked blocked;
  return EngineContext::open(device);
}

}  // namespace

UROCE_API ibv_context* ibv_open_device(ibv_device* device) {
  return abi_guard<ibv_context*>(nullptr, [&]() -> ibv_context* {
    if (!device) {
      errno = EINVAL;
      return nullptr;
    }
    EngineContext* e = open_context(Device::from(device));
    if (!e) return nullptr;
    uroce::verbs::install_context_ops(e->vctx);
    uroce::verbs::track_context(e->ib());
    return e->ib();
  });
}

UROCE_API int ibv_close_device(ibv_context* context) {
  return abi_guard_errno([&] {
    if (!context) return EINVAL;
    if (uroce::verbs::close_imported(context)) return 0;  // an imported reference (ibv_import_device)
    EngineContext::from(context)->close();
    return 0;
  });
}

UROCE_API int ibv_query_device(ibv_context* context, ibv_device_attr* attr) {
  return abi_guard_errno([&] {
    if (!context || !attr) return EINVAL;
    EngineContext::from(context)->query_device(attr);
    return 0;
  });
}

// The exported symbol takes the pre-1.3 layout; verbs.h's inline
// ___ibv_query_port uses verbs_context::query_port (query_port_ex) instead.
UROCE_API int ibv_query_port(ibv_context* context, uint8_t port_num, _compat_ibv_port_attr* attr) {
  if (!context || !attr) return EINVAL;
  return abi_guard_errno(
      [&] { return EngineContext::from(context)->query_port(port_num, reinterpret_cast<ibv_port_attr*>(attr)); });
}

UROCE_API int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  if (!context || !gid) {
    errno = EINVAL;
    return -1;
  }
  return abi_guard<int>(-1, [&] {
    switch (EngineContext::from(context)->query_gid(port_num, index, gid)) {
      case 0:
        return 0;
      case ENODATA:  // an empty slot: a zero GID, as libibverbs reports one
        *gid = ibv_gid{};
        return 0;
      default:
        errno = EINVAL;
        return -1;
    }
  });
}

UROCE_API int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  if (!context || !pkey) {
    errno = EINVAL;
    return -1;
  }
  return abi_guard<int>(-1, [&] {
    uint16_t p;
    if (EngineContext::from(context)->query_pkey(port_num, index, &p) != 0) {
      errno = EINVAL;
      return -1;
    }
    *pkey = p;
    return 0;
  });
}

UROCE_API int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
  if (!context || port_num != 1 || pkey != 0xFFFF) {
    errno = EINVAL;
    return -1;
  }
  return 0;
}

// Private symbol Debian's ibv_devinfo uses (IBVERBS_PRIVATE_34); rdma-core's
// driver.h declares it with this enum.
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };

UROCE_API int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, ibv_gid_type_sysfs* type) {
  return abi_guard<int>(-1, [&] {
    ibv_gid gid;
    int r = context && type && index <= INT32_MAX ? EngineContext::from(context)->query_gid(port_num, int(index), &gid)
                                                  : EINVAL;
    if (r != 0 && r != ENODATA) {
      errno = EINVAL;
      return -1;
    }
    // An empty slot's type is IB/RoCE v1, as libibverbs reports it.
    *type = r == 0 ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
    return 0;
  });
}

// entry_size is the caller's sizeof(struct ibv_gid_entry): a newer, larger
// layout gets its unknown tail zeroed, and table entries are entry_size apart.
UROCE_API int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                                uint32_t flags, size_t entry_size) {
  return abi_guard_errno([&] {
    if (!context || !entry || flags != 0 || entry_size < sizeof(ibv_gid_entry) || port_num != 1) return EINVAL;
    auto* e = EngineContext::from(context);
    ibv_gid gid;
    if (gid_index > INT32_MAX) return EINVAL;
    // EINVAL past the table, ENODATA for an empty slot (the kernel's rdma_get_gid_attr).
    if (int r = e->query_gid(1, int(gid_index), &gid)) return r;
    std::memset(entry, 0, entry_size);
    entry->gid = gid;
    entry->gid_index = gid_index;
    entry->port_num = port_num;
    entry->gid_type = IBV_GID_TYPE_ROCE_V2;
    entry->ndev_ifindex = if_nametoindex(e->addresses()[gid_index].ifname.c_str());
    return 0;
  });
}

UROCE_API ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags,
                                       size_t entry_size) {
  if (!context || (!entries && max_entries) || flags != 0 || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  return abi_guard_neg_errno([&]() -> ssize_t {
    auto* e = EngineContext::from(context);
    size_t n = e->gid_count();
    if (n > max_entries) return -EINVAL;
    for (size_t i = 0; i < n; ++i) {
      auto* entry = reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<char*>(entries) + i * entry_size);
      if (int r = _ibv_query_gid_ex(context, 1, uint32_t(i), entry, 0, entry_size)) return -r;
    }
    return ssize_t(n);
  });
}

UROCE_API int ibv_fork_init(void) { return 0; }  // nothing is pinned, so fork is always safe

UROCE_API enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

namespace uroce::verbs {

int query_port_ex(ibv_context* context, uint8_t port_num, ibv_port_attr* port_attr, size_t port_attr_len) {
  return abi_guard_errno([&] {
    if (!context || !port_attr) return EINVAL;
    ibv_port_attr a;
    int r = EngineContext::from(context)->query_port(port_num, &a);
    if (r) return r;
    std::memset(port_attr, 0, port_attr_len);
    std::memcpy(port_attr, &a, std::min(port_attr_len, sizeof a));
    return 0;
  });
}

}  // namespace uroce::verbs
