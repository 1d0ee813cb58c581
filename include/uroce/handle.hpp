// uroce C++ API: the move-only owner every RAII type is built on.
#pragma once

#include <utility>

namespace uroce::detail {

// Owns one rdma-core object pointer; Release is a stateless functor that frees it.
// Move-only: copying an owner does not compile.
template <class T, class Release>
class Handle {
 public:
  Handle() = default;
  explicit Handle(T* raw) noexcept : raw_(raw) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      raw_ = std::exchange(other.raw_, nullptr);
    }
    return *this;
  }
  ~Handle() { reset(); }

  T* get() const noexcept { return raw_; }
  T* release() noexcept { return std::exchange(raw_, nullptr); }
  void reset() noexcept {
    if (raw_ != nullptr) Release{}(std::exchange(raw_, nullptr));
  }
  explicit operator bool() const noexcept { return raw_ != nullptr; }

 private:
  T* raw_ = nullptr;
};

}  // namespace uroce::detail
