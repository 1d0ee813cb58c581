// The part of librdmacm uroce does not implement yet: multicast (rsockets are
// src/rsockets). Its entry points fail with ENOSYS and say so once on stderr,
// so that a program like mckey stops with a clear reason rather than a bare
// errno.
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cerrno>
#include <cstdio>

#include "verbs/export.h"

namespace {

int not_supported(const char* what) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    std::fprintf(stderr, "uroce: %s: rdma_cm multicast groups are not implemented by uroce yet (ENOSYS)\n", what);
  errno = ENOSYS;
  return -1;
}

}  // namespace

UROCE_API int rdma_join_multicast(rdma_cm_id*, sockaddr*, void*) { return not_supported("rdma_join_multicast"); }

UROCE_API int rdma_join_multicast_ex(rdma_cm_id*, rdma_cm_join_mc_attr_ex*, void*) {
  return not_supported("rdma_join_multicast_ex");
}

UROCE_API int rdma_leave_multicast(rdma_cm_id*, sockaddr*) { return not_supported("rdma_leave_multicast"); }
