// Completion queue ring and completion channel: order, overflow, arming and
// events (one per arm; solicited-only arms fire on solicited or error
// completions; the channel fd becomes readable); pop() and timestamps.
#include "core/cq.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <vector>

#include "core/comp_channel.h"
#include "core/limits.h"

namespace uroce::core {
namespace {

ibv_wc wc(uint64_t id, ibv_wc_status st = IBV_WC_SUCCESS, uint32_t qpn = 7) {
  ibv_wc w{};
  w.wr_id = id;
  w.status = st;
  w.qp_num = qpn;
  w.opcode = IBV_WC_RECV;
  return w;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

struct ChannelDeleter {
  void operator()(CompChannel* c) const { delete c; }
};

// Push 1..5 / Expect poll to return them in order, in pieces.
TEST(Cq, PushPollOrder) {
  Cq cq(nullptr, 8, nullptr, nullptr);
  EXPECT_EQ(cq.capacity(), 8u);
  ibv_wc out[8];
  EXPECT_EQ(cq.poll(8, out), 0);
  for (uint64_t i = 1; i <= 5; ++i) EXPECT_TRUE(cq.push(wc(i), false));
  EXPECT_EQ(cq.poll(2, out), 2);
  EXPECT_EQ(out[0].wr_id, 1u);
  EXPECT_EQ(out[1].wr_id, 2u);
  EXPECT_EQ(cq.poll(8, out), 3);
  EXPECT_EQ(out[0].wr_id, 3u);
  EXPECT_EQ(out[2].wr_id, 5u);
  EXPECT_EQ(cq.poll(8, out), 0);
  EXPECT_EQ(cq.poll(0, out), 0);
  EXPECT_EQ(cq.poll(-1, out), 0);
}

// Push/poll across the ring's end many times / Expect FIFO order throughout.
TEST(Cq, WrapsAround) {
  Cq cq(nullptr, 3, nullptr, nullptr);
  uint64_t next_push = 0, next_poll = 0;
  ibv_wc out[3];
  for (int round = 0; round < 20; ++round) {
    while (cq.push(wc(next_push), false)) ++next_push;
    int n = cq.poll(1 + round % 3, out);
    for (int i = 0; i < n; ++i) EXPECT_EQ(out[i].wr_id, next_poll++);
  }
  int n;
  while ((n = cq.poll(3, out)) > 0)
    for (int i = 0; i < n; ++i) EXPECT_EQ(out[i].wr_id, next_poll++);
  EXPECT_EQ(next_poll, next_push);
}

// Push into a full CQ / Expect false, the overrun counted, the queue unchanged.
TEST(Cq, OverflowReturnsFalseAndCounts) {
  Cq cq(nullptr, 2, nullptr, nullptr);
  EXPECT_TRUE(cq.push(wc(1), false));
  EXPECT_TRUE(cq.push(wc(2), false));
  EXPECT_EQ(cq.overruns(), 0u);
  EXPECT_FALSE(cq.push(wc(3), false));
  EXPECT_FALSE(cq.push(wc(4), true));
  EXPECT_EQ(cq.overruns(), 2u);
  ibv_wc out[4];
  ASSERT_EQ(cq.poll(4, out), 2);
  EXPECT_EQ(out[0].wr_id, 1u);
  EXPECT_EQ(out[1].wr_id, 2u);
  EXPECT_TRUE(cq.push(wc(5), false));
}

// Expect completions in order across the ring's wrap, and a ring that empties
// to start again at its first entry (it commits only what it held at once).
TEST(Cq, WrapsInOrderAndRestartsWhenEmpty) {
  Cq cq(nullptr, 3, nullptr, nullptr);
  ibv_wc out[4];
  ASSERT_TRUE(cq.push(wc(1), false) && cq.push(wc(2), false));
  ASSERT_EQ(cq.poll(1, out), 1);
  ASSERT_TRUE(cq.push(wc(3), false) && cq.push(wc(4), false));  // 4 goes to entry 0
  EXPECT_FALSE(cq.push(wc(5), false));                          // full: 2, 3, 4
  ASSERT_EQ(cq.poll(4, out), 3);
  EXPECT_EQ(out[0].wr_id, 2u);
  EXPECT_EQ(out[1].wr_id, 3u);
  EXPECT_EQ(out[2].wr_id, 4u);
  ASSERT_TRUE(cq.push(wc(6), false) && cq.push(wc(7), false) && cq.push(wc(8), false));
  ASSERT_EQ(cq.poll(4, out), 3);
  EXPECT_EQ(out[0].wr_id, 6u);
  EXPECT_EQ(out[2].wr_id, 8u);
}

// Expect a CQ of max_cqe entries (mlx5's 4194303: 256 MiB of entries) to be
// created at once and to work: its ring is committed only as it fills.
TEST(Cq, MaxSizeRing) {
  Cq cq(nullptr, kMaxCqe, nullptr, nullptr);
  EXPECT_EQ(cq.capacity(), kMaxCqe);
  ASSERT_TRUE(cq.push(wc(9), false));
  ibv_wc out[1];
  ASSERT_EQ(cq.poll(1, out), 1);
  EXPECT_EQ(out[0].wr_id, 9u);
}

class CqChannel : public ::testing::Test {
 protected:
  void SetUp() override {
    ch.reset(CompChannel::create(nullptr));
    ASSERT_NE(ch, nullptr);
    fcntl(ch->ibch.fd, F_SETFL, fcntl(ch->ibch.fd, F_GETFL) | O_NONBLOCK);
    cq = std::make_unique<Cq>(nullptr, 16, ch.get(), this);
  }
  int events() {
    int n = 0;
    while (readable(ch->ibch.fd)) {
      auto r = ch->get_event();
      if (!r.ok()) break;
      EXPECT_EQ(*r, cq.get());
      ++n;
    }
    return n;
  }
  std::unique_ptr<CompChannel, ChannelDeleter> ch;
  std::unique_ptr<Cq> cq;
};

// Arms counted in the context's count (Context::armed_cqs) / Expect one per
// armed CQ however often it is re-armed, none once its event is raised or it
// is destroyed, and none for a CQ without a channel (no thread can wait).
TEST_F(CqChannel, ArmedCqsAreCountedUntilTheirEvent) {
  std::atomic<int> armed{0};
  cq->count_arms_in(&armed);
  cq->arm(true);
  cq->arm(false);  // a stronger arm of the same CQ
  EXPECT_EQ(armed.load(), 1);
  cq->push(wc(1), false);
  EXPECT_EQ(armed.load(), 0);
  EXPECT_EQ(events(), 1);
  cq->arm(false);
  EXPECT_EQ(armed.load(), 1);
  cq.reset();  // destroyed while armed
  EXPECT_EQ(armed.load(), 0);
  Cq plain(nullptr, 4, nullptr, nullptr);
  plain.count_arms_in(&armed);
  plain.arm(false);
  EXPECT_EQ(armed.load(), 0);
}

// The spin before a blocking ibv_get_cq_event (CompChannel::spin_hint) / Expect
// it on at first and while spins find their event, off after one that did not,
// back on after a wait without a spin shorter than twice the spin, and off
// while such waits are longer (an idle channel spins no more).
TEST_F(CqChannel, SpinHintFollowsHowSoonEventsCome) {
  using std::chrono::microseconds;
  EXPECT_TRUE(ch->spin_hint());
  ch->note_spin(true);
  EXPECT_TRUE(ch->spin_hint());
  ch->note_spin(false);
  EXPECT_FALSE(ch->spin_hint());
  ch->note_wait(microseconds(300), microseconds(50));
  EXPECT_FALSE(ch->spin_hint());
  ch->note_wait(microseconds(90), microseconds(50));
  EXPECT_TRUE(ch->spin_hint());
}

// An event queued / Expect has_event until it is taken, and not for a
// destroyed CQ's events (forget).
TEST_F(CqChannel, HasEventCountsQueuedEvents) {
  EXPECT_FALSE(ch->has_event());
  cq->arm(false);
  cq->push(wc(1), false);
  EXPECT_TRUE(ch->has_event());
  EXPECT_EQ(events(), 1);
  EXPECT_FALSE(ch->has_event());
  cq->arm(false);
  cq->push(wc(2), false);
  ch->forget(cq.get());
  EXPECT_FALSE(ch->has_event());
}

// No arm / Expect no event.
TEST_F(CqChannel, UnarmedCqRaisesNothing) {
  EXPECT_EQ(cq->ibcq.channel, &ch->ibch);
  cq->push(wc(1), true);
  EXPECT_FALSE(readable(ch->ibch.fd));
  auto r = ch->get_event();  // non-blocking fd, nothing queued
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.err(), EAGAIN);
}

// Arm (next) then push / Expect the fd readable and get_event returning the CQ,
// once.
TEST_F(CqChannel, ArmNextFiresOncePerArm) {
  EXPECT_EQ(cq->arm(false), 0);
  EXPECT_FALSE(readable(ch->ibch.fd));
  cq->push(wc(1), false);
  ASSERT_TRUE(readable(ch->ibch.fd));
  auto r = ch->get_event();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, cq.get());
  EXPECT_EQ((*r)->ibcq.cq_context, this);
  EXPECT_FALSE(readable(ch->ibch.fd));
  cq->push(wc(2), false);  // not re-armed: no event
  EXPECT_EQ(events(), 0);
  cq->arm(false);
  cq->push(wc(3), false);
  cq->push(wc(4), true);
  EXPECT_EQ(events(), 1);
}

// Solicited-only arm / Expect unsolicited successes to be ignored, a solicited
// completion to fire once.
TEST_F(CqChannel, SolicitedArmFiresOnSolicited) {
  cq->arm(true);
  cq->push(wc(1), false);
  cq->push(wc(2), false);
  EXPECT_EQ(events(), 0);
  cq->push(wc(3), true);
  EXPECT_EQ(events(), 1);
  cq->push(wc(4), true);  // one event per arm
  EXPECT_EQ(events(), 0);
}

// Solicited-only arm / Expect an error completion to fire it (errors always
// notify).
TEST_F(CqChannel, SolicitedArmFiresOnError) {
  cq->arm(true);
  cq->push(wc(1, IBV_WC_SUCCESS), false);
  EXPECT_EQ(events(), 0);
  cq->push(wc(2, IBV_WC_WR_FLUSH_ERR), false);
  EXPECT_EQ(events(), 1);
}

// Arm next then solicited-only / Expect the stronger arm to stay (any
// completion fires).
TEST_F(CqChannel, SolicitedArmDoesNotWeakenNextArm) {
  cq->arm(false);
  cq->arm(true);
  cq->push(wc(1), false);
  EXPECT_EQ(events(), 1);
  // Solicited then next: upgraded to next.
  cq->arm(true);
  cq->arm(false);
  cq->push(wc(2), false);
  EXPECT_EQ(events(), 1);
}

// Two CQs on one channel / Expect events in the order they were raised.
TEST_F(CqChannel, TwoCqsOneChannel) {
  Cq other(nullptr, 4, ch.get(), nullptr);
  other.arm(false);
  cq->arm(false);
  other.push(wc(1), false);
  cq->push(wc(2), false);
  auto a = ch->get_event();
  auto b = ch->get_event();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, &other);
  EXPECT_EQ(*b, cq.get());
  // forget() drops queued events of a CQ being destroyed.
  other.arm(false);
  other.push(wc(3), false);
  ch->forget(&other);
  auto c = ch->get_event();  // the byte is there, the event is not
  EXPECT_FALSE(c.ok());
}

