// ShmTransport: datagrams to a local transport of the host go through its
// shared-memory segment (whole, with their addressing; GSO messages as one
// record per segment, each with its place), others through the socket; a
// receiver asleep in recv_burst is woken by the doorbell, also when another
// thread swallowed it; jumbo packets go whole and are delivered in place;
// bare datagrams (no ICRC) go only through a ring; a segment of another
// layout version is not attached to; a scribbled ring loses datagrams, never
// the process; a word posted to the board is read, and wakes, as a record.
#include "transport/shm_transport.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/udp_transport.h"

namespace uroce::transport {
namespace {

constexpr uint32_t kLoopback = 0x7F000001;

// Two transports of "the host": each knows the other's port and segment.
class Directory : public ShmDirectory {
 public:
  bool lookup(uint16_t port, std::string* segment, unsigned* ring) noexcept override {
    for (auto& [p, seg] : peers) {
      if (p != port) continue;
      *segment = seg;
      *ring = my_ring;
      return true;
    }
    return false;
  }
  std::vector<std::pair<uint16_t, std::string>> peers;
  unsigned my_ring = 0;
};

struct Node {
  Directory dir;
  std::unique_ptr<ShmTransport> t;
  std::string segment;
};

std::unique_ptr<DatagramTransport> udp() {
  UdpConfig cfg;
  cfg.host_port = 0;
  auto t = UdpTransport::open(cfg);
  EXPECT_NE(t, nullptr);
  return t;
}

class ShmTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (unsigned i = 0; i < 2; ++i) {
      nodes[i].segment = "/dev/shm/uroce-shm-transport-test-" + std::to_string(getpid()) + "-" + std::to_string(i);
      nodes[i].dir.my_ring = i + 1;
      std::unique_ptr<DatagramTransport> back;
      nodes[i].t = ShmTransport::open(udp(), nodes[i].segment, &nodes[i].dir, &back);
      ASSERT_NE(nodes[i].t, nullptr);
    }
    for (unsigned i = 0; i < 2; ++i) nodes[i].dir.peers.push_back({nodes[1 - i].t->local_port(), nodes[1 - i].segment});
  }

  // Receives until `want` datagrams (copied) or 5 s.
  static std::vector<std::pair<RxDatagram, std::vector<uint8_t>>> receive(ShmTransport& t, size_t want) {
    std::vector<std::pair<RxDatagram, std::vector<uint8_t>>> got;
    std::vector<RxDatagram> rx(64);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (got.size() < want && std::chrono::steady_clock::now() < deadline) {
      size_t n = t.recv_burst(rx, 50);
      for (size_t i = 0; i < n; ++i) got.push_back({rx[i], std::vector<uint8_t>(rx[i].data, rx[i].data + rx[i].len)});
    }
    return got;
  }

  Node nodes[2];
};

