// uroce C++ API: the RDMA connection manager (librdmacm).
//
//   server                                          client
//   auto ch = EventChannel::create();               auto ch = EventChannel::create();
//   auto listener = CmId::create(*ch);              auto id = CmId::create(*ch);
//   listener->bind("127.0.0.1", port);              id->resolve("127.0.0.1", port, 2s);
//   listener->listen();                             ... PD, CQ from id->context()
//   auto req = listener->get_request(5s);           id->create_qp(pd, cq, cq);
//   ... PD, CQ from req->id.context()               id->connect(ConnParam::with(hello));
//   req->id.create_qp(pd, cq, cq);                  auto est = id->wait_established(5s);
//   req->id.accept(ConnParam::with(reply));         est->private_as<Reply>()
//   req->id.wait_established(5s);
//
// Events are acknowledged as soon as they are read (a CmEvent is a value that owns a copy
// of the private data). The wait helpers read the id's event channel and expect the next
// event to concern this id: give each concurrently progressing connection its own channel
// (CmId::migrate) or read EventChannel::next() yourself.
#pragma once

#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "uroce/cq.hpp"
#include "uroce/device.hpp"
#include "uroce/handle.hpp"
#include "uroce/qp.hpp"
#include "uroce/result.hpp"

namespace uroce {

inline std::string_view to_string(rdma_cm_event_type type) noexcept { return ::rdma_event_str(type); }

// One connection manager event, already acknowledged.
struct CmEvent {
  rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_ERROR;
  int status = 0;
  rdma_cm_id* id = nullptr;             // for CONNECT_REQUEST: the new id (see CmId::get_request)
  rdma_cm_id* listen_id = nullptr;      // for CONNECT_REQUEST: the listener
  std::vector<std::byte> private_data;  // the peer's (IB CM pads it: 56 bytes on REQ, 196 on REP)
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;

  // The start of the private data as a T, if there are at least sizeof(T) bytes.
  template <class T>
  requires std::is_trivially_copyable_v<T> std::optional<T> private_as()
  const {
    if (private_data.size() < sizeof(T)) return std::nullopt;
    T value;
    std::memcpy(&value, private_data.data(), sizeof(T));
    return value;
  }
};

// Parameters of connect/accept; private_data is referenced, not copied (keep it alive
// until the call returns). At most 56 bytes on connect, 196 on accept.
struct ConnParam {
  std::span<const std::byte> private_data;
  std::uint8_t responder_resources = 1;
  std::uint8_t initiator_depth = 1;
  std::uint8_t retry_count = 7;
  std::uint8_t rnr_retry_count = 7;

  template <class T>
  requires std::is_trivially_copyable_v<T>
  static ConnParam with(const T& data) noexcept {
    ConnParam p;
    p.private_data = std::as_bytes(std::span<const T, 1>(&data, 1));
    return p;
  }
  rdma_conn_param to_raw() const noexcept {
    rdma_conn_param raw{};
    raw.private_data = private_data.empty() ? nullptr : private_data.data();
    raw.private_data_len = std::uint8_t(private_data.size());
    raw.responder_resources = responder_resources;
    raw.initiator_depth = initiator_depth;
    raw.retry_count = retry_count;
    raw.rnr_retry_count = rnr_retry_count;
    return raw;
  }
};

// An rdma_cm event channel (its fd can be polled).
class EventChannel {
 public:
  static Result<EventChannel> create() {
    errno = 0;
    rdma_event_channel* raw = ::rdma_create_event_channel();
    if (raw == nullptr) return Error::from_errno(last_errno(), "rdma_create_event_channel");
    return EventChannel(raw);
  }

  rdma_event_channel* raw() const noexcept { return handle_.get(); }
  int fd() const noexcept { return raw()->fd; }

  // The next event within `timeout` (ETIMEDOUT), acknowledged.
  Result<CmEvent> next(Milliseconds timeout) const {
    pollfd p{fd(), POLLIN, 0};
    int n = ::poll(&p, 1, int(timeout.count()));
    if (n < 0) return Error::from_errno(errno, "poll(rdma_cm event channel)");
    if (n == 0) return Error(ETIMEDOUT, "no rdma_cm event within " + std::to_string(timeout.count()) + " ms");
    rdma_cm_event* raw_event = nullptr;
    if (::rdma_get_cm_event(raw(), &raw_event) != 0) return Error::from_errno(last_errno(), "rdma_get_cm_event");
    CmEvent event;
    event.type = raw_event->event;
    event.status = raw_event->status;
    event.id = raw_event->id;
    event.listen_id = raw_event->listen_id;
    const rdma_conn_param& conn = raw_event->param.conn;
    bool carries_data = event.type == RDMA_CM_EVENT_CONNECT_REQUEST || event.type == RDMA_CM_EVENT_CONNECT_RESPONSE ||
                        event.type == RDMA_CM_EVENT_ESTABLISHED || event.type == RDMA_CM_EVENT_REJECTED;
    if (carries_data && conn.private_data != nullptr && conn.private_data_len > 0) {
      auto* data = static_cast<const std::byte*>(conn.private_data);
      event.private_data.assign(data, data + conn.private_data_len);
    }
    event.responder_resources = conn.responder_resources;
    event.initiator_depth = conn.initiator_depth;
    ::rdma_ack_cm_event(raw_event);
    return event;
  }