// A full CQ / Expect no event for the lost completion.
TEST_F(CqChannel, OverrunRaisesNoEvent) {
  Cq small(nullptr, 1, ch.get(), nullptr);
  small.push(wc(1), false);
  small.arm(false);
  EXPECT_FALSE(small.push(wc(2), false));
  EXPECT_FALSE(readable(ch->ibch.fd));
}

// pop() (the extended polling API's consumer) / Expect FIFO order shared with
// poll(), no timestamps unless asked, then non-decreasing non-zero ones.
TEST(Cq, PopAndTimestamps) {
  Cq cq(nullptr, 4, nullptr, nullptr);
  CqEntry e;
  EXPECT_TRUE(cq.empty());
  EXPECT_FALSE(cq.pop(&e));
  cq.push(wc(1), false);
  ASSERT_TRUE(cq.pop(&e));
  EXPECT_EQ(e.wc.wr_id, 1u);
  EXPECT_EQ(e.timestamp_ns, 0u);
  EXPECT_EQ(e.wallclock_ns, 0u);

  cq.record_timestamps(true, true);
  for (uint64_t i = 2; i <= 4; ++i) cq.push(wc(i), false);
  ibv_wc out[1];
  EXPECT_EQ(cq.poll(1, out), 1);
  EXPECT_EQ(out[0].wr_id, 2u);
  uint64_t last = 0;
  for (uint64_t i = 3; i <= 4; ++i) {
    ASSERT_TRUE(cq.pop(&e));
    EXPECT_EQ(e.wc.wr_id, i);
    EXPECT_NE(e.timestamp_ns, 0u);
    EXPECT_GE(e.timestamp_ns, last);
    EXPECT_NE(e.wallclock_ns, 0u);
    last = e.timestamp_ns;
  }
  EXPECT_TRUE(cq.empty());
}

}  // namespace
}  // namespace uroce::core
