// Devices, object lifetimes, bad arguments, and the value types of the C++ API.
#include <cstring>
#include <type_traits>

#include "test_util.hpp"

namespace uroce::test {
namespace {

// Owners are move-only.
static_assert(!std::is_copy_constructible_v<Context> && std::is_nothrow_move_constructible_v<Context>);
static_assert(!std::is_copy_constructible_v<DeviceList> && std::is_move_constructible_v<DeviceList>);
static_assert(!std::is_copy_constructible_v<ProtectionDomain> && !std::is_copy_assignable_v<ProtectionDomain>);
static_assert(!std::is_copy_constructible_v<RegisteredBuffer>);
static_assert(!std::is_copy_constructible_v<MemoryRegion> && std::is_nothrow_move_constructible_v<MemoryRegion>);
static_assert(!std::is_copy_constructible_v<CompletionChannel> && !std::is_copy_constructible_v<CompletionQueue>);
static_assert(!std::is_copy_constructible_v<QueuePair> && std::is_nothrow_move_assignable_v<QueuePair>);
static_assert(!std::is_copy_constructible_v<SharedReceiveQueue> && !std::is_copy_constructible_v<AddressHandle>);
static_assert(!std::is_copy_constructible_v<EventChannel> && !std::is_copy_constructible_v<CmId>);
static_assert(!std::is_copy_constructible_v<TcpSocket> && !std::is_copy_constructible_v<TcpListener>);
// Descriptors are plain values; local and remote views do not convert into each other.
static_assert(std::is_trivially_copyable_v<RemoteBuffer> && std::is_trivially_copyable_v<QpEndpoint>);
static_assert(std::is_trivially_copyable_v<LocalSlice>);
static_assert(!std::is_convertible_v<RemoteBuffer, LocalSlice> && !std::is_convertible_v<LocalSlice, RemoteBuffer>);
static_assert(!std::is_convertible_v<RemoteBuffer, SgList> && std::is_convertible_v<LocalSlice, SgList>);
static_assert(!std::is_convertible_v<LocalKey, RemoteKey> && !std::is_convertible_v<std::uint32_t, LocalKey>);
static_assert(!std::is_convertible_v<std::uint64_t, WrId>);

TEST(Device, ListOpenAndQuery) {
  ASSERT_OK_AND_ASSIGN(DeviceList list, DeviceList::get());
  ASSERT_FALSE(list.empty());
  std::size_t seen = 0;
  for (Device d : list) {
    EXPECT_FALSE(d.name().empty());
    ++seen;
  }
  EXPECT_EQ(seen, list.size());
  ASSERT_OK_AND_ASSIGN(Device first, list.find(list[0].name()));
  ASSERT_OK_AND_ASSIGN(Context by_name, Context::open(first.name()));
  EXPECT_EQ(by_name.name(), first.name());
  ASSERT_OK_AND_ASSIGN(Context ctx, Context::open());
  ASSERT_OK_AND_ASSIGN(ibv_port_attr port, ctx.query_port(1));
  EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
  ASSERT_OK_AND_ASSIGN(Gid gid, ctx.query_gid(1, 0));
  EXPECT_FALSE(gid.is_zero());
  EXPECT_FALSE(gid.to_string().empty());
  ASSERT_OK_AND_ASSIGN(ibv_device_attr attr, ctx.query_device());
  EXPECT_GT(attr.max_qp, 0);
}

TEST(Device, UnknownNameIsENODEV) {
  auto ctx = Context::open("no-such-device");
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.error().errnum(), ENODEV);
  EXPECT_NE(ctx.error().message().find("no-such-device"), std::string::npos);
  auto port = Context::open();
  ASSERT_TRUE(port.ok());
  auto bad_port = port->query_port(7);
  ASSERT_FALSE(bad_port.ok());
  EXPECT_EQ(bad_port.error().errnum(), EINVAL) << bad_port.error().message();
}

TEST(Lifetime, CreateMoveAndDestroyEveryObject) {
  for (int round = 0; round < 3; ++round) {
    std::vector<std::byte> buffer(8192);
    ASSERT_OK_AND_ASSIGN(Context ctx, Context::open());
    ASSERT_OK_AND_ASSIGN(ProtectionDomain pd, ProtectionDomain::alloc(ctx));
    ASSERT_OK_AND_ASSIGN(CompletionChannel channel, CompletionChannel::create(ctx));
    EXPECT_GE(channel.fd(), 0);
    ASSERT_OK_AND_ASSIGN(CompletionQueue cq, CompletionQueue::create(ctx, 32, &channel));
    EXPECT_GE(cq.capacity(), 32);
    ASSERT_OK_AND_ASSIGN(MemoryRegion mr, MemoryRegion::reg(pd, std::span(buffer), Access::kAll));
    EXPECT_EQ(mr.size(), buffer.size());
    EXPECT_EQ(mr.data(), buffer.data());
    EXPECT_EQ(mr.slice().key(), mr.lkey());
    EXPECT_EQ(mr.remote().key(), mr.rkey());
    EXPECT_EQ(mr.remote(16, 32).addr, reinterpret_cast<std::uintptr_t>(buffer.data()) + 16);
    ASSERT_OK_AND_ASSIGN(SharedReceiveQueue srq, SharedReceiveQueue::create(pd));
    ASSERT_OK_AND_ASSIGN(QueuePair qp, QueuePair::create(pd, QpType::kRc, cq, cq));
    ASSERT_OK_AND_ASSIGN(QueuePair uc, QueuePair::create(pd, QpType::kUc, cq, cq));
    ASSERT_OK_AND_ASSIGN(QueuePair ud, QueuePair::create(pd, QpType::kUd, cq, cq, {.srq = &srq}));
    EXPECT_EQ(ud.type(), QpType::kUd);
    EXPECT_NE(qp.qpn(), uc.qpn());
    // Moving transfers ownership: the moved-to object destroys the QP exactly once.
    std::uint32_t qpn = qp.qpn();
    QueuePair moved = std::move(qp);
    EXPECT_EQ(moved.qpn(), qpn);
    EXPECT_EQ(qp.raw(), nullptr);  // NOLINT: checking the moved-from state on purpose
    MemoryRegion mr2 = std::move(mr);
    EXPECT_EQ(mr2.size(), buffer.size());
    ASSERT_OK_AND_ASSIGN(auto none, cq.poll_one());
    EXPECT_FALSE(none.has_value());
  }
}

TEST(Lifetime, RegisteredBufferOwnsItsMemoryAndRegistration) {
  ASSERT_OK_AND_ASSIGN(Context ctx, Context::open());
  ASSERT_OK_AND_ASSIGN(ProtectionDomain pd, ProtectionDomain::alloc(ctx));
  ASSERT_OK_AND_ASSIGN(RegisteredBuffer buffer, RegisteredBuffer::allocate(pd, 10000));
  EXPECT_EQ(buffer.size(), 10000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % 4096, 0u);
  EXPECT_EQ(buffer.bytes()[9999], std::byte{0});
  EXPECT_EQ(buffer.slice(100, 10).data(), buffer.data() + 100);
  EXPECT_EQ(buffer.remote().rkey, buffer.region().rkey().value);
  RegisteredBuffer moved = std::move(buffer);
  EXPECT_EQ(moved.size(), 10000u);
  auto empty = RegisteredBuffer::allocate(pd, 0);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().errnum(), EINVAL);
}