TEST_F(ShmTransportTest, LocalDatagramGoesThroughSharedMemoryWithItsAddresses) {
  std::vector<uint8_t> a(100, 0xA1), b(60, 0xB2);
  iovec v[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
  TxDatagram d{Endpoint{kLoopback, nodes[1].t->local_port()}, kLoopback, 0, 2, v};
  EXPECT_TRUE(nodes[0].t->through_memory(d.dst));
  ASSERT_EQ(nodes[0].t->send_burst(std::span(&d, 1)), 1u);
  auto got = receive(*nodes[1].t, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(nodes[0].t->shm_sent(), 1u);
  EXPECT_EQ(nodes[1].t->shm_received(), 1u);
  std::vector<uint8_t> want = a;
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(got[0].second, want);
  EXPECT_EQ(got[0].first.src, (Endpoint{kLoopback, nodes[0].t->local_port()}));
  EXPECT_EQ(got[0].first.dst_ip, kLoopback);
  EXPECT_EQ(got[0].first.dst_port, nodes[1].t->local_port());
  EXPECT_FALSE(got[0].first.truncated);
}

TEST_F(ShmTransportTest, GsoMessageArrivesAsItsSegmentsInOrder) {
  std::vector<uint8_t> bytes(3 * 1000 + 400);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i / 1000 + 1);
  iovec v{bytes.data(), bytes.size()};
  TxDatagram d{Endpoint{kLoopback, nodes[1].t->local_port()}, kLoopback, 1000, 1, &v};
  ASSERT_EQ(nodes[0].t->send_burst(std::span(&d, 1)), 1u);
  auto got = receive(*nodes[1].t, 4);
  ASSERT_EQ(got.size(), 4u);
  for (unsigned k = 0; k < 4; ++k) {
    EXPECT_EQ(got[k].second.size(), k < 3 ? 1000u : 400u);
    EXPECT_EQ(got[k].second[0], uint8_t(k + 1));
    EXPECT_EQ(got[k].first.gso_index, k);  // the IP identification its ICRC was computed with
  }
}

TEST_F(ShmTransportTest, UnknownDestinationGoesThroughTheSocket) {
  auto other = udp();  // a plain transport: no segment
  std::vector<uint8_t> a(40, 0x5A);
  iovec v{a.data(), a.size()};
  TxDatagram d{Endpoint{kLoopback, other->local_port()}, kLoopback, 0, 1, &v};
  EXPECT_FALSE(nodes[0].t->through_memory(d.dst));
  EXPECT_FALSE(other->through_memory(d.dst));
  ASSERT_EQ(nodes[0].t->send_burst(std::span(&d, 1)), 1u);
  std::vector<RxDatagram> rx(4);
  size_t n = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (n == 0 && std::chrono::steady_clock::now() < deadline) n = other->recv_burst(rx, 50);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(rx[0].len, 40u);
  EXPECT_EQ(nodes[0].t->shm_sent(), 0u);
}

// A bare datagram (no ICRC) goes through the ring and arrives marked so;
// one the ring cannot take (no segment at its destination) is dropped and
// counted, never put on the socket, while its plain neighbours still go.
TEST_F(ShmTransportTest, BareDatagramGoesOnlyThroughARing) {
  std::vector<uint8_t> a(40, 0x3C);
  iovec v{a.data(), a.size()};
  TxDatagram plain{Endpoint{kLoopback, nodes[1].t->local_port()}, kLoopback, 0, 1, &v};
  TxDatagram bare = plain;
  bare.bare = true;
  TxDatagram both[2] = {bare, plain};
  ASSERT_EQ(nodes[0].t->send_burst(both), 2u);
  auto got = receive(*nodes[1].t, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].first.bare);
  EXPECT_FALSE(got[1].first.bare);
  EXPECT_EQ(got[0].second, a);

  auto other = udp();  // a plain transport: no segment
  TxDatagram to_socket[3] = {plain, bare, plain};
  for (auto& d : to_socket) d.dst = Endpoint{kLoopback, other->local_port()};
  ASSERT_EQ(nodes[0].t->send_burst(to_socket), 3u);
  std::vector<RxDatagram> rx(4);
  size_t n = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (n < 2 && std::chrono::steady_clock::now() < deadline) n += other->recv_burst(std::span(rx).subspan(n), 50);
  EXPECT_EQ(n, 2u);  // the two plain ones
  EXPECT_EQ(other->recv_burst(rx, 100), 0u);
  EXPECT_EQ(nodes[0].t->bare_drops(), 1u);
}

// A segment of another uroce build (its magic, which carries the layout's
// version, differs) / Expect no ring attached to it: the datagram goes
// through the socket, and arrives.
TEST_F(ShmTransportTest, SegmentOfAnotherVersionIsReachedThroughTheSocket) {
  int fd = ::open(nodes[1].segment.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const uint64_t older = 0x75726f63'65536567ULL;  // the layout before bare records
  ASSERT_EQ(::pwrite(fd, &older, sizeof older, 0), ssize_t(sizeof older));
  ::close(fd);
  std::vector<uint8_t> a(40, 0x77);
  iovec v{a.data(), a.size()};
  TxDatagram d{Endpoint{kLoopback, nodes[1].t->local_port()}, kLoopback, 0, 1, &v};
  EXPECT_FALSE(nodes[0].t->through_memory(d.dst));
  ASSERT_EQ(nodes[0].t->send_burst(std::span(&d, 1)), 1u);
  auto got = receive(*nodes[1].t, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].second, a);
  EXPECT_EQ(nodes[0].t->shm_sent(), 0u);
}

