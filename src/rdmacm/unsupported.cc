// The parts of librdmacm uroce does not implement yet: multicast and the
// rsocket I/O-mapping calls (riomap, riounmap, riowrite; the rest of rsockets
// is src/rsockets). Their entry points fail with ENOSYS and say so once on
// stderr, so that a program like mckey or riostream stops with a clear reason
// rather than a bare errno.
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cerrno>
#include <cstdio>

#include "verbs/export.h"

namespace {

int not_supported(const char* what) {
  static std::atomic<bool> said_multicast{false}, said_iomap{false};
  const bool multicast = what[0] == 'r' && what[1] == 'd';
  std::atomic<bool>& said = multicast ? said_multicast : said_iomap;
  if (!said.exchange(true)) {
    std::fprintf(stderr, "uroce: %s: %s are not implemented by uroce yet (ENOSYS)\n", what,
                 multicast ? "rdma_cm multicast groups" : "rsocket I/O mapping (riomap, riowrite)");
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

UROCE_API off_t riomap(int, void*, size_t, int, int, off_t) { return not_supported("riomap"); }

UROCE_API int riounmap(int, void*, size_t) { return not_supported("riounmap"); }

UROCE_API size_t riowrite(int, const void*, size_t, off_t, int) { return size_t(not_supported("riowrite")); }
