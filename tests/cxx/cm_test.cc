// rdma_cm over the C++ API: connect/accept with private data between two threads on
// 127.0.0.1, a SEND over the QP the CM created, disconnect; and a rejected connection.
// TCP (= rdma_cm) ports kPortBase + 0, 3 and 5 (test_util.hpp).
#include <cstring>
#include <future>
#include <thread>

#include "test_util.hpp"

namespace uroce::test {
namespace {

struct Hello {
  char text[16];
  std::uint32_t number;
};

Hello make_hello(const char* text, std::uint32_t number) {
  Hello h{};
  std::strncpy(h.text, text, sizeof h.text - 1);
  h.number = number;
  return h;
}

// What one side of a CM connection holds, in destruction order (the id, which destroys its
// QP, goes before the CQ and the PD).
struct Side {
  std::optional<Context> ctx;
  std::optional<ProtectionDomain> pd;
  std::optional<CompletionQueue> cq;
  std::optional<MemoryRegion> mr;
  std::vector<std::byte> buffer = std::vector<std::byte>(256);
};

void make_resources(Side& side, CmId& id) {
  ASSERT_OK_AND_ASSIGN(side.ctx, id.context());
  ASSERT_OK_AND_ASSIGN(side.pd, ProtectionDomain::alloc(*side.ctx));
  ASSERT_OK_AND_ASSIGN(side.cq, CompletionQueue::create(*side.ctx, 16));
  ASSERT_OK_AND_ASSIGN(side.mr, MemoryRegion::reg(*side.pd, std::span(side.buffer), Access::kAll));
  ASSERT_OK(id.create_qp(*side.pd, *side.cq, *side.cq));
  EXPECT_TRUE(id.has_qp());
}

void serve(std::uint16_t port, std::promise<void>& listening) {
  Side side;
  ASSERT_OK_AND_ASSIGN(EventChannel channel, EventChannel::create());
  ASSERT_OK_AND_ASSIGN(CmId listener, CmId::create(channel));
  ASSERT_OK(listener.bind("127.0.0.1", port));
  ASSERT_OK(listener.listen());
  EXPECT_EQ(listener.local_port(), port);
  listening.set_value();

  ASSERT_OK_AND_ASSIGN(ConnectRequest request, listener.get_request(kWait));
  auto hello = request.event.private_as<Hello>();
  ASSERT_TRUE(hello.has_value());
  EXPECT_STREQ(hello->text, "hello");
  EXPECT_EQ(hello->number, 1234u);
  CmId& id = request.id;
  ASSERT_NO_FATAL_FAILURE(make_resources(side, id));
  ASSERT_OK(id.qp().post_recv(RecvRequest(side.mr->slice(0, 64), WrId{1})));
  Hello reply = make_hello("welcome", 5678);
  ASSERT_OK(id.accept(ConnParam::with(reply)));
  ASSERT_OK(id.wait_established(kWait));

  ASSERT_OK_AND_ASSIGN(Completion got, side.cq->wait_ok(kWait));
  EXPECT_EQ(got.opcode, IBV_WC_RECV);
  EXPECT_EQ(got.byte_len, 5u);
  EXPECT_EQ(std::memcmp(side.buffer.data(), "ping", 5), 0);
  ASSERT_OK(id.wait_disconnected(kWait));
}

TEST(Cm, ConnectAcceptWithPrivateDataThenSendAndDisconnect) {
  constexpr std::uint16_t kPort = kPortBase + 0;
  std::promise<void> listening;
  std::future<void> ready = listening.get_future();
  std::thread server(serve, kPort, std::ref(listening));
  struct Join {
    std::thread& t;
    ~Join() { t.join(); }
  } join{server};
  ASSERT_EQ(ready.wait_for(kWait), std::future_status::ready);

  Side side;
  ASSERT_OK_AND_ASSIGN(EventChannel channel, EventChannel::create());
  ASSERT_OK_AND_ASSIGN(CmId id, CmId::create(channel));
  ASSERT_OK(id.resolve("127.0.0.1", kPort, kWait));
  ASSERT_NO_FATAL_FAILURE(make_resources(side, id));
  Hello hello = make_hello("hello", 1234);
  ASSERT_OK(id.connect(ConnParam::with(hello)));
  ASSERT_OK_AND_ASSIGN(CmEvent established, id.wait_established(kWait));
  auto reply = established.private_as<Hello>();
  ASSERT_TRUE(reply.has_value());
  EXPECT_STREQ(reply->text, "welcome");
  EXPECT_EQ(reply->number, 5678u);
  ASSERT_OK_AND_ASSIGN(ibv_qp_state state, id.qp().state());
  EXPECT_EQ(state, IBV_QPS_RTS);

  std::memcpy(side.buffer.data(), "ping", 5);
  ASSERT_OK(id.qp().post_send(SendRequest::send(side.mr->slice(0, 5)).id(WrId{2})));
  ASSERT_OK(side.cq->wait_ok(kWait));
  ASSERT_OK(id.disconnect());
  ASSERT_OK(id.wait_disconnected(kWait));
}

TEST(Cm, RejectedConnectionIsECONNREFUSED) {
  constexpr std::uint16_t kPort = kPortBase + 3;
  std::promise<void> listening;
  std::future<void> ready = listening.get_future();
  std::thread server([&] {
    ASSERT_OK_AND_ASSIGN(EventChannel channel, EventChannel::create());
    ASSERT_OK_AND_ASSIGN(CmId listener, CmId::create(channel));
    ASSERT_OK(listener.bind("127.0.0.1", kPort));
    ASSERT_OK(listener.listen());
    listening.set_value();
    ASSERT_OK_AND_ASSIGN(ConnectRequest request, listener.get_request(kWait));
    Hello no = make_hello("go away", 1);
    ASSERT_OK(request.id.reject(std::as_bytes(std::span(&no, 1))));
  });
  struct Join {
    std::thread& t;
    ~Join() { t.join(); }
  } join{server};
  ASSERT_EQ(ready.wait_for(kWait), std::future_status::ready);

  Side side;
  ASSERT_OK_AND_ASSIGN(EventChannel channel, EventChannel::create());
  ASSERT_OK_AND_ASSIGN(CmId id, CmId::create(channel));
  ASSERT_OK(id.resolve("127.0.0.1", kPort, kWait));
  ASSERT_NO_FATAL_FAILURE(make_resources(side, id));
  ASSERT_OK(id.connect());
  auto established = id.wait_established(kWait);
  ASSERT_FALSE(established.ok());
  EXPECT_EQ(established.error().errnum(), ECONNREFUSED) << established.error().message();
}

TEST(Cm, ResolvingANameThatDoesNotExistIsAnError) {
  ASSERT_OK_AND_ASSIGN(EventChannel channel, EventChannel::create());
  ASSERT_OK_AND_ASSIGN(CmId id, CmId::create(channel));
  auto context = id.context();
  ASSERT_FALSE(context.ok());
  EXPECT_EQ(context.error().errnum(), ENODEV);
  Status s = id.resolve("no-such-host.invalid", kPortBase + 5, Milliseconds(500));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().errnum(), EHOSTUNREACH) << s.error().message();
}

}  // namespace
}  // namespace uroce::test
