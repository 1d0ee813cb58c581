// uroce C++ API: the out-of-band TCP exchange the classic verbs programs use to swap
// QpEndpoints and RemoteBuffers before they talk RDMA.
//
//   server:  auto listener = TcpListener::listen("127.0.0.1", 18515);
//            auto peer = listener->accept(5s);
//   client:  auto peer = TcpSocket::connect("127.0.0.1", 18515, 5s);   // retries until the listener is up
//   both:    auto theirs = peer->exchange(mine, 5s);                   // send mine, receive theirs
//
// send()/receive() move one fixed-size value: a type with to_bytes()/from_bytes() and
// kWireSize (QpEndpoint, RemoteBuffer) goes in that portable encoding, any other trivially
// copyable type as its bytes. Every call takes a timeout (ETIMEDOUT); a peer that closes
// early gives ECONNRESET.
#pragma once

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "uroce/handle.hpp"
#include "uroce/result.hpp"

namespace uroce {

// A type with a fixed portable encoding: kWireSize, to_bytes(), from_bytes().
template <class T>
concept WireCodable = requires(const T& value, std::span<const std::byte, T::kWireSize> in) {
  { value.to_bytes() } -> std::same_as<std::array<std::byte, T::kWireSize>>;
  { T::from_bytes(in) } -> std::same_as<T>;
};

namespace detail {

// A file descriptor owner (move-only).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

 private:
  int fd_ = -1;
};

using Clock = std::chrono::steady_clock;

inline int millis_left(Clock::time_point deadline) {
  auto left = std::chrono::ceil<Milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : int(std::min<long long>(left, INT32_MAX));
}

// Waits until `fd` reports `events` or the deadline passes.
inline Status wait_fd(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, millis_left(deadline));
    if (n > 0) return {};
    if (n == 0) return Error(ETIMEDOUT, std::string(what) + ": timed out");
    if (errno != EINTR) return Error::from_errno(errno, std::string(what) + ": poll");
  }
}

struct AddrInfoRelease {
  void operator()(addrinfo* ai) const noexcept { ::freeaddrinfo(ai); }
};

inline Result<detail::Handle<addrinfo, AddrInfoRelease>> resolve_tcp(const std::string& host, std::uint16_t port,
                                                                     bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* list = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) return Error(EHOSTUNREACH, "getaddrinfo(" + host + "): " + ::gai_strerror(rc));
  return detail::Handle<addrinfo, AddrInfoRelease>(list);
}

}  // namespace detail

// A connected TCP socket.
class TcpSocket {
 public:
  // Connects to host:port, retrying while nobody listens yet, until `timeout`.
  static Result<TcpSocket> connect(const std::string& host, std::uint16_t port, Milliseconds timeout) {
    auto deadline = detail::Clock::now() + timeout;
    auto addrs = detail::resolve_tcp(host, port, false);
    if (!addrs) return std::move(addrs).error();
    std::string what = "connect to " + host + ":" + std::to_string(port);
    for (;;) {
      bool refused = false;  // by some address: nobody listens there yet
      int other_error = 0;
      for (const addrinfo* ai = addrs->get(); ai != nullptr; ai = ai->ai_next) {
        auto socket = try_connect(*ai, deadline, what);
        if (socket) return socket;
        if (socket.error().errnum() == ETIMEDOUT) return socket;
        if (socket.error().errnum() == ECONNREFUSED)
          refused = true;
        else
          other_error = socket.error().errnum();
      }
      if (!refused || detail::Clock::now() >= deadline)
        return Error::from_errno(refused ? ECONNREFUSED : other_error, what);
      std::this_thread::sleep_for(Milliseconds(20));
    }
  }

  int fd() const noexcept { return fd_.get(); }

