// From an embedded ABI struct back to the uroce object that embeds it.
// uroce objects are not always standard-layout (private members, mutexes),
// which makes offsetof "conditionally supported"; GCC and Clang support it
// for classes without virtual bases, which is all uroce uses it for.
#pragma once

#include <cstddef>

#define UROCE_CONTAINER_OF(ptr, Type, member)                                                                         \
  ([](auto* p_) {                                                                                                     \
    _Pragma("GCC diagnostic push")                                                                                    \
        _Pragma("GCC diagnostic ignored \"-Winvalid-offsetof\"") constexpr std::size_t off_ = offsetof(Type, member); \
    _Pragma("GCC diagnostic pop") return reinterpret_cast<Type*>(reinterpret_cast<char*>(p_) - off_);                 \
  }(ptr))
