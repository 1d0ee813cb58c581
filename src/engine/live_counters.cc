#include "engine/live_counters.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "core/log.h"
#include "transport/shared_file.h"

namespace uroce::engine {

namespace {
std::mutex claim_mu;  // claim_qp / release_qp of every engine: control path only

void copy_name(char* out, size_t size, const char* in) { std::snprintf(out, size, "%s", in ? in : ""); }
}  // namespace

std::unique_ptr<LiveCounters> LiveCounters::open_private() {
  auto* layout = new Layout();  // ~115 KiB; as any allocation of a device open
  return std::unique_ptr<LiveCounters>(new LiveCounters(layout, sizeof(Layout), {}, false));
}

std::unique_ptr<LiveCounters> LiveCounters::open(const char* device, uint16_t lid, bool shared) {
  std::unique_ptr<LiveCounters> c;
  if (shared) {
    transport::remove_stale_files(folder(), prefix());
    std::string path = folder() + "/" + prefix() + std::to_string(getpid()) + "-" + std::to_string(lid);
    if (void* map = transport::create_shared_file(path, sizeof(Layout), false)) {
      // A fresh file reads as zeros: every atomic starts at 0, as constructed.
      c.reset(new (std::nothrow) LiveCounters(static_cast<Layout*>(map), sizeof(Layout), path, true));
      if (!c) {
        ::munmap(map, sizeof(Layout));
        ::unlink(path.c_str());
      }
    } else {
      LOG_INFO("no live counters file %s (%s): UROCE_STATS=1 still prints them at exit", path.c_str(),
               std::strerror(errno));
    }
  }
  if (!c) c = open_private();
  if (!c) return nullptr;
  Header& h = c->header();
  h.version = kVersion;
  h.pid = uint32_t(getpid());
  h.lid = lid;
  h.max_qps = kMaxQps;
  copy_name(h.device, sizeof h.device, device);
  h.magic.store(kMagic, std::memory_order_release);
  return c;
}

LiveCounters::LiveCounters(Layout* layout, size_t bytes, std::string path, bool mapped)
    : layout_(layout), bytes_(bytes), path_(std::move(path)), mapped_(mapped) {}

LiveCounters::~LiveCounters() {
  if (!mapped_) {
    delete layout_;
    return;
  }
  // A forked child inherits the mapping but not the file: only the opener removes it.
  if (layout_->header.pid == uint32_t(getpid())) ::unlink(path_.c_str());
  ::munmap(layout_, bytes_);
}

void LiveCounters::set_paths(const char* tx_path, const char* rx_path) {
  Header& h = header();
  copy_name(h.tx_path, sizeof h.tx_path, tx_path);
  copy_name(h.rx_path, sizeof h.rx_path, rx_path);
}

QpCounters* LiveCounters::claim_qp(uint32_t qpn, uint32_t type) {
  std::lock_guard lock(claim_mu);
  for (QpCounters& c : layout_->qps) {
    if (c.qpn.load(std::memory_order_relaxed) != 0) continue;
    for (std::atomic<uint64_t>* v :
         {&c.sent_pkts, &c.sent_bytes, &c.rcvd_pkts, &c.rcvd_bytes, &c.retransmits, &c.seq_naks_sent, &c.rcvd_seq_err,
          &c.send_rnr_err, &c.rcvd_rnr_err, &c.duplicate_request, &c.out_of_seq_request, &c.local_ack_timeout_err,
          &c.placed_ops, &c.placed_bytes})
      v->store(0, std::memory_order_relaxed);
    c.type.store(type, std::memory_order_relaxed);
    c.state.store(0, std::memory_order_relaxed);
    c.dest_qpn.store(0, std::memory_order_relaxed);
    c.qpn.store(qpn, std::memory_order_release);
    return &c;
  }
  header().qps_not_listed.fetch_add(1, std::memory_order_relaxed);
  return &overflow_;
}

QpCounters& LiveCounters::unlisted() {
  static QpCounters sink;
  return sink;
}

void LiveCounters::release_qp(QpCounters* c) {
  if (!c || c == &overflow_ || c == &unlisted()) return;
  std::lock_guard lock(claim_mu);
  c->qpn.store(0, std::memory_order_release);
}

}  // namespace uroce::engine
