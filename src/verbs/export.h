// Definitions of exported ABI functions. The library is built with hidden
// visibility; every libibverbs/librdmacm entry point uroce implements is
// marked UROCE_API, overrides the weak EOPNOTSUPP stub of abi_stubs.cc and is
// versioned by uroce.map.
//
// No C++ exception crosses the ABI (design.md section 2). An export that calls
// into uroce's C++ code runs its body inside abi_guard, abi_guard_errno or
// abi_guard_neg_errno (or a wrapper of them: rdmacm::cm_call, with_socket in
// rsocket_api.cc), which turn an exception into the function's own rdma-core
// error convention, std::bad_alloc into ENOMEM and anything else into EIO.
// Only exports whose bodies cannot throw (string tables, free(3), a field,
// forwarding to guarded exports) go without; the test abi.guarded
// (tests/abi/check_abi_guard.sh) names each with its reason and fails on any
// other unguarded export. The definitions cannot be declared noexcept:
// <infiniband/verbs.h> and <rdma/rdma_cma.h> declare them without it, and
// clang rejects the mismatch. The entry points reached through the ops tables
// (verbs/ops.h) are declared by uroce: the data path ones are noexcept.
//
// Thread cancellation passes: glibc's pthread_cancel unwinds a thread from a
// cancellation point (a read or poll inside ibv_get_cq_event, rdma_get_cm_event,
// rpoll...) with a forced unwind, which must not be caught and dropped (the
// process aborts: "exception not rethrown"). The guards rethrow it, so it
// unwinds through uroce as it does through rdma-core's C frames (rping cancels
// its CQ thread blocked in ibv_get_cq_event); that is also why they are not
// noexcept.
#pragma once

#include <cxxabi.h>

#include <cerrno>
#include <new>

#define UROCE_API extern "C" __attribute__((visibility("default")))

namespace uroce::verbs {

namespace detail {

// Called from a catch (...) handler: the errno the exception being handled
// stands for (ENOMEM for std::bad_alloc, else EIO), also stored in errno.
// Thread cancellation (abi::__forced_unwind) is rethrown. (glibc's forced
// unwind is a foreign exception with no C++ object: the handler's reference
// is bound to null, as in libstdc++'s own handlers of it, which UBSan's null
// check reports; it is off for this function alone.)
__attribute__((no_sanitize("null"))) inline int exception_errno() {
  try {
    throw;
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (const std::bad_alloc&) {
    return errno = ENOMEM;
  } catch (...) {
    return errno = EIO;
  }
}

}  // namespace detail

// Runs f; on an exception returns `on_error` with errno set: pointer results
// (NULL + errno) and the -1 + errno convention.
template <class R, class F>
R abi_guard(R on_error, F&& f) {
  try {
    return f();
  } catch (...) {
    detail::exception_errno();
    return on_error;
  }
}

// For void functions: runs f; on an exception sets errno.
template <class F>
void abi_guard(F&& f) {
  try {
    f();
  } catch (...) {
    detail::exception_errno();
  }
}

// For functions whose result is an errno value (0 or a positive errno: the int
// verbs, ibv_modify_qp, ibv_destroy_*...): on an exception returns that errno.
// A failure also leaves its value in errno, as a kernel provider's failed
// system call does: programs print errno after such a verb (qperf's "failed to
// modify QP to RTR: Invalid argument").
template <class F>
auto abi_guard_errno(F&& f) -> decltype(f()) {
  try {
    auto r = f();
    if (r > 0) errno = static_cast<int>(r);
    return r;
  } catch (...) {
    return detail::exception_errno();
  }
}

// The same for results that are negated errno values on failure (ibv_poll_cq,
// _ibv_query_gid_table).
template <class F>
auto abi_guard_neg_errno(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (...) {
    return -detail::exception_errno();
  }
}

}  // namespace uroce::verbs
