// The process's connection manager: every rdma_cm id, the CM state machines
// and their timers, and the CM's MADs over QP1 (engine/gsi.h, design §6).
//
// Threads: application threads call in through the exported rdma_* functions
// and run the state machines directly (send a REQ, program a QP, queue an
// event) under `mu`. One progress thread, started on first use, waits in
// epoll for the ids' port sockets, the engines' MADs and the timers and runs
// the same state machines, also under `mu`; an engine's receiving thread
// handles an RTU, DREP or DREQ in place when `mu` is free (handle_in_place).
// Nothing blocks while holding `mu` except the few verbs calls that program a
// QP (ibv_modify_qp), which never call back into the CM. Waiting
// (rdma_get_cm_event, rdma_destroy_id, synchronous ids) happens outside the
// mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/config.h"
#include "engine/gsi.h"
#include "rdmacm/cm_id.h"
#include "rdmacm/cm_messages.h"
#include "rdmacm/event_channel.h"
#include "rdmacm/log_limiter.h"
#include "rdmacm/mad_inbox.h"
#include "rdmacm/neighbour.h"
#include "rdmacm/recent_dreps.h"
#include "rdmacm/request_memory.h"

namespace uroce::rdmacm {

// IB CM values uroce puts in its messages (those of the Linux CM).
constexpr uint8_t kCmResponseTimeout = 20;  // 4.096 us * 2^20 = 4.3 s
constexpr uint8_t kMaxCmRetries = 15;
// Local ACK timeout of CM-programmed QPs unless RDMA_OPTION_ID_ACK_TIMEOUT
// says otherwise: 14 (67 ms), what perftest and most verbs programs use. The
// kernel's RoCE default (about 0.5 s) would only slow down the detection of a
// dead peer, since uroce recovers lost packets with tail-loss probes.
constexpr uint8_t kDefaultAckTimeout = 14;
constexpr uint8_t kHopLimit = 64;  // IPv4 TTL of the path

// A resource count of rdma_conn_param (responder_resources, initiator_depth)
// that rdma_connect and rdma_accept take: at most the device's, or 0xFF for
// "the device maximum".
inline bool conn_resource_valid(uint8_t v, uint8_t max) { return v == RDMA_MAX_RESP_RES || v <= max; }

// uroce's CM timers: how long a side waits for the other's CM (application)
// to answer, its messages being resent meanwhile (kFirstResendMs).
// SIDR_REQ -> SIDR_REP: as long as the kernel's rdma_cm waits (cma_resolve_ib_udp: 4096 ms
// a try, 1 << (CMA_CM_RESPONSE_TIMEOUT - 8), and CMA_MAX_CM_RETRIES = 15 retries), so that
// a resolution survives the losses the kernel's does (interop.lossy_cm_udaddy: with 5 s,
// four copies of one SIDR_REQ could all be lost).
constexpr int kSidrTimeoutMs = 16 * 4096;
constexpr int kRepTimeoutMs = 60000;  // REQ -> REP and REP -> RTU (the kernel's MRA allows ~68 s)
constexpr int kDreqTimeoutMs = 4000;  // DREQ -> DREP, then DISCONNECTED with -ETIMEDOUT
constexpr int kTimewaitMs = 500;      // DISCONNECTED -> TIMEWAIT_EXIT (the kernel's RoCE ~0.5 s)
// rdma_connect sends its REQ (or SIDR_REQ) again, every kRequestRetryMs, when
// it is rejected for want of a listener ("invalid service ID") within this
// long, before it reports REJECTED: uroce's resolution is near-instant, and
// programs written against real rdma_cm (perftest -R re-creating its
// listener between its two connections) rely on the slack that ARP/route
// resolution gives a listener to appear.
constexpr int kRefusedGraceMs = 500;
constexpr int kRequestRetryMs = 10;

// A listener takes at most `backlog` connection requests that the application
// has not yet retrieved (rdma_listen's backlog if in 1..kMaxBacklog, else
// kMaxBacklog: the kernel's ucma and its net.rdma_ucm.max_backlog default).
// Beyond, a REQ is dropped and counted, and the peer's CM sends it again (the
// kernel's CM drops it too: "do not reject to allow future retries"). A flood
// of requests cannot grow the process's ids.
constexpr int kMaxBacklog = 1024;
// Resending: the REQ, REP, DREQ or SIDR_REQ waiting for its answer goes again
// after this, doubling up to the maximum, until the answer comes or the
// state's own timer ends the wait.
constexpr int kFirstResendMs = 500;
constexpr int kMaxResendMs = 4000;
// How often the CM looks whether the peers of its connections on this host
// are still alive (engine::gsi_engine_alive). A process's end is what tells
// the kernel's CM to send its DREQs (or REJs); a uroce process that dies
// sends nothing, so its peer's CM notices the slot it held go free.
constexpr int kPeerCheckMs = 200;
// How long the exit handler waits for the CM's mutex before it gives up.
constexpr int kExitLockWaitMs = 200;
// rdma_resolve_addr looks at the next hop's neighbour entry after
// this, the interval doubling up to the maximum until the entry is valid or
// the timeout has passed: on a LAN an ARP/NDP answer takes well under a
// millisecond, and a long wait costs a few netlink queries per second.
constexpr int kNeighbourFirstPollMs = 1;
constexpr int kNeighbourMaxPollMs = 16;
// Datagrams an id's port socket is read for per wake-up (level-triggered).
constexpr int kRequestBurst = 64;
// MADs the engines may queue for the progress thread; beyond, they are
// dropped (the peer's CM resends).
constexpr size_t kMaxInbox = 256;

// Where a connection request came from: the id whose port it names (a
// listener, or else it is refused), and the addresses of its datagram.
struct RequestOrigin {
  CmId* listener = nullptr;
  transport::IpAddress local_ip;  // the address the request was sent to
  transport::IpAddress peer_ip;   // its sender (a link-local one with its interface)
  transport::Endpoint gsi_reply;  // where the peer's CM is answered
};

// A random 24-bit starting PSN, as the IB CM chooses them.
uint32_t new_psn();

// Fields of an event's param.conn / param.ud beyond type and status.
struct EventParams {
  const uint8_t* private_data = nullptr;
  size_t private_data_len = 0;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t flow_control = 0;
  uint8_t retry_count = 0;
  uint8_t rnr_retry_count = 0;
  uint8_t srq = 0;
  uint32_t qp_num = 0;
  // UD events
  bool ud = false;
  ibv_ah_attr ah_attr{};
  uint32_t qkey = 0;
  void* ud_context = nullptr;  // MULTICAST_JOIN: the join's context, as param.ud.private_data
};

// Leaves every multicast group of `id` (multicast_api.cc; mutex held).
void leave_all_multicast(CmId* id);

class CmService {
 public:
  static CmService& get();  // created on first use, never destroyed

