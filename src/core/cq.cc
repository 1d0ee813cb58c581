#include "core/cq.h"

#include <algorithm>
#include <cerrno>

#include "core/comp_channel.h"
#include "core/completion_clock.h"
#include "core/context.h"

namespace uroce::core {

Cq::Cq(ibv_context* ctx, uint32_t entries, CompChannel* channel, void* cq_context) : channel_(channel), ring_(entries) {
  ibcq.context = ctx;
  ibcq.channel = channel ? &channel->ibch : nullptr;
  ibcq.cq_context = cq_context;
  ibcq.cqe = int(entries);
  pthread_mutex_init(&ibcq.mutex, nullptr);
  pthread_cond_init(&ibcq.cond, nullptr);
}

bool Cq::push(const ibv_wc& wc, bool solicited) {
  bool raise = false;
  {
    std::lock_guard lock(mu_);
    uint32_t n = count_.load(std::memory_order_relaxed);
    if (n == ring_.size()) {
      // An overrun is the IBA "CQ Error" affiliated asynchronous error, reported
      // once as an async event (IBV_EVENT_CQ_ERR).
      if (overruns_.fetch_add(1, std::memory_order_relaxed) == 0 && ibcq.context) {
        ibv_async_event ev{};
        ev.element.cq = reinterpret_cast<ibv_cq*>(&ibcq);
        ev.event_type = IBV_EVENT_CQ_ERR;
        Context::from(ibcq.context)->raise_async_event(ev);
      }
      return false;
    }
    CqEntry& e = ring_[(head_ + n) % ring_.size()];
    e.wc = wc;
    // Sampled under the lock, so timestamps never decrease in CQ order.
    e.timestamp_ns = record_completion_ts_ ? completion_clock_ns() : 0;
    e.wallclock_ns = record_wallclock_ ? wallclock_ns() : 0;
    count_.store(n + 1, std::memory_order_release);
    bool is_error = wc.status != IBV_WC_SUCCESS;
    if (arm_ == Arm::kNext || (arm_ == Arm::kSolicited && (solicited || is_error))) {
      arm_ = Arm::kNone;
      raise = channel_ != nullptr;
    }
  }
  if (raise) channel_->notify(this);
  return true;
}

int Cq::resize(uint32_t entries) {
  std::lock_guard lock(mu_);
  uint32_t n = count_.load(std::memory_order_relaxed);
  if (entries == 0 || entries < n) return EINVAL;
  std::vector<CqEntry> ring(entries);
  for (uint32_t i = 0; i < n; ++i) ring[i] = ring_[(head_ + i) % ring_.size()];
  ring_.swap(ring);
  head_ = 0;
  ibcq.cqe = int(entries);
  return 0;
}

int Cq::poll(int max, ibv_wc* out) {
  if (max <= 0 || count_.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard lock(mu_);
  uint32_t n = std::min<uint32_t>(uint32_t(max), count_.load(std::memory_order_relaxed));
  for (uint32_t i = 0; i < n; ++i) {
    out[i] = ring_[head_].wc;
    head_ = (head_ + 1) % ring_.size();
  }
  count_.store(count_.load(std::memory_order_relaxed) - n, std::memory_order_release);
  return int(n);
}

bool Cq::pop(CqEntry* out) {
  if (count_.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(mu_);
  uint32_t n = count_.load(std::memory_order_relaxed);
  if (n == 0) return false;
  *out = ring_[head_];
  head_ = (head_ + 1) % ring_.size();
  count_.store(n - 1, std::memory_order_release);
  return true;
}

int Cq::arm(bool solicited_only) {
  std::lock_guard lock(mu_);
  // A stronger arm is not weakened by a later solicited-only arm.
  if (!solicited_only)
    arm_ = Arm::kNext;
  else if (arm_ == Arm::kNone)
    arm_ = Arm::kSolicited;
  return 0;
}

void Cq::purge_qp(uint32_t qp_num) {
  std::lock_guard lock(mu_);
  uint32_t n = count_.load(std::memory_order_relaxed);
  uint32_t kept = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const CqEntry& e = ring_[(head_ + i) % ring_.size()];
    if (e.wc.qp_num != qp_num) ring_[(head_ + kept++) % ring_.size()] = e;
  }
  count_.store(kept, std::memory_order_release);
}

}  // namespace uroce::core
