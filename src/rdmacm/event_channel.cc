#include "rdmacm/event_channel.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <new>

namespace uroce::rdmacm {

EventChannel* EventChannel::create() {
  auto* c = new (std::nothrow) EventChannel();
  if (!c) {
    errno = ENOMEM;
    return nullptr;
  }
  c->abi.fd = eventfd(0, EFD_CLOEXEC);
  if (c->abi.fd < 0) {
    int e = errno;
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
  delete this;
}

void EventChannel::push(CmEvent* e) {
  queue_.push_back(e);
  if (queue_.size() == 1) set_readable(true);
}

CmEvent* EventChannel::pop() {
  if (queue_.empty()) return nullptr;
  CmEvent* e = queue_.front();
  queue_.pop_front();
  if (queue_.empty()) set_readable(false);
  return e;
}

void EventChannel::set_readable(bool readable) {
  // The counter is 0 or 1 (see the header), so neither call can block, even if
  // the application made the fd blocking or non-blocking.
  if (readable) {
    eventfd_write(abi.fd, 1);
  } else {
    eventfd_t v;
    eventfd_read(abi.fd, &v);
  }
}

}  // namespace uroce::rdmacm
