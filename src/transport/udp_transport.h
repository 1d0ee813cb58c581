// DatagramTransport over unconnected UDP sockets (design §3, §4): an IPv4
// socket on the private port, and beside it an IPv6 one (IPV6_V6ONLY) on the
// same port for IPv6 peers; the host's port likewise.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "transport/datagram.h"

namespace uroce::transport {

struct UdpConfig {
  uint16_t preferred_port = 0;  // the private port (LID = UDP port); 0 or taken: another is chosen
  uint16_t max_port = 0xBFFF;   // ports at or above 0xC000 are RoCE source ports
  // The host's RoCE port, joined with SO_REUSEPORT by every transport of the
  // host (of the same user); 0: none. Never the private port. Set by the
  // engine (UROCE_PORT: wire::kRoceV2Port unless changed); this layer knows
  // nothing of RDMA, so its default is none.
  uint16_t host_port = 0;
  bool ipv6 = true;  // also IPv6 sockets on both ports, where the host has IPv6
  int socket_buffer_bytes = 32 << 20;
  uint32_t max_datagram = 9216;
  bool gso = true;  // use UDP GSO and GRO where the kernel has them (UROCE_GSO=0: not)
  // Send ECN-capable (ECT(0)) and report Congestion Experienced marks
  // (RxDatagram::ce), as a RoCE NIC with congestion control does (UROCE_ECN).
  bool ecn = true;
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
  void nap(int timeout_us) noexcept override;
  bool nap_or_readable(int timeout_us) noexcept override;
  uint16_t local_port() const noexcept override { return port_; }
  uint16_t host_port() const noexcept override { return host_fd_ >= 0 ? host_port_ : 0; }
  // Whether IPv6 datagrams can be sent and received (an IPv6 socket is open).
  bool ipv6() const noexcept { return fd6_ >= 0; }
  unsigned max_gso_segments() const noexcept override {
    return gso_.load(std::memory_order_relaxed) ? kMaxGsoSegments : 1;
  }
  bool gro() const noexcept override { return gro_; }
  bool more_ready() const noexcept override { return rx_more_ || rx_next_ < rx_count_; }
  // Joins (or leaves) the IPv4 multicast group `group` on the host socket,
  // whose port multicast RoCE packets are sent to: 0 or an errno (ENODEV
  // without a host socket).
  int set_group(uint32_t group, bool join) noexcept;

 private:
  UdpTransport(int fd, int host_fd, int wake_fd, uint16_t port, const UdpConfig& cfg, bool gso, bool gro);
  // One sendmmsg on the socket of the burst's address family.
  size_t send_some(std::span<TxDatagram> burst) noexcept;
  void send_split(const TxDatagram& d) noexcept;
  size_t take_received(std::span<RxDatagram> out) noexcept;
  // One recvmmsg on `fd` (received at `port`) into messages [first, first + want).
  size_t recv_into(int fd, uint16_t port, size_t first, size_t want) noexcept;
  // Whether this receive should also read the host socket.
  bool read_host_socket() noexcept;
  // Reads the IPv6 sockets into messages from `got` on; returns the new count.
  size_t recv_ipv6(size_t got, size_t want, bool host_due) noexcept;
  void watched(pollfd (&p)[5]) const noexcept;
  bool note_ready(const pollfd (&p)[5]) noexcept;
  void consume_wake() noexcept;  // reads the eventfd a wake() wrote

  // One received (possibly GRO-coalesced) datagram, split by take_received.
  struct RxMessage {
    uint8_t* data;
    uint32_t len;
    uint32_t segment;  // segment size; len when not coalesced
    uint32_t offset;   // of the next segment to return
    Endpoint src;
    IpAddress dst_ip;
    uint16_t dst_port;
    bool truncated;
    bool ce;  // marked Congestion Experienced
  };

  int fd_;
  int wake_fd_;
  uint16_t port_;
  uint32_t rx_buffer_size_;
  uint32_t max_datagram_;  // longer segments are reported truncated
  std::atomic<bool> gso_;  // cleared when the kernel refuses a GSO send
  bool gro_;
  // The host socket (-1: none). Read when a wait() saw it readable
  // (host_ready_, set by any waiting thread) and, while it keeps delivering,
  // on every receive (host_hot_, receiver only), and in any case every 16th
  // receive (host_countdown_) and once kHostMaxGap has passed since it was
  // last read (host_read_at_): an idle one costs a poller one extra system
  // call in 16 receives, and a receiver that never waits here (always busy,
  // or a transport above that waits on other things first) still reads it
  // within a bounded time, however long its receives take.
  int host_fd_;
  uint16_t host_port_;
  std::atomic<bool> host_ready_{false};
  unsigned host_hot_ = 0;
  unsigned host_countdown_ = 0;  // receives since the host socket was last read regardless (receiver only)
  std::chrono::steady_clock::time_point host_read_at_{};  // receiver only
  // Receiver thread only: the buffers, and the messages of the last
  // recvmmsg not yet returned (rx_next_ .. rx_count_).
  // The IPv6 sockets on the private and the host port (-1: none; the host
  // has no IPv6, or another program holds the port for IPv6). Once IPv6 is
  // in use (ipv6_used_: a datagram went or came over IPv6) the private one
  // is read on every receive and the host one whenever the IPv4 host socket
  // is. Before, each is read when a wait() saw it readable (ipv6_ready_,
  // host6_ready_) and, for a receiver that never waits here, every 16th
  // round of the host socket (ipv6_sweep_): so an engine that never meets
  // an IPv6 peer pays one more system call per 256 receives or so, and one
  // that does reads IPv6 as promptly as IPv4 after its first datagram.
  int fd6_ = -1;
  int host_fd6_ = -1;
  std::atomic<bool> ipv6_used_{false};
  std::atomic<bool> ipv6_ready_{false};
  std::atomic<bool> host6_ready_{false};
  unsigned ipv6_sweep_ = 0;  // receiver only
  std::vector<uint8_t> rx_buffers_;
  std::vector<RxMessage> rx_messages_;
  // The recvmmsg header of each buffer, with its iovec, address and control
  // space (RxSlot), made once: a receive resets only what the kernel wrote
  // in the headers it filled (receiver only).
  struct RxSlot;
  std::unique_ptr<mmsghdr[]> rx_headers_;
  std::unique_ptr<RxSlot[]> rx_slots_;
  size_t rx_count_ = 0;
  size_t rx_next_ = 0;
  bool rx_more_ = false;  // the last recvmmsg filled every buffer
};

}  // namespace uroce::transport
