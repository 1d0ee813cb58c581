// The progress thread's loop and the receive turn (docs/architecture.md,
// "Threads": who receives, poller mode, ACKs that ride with the reply).
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "core/comp_channel.h"
#include "core/config.h"
#include "engine/engine_context.h"
#include "engine/progress_policy.h"
#include "engine/roles.h"
#include "engine/tx_batch.h"
#include "host/spin_advisor.h"

namespace uroce::engine {

namespace {
// While an application thread polls, the progress thread naps this long
// between looks at whether it still does (a timer tick: timers run after a
// nap), and sends ACKs that have waited for the application's next post
// longer than kAckDelay. Each nap's end preempts a poller that shares the
// core: at 200 us, 5,000 a second per process were most of a same-host
// ib_send_lat's context switches and showed in its average
// (docs/measurements.md, "2026-11-30 (night)").
constexpr int kNapUs = 1000;
static_assert(std::chrono::microseconds(kNapUs) == ProgressPolicy::kTimerTick);
constexpr auto kAckDelay = std::chrono::microseconds(100);
}  // namespace

namespace {
// With UROCE_PROGRESS_SLICE_US=N the progress thread asks the scheduler for
// an N us time slice (Linux 6.12+ EEVDF: a fair-class thread's sched_runtime
// is its slice, and a thread with a shorter slice than the running one
// preempts it when it wakes up), meant to let it take a datagram at once from
// an application thread spinning on the same core. Off by default: measured,
// it gained nothing and delayed polling applications (docs/architecture.md).
// Older kernels ignore the value; failure is harmless.
void request_short_slice() {
  struct {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
  } attr{};
  attr.size = sizeof attr;
  attr.policy = 0;  // SCHED_OTHER
  attr.runtime = core::config().progress_slice_us * 1000ull;
  if (attr.runtime) (void)syscall(SYS_sched_setattr, 0, &attr, 0);
}
}  // namespace

// The progress thread waits for datagrams without holding the receive turn,
// then takes it (after any CQ poller that has it) to receive. It wakes for
// timers only while some timer is armed (or tombstones or READ responses are
// pending); otherwise it sleeps until a datagram, a drain request, or a newly
// armed timer (timer_armed) wakes it: an idle context costs nothing. When and
// how it waits is ProgressPolicy's (progress_policy.h).
void EngineContext::progress_loop() {
  request_short_slice();
  // UROCE_POLL=spin:N / auto:N: after a datagram, poll the sockets for N us
  // more before sleeping; auto only while no application thread is runnable
  // (docs/architecture.md, "How the progress thread waits").
  const bool spin_auto = core::config().progress_spin_auto;
  ProgressPolicy policy(std::chrono::microseconds(core::config().progress_spin_us), spin_auto, Clock::now());
  host::SpinAdvisor advisor;
  if (spin_auto) host::SpinAdvisor::note_internal_thread();
  while (!stop_.load(std::memory_order_relaxed)) {
    ProgressPolicy::Wait wait = policy.how_to_wait(Clock::now(), poller_active(Clock::now()));
    if (wait == ProgressPolicy::Wait::kNap) {
      nap_for_poller();
    } else if (wait == ProgressPolicy::Wait::kSleep) {
      sleep_on_sockets(policy);
    }
    uint64_t drain_target;  // read after the wait, which a drain request ends
    bool drain_due;
    {
      std::lock_guard lock(drain_mu_);
      drain_target = drain_requested_;
      drain_due = drain_done_ < drain_target;
    }
    auto now = Clock::now();
    size_t received = 0;
    if (policy.take_turn(now, poller_active(now), drain_due, stats.rx_packets.load(std::memory_order_relaxed))) {
      std::lock_guard rx(rx_mu_);
      bool busy = receive_turn(&received, Turn::kProgress, now);
      policy.turn_taken(now, received, wait == ProgressPolicy::Wait::kNap, busy);
    } else {
      // The poller receives: only ACKs it left waiting too long go from here.
      std::unique_lock rx(rx_mu_, std::try_to_lock);
      if (rx.owns_lock()) flush_deferred_acks(kAckDelay);
    }
    if (!policy.busy()) end_drain(drain_target);  // every datagram that had arrived is processed
    now = Clock::now();
    if (policy.timers_due(now)) policy.timers_ran(now, run_timers(now));
    policy.turn_ended(now, received, [&] { return advisor.application_runnable(); });
  }
  if (spin_auto) host::SpinAdvisor::forget_internal_thread();
}

// Poller mode: an application thread polls a CQ and receives for itself, so
// arrivals must not wake this thread (on a core it shares with the poller,
// each wake-up preempts the poller and takes the packet from it in two
// context switches). It naps on its eventfd alone and looks again.
void EngineContext::nap_for_poller() {
  napping_.store(true);
  if (poller_active(Clock::now())) transport_->nap(kNapUs);
  napping_.store(false, std::memory_order_relaxed);
}

// A tick long, or without a deadline when the policy allows and no timer was
// armed meanwhile (timer_armed clears deep_sleep_ and wakes the thread).
void EngineContext::sleep_on_sockets(const ProgressPolicy& policy) {
  int timeout = int(std::chrono::duration_cast<std::chrono::milliseconds>(ProgressPolicy::kTimerTick).count());
  bool ticking = tombstones_.any() || have_kept_xrc_.load(std::memory_order_relaxed);
  if (policy.may_sleep_deeply(Clock::now(), ticking)) {
    deep_sleep_.store(true);
    if (any_timer_armed())  // armed before the flag was seen: no deep sleep
      deep_sleep_.store(false);
    else
      timeout = -1;
  }
  transport_->wait(timeout);
  deep_sleep_.store(false, std::memory_order_relaxed);
}

void EngineContext::end_drain(uint64_t target) {
  std::lock_guard lock(drain_mu_);
  if (drain_done_ < target) {
    drain_done_ = target;
    drain_cv_.notify_all();
  }
}

// Same-host mailboxes first (mailboxes.h); a turn that took mail returns
// without the rings, so that the poller sees its completion at once, but
// not more than kMailTurns - 1 times in a row.
bool EngineContext::receive_turn(size_t* received, Turn turn, Clock::time_point now) {
  flush_deferred_acks();
  if (mailboxes_.any()) {
    size_t mail = take_mail();
    if (mail && ++mail_turns_ < kMailTurns) {
      *received = mail;
      return true;
    }
    mail_turns_ = 0;
  }
  size_t n = transport_->recv_burst(rx_, 0);
  *received = n;
  bool board_moved = board_watch_.moved();  // after the rings: a word is as new as the records
  if (n || board_moved) process_burst(std::span(rx_.data(), n), turn, now, board_moved);
  bool reads_pending = send_reads();
  return reads_pending || transport_->more_ready();
}

// The board is read between a record seen and taken: an ACK word its sender
// stored before the record (the ACK of the request a reply answers) then
// completes its send before the reply's receive completes.
size_t EngineContext::take_mail() {
  std::shared_lock lock(qps_.mu());  // withdraw takes it exclusively
  if (!mailboxes_.ready()) return 0;
  TxBatch& tx = TxBatch::local();
  tx.use(transport_.get());
  board_watch_.take(tx, board_watch_.moved());
  size_t taken = mailboxes_.take(tx);
  if (tx.pending()) tx.flush();
  return taken;
}

// A clock read (~30 ns on the machines measured) is most of an empty poll's
// cost, and a datagram that arrives during one waits for it: the poller's
// stamp is taken on every kStampEvery-th poll (the first of a spell among
// them: the stamp's freshness is tens of us), and a burst's time only when
// one arrives.
bool EngineContext::poll_receive() {
  unsigned polls = polls_.load(std::memory_order_relaxed) + 1;
  polls_.store(polls, std::memory_order_relaxed);
  if (polls % kStampEvery == 1) note_poller();
  std::unique_lock rx(rx_mu_, std::try_to_lock);
  if (!rx.owns_lock()) return false;
  size_t received;
  receive_turn(&received, Turn::kApplication);
  return true;
}

void EngineContext::event_spin(const core::CompChannel& channel, Clock::duration spin) {
  event_spinners_.fetch_add(1, std::memory_order_relaxed);
  Clock::time_point until = Clock::now() + spin;
  while (!channel.has_event() && Clock::now() < until)
    if (!poll_receive()) std::this_thread::yield();  // another thread receives
  event_spinners_.fetch_sub(1, std::memory_order_relaxed);
  poller_leaves();
}

unsigned EngineContext::note_large_write(uint32_t qpn, Clock::time_point now) {
  std::lock_guard lock(large_writers_mu_);
  LargeWriter* slot = &large_writers_[0];
  for (LargeWriter& w : large_writers_) {
    if (w.qpn == qpn) {
      slot = &w;
      break;
    }
    if (w.at < slot->at) slot = &w;  // else the oldest is replaced
  }
  *slot = LargeWriter{qpn, now};
  unsigned n = 0;
  for (const LargeWriter& w : large_writers_) n += w.qpn != 0 && now - w.at < kRecentWriter;
  return n;
}

void EngineContext::count_sender(EngineQp& qp, bool sending) {
  if (sending == qp.req.counted_sending) return;
  qp.req.counted_sending = sending;
  if (sending)
    senders_.fetch_add(1, std::memory_order_relaxed);
  else
    senders_.fetch_sub(1, std::memory_order_relaxed);
}

void EngineContext::send_deferred_acks_now(bool wait_for_turn) {
  std::unique_lock rx(rx_mu_, std::defer_lock);
  if (wait_for_turn) {
    rx.lock();
  } else if (!rx.try_lock()) {
    return;  // the thread in its turn sends them
  }
  flush_deferred_acks();
}

void EngineContext::flush_deferred_acks(Clock::duration older_than) {
  if (deferred_ack_count_.load(std::memory_order_relaxed) == 0) return;  // see its declaration
  std::shared_lock lock(qps_.mu());  // unregister_qp erases from deferred_acks_ under it
  if (deferred_acks_.empty()) return;
  if (older_than != Clock::duration::zero() && Clock::now() - acks_deferred_at_ < older_than) return;
  TxBatch& tx = TxBatch::local();
  tx.use(transport_.get());
  for (EngineQp* qp : deferred_acks_) {
    std::lock_guard ql(qp->mu);
    qp->in_ack_list = false;
    if (!qp->resp.ack_pending) continue;  // the QP's post has sent it
    // Handed to the transport before the QP's lock is released: a reply the
    // application posts meanwhile (it holds the lock) must not leave first.
    responder_flush_ack(*qp, tx);
    tx.flush();
  }
  deferred_acks_.clear();
  deferred_ack_count_.store(0, std::memory_order_relaxed);
}

}  // namespace uroce::engine
