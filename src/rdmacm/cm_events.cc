// Queueing, delivering and acknowledging rdma_cm events.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "rdmacm/cm_service.h"

namespace uroce::rdmacm {

namespace {

CmEvent* make_event(CmId* id, rdma_cm_event_type type, int status, const EventParams& p) {
  auto* e = new CmEvent();
  e->ev.id = &id->abi;
  e->ev.event = type;
  e->ev.status = status;
  e->owner = id;
  const size_t len = std::min(p.private_data_len, kEventPrivateDataMax);
  if (p.private_data && len) std::memcpy(e->private_data, p.private_data, len);
  if (p.ud) {
    rdma_ud_param& ud = e->ev.param.ud;
    ud.private_data = p.ud_context ? p.ud_context : len ? e->private_data : nullptr;
    ud.private_data_len = p.ud_context ? 0 : uint8_t(len);
    ud.ah_attr = p.ah_attr;
    ud.qp_num = p.qp_num;
    ud.qkey = p.qkey;
  } else {
    rdma_conn_param& c = e->ev.param.conn;
    c.private_data = len ? e->private_data : nullptr;
    c.private_data_len = uint8_t(len);
    c.responder_resources = p.responder_resources;
    c.initiator_depth = p.initiator_depth;
    c.flow_control = p.flow_control;
    c.retry_count = p.retry_count;
    c.rnr_retry_count = p.rnr_retry_count;
    c.srq = p.srq;
    c.qp_num = p.qp_num;
  }
  return e;
}

}  // namespace

void CmService::queue_event(CmId* id, rdma_cm_event_type type, int status, const EventParams& p) {
  if (id->destroying) return;
  LOG_DEBUG("rdma_cm: id %llu: %s, status %d", (unsigned long long)id->serial, rdma_event_str(type), status);
  id->channel()->push(make_event(id, type, status, p));
}

void CmService::queue_connect_request(CmId* listener, CmId* child, const EventParams& p) {
  LOG_DEBUG("rdma_cm: listener %llu: connect request, new id %llu", (unsigned long long)listener->serial,
            (unsigned long long)child->serial);
  CmEvent* e = make_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, p);
  e->ev.listen_id = &listener->abi;
  e->owner = listener;
  ++listener->requests_queued;
  listener->channel()->push(e);
}

int CmService::get_event(EventChannel* channel, CmEvent** out) {
  std::unique_lock lock(mu);
  for (;;) {
    if (CmEvent* e = channel->pop()) {
      e->owner->events_delivered++;
      if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->owner != CmId::from(e->ev.id)) --e->owner->requests_queued;
      LOG_DEBUG("rdma_cm: delivering %s of id %llu", rdma_event_str(e->ev.event),
                (unsigned long long)CmId::from(e->ev.id)->serial);
      *out = e;
      return 0;
    }
    // Blocks exactly when librdmacm's read of the rdma_cm device would: not
    // if the application made channel->fd non-blocking, and then as a plain
    // read() (event_channel.h), which a signal interrupts with EINTR unless
    // its handler has SA_RESTART.
    if (channel->closed()) {
      // Destroyed by another thread (event_channel.h): as a read blocked on
      // the channel's fd when it was closed, this waits until a signal.
      lock.unlock();
      pause();
      return EINTR;
    }
    const int flags = fcntl(channel->abi.fd, F_GETFL);
    if (flags >= 0 && (flags & O_NONBLOCK)) return EAGAIN;
    const int doorbell = channel->begin_wait();
    lock.unlock();
    uint64_t ring;
    const ssize_t n = read(doorbell, &ring, sizeof ring);
    const int err = n == ssize_t(sizeof ring) ? 0 : n < 0 ? errno : EIO;
    lock.lock();
    channel->end_wait(err == 0);
    if (err) return err;
  }
}

void CmService::ack_event(CmEvent* e) {
  {
    std::lock_guard lock(mu);
    e->owner->events_acked++;
  }
  acked.notify_all();
  delete e;
}

int CmService::complete_sync(CmId* id) {
  {
    std::lock_guard lock(mu);
    if (!id->sync) return 0;
  }
  if (id->abi.event) {
    ack_event(CmEvent::from(id->abi.event));
    id->abi.event = nullptr;
  }
  CmEvent* e = nullptr;
  if (int err = get_event(id->channel(), &e)) return err;
  id->abi.event = &e->ev;
  const int status = e->ev.status;
  if (!status) return 0;
  if (e->ev.event == RDMA_CM_EVENT_REJECTED) return ECONNREFUSED;
  return status < 0 ? -status : status;
}

}  // namespace uroce::rdmacm
