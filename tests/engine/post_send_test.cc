// The one post path (engine/post_send.h) that ibv_post_send (PostMode::kEach)
// and ibv_wr_complete (PostMode::kAllOrNothing) share: the same refusals, the
// same poller hint, and the two ways a refused WR ends a chain.
#include "engine/post_send.h"

#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

constexpr PostMode kModes[] = {PostMode::kEach, PostMode::kAllOrNothing};

class PostSend : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    bring_up();
    mr = reg(buf, IBV_ACCESS_LOCAL_WRITE);
    s = sge(buf.data(), 64, mr);
  }
  // A signaled SEND of 64 bytes of buf.
  ibv_send_wr send_wr(uint64_t wr_id) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &s;
    wr.num_sge = 1;
    return wr;
  }
  uint32_t posted() {
    std::lock_guard lock(qp->mu);
    return qp->sq.posted;
  }

  std::vector<uint8_t> buf = std::vector<uint8_t>(4096, 0x5a);
  core::Mr* mr = nullptr;
  ibv_sge s{};
};

// Post a SEND in either mode / Expect the engine told that an application
// thread is in a verb (EngineContext::note_poller: the progress thread then
// leaves the receiving to it). ibv_wr_complete did not before the two paths
// were one.
TEST_F(PostSend, BothModesNoteThePoller) {
  for (PostMode mode : kModes) {
    engine->poller_leaves();
    Clock::time_point before = Clock::now();  // a stamp from the post is not older
    ASSERT_FALSE(engine->poller_active(before));
    ibv_send_wr wr = send_wr(1);
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(engine::post_send(*qp, &wr, &bad, mode), 0);
    EXPECT_TRUE(engine->poller_active(before)) << int(mode);
  }
}

// A chain SEND, atomic of 64 bytes (refused: atomics move 8, IBA 9.4.5) /
// Expect EINVAL and bad_wr at the atomic; ibv_post_send keeps the SEND
// posted, ibv_wr_complete takes it back.
TEST_F(PostSend, RefusedWrEndsTheChain) {
  for (PostMode mode : kModes) {
    ibv_send_wr first = send_wr(1), second = send_wr(2);
    second.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    first.next = &second;
    ibv_send_wr* bad = nullptr;
    uint32_t before = posted();
    EXPECT_EQ(engine::post_send(*qp, &first, &bad, mode), EINVAL);
    EXPECT_EQ(bad, &second);
    EXPECT_EQ(posted() - before, mode == PostMode::kEach ? 1u : 0u) << int(mode);
  }
}

class PostSendXrcTarget : public PostSend {
 protected:
  PostSendXrcTarget() { qp_type = IBV_QPT_XRC_RECV; }
};

// An XRC target QP in RTS / Expect both modes to refuse a SEND with EINVAL
// (it has no send queue), bad_wr at it, nothing queued.
TEST_F(PostSendXrcTarget, RefusedInBothModes) {
  ASSERT_EQ(qp->state(), IBV_QPS_RTS);
  for (PostMode mode : kModes) {
    ibv_send_wr wr = send_wr(1);
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(engine::post_send(*qp, &wr, &bad, mode), EINVAL) << int(mode);
    EXPECT_EQ(bad, &wr);
    EXPECT_EQ(posted(), 0u);
  }
}

}  // namespace
}  // namespace uroce::engine::test
