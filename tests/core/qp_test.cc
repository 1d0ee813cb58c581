// core::Qp: value checks of apply_modify (on top of the mask rules) and the
// validation of work requests by enqueue_send / enqueue_recv.
#include "core/qp.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "core/context.h"
#include "core/cq.h"
#include "core/device.h"
#include "core/limits.h"
#include "core/pd.h"

namespace uroce::core {
namespace {

ibv_gid mapped(uint32_t ip) { return ipv4_to_gid(ip); }

class QpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx = std::make_unique<Context>(devices()[0]);
    ASSERT_GE(ctx->gid_count(), 1u);
    pd.ctx = ctx.get();
    pd.ibpd.context = ctx->ib();
    cq = std::make_unique<Cq>(ctx->ib(), 16, nullptr, nullptr);
  }

  std::unique_ptr<Qp> make(ibv_qp_type type, QpCaps caps = {4, 4, 2, 2, 64}) {
    return std::make_unique<Qp>(ctx.get(), &pd, cq.get(), cq.get(), type, caps, false, 0x123, nullptr);
  }

  static ibv_qp_attr init_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    a.qkey = 0x11111111;
    return a;
  }
  static constexpr int kInitMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;

  static ibv_qp_attr rtr_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = 0x456;
    a.rq_psn = 100;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = mapped(0x7F000001);
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.dlid = 5000;
    a.ah_attr.port_num = 1;
    return a;
  }
  static constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

  static ibv_qp_attr rts_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 200;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    return a;
  }
  static constexpr int kRtsMask =
      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;

  // Applies a modify holding the QP's mutex, as the verbs layer does.
  static int modify(Qp& qp, const ibv_qp_attr& a, int mask) {
    std::lock_guard lock(qp.mu);
    return qp.apply_modify(a, mask);
  }

  std::unique_ptr<Context> ctx;
  Pd pd;
  std::unique_ptr<Cq> cq;
};

// Expect the good path RESET→INIT→RTR→RTS to succeed and store the attributes.
TEST_F(QpTest, RcGoodPathStoresAttributes) {
  auto qp = make(IBV_QPT_RC);
  EXPECT_EQ(qp->state(), IBV_QPS_RESET);
  ASSERT_EQ(modify(*qp, init_attr(), kInitMask), 0);
  EXPECT_EQ(qp->state(), IBV_QPS_INIT);
  EXPECT_EQ(qp->ibqp.qp_base.state, IBV_QPS_INIT);
  ibv_qp_attr rtr = rtr_attr();
  rtr.rq_psn = 0x12345678;  // masked to 24 bits
  ASSERT_EQ(modify(*qp, rtr, kRtrMask), 0);
  EXPECT_EQ(qp->attr.rq_psn, 0x345678u);
  EXPECT_EQ(qp->attr.dest_qp_num, 0x456u);
  EXPECT_EQ(qp->attr.path_mtu, IBV_MTU_1024);
  ibv_qp_attr rts = rts_attr();
  rts.sq_psn = 0xFF000001;
  ASSERT_EQ(modify(*qp, rts, kRtsMask), 0);
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
  EXPECT_EQ(qp->attr.sq_psn, 1u);
  EXPECT_EQ(qp->attr.timeout, 14);
  ibv_qp_attr q;
  ibv_qp_init_attr init;
  qp->query(&q, &init);
  EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(init.qp_type, IBV_QPT_RC);
  EXPECT_EQ(init.cap.max_send_sge, 2u);
}

// Expect port ≠ 1 and pkey_index ≠ 0 to be EINVAL, with the state unchanged.
TEST_F(QpTest, BadPortAndPkeyIndex) {
  auto qp = make(IBV_QPT_RC);
  ibv_qp_attr a = init_attr();
  a.port_num = 2;
  EXPECT_EQ(modify(*qp, a, kInitMask), EINVAL);
  a.port_num = 0;
  EXPECT_EQ(modify(*qp, a, kInitMask), EINVAL);
  a = init_attr();
  a.pkey_index = 1;
  EXPECT_EQ(modify(*qp, a, kInitMask), EINVAL);
  EXPECT_EQ(qp->state(), IBV_QPS_RESET);
  a = init_attr();
  a.qp_access_flags = 1u << 30;  // no access flag at all
  EXPECT_EQ(modify(*qp, a, kInitMask), EINVAL);
  EXPECT_EQ(qp->state(), IBV_QPS_RESET);
}

