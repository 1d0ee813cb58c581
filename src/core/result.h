// Control-path results: a value or a positive errno, never an exception.
#pragma once

#include <utility>

namespace uroce::core {

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)), err_(0) {}  // NOLINT: implicit on purpose
  static Result error(int err) { return Result(T{}, err); }

  bool ok() const { return err_ == 0; }
  int err() const { return err_; }
  T& value() { return value_; }
  T& operator*() { return value_; }
  T* operator->() { return &value_; }

 private:
  Result(T value, int err) : value_(std::move(value)), err_(err) {}
  T value_;
  int err_;
};

}  // namespace uroce::core