// A receiver whose rings deliver on every receive asks its socket only now
// and then: a datagram that comes through the socket meanwhile still
// arrives, among the records, and none of them is lost.
TEST_F(ShmTransportTest, SocketDatagramReachesAReceiverWhoseRingsAreBusy) {
  auto other = udp();  // a peer of another host, as far as node 1 knows
  std::vector<uint8_t> rec(48, 0x11), dgram(40, 0x5A);
  iovec rv{rec.data(), rec.size()}, dv{dgram.data(), dgram.size()};
  TxDatagram to_ring{Endpoint{kLoopback, nodes[1].t->local_port()}, kLoopback, 0, 1, &rv};
  TxDatagram to_socket{Endpoint{kLoopback, nodes[1].t->local_port()}, kLoopback, 0, 1, &dv};
  std::vector<RxDatagram> rx(64);
  size_t records = 0, pushed = 0;
  bool socket_seen = false;
  // Rings active first, then the datagram through the socket.
  ASSERT_EQ(nodes[0].t->send_burst(std::span(&to_ring, 1)), 1u);
  ++pushed;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (records == 0 && std::chrono::steady_clock::now() < deadline) records += nodes[1].t->recv_burst(rx, 50);
  ASSERT_EQ(records, 1u);
  ASSERT_EQ(other->send_burst(std::span(&to_socket, 1)), 1u);
  while (!socket_seen && std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(nodes[0].t->send_burst(std::span(&to_ring, 1)), 1u);  // a record before every receive
    ++pushed;
    size_t n = nodes[1].t->recv_burst(rx, 0);
    for (size_t i = 0; i < n; ++i) {
      if (rx[i].len == dgram.size() && rx[i].data[0] == 0x5A) {
        socket_seen = true;
        EXPECT_EQ(rx[i].src.port, other->local_port());
      } else {
        ASSERT_EQ(rx[i].len, rec.size());
        ++records;
      }
    }
  }
  EXPECT_TRUE(socket_seen);
  while (records < pushed && std::chrono::steady_clock::now() < deadline) records += nodes[1].t->recv_burst(rx, 50);
  EXPECT_EQ(records, pushed);
}