  std::mutex mu;
  std::condition_variable acked;  // an event was acknowledged

  // ---- ids (callers hold mu) ----
  CmId* create_id(EventChannel* channel, bool sync, void* context, rdma_port_space ps, ibv_qp_type qp_type);
  // Marks the id destroyed, sends what the IB CM sends for its state, drops
  // its undelivered events, waits for its delivered events to be
  // acknowledged, then frees it. `lock` holds mu (released while waiting).
  void destroy_id(CmId* id, std::unique_lock<std::mutex>& lock);
  // Moves the id (and its undelivered events) to another channel.
  void migrate_id(CmId* id, EventChannel* to, bool to_sync, std::unique_lock<std::mutex>& lock);

  // ---- events ----
  // Queues an event for `id` on its channel (dropped if the id is being destroyed).
  void queue_event(CmId* id, rdma_cm_event_type type, int status, const EventParams& p = {});
  // CONNECT_REQUEST: on the listener's channel, counted against the listener.
  void queue_connect_request(CmId* listener, CmId* child, const EventParams& p);
  // rdma_get_cm_event: waits (unless the fd is non-blocking) for an event.
  // Called without mu. Returns 0 or an errno.
  [[nodiscard]] int get_event(EventChannel* channel, CmEvent** out);
  // rdma_ack_cm_event. Called without mu.
  void ack_event(CmEvent* e);
  // What a synchronous id (created without a channel) does after starting an
  // operation: acknowledge its previous event, wait for the next one (kept in
  // id->event) and turn a failure status into an errno. 0 for other ids.
  // Called without mu.
  [[nodiscard]] int complete_sync(CmId* id);

  // ---- operations of the exported API (callers hold mu); return an errno ----
  [[nodiscard]] int bind(CmId* id, const sockaddr* addr);
  [[nodiscard]] int resolve_addr(CmId* id, const sockaddr* src, const sockaddr* dst, int timeout_ms);
  [[nodiscard]] int resolve_route(CmId* id, int timeout_ms);
  [[nodiscard]] int listen(CmId* id, int backlog);
  [[nodiscard]] int connect(CmId* id, const rdma_conn_param* param);
  [[nodiscard]] int accept(CmId* id, const rdma_conn_param* param);
  [[nodiscard]] int reject(CmId* id, const void* private_data, uint8_t len, RejReason reason);
  [[nodiscard]] int disconnect(CmId* id);
  [[nodiscard]] int establish(CmId* id);
  [[nodiscard]] int notify(CmId* id, ibv_event_type event);

