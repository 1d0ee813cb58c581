// The parts of librdmacm uroce does not implement yet: multicast and rsockets.
// Their entry points fail with ENOSYS and say so once on stderr, so that a
// program like mckey or rstream stops with a clear reason rather than a bare
// errno. The other rsocket calls (rsend, rpoll, ...) need an rsocket first
// and keep their generated ENOSYS stubs (abi_stubs.cc).
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cerrno>
#include <cstdio>

#include "verbs/export.h"

namespace {

int not_supported(const char* what) {
  static std::atomic<bool> said_multicast{false}, said_rsockets{false};
  const bool multicast = what[0] == 'r' && what[1] == 'd';
  std::atomic<bool>& said = multicast ? said_multicast : said_rsockets;
  if (!said.exchange(true)) {
    std::fprintf(stderr, "uroce: %s: %s are not implemented by uroce yet (ENOSYS)\n", what,
                 multicast ? "rdma_cm multicast groups" : "rsockets");
  }
  errno = ENOSYS;
  return -1;
}

}  // namespace

UROCE_API int rdma_join_multicast(rdma_cm_id*, sockaddr*, void*) { return not_supported("rdma_join_multicast"); }

UROCE_API int rdma_join_multicast_ex(rdma_cm_id*, rdma_cm_join_mc_attr_ex*, void*) {
  return not_supported("rdma_join_multicast_ex");
}

UROCE_API int rdma_leave_multicast(rdma_cm_id*, sockaddr*) { return not_supported("rdma_leave_multicast"); }

UROCE_API int rsocket(int, int, int) { return not_supported("rsocket"); }