// While the rings deliver and the socket is quiet, a poller asks the socket
// only now and then; a thread napping meanwhile watches it: a datagram
// arriving makes the next receive ask (socket_due), the nap goes on (it does
// not take the datagram: that is the poller's), and the receive delivers it.
TEST_F(ShmTransportTest, NappingThreadTellsThePollerOfASocketDatagram) {
  auto other = udp();
  std::vector<uint8_t> rec(48, 0x11), dgram(40, 0x5A);
  iovec rv{rec.data(), rec.size()}, dv{dgram.data(), dgram.size()};
  TxDatagram to_ring{Endpoint{kLoopback, nodes[1].t->local_port()}, kLoopback, 0, 1, &rv};
  TxDatagram to_socket{Endpoint{kLoopback, nodes[1].t->local_port()}, kLoopback, 0, 1, &dv};
  ASSERT_EQ(nodes[0].t->send_burst(std::span(&to_ring, 1)), 1u);
  ASSERT_EQ(receive(*nodes[1].t, 1).size(), 1u);  // the rings deliver; the socket was asked
  EXPECT_FALSE(nodes[1].t->socket_due());
  std::atomic<bool> napped{false};
  std::thread napper([&] {
    nodes[1].t->nap(5'000'000);
    napped = true;
  });
  ASSERT_EQ(other->send_burst(std::span(&to_socket, 1)), 1u);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  while (!nodes[1].t->socket_due() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(nodes[1].t->socket_due());
  EXPECT_FALSE(napped);  // told, it naps on (for the rest of its 5 s)
  ASSERT_EQ(nodes[0].t->send_burst(std::span(&to_ring, 1)), 1u);
  std::vector<RxDatagram> rx(8);
  size_t n = nodes[1].t->recv_burst(rx, 0);
  ASSERT_EQ(n, 2u);  // the record and the socket's datagram
  EXPECT_EQ(rx[1].len, dgram.size());
  EXPECT_EQ(rx[1].src.port, other->local_port());
  EXPECT_FALSE(nodes[1].t->socket_due());
  nodes[1].t->wake();
  napper.join();
}

// A receiver blocked in recv_burst (nothing in its rings: it sleeps in the
// socket's poll) gets a datagram pushed into its ring: the doorbell wakes it.
TEST_F(ShmTransportTest, SleepingReceiverIsWokenByTheDoorbell) {
  std::vector<RxDatagram> rx(4);
  size_t n = 0;
  std::thread receiver([&] {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (n == 0 && std::chrono::steady_clock::now() < deadline) n = nodes[1].t->recv_burst(rx, 5000);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let it block
  std::vector<uint8_t> a(20, 0x33);
  iovec v{a.data(), a.size()};
  TxDatagram d{Endpoint{kLoopback, nodes[1].t->local_port()}, kLoopback, 0, 1, &v};
  ASSERT_EQ(nodes[0].t->send_burst(std::span(&d, 1)), 1u);
  auto start = std::chrono::steady_clock::now();
  receiver.join();
  ASSERT_EQ(n, 1u);  // not the doorbell itself: that one is swallowed
  EXPECT_EQ(rx[0].len, 20u);
  // Woken by the doorbell, not by the 5 s timeout (a generous bound: no timing claim).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}

// The board: a word posted to a local transport's cell is what its receiver
// reads there, once it has been told that the board moved (and told once);
// cleared, the cell reads 0; a destination without a ring has no board.
TEST_F(ShmTransportTest, BoardWordIsReadByTheReceiverAfterTheMove) {
  Endpoint to1{kLoopback, nodes[1].t->local_port()};
  EXPECT_FALSE(nodes[1].t->take_board_change());
  ASSERT_TRUE(nodes[0].t->post_board(to1, 7, 0x8000'0000'1234'5678ULL));
  EXPECT_EQ(nodes[0].t->board_posts(), 1u);
  EXPECT_TRUE(nodes[1].t->take_board_change());
  EXPECT_FALSE(nodes[1].t->take_board_change());
  EXPECT_EQ(nodes[1].t->board_word(7), 0x8000'0000'1234'5678ULL);
  EXPECT_EQ(nodes[1].t->board_word(8), 0u);
  EXPECT_EQ(nodes[0].t->board_word(7), 0u);  // the receiver's board, not the sender's
  nodes[1].t->clear_board(7);
  EXPECT_EQ(nodes[1].t->board_word(7), 0u);
  EXPECT_FALSE(nodes[0].t->post_board(to1, ShmTransport::kBoardCells, 1));
  EXPECT_FALSE(nodes[0].t->post_board(Endpoint{kLoopback, 1}, 7, 1));  // no such transport
}

// A receiver blocked in wait() is woken by a word posted to its board (the
// doorbell, as for a record), and one whose board moved unseen does not block.
TEST_F(ShmTransportTest, BoardWordWakesASleepingReceiver) {
  std::atomic<bool> woke{false};
  std::thread receiver([&] {
    nodes[1].t->wait(5000);
    woke = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let it block
  ASSERT_TRUE(nodes[0].t->post_board(Endpoint{kLoopback, nodes[1].t->local_port()}, 3, 42));
  auto start = std::chrono::steady_clock::now();
  receiver.join();
  EXPECT_TRUE(woke);
  // Woken by the doorbell, not by the 5 s timeout (a generous bound: no timing claim).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  start = std::chrono::steady_clock::now();
  nodes[1].t->wait(5000);  // the move not yet taken: no sleep at all
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  EXPECT_TRUE(nodes[1].t->take_board_change());
}

// A UDP transport whose wait() first stops at a gate the test opens: the
// moment between a waiter taking the segment's waiting word and its poll.
class GatedUdp : public DatagramTransport {
 public:
  GatedUdp() : inner_(udp()) {}
  size_t send_burst(std::span<TxDatagram> burst) noexcept override { return inner_->send_burst(burst); }
  size_t recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept override {
    size_t n = inner_->recv_burst(out, timeout_ms);
    for (size_t i = 0; i < n; ++i) doorbells += out[i].len == 1;
    return n;
  }
  void wake() noexcept override { inner_->wake(); }
  void wait(int timeout_ms) noexcept override {
    in_gate = true;
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return open_; });
    lock.unlock();
    inner_->wait(timeout_ms);
  }
  void open_gate() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  uint16_t local_port() const noexcept override { return inner_->local_port(); }
  std::atomic<bool> in_gate{false};
  std::atomic<unsigned> doorbells{0};  // one-byte datagrams the socket delivered

 private:
  std::unique_ptr<DatagramTransport> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Spins (bounded: 5 s) until `done`.
template <typename F>
bool eventually(F done) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The engine's progress thread waits without the receive turn, and a CQ
// poller receives meanwhile. Receive: a datagram pushed while the waiter is
// on its way to its poll; the poller takes it and swallows its doorbell.
// Expect: the waiter's poll still ends at once (woken, not by its 5 s
// timeout): no later sender rings again until it has waited anew.
TEST_F(ShmTransportTest, DoorbellSwallowedByAnotherThreadStillWakesTheWaiter) {
  auto gated = std::make_unique<GatedUdp>();
  GatedUdp* gate = gated.get();
  Directory dir;
  std::string segment = "/dev/shm/uroce-shm-transport-test-" + std::to_string(getpid()) + "-gated";
  std::unique_ptr<DatagramTransport> back;
  auto r = ShmTransport::open(std::move(gated), segment, &dir, &back);
  ASSERT_NE(r, nullptr);
  nodes[0].dir.peers.push_back({r->local_port(), segment});

  std::chrono::steady_clock::time_point opened, woke;
  std::thread waiter([&] {
    r->wait(5000);
    woke = std::chrono::steady_clock::now();
  });
  ASSERT_TRUE(eventually([&] { return gate->in_gate.load(); }));
  std::vector<uint8_t> a(20, 0x44);
  iovec v{a.data(), a.size()};
  TxDatagram d{Endpoint{kLoopback, r->local_port()}, kLoopback, 0, 1, &v};
  ASSERT_EQ(nodes[0].t->send_burst(std::span(&d, 1)), 1u);
  ASSERT_EQ(nodes[0].t->shm_sent(), 1u);
  // The poller: receives the datagram and, asking the socket too, the doorbell.
  std::vector<RxDatagram> rx(4);
  size_t got = 0;
  EXPECT_TRUE(eventually([&] {
    got += r->recv_burst(rx, 0);
    return got >= 1 && gate->doorbells.load() >= 1;
  }));
  EXPECT_EQ(got, 1u);  // the datagram; the doorbell was swallowed
  opened = std::chrono::steady_clock::now();
  gate->open_gate();
  waiter.join();
  // Woken, not timed out (a generous bound: no timing claim).
  EXPECT_LT(woke - opened, std::chrono::seconds(4));
}

// A jumbo packet goes as one record, after the datagram sent before it, its
// payload (after the first part, the headers) on a cache line; it is
// delivered in place, flagged, and stays readable until the next receive,
// which frees it. To a destination without a segment: kNotLocal, nothing sent.
TEST_F(ShmTransportTest, JumboGoesWholeInPlaceAndInOrder) {
  std::vector<uint8_t> small(40, 0x11), head(28, 0x22), payload(200000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 13 + 1);
  Endpoint to{kLoopback, nodes[1].t->local_port()};
  ASSERT_GE(nodes[0].t->jumbo_limit(to), ShmTransport::kJumboBytes);
  iovec sv{small.data(), small.size()};
  TxDatagram d{to, kLoopback, 0, 1, &sv};
  ASSERT_EQ(nodes[0].t->send_burst(std::span(&d, 1)), 1u);
  iovec jv[2] = {{head.data(), head.size()}, {payload.data(), payload.size()}};
  ASSERT_EQ(nodes[0].t->send_jumbo(to, kLoopback, jv, 2), JumboSend::kSent);

  std::vector<RxDatagram> rx(8);
  size_t n = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (n < 2 && std::chrono::steady_clock::now() < deadline)
    n += nodes[1].t->recv_burst(std::span(rx).subspan(n), 50);
  ASSERT_EQ(n, 2u);
  EXPECT_FALSE(rx[0].jumbo);
  EXPECT_EQ(rx[0].len, small.size());
  ASSERT_TRUE(rx[1].jumbo);
  ASSERT_EQ(rx[1].len, head.size() + payload.size());
  EXPECT_EQ(rx[1].src, (Endpoint{kLoopback, nodes[0].t->local_port()}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(rx[1].data + head.size()) % ShmRing::kLineBytes, 0u);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), rx[1].data));
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), rx[1].data + head.size()));
  EXPECT_EQ(nodes[1].t->recv_burst(rx, 0), 0u);  // frees it: nothing more

  auto other = udp();
  Endpoint elsewhere{kLoopback, other->local_port()};
  EXPECT_EQ(nodes[0].t->jumbo_limit(elsewhere), 0u);
  EXPECT_EQ(nodes[0].t->send_jumbo(elsewhere, kLoopback, jv, 2), JumboSend::kNotLocal);
}

// A stream of jumbo packets larger than the ring: each is freed by the
// receive after the one that returned it, so the sender finds room again and
// every byte arrives in order.
TEST_F(ShmTransportTest, JumboStreamLargerThanTheRingArrivesInOrder) {
  Endpoint to{kLoopback, nodes[1].t->local_port()};
  std::vector<uint8_t> payload(ShmTransport::kJumboBytes);
  const unsigned kCount = 3 * ShmTransport::kRingBytes / ShmTransport::kJumboBytes;
  std::thread receiver([&] {
    std::vector<RxDatagram> rx(8);
    unsigned got = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got < kCount && std::chrono::steady_clock::now() < deadline) {
      size_t n = nodes[1].t->recv_burst(rx, 50);
      for (size_t i = 0; i < n; ++i) {
        EXPECT_TRUE(rx[i].jumbo);
        EXPECT_EQ(rx[i].len, 8 + payload.size());
        uint32_t seq = 0;
        std::memcpy(&seq, rx[i].data, 4);
        EXPECT_EQ(seq, got);
        EXPECT_EQ(rx[i].data[8 + payload.size() - 1], uint8_t(seq));
        ++got;
      }
    }
    EXPECT_EQ(got, kCount);
  });
  for (uint32_t seq = 0; seq < kCount; ++seq) {
    uint8_t head[8] = {};
    std::memcpy(head, &seq, 4);
    payload.back() = uint8_t(seq);
    iovec jv[2] = {{head, 8}, {payload.data(), payload.size()}};
    JumboSend r = JumboSend::kDropped;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (r == JumboSend::kDropped && std::chrono::steady_clock::now() < deadline)
      r = nodes[0].t->send_jumbo(to, kLoopback, jv, 2);  // dropped on a full ring: try again
    ASSERT_EQ(r, JumboSend::kSent);
  }
  receiver.join();
}

// A peer scribbles over the ring it shares with us: the datagrams in it are
// lost, the process is not harmed, and nothing else is delivered from it.
TEST_F(ShmTransportTest, ScribbledRingLosesItsDatagramsOnly) {
  std::vector<uint8_t> a(64, 0x77);
  iovec v{a.data(), a.size()};
  TxDatagram d{Endpoint{kLoopback, nodes[1].t->local_port()}, kLoopback, 0, 1, &v};
  ASSERT_EQ(nodes[0].t->send_burst(std::span(&d, 1)), 1u);
  // Ring 1 of node 1's segment (from node 0): overwrite its first record's length.
  FILE* f = std::fopen(nodes[1].segment.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  uint32_t huge = 0x7FFFFFF0;
  std::fseek(f, long(ShmTransport::ring_offset(1) + ShmRing::kHeaderBytes), SEEK_SET);
  std::fwrite(&huge, 4, 1, f);
  std::fclose(f);
  std::vector<RxDatagram> rx(4);
  EXPECT_EQ(nodes[1].t->recv_burst(rx, 100), 0u);
  EXPECT_EQ(nodes[1].t->recv_burst(rx, 0), 0u);
}

}  // namespace
}  // namespace uroce::transport