TEST(BadArguments, CompletionQueueSizes) {
  ASSERT_OK_AND_ASSIGN(Context ctx, Context::open());
  auto zero = CompletionQueue::create(ctx, 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().errnum(), EINVAL) << zero.error().message();
  EXPECT_NE(zero.error().message().find("ibv_create_cq"), std::string::npos);
  ASSERT_OK_AND_ASSIGN(ibv_device_attr attr, ctx.query_device());
  auto huge = CompletionQueue::create(ctx, attr.max_cqe + 1);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().errnum(), EINVAL) << huge.error().message();
}

TEST(BadArguments, QpCapsBeyondTheDevice) {
  ASSERT_OK_AND_ASSIGN(Context ctx, Context::open());
  ASSERT_OK_AND_ASSIGN(ProtectionDomain pd, ProtectionDomain::alloc(ctx));
  ASSERT_OK_AND_ASSIGN(CompletionQueue cq, CompletionQueue::create(ctx, 16));
  ASSERT_OK_AND_ASSIGN(ibv_device_attr attr, ctx.query_device());
  QpOptions options;
  options.caps.max_send_wr = std::uint32_t(attr.max_qp_wr) + 1;
  auto qp = QueuePair::create(pd, QpType::kRc, cq, cq, options);
  ASSERT_FALSE(qp.ok());
  EXPECT_EQ(qp.error().errnum(), EINVAL) << qp.error().message();
}

