// rdma_event_channel and rdma_cm_event: the queue through which the
// connection manager hands events to the application.
//
// The channel's fd is an eventfd used as a level indicator: its counter is
// non-zero exactly while the queue holds an event, so poll/epoll on
// channel->fd say "readable" iff rdma_get_cm_event would not block. The queue
// and the counter change together, under the CmService mutex.
//
// rdma_get_cm_event does not wait on that fd (reading it would clear the
// indicator that other threads may be polling) but on a private doorbell, a
// blocking eventfd in semaphore mode rung once for each waiter that an event
// may serve. Waiting is thus a plain read(), as librdmacm's read of the
// rdma_cm device: a signal whose handler has SA_RESTART resumes it, any other
// interrupts it with EINTR.
#pragma once

#include <rdma/rdma_cma.h>

#include <cstdint>
#include <deque>

#include "core/container_of.h"

namespace uroce::rdmacm {

struct CmId;

// Private data of any CM message fits (REQ/REP/REJ/RTU/DREQ/DREP: <= 224).
constexpr size_t kEventPrivateDataMax = 256;

struct CmEvent {
  rdma_cm_event ev{};  // ABI object handed to the application
  // The id whose delivered/acknowledged counters this event counts against:
  // the listener for CONNECT_REQUEST (the new id may be destroyed before the
  // event is acknowledged), ev.id otherwise. rdma_destroy_id waits until all
  // events delivered for an id are acknowledged.
  CmId* owner = nullptr;
  uint8_t private_data[kEventPrivateDataMax] = {};

  static CmEvent* from(rdma_cm_event* e) { return UROCE_CONTAINER_OF(e, CmEvent, ev); }
};

class EventChannel {
 public:
  rdma_event_channel abi{};  // abi.fd is the eventfd

  // nullptr + errno on failure.
  static EventChannel* create();
  static EventChannel* from(rdma_event_channel* c) { return UROCE_CONTAINER_OF(c, EventChannel, abi); }
  // Closes the fd and frees every undelivered event. The object itself lives
  // on (retire()): ids that still name it (an application that destroys a
  // channel before its ids) drop their later events instead of landing in
  // freed memory, and rdma_get_cm_event on it waits like a read of a
  // channel closed under it (until a signal).
  void destroy();
  bool closed() const { return closed_; }
  // Ids whose channel this is (under the CmService mutex).
  void add_user() { ++users_; }
  void remove_user();

  // The following run under the CmService mutex.
  void push(CmEvent* e);
  CmEvent* pop();  // nullptr if empty
  bool empty() const { return queue_.empty(); }
  // A thread about to wait for an event (queue empty): returns the doorbell
  // fd to read; end_wait(woken) once the read returned (woken: it consumed a
  // ring, as opposed to failing with EINTR).
  int begin_wait() {
    ++waiters_;
    return doorbell_;
  }
  void end_wait(bool woken) {
    --waiters_;
    if (woken) --rung_;
  }
  // Removes (and returns, in order) the undelivered events matching pred.
  template <class Pred>
  std::deque<CmEvent*> take_if(Pred pred);

 private:
  EventChannel() = default;
  void set_readable(bool readable);
  void retire();
  std::deque<CmEvent*> queue_;
  int doorbell_ = -1;
  int waiters_ = 0;  // threads between begin_wait and end_wait
  int rung_ = 0;     // rings not yet consumed (the doorbell's counter)
  int users_ = 0;
  bool closed_ = false;
};

template <class Pred>
std::deque<CmEvent*> EventChannel::take_if(Pred pred) {
  std::deque<CmEvent*> out;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (pred(*it)) {
      out.push_back(*it);
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  if (!out.empty() && queue_.empty()) set_readable(false);
  return out;
}

}  // namespace uroce::rdmacm
