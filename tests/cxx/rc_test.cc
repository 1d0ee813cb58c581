// RC data path over the C++ API: two QPs of one process connected to each other.
#include <cstring>

#include "test_util.hpp"

namespace uroce::test {
namespace {

class RcTest : public RcPair {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(build(QpType::kRc));
    ASSERT_NO_FATAL_FAILURE(connect());
  }
  void fill_a(unsigned seed) {
    auto p = pattern(kBufferSize, seed);
    std::memcpy(buf_a_.data(), p.data(), p.size());
  }
};

enum class Op : std::uint64_t { kSend = 1, kRecv, kWrite, kRead };

TEST_F(RcTest, SendReceive) {
  fill_a(1);
  ASSERT_OK(qp_b_->post_recv(RecvRequest(mr_b_->slice(0, 1024), WrId{Op::kRecv})));
  ASSERT_OK(qp_a_->post_send(SendRequest::send(mr_a_->slice(0, 1000)).id(WrId{Op::kSend})));

  ASSERT_OK_AND_ASSIGN(Completion sent, cq_a_->wait(kWait));
  EXPECT_TRUE(sent.ok()) << to_string(sent.status);
  EXPECT_EQ(sent.opcode, IBV_WC_SEND);
  EXPECT_EQ(sent.wr_id.as<Op>(), Op::kSend);
  ASSERT_OK_AND_ASSIGN(Completion got, cq_b_->wait_ok(kWait));
  EXPECT_EQ(got.opcode, IBV_WC_RECV);
  EXPECT_EQ(got.byte_len, 1000u);
  EXPECT_EQ(got.wr_id, WrId{Op::kRecv});
  EXPECT_EQ(got.qp_num, qp_b_->qpn());
  EXPECT_FALSE(got.imm.has_value());
  EXPECT_EQ(std::memcmp(buf_a_.data(), buf_b_.data(), 1000), 0);
}

TEST_F(RcTest, SendWithImmediate) {
  fill_a(2);
  ASSERT_OK(qp_b_->post_recv(RecvRequest(mr_b_->slice(), WrId{7})));
  ASSERT_OK(qp_a_->post_send(SendRequest::send_with_imm(mr_a_->slice(0, 64), 0xDEADBEEF).id(WrId{8})));
  ASSERT_OK(cq_a_->wait_ok(kWait));
  ASSERT_OK_AND_ASSIGN(Completion got, cq_b_->wait_ok(kWait));
  EXPECT_EQ(got.opcode, IBV_WC_RECV);
  ASSERT_TRUE(got.imm.has_value());
  EXPECT_EQ(*got.imm, 0xDEADBEEFu);
  EXPECT_EQ(got.byte_len, 64u);
  EXPECT_EQ(std::memcmp(buf_a_.data(), buf_b_.data(), 64), 0);
}

TEST_F(RcTest, Write) {
  fill_a(3);
  RemoteBuffer remote = mr_b_->remote(100, 2000);  // what b would send to a
  ASSERT_OK(qp_a_->post_send(SendRequest::write(mr_a_->slice(0, 2000), remote).id(WrId{Op::kWrite})));
  ASSERT_OK_AND_ASSIGN(Completion c, cq_a_->wait_ok(kWait));
  EXPECT_EQ(c.opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(c.wr_id.as<Op>(), Op::kWrite);
  EXPECT_EQ(std::memcmp(buf_a_.data(), buf_b_.data() + 100, 2000), 0);
  EXPECT_EQ(buf_b_[99], std::byte{0});
  EXPECT_EQ(buf_b_[2100], std::byte{0});
}

TEST_F(RcTest, WriteWithImmediateConsumesAReceive) {
  fill_a(4);
  ASSERT_OK(qp_b_->post_recv(RecvRequest({}, WrId{5})));  // no slices: only the immediate lands
  ASSERT_OK(qp_a_->post_send(SendRequest::write(mr_a_->slice(0, 512), mr_b_->remote()).with_imm(42)));
  ASSERT_OK(cq_a_->wait_ok(kWait));
  ASSERT_OK_AND_ASSIGN(Completion got, cq_b_->wait_ok(kWait));
  EXPECT_EQ(got.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(got.wr_id, WrId{5});
  ASSERT_TRUE(got.imm.has_value());
  EXPECT_EQ(*got.imm, 42u);
  EXPECT_EQ(got.byte_len, 512u);
  EXPECT_EQ(std::memcmp(buf_a_.data(), buf_b_.data(), 512), 0);
}

TEST_F(RcTest, Read) {
  auto p = pattern(kBufferSize, 5);
  std::memcpy(buf_b_.data(), p.data(), p.size());
  ASSERT_OK(qp_a_->post_send(SendRequest::read(mr_a_->slice(8, 3000), mr_b_->remote(16, 3000)).id(WrId{Op::kRead})));
  ASSERT_OK_AND_ASSIGN(Completion c, cq_a_->wait_ok(kWait));
  EXPECT_EQ(c.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(c.byte_len, 3000u);
  EXPECT_EQ(std::memcmp(buf_a_.data() + 8, buf_b_.data() + 16, 3000), 0);
}

TEST_F(RcTest, CompareAndSwapAndFetchAndAdd) {
  std::uint64_t initial = 1000;
  std::memcpy(buf_b_.data() + 64, &initial, 8);
  RemoteBuffer counter = mr_b_->remote(64, 8);
  LocalSlice old_value = mr_a_->slice(0, 8);

  // CAS with the wrong expected value leaves the counter alone and returns it.
  ASSERT_OK(qp_a_->post_send(SendRequest::compare_and_swap(old_value, counter, 1, 5)));
  ASSERT_OK_AND_ASSIGN(Completion c1, cq_a_->wait_ok(kWait));
  EXPECT_EQ(c1.opcode, IBV_WC_COMP_SWAP);
  std::uint64_t seen = 0, now = 0;
  std::memcpy(&seen, buf_a_.data(), 8);
  std::memcpy(&now, buf_b_.data() + 64, 8);
  EXPECT_EQ(seen, 1000u);
  EXPECT_EQ(now, 1000u);

  ASSERT_OK(qp_a_->post_send(SendRequest::compare_and_swap(old_value, counter, 1000, 2000)));
  ASSERT_OK(cq_a_->wait_ok(kWait));
  std::memcpy(&seen, buf_a_.data(), 8);
  std::memcpy(&now, buf_b_.data() + 64, 8);
  EXPECT_EQ(seen, 1000u);
  EXPECT_EQ(now, 2000u);

  ASSERT_OK(qp_a_->post_send(SendRequest::fetch_and_add(old_value, counter, 7)));
  ASSERT_OK_AND_ASSIGN(Completion c3, cq_a_->wait_ok(kWait));
  EXPECT_EQ(c3.opcode, IBV_WC_FETCH_ADD);
  std::memcpy(&seen, buf_a_.data(), 8);
  std::memcpy(&now, buf_b_.data() + 64, 8);
  EXPECT_EQ(seen, 2000u);
  EXPECT_EQ(now, 2007u);
}

TEST_F(RcTest, GatherWriteOfThreeSlices) {
  fill_a(6);
  std::vector<LocalSlice> slices = {mr_a_->slice(0, 100), mr_a_->slice(1000, 200), mr_a_->slice(3000, 300)};
  ASSERT_OK(qp_a_->post_send(SendRequest::write(slices, mr_b_->remote(0, 600))));
  ASSERT_OK(cq_a_->wait_ok(kWait));
  EXPECT_EQ(std::memcmp(buf_b_.data(), buf_a_.data(), 100), 0);
  EXPECT_EQ(std::memcmp(buf_b_.data() + 100, buf_a_.data() + 1000, 200), 0);
  EXPECT_EQ(std::memcmp(buf_b_.data() + 300, buf_a_.data() + 3000, 300), 0);
}

TEST_F(RcTest, ScatterReceiveAndChainedPosts) {
  fill_a(7);
  // Two receives posted as one chain, each scattering into two slices.
  std::array<RecvRequest, 2> recvs = {RecvRequest({mr_b_->slice(0, 10), mr_b_->slice(100, 90)}, WrId{1}),
                                      RecvRequest({mr_b_->slice(200, 50), mr_b_->slice(300, 50)}, WrId{2})};
  ASSERT_OK(qp_b_->post_recv(recvs));
  std::array<SendRequest, 2> sends = {SendRequest::send(mr_a_->slice(0, 100)).id(WrId{11}),
                                      SendRequest::send(mr_a_->slice(100, 100)).id(WrId{12})};
  ASSERT_OK(qp_a_->post_send(sends));
  ASSERT_OK_AND_ASSIGN(auto sent, cq_a_->wait_n(2, kWait));
  EXPECT_EQ(sent[0].wr_id, WrId{11});
  EXPECT_EQ(sent[1].wr_id, WrId{12});
  ASSERT_OK_AND_ASSIGN(auto got, cq_b_->wait_n(2, kWait));
  EXPECT_EQ(got[0].wr_id, WrId{1});
  EXPECT_EQ(got[1].wr_id, WrId{2});
  EXPECT_EQ(std::memcmp(buf_b_.data(), buf_a_.data(), 10), 0);
  EXPECT_EQ(std::memcmp(buf_b_.data() + 100, buf_a_.data() + 10, 90), 0);
  EXPECT_EQ(std::memcmp(buf_b_.data() + 200, buf_a_.data() + 100, 50), 0);
  EXPECT_EQ(std::memcmp(buf_b_.data() + 300, buf_a_.data() + 150, 50), 0);
}

TEST_F(RcTest, BadRkeyIsARemoteAccessErrorCompletion) {
  RemoteBuffer bogus = mr_b_->remote(0, 64);
  bogus.rkey ^= 0x5A5A00;
  ASSERT_OK(qp_a_->post_send(SendRequest::write(mr_a_->slice(0, 64), bogus).id(WrId{99})));
  ASSERT_OK_AND_ASSIGN(Completion c, cq_a_->wait(kWait));
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.status, IBV_WC_REM_ACCESS_ERR) << to_string(c.status);
  EXPECT_EQ(c.wr_id, WrId{99});
  Status as_status = c.to_status();
  ASSERT_FALSE(as_status.ok());
  EXPECT_EQ(as_status.error().wc_status(), IBV_WC_REM_ACCESS_ERR);
  EXPECT_NE(as_status.error().message().find("remote access error"), std::string::npos) << as_status.error().message();
  // The QP is in the error state now; the next request is flushed.
  ASSERT_OK(qp_a_->post_send(SendRequest::write(mr_a_->slice(0, 8), mr_b_->remote(0, 8)).id(WrId{100})));
  auto flushed = cq_a_->wait_ok(kWait);
  ASSERT_FALSE(flushed.ok());
  EXPECT_EQ(flushed.error().wc_status(), IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(flushed.error().errnum(), EIO);
}

TEST_F(RcTest, InvalidRequestsAreRefusedWhenPosted) {
  // An atomic needs an 8-byte result slice.
  Status s = qp_a_->post_send(SendRequest::fetch_and_add(mr_a_->slice(0, 4), mr_b_->remote(0, 8), 1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().errnum(), EINVAL);
  // A WRITE longer than the RemoteBuffer it targets.
  s = qp_a_->post_send(SendRequest::write(mr_a_->slice(0, 100), mr_b_->remote(0, 50)));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().errnum(), EINVAL);
  // More slices than kMaxSge.
  std::vector<LocalSlice> many(kMaxSge + 1, mr_a_->slice(0, 1));
  s = qp_a_->post_send(SendRequest::send(many));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().errnum(), EINVAL);
  // More slices than the QP's max_send_sge (4): the verb itself refuses.
  std::vector<LocalSlice> five(5, mr_a_->slice(0, 1));
  s = qp_a_->post_send(SendRequest::send(five));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().errnum(), EINVAL) << s.error().message();
  // Nothing was posted, so nothing completes.
  ASSERT_OK_AND_ASSIGN(auto none, cq_a_->poll_one());
  EXPECT_FALSE(none.has_value());
}

TEST_F(RcTest, QpStatesStepByStep) {
  ASSERT_OK_AND_ASSIGN(ibv_qp_state state, qp_a_->state());
  EXPECT_EQ(state, IBV_QPS_RTS);
  ASSERT_OK_AND_ASSIGN(QueuePair c, QueuePair::create(*pd_, QpType::kRc, *cq_a_, *cq_a_));
  ASSERT_OK_AND_ASSIGN(state, c.state());
  EXPECT_EQ(state, IBV_QPS_RESET);
  ASSERT_OK_AND_ASSIGN(QpEndpoint b, qp_b_->local_endpoint());
  // RTR before INIT is refused with an errno.
  Status early = c.to_rtr(b);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.error().errnum(), EINVAL) << early.error().message();
  ASSERT_OK(c.to_init());
  ASSERT_OK(c.to_rtr(b));
  ASSERT_OK_AND_ASSIGN(state, c.state());
  EXPECT_EQ(state, IBV_QPS_RTR);
  ASSERT_OK(c.to_rts());
  ASSERT_OK_AND_ASSIGN(state, c.state());
  EXPECT_EQ(state, IBV_QPS_RTS);
  ASSERT_OK(c.to_error());
  ASSERT_OK_AND_ASSIGN(state, c.state());
  EXPECT_EQ(state, IBV_QPS_ERR);
}

}  // namespace
}  // namespace uroce::test
