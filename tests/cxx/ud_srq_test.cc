// UD through an AddressHandle, receives from a shared receive queue, and a CQ with a
// completion channel.
#include <cstring>

#include "test_util.hpp"

namespace uroce::test {
namespace {

// UD receives start with the 40-byte GRH space.
constexpr std::size_t kGrh = 40;

TEST(Ud, SendThroughAnAddressHandle) {
  std::vector<std::byte> send_buf = pattern(256, 9), recv_buf(kGrh + 256);
  ASSERT_OK_AND_ASSIGN(Context ctx, Context::open());
  ASSERT_OK_AND_ASSIGN(ProtectionDomain pd, ProtectionDomain::alloc(ctx));
  ASSERT_OK_AND_ASSIGN(CompletionQueue cq_a, CompletionQueue::create(ctx, 16));
  ASSERT_OK_AND_ASSIGN(CompletionQueue cq_b, CompletionQueue::create(ctx, 16));
  ASSERT_OK_AND_ASSIGN(QueuePair a, QueuePair::create(pd, QpType::kUd, cq_a, cq_a));
  ASSERT_OK_AND_ASSIGN(QueuePair b, QueuePair::create(pd, QpType::kUd, cq_b, cq_b));
  ASSERT_OK(a.activate_ud());
  ASSERT_OK(b.activate_ud());
  ASSERT_OK_AND_ASSIGN(MemoryRegion send_mr, MemoryRegion::reg(pd, std::span(send_buf)));
  ASSERT_OK_AND_ASSIGN(MemoryRegion recv_mr, MemoryRegion::reg(pd, std::span(recv_buf), Access::kLocalWrite));

  ASSERT_OK_AND_ASSIGN(QpEndpoint to_b, b.local_endpoint());
  EXPECT_EQ(to_b.qkey, kDefaultQkey);
  ASSERT_OK_AND_ASSIGN(AddressHandle ah, AddressHandle::create(pd, to_b));
  ASSERT_OK(b.post_recv(RecvRequest(recv_mr.slice(), WrId{1})));
  ASSERT_OK(a.post_send(SendRequest::send(send_mr.slice()).with_imm(77).to(ah, to_b.qpn, to_b.qkey).id(WrId{2})));
  ASSERT_OK_AND_ASSIGN(Completion sent, cq_a.wait_ok(kWait));
  EXPECT_EQ(sent.wr_id, WrId{2});
  ASSERT_OK_AND_ASSIGN(Completion got, cq_b.wait_ok(kWait));
  EXPECT_EQ(got.opcode, IBV_WC_RECV);
  EXPECT_EQ(got.byte_len, kGrh + 256);
  EXPECT_EQ(got.src_qp, a.qpn());
  ASSERT_TRUE(got.imm.has_value());
  EXPECT_EQ(*got.imm, 77u);
  EXPECT_EQ(std::memcmp(recv_buf.data() + kGrh, send_buf.data(), 256), 0);
}

TEST(Ud, WrongQkeyIsDropped) {
  std::vector<std::byte> send_buf(64), recv_buf(kGrh + 64);
  ASSERT_OK_AND_ASSIGN(Context ctx, Context::open());
  ASSERT_OK_AND_ASSIGN(ProtectionDomain pd, ProtectionDomain::alloc(ctx));
  ASSERT_OK_AND_ASSIGN(CompletionQueue cq, CompletionQueue::create(ctx, 16));
  ASSERT_OK_AND_ASSIGN(QueuePair a, QueuePair::create(pd, QpType::kUd, cq, cq));
  ASSERT_OK_AND_ASSIGN(QueuePair b, QueuePair::create(pd, QpType::kUd, cq, cq));
  ASSERT_OK(a.activate_ud());
  ASSERT_OK(b.activate_ud({.qkey = 0x1234}));
  ASSERT_OK_AND_ASSIGN(MemoryRegion send_mr, MemoryRegion::reg(pd, std::span(send_buf)));
  ASSERT_OK_AND_ASSIGN(MemoryRegion recv_mr, MemoryRegion::reg(pd, std::span(recv_buf), Access::kLocalWrite));
  ASSERT_OK_AND_ASSIGN(QpEndpoint to_b, b.local_endpoint(1, 0, 0x1234));
  ASSERT_OK_AND_ASSIGN(AddressHandle ah, AddressHandle::create(pd, to_b));
  ASSERT_OK(b.post_recv(RecvRequest(recv_mr.slice(), WrId{1})));
  ASSERT_OK(a.post_send(SendRequest::send(send_mr.slice()).to(ah, to_b.qpn, 0x9999).id(WrId{2})));
  ASSERT_OK_AND_ASSIGN(Completion sent, cq.wait_ok(kWait));  // UD sends complete locally
  EXPECT_EQ(sent.qp_num, a.qpn());
  auto nothing = cq.wait(Milliseconds(200));
  ASSERT_FALSE(nothing.ok());
  EXPECT_EQ(nothing.error().errnum(), ETIMEDOUT);
}

TEST(Srq, ReceivesComeFromTheSharedQueue) {
  std::vector<std::byte> send_buf = pattern(1024, 11), recv_buf(2048);
  ASSERT_OK_AND_ASSIGN(Context ctx, Context::open());
  ASSERT_OK_AND_ASSIGN(ProtectionDomain pd, ProtectionDomain::alloc(ctx));
  ASSERT_OK_AND_ASSIGN(CompletionChannel channel, CompletionChannel::create(ctx));
  ASSERT_OK_AND_ASSIGN(CompletionQueue cq_a, CompletionQueue::create(ctx, 16));
  ASSERT_OK_AND_ASSIGN(CompletionQueue cq_b, CompletionQueue::create(ctx, 16, &channel));
  ASSERT_OK_AND_ASSIGN(SharedReceiveQueue srq, SharedReceiveQueue::create(pd, {.max_wr = 16, .max_sge = 2}));
  ASSERT_OK_AND_ASSIGN(QueuePair a, QueuePair::create(pd, QpType::kRc, cq_a, cq_a));
  ASSERT_OK_AND_ASSIGN(QueuePair b, QueuePair::create(pd, QpType::kRc, cq_b, cq_b, {.srq = &srq}));
  ASSERT_OK_AND_ASSIGN(QpEndpoint ea, a.local_endpoint());
  ASSERT_OK_AND_ASSIGN(QpEndpoint eb, b.local_endpoint());
  ASSERT_OK(a.connect(eb));
  ASSERT_OK(b.connect(ea));
  ASSERT_OK_AND_ASSIGN(MemoryRegion send_mr, MemoryRegion::reg(pd, std::span(send_buf)));
  ASSERT_OK_AND_ASSIGN(MemoryRegion recv_mr, MemoryRegion::reg(pd, std::span(recv_buf), Access::kLocalWrite));

  std::array<RecvRequest, 2> recvs = {RecvRequest(recv_mr.slice(0, 1024), WrId{100}),
                                      RecvRequest(recv_mr.slice(1024, 1024), WrId{101})};
  ASSERT_OK(srq.post_recv(recvs));
  ASSERT_OK(a.post_send(SendRequest::send(send_mr.slice(0, 512)).id(WrId{1})));
  ASSERT_OK(a.post_send(SendRequest::send(send_mr.slice(512, 512)).id(WrId{2})));
  ASSERT_OK(cq_a.wait_n(2, kWait));
  // cq_b has a channel: wait() sleeps on it.
  ASSERT_OK_AND_ASSIGN(Completion first, cq_b.wait_ok(kWait));
  ASSERT_OK_AND_ASSIGN(Completion second, cq_b.wait_ok(kWait));
  EXPECT_EQ(first.wr_id, WrId{100});
  EXPECT_EQ(second.wr_id, WrId{101});
  EXPECT_EQ(first.qp_num, b.qpn());
  EXPECT_EQ(std::memcmp(recv_buf.data(), send_buf.data(), 512), 0);
  EXPECT_EQ(std::memcmp(recv_buf.data() + 1024, send_buf.data() + 512, 512), 0);
}

}  // namespace
}  // namespace uroce::test
