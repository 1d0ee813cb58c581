#include "engine/engine_context.h"

#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/config.h"
#include "core/device.h"
#include "core/log.h"
#include "engine/ack.h"
#include "engine/ecn.h"
#include "engine/host_delivery.h"
#include "engine/roles.h"
#include "engine/xrc_target.h"
#include "host/direct_placement.h"
#include "host/host_directory.h"
#include "host/host_registry.h"
#include "host/host_relay.h"
#include "transport/capture.h"
#include "transport/envelope.h"
#include "transport/fault_injection.h"
#include "transport/shared_file.h"
#include "transport/shm_transport.h"
#include "transport/udp_transport.h"
#include "wire/headers.h"
#include "wire/psn.h"

namespace uroce::engine {

namespace {
constexpr size_t kRxBurst = 64;
constexpr uint32_t kReadBudgetPerQp = TxBatch::kMaxPackets;  // READ response packets per QP per turn: one sendmmsg

// The contexts open in this process, for the exit hook: an application that
// exits right after its last completion must not leave the ACK of the message
// unsent (its peer would retry into a process that is gone).
std::mutex& live_mu() {
  static std::mutex m;
  return m;
}
std::vector<EngineContext*>& live_contexts() {
  static auto* const v = new std::vector<EngineContext*>;  // never destroyed: a close may follow exit's destructors
  return *v;
}
// The ACKs that application turns left waiting (a process that exits right after
// polling a receive): sent, waiting for the receive turn if a thread has it, so
// that the peer does not retry a message that was delivered.
void send_acks_at_exit() {
  std::lock_guard lock(live_mu());
  for (EngineContext* e : live_contexts()) e->send_deferred_acks_now(true);
}
}  // namespace

EngineContext::EngineContext(core::Device* dev, std::unique_ptr<transport::DatagramTransport> t, bool publish)
    : core::Context(dev),
      live_(LiveCounters::open(dev->ibdev.name, t->local_port(), publish && core::config().live_stats)),
      stats(live_->port()),
      transport_(std::move(t)),
      qps_(transport_.get()) {
  set_lid(transport_->local_port());
  live_->set_paths(transport_->max_gso_segments() > 1 ? "gso" : "sendmmsg", transport_->gro() ? "gro" : "recvmmsg");
  if (auto* shm = transport::find_layer<transport::ShmTransport>(transport_.get()))
    shm->count_into(stats.same_host_out, stats.same_host_in, stats.same_host_full_drops);
  touched_.reserve(256);
  rx_.resize(kRxBurst);
}

EngineContext::~EngineContext() = default;

EngineContext* EngineContext::open(core::Device* dev) {
  transport::UdpConfig cfg;
  cfg.host_port = core::config().udp_port;
  cfg.gso = core::config().gso;
  cfg.ecn = core::config().ecn;
  std::unique_ptr<transport::DatagramTransport> t = transport::UdpTransport::open(cfg);
  if (!t) return nullptr;
  auto registry = host::HostRegistry::open(t->local_port());
  if (!registry.ok()) LOG_WARN("no host registry (%s): QPs are reachable by LID only", std::strerror(registry.err()));
  std::unique_ptr<host::HostDirectory> directory;
  if (registry.ok() && core::config().shm) t = with_same_host_path(std::move(t), **registry, &directory);
  if (!core::config().pcap.empty()) t = with_capture(std::move(t));
  if (!core::config().fault.empty()) {
    std::string error;
    auto spec = transport::FaultSpec::parse(core::config().fault, &error);
    if (!spec) {
      LOG_ERROR("UROCE_FAULT: %s", error.c_str());
      errno = EINVAL;
      return nullptr;
    }
    if (spec->any()) t = std::make_unique<transport::FaultyTransport>(std::move(t), *spec);
  }
  EngineContext* e = open_with(dev, std::move(t), false, true);
  if (!e) return nullptr;
  if (registry.ok()) e->attach_host_registry(std::move(*registry));
  e->shm_directory_ = std::move(directory);
  if (e->shm_directory_ && core::config().shm_direct && core::config().fault.empty() && !e->start_placement())
    LOG_INFO("no same-host direct placement (%s): WRITE and READ go as packets", std::strerror(errno));
  e->thread_ = std::thread([e] { e->progress_loop(); });
  return e;
}

// UROCE_PCAP: a capture of `t`'s datagrams (transport/capture.h), or `t`
// itself (with a warning) when the file cannot be made.
std::unique_ptr<transport::DatagramTransport> EngineContext::with_capture(
    std::unique_ptr<transport::DatagramTransport> t) {
  static std::atomic<unsigned> capturing{0};
  std::string path;
  const std::string& spec = core::config().pcap;
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] == '%' && i + 1 < spec.size() && (spec[i + 1] == 'p' || spec[i + 1] == 'l')) {
      path += std::to_string(spec[i + 1] == 'p' ? unsigned(getpid()) : unsigned(t->local_port()));
      ++i;
    } else {
      path += spec[i];
    }
  }
  if (capturing.fetch_add(1) > 0 && spec.find("%l") == std::string::npos) path += "-" + std::to_string(t->local_port());
  auto writer = transport::PcapWriter::open(path, core::config().pcap_limit_mb << 20);
  if (!writer) {
    LOG_WARN("UROCE_PCAP: cannot create %s (%s): no capture", path.c_str(), std::strerror(errno));
    return t;
  }
  LOG_INFO("capturing port %u into %s", t->local_port(), path.c_str());
  return std::make_unique<transport::CaptureTransport>(std::move(t), std::move(writer));
}

