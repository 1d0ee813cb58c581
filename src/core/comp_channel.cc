#include "core/comp_channel.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace uroce::core {

CompChannel* CompChannel::create(ibv_context* ctx) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return nullptr;
  fcntl(fds[1], F_SETFL, O_NONBLOCK);
  auto* ch = new (std::nothrow) CompChannel;
  if (!ch) {
    close(fds[0]);
    close(fds[1]);
    errno = ENOMEM;
    return nullptr;
  }
  ch->ibch.context = ctx;
  ch->ibch.fd = fds[0];
  ch->ibch.refcnt = 0;
  ch->write_fd_ = fds[1];
  return ch;
}

CompChannel::~CompChannel() {
  close(ibch.fd);
  close(write_fd_);
}

void CompChannel::notify(Cq* cq) {
  std::lock_guard lock(mu_);
  events_.push_back(cq);
  queued_.store(events_.size(), std::memory_order_release);
  char b = 1;
  (void)!write(write_fd_, &b, 1);
}

Result<Cq*> CompChannel::get_event() {
  // One plain read, as rdma-core's ibv_get_cq_event: a signal that interrupts
  // the wait (handler without SA_RESTART) is EINTR for the caller, which is
  // how programs end a blocking wait.
  char b;
  ssize_t n = read(ibch.fd, &b, 1);
  if (n != 1) return Result<Cq*>::error(n < 0 ? errno : EIO);
  std::lock_guard lock(mu_);
  if (events_.empty()) return Result<Cq*>::error(EAGAIN);  // event of a destroyed CQ
  Cq* cq = events_.front();
  events_.pop_front();
  queued_.store(events_.size(), std::memory_order_release);
  return cq;
}

void CompChannel::forget(Cq* cq) {
  std::lock_guard lock(mu_);
  events_.erase(std::remove(events_.begin(), events_.end(), cq), events_.end());
  queued_.store(events_.size(), std::memory_order_release);
}

}  // namespace uroce::core
