#include "rdmacm/event_channel.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <new>
#include <vector>

namespace uroce::rdmacm {

EventChannel* EventChannel::create() {
  auto* c = new (std::nothrow) EventChannel();
  if (!c) {
    errno = ENOMEM;
    return nullptr;
  }
  c->abi.fd = eventfd(0, EFD_CLOEXEC);
  c->doorbell_ = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (c->abi.fd < 0 || c->doorbell_ < 0) {
    int e = errno;
    if (c->abi.fd >= 0) close(c->abi.fd);
    if (c->doorbell_ >= 0) close(c->doorbell_);
    delete c;
    errno = e;
    return nullptr;
  }
  return c;
}

void EventChannel::destroy() {
  for (CmEvent* e : queue_) delete e;
  queue_.clear();
  close(abi.fd);
  close(doorbell_);
  abi.fd = -1;
  doorbell_ = -1;
  closed_ = true;
  retire();
}

void EventChannel::remove_user() { --users_; }

// A destroyed channel is kept (about 100 bytes): a thread of the application
// may still be on its way into rdma_get_cm_event on it — Debian's rping
// destroys the channel while its event thread loops back from acknowledging
// the last event — and must find it closed, not freed memory.
void EventChannel::retire() {
  // Never destroyed, so that the retired channels stay reachable (no leak
  // report at exit). Under the CmService mutex.
  static auto* retired = new std::vector<EventChannel*>;
  try {
    retired->push_back(this);
  } catch (...) {  // out of memory: leak it unreferenced rather than free it
  }
}

void EventChannel::push(CmEvent* e) {
  if (closed_) {
    delete e;
    return;
  }
  queue_.push_back(e);
  // Every event wakes the fd (not only the first), so that an application
  // waiting with edge-triggered epoll sees each one, as with the kernel's fd.
  set_readable(true);
  // One ring per waiter at most: each ring lets one read() return.
  if (waiters_ > rung_) {
    eventfd_write(doorbell_, 1);
    ++rung_;
  }
}

CmEvent* EventChannel::pop() {
  if (queue_.empty()) return nullptr;
  CmEvent* e = queue_.front();
  queue_.pop_front();
  if (queue_.empty()) set_readable(false);
  return e;
}

void EventChannel::set_readable(bool readable) {
  if (closed_) return;
  // The counter is non-zero exactly while events are queued (see the header),
  // so neither call can block, whether or not the application made the fd
  // non-blocking; a read resets it to 0.
  if (readable) {
    eventfd_write(abi.fd, 1);
  } else {
    eventfd_t v;
    eventfd_read(abi.fd, &v);
  }
}

}  // namespace uroce::rdmacm