 private:
  struct Release {
    void operator()(rdma_event_channel* c) const noexcept { ::rdma_destroy_event_channel(c); }
  };
  explicit EventChannel(rdma_event_channel* raw) noexcept : handle_(raw) {}

  detail::Handle<rdma_event_channel, Release> handle_;
};

struct ConnectRequest;

// An rdma_cm id, and the QP created on it. Destroying it destroys the QP, then the id.
class CmId {
 public:
  static Result<CmId> create(const EventChannel& channel, rdma_port_space port_space = RDMA_PS_TCP) {
    rdma_cm_id* raw = nullptr;
    if (auto s = status_from_rc(::rdma_create_id(channel.raw(), &raw, nullptr, port_space), "rdma_create_id"); !s)
      return std::move(s).error();
    return CmId(raw, &channel);
  }

  // Takes ownership of an id the caller got from the C API (e.g. EventChannel::next()'s
  // CONNECT_REQUEST event); its events arrive on `channel`.
  static CmId adopt(rdma_cm_id* raw, const EventChannel& channel) noexcept { return CmId(raw, &channel); }

  CmId(CmId&& other) noexcept
      : raw_(std::exchange(other.raw_, nullptr)), channel_(other.channel_), qp_(std::move(other.qp_)) {}
  CmId& operator=(CmId&& other) noexcept {
    if (this != &other) {
      destroy();
      raw_ = std::exchange(other.raw_, nullptr);
      channel_ = other.channel_;
      qp_ = std::move(other.qp_);
    }
    return *this;
  }
  CmId(const CmId&) = delete;
  CmId& operator=(const CmId&) = delete;
  ~CmId() { destroy(); }

  rdma_cm_id* raw() const noexcept { return raw_; }
  // The device the id is bound to (after bind to a local address, resolve, or on a
  // request); ENODEV before.
  Result<Context> context() const {
    if (raw_->verbs == nullptr) return Error(ENODEV, "CmId::context: the id is not bound to a device yet");
    return Context::borrow(raw_->verbs);
  }
  std::uint16_t local_port() const noexcept { return ntohs(::rdma_get_src_port(raw_)); }

  Status bind(const std::string& host, std::uint16_t port) const {
    auto addr = resolve_ip(host, port);
    if (!addr) return std::move(addr).error();
    return status_from_rc(::rdma_bind_addr(raw_, reinterpret_cast<sockaddr*>(&*addr)), "rdma_bind_addr");
  }
  Status listen(int backlog = 16) const { return status_from_rc(::rdma_listen(raw_, backlog), "rdma_listen"); }

  // Resolves the address and the route of host:port, waiting for both events.
  Status resolve(const std::string& host, std::uint16_t port, Milliseconds timeout) const {
    auto addr = resolve_ip(host, port);
    if (!addr) return std::move(addr).error();
    int ms = int(timeout.count());
    if (auto s = status_from_rc(::rdma_resolve_addr(raw_, nullptr, reinterpret_cast<sockaddr*>(&*addr), ms),
                                "rdma_resolve_addr");
        !s)
      return s;
    if (auto e = wait_event(RDMA_CM_EVENT_ADDR_RESOLVED, timeout); !e) return std::move(e).error();
    if (auto s = status_from_rc(::rdma_resolve_route(raw_, ms), "rdma_resolve_route"); !s) return s;
    if (auto e = wait_event(RDMA_CM_EVENT_ROUTE_RESOLVED, timeout); !e) return std::move(e).error();
    return {};
  }

  // Creates the id's QP (rdma_create_qp; the CM moves it through its states).
  Status create_qp(const ProtectionDomain& pd, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                   const QpOptions& options = {}, QpType type = QpType::kRc) {
    if (qp_) return Error(EEXIST, "CmId::create_qp: the id already has a QP");
    ibv_qp_init_attr init = QueuePair::init_attr(type, send_cq, recv_cq, options);
    if (auto s = status_from_rc(::rdma_create_qp(raw_, pd.raw(), &init), "rdma_create_qp"); !s) return s;
    qp_ = std::make_unique<QueuePair>(QueuePair::borrow(raw_->qp));
    return {};
  }
  bool has_qp() const noexcept { return qp_ != nullptr; }
  // The QP made by create_qp (precondition, checked: has_qp()).
  const QueuePair& qp() const {
    if (!qp_) detail::die("CmId::qp(): no QP was created on this id");
    return *qp_;
  }