  // ---- QP programming (qp_attrs.cc; callers hold mu) ----
  // rdma_init_qp_attr: the attributes the CM would use to move id's QP to attr->qp_state.
  [[nodiscard]] int init_qp_attr(const CmId* id, ibv_qp_attr* attr, int* mask) const;
  // Moves the attached QP INIT -> RTR -> RTS with the connection's attributes.
  [[nodiscard]] int program_qp_rts(CmId* id);
  // Moves the attached QP (if any) to ERR.
  void qp_to_error(CmId* id);

 private:
  CmService();
  void ensure_thread();
  void run();
  void wake();

  // Timers: at most one pending per id (arming replaces it).
  void arm_timer(CmId* id, TimerKind kind, int ms);
  void cancel_timer(CmId* id);
  void run_timers(Clock::time_point now);
  void on_timer(CmId* id, TimerKind kind);
  int next_timeout_ms();

  // QP1 (cm_gsi.cc): the CM's MADs.
  static void gsi_sink(const engine::GsiMad& mad);  // an engine's receiving thread: queue and wake
  void drain_inbox();
  void on_gsi_mad(const engine::GsiMad& mad);
  // An RTU, DREP, or DREQ of a connection that is up, in the engine's thread
  // (mu held): only events, nothing sent. False: for the progress thread.
  bool handle_in_place(const engine::GsiMad& mad);
  // The REQs and SIDR_REQs engines passed to the id's port socket.
  void on_port_ready(CmId* id);
  void close_port_socket(CmId* id);
  // Starts the id's conversation over QP1, with the peer's CM at `peer`.
  void go_over_gsi(CmId* id, const transport::Endpoint& peer);
  // Sends a message to the id's peer CM (ENOTCONN: it has none yet).
  [[nodiscard]] int send_mad(CmId* id, const CmMessage& m, uint64_t tid);
  // Sends a MAD from QP1 of the engine serving `local_ip` (no id: answers).
  void send_gsi_from(const transport::IpAddress& local_ip, const transport::Endpoint& to, const CmMessage& m,
                     uint64_t tid);
  void send_gsi_from(const transport::IpAddress& local_ip, const transport::Endpoint& to, const Mad& mad);
  // Sends the id's last REQ / REP / DREQ / SIDR_REQ (or SIDR_REP) again.
  void resend_last(CmId* id);
  void arm_resend(CmId* id, int ms);
  void cancel_resend(CmId* id);
  void on_resend(CmId* id);
  CmId* gsi_id(uint32_t local_comm_id);
  void leave_gsi(CmId* id);
  // Every kPeerCheckMs while ids are over QP1: a peer on this host whose
  // process is gone is lost (peer_gone): DISCONNECTED, or UNREACHABLE
  // mid-handshake.
  void check_peers(Clock::time_point now);
  // At process exit (an atexit handler, registered with the first id over
  // QP1): every connection still open is ended with what the IB CM sends
  // when an id is destroyed (DREQ, DREP, REJ), as the kernel does when a
  // process's rdma_cm file closes; and the DREPs of the last seconds go
  // once more (recent_dreps.h).
  void abandon_at_exit();
  bool peer_process_gone(const CmId* id) const;
  // The REQ or SIDR_REQ of `id` to QP1 of the destination's host.
  void request_over_gsi(CmId* id);
  void on_gsi_rej(CmId* id, const RejMessage& rej);
  // A request refused for want of a listener within rdma_connect's grace
  // period: sent again after kRequestRetryMs (true).
  bool retry_refused(CmId* id);
  // A request resent by its peer's CM, for a live id or one destroyed since
  // (request_memory_): answered again if it was; true if it is one.
  bool answer_duplicate(const RequestOrigin& from, uint32_t remote_comm_id);
  // What a copy of the request that made `id` gets while `id` lives (nothing:
  // the application has not answered, or the connection is up).
  std::optional<Mad> duplicate_answer(const CmId* id) const;
  // A passive id over QP1 that is destroyed: its answer is kept for copies.
  void remember_answer(const CmId* id);
  // The answer to a copy of the request of `id`, whose connection is over:
  // its REJ or SIDR_REP again, else REJ "stale connection".
  std::optional<Mad> gone_answer(const CmId* id) const;

