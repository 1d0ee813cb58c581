// Conventions of the exported librdmacm functions: 0, or -1 with errno set;
// no exception crosses the ABI (verbs::abi_guard, verbs/export.h).
#pragma once

#include <cerrno>

#include "verbs/export.h"

namespace uroce::rdmacm {

inline int abi_result(int err) {
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}

// Runs f (returning an errno) inside abi_guard, in librdmacm's convention.
// Not noexcept: thread cancellation passes (verbs/export.h).
template <class F>
int cm_call(F&& f) {
  return verbs::abi_guard<int>(-1, [&] { return abi_result(f()); });
}

}  // namespace uroce::rdmacm
