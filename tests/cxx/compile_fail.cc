// Misuse that must not compile. Built once per UROCE_MISUSE_* macro by CTest (see
// CMakeLists.txt), each build expected to fail; built with none defined it must succeed,
// so that a failure really comes from the misuse.
#include "uroce/uroce.hpp"

using namespace uroce;

void misuse(const ProtectionDomain& pd, const MemoryRegion& mr, const QueuePair& qp, RemoteBuffer remote) {
  LocalSlice local = mr.slice(0, 8);
  (void)pd;
  (void)local;
  (void)remote;
  (void)qp;
#if defined(UROCE_MISUSE_COPY_OWNER)
  MemoryRegion copy = mr;  // owners are move-only
  (void)copy;
#elif defined(UROCE_MISUSE_REMOTE_AS_LOCAL)
  (void)qp.post_send(SendRequest::send(remote));  // a RemoteBuffer is not a local slice
#elif defined(UROCE_MISUSE_SWAPPED_WRITE)
  (void)qp.post_send(SendRequest::write(remote, local));  // (local, remote), not (remote, local)
#elif defined(UROCE_MISUSE_LOCAL_AS_REMOTE)
  (void)qp.post_send(SendRequest::read(local, local));  // a LocalSlice is not a RemoteBuffer
#elif defined(UROCE_MISUSE_RAW_WR_ID)
  (void)qp.post_send(SendRequest::send(local).id(42));  // wr_id is a WrId, not a bare integer
#elif defined(UROCE_MISUSE_KEYS)
  RemoteKey key = mr.lkey();  // a local key is not a remote key
  (void)key;
#elif defined(UROCE_MISUSE_IGNORED_STATUS)
  qp.post_send(SendRequest::send(local));  // [[nodiscard]]: built with -Werror
#elif defined(UROCE_MISUSE_COPY_CONTEXT)
  auto ctx = Context::open();
  Context copy = *ctx;
  (void)copy;
#else
  (void)qp.post_send(SendRequest::write(local, remote).id(WrId{42}));
#endif
}
