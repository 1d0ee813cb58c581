// uroce C++ API: the work request id as a typed value.
//
// A WrId wraps the 64-bit wr_id of a work request. Build it from an integer, an enum or a
// pointer, and read it back the same way; no casts through void* in user code:
//   WrId{42}, WrId{Op::kWrite}, WrId::of(&request)  ->  id.value(), id.as<Op>(), id.pointer<Request>()
#pragma once

#include <compare>
#include <cstdint>
#include <type_traits>

namespace uroce {

class WrId {
 public:
  constexpr WrId() noexcept = default;
  constexpr explicit WrId(std::uint64_t value) noexcept : value_(value) {}
  template <class E>
  requires std::is_enum_v<E>
  constexpr explicit WrId(E value) noexcept : value_(std::uint64_t(value)) {}
  template <class T>
  static WrId of(T* pointer) noexcept {
    return WrId(std::uint64_t(reinterpret_cast<std::uintptr_t>(pointer)));
  }

  constexpr std::uint64_t value() const noexcept { return value_; }
  template <class E>
  requires std::is_enum_v<E>
  constexpr E as() const noexcept { return E(value_); }
  template <class T>
  T* pointer() const noexcept {
    return reinterpret_cast<T*>(std::uintptr_t(value_));
  }

  friend constexpr auto operator<=>(WrId, WrId) = default;

 private:
  std::uint64_t value_ = 0;
};

}  // namespace uroce
