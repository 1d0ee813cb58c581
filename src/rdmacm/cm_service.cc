// CmService plumbing: the progress thread, timers and the id registry. The
// state machines live in cm_address.cc, cm_active.cc, cm_passive.cc,
// cm_teardown.cc and cm_sidr.cc, QP1 in cm_gsi.cc; events in cm_events.cc.
#include "rdmacm/cm_service.h"

#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "core/device.h"
#include "core/guarded_access.h"
#include "core/log.h"

namespace uroce::rdmacm {

namespace {
constexpr uint64_t kWakeToken = 0;
constexpr uint64_t kInboxToken = ~uint64_t(0);  // the engines' MADs (cm_gsi.cc)

uint64_t random_u64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != sizeof v) v = uint64_t(getpid()) << 32 ^ uint64_t(time(nullptr));
  return v;
}
}  // namespace

const char* state_name(CmState s) {
  switch (s) {
    case CmState::kIdle:
      return "idle";
    case CmState::kAddrQuery:
      return "addr-query";
    case CmState::kAddrResolved:
      return "addr-resolved";
    case CmState::kRouteQuery:
      return "route-query";
    case CmState::kRouteResolved:
      return "route-resolved";
    case CmState::kListen:
      return "listen";
    case CmState::kReqSent:
      return "req-sent";
    case CmState::kRepRcvd:
      return "rep-rcvd";
    case CmState::kReqRcvd:
      return "req-rcvd";
    case CmState::kRepSent:
      return "rep-sent";
    case CmState::kEstablished:
      return "established";
    case CmState::kDreqSent:
      return "dreq-sent";
    case CmState::kDreqRcvd:
      return "dreq-rcvd";
    case CmState::kTimewait:
      return "timewait";
    case CmState::kSidrReqSent:
      return "sidr-req-sent";
    case CmState::kClosed:
      return "closed";
  }
  return "?";
}

EventChannel* CmId::channel() const { return EventChannel::from(abi.channel); }

CmService& CmService::get() {
  static CmService* s = new CmService();  // never destroyed: the thread may outlive main()
  return *s;
}

CmService::CmService() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeToken;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  inbox_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ev.data.u64 = kInboxToken;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, inbox_fd_, &ev);
  draining_.reserve(kMaxInbox);
  engine::set_gsi_sink(&CmService::gsi_sink);
  uint64_t r = random_u64();
  next_tid_ = r << 16;
  comm_id_operand_ = uint32_t(r >> 32);
}

void CmService::ensure_thread() {
  if (thread_started_) return;
  thread_started_ = true;
  // Detached: nothing joins it at exit, and it touches only this never-freed object.
  thread_ = std::thread([this] { run(); });
  thread_.detach();
}

void CmService::wake() { eventfd_write(wake_fd_, 1); }

void CmService::run() {
  // The application's signals are not ours to take.
  sigset_t all;
  core::blockable_signals(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  epoll_event evs[64];
  for (;;) {
    int timeout;
    {
      std::lock_guard lock(mu);
      timeout = next_timeout_ms();
    }
    int n = epoll_wait(epoll_fd_, evs, 64, timeout);
    if (n < 0 && errno != EINTR) {
      LOG_ERROR("rdma_cm: epoll_wait: %s", strerror(errno));
      usleep(10000);
      continue;
    }
    std::lock_guard lock(mu);
    for (int i = 0; i < n; ++i) {
      const uint64_t token = evs[i].data.u64;
      if (token == kWakeToken) {
        eventfd_t v;
        eventfd_read(wake_fd_, &v);
        continue;
      }
      if (token == kInboxToken) {
        drain_inbox();
        continue;
      }
      // Look tokens up each time: handling one event may close other sockets.
      if (auto p = port_ids_.find(token); p != port_ids_.end()) on_port_ready(p->second);
    }
    const auto now = Clock::now();
    run_timers(now);
    check_peers(now);
  }
}

// ---- ids ----

CmId* CmService::create_id(EventChannel* channel, bool sync, void* context, rdma_port_space ps, ibv_qp_type qp_type) {
  auto* id = new CmId();
  id->abi.channel = &channel->abi;
  channel->add_user();
  id->abi.context = context;
  id->abi.ps = ps;
  id->abi.qp_type = qp_type;
  id->sync = sync;
  id->serial = next_serial_++;
  return id;
}

uint32_t CmService::new_comm_id(const CmId* id) {
  // As the kernel's CM (cm_alloc_id_priv: a cyclic counter XORed with a
  // random operand): no ID comes again within 2^24 connections of the process,
  // and none is predictable from another process. (Random draws of 24 bits
  // repeated one of the last thousand IDs in a few % of rdmacm.cycles_1000's
  // runs; the peer, which remembers a closed connection's ID for a while
  // (request_memory.h), then answered the new REQ "stale connection".)
  unsigned slot = id->port.device ? engine::gsi_slot(id->port.device->verbs) : 0;
  for (;;) {
    uint32_t random = (comm_id_counter_++ ^ comm_id_operand_) & 0xFFFFFF;
    uint32_t c = engine::make_comm_id(slot, random);
    if (random != 0 && !gsi_ids_.count(c)) return c;
  }
}

void CmService::destroy_id(CmId* id, std::unique_lock<std::mutex>& lock) {
  id->destroying = true;
  cancel_timer(id);
  abandon(id);
  // Undelivered events die with the id; a listener's undelivered connection
  // requests take their new ids with them (the application never saw them).
  for (CmEvent* e : id->channel()->take_if([id](CmEvent* ev) { return ev->owner == id; })) {
    if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->ev.id != &id->abi) free_unseen_id(CmId::from(e->ev.id));
    delete e;
  }
  acked.wait(lock, [id] { return id->events_acked >= id->events_delivered; });
  release_id(id);
}

