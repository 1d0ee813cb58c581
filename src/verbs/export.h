// Definitions of exported ABI functions. The library is built with hidden
// visibility; every libibverbs/librdmacm entry point uroce implements is
// marked UROCE_API, overrides the weak EOPNOTSUPP stub of abi_stubs.cc and is
// versioned by uroce.map. No C++ exception crosses the ABI: bodies run inside
// abi_guard, which turns one into ENOMEM/EIO.
#pragma once

#include <cerrno>
#include <new>

#define UROCE_API extern "C" __attribute__((visibility("default")))

namespace uroce::verbs {

// Runs f; on an exception returns `on_error` with errno set.
template <class R, class F>
R abi_guard(R on_error, F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
  } catch (...) {
    errno = EIO;
  }
  return on_error;
}

}  // namespace uroce::verbs
