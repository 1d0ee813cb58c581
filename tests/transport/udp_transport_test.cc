// UdpTransport over real loopback sockets: GSO messages leave as one datagram
// per segment, GRO batches are split back into them, and the fallbacks
// (UROCE_GSO=0, a receiver without GRO) deliver the same datagrams.
#include "transport/udp_transport.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace uroce::transport {
namespace {

constexpr uint32_t kLoopback = 0x7F000001;

std::unique_ptr<UdpTransport> open_transport(bool gso) {
  UdpConfig cfg;
  cfg.preferred_port = 0;  // any free port
  cfg.host_port = 0;       // no share of the host's port 4791 (other tests' traffic)
  cfg.gso = gso;
  auto t = UdpTransport::open(cfg);
  EXPECT_NE(t, nullptr);
  return t;
}

struct Received {
  std::vector<uint8_t> bytes;
  uint8_t gso_index;
  bool truncated;
  uint16_t src_port;
  uint16_t dst_port;
  IpAddress src_ip;
  IpAddress dst_ip;
};

// Receives until `want` datagrams arrived or `limit` passed.
std::vector<Received> receive(UdpTransport& t, size_t want, size_t burst = 64,
                              std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  std::vector<Received> got;
  std::vector<RxDatagram> rx(burst);
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (got.size() < want && std::chrono::steady_clock::now() < deadline) {
    size_t n = t.recv_burst(rx, 100);
    for (size_t i = 0; i < n; ++i)
      got.push_back(Received{std::vector<uint8_t>(rx[i].data, rx[i].data + rx[i].len), rx[i].gso_index, rx[i].truncated,
                             rx[i].src.port, rx[i].dst_port, rx[i].src.ip, rx[i].dst_ip});
  }
  return got;
}

// `n` full segments of `seg` bytes and one of `tail` bytes, each filled with
// its index, as a GSO message (segment_size = seg) to `to`.
struct Message {
  std::vector<std::vector<uint8_t>> segments;
  std::vector<iovec> iov;
  TxDatagram d;
  Message(uint16_t to, unsigned n, uint16_t seg, uint16_t tail, uint8_t tag = 0) {
    for (unsigned i = 0; i <= n; ++i) {
      if (i == n && tail == 0) break;
      segments.emplace_back(i == n ? tail : seg, uint8_t(tag + i));
    }
    for (auto& s : segments) iov.push_back(iovec{s.data(), s.size()});
    d = TxDatagram{Endpoint{kLoopback, to}, 0, seg, uint16_t(iov.size()), iov.data()};
  }
};

// Send one GSO message of 5 x 1000 + 300 bytes / Expect six datagrams with
// those bytes, in order, from the sender's port; with GRO (the loopback
// delivers the message whole) numbered 0..5 by their place in it.
TEST(UdpTransportGso, MessageArrivesAsItsSegments) {
  auto tx = open_transport(true);
  auto rx = open_transport(true);
  if (tx->max_gso_segments() == 1) GTEST_SKIP() << "this kernel has no UDP GSO";
  Message m(rx->local_port(), 5, 1000, 300);
  ASSERT_EQ(tx->send_burst(std::span(&m.d, 1)), 1u);
  auto got = receive(*rx, 6);
  ASSERT_EQ(got.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(got[i].bytes, m.segments[i]) << "segment " << i;
    EXPECT_EQ(got[i].src_port, tx->local_port());
    EXPECT_FALSE(got[i].truncated);
    if (rx->gro()) {
      EXPECT_EQ(got[i].gso_index, i);
    }
  }
}

// The same message to a receiver without GRO (UROCE_GSO=0 there) / Expect the
// kernel to split it: the same six datagrams, each alone (index 0).
TEST(UdpTransportGso, ReceiverWithoutGroGetsTheSameDatagrams) {
  auto tx = open_transport(true);
  auto rx = open_transport(false);
  if (tx->max_gso_segments() == 1) GTEST_SKIP() << "this kernel has no UDP GSO";
  EXPECT_FALSE(rx->gro());
  Message m(rx->local_port(), 5, 1000, 300);
  ASSERT_EQ(tx->send_burst(std::span(&m.d, 1)), 1u);
  auto got = receive(*rx, 6);
  ASSERT_EQ(got.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(got[i].bytes, m.segments[i]) << "segment " << i;
    EXPECT_EQ(got[i].gso_index, 0u);
  }
}

// UROCE_GSO=0 on the sender / Expect no GSO offered (TxBatch then sends one
// datagram per packet) and no GRO.
TEST(UdpTransportGso, DisabledMeansOneDatagramPerPacket) {
  auto t = open_transport(false);
  EXPECT_EQ(t->max_gso_segments(), 1u);
  EXPECT_FALSE(t->gro());
}

// Three GSO messages of 20 segments, received 8 at a time / Expect all 60 in
// order, more_ready() while some are left, and not after the last.
TEST(UdpTransportGso, GroBatchesAreReturnedAcrossCalls) {
  auto tx = open_transport(true);
  auto rx = open_transport(true);
  if (tx->max_gso_segments() == 1) GTEST_SKIP() << "this kernel has no UDP GSO";
  std::vector<Message> ms;
  for (uint8_t k = 0; k < 3; ++k) ms.emplace_back(rx->local_port(), 20, 500, 0, uint8_t(k * 20));
  std::vector<TxDatagram> ds;
  for (auto& m : ms) ds.push_back(m.d);
  ASSERT_EQ(tx->send_burst(ds), 3u);
  auto got = receive(*rx, 60, 8);
  ASSERT_EQ(got.size(), 60u);
  for (size_t i = 0; i < 60; ++i) EXPECT_EQ(got[i].bytes, std::vector<uint8_t>(500, uint8_t(i))) << i;
  std::vector<RxDatagram> none(8);
  EXPECT_EQ(rx->recv_burst(none, 0), 0u);
  EXPECT_FALSE(rx->more_ready());
}

// A 10,000-byte datagram (more than the 9216 a RoCE packet can be) / Expect it
// reported truncated (counted malformed by the engine), with or without GRO.
TEST(UdpTransportGso, OversizeDatagramIsTruncated) {
  for (bool gro : {true, false}) {
    auto tx = open_transport(false);
    auto rx = open_transport(gro);
    std::vector<uint8_t> big(10000, 0xAB);
    iovec v{big.data(), big.size()};
    TxDatagram d{Endpoint{kLoopback, rx->local_port()}, 0, 0, 1, &v};
    ASSERT_EQ(tx->send_burst(std::span(&d, 1)), 1u);
    auto got = receive(*rx, 1);
    ASSERT_EQ(got.size(), 1u) << "gro " << gro;
    EXPECT_TRUE(got[0].truncated) << "gro " << gro;
  }
}

// The host's port (SO_REUSEPORT): two transports share it besides their own
// private ports; a datagram sent to it reaches exactly one of them, which
// reports the port it arrived at; the private ports still work.
TEST(UdpTransportHostPort, SharedPortReachesOneTransport) {
  UdpConfig cfg;
  cfg.host_port = uint16_t(50000 + getpid() % 5000);  // a test's own "4791"
  cfg.gso = false;
  auto a = UdpTransport::open(cfg);
  auto b = UdpTransport::open(cfg);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(a->host_port(), cfg.host_port);
  ASSERT_EQ(b->host_port(), cfg.host_port);
  EXPECT_NE(a->local_port(), cfg.host_port);
  EXPECT_NE(a->local_port(), b->local_port());

  Message to_host(cfg.host_port, 0, 100, 100, 7);
  to_host.d.segment_size = 0;
  ASSERT_EQ(a->send_burst(std::span(&to_host.d, 1)), 1u);
  std::vector<Received> got_a, got_b;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (got_a.empty() && got_b.empty() && std::chrono::steady_clock::now() < deadline) {
    got_a = receive(*a, 1, 64, std::chrono::milliseconds(50));
    got_b = receive(*b, 1, 64, std::chrono::milliseconds(50));
  }
  ASSERT_EQ(got_a.size() + got_b.size(), 1u);
  const Received& r = got_a.empty() ? got_b[0] : got_a[0];
  EXPECT_EQ(r.dst_port, cfg.host_port);
  EXPECT_EQ(r.src_port, a->local_port());
  EXPECT_EQ(r.bytes, to_host.segments[0]);

  Message direct(b->local_port(), 0, 60, 60, 9);
  direct.d.segment_size = 0;
  ASSERT_EQ(a->send_burst(std::span(&direct.d, 1)), 1u);
  std::vector<Received> got = receive(*b, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].dst_port, b->local_port());
}