// The same-host path over `t` (transport/shm_transport.h), or `t` itself
// when its segment cannot be made.
std::unique_ptr<transport::DatagramTransport> EngineContext::with_same_host_path(
    std::unique_ptr<transport::DatagramTransport> t, host::HostRegistry& registry,
    std::unique_ptr<host::HostDirectory>* out) {
  auto directory = std::make_unique<host::HostDirectory>(registry);
  transport::remove_stale_files(directory->segment_dir(), directory->segment_prefix());
  std::unique_ptr<transport::DatagramTransport> back;
  auto shm = transport::ShmTransport::open(std::move(t), directory->own_segment(), directory.get(), &back);
  if (!shm) {
    LOG_WARN("no same-host path (%s): traffic to this host's processes goes over UDP", std::strerror(errno));
    return back;
  }
  *out = std::move(directory);
  return shm;
}

EngineContext* EngineContext::open_with(core::Device* dev, std::unique_ptr<transport::DatagramTransport> t,
                                        bool start_thread, bool publish) {
  auto* e = new (std::nothrow) EngineContext(dev, std::move(t), publish);
  if (!e) {
    errno = ENOMEM;
    return nullptr;
  }
  if (start_thread) e->thread_ = std::thread([e] { e->progress_loop(); });
  {
    std::lock_guard lock(live_mu());
    live_contexts().push_back(e);
  }
  static std::once_flag hook;
  std::call_once(hook, [] { std::atexit(send_acks_at_exit); });
  LOG_INFO("device %s opened, UDP port %u", dev->ibdev.name, e->lid());
  return e;
}

void EngineContext::close() {
  {
    std::lock_guard lock(live_mu());
    std::erase(live_contexts(), this);
  }
  send_deferred_acks_now();
  linger();
  stop_.store(true);
  transport_->wake();
  if (thread_.joinable()) thread_.join();
  close_xrc_handles();
  if (placement_) mrs.set_observer(nullptr);
  if (core::config().stats_at_exit) print_stats();
  if (auto* c = transport::find_layer<transport::CaptureTransport>(transport_.get()))
    LOG_INFO("capture %s: %llu packets written, %llu not written (limit or backlog)", c->writer().path().c_str(),
             (unsigned long long)c->writer().written(), (unsigned long long)c->writer().dropped());
  if (auto* f = dynamic_cast<transport::FaultyTransport*>(transport_.get())) {
    const auto& c = f->counters();
    std::fprintf(stderr,
                 "uroce fault injection (port %u, seed %llu): %llu sent, %llu lost, %llu duplicated, "
                 "%llu reordered, %llu corrupted, %llu overflowed\n",
                 lid(), (unsigned long long)f->spec().seed, (unsigned long long)c.sent.load(),
                 (unsigned long long)c.lost.load(), (unsigned long long)c.duplicated.load(),
                 (unsigned long long)c.reordered.load(), (unsigned long long)c.corrupted.load(),
                 (unsigned long long)c.overflowed.load());
  }
  delete this;
}

