// Completion channels and completion queues.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sched.h>

#include <chrono>

#include "core/comp_channel.h"
#include "core/cq.h"
#include "core/limits.h"
#include "engine/engine_context.h"
#include "transport/step_probe.h"
#include "verbs/export.h"
#include "verbs/ops.h"

using uroce::core::CompChannel;
using uroce::core::Cq;
using uroce::engine::EngineContext;
using uroce::verbs::abi_guard;
using uroce::verbs::abi_guard_errno;

UROCE_API ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  return abi_guard<ibv_comp_channel*>(nullptr, [&]() -> ibv_comp_channel* {
    if (!context) {
      errno = EINVAL;
      return nullptr;
    }
    CompChannel* ch = CompChannel::create(context);
    return ch ? &ch->ibch : nullptr;
  });
}

UROCE_API int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  return abi_guard_errno([&] {
    if (!channel) return EINVAL;
    CompChannel* ch = CompChannel::from(channel);
    if (ch->cq_users.load() != 0) return EBUSY;
    delete ch;
    return 0;
  });
}

UROCE_API ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                                int comp_vector) {
  return abi_guard<ibv_cq*>(nullptr, [&]() -> ibv_cq* {
    if (!context || cqe < 1 || uint32_t(cqe) > uroce::core::kMaxCqe || comp_vector < 0 ||
        comp_vector >= context->num_comp_vectors) {
      errno = EINVAL;
      return nullptr;
    }
    uroce::core::Reservation slot(EngineContext::from(context), uroce::core::Resource::kCq);  // max_cq
    if (slot.error()) {
      errno = slot.error();
      return nullptr;
    }
    CompChannel* ch = channel ? CompChannel::from(channel) : nullptr;
    auto* cq = new Cq(context, uint32_t(cqe), ch, cq_context);
    cq->count_arms_in(&EngineContext::from(context)->armed_cqs);
    if (ch) ch->cq_users.fetch_add(1);
    slot.keep();
    return reinterpret_cast<ibv_cq*>(&cq->ibcq);
  });
}

UROCE_API int ibv_resize_cq(ibv_cq* ibcq, int cqe) {
  return abi_guard_errno([&] {
    if (!ibcq || cqe < 1 || uint32_t(cqe) > uroce::core::kMaxCqe) return EINVAL;
    return Cq::from(ibcq)->resize(uint32_t(cqe));
  });
}

UROCE_API int ibv_destroy_cq(ibv_cq* ibcq) {
  return abi_guard_errno([&] {
    if (!ibcq) return EINVAL;
    Cq* cq = Cq::from(ibcq);
    if (cq->qp_users.load() != 0) return EBUSY;
    if (CompChannel* ch = cq->channel()) {
      ch->forget(cq);
      ch->cq_users.fetch_sub(1);
    }
    EngineContext::from(ibcq->context)->release(uroce::core::Resource::kCq);
    delete cq;
    return 0;
  });
}

namespace {

// How long a thread about to block in ibv_get_cq_event first receives for
// itself (EngineContext::event_spin), while the channel's waits are short.
constexpr auto kEventSpin = std::chrono::microseconds(50);

// Before a blocking wait for an event: the spin, if the channel's hint says
// so (CompChannel::spin_hint), and what it found or how long the wait took
// noted for the next one. A non-blocking channel fd (the application polls
// it itself) is left alone. A signal handled during the spin does not end the
// wait (a later one does), as one that lands just before rdma-core's read.
template <class Wait>
auto wait_for_event(CompChannel& ch, Wait wait) {
  if (ch.has_event() || (fcntl(ch.ibch.fd, F_GETFL) & O_NONBLOCK)) return wait();
  if (ch.spin_hint()) {
    EngineContext::from(ch.ibch.context)->event_spin(ch, kEventSpin);
    ch.note_spin(ch.has_event());
    return wait();
  }
  auto start = std::chrono::steady_clock::now();
  auto r = wait();
  ch.note_wait(std::chrono::steady_clock::now() - start, kEventSpin);
  return r;
}

}  // namespace

UROCE_API int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  if (!channel || !cq || !cq_context) {
    errno = EINVAL;
    return -1;
  }
  return abi_guard<int>(-1, [&] {
    CompChannel* ch = CompChannel::from(channel);
    auto r = wait_for_event(*ch, [&] { return ch->get_event(); });
    if (!r.ok()) {
      errno = r.err();
      return -1;
    }
    Cq* c = *r;
    *cq = reinterpret_cast<ibv_cq*>(&c->ibcq);
    *cq_context = c->ibcq.cq_context;
    return 0;
  });
}

UROCE_API void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  if (!cq) return;
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

namespace uroce::verbs {

int poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) noexcept {
  if (num_entries < 0) return -EINVAL;
  Cq* c = Cq::from(cq);
  int n = c->poll(num_entries, wc);
  if (n == 0 && num_entries > 0) {
    // An empty CQ: this thread receives what has arrived itself (no hand-off
    // to the progress thread), then looks again. If another thread has the
    // receive turn, yield: on a machine with few cores a spinning poller
    // would delay the very completion it waits for.
    if (EngineContext::from(cq->context)->poll_receive())
      n = c->poll(num_entries, wc);
    else
      sched_yield();
  }
  if (n > 0) transport::step_probe::stamp(transport::step_probe::Step::kPolled);
  return n;
}

int req_notify_cq(ibv_cq* cq, int solicited_only) noexcept {
  // The application will wait for an event instead of polling: the progress
  // thread must receive from now on (EngineContext, "poller mode").
  EngineContext::from(cq->context)->poller_leaves();
  return Cq::from(cq)->arm(solicited_only != 0);
}

}  // namespace uroce::verbs