// Napping: nap() ends at its time or at wake(), never because a datagram
// arrived; nap_or_readable() also ends when a socket has one, and says so
// (it is level-triggered: a datagram already waiting ends it at once), but
// not when it was woken.
TEST(UdpTransportNap, OnlyNapOrReadableEndsForADatagram) {
  auto t = open_transport(false), peer = open_transport(false);
  Message m(t->local_port(), 0, 40, 40, 3);
  m.d.segment_size = 0;
  ASSERT_EQ(peer->send_burst(std::span(&m.d, 1)), 1u);
  auto start = std::chrono::steady_clock::now();
  t->nap(30000);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(25));
  EXPECT_TRUE(t->nap_or_readable(5'000'000));  // the datagram waits since before
  ASSERT_EQ(receive(*t, 1).size(), 1u);
  EXPECT_FALSE(t->nap_or_readable(1000));  // nothing came: the nap's end
  t->wake();
  start = std::chrono::steady_clock::now();
  EXPECT_FALSE(t->nap_or_readable(5'000'000));
  // Ended by the wake-up, not by the 5 s (a generous bound: no timing claim).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  bool readable = false;
  std::thread napper([&] { readable = t->nap_or_readable(5'000'000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it nap
  start = std::chrono::steady_clock::now();
  ASSERT_EQ(peer->send_burst(std::span(&m.d, 1)), 1u);
  napper.join();
  EXPECT_TRUE(readable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}

const IpAddress kLoopback6 =
    IpAddress::from_bytes(std::array<uint8_t, 16>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}.data());

// IPv6: each transport also has an IPv6 socket on its private port. A
// datagram to [::1]:port from ::1 / Expect it to arrive with both addresses
// (IPV6_RECVPKTINFO) and ports, although the receiver never used IPv6 before
// (its IPv6 socket is read once a wait saw it readable).
TEST(UdpTransportIpv6, DatagramCarriesAddresses) {
  auto tx = open_transport(false);
  auto rx = open_transport(false);
  if (!tx->ipv6() || !rx->ipv6()) GTEST_SKIP() << "no IPv6 on this host";
  Message m(rx->local_port(), 0, 100, 100, 3);
  m.d.segment_size = 0;
  m.d.dst.ip = kLoopback6;
  m.d.src_ip = kLoopback6;
  ASSERT_EQ(tx->send_burst(std::span(&m.d, 1)), 1u);
  auto got = receive(*rx, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes, m.segments[0]);
  EXPECT_EQ(got[0].src_ip, kLoopback6);
  EXPECT_EQ(got[0].dst_ip, kLoopback6);
  EXPECT_EQ(got[0].src_port, tx->local_port());
  EXPECT_EQ(got[0].dst_port, rx->local_port());
}

// A datagram to [::1]:port with UDP checksum 0, as rxe sends them (IPv6 UDP
// drops those unless the socket allows it, RFC 6936) / Expect it received.
TEST(UdpTransportIpv6, ZeroChecksumDatagramIsReceived) {
  auto rx = open_transport(false);
  if (!rx->ipv6()) GTEST_SKIP() << "no IPv6 on this host";
  int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  int on = 1;
  ASSERT_EQ(setsockopt(fd, IPPROTO_UDP, UDP_NO_CHECK6_TX, &on, sizeof on), 0);
  sockaddr_in6 to{};
  to.sin6_family = AF_INET6;
  to.sin6_addr = in6addr_loopback;
  to.sin6_port = htons(rx->local_port());
  std::vector<uint8_t> bytes(64, 0x6B);
  ASSERT_EQ(sendto(fd, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to), 64);
  close(fd);
  auto got = receive(*rx, 1, 64, std::chrono::seconds(2));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes, bytes);
}

// One burst mixing IPv4 and IPv6 datagrams (two runs of each) / Expect every
// one to arrive over its own family.
TEST(UdpTransportIpv6, MixedBurstGoesOutOverBothFamilies) {
  auto tx = open_transport(false);
  auto rx = open_transport(false);
  if (!tx->ipv6() || !rx->ipv6()) GTEST_SKIP() << "no IPv6 on this host";
  std::vector<Message> ms;
  for (uint8_t k = 0; k < 6; ++k) ms.emplace_back(rx->local_port(), 0, 50, 50, uint8_t(k * 10));
  std::vector<TxDatagram> ds;
  for (size_t k = 0; k < ms.size(); ++k) {
    ms[k].d.segment_size = 0;
    if (k == 1 || k == 2 || k == 4) ms[k].d.dst.ip = kLoopback6;
    ds.push_back(ms[k].d);
  }
  ASSERT_EQ(tx->send_burst(ds), ds.size());
  auto got = receive(*rx, 6);
  ASSERT_EQ(got.size(), 6u);
  unsigned v6 = 0;
  for (const Received& r : got) {
    bool six = !r.src_ip.is_v4();
    v6 += six;
    uint8_t k = uint8_t(r.bytes[0] / 10);
    EXPECT_EQ(six, k == 1 || k == 2 || k == 4) << "datagram " << unsigned(k);
    EXPECT_EQ(r.dst_ip, six ? kLoopback6 : IpAddress(kLoopback));
  }
  EXPECT_EQ(v6, 3u);
}

// A GSO message over IPv6 / Expect its segments, numbered by GRO as over IPv4.
TEST(UdpTransportIpv6, GsoMessageArrivesAsItsSegments) {
  auto tx = open_transport(true);
  auto rx = open_transport(true);
  if (!tx->ipv6() || !rx->ipv6()) GTEST_SKIP() << "no IPv6 on this host";
  if (tx->max_gso_segments() == 1) GTEST_SKIP() << "this kernel has no UDP GSO";
  Message m(rx->local_port(), 5, 1000, 300);
  m.d.dst.ip = kLoopback6;
  ASSERT_EQ(tx->send_burst(std::span(&m.d, 1)), 1u);
  auto got = receive(*rx, 6);
  ASSERT_EQ(got.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(got[i].bytes, m.segments[i]) << "segment " << i;
    EXPECT_EQ(got[i].src_ip, kLoopback6);
    if (rx->gro()) {
      EXPECT_EQ(got[i].gso_index, i);
    }
  }
}

// The host's port over IPv6 / Expect a datagram to it to reach one of the
// transports sharing it, which reports the port it arrived at.
TEST(UdpTransportIpv6, SharedHostPort) {
  UdpConfig cfg;
  cfg.host_port = uint16_t(45000 + getpid() % 5000);
  cfg.gso = false;
  auto a = UdpTransport::open(cfg);
  auto b = UdpTransport::open(cfg);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  if (!a->ipv6() || !b->ipv6()) GTEST_SKIP() << "no IPv6 on this host";
  Message to_host(cfg.host_port, 0, 80, 80, 5);
  to_host.d.segment_size = 0;
  to_host.d.dst.ip = kLoopback6;
  ASSERT_EQ(a->send_burst(std::span(&to_host.d, 1)), 1u);
  std::vector<Received> got_a, got_b;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (got_a.empty() && got_b.empty() && std::chrono::steady_clock::now() < deadline) {
    got_a = receive(*a, 1, 64, std::chrono::milliseconds(50));
    got_b = receive(*b, 1, 64, std::chrono::milliseconds(50));
  }
  ASSERT_EQ(got_a.size() + got_b.size(), 1u);
  const Received& r = got_a.empty() ? got_b[0] : got_a[0];
  EXPECT_EQ(r.dst_port, cfg.host_port);
  EXPECT_EQ(r.src_ip, kLoopback6);
  EXPECT_EQ(r.bytes, to_host.segments[0]);
}

// IpAddress: IPv4 converts to its IPv4-mapped form and back; the default is
// IPv4 0.0.0.0; only a link-local IPv6 address keeps a scope.
TEST(IpAddress, Forms) {
  IpAddress v4 = 0xC0000202;
  EXPECT_TRUE(v4.is_v4());
  EXPECT_EQ(v4.v4(), 0xC0000202u);
  EXPECT_EQ(v4.bytes[10], 0xFF);
  EXPECT_TRUE(IpAddress{}.is_v4());
  EXPECT_TRUE(IpAddress{}.unspecified());
  EXPECT_EQ(IpAddress{}, IpAddress(0u));
  std::array<uint8_t, 16> any{};
  EXPECT_TRUE(IpAddress::from_bytes(any.data()).unspecified());
  EXPECT_FALSE(IpAddress::from_bytes(any.data()).is_v4());
  std::array<uint8_t, 16> ll{0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0, 0xFC, 0, 0xFF, 0xFE, 0, 0, 1};
  EXPECT_TRUE(IpAddress::from_bytes(ll.data(), 4).link_local());
  EXPECT_EQ(IpAddress::from_bytes(ll.data(), 4).scope, 4u);
  EXPECT_NE(IpAddress::from_bytes(ll.data(), 4), IpAddress::from_bytes(ll.data(), 5));
  EXPECT_EQ(kLoopback6.scope, 0u);
  EXPECT_EQ(IpAddress::from_bytes(kLoopback6.bytes.data(), 4).scope, 0u);
}

// Loopback is 127.0.0.0/8 or ::1, multicast 224.0.0.0/4 or ff00::/8; an
// address of one family never matches the other's form.
TEST(IpAddress, LoopbackAndMulticast) {
  EXPECT_TRUE(IpAddress(0x7F000001).loopback());
  EXPECT_TRUE(IpAddress(0x7FFFFFFE).loopback());
  EXPECT_FALSE(IpAddress(0x80000001).loopback());
  EXPECT_FALSE(IpAddress(1u).loopback());  // ::ffff:0.0.0.1 is not ::1
  EXPECT_TRUE(kLoopback6.loopback());
  std::array<uint8_t, 16> not_loopback{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_FALSE(IpAddress::from_bytes(not_loopback.data()).loopback());
  EXPECT_FALSE(IpAddress::from_bytes(std::array<uint8_t, 16>{}.data()).loopback());

  EXPECT_TRUE(IpAddress(0xE0000001).multicast());
  EXPECT_TRUE(IpAddress(0xEFFFFFFF).multicast());
  EXPECT_FALSE(IpAddress(0xDFFFFFFF).multicast());
  EXPECT_FALSE(IpAddress(0xF0000000).multicast());
  std::array<uint8_t, 16> all_nodes{0xFF, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_TRUE(IpAddress::from_bytes(all_nodes.data()).multicast());
  EXPECT_FALSE(kLoopback6.multicast());
  EXPECT_FALSE(IpAddress{}.multicast());
}

}  // namespace
}  // namespace uroce::transport