  // A line about something a peer did: rate-limited (LogLimiter).
  void log_limited(core::LogLevel level, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

  // Address helpers (cm_address.cc).
  [[nodiscard]] int attach_device(CmId* id, const transport::IpAddress& ip);
  void set_route_addresses(CmId* id);
  void fill_path_record(CmId* id);
  // The id's port socket at `ip`:`port` (0: one the kernel picks).
  [[nodiscard]] int open_bound_socket(CmId* id, const transport::IpAddress& ip, uint16_t port);

  void finish_resolve(CmId* id, int err);
  // ADDR_RESOLVED once the route's next hop has a valid neighbour entry, at
  // once for a local destination or an interface without neighbours;
  // ADDR_ERROR -ETIMEDOUT if it has none by the id's timeout (the kernel's
  // rdma_resolve_addr for RoCE).
  void wait_for_neighbour(CmId* id, const neighbour::NextHop& hop);
  void poll_neighbour(CmId* id);

  // Active side (cm_active.cc).
  void send_req(CmId* id);
  void on_rep(CmId* id, const RepMessage& rep);
  void on_rej(CmId* id, const RejMessage& rej);

  // Passive side (cm_passive.cc).
  void on_req(const RequestOrigin& from, uint64_t tid, const ReqMessage& req);
  // The listener's backlog is full (kMaxBacklog): a REQ is dropped (and counted).
  bool backlog_full(const CmId* listener);
  void on_rtu(CmId* id);
  void reject_request(const RequestOrigin& from, uint64_t tid, const ReqMessage& req, RejReason reason);
  // The answer to a request no id takes (REJ, SIDR_REP).
  void refuse_request(const RequestOrigin& from, const CmMessage& answer, uint64_t tid);
  // The new id of a request: its device, addresses and channel (null: no channel could be made).
  CmId* new_passive_id(const RequestOrigin& from, const CmaIpHeader& hdr, const DevicePort& dp);

  // Teardown (cm_teardown.cc).
  void on_dreq(CmId* id, uint64_t tid, const DreqMessage& dreq);
  void on_drep(CmId* id);
  void enter_timewait(CmId* id);
  void report_disconnected(CmId* id, int status);
  void peer_gone(CmId* id, int err);
  void abandon(CmId* id);  // the IB CM's messages for an id being destroyed

  // UD (cm_sidr.cc).
  void on_sidr_req(const RequestOrigin& from, uint64_t tid, const SidrReqMessage& req);
  void refuse_sidr(const RequestOrigin& from, uint64_t tid, const SidrReqMessage& req, SidrStatus status);
  void on_sidr_rep(CmId* id, const SidrRepMessage& rep);
  void send_sidr_req(CmId* id);
  [[nodiscard]] int accept_ud(CmId* id, const rdma_conn_param* param);
  [[nodiscard]] int reject_ud(CmId* id, const void* private_data, uint8_t len);

  // Frees an id the application never saw (its CONNECT_REQUEST undelivered).
  void free_unseen_id(CmId* id);
  void release_id(CmId* id);  // the last step of destroying an id
  // A communication ID of the engine serving `id`'s device: its host slot
  // in the top 8 bits (engine/gsi.h), so that MADs naming it find this process.
  uint32_t new_comm_id(const CmId* id);

  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  bool thread_started_ = false;
  uint64_t next_serial_ = 1;
  uint64_t next_token_ = 1;
  uint64_t next_tid_ = 0;
  uint32_t comm_id_operand_ = 0;                  // new_comm_id: random, XORed with...
  uint32_t comm_id_counter_ = 0;                  // ...a counter of the IDs made
  std::unordered_map<uint64_t, CmId*> port_ids_;  // ids with a port socket, by its epoll token
  std::unordered_map<uint32_t, CmId*> gsi_ids_;   // ids over QP1, by local communication ID
  RequestMemory request_memory_;                  // answers of passive ids since destroyed
  RecentDreps recent_dreps_;                      // sent again at exit
  // MADs the engines' sink queued for the progress thread (inbox_fd_ wakes it).
  MadInbox inbox_{kMaxInbox};
  std::vector<engine::GsiMad> draining_;  // the progress thread's: inbox_ swapped out, reused
  int inbox_fd_ = -1;
  LogLimiter log_limiter_;

  TimerMap timers_;
  neighbour::RouteNetlink netlink_;  // route and neighbour lookups of rdma_resolve_addr
  Clock::time_point next_peer_check_{};
  uint64_t requests_over_backlog_ = 0;  // REQs dropped: the listener's backlog was full
};

}  // namespace uroce::rdmacm