// Expect the memory-registration access flags that mean nothing for a QP (ON_DEMAND,
// MW_BIND, ZERO_BASED) to be accepted, as rxe and mlx5 accept them (pyverbs' ODP tests
// pass an MR's access flags to the QP).
TEST_F(QpTest, RegistrationOnlyAccessFlagsAccepted) {
  auto qp = make(IBV_QPT_RC);
  ibv_qp_attr a = init_attr();
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ON_DEMAND | IBV_ACCESS_MW_BIND |
                      IBV_ACCESS_ZERO_BASED;
  EXPECT_EQ(modify(*qp, a, kInitMask), 0);
  EXPECT_EQ(qp->state(), IBV_QPS_INIT);
}

// Expect AV errors (no GRH, sgid_index out of range, an IPv6 GID from an IPv4 GID, bad
// AV port) and a bad path MTU to be EINVAL at INIT→RTR.
TEST_F(QpTest, BadAddressVector) {
  auto qp = make(IBV_QPT_RC);
  ASSERT_EQ(modify(*qp, init_attr(), kInitMask), 0);
  ibv_qp_attr a = rtr_attr();
  a.ah_attr.is_global = 0;
  EXPECT_EQ(modify(*qp, a, kRtrMask), EINVAL);
  a = rtr_attr();
  a.ah_attr.grh.sgid_index = uint8_t(ctx->gid_count());
  EXPECT_EQ(modify(*qp, a, kRtrMask), EINVAL);
  a = rtr_attr();
  a.ah_attr.grh.sgid_index = 255;
  EXPECT_EQ(modify(*qp, a, kRtrMask), EINVAL);
  a = rtr_attr();
  std::memset(a.ah_attr.grh.dgid.raw, 0, 16);
  a.ah_attr.grh.dgid.raw[0] = 0xFE;
  a.ah_attr.grh.dgid.raw[1] = 0x80;
  EXPECT_EQ(modify(*qp, a, kRtrMask), EINVAL);
  a = rtr_attr();
  a.ah_attr.port_num = 2;
  EXPECT_EQ(modify(*qp, a, kRtrMask), EINVAL);
  a = rtr_attr();
  a.path_mtu = ibv_mtu(6);
  EXPECT_EQ(modify(*qp, a, kRtrMask), EINVAL);
  a.path_mtu = ibv_mtu(0);
  EXPECT_EQ(modify(*qp, a, kRtrMask), EINVAL);
  a = rtr_attr();
  a.max_dest_rd_atomic = 129;
  EXPECT_EQ(modify(*qp, a, kRtrMask), EINVAL);
  a = rtr_attr();
  a.min_rnr_timer = 32;
  EXPECT_EQ(modify(*qp, a, kRtrMask), EINVAL);
  a = rtr_attr();
  a.dest_qp_num = 0x1000000;
  EXPECT_EQ(modify(*qp, a, kRtrMask), EINVAL);
  EXPECT_EQ(qp->state(), IBV_QPS_INIT);
  a = rtr_attr();
  a.max_dest_rd_atomic = 128;
  EXPECT_EQ(modify(*qp, a, kRtrMask), 0);
}

// Expect timeout > 31, retry_cnt/rnr_retry > 7 and max_rd_atomic > 128 to be
// EINVAL at RTR→RTS.
TEST_F(QpTest, BadRtsValues) {
  auto qp = make(IBV_QPT_RC);
  ASSERT_EQ(modify(*qp, init_attr(), kInitMask), 0);
  ASSERT_EQ(modify(*qp, rtr_attr(), kRtrMask), 0);
  ibv_qp_attr a = rts_attr();
  a.timeout = 32;
  EXPECT_EQ(modify(*qp, a, kRtsMask), EINVAL);
  a = rts_attr();
  a.max_rd_atomic = 129;
  EXPECT_EQ(modify(*qp, a, kRtsMask), EINVAL);
  a = rts_attr();
  a.retry_cnt = 8;
  EXPECT_EQ(modify(*qp, a, kRtsMask), EINVAL);
  a = rts_attr();
  a.rnr_retry = 8;
  EXPECT_EQ(modify(*qp, a, kRtsMask), EINVAL);
  EXPECT_EQ(qp->state(), IBV_QPS_RTR);
  a = rts_attr();
  a.timeout = 31;
  a.max_rd_atomic = 128;
  EXPECT_EQ(modify(*qp, a, kRtsMask), 0);
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
}