void EngineContext::print_stats() const {
  const auto* shm = transport::find_layer<transport::ShmTransport>(transport_.get());
  std::fprintf(stderr,
               "uroce stats %s port %u: rx %llu, malformed %llu, bad_icrc %llu, no_qp %llu, wrong_service %llu, "
               "dropped_state %llu, duplicates %llu, out_of_sequence %llu, retransmits %llu, naks %llu, "
               "rnr_naks %llu, qkey_violations %llu, xrc_relayed %llu, bad_path %llu, ghost %llu, no_recv_wqe %llu, "
               "host_port %u, slot %u, relayed_out %llu, relayed_in %llu, same_host_out %llu, same_host_in %llu, "
               "same_host_full_drops %llu, same_host_jumbo %llu, same_host_bare_drops %llu, qp1_in %llu, qp1_out %llu, "
               "qp1_dropped %llu, ecn_ce %llu, "
               "cnps_out %llu, cnps_in %llu, tx_path %s, rx_path %s\n",
               device->ibdev.name, lid(), (unsigned long long)stats.rx_packets.load(),
               (unsigned long long)stats.rx_malformed.load(), (unsigned long long)stats.rx_bad_icrc.load(),
               (unsigned long long)stats.rx_no_qp.load(), (unsigned long long)stats.rx_wrong_service.load(),
               (unsigned long long)stats.rx_dropped_state.load(), (unsigned long long)stats.rx_duplicates.load(),
               (unsigned long long)stats.rx_out_of_sequence.load(), (unsigned long long)stats.tx_retransmits.load(),
               (unsigned long long)stats.tx_naks.load(), (unsigned long long)stats.rnr_naks_sent.load(),
               (unsigned long long)stats.rx_qkey_violations.load(), (unsigned long long)stats.tx_xrc_relayed.load(),
               (unsigned long long)stats.rx_bad_path.load(), (unsigned long long)stats.rx_ghost.load(),
               (unsigned long long)stats.rx_no_recv_wqe.load(), transport_->host_port(),
               registry_ ? registry_->slot() : 0u, (unsigned long long)stats.tx_host_relayed.load(),
               (unsigned long long)stats.rx_host_relayed.load(), (unsigned long long)(shm ? shm->shm_sent() : 0),
               (unsigned long long)(shm ? shm->shm_received() : 0), (unsigned long long)(shm ? shm->full_drops() : 0),
               (unsigned long long)(shm ? shm->jumbo_sent() : 0), (unsigned long long)(shm ? shm->bare_drops() : 0),
               (unsigned long long)stats.rx_gsi.load(), (unsigned long long)stats.tx_gsi.load(),
               (unsigned long long)stats.rx_gsi_dropped.load(), (unsigned long long)stats.rx_ecn_ce.load(),
               (unsigned long long)stats.tx_cnps.load(), (unsigned long long)stats.rx_cnps.load(),
               transport_->max_gso_segments() > 1 ? "gso" : "sendmmsg", transport_->gro() ? "gro" : "recvmmsg");
  if (placement_)
    std::fprintf(stderr,
                 "uroce stats %s port %u: placed_writes %llu, placed_reads %llu, placed_bytes %llu, "
                 "placement_declined %llu, split_copies %llu, taken_back %llu\n",
                 device->ibdev.name, lid(), (unsigned long long)placement_->placed_writes(),
                 (unsigned long long)placement_->placed_reads(), (unsigned long long)placement_->placed_bytes(),
                 (unsigned long long)placement_->declined(), (unsigned long long)placement_->copier().split_copies(),
                 (unsigned long long)placement_->copier().taken_back());
}

