// Completion channel: a real file descriptor (the read end of a pipe) that
// becomes readable when an armed CQ gets a completion, so poll/epoll on
// channel->fd work. One byte is written per event; ibv_get_cq_event reads one
// byte (blocking or not, as the application set the fd) and takes the
// matching CQ from the queue.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>

#include "core/container_of.h"
#include "core/result.h"

namespace uroce::core {

class Cq;

class CompChannel {
 public:
  // Returns nullptr with errno set on failure.
  static CompChannel* create(ibv_context* ctx);
  ~CompChannel();

  ibv_comp_channel ibch{};  // ABI object; ibch.fd is the pipe's read end
  std::atomic<int> cq_users{0};

  void notify(Cq* cq);
  // Blocks (unless fd is O_NONBLOCK) until an event; errno-style failure
  // (EAGAIN when non-blocking and none is queued, EINTR when a signal
  // interrupts the wait).
  [[nodiscard]] Result<Cq*> get_event();
  // Drops queued events of a CQ being destroyed.
  void forget(Cq* cq);
  // Whether an event is queued (any thread, without the lock).
  bool has_event() const { return queued_.load(std::memory_order_acquire) != 0; }
  // Whether the next blocking wait should first spin (verbs/cq_verbs.cc,
  // ibv_get_cq_event): yes while spins find their event, as in an exchange
  // of messages; not after a spin that did not (the peer is slower or idle),
  // until a wait without one is short again (under twice the spin: its
  // wake-ups take tens of us). So events that come a little too late for a
  // spin pay for one every other wait, and an idle channel for none.
  bool spin_hint() const { return spin_hint_.load(std::memory_order_relaxed); }
  void note_spin(bool found) { spin_hint_.store(found, std::memory_order_relaxed); }
  void note_wait(std::chrono::nanoseconds waited, std::chrono::nanoseconds spin) {
    spin_hint_.store(waited < 2 * spin, std::memory_order_relaxed);
  }

  static CompChannel* from(ibv_comp_channel* c) { return UROCE_CONTAINER_OF(c, CompChannel, ibch); }

 private:
  CompChannel() = default;
  int write_fd_ = -1;
  std::mutex mu_;
  std::deque<Cq*> events_;
  std::atomic<size_t> queued_{0};  // events_.size(), stored under mu_
  std::atomic<bool> spin_hint_{true};
};

}  // namespace uroce::core
