// The CM over QP1 (engine/gsi.h): every CM message is an IB CM MAD in a UD
// datagram to QP1 at the host's RoCE port, to uroce peers and kernel CMs
// (rxe, a RoCE NIC) alike, as the kernel's CM sends them:
//   - passive: a bound id holds a UDP socket at its address and rdma_cm port,
//     where the engine that receives a REQ or SIDR_REQ on QP1 for that port
//     passes it (a listener takes it, any other id refuses it); the new id
//     answers over QP1 (go_over_gsi).
//   - active: the REQ or SIDR_REQ goes to QP1 of the destination's host; a
//     REJ "invalid service ID" within rdma_connect's grace period sends it
//     again a little later (retry_refused).
//   - every other MAD names the receiver's communication ID, which names its
//     engine's host slot: it reaches this process's CM through its engine.
// There is no connection to lose: the request waiting for an answer (REQ,
// REP, DREQ, SIDR_REQ) is resent until it comes, and the state's timer ends
// the wait, as the IB CM's retries and timeouts do.
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/config.h"
#include "core/device.h"
#include "core/log.h"
#include "rdmacm/cm_service.h"
#include "wire/headers.h"

namespace uroce::rdmacm {

namespace {

// The AttributeID of a MAD (which CM message it is).
uint16_t attribute_of(const Mad& mad) { return uint16_t(mad[16] << 8 | mad[17]); }

// Whether `ip` is an address of this host (an engine of it passed a request).
bool from_this_host(const transport::IpAddress& ip) {
  if (ip.loopback()) return true;
  const ibv_gid gid = core::ip_to_gid(ip.bytes);
  for (const core::HostAddress& h : core::host_addresses())
    if (std::memcmp(h.gid.raw, gid.raw, sizeof gid.raw) == 0) return true;
  return false;
}

// The messages that wait for an answer and are resent until it comes.
bool awaits_answer(const CmMessage& m) {
  return std::holds_alternative<ReqMessage>(m) || std::holds_alternative<RepMessage>(m) ||
         std::holds_alternative<DreqMessage>(m) || std::holds_alternative<SidrReqMessage>(m);
}

}  // namespace

void CmService::gsi_sink(const engine::GsiMad& mad) {
  CmService& s = get();
  // What only reports an event is handled here, in its place among the data
  // (an RTU's ESTABLISHED before the completion of the SEND behind it), when
  // the CM is free and no MAD received before it still waits (mad_inbox.h);
  // the rest (it sends, or programs QPs) goes to the progress thread.
  auto in_place = [&s](const engine::GsiMad& m) { return s.handle_in_place(m); };
  if (s.inbox_.offer(s.mu, mad, in_place) == MadInbox::Offer::kQueued) eventfd_write(s.inbox_fd_, 1);
}

bool CmService::handle_in_place(const engine::GsiMad& g) {
  auto mad = decode_mad(g.mad);
  if (!mad) return true;  // dropped either way
  if (auto* rtu = std::get_if<RtuMessage>(&mad->message)) {
    if (CmId* id = gsi_id(rtu->remote_comm_id)) on_rtu(id);
    return true;
  }
  if (auto* drep = std::get_if<DrepMessage>(&mad->message)) {
    if (CmId* id = gsi_id(drep->remote_comm_id)) on_drep(id);
    return true;
  }
  if (auto* dreq = std::get_if<DreqMessage>(&mad->message)) {
    CmId* id = gsi_id(dreq->remote_comm_id);
    if (!id || (id->state != CmState::kEstablished && id->state != CmState::kRepSent)) return false;
    on_dreq(id, mad->transaction_id, *dreq);  // DISCONNECTED; the DREP comes with rdma_disconnect
    return true;
  }
  return false;
}

void CmService::drain_inbox() {
  eventfd_t v;
  eventfd_read(inbox_fd_, &v);
  inbox_.take(draining_);
  for (const engine::GsiMad& m : draining_) on_gsi_mad(m);
  draining_.clear();
}

CmId* CmService::gsi_id(uint32_t local_comm_id) {
  auto it = gsi_ids_.find(local_comm_id);
  return it == gsi_ids_.end() ? nullptr : it->second;
}

void CmService::on_gsi_mad(const engine::GsiMad& g) {
  auto mad = decode_mad(g.mad);
  if (!mad) return;
  const uint64_t tid = mad->transaction_id;
  struct Dispatch {
    CmService* s;
    const engine::GsiMad& g;
    uint64_t tid;
    void operator()(const RepMessage& m) const {
      CmId* id = s->gsi_id(m.remote_comm_id);
      if (!id) return;
      if (id->state == CmState::kReqSent) {
        id->gsi_peer = engine::gsi_reply_endpoint(g.src);
        // A uroce peer answers from its engine's private port: its data goes there too.
        if (g.src.port && g.src.port < wire::kRoceSourcePortMin) id->conn.remote_lid = g.src.port;
        s->on_rep(id, m);
      } else if (id->state == CmState::kEstablished && id->conn.remote_comm_id == m.local_comm_id) {
        // Our RTU was lost: the REP came again.
        RtuMessage rtu;
        rtu.local_comm_id = id->conn.local_comm_id;
        rtu.remote_comm_id = id->conn.remote_comm_id;
        (void)s->send_mad(id, rtu, id->conn.transaction_id);
      }
    }
    void operator()(const RejMessage& m) const {
      if (CmId* id = s->gsi_id(m.remote_comm_id)) s->on_gsi_rej(id, m);
    }
    void operator()(const RtuMessage& m) const {
      if (CmId* id = s->gsi_id(m.remote_comm_id)) s->on_rtu(id);
    }
    void operator()(const DreqMessage& m) const {
      CmId* id = s->gsi_id(m.remote_comm_id);
      DrepMessage drep;
      drep.local_comm_id = m.remote_comm_id;
      drep.remote_comm_id = m.local_comm_id;
      if (id && id->state != CmState::kTimewait && id->state != CmState::kClosed) {
        s->on_dreq(id, tid, m);
      } else {
        // Gone, or our DREP was lost: the IB CM answers a DREQ it cannot
        // place with a DREP.
        const transport::Endpoint to = engine::gsi_reply_endpoint(g.src);
        const Mad mad = encode_mad(tid, drep);
        s->recent_dreps_.remember(g.dst_ip, to, mad, Clock::now());
        s->send_gsi_from(g.dst_ip, to, mad);
      }
    }
    void operator()(const DrepMessage& m) const {
      if (CmId* id = s->gsi_id(m.remote_comm_id)) s->on_drep(id);
    }
    void operator()(const SidrRepMessage& m) const {
      CmId* id = s->gsi_id(m.request_id);
      if (!id || id->state != CmState::kSidrReqSent) return;
      if (m.status == SidrStatus::kSidUnsupported && s->retry_refused(id)) return;
      // As a REP: a uroce peer's QP is served at its engine's private port.
      if (g.src.port && g.src.port < wire::kRoceSourcePortMin) id->conn.remote_lid = g.src.port;
      s->on_sidr_rep(id, m);
    }
    // Requests come through a listener's socket; the rest is not for an id.
    void operator()(const ReqMessage&) const {}
    void operator()(const SidrReqMessage&) const {}
  };
  std::visit(Dispatch{this, g, tid}, mad->message);
}

void CmService::on_gsi_rej(CmId* id, const RejMessage& rej) {
  if (id->state == CmState::kReqSent && rej.reason == uint16_t(RejReason::kInvalidServiceId) && retry_refused(id))
    return;
  on_rej(id, rej);
}

bool CmService::retry_refused(CmId* id) {
  // Nobody listens yet: within the grace period, the request goes again
  // (on_timer), and a listener that has appeared since takes it.
  if (Clock::now() >= id->refused_grace_end) return false;
  leave_gsi(id);
  arm_timer(id, TimerKind::kRequestRetry, kRequestRetryMs);
  return true;
}

void CmService::on_port_ready(CmId* id) {
  for (int i = 0; i < kRequestBurst && id->sock >= 0; ++i) {
    uint8_t buf[engine::kGsiEnvelopeBytes + 1];
    sockaddr_storage from{};
    socklen_t len = sizeof from;
    ssize_t n = recvfrom(id->sock, buf, sizeof buf, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &len);
    if (n < 0) return;
    IpEndpoint sender;
    auto g = engine::decode_gsi_envelope(std::span<const uint8_t>(buf, size_t(n)));
    if (!endpoint_of(from, &sender) || !from_this_host(sender.ip) || !g) {
      log_limited(core::LogLevel::kWarn, "rdma_cm: dropping a datagram at port %u that no engine of this host sent",
                  id->src_port);
      continue;
    }
    auto mad = decode_mad(g->mad);
    if (!mad) continue;
    // An id that does not listen refuses it (on_req, on_sidr_req).
    RequestOrigin o{id, g->dst_ip, g->src.ip, engine::gsi_reply_endpoint(g->src)};
    if (auto* req = std::get_if<ReqMessage>(&mad->message)) {
      if (!answer_duplicate(o, req->local_comm_id)) on_req(o, mad->transaction_id, *req);
    } else if (auto* sreq = std::get_if<SidrReqMessage>(&mad->message)) {
      if (!answer_duplicate(o, sreq->request_id)) on_sidr_req(o, mad->transaction_id, *sreq);
    }
  }
}

bool CmService::answer_duplicate(const RequestOrigin& from, uint32_t remote_comm_id) {
  for (auto& [comm_id, id] : gsi_ids_) {
    if (id->conn.remote_comm_id != remote_comm_id || id->dst_ip.bytes != from.peer_ip.bytes) continue;
    // A REQ resent before our REP arrived: the REP again (a SIDR_REP, a REJ,
    // or nothing while the application has not answered).
    if (auto answer = duplicate_answer(id)) send_gsi_from(from.local_ip, from.gsi_reply, *answer);
    return true;
  }
  // The id is gone (request_memory.h): what it last answered, not a new request.
  if (auto answer = request_memory_.find(remote_comm_id, from.peer_ip, Clock::now())) {
    send_gsi_from(from.local_ip, from.gsi_reply, *answer);
    return true;
  }
  return false;
}

std::optional<Mad> CmService::duplicate_answer(const CmId* id) const {
  if (!id->from_request) return std::nullopt;
  if (id->state == CmState::kRepSent) return id->last_request;
  if (id->state == CmState::kClosed || id->state == CmState::kTimewait) return gone_answer(id);
  return std::nullopt;  // not answered yet (as the kernel's CM in REQ_RCVD), or connected
}

std::optional<Mad> CmService::gone_answer(const CmId* id) const {
  const uint16_t last = attribute_of(id->last_request);
  if (id->abi.qp_type == IBV_QPT_UD)
    return last == uint16_t(CmAttr::kSidrRep) ? std::optional<Mad>(id->last_request) : std::nullopt;
  if (last == uint16_t(CmAttr::kRej)) return id->last_request;
  return stale_connection_rej(id->conn.transaction_id, id->conn.local_comm_id, id->conn.remote_comm_id);
}

void CmService::remember_answer(const CmId* id) {
  // Destroyed: whatever state it was left in, its connection is over.
  if (!id->from_request || !id->conn.remote_comm_id) return;
  if (auto answer = gone_answer(id))
    request_memory_.remember(id->conn.remote_comm_id, id->dst_ip, *answer, Clock::now());
}

void CmService::go_over_gsi(CmId* id, const transport::Endpoint& peer) {
  id->over_gsi = true;
  id->gsi_peer = peer;
  gsi_ids_[id->conn.local_comm_id] = id;
  static std::once_flag hook;
  std::call_once(hook, [] { std::atexit([] { get().abandon_at_exit(); }); });
}

void CmService::abandon_at_exit() {
  // The exiting thread may race the progress thread (or an application
  // thread) for the mutex; nothing is sent if it stays taken (as a kill).
  std::unique_lock lock(mu, std::defer_lock);
  for (int i = 0; i < kExitLockWaitMs && !lock.try_lock(); ++i) usleep(1000);
  if (!lock.owns_lock()) return;
  for (const auto& [comm_id, id] : gsi_ids_) {
    if (id->destroying || id->state == CmState::kListen) continue;
    abandon(id);  // DREQ, DREP or REJ, by its state
    id->state = CmState::kClosed;
  }
  // Nobody will answer a DREQ resent after this: its DREP goes again now.
  recent_dreps_.resend(Clock::now(), [this](const RecentDreps::Sent& d) { send_gsi_from(d.local_ip, d.peer, d.mad); });
}

void CmService::leave_gsi(CmId* id) {
  cancel_resend(id);
  if (auto it = gsi_ids_.find(id->conn.local_comm_id); it != gsi_ids_.end() && it->second == id) gsi_ids_.erase(it);
  id->over_gsi = false;
}

void CmService::request_over_gsi(CmId* id) {
  go_over_gsi(id, transport::Endpoint{id->dst_ip, core::config().udp_port});
  if (id->state == CmState::kSidrReqSent) {
    send_sidr_req(id);
    arm_timer(id, TimerKind::kSidr, kSidrTimeoutMs);
  } else {
    send_req(id);  // arms the REP timer
  }
}

int CmService::send_mad(CmId* id, const CmMessage& m, uint64_t tid) {
  if (!id->over_gsi) return ENOTCONN;
  if (!id->port.device) return ENODEV;
  Mad mad = encode_mad(tid, m);
  // A REJ or SIDR_REP is kept too: a copy of the peer's request gets it again.
  if (awaits_answer(m) || std::holds_alternative<SidrRepMessage>(m) || std::holds_alternative<RejMessage>(m))
    id->last_request = mad;
  if (awaits_answer(m)) arm_resend(id, kFirstResendMs);
  if (std::holds_alternative<DrepMessage>(m)) recent_dreps_.remember(id->src_ip, id->gsi_peer, mad, Clock::now());
  return engine::gsi_send(id->port.device->verbs, id->gsi_peer, id->src_ip, mad);
}

void CmService::send_gsi_from(const transport::IpAddress& local_ip, const transport::Endpoint& to, const CmMessage& m,
                              uint64_t tid) {
  send_gsi_from(local_ip, to, encode_mad(tid, m));
}

void CmService::send_gsi_from(const transport::IpAddress& local_ip, const transport::Endpoint& to, const Mad& mad) {
  auto dp = device_for_ip(local_ip);
  if (dp.ok()) (void)engine::gsi_send(dp->device->verbs, to, local_ip, mad);
}

bool CmService::peer_process_gone(const CmId* id) const {
  const transport::Endpoint& peer = id->gsi_peer;
  const unsigned slot = engine::comm_id_slot(id->conn.remote_comm_id);
  if (!id->port.device || slot == 0 || peer.port == 0 || peer.port >= wire::kRoceSourcePortMin) return false;
  if (!from_this_host(peer.ip)) return false;  // another host's engine: its registry is not ours
  return !engine::gsi_engine_alive(id->port.device->verbs, slot, peer.port);
}

void CmService::check_peers(Clock::time_point now) {
  if (now < next_peer_check_) return;
  next_peer_check_ = now + std::chrono::milliseconds(kPeerCheckMs);
  std::vector<CmId*> gone;
  for (const auto& [comm_id, id] : gsi_ids_) {
    switch (id->state) {
      case CmState::kReqRcvd:
      case CmState::kRepSent:
      case CmState::kRepRcvd:
      case CmState::kEstablished:
      case CmState::kDreqSent:
        if (peer_process_gone(id)) gone.push_back(id);
        break;
      default:
        break;
    }
  }
  for (CmId* id : gone) {
    LOG_INFO("rdma_cm: id %llu: the peer's process on this host is gone", (unsigned long long)id->serial);
    peer_gone(id, ECONNRESET);
  }
}

void CmService::resend_last(CmId* id) {
  (void)engine::gsi_send(id->port.device->verbs, id->gsi_peer, id->src_ip, id->last_request);
}

void CmService::arm_resend(CmId* id, int ms) {
  cancel_resend(id);
  id->resend_ms = ms;
  id->resend_timer = timers_.emplace(Clock::now() + std::chrono::milliseconds(ms), TimerEntry{id, TimerKind::kResend});
  ensure_thread();
  wake();
}

void CmService::cancel_resend(CmId* id) {
  if (!id->resend_timer) return;
  timers_.erase(*id->resend_timer);
  id->resend_timer.reset();
}

void CmService::on_resend(CmId* id) {
  const uint16_t attr = attribute_of(id->last_request);
  const bool waiting = (id->state == CmState::kReqSent && attr == uint16_t(CmAttr::kReq)) ||
                       (id->state == CmState::kRepSent && attr == uint16_t(CmAttr::kRep)) ||
                       (id->state == CmState::kDreqSent && attr == uint16_t(CmAttr::kDreq)) ||
                       (id->state == CmState::kSidrReqSent && attr == uint16_t(CmAttr::kSidrReq));
  if (!id->over_gsi || !waiting || !id->port.device) return;
  resend_last(id);
  arm_resend(id, std::min(2 * id->resend_ms, kMaxResendMs));
}

}  // namespace uroce::rdmacm