int EngineContext::query_port(uint8_t port, ibv_port_attr* attr) const {
  if (int e = core::Context::query_port(port, attr)) return e;
  attr->qkey_viol_cntr = uint32_t(std::min<uint64_t>(stats.rx_qkey_violations.load(std::memory_order_relaxed), 0xFFFF));
  return 0;
}

void EngineContext::attach_host_registry(std::unique_ptr<host::HostRegistry> r) {
  registry_ = std::move(r);
  live_->header().slot = registry_ ? registry_->slot() : 0;
}

bool EngineContext::start_placement() {
  if (!registry_) {
    errno = ENOENT;
    return false;
  }
  placement_ = host::DirectPlacement::open(*registry_);
  if (!placement_) return false;
  mrs.set_observer(placement_.get());
  return true;
}

transport::Endpoint EngineContext::direct_endpoint(transport::Endpoint dst, uint32_t dest_qpn) {
  if (!registry_ || dst.port != core::config().udp_port || !is_host_address(core::ip_to_gid(dst.ip.bytes))) return dst;
  uint16_t port = registry_->port_of(host::qpn_slot(dest_qpn));
  return port ? transport::Endpoint{dst.ip, port} : dst;
}

uint32_t EngineContext::allocate_qp_num() { return qps_.allocate_num(registry_ ? int(registry_->slot()) : -1); }

void EngineContext::register_qp(EngineQp* qp) {
  qp->counters = live_->claim_qp(qp->qp_num(), qp->type);
  qps_.insert(qp);
}

void EngineContext::unregister_qp(EngineQp* qp) {
  {
    // The ACK an application turn left for this QP goes now: the peer must
    // not retry what was delivered (the tombstone answers only duplicates
    // that come later).
    std::lock_guard ql(qp->mu);
    if (qp->in_ack_list && qp->resp.ack_pending) {
      TxBatch& tx = TxBatch::local();
      tx.use(transport_.get());
      responder_flush_ack(*qp, tx);
      tx.flush();
    }
  }
  if (placement_) placement_->withdraw_qp(qp->qp_num());
  // The progress thread holds qps_.mu() shared for a whole burst, so taking it
  // exclusively also waits for any use of `qp` to finish.
  std::unique_lock lock(qps_.mu());
  qps_.erase_locked(qp);  // also leaves the multicast groups it was the last member of
  std::erase(reading_, qp);
  std::erase(deferred_acks_, qp);
  reading_count_.store(reading_.size(), std::memory_order_relaxed);
  deferred_ack_count_.store(deferred_acks_.size(), std::memory_order_relaxed);
  count_sender(*qp, false);
  live_->release_qp(std::exchange(qp->counters, &LiveCounters::unlisted()));
}

// A multicast packet (IBA 10.5.2.4: DQPN 0xFFFFFF) goes to every UD QP of
// this engine attached to its destination group, each consuming a receive
// WQE of its own (the progress thread or poller holds qps_.mu() shared).
void EngineContext::deliver_multicast(transport::RxDatagram& d, const wire::PacketView& pkt,
                                      std::vector<EngineQp*>& touched) {
  const std::vector<EngineQp*>* members = qps_.mcast_members(d.dst_ip);
  if (!members || wire::service_of(pkt.bth().opcode()) != wire::Service::kUd) return count(stats.rx_no_qp);
  for (EngineQp* qp : *members) {
    std::lock_guard ql(qp->mu);
    qp->counters->count_received(d.len);
    responder_receive(*qp, pkt, d.src, d.dst_ip, TxBatch::local());
    note_responder_work(*qp, touched);  // (a UD QP: receive completions only)
  }
}

void EngineContext::keep_xrc_target(EngineQp* qp) {
  std::lock_guard lock(xrc_mu_);
  xrc_kept_.push_back(qp);
  have_kept_xrc_.store(true);
  timer_armed();  // out of a deep sleep: the progress thread reclaims it
}

void EngineContext::track_xrc_handle(EngineQp* handle, bool open) {
  std::lock_guard lock(xrc_mu_);
  if (open)
    xrc_opened_.push_back(handle);
  else
    std::erase(xrc_opened_, handle);
}