  Status connect(const ConnParam& param = {}) const {
    rdma_conn_param raw = param.to_raw();
    return status_from_rc(::rdma_connect(raw_, &raw), "rdma_connect");
  }
  Status accept(const ConnParam& param = {}) const {
    rdma_conn_param raw = param.to_raw();
    return status_from_rc(::rdma_accept(raw_, &raw), "rdma_accept");
  }
  Status reject(std::span<const std::byte> private_data = {}) const {
    return status_from_rc(
        ::rdma_reject(raw_, private_data.empty() ? nullptr : private_data.data(), std::uint8_t(private_data.size())),
        "rdma_reject");
  }
  Status disconnect() const { return status_from_rc(::rdma_disconnect(raw_), "rdma_disconnect"); }
  // Moves the id (and the events to come for it) to another channel.
  Status migrate(const EventChannel& channel) {
    if (auto s = status_from_rc(::rdma_migrate_id(raw_, channel.raw()), "rdma_migrate_id"); !s) return s;
    channel_ = &channel;
    return {};
  }

  // The next event of the id's channel, which must be of type `expected` and concern this
  // id. A REJECTED event gives ECONNREFUSED (read EventChannel::next() yourself to see a
  // rejection's private data), UNREACHABLE / *_ERROR EHOSTUNREACH, DISCONNECTED
  // ECONNRESET, nothing at all ETIMEDOUT, anything else EPROTO. A connection request that
  // arrives instead is rejected (its id destroyed) rather than leaked.
  Result<CmEvent> wait_event(rdma_cm_event_type expected, Milliseconds timeout) const {
    auto event = channel_->next(timeout);
    if (!event) return event;
    if (event->type == expected && (event->id == raw_ || event->listen_id == raw_)) return event;
    std::string what = "expected rdma_cm event " + std::string(to_string(expected)) + ", got " +
                       std::string(to_string(event->type)) + " (status " + std::to_string(event->status) + ")";
    if (event->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
      CmId unwanted(event->id, channel_);  // destroying it rejects the request
      return Error(EPROTO, what + "; the request was rejected");
    }
    if (event->type == expected) return Error(EPROTO, what + " for another id");
    switch (event->type) {
      case RDMA_CM_EVENT_REJECTED:
        return Error(ECONNREFUSED, what);
      case RDMA_CM_EVENT_ADDR_ERROR:
      case RDMA_CM_EVENT_ROUTE_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
      case RDMA_CM_EVENT_CONNECT_ERROR:
        return Error(EHOSTUNREACH, what);
      case RDMA_CM_EVENT_DISCONNECTED:
        return Error(ECONNRESET, what);
      default:
        return Error(EPROTO, what);
    }
  }
  Result<CmEvent> wait_established(Milliseconds timeout) const {
    return wait_event(RDMA_CM_EVENT_ESTABLISHED, timeout);
  }
  Result<CmEvent> wait_disconnected(Milliseconds timeout) const {
    return wait_event(RDMA_CM_EVENT_DISCONNECTED, timeout);
  }
  // Listener: the next connection request; the request's new id shares this channel.
  Result<ConnectRequest> get_request(Milliseconds timeout) const;

 private:
  CmId(rdma_cm_id* raw, const EventChannel* channel) noexcept : raw_(raw), channel_(channel) {}
  void destroy() noexcept {
    if (raw_ == nullptr) return;
    if (qp_) {
      qp_.reset();
      ::rdma_destroy_qp(raw_);
    }
    ::rdma_destroy_id(std::exchange(raw_, nullptr));
  }
  static Result<sockaddr_storage> resolve_ip(const std::string& host, std::uint16_t port) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = host.empty() ? AI_PASSIVE : 0;
    addrinfo* list = nullptr;
    std::string service = std::to_string(port);
    int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &list);
    if (rc != 0) return Error(EHOSTUNREACH, "getaddrinfo(" + host + "): " + ::gai_strerror(rc));
    sockaddr_storage out{};
    std::memcpy(&out, list->ai_addr, list->ai_addrlen);
    ::freeaddrinfo(list);
    return out;
  }

  friend struct ConnectRequest;
  rdma_cm_id* raw_ = nullptr;
  const EventChannel* channel_ = nullptr;
  std::unique_ptr<QueuePair> qp_;  // a view: the id owns the QP
};

// A connection request: the new id (owned; accept or reject it) and the event with the
// peer's private data.
struct ConnectRequest {
  CmId id;
  CmEvent event;
};

inline Result<ConnectRequest> CmId::get_request(Milliseconds timeout) const {
  auto event = wait_event(RDMA_CM_EVENT_CONNECT_REQUEST, timeout);
  if (!event) return std::move(event).error();
  return ConnectRequest{CmId(event->id, channel_), std::move(*event)};
}

}  // namespace uroce
