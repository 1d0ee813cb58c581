// uroce C++ API: errors as values.
//
// Error carries an errno value, for failed work completions the ibv_wc_status, and a
// one-line message naming the call that failed. Result<T> holds either a T or an Error;
// Status is Result<void>. Both are [[nodiscard]]. No exception is thrown by the API:
// reading the value of a failed Result (or the error of a successful one) is a bug in
// the caller and aborts with the message.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace uroce {

// Every timeout of the API.
using Milliseconds = std::chrono::milliseconds;

class Error {
 public:
  Error(int errnum, std::string message) : errnum_(errnum), message_(std::move(message)) {}
  Error(int errnum, ibv_wc_status wc_status, std::string message)
      : errnum_(errnum), wc_status_(wc_status), message_(std::move(message)) {}

  // "what: strerror(errnum)", e.g. "ibv_create_cq: Invalid argument".
  static Error from_errno(int errnum, std::string_view what) {
    std::string message(what);
    message += ": ";
    message += std::strerror(errnum);
    return Error(errnum, std::move(message));
  }

  int errnum() const noexcept { return errnum_; }
  // IBV_WC_SUCCESS unless the error is a failed work completion.
  ibv_wc_status wc_status() const noexcept { return wc_status_; }
  const std::string& message() const noexcept { return message_; }

 private:
  int errnum_;
  ibv_wc_status wc_status_ = IBV_WC_SUCCESS;
  std::string message_;
};

namespace detail {
[[noreturn]] inline void die(std::string_view what) noexcept {
  std::fprintf(stderr, "uroce: %.*s\n", int(what.size()), what.data());
  std::abort();
}
}  // namespace detail

template <class T>
class [[nodiscard]] Result {
  static_assert(!std::is_reference_v<T> && !std::is_same_v<std::remove_cv_t<T>, Error>);

 public:
  using value_type = T;

  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}      // NOLINT: implicit on purpose
  Result(Error error) : state_(std::in_place_index<1>, std::move(error)) {}  // NOLINT
  template <class U>
  requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::remove_cvref_t<U>, T> &&
           !std::is_same_v<std::remove_cvref_t<U>, Error> && !std::is_same_v<std::remove_cvref_t<U>, Result>)
      Result(U&& value)
      : state_(std::in_place_index<0>, std::forward<U>(value)) {}  // NOLINT

  bool ok() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  T& value() & { return checked(); }
  const T& value() const& { return const_cast<Result*>(this)->checked(); }
  T&& value() && { return std::move(checked()); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &value(); }

  template <class U>
  T value_or(U&& fallback) const& {
    return ok() ? std::get<0>(state_) : T(std::forward<U>(fallback));
  }

  const Error& error() const& {
    if (ok()) detail::die("Result::error() called on a value");
    return std::get<1>(state_);
  }
  Error&& error() && {
    if (ok()) detail::die("Result::error() called on a value");
    return std::get<1>(std::move(state_));
  }

 private:
  T& checked() {
    if (!ok()) detail::die("Result::value() on an error: " + std::get<1>(state_).message());
    return std::get<0>(state_);
  }

  std::variant<T, Error> state_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  using value_type = void;

  Result() = default;
  Result(Error error) : error_(std::in_place, std::move(error)) {}  // NOLINT: implicit on purpose

  bool ok() const noexcept { return !error_.has_value(); }
  explicit operator bool() const noexcept { return ok(); }
  void value() const {
    if (!ok()) detail::die("Status::value() on an error: " + error_->message());
  }
  const Error& error() const& {
    if (ok()) detail::die("Status::error() called on success");
    return *error_;
  }
  Error&& error() && {
    if (ok()) detail::die("Status::error() called on success");
    return std::move(*error_);
  }

 private:
  std::optional<Error> error_;
};

using Status = Result<void>;

// A Status from the int an rdma-core verb returns: 0 is success, a positive value is an
// errno, -1 means "look at errno" (the librdmacm convention).
inline Status status_from_rc(int rc, std::string_view what) {
  if (rc == 0) return {};
  int errnum = rc > 0 ? rc : errno;
  if (errnum == 0) errnum = EIO;
  return Error::from_errno(errnum, what);
}

// errno after a pointer-returning verb returned NULL (never 0).
inline int last_errno() noexcept { return errno != 0 ? errno : EIO; }

}  // namespace uroce

// Propagation helpers for functions that themselves return a Result or Status:
//   UROCE_TRY(qp.to_init(...));                // return the error if it failed
//   UROCE_TRY_ASSIGN(auto pd, ProtectionDomain::alloc(ctx));
#define UROCE_CONCAT_INNER_(a, b) a##b
#define UROCE_CONCAT_(a, b) UROCE_CONCAT_INNER_(a, b)
#define UROCE_TRY(expr)                                            \
  do {                                                             \
    auto&& uroce_try_result_ = (expr);                             \
    if (!uroce_try_result_.ok()) return uroce_try_result_.error(); \
  } while (0)
#define UROCE_TRY_ASSIGN(decl, expr) UROCE_TRY_ASSIGN_(UROCE_CONCAT_(uroce_try_, __LINE__), decl, expr)
#define UROCE_TRY_ASSIGN_(tmp, decl, expr)      \
  auto tmp = (expr);                            \
  if (!tmp.ok()) return std::move(tmp).error(); \
  decl = std::move(tmp).value()