void EngineContext::reclaim_xrc_targets(bool all) {
  std::vector<EngineQp*> gone;
  {
    std::lock_guard lock(xrc_mu_);
    std::erase_if(xrc_kept_, [&](EngineQp* qp) {
      if (!all && !xrc_target_unheld(*qp)) return false;
      gone.push_back(qp);
      return true;
    });
    have_kept_xrc_.store(!xrc_kept_.empty());
  }
  for (EngineQp* qp : gone) {  // as ibv_destroy_qp destroys a target
    unregister_qp(qp);
    xrc_target_detach(*qp);
    release(core::Resource::kQp);
    delete qp;
  }
}

// At close (the progress thread has stopped): this context's opened handles
// are dropped and its kept targets reclaimed; a target QP the application did
// not destroy ends with its context (other handles on it then get EIO).
void EngineContext::close_xrc_handles() {
  std::vector<EngineQp*> opened;
  {
    std::lock_guard lock(xrc_mu_);
    opened.swap(xrc_opened_);
  }
  for (EngineQp* h : opened) {
    (void)xrc_target_close(*h);
    delete h;
  }
  reclaim_xrc_targets(true);
  std::shared_lock lock(qps_.mu());
  qps_.for_each([](EngineQp& qp) {
    if (!qp.xrc) return;
    qp.xrc->domain->remove_local_handle(&qp);
    qp.xrc->domain->release_slot(qp.xrc->slot, qp.xrc->home_port, qp.xrc->qp_num);
  });
}

EngineQp& EngineContext::relay_proxy() {
  if (!relay_proxy_) {
    core::QpCaps caps{1, 1, 1, 1, 0};
    relay_proxy_ =
        std::make_unique<EngineQp>(this, nullptr, nullptr, nullptr, IBV_QPT_XRC_RECV, caps, false, 0, nullptr);
    relay_proxy_->relay_proxy = true;
  }
  return *relay_proxy_;
}

namespace {
constexpr auto kPruneInterval = std::chrono::milliseconds(100);
}  // namespace

void EngineContext::linger() {
  if (!thread_.joinable()) return;
  auto start = Clock::now();
  for (auto now = start; !tombstones_.quiet(now) && now - start < Tombstones::kLingerMax; now = Clock::now())
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

bool EngineContext::any_timer_armed() {
  std::shared_lock lock(qps_.mu());
  bool armed = false;
  qps_.for_each([&](EngineQp& qp) {
    std::lock_guard ql(qp.mu);
    armed = armed || timer_pending(qp.timers);
  });
  return armed;
}

void EngineContext::drain_received() {
  if (!thread_.joinable() || std::this_thread::get_id() == thread_.get_id()) return;
  std::unique_lock lock(drain_mu_);
  uint64_t ticket = ++drain_requested_;
  transport_->wake();
  // Bounded: a flood that never leaves the socket empty must not block the
  // application's disconnect.
  drain_cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return drain_done_ >= ticket; });
}

bool EngineContext::send_reads() {
  if (reading_count_.load(std::memory_order_relaxed) == 0) return false;
  std::shared_lock lock(qps_.mu());
  if (reading_.empty()) return false;
  TxBatch& tx = TxBatch::local();
  tx.use(transport_.get());
  std::erase_if(reading_, [&](EngineQp* qp) {
    std::lock_guard ql(qp->mu);
    qp->in_read_list = responder_send_reads(*qp, tx, kReadBudgetPerQp);
    return !qp->in_read_list;
  });
  reading_count_.store(reading_.size(), std::memory_order_relaxed);
  tx.flush();
  return !reading_.empty();
}