void CmService::free_unseen_id(CmId* id) {
  id->destroying = true;
  cancel_timer(id);
  abandon(id);
  for (CmEvent* e : id->channel()->take_if([id](CmEvent* ev) { return ev->owner == id; })) delete e;
  release_id(id);
}

void CmService::release_id(CmId* id) {
  cancel_timer(id);
  cancel_resend(id);
  close_port_socket(id);
  if (auto it = gsi_ids_.find(id->conn.local_comm_id); it != gsi_ids_.end() && it->second == id) {
    remember_answer(id);
    gsi_ids_.erase(it);
  }
  free(id->abi.route.path_rec);
  EventChannel* channel = id->channel();
  if (id->sync) channel->destroy();
  channel->remove_user();
  delete id;
}

void CmService::migrate_id(CmId* id, EventChannel* to, bool to_sync, std::unique_lock<std::mutex>& lock) {
  EventChannel* from = id->channel();
  for (CmEvent* e : from->take_if([id](CmEvent* ev) { return ev->owner == id; })) {
    to->push(e);
    // A connection request not yet delivered brings its new id along.
    if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->ev.id != &id->abi) {
      CmId* child = CmId::from(e->ev.id);
      if (!child->sync && child->channel() == from) {
        for (CmEvent* c : from->take_if([child](CmEvent* ev) { return ev->owner == child; })) to->push(c);
        child->abi.channel = &to->abi;
        from->remove_user();
        to->add_user();
      }
    }
  }
  const bool was_sync = id->sync;
  id->abi.channel = &to->abi;
  id->sync = to_sync;
  to->add_user();
  if (was_sync) {
    if (id->abi.event) {
      CmEvent* e = CmEvent::from(id->abi.event);
      id->abi.event = nullptr;
      e->owner->events_acked++;
      delete e;
    }
    from->destroy();
  }
  from->remove_user();
  // As librdmacm: events already handed out on the old channel must be
  // acknowledged before the id is used through the new one.
  acked.wait(lock, [id] { return id->events_acked >= id->events_delivered; });
}

// ---- timers ----

void CmService::arm_timer(CmId* id, TimerKind kind, int ms) {
  cancel_timer(id);
  id->timer = timers_.emplace(Clock::now() + std::chrono::milliseconds(ms), TimerEntry{id, kind});
  ensure_thread();
  wake();  // the progress thread may be sleeping past the new deadline
}

void CmService::cancel_timer(CmId* id) {
  if (!id->timer) return;
  timers_.erase(*id->timer);
  id->timer.reset();
}

int CmService::next_timeout_ms() {
  std::optional<Clock::time_point> next;
  if (!timers_.empty()) next = timers_.begin()->first;
  if (!gsi_ids_.empty() && (!next || next_peer_check_ < *next)) next = next_peer_check_;
  if (!next) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
  return left < 0 ? 0 : int(std::min<int64_t>(left, 60 * 1000));
}

void CmService::run_timers(Clock::time_point now) {
  while (!timers_.empty() && timers_.begin()->first <= now) {
    const TimerEntry t = timers_.begin()->second;
    timers_.erase(timers_.begin());
    (t.kind == TimerKind::kResend ? t.id->resend_timer : t.id->timer).reset();
    on_timer(t.id, t.kind);
  }
}

// ---- logging what peers cause ----

void CmService::log_limited(core::LogLevel level, const char* fmt, ...) {
  if (!core::log_enabled(level)) return;
  uint64_t suppressed = 0;
  if (!log_limiter_.allow(Clock::now(), &suppressed)) return;
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (suppressed) {
    core::log_message(level, "%s (%llu similar messages suppressed)", line, (unsigned long long)suppressed);
  } else {
    core::log_message(level, "%s", line);
  }
}

}  // namespace uroce::rdmacm
