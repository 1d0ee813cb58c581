// Completion channel: a real file descriptor (the read end of a pipe) that
// becomes readable when an armed CQ gets a completion, so poll/epoll on
// channel->fd work. One byte is written per event; ibv_get_cq_event reads one
// byte (blocking or not, as the application set the fd) and takes the
// matching CQ from the queue.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
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

  static CompChannel* from(ibv_comp_channel* c) { return UROCE_CONTAINER_OF(c, CompChannel, ibch); }

 private:
  CompChannel() = default;
  int write_fd_ = -1;
  std::mutex mu_;
  std::deque<Cq*> events_;
};

}  // namespace uroce::core