void EngineContext::process_burst(std::span<transport::RxDatagram> burst, Turn turn, Clock::time_point now) {
  TxBatch& tx = TxBatch::local();
  tx.use(transport_.get());
  TxBatch::BurstScope in_burst(tx);  // flushed below
  std::shared_lock lock(qps_.mu());
  uint64_t rx_bytes = 0;  // of packets taken by a QP
  for (auto& d : burst) {
    dispatch(d, touched_, rx_bytes, now);
    // A CM message takes its place among the data (gsi.h): what came before
    // it completes first, what comes after it completes after its event.
    if (gsi_inbox.pending()) {
      settle_burst(tx, turn, now);
      gsi_inbox.deliver();
    }
  }
  stats.rx_packets.fetch_add(burst.size(), std::memory_order_relaxed);
  stats.rx_bytes.fetch_add(rx_bytes, std::memory_order_relaxed);
  settle_burst(tx, turn, now);
}

void EngineContext::settle_burst(TxBatch& tx, Turn turn, Clock::time_point now) {
  // ACK coalescing: one ACK per QP per burst, covering every request in it.
  // In an application's turn, an RC QP's ACK waits instead for the
  // application's next post on the QP, which sends it in the same system
  // call as the reply that usually follows (before the reply if it covers a
  // receive, else behind it: requester_run), or for the next turn
  // (deferred_acks_). So it does in this
  // thread's turn when the application answers on the QP (a WRITE ping-pong
  // whose target spins on memory: the peer's poll for its completion then
  // takes the reply with the ACK, and neither side's progress thread is
  // woken again); a turn of this thread comes within a timer tick.
  for (EngineQp* qp : touched_) {
    std::lock_guard ql(qp->mu);
    bool rc_ack = qp->type == IBV_QPT_RC && qp->resp.ack_pending;
    bool reply_expected = rc_ack && responder_reply_expected(*qp);
    bool wait_for_post = turn == Turn::kApplication && !qp->delivery.through_memory();
    if (rc_ack && (wait_for_post || reply_expected)) {
      if (!qp->in_ack_list) {
        if (deferred_acks_.empty()) acks_deferred_at_ = now;
        qp->in_ack_list = true;
        deferred_acks_.push_back(qp);
        deferred_ack_count_.store(deferred_acks_.size(), std::memory_order_relaxed);
      }
      continue;
    }
    responder_flush_ack(*qp, tx);
  }
  tx.flush();
  // ACK before completion (but see above): the burst's receive completions become visible
  // only now that the ACKs covering them have left.
  for (EngineQp* qp : touched_) {
    std::lock_guard ql(qp->mu);
    qp->in_touched_list = false;
    responder_release_completions(*qp);
  }
  touched_.clear();
}

namespace {
// RC, UC and XRC packets are heard only from the path the QP was connected to
// (rxe's check_addr): the datagram's source must be the remote GID's address
// and its destination the QP's source GID's. The UDP source port is flow
// entropy in RoCEv2 and is not checked. Before RTR there is no path: the
// roles drop such packets by state.
bool from_connected_path(const EngineQp& qp, const transport::RxDatagram& d) {
  if (qp.type == IBV_QPT_UD) return true;  // checked by Q_Key
  ibv_qp_state st = qp.state();
  if (st == IBV_QPS_RESET || st == IBV_QPS_INIT) return true;
  return d.src.ip == qp.path.dst.ip && d.dst_ip == qp.path.src_ip;
}
}  // namespace

namespace {
// The ICRC check (docs/architecture.md, "ICRC"). Over IPv4 the sender's
// identification and DF bit are covered but unseen: the packet's place in its
// GRO batch is tried first, then what its sender may have used
// (wire::icrc_ipv4_received_ok).
bool icrc_ok(const transport::RxDatagram& d, const wire::PacketView& pkt, uint16_t local_port) {
  uint16_t dst_port = d.dst_port ? d.dst_port : local_port;
  if (!d.src.ip.is_v4()) {  // IPv6: no hidden field (traffic class, flow label, hop limit are masked)
    wire::Ipv6Flow flow{d.src.ip.bytes, d.dst_ip.bytes, d.src.port, dst_port};
    return wire::icrc_ipv6(flow, d.data, d.len) == pkt.icrc_wire();
  }
  wire::Ipv4Flow flow{d.src.ip.v4(), d.dst_ip.v4(), d.src.port, dst_port, d.gso_index};
  return wire::icrc_ipv4_received_ok(flow, d.data, d.len, pkt.icrc_wire());
}
}  // namespace

