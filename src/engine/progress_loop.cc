// The progress thread's loop and the receive turn (docs/architecture.md,
// "Threads": who receives, poller mode, ACKs that ride with the reply).
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <shared_mutex>

#include "core/config.h"
#include "engine/engine_context.h"
#include "engine/roles.h"
#include "engine/spin_advisor.h"
#include "engine/tx_batch.h"

namespace uroce::engine {

namespace {
constexpr int kTimerTickMs = 1;
constexpr auto kQuietBeforeDeepSleep = std::chrono::milliseconds(50);
// While an application thread polls, the progress thread naps this long
// between looks at whether it still does, and sends ACKs that have waited
// for the application's next post longer than kAckDelay.
constexpr int kNapUs = 200;
constexpr auto kAckDelay = std::chrono::microseconds(100);
// UROCE_POLL=auto (spin_advisor.h): a polling progress thread looks every
// kSpinCheck whether an application thread has become runnable. One found
// runnable is taken to stay so for kSpinBackoff (a thread spinning on
// memory): each look costs a few us that would delay it after every datagram.
constexpr auto kSpinCheck = std::chrono::microseconds(20);
constexpr auto kSpinBackoff = std::chrono::milliseconds(2);
// ... and only after a receive turn of at most kSpinBurst datagrams: a
// request-response exchange, whose next request a wake-up would delay. A
// stream's receiver gets larger bursts, and keeps getting them without a
// wake-up; polling its socket would contend with the sender's softirq that
// fills it.
constexpr size_t kSpinBurst = 8;
// After the progress thread had to receive datagrams itself because no
// application thread was polling, it keeps watching the sockets for a while
// (a WRITE target that spins on memory polls its CQ between WRITEs, but
// only the progress thread can take the WRITEs). The hold starts short and
// doubles each time datagrams are found waiting again at the first nap after
// it: a poller that was only descheduled once (a loaded machine) loses the
// sockets for kMinHold, a WRITE target that never takes its own datagrams
// for kMaxHold at a time (then one datagram waits for a nap again).
constexpr auto kMinHold = std::chrono::milliseconds(1);
constexpr auto kMaxHold = std::chrono::milliseconds(50);
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
// armed timer (timer_armed) wakes it: an idle context costs nothing.
void EngineContext::progress_loop() {
  request_short_slice();
  auto next_timers = Clock::now();
  auto last_active = next_timers;         // a timer armed or a datagram received
  auto self_receive_until = next_timers;  // see kMinHold
  Clock::duration hold = kMinHold;
  uint64_t rx_at_nap = 0;    // stats.rx_packets at the last nap's end
  bool timers_armed = true;  // until run_timers says otherwise
  bool busy = false;         // more to receive or send at once
  // UROCE_POLL=spin:N / auto:N: after a datagram, poll the sockets for N us
  // more before sleeping; auto only while no application thread is runnable
  // (docs/architecture.md, "How the progress thread waits").
  const auto spin = std::chrono::microseconds(core::config().progress_spin_us);
  auto spin_until = next_timers;
  const bool spin_auto = core::config().progress_spin_auto;
  SpinAdvisor advisor;
  auto next_check = next_timers;
  bool spin_ok = false;
  if (spin_auto) SpinAdvisor::note_internal_thread();
  while (!stop_.load(std::memory_order_relaxed)) {
    size_t received = 0;
    // Poller mode: an application thread polls a CQ and receives for itself,
    // so arrivals must not wake this thread (on a core it shares with the
    // poller, each wake-up preempts the poller and takes the packet from it
    // in two context switches). It naps on its eventfd alone and looks again.
    bool leave_to_poller = !busy && Clock::now() >= self_receive_until && poller_active(Clock::now());
    bool napped = leave_to_poller;
    if (leave_to_poller) {
      napping_.store(true);
      if (poller_active(Clock::now())) transport_->nap(kNapUs);
      napping_.store(false, std::memory_order_relaxed);
    } else if (!busy && (spin.count() == 0 || Clock::now() >= spin_until)) {
      int timeout = kTimerTickMs;
      // Deep sleep only after a quiet while: a ping-pong disarms its timer
      // after every message, and waking this thread at every post would
      // cost a system call and a context switch on the critical path.
      if (!timers_armed && !have_tombstones_.load(std::memory_order_relaxed) &&
          !have_kept_xrc_.load(std::memory_order_relaxed) && Clock::now() - last_active >= kQuietBeforeDeepSleep) {
        deep_sleep_.store(true);
        if (any_timer_armed())  // armed before the flag was seen: no deep sleep
          deep_sleep_.store(false);
        else
          timeout = -1;
      }
      transport_->wait(timeout);
      deep_sleep_.store(false, std::memory_order_relaxed);
    }
    uint64_t drain_target;  // read after the wait, which a drain request ends
    bool drain_due;
    {
      std::lock_guard lock(drain_mu_);
      drain_target = drain_requested_;
      drain_due = drain_done_ < drain_target;
    }
    auto now = Clock::now();
    bool take_turn = true;
    bool for_poller = !drain_due && now >= self_receive_until && poller_active(now);
    if (for_poller) {
      // The poller receives. Only if nobody has received anything since the
      // last nap does this thread look itself: a poller that stopped polling
      // (it spins on memory, say) must not leave datagrams waiting.
      uint64_t rx_now = stats.rx_packets.load(std::memory_order_relaxed);
      take_turn = rx_now == rx_at_nap;
      rx_at_nap = rx_now;
      if (!take_turn) {
        // Only ACKs the poller left waiting too long go from here.
        std::unique_lock rx(rx_mu_, std::try_to_lock);
        if (rx.owns_lock()) flush_deferred_acks(kAckDelay);
        busy = false;
      }
    }
    if (take_turn) {
      std::lock_guard rx(rx_mu_);
      busy = receive_turn(&received, Turn::kProgress, now);
      // Datagrams that waited through a nap: the application polls its CQ
      // but not for these (a WRITE target spinning on memory between its
      // posts). Watch the sockets for a while.
      if (received && napped) {
        bool again = now - self_receive_until < 2 * kMinHold;  // at the first nap after the last hold
        hold = again ? std::min<Clock::duration>(2 * hold, kMaxHold) : Clock::duration(kMinHold);
        self_receive_until = now + hold;
      }
    }
    if (!busy) {  // every datagram that had arrived is processed
      std::lock_guard lock(drain_mu_);
      if (drain_done_ < drain_target) {
        drain_done_ = drain_target;
        drain_cv_.notify_all();
      }
    }
    now = Clock::now();
    if (now >= next_timers) {  // after a deep sleep, at once
      timers_armed = run_timers(now);
      next_timers = now + std::chrono::milliseconds(kTimerTickMs);
    }
    if (timers_armed || received) last_active = now;
    if (received && (!spin_auto || received <= kSpinBurst)) spin_until = now + spin;
    if (spin_auto && now < spin_until) {
      if (now >= next_check) {
        spin_ok = !advisor.application_runnable();
        next_check = now + (spin_ok ? kSpinCheck : kSpinBackoff);
      }
      if (!spin_ok) spin_until = now;
    }
  }
  if (spin_auto) SpinAdvisor::forget_internal_thread();
}

bool EngineContext::receive_turn(size_t* received, Turn turn, Clock::time_point now) {
  flush_deferred_acks();
  size_t n = transport_->recv_burst(rx_, 0);
  *received = n;
  if (n) process_burst(std::span(rx_.data(), n), turn, now);
  bool reads_pending = send_reads();
  return reads_pending || transport_->more_ready();
}

bool EngineContext::poll_receive() {
  auto now = Clock::now();
  note_poller(now);
  std::unique_lock rx(rx_mu_, std::try_to_lock);
  if (!rx.owns_lock()) return false;
  size_t received;
  receive_turn(&received, Turn::kApplication, now);
  return true;
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
  std::shared_lock lock(qps_mu_);  // unregister_qp erases from deferred_acks_ under it
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
