// The transport interface: moves bursts of datagrams, knows nothing of RDMA.
//
// A system call costs about a microsecond here, so every call moves a burst
// (sendmmsg/recvmmsg); there is no one-packet-per-call API.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace uroce::transport {

// An IPv4 address and UDP port, host byte order.
struct Endpoint {
  uint32_t ip = 0;
  uint16_t port = 0;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

inline constexpr unsigned kMaxTxIov = 4;

// One datagram to send: gathered from up to kMaxTxIov segments.
struct TxDatagram {
  Endpoint dst;
  uint32_t src_ip = 0;  // 0: let the kernel choose
  uint8_t iovcnt = 0;
  iovec iov[kMaxTxIov];
};

// One received datagram; `data` points into the transport's receive buffers
// and stays valid until the next recv_burst call.
struct RxDatagram {
  uint8_t* data = nullptr;
  uint32_t len = 0;
  Endpoint src;
  uint32_t dst_ip = 0;
  bool truncated = false;
};

class DatagramTransport {
 public:
  virtual ~DatagramTransport() = default;

  // Sends as many of `burst` as the socket accepts now; returns how many were
  // handed to the network (datagrams the kernel refused count as sent and
  // lost, as on a real network). Thread-safe.
  virtual size_t send_burst(std::span<TxDatagram> burst) noexcept = 0;

  // Waits up to timeout_ms (-1: forever) for datagrams, returns how many were
  // stored in `out` (0 on timeout or wake()). Only one thread may receive.
  virtual size_t recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept = 0;

  // Makes a blocked recv_burst return now. Thread-safe.
  virtual void wake() noexcept = 0;

  virtual uint16_t local_port() const noexcept = 0;
};

}  // namespace uroce::transport