// A same-host jumbo packet (ShmTransport::send_jumbo) is an RC SEND or WRITE
// request for a QP of this engine: it is never relayed, and nothing else may
// come as one (it has no ICRC).
bool EngineContext::jumbo_ok(const wire::PacketView& pkt) const {
  uint8_t opcode = pkt.bth().opcode();
  bool request = (pkt.info->flags & (wire::kOpSend | wire::kOpWrite)) && !(pkt.info->flags & wire::kOpResponse);
  uint32_t qpn = pkt.bth().dest_qp();
  return request && wire::service_of(opcode) == wire::Service::kRc && qpn != kMulticastQpn &&
         (!registry_ || host::qpn_slot(qpn) == registry_->slot());
}

// A same-host bare packet (TxDatagram::bare) is an RC or UC packet a QP's
// Delivery sent straight to the engine that owns its peer QP: it is never
// relayed, and nothing else comes without an ICRC.
bool EngineContext::bare_ok(const wire::PacketView& pkt) const {
  wire::Service service = wire::service_of(pkt.bth().opcode());
  uint32_t qpn = pkt.bth().dest_qp();
  return (service == wire::Service::kRc || service == wire::Service::kUc) && qpn != kMulticastQpn && qpn != kGsiQpn &&
         (!registry_ || host::qpn_slot(qpn) == registry_->slot());
}

// Host delivery (host_delivery.h): a RoCE packet for a QP of another engine
// of this host (its number's slot) is passed on to that engine. True when
// it is ours.
bool EngineContext::ours_or_relayed(const transport::RxDatagram& d) {
  int64_t qpn = host::dest_qpn_of(d);
  unsigned slot = qpn < 0 ? 0 : host::qpn_slot(uint32_t(qpn));
  if (slot < host::kFirstHostSlot || slot > host::kLastHostSlot || slot == registry_->slot()) return true;
  relay_to_slot(*this, d, slot, TxBatch::local());
  return false;
}

// One datagram of a burst, by kind (transport/envelope.h): a RoCE packet
// (the common case) is ours or passed on to its engine; a relayed one is
// unwrapped once (a stale slot then ends as no_qp); an XRC relay goes to its
// handler; a doorbell never comes here (the transport swallows it).
void EngineContext::dispatch(transport::RxDatagram& d, std::vector<EngineQp*>& touched, uint64_t& rx_bytes,
                             Clock::time_point now) {
  if (d.truncated) return count(stats.rx_malformed);
  switch (transport::envelope_of(d)) {
    case transport::Envelope::kNone:
      if (registry_ && !d.jumbo && !d.bare && !ours_or_relayed(d)) return;
      break;
    case transport::Envelope::kHostRelay:
      if (!registry_) return count(stats.rx_malformed);
      if (!unwrap_host_relay(*this, d)) return;  // (counted)
      break;
    case transport::Envelope::kXrcRelay:
      return xrc_relay_receive(*this, d, TxBatch::local());
    case transport::Envelope::kDoorbell:
      return count(stats.rx_malformed);
  }
  receive_packet(d, touched, rx_bytes, now);
}

// A RoCE packet for this engine: parsed and checked, then to what its
// destination QP number names (CNP, multicast, QP1, a QP, a tombstone).
void EngineContext::receive_packet(transport::RxDatagram& d, std::vector<EngineQp*>& touched, uint64_t& rx_bytes,
                                   Clock::time_point now) {
  wire::PacketView pkt;
  if (wire::PacketView::parse(d.data, d.len, pkt) != wire::ParseError::kNone || (d.jumbo && !jumbo_ok(pkt)) ||
      (d.bare && !bare_ok(pkt)))
    return count(stats.rx_malformed);
  if (!d.jumbo && !d.bare && core::config().icrc_check && !icrc_ok(d, pkt, lid())) return count(stats.rx_bad_icrc);
  pkt.jumbo = d.jumbo;
  uint32_t qpn = pkt.bth().dest_qp();
  if (pkt.bth().opcode() == wire::kOpCnp) return receive_cnp(d, pkt);
  if (qpn == kMulticastQpn) return deliver_multicast(d, pkt, touched);
  if (qpn == kGsiQpn) return gsi_receive(*this, d, pkt);
  if (EngineQp* qp = qps_.find(qpn)) return deliver_to_qp(*qp, d, pkt, touched, rx_bytes, now);
  if (!tombstones_.any() || !tombstones_.answer(d, pkt, TxBatch::local(), stats)) count(stats.rx_no_qp);
}

