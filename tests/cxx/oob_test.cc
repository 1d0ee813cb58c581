// The out-of-band TCP exchange between two threads (TCP ports kPortBase + 1, 2, 6, 7).
#include <future>
#include <thread>

#include "test_util.hpp"

namespace uroce::test {
namespace {

struct Plain {
  std::uint64_t a;
  std::uint32_t b;
  std::uint32_t c;
};

TEST(Oob, ExchangeEndpointsBuffersAndPlainStructs) {
  constexpr std::uint16_t kPort = kPortBase + 1;
  ASSERT_OK_AND_ASSIGN(TcpListener listener, TcpListener::listen("127.0.0.1", kPort));
  EXPECT_EQ(listener.port(), kPort);
  QpEndpoint server_end;
  server_end.qpn = 17;
  server_end.psn = 0x111;
  server_end.lid = 9;
  server_end.gid.bytes[15] = 1;
  RemoteBuffer server_buf{0x1000, 0x22, 4096};

  std::thread server([&] {
    ASSERT_OK_AND_ASSIGN(TcpSocket peer, listener.accept(kWait));
    ASSERT_OK_AND_ASSIGN(QpEndpoint client_end, peer.exchange(server_end, kWait));
    EXPECT_EQ(client_end.qpn, 42u);
    ASSERT_OK_AND_ASSIGN(RemoteBuffer client_buf, peer.receive<RemoteBuffer>(kWait));
    EXPECT_EQ(client_buf.rkey, 0x77u);
    ASSERT_OK(peer.send(server_buf, kWait));
    ASSERT_OK_AND_ASSIGN(Plain p, peer.receive<Plain>(kWait));
    ASSERT_OK(peer.send(Plain{p.a + 1, p.b + 1, p.c + 1}, kWait));
  });
  struct Join {
    std::thread& t;
    ~Join() { t.join(); }
  } join{server};

  ASSERT_OK_AND_ASSIGN(TcpSocket socket, TcpSocket::connect("127.0.0.1", kPort, kWait));
  QpEndpoint mine;
  mine.qpn = 42;
  ASSERT_OK_AND_ASSIGN(QpEndpoint theirs, socket.exchange(mine, kWait));
  EXPECT_EQ(theirs, server_end);
  ASSERT_OK_AND_ASSIGN(RemoteBuffer buf, socket.exchange(RemoteBuffer{0x2000, 0x77, 64}, kWait));
  EXPECT_EQ(buf, server_buf);
  ASSERT_OK_AND_ASSIGN(Plain back, socket.exchange(Plain{1, 2, 3}, kWait));
  EXPECT_EQ(back.a, 2u);
  EXPECT_EQ(back.b, 3u);
  EXPECT_EQ(back.c, 4u);
}

TEST(Oob, ConnectWithoutAListenerGivesUpAtTheTimeout) {
  auto socket = TcpSocket::connect("127.0.0.1", kPortBase + 2, Milliseconds(200));
  ASSERT_FALSE(socket.ok());
  EXPECT_EQ(socket.error().errnum(), ECONNREFUSED) << socket.error().message();
}

TEST(Oob, ConnectRetriesUntilTheListenerAppears) {
  constexpr std::uint16_t kPort = kPortBase + 6;
  std::thread late([&] {
    std::this_thread::sleep_for(Milliseconds(100));
    ASSERT_OK_AND_ASSIGN(TcpListener listener, TcpListener::listen("127.0.0.1", kPort));
    ASSERT_OK_AND_ASSIGN(TcpSocket peer, listener.accept(kWait));
    ASSERT_OK(peer.send(std::uint32_t{7}, kWait));
  });
  struct Join {
    std::thread& t;
    ~Join() { t.join(); }
  } join{late};
  // "localhost" may resolve to ::1 first: every address is tried, in every round.
  ASSERT_OK_AND_ASSIGN(TcpSocket socket, TcpSocket::connect("localhost", kPort, kWait));
  ASSERT_OK_AND_ASSIGN(std::uint32_t seven, socket.receive<std::uint32_t>(kWait));
  EXPECT_EQ(seven, 7u);
}

TEST(Oob, SilentPeerTimesOutAndClosedPeerIsECONNRESET) {
  constexpr std::uint16_t kPort = kPortBase + 7;
  ASSERT_OK_AND_ASSIGN(TcpListener listener, TcpListener::listen("127.0.0.1", kPort));
  ASSERT_OK_AND_ASSIGN(TcpSocket client, TcpSocket::connect("127.0.0.1", kPort, kWait));
  {
    ASSERT_OK_AND_ASSIGN(TcpSocket server_side, listener.accept(kWait));
    auto nothing = client.receive<QpEndpoint>(Milliseconds(50));
    ASSERT_FALSE(nothing.ok());
    EXPECT_EQ(nothing.error().errnum(), ETIMEDOUT);
    ASSERT_OK(server_side.send(std::uint16_t{1}, kWait));  // half of a uint32_t, then close
  }
  auto truncated = client.receive<std::uint32_t>(kWait);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.error().errnum(), ECONNRESET);
  auto accept = listener.accept(Milliseconds(20));
  ASSERT_FALSE(accept.ok());
  EXPECT_EQ(accept.error().errnum(), ETIMEDOUT);
}

}  // namespace
}  // namespace uroce::test