// Expect CUR_STATE that does not match the QP's state to be EINVAL; matching
// passes.
TEST_F(QpTest, CurStateMustMatch) {
  auto qp = make(IBV_QPT_RC);
  ASSERT_EQ(modify(*qp, init_attr(), kInitMask), 0);
  ASSERT_EQ(modify(*qp, rtr_attr(), kRtrMask), 0);
  ibv_qp_attr a = rts_attr();
  a.cur_qp_state = IBV_QPS_INIT;
  EXPECT_EQ(modify(*qp, a, kRtsMask | IBV_QP_CUR_STATE), EINVAL);
  a.cur_qp_state = IBV_QPS_RTR;
  EXPECT_EQ(modify(*qp, a, kRtsMask | IBV_QP_CUR_STATE), 0);
}

// Expect mask errors to surface through apply_modify too (missing required bit,
// illegal transition), and IBV_QP_CAP to be refused.
TEST_F(QpTest, MaskErrorsThroughApplyModify) {
  auto qp = make(IBV_QPT_RC);
  EXPECT_EQ(modify(*qp, init_attr(), kInitMask & ~IBV_QP_ACCESS_FLAGS), EINVAL);
  EXPECT_EQ(modify(*qp, rtr_attr(), kRtrMask), EINVAL);  // RESET→RTR
  ASSERT_EQ(modify(*qp, init_attr(), kInitMask), 0);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  EXPECT_EQ(modify(*qp, a, IBV_QP_STATE), 0);
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  a.qp_state = IBV_QPS_RESET;
  EXPECT_EQ(modify(*qp, a, IBV_QP_STATE), 0);
  a = init_attr();
  EXPECT_EQ(modify(*qp, a, kInitMask), 0);
  a.cap.max_send_wr = 8;
  EXPECT_EQ(modify(*qp, a, IBV_QP_CAP), EINVAL);
}

// UD: RESET→INIT needs a Q_Key; a privileged Q_Key (bit 31) is EPERM (§2.5).
TEST_F(QpTest, UdQkey) {
  auto qp = make(IBV_QPT_UD);
  ibv_qp_attr a = init_attr();
  constexpr int kUdInit = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
  a.qkey = 0x80010000;
  EXPECT_EQ(modify(*qp, a, kUdInit), EPERM);
  a.qkey = 0x01234567;
  EXPECT_EQ(modify(*qp, a, kUdInit), 0);
  EXPECT_EQ(qp->attr.qkey, 0x01234567u);
}

// --- work requests
// ------------------------------------------------------------

class QpPostTest : public QpTest {
 protected:
  void SetUp() override {
    QpTest::SetUp();
    qp = make(IBV_QPT_RC);
  }
  int send(ibv_send_wr& wr) {
    std::lock_guard lock(qp->mu);
    return qp->enqueue_send(wr);
  }
  int recv(ibv_recv_wr& wr) {
    std::lock_guard lock(qp->mu);
    return qp->enqueue_recv(wr);
  }
  std::unique_ptr<Qp> qp;
  std::vector<uint8_t> buf = std::vector<uint8_t>(1024, 0xAB);
  ibv_sge sge[4] = {{reinterpret_cast<uint64_t>(buf.data()), 16, 1},
                    {reinterpret_cast<uint64_t>(buf.data()) + 16, 16, 1},
                    {reinterpret_cast<uint64_t>(buf.data()) + 32, 16, 1},
                    {reinterpret_cast<uint64_t>(buf.data()) + 48, 16, 1}};
};

// Expect num_sge above max_send_sge (and negative) to be EINVAL.
TEST_F(QpPostTest, SendNumSgeOverCap) {
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = sge;
  wr.num_sge = 3;
  EXPECT_EQ(send(wr), EINVAL);
  wr.num_sge = -1;
  EXPECT_EQ(send(wr), EINVAL);
  wr.num_sge = 2;
  EXPECT_EQ(send(wr), 0);
  EXPECT_EQ(qp->sq.posted, 1u);
}

// Expect the (max_send_wr+1)-th outstanding WR to be ENOMEM.
TEST_F(QpPostTest, SendQueueFull) {
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = sge;
  wr.num_sge = 1;
  for (uint32_t i = 0; i < qp->sq.capacity(); ++i) {
    wr.wr_id = i;
    ASSERT_EQ(send(wr), 0) << i;
  }
  EXPECT_EQ(qp->sq.capacity(), 4u);
  EXPECT_EQ(send(wr), ENOMEM);
  EXPECT_EQ(qp->sq.posted, 4u);
}

