// DatagramTransport over one unconnected IPv4 UDP socket (design §3, §4).
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "transport/datagram.h"

namespace uroce::transport {

struct UdpConfig {
  uint16_t preferred_port = 4791;  // LID = UDP port; fall back when taken
  uint16_t max_port = 0xBFFF;      // ports at or above 0xC000 are RoCE source ports
  int socket_buffer_bytes = 32 << 20;
  uint32_t max_datagram = 9216;
  bool gso = true;  // use UDP GSO and GRO where the kernel has them (UROCE_GSO=0: not)
};

class UdpTransport final : public DatagramTransport {
 public:
  // Returns nullptr with errno set when no socket can be bound.
  static std::unique_ptr<UdpTransport> open(const UdpConfig& cfg);
  ~UdpTransport() override;

  size_t send_burst(std::span<TxDatagram> burst) noexcept override;
  size_t recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept override;
  void wake() noexcept override;
  void wait(int timeout_ms) noexcept override;
  uint16_t local_port() const noexcept override { return port_; }
  unsigned max_gso_segments() const noexcept override {
    return gso_.load(std::memory_order_relaxed) ? kMaxGsoSegments : 1;
  }
  bool gro() const noexcept override { return gro_; }
  bool more_ready() const noexcept override { return rx_more_ || rx_next_ < rx_count_; }

 private:
  UdpTransport(int fd, int wake_fd, uint16_t port, const UdpConfig& cfg, bool gso, bool gro);
  size_t send_some(std::span<TxDatagram> burst) noexcept;
  void send_split(const TxDatagram& d) noexcept;
  size_t take_received(std::span<RxDatagram> out) noexcept;

  // One received (possibly GRO-coalesced) datagram, split by take_received.
  struct RxMessage {
    uint8_t* data;
    uint32_t len;
    uint32_t segment;  // segment size; len when not coalesced
    uint32_t offset;   // of the next segment to return
    Endpoint src;
    uint32_t dst_ip;
    bool truncated;
  };

  int fd_;
  int wake_fd_;
  uint16_t port_;
  uint32_t rx_buffer_size_;
  uint32_t max_datagram_;  // longer segments are reported truncated
  std::atomic<bool> gso_;  // cleared when the kernel refuses a GSO send
  bool gro_;
  // Receiver thread only: the buffers, and the messages of the last
  // recvmmsg not yet returned (rx_next_ .. rx_count_).
  std::vector<uint8_t> rx_buffers_;
  std::vector<RxMessage> rx_messages_;
  size_t rx_count_ = 0;
  size_t rx_next_ = 0;
  bool rx_more_ = false;  // the last recvmmsg filled every buffer
};

}  // namespace uroce::transport
