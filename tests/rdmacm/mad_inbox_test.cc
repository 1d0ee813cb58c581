// The order in which the CM takes the MADs an engine hands it over QP1
// (rdmacm/mad_inbox.h): a MAD handled in place never overtakes one that
// waits for the progress thread.
#include "rdmacm/mad_inbox.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "rdmacm/cm_messages.h"

namespace uroce::rdmacm {
namespace {

constexpr uint32_t kPassiveCommId = 0x01BBDCD7;
constexpr uint32_t kActiveCommId = 0x02CF02A9;

engine::GsiMad gsi_mad(const CmMessage& m) {
  engine::GsiMad g;
  Mad mad = encode_mad(7, m);
  std::memcpy(g.mad.data(), mad.data(), mad.size());
  return g;
}

engine::GsiMad rtu(uint32_t passive = kPassiveCommId, uint32_t active = kActiveCommId) {
  RtuMessage m;
  m.local_comm_id = active;
  m.remote_comm_id = passive;
  return gsi_mad(m);
}

engine::GsiMad dreq(uint32_t passive = kPassiveCommId, uint32_t active = kActiveCommId) {
  DreqMessage m;
  m.local_comm_id = active;
  m.remote_comm_id = passive;
  return gsi_mad(m);
}

// The passive side of connections in REP Sent, as the CM sees their RTU and
// DREQ: the events the application gets, in order.
class PassiveSide {
 public:
  void take(const engine::GsiMad& g) {
    auto d = decode_mad(g.mad);
    ASSERT_TRUE(d.has_value());
    if (auto* r = std::get_if<RtuMessage>(&d->message)) {
      if (state_[r->remote_comm_id] == State::kRepSent) state_[r->remote_comm_id] = State::kEstablished;
    } else if (auto* q = std::get_if<DreqMessage>(&d->message)) {
      // What the CM reports: DISCONNECTED, after ESTABLISHED only if the RTU came first.
      State& s = state_[q->remote_comm_id];
      s = s == State::kEstablished ? State::kDisconnected : State::kDisconnectedUnestablished;
    }
  }
  bool disconnected_after_established(uint32_t comm_id) { return state_[comm_id] == State::kDisconnected; }

 private:
  enum class State { kRepSent, kEstablished, kDisconnected, kDisconnectedUnestablished };
  std::unordered_map<uint32_t, State> state_;
};

TEST(MadInbox, HandledInPlaceWhenTheCmIsFree) {
  std::mutex cm_mu;
  MadInbox inbox(4);
  int handled = 0;
  auto in_place = [&](const engine::GsiMad&) { return ++handled, true; };
  EXPECT_EQ(inbox.offer(cm_mu, rtu(), in_place), MadInbox::Offer::kHandled);
  EXPECT_EQ(handled, 1);
  // What the in-place handler declines goes to the progress thread.
  EXPECT_EQ(inbox.offer(cm_mu, rtu(), [](const engine::GsiMad&) { return false; }), MadInbox::Offer::kQueued);
  std::vector<engine::GsiMad> out;
  inbox.take(out);
  EXPECT_EQ(out.size(), 1u);
}

// The race of rdmacm.cycles_1000 over QP1 under load: the RTU comes while
// the CM is busy and waits for the progress thread; the DREQ right behind
// it finds the CM free. It must wait behind the RTU, or the passive side
// reports DISCONNECTED without ESTABLISHED.
TEST(MadInbox, AMadNeverOvertakesOneWaiting) {
  std::mutex cm_mu;
  MadInbox inbox(4);
  PassiveSide cm;
  auto in_place = [&](const engine::GsiMad& g) { return cm.take(g), true; };
  cm_mu.lock();  // the progress thread is busy
  EXPECT_EQ(inbox.offer(cm_mu, rtu(), in_place), MadInbox::Offer::kQueued);
  cm_mu.unlock();
  EXPECT_EQ(inbox.offer(cm_mu, dreq(), in_place), MadInbox::Offer::kQueued);
  std::vector<engine::GsiMad> out;
  {
    std::lock_guard lock(cm_mu);
    inbox.take(out);
    for (const engine::GsiMad& g : out) cm.take(g);
  }
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(cm.disconnected_after_established(kPassiveCommId));
  // Once the queue is empty, MADs are handled in place again.
  EXPECT_EQ(inbox.offer(cm_mu, rtu(3), in_place), MadInbox::Offer::kHandled);
}

TEST(MadInbox, DropsWhenFull) {
  std::mutex cm_mu;
  MadInbox inbox(2);
  std::lock_guard lock(cm_mu);
  auto in_place = [](const engine::GsiMad&) { return true; };
  EXPECT_EQ(inbox.offer(cm_mu, rtu(), in_place), MadInbox::Offer::kQueued);
  EXPECT_EQ(inbox.offer(cm_mu, dreq(), in_place), MadInbox::Offer::kQueued);
  EXPECT_EQ(inbox.offer(cm_mu, dreq(), in_place), MadInbox::Offer::kDropped);
}

// An engine's thread hands over RTU then DREQ of many connections while a
// progress thread, taking the CM's mutex now and then, drains the queue:
// every connection is established before it is disconnected.
TEST(MadInbox, OrderUnderContention) {
  constexpr uint32_t kConnections = 20000;
  std::mutex cm_mu;
  MadInbox inbox(kConnections * 2);
  PassiveSide cm;  // touched only with cm_mu held
  auto in_place = [&](const engine::GsiMad& g) { return cm.take(g), true; };
  std::atomic<bool> done{false};
  std::thread progress([&] {
    std::vector<engine::GsiMad> out;
    while (!done.load()) {
      std::lock_guard lock(cm_mu);
      inbox.take(out);
      for (const engine::GsiMad& g : out) cm.take(g);
      out.clear();
    }
  });
  for (uint32_t c = 1; c <= kConnections; ++c) {
    (void)inbox.offer(cm_mu, rtu(c), in_place);
    (void)inbox.offer(cm_mu, dreq(c), in_place);
  }
  done = true;
  progress.join();
  std::vector<engine::GsiMad> out;
  inbox.take(out);
  for (const engine::GsiMad& g : out) cm.take(g);
  uint32_t out_of_order = 0;
  for (uint32_t c = 1; c <= kConnections; ++c) out_of_order += !cm.disconnected_after_established(c);
  EXPECT_EQ(out_of_order, 0u);
}

}  // namespace
}  // namespace uroce::rdmacm