// Expect inline data above max_inline_data to be EINVAL; at the limit it is
// copied.
TEST_F(QpPostTest, InlineOverMax) {
  ibv_sge big[2] = {{reinterpret_cast<uint64_t>(buf.data()), 60, 0},
                    {reinterpret_cast<uint64_t>(buf.data()) + 60, 5, 0}};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_INLINE;
  wr.sg_list = big;
  wr.num_sge = 2;
  EXPECT_EQ(send(wr), EINVAL);  // 65 > 64
  big[1].length = 4;
  ASSERT_EQ(send(wr), 0);
  SendWqe& w = qp->sq.at(0);
  EXPECT_TRUE(w.is_inline);
  EXPECT_EQ(w.length, 64u);
  EXPECT_EQ(w.num_sge, 0);
  EXPECT_EQ(std::memcmp(qp->sq.inline_buf(0), buf.data(), 64), 0);
  // READ ignores the inline flag (nothing to send).
  ibv_send_wr rd{};
  rd.opcode = IBV_WR_RDMA_READ;
  rd.send_flags = IBV_SEND_INLINE;
  big[1].length = 5;
  rd.sg_list = big;
  rd.num_sge = 2;
  EXPECT_EQ(send(rd), 0);
  EXPECT_FALSE(qp->sq.at(1).is_inline);
}

// Expect the WQE to be a copy: the application's WR and SGEs may be reused.
TEST_F(QpPostTest, SendCopiesWr) {
  ibv_send_wr wr{};
  wr.wr_id = 77;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = sge;
  wr.num_sge = 2;
  wr.wr.rdma.remote_addr = 0x1000;
  wr.wr.rdma.rkey = 0x4242;
  ASSERT_EQ(send(wr), 0);
  sge[0].length = 999;
  SendWqe& w = qp->sq.at(0);
  EXPECT_EQ(w.wr_id, 77u);
  EXPECT_EQ(w.length, 32u);
  EXPECT_EQ(w.remote_addr, 0x1000u);
  EXPECT_EQ(w.rkey, 0x4242u);
  EXPECT_TRUE(w.signaled);
  EXPECT_EQ(qp->sq.sges(0)[0].length, 16u);
}

// Expect unsupported opcodes on RC to be refused (EOPNOTSUPP) without queuing.
TEST_F(QpPostTest, UnsupportedOpcode) {
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_BIND_MW;
  EXPECT_NE(send(wr), 0);
  EXPECT_EQ(qp->sq.posted, 0u);
}

// Expect receive num_sge over cap to be EINVAL, a full RQ ENOMEM.
TEST_F(QpPostTest, RecvBadArguments) {
  ibv_recv_wr wr{};
  wr.sg_list = sge;
  wr.num_sge = 3;
  EXPECT_EQ(recv(wr), EINVAL);
  wr.num_sge = -1;
  EXPECT_EQ(recv(wr), EINVAL);
  wr.num_sge = 2;
  for (uint32_t i = 0; i < qp->rq.capacity(); ++i) ASSERT_EQ(recv(wr), 0) << i;
  EXPECT_EQ(recv(wr), ENOMEM);
  EXPECT_EQ(qp->rq.size(), 4u);
  EXPECT_EQ(qp->rq.at(0).length, 32u);
}

// validate_qp_caps: limits and rounding.
TEST(QpCapsTest, Validate) {
  QpCaps out;
  ibv_qp_cap c{};
  c.max_send_wr = 5;
  c.max_recv_wr = 0;
  EXPECT_EQ(validate_qp_caps(IBV_QPT_RC, c, &out), 0);
  EXPECT_EQ(out.max_send_wr, 8u);
  EXPECT_EQ(out.max_recv_wr, 1u);
  EXPECT_EQ(out.max_inline_data, 64u);  // asked for none: uroce gives at least 64 bytes
  c.max_inline_data = 100;
  EXPECT_EQ(validate_qp_caps(IBV_QPT_RC, c, &out), 0);
  EXPECT_EQ(out.max_inline_data, 100u);
  c.max_send_sge = kMaxSge + 1;
  EXPECT_EQ(validate_qp_caps(IBV_QPT_RC, c, &out), EINVAL);
  c = ibv_qp_cap{};
  c.max_send_wr = kMaxQpWr + 1;
  EXPECT_EQ(validate_qp_caps(IBV_QPT_RC, c, &out), EINVAL);
  c = ibv_qp_cap{};
  c.max_inline_data = kMaxInlineData + 1;
  EXPECT_EQ(validate_qp_caps(IBV_QPT_RC, c, &out), EINVAL);
}

}  // namespace
}  // namespace uroce::core