TEST(BadArguments, ConnectOnAUdQpAndActivateOnAnRcQp) {
  ASSERT_OK_AND_ASSIGN(Context ctx, Context::open());
  ASSERT_OK_AND_ASSIGN(ProtectionDomain pd, ProtectionDomain::alloc(ctx));
  ASSERT_OK_AND_ASSIGN(CompletionQueue cq, CompletionQueue::create(ctx, 16));
  ASSERT_OK_AND_ASSIGN(QueuePair ud, QueuePair::create(pd, QpType::kUd, cq, cq));
  ASSERT_OK_AND_ASSIGN(QueuePair rc, QueuePair::create(pd, QpType::kRc, cq, cq));
  Status s = ud.connect(QpEndpoint{});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().errnum(), EINVAL);
  s = rc.activate_ud();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().errnum(), EINVAL);
}

TEST(Completion, WaitTimesOutWithETIMEDOUT) {
  ASSERT_OK_AND_ASSIGN(Context ctx, Context::open());
  ASSERT_OK_AND_ASSIGN(CompletionChannel channel, CompletionChannel::create(ctx));
  ASSERT_OK_AND_ASSIGN(CompletionQueue polled, CompletionQueue::create(ctx, 4));
  ASSERT_OK_AND_ASSIGN(CompletionQueue evented, CompletionQueue::create(ctx, 4, &channel));
  for (const CompletionQueue* cq : {&polled, &evented}) {
    auto c = cq->wait(Milliseconds(20));
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().errnum(), ETIMEDOUT);
  }
  auto event = channel.wait_event(Milliseconds(10));
  ASSERT_FALSE(event.ok());
  EXPECT_EQ(event.error().errnum(), ETIMEDOUT);
}

TEST(Values, StatusStrings) {
  EXPECT_EQ(to_string(IBV_WC_SUCCESS), "success");
  EXPECT_EQ(to_string(IBV_WC_REM_ACCESS_ERR), "remote access error");
  Error e = Error::from_errno(EINVAL, "ibv_thing");
  EXPECT_EQ(e.message(), "ibv_thing: Invalid argument");
  EXPECT_EQ(e.wc_status(), IBV_WC_SUCCESS);
}

TEST(Values, RemoteBufferAndQpEndpointRoundTripThroughBytes) {
  RemoteBuffer remote{0x0123456789ABCDEFull, 0xA1B2C3D4u, 4096};
  auto bytes = remote.to_bytes();
  EXPECT_EQ(bytes[0], std::byte{0x01});  // big-endian on the wire
  EXPECT_EQ(bytes[8], std::byte{0xA1});
  EXPECT_EQ(RemoteBuffer::from_bytes(bytes), remote);
  EXPECT_TRUE(remote.contains(4000, 96));
  EXPECT_FALSE(remote.contains(4000, 97));
  EXPECT_EQ(remote.slice(96, 100).addr, remote.addr + 96);

  QpEndpoint e;
  e.gid.bytes[10] = 0xFF;
  e.gid.bytes[11] = 0xFF;
  e.gid.bytes[12] = 127;
  e.gid.bytes[15] = 1;
  e.qpn = 0x123456;
  e.psn = 0xABCDEF;
  e.qkey = kDefaultQkey;
  e.lid = 4791;
  EXPECT_EQ(e.gid.to_string(), "::ffff:127.0.0.1");
  auto wire = e.to_bytes();
  EXPECT_EQ(wire.size(), QpEndpoint::kWireSize);
  EXPECT_EQ(QpEndpoint::from_bytes(wire), e);
}

enum class Tag : std::uint32_t { kA = 3, kB = 9 };

TEST(Values, WrIdHoldsIntegersEnumsAndPointers) {
  int object = 0;
  EXPECT_EQ(WrId{Tag::kB}.as<Tag>(), Tag::kB);
  EXPECT_EQ(WrId{Tag::kA}.value(), 3u);
  EXPECT_EQ(WrId::of(&object).pointer<int>(), &object);
  EXPECT_LT(WrId{1}, WrId{2});
}

Status step(bool fail) {
  if (fail) return Error(EAGAIN, "step failed");
  return {};
}
Result<int> twice(Result<int> in) {
  UROCE_TRY_ASSIGN(int v, std::move(in));
  UROCE_TRY(step(v < 0));
  return 2 * v;
}

TEST(Values, ResultPropagation) {
  EXPECT_EQ(*twice(21), 42);
  auto failed = twice(Error(ENOMEM, "no memory"));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().errnum(), ENOMEM);
  auto failed_step = twice(-1);
  ASSERT_FALSE(failed_step.ok());
  EXPECT_EQ(failed_step.error().errnum(), EAGAIN);
  EXPECT_EQ(Result<int>(Error(EIO, "x")).value_or(5), 5);
}

TEST(ValuesDeathTest, ValueOfAnErrorAbortsWithTheMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH((void)Result<int>(Error(EIO, "the reason")).value(), "the reason");
}

}  // namespace
}  // namespace uroce::test