  Status send_bytes(std::span<const std::byte> bytes, Milliseconds timeout) const {
    auto deadline = detail::Clock::now() + timeout;
    while (!bytes.empty()) {
      ssize_t n = ::send(fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n > 0) {
        bytes = bytes.subspan(std::size_t(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN) return Error::from_errno(errno, "TcpSocket::send");
      if (auto s = detail::wait_fd(fd(), POLLOUT, deadline, "TcpSocket::send"); !s) return s;
    }
    return {};
  }
  Status receive_bytes(std::span<std::byte> bytes, Milliseconds timeout) const {
    auto deadline = detail::Clock::now() + timeout;
    while (!bytes.empty()) {
      ssize_t n = ::recv(fd(), bytes.data(), bytes.size(), 0);
      if (n > 0) {
        bytes = bytes.subspan(std::size_t(n));
        continue;
      }
      if (n == 0) return Error(ECONNRESET, "TcpSocket::receive: the peer closed the connection");
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return Error::from_errno(errno, "TcpSocket::receive");
      if (auto s = detail::wait_fd(fd(), POLLIN, deadline, "TcpSocket::receive"); !s) return s;
    }
    return {};
  }

  template <class T>
  requires(WireCodable<T> || std::is_trivially_copyable_v<T>) Status send(const T& value, Milliseconds timeout)
  const {
    if constexpr (WireCodable<T>) {
      auto bytes = value.to_bytes();
      return send_bytes(bytes, timeout);
    } else {
      return send_bytes(std::as_bytes(std::span<const T, 1>(&value, 1)), timeout);
    }
  }
  template <class T>
  requires(WireCodable<T> || (std::is_trivially_copyable_v<T> &&
                              std::is_default_constructible_v<T>)) Result<T> receive(Milliseconds timeout)
  const {
    if constexpr (WireCodable<T>) {
      std::array<std::byte, T::kWireSize> bytes;
      if (auto s = receive_bytes(bytes, timeout); !s) return std::move(s).error();
      return T::from_bytes(bytes);
    } else {
      T value{};
      if (auto s = receive_bytes(std::as_writable_bytes(std::span<T, 1>(&value, 1)), timeout); !s)
        return std::move(s).error();
      return value;
    }
  }
  // Sends `mine`, then receives the peer's value of the same type.
  template <class T>
  Result<T> exchange(const T& mine, Milliseconds timeout) const {
    if (auto s = send(mine, timeout); !s) return std::move(s).error();
    return receive<T>(timeout);
  }

 private:
  friend class TcpListener;
  static Result<TcpSocket> try_connect(const addrinfo& ai, detail::Clock::time_point deadline,
                                       const std::string& what) {
    detail::Fd fd(::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol));
    if (fd.get() < 0) return Error::from_errno(errno, "socket");
    int err = ::connect(fd.get(), ai.ai_addr, ai.ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      if (auto s = detail::wait_fd(fd.get(), POLLOUT, deadline, what.c_str()); !s) return std::move(s).error();
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err != 0) return Error::from_errno(err, what);
    return TcpSocket(std::move(fd));
  }
  explicit TcpSocket(detail::Fd fd) noexcept : fd_(std::move(fd)) {
    int one = 1;
    ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  detail::Fd fd_;
};

// A listening TCP socket (SO_REUSEADDR).
class TcpListener {
 public:
  // Listens on host:port (host "" or "0.0.0.0": every address).
  static Result<TcpListener> listen(const std::string& host, std::uint16_t port, int backlog = 16) {
    auto addrs = detail::resolve_tcp(host, port, true);
    if (!addrs) return std::move(addrs).error();
    const addrinfo* ai = addrs->get();
    detail::Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.get() < 0) return Error::from_errno(errno, "socket");
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    std::string what = host + ":" + std::to_string(port);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) return Error::from_errno(errno, "bind " + what);
    if (::listen(fd.get(), backlog) != 0) return Error::from_errno(errno, "listen " + what);
    return TcpListener(std::move(fd));
  }

  int fd() const noexcept { return fd_.get(); }
  // The port listened on (useful after listening on port 0).
  std::uint16_t port() const noexcept {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ::getsockname(fd(), reinterpret_cast<sockaddr*>(&addr), &len);
    if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }

  Result<TcpSocket> accept(Milliseconds timeout) const {
    auto deadline = detail::Clock::now() + timeout;
    for (;;) {
      int fd = ::accept4(fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) return TcpSocket(detail::Fd(fd));
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN) return Error::from_errno(errno, "accept");
      if (auto s = detail::wait_fd(fd_.get(), POLLIN, deadline, "TcpListener::accept"); !s) return std::move(s).error();
    }
  }

 private:
  explicit TcpListener(detail::Fd fd) noexcept : fd_(std::move(fd)) {}

  detail::Fd fd_;
};

}  // namespace uroce