// A packet for `qp`: checked against the QP (service, XRC handles, path),
// counted, and run by the role it is for.
void EngineContext::deliver_to_qp(EngineQp& qp, const transport::RxDatagram& d, const wire::PacketView& pkt,
                                  std::vector<EngineQp*>& touched, uint64_t& rx_bytes, Clock::time_point now) {
  // rxe: the opcode's service must match the QP type.
  // XRC: initiators only take responses, targets only requests.
  bool response = pkt.info->flags & wire::kOpResponse;
  if (wire::service_of(pkt.bth().opcode()) != service_of_qp(qp.type) || (qp.type == IBV_QPT_XRC_SEND && !response) ||
      (qp.type == IBV_QPT_XRC_RECV && response))
    return count(stats.rx_wrong_service);
  std::lock_guard ql(qp.mu);
  if (qp.xrc && !xrc_target_sync(qp)) return count(stats.rx_no_qp);  // an XRC target whose last handle is gone
  if (!from_connected_path(qp, d)) return count(stats.rx_bad_path);
  qp.counters->count_received(d.len);
  rx_bytes += d.len;
  if (d.ce && qp.type != IBV_QPT_UD)
    answer_congestion_mark(qp, TxBatch::local(), now, stats);  // a burst's marks: one CNP
  if (qp.type == IBV_QPT_XRC_RECV) return xrc_target_receive(qp, pkt, d, TxBatch::local());
  if (response) return completer_receive(qp, pkt, TxBatch::local());
  responder_receive(qp, pkt, d.src, d.dst_ip, TxBatch::local());
  note_responder_work(qp, touched);
}

// After the responder ran: a QP with an ACK or completions waiting joins the
// burst's touched list (settle_burst), one with READ responses to send the
// reading list (send_reads).
void EngineContext::note_responder_work(EngineQp& qp, std::vector<EngineQp*>& touched) {
  if ((qp.resp.ack_pending || qp.deferred_count) && !qp.in_touched_list) {
    qp.in_touched_list = true;
    touched.push_back(&qp);
  }
  if (qp.resp.read_count && !qp.in_read_list) {
    qp.in_read_list = true;
    reading_.push_back(&qp);
    reading_count_.store(reading_.size(), std::memory_order_relaxed);
  }
}

// A CNP (ecn.h): to a QP of ours that sends on the path it came from, else
// dropped as any packet for no QP or from elsewhere.
void EngineContext::receive_cnp(const transport::RxDatagram& d, const wire::PacketView& pkt) {
  EngineQp* found = qps_.find(pkt.bth().dest_qp());
  if (!found || found->type == IBV_QPT_UD) {
    stats.rx_no_qp.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  EngineQp& qp = *found;
  std::lock_guard ql(qp.mu);
  if (!from_connected_path(qp, d)) {
    stats.rx_bad_path.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  completer_receive_cnp(qp);
}

bool EngineContext::run_timers(Clock::time_point now) {
  TxBatch& tx = TxBatch::local();
  tx.use(transport_.get());
  bool armed = false;
  {
    std::shared_lock lock(qps_.mu());
    qps_.for_each([&](EngineQp& qp) {
      std::lock_guard ql(qp.mu);
      completer_check_timers(qp, now, tx);
      armed = armed || timer_pending(qp.timers);
    });
  }
  tx.flush();
  if (now >= next_prune_) {
    next_prune_ = now + kPruneInterval;
    if (tombstones_.any()) tombstones_.prune(now);
    if (have_kept_xrc_.load(std::memory_order_relaxed)) reclaim_xrc_targets(false);
  }
  return armed;
}

}  // namespace uroce::engine
