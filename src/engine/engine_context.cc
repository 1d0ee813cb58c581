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
#include "engine/roles.h"
#include "host/direct_placement.h"
#include "host/host_directory.h"
#include "host/host_registry.h"
#include "host/host_relay.h"
#include "transport/capture.h"
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
      qps_(transport_.get()),
      board_watch_(transport::find_layer<transport::ShmTransport>(transport_.get())),
      mailboxes_(transport_.get()) {
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
  std::fprintf(
      stderr,
      "uroce stats %s port %u: rx %llu, malformed %llu, bad_icrc %llu, no_qp %llu, wrong_service %llu, "
      "dropped_state %llu, duplicates %llu, out_of_sequence %llu, retransmits %llu, timeouts %llu, seq_naks_in %llu, "
      "naks %llu, "
      "rnr_naks %llu, rnr_naks_in %llu, qkey_violations %llu, xrc_relayed %llu, bad_path %llu, ghost %llu, "
      "no_recv_wqe %llu, "
      "host_port %u, slot %u, relayed_out %llu, relayed_in %llu, same_host_out %llu, same_host_in %llu, "
      "same_host_full_drops %llu, same_host_jumbo %llu, same_host_bare_drops %llu, qp1_in %llu, qp1_out %llu, "
      "qp1_dropped %llu, ecn_ce %llu, "
      "cnps_out %llu, cnps_in %llu, mail_out %llu, mail_in %llu, tx_path %s, rx_path %s\n",
      device->ibdev.name, lid(), (unsigned long long)stats.rx_packets.load(),
      (unsigned long long)stats.rx_malformed.load(), (unsigned long long)stats.rx_bad_icrc.load(),
      (unsigned long long)stats.rx_no_qp.load(), (unsigned long long)stats.rx_wrong_service.load(),
      (unsigned long long)stats.rx_dropped_state.load(), (unsigned long long)stats.rx_duplicates.load(),
      (unsigned long long)stats.rx_out_of_sequence.load(), (unsigned long long)stats.tx_retransmits.load(),
      (unsigned long long)stats.timeouts.load(), (unsigned long long)stats.rx_seq_naks.load(),
      (unsigned long long)stats.tx_naks.load(), (unsigned long long)stats.rnr_naks_sent.load(),
      (unsigned long long)stats.rx_rnr_naks.load(), (unsigned long long)stats.rx_qkey_violations.load(),
      (unsigned long long)stats.tx_xrc_relayed.load(), (unsigned long long)stats.rx_bad_path.load(),
      (unsigned long long)stats.rx_ghost.load(), (unsigned long long)stats.rx_no_recv_wqe.load(),
      transport_->host_port(), registry_ ? registry_->slot() : 0u, (unsigned long long)stats.tx_host_relayed.load(),
      (unsigned long long)stats.rx_host_relayed.load(), (unsigned long long)(shm ? shm->shm_sent() : 0),
      (unsigned long long)(shm ? shm->shm_received() : 0), (unsigned long long)(shm ? shm->full_drops() : 0),
      (unsigned long long)(shm ? shm->jumbo_sent() : 0), (unsigned long long)(shm ? shm->bare_drops() : 0),
      (unsigned long long)stats.rx_gsi.load(), (unsigned long long)stats.tx_gsi.load(),
      (unsigned long long)stats.rx_gsi_dropped.load(), (unsigned long long)stats.rx_ecn_ce.load(),
      (unsigned long long)stats.tx_cnps.load(), (unsigned long long)stats.rx_cnps.load(),
      (unsigned long long)stats.mail_out.load(), (unsigned long long)stats.mail_in.load(),
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
  withdraw_qp(qp);
  live_->release_qp(std::exchange(qp->counters, &LiveCounters::unlisted()));
}

void EngineContext::retire_qp(EngineQp* qp) {
  withdraw_qp(qp);
  tombstones_.add(*qp);  // after the table has let go of it, before its counters go
  live_->release_qp(std::exchange(qp->counters, &LiveCounters::unlisted()));
}

// Out of the QP table and every list of the receive path; the ACK an application
// turn left for it sent.
void EngineContext::withdraw_qp(EngineQp* qp) {
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
  board_watch_.withdraw(qp);
  mailboxes_.withdraw(qp);
  std::erase(reading_, qp);
  std::erase(deferred_acks_, qp);
  reading_count_.store(reading_.size(), std::memory_order_relaxed);
  deferred_ack_count_.store(deferred_acks_.size(), std::memory_order_relaxed);
  count_sender(*qp, false);
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
