// DatagramTransport over one unconnected IPv4 UDP socket (design §3, §4).
#pragma once

#include <memory>
#include <vector>

#include "transport/datagram.h"

namespace uroce::transport {

struct UdpConfig {
  uint16_t preferred_port = 4791;  // LID = UDP port; fall back when taken
  uint16_t max_port = 0xBFFF;      // ports at or above 0xC000 are RoCE source ports
  int socket_buffer_bytes = 32 << 20;
  uint32_t max_datagram = 9216;
};

class UdpTransport final : public DatagramTransport {
 public:
  // Returns nullptr with errno set when no socket can be bound.
  static std::unique_ptr<UdpTransport> open(const UdpConfig& cfg);
  ~UdpTransport() override;

  size_t send_burst(std::span<TxDatagram> burst) noexcept override;
  size_t recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept override;
  void wake() noexcept override;
  uint16_t local_port() const noexcept override { return port_; }

 private:
  UdpTransport(int fd, int wake_fd, uint16_t port, const UdpConfig& cfg);

  int fd_;
  int wake_fd_;
  uint16_t port_;
  uint32_t max_datagram_;
  std::vector<uint8_t> rx_buffers_;  // receiver thread only
};

}  // namespace uroce::transport
