#include "core/cq.h"

#include <algorithm>
#include <cerrno>
#include <new>

#include "core/comp_channel.h"
#include "core/completion_clock.h"
#include "core/context.h"

namespace uroce::core {

std::unique_ptr<CqEntry[], Cq::FreeRing> Cq::allocate_ring(uint32_t entries) {
  // CqEntry is an aggregate (an implicit-lifetime type), so calloc's zeroed
  // storage holds an array of value-initialized entries (C++20 [intro.object]).
  auto* p = static_cast<CqEntry*>(std::calloc(entries, sizeof(CqEntry)));
  if (!p) throw std::bad_alloc();  // ENOMEM at the ABI boundary
  return std::unique_ptr<CqEntry[], FreeRing>(p);
}

Cq::Cq(ibv_context* ctx, uint32_t entries, CompChannel* channel, void* cq_context)
    : channel_(channel), ring_(allocate_ring(entries)), capacity_(entries) {
  ibcq.context = ctx;
  ibcq.channel = channel ? &channel->ibch : nullptr;
  ibcq.cq_context = cq_context;
  ibcq.cqe = int(entries);
  pthread_mutex_init(&ibcq.mutex, nullptr);
  pthread_cond_init(&ibcq.cond, nullptr);
}

Cq::~Cq() {
  if (arm_ != Arm::kNone) note_arm(-1);
}

bool Cq::push(const ibv_wc& wc, bool solicited) {
  bool raise = false;
  {
    std::lock_guard lock(mu_);
    uint32_t n = count_.load(std::memory_order_relaxed);
    if (n == capacity_) {
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
    CqEntry& e = ring_[at(n)];
    e.wc = wc;
    // Sampled under the lock, so timestamps never decrease in CQ order.
    e.timestamp_ns = record_completion_ts_ ? completion_clock_ns() : 0;
    e.wallclock_ns = record_wallclock_ ? wallclock_ns() : 0;
    count_.store(n + 1, std::memory_order_release);
    bool is_error = wc.status != IBV_WC_SUCCESS;
    if (arm_ == Arm::kNext || (arm_ == Arm::kSolicited && (solicited || is_error))) {
      arm_ = Arm::kNone;
      note_arm(-1);
      raise = channel_ != nullptr;
    }
  }
  if (raise) channel_->notify(this);
  return true;
}

void Cq::discard_qp(uint32_t qp_num) noexcept {
  std::lock_guard lock(mu_);
  const uint32_t n = count_.load(std::memory_order_relaxed);
  uint32_t kept = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const CqEntry& e = ring_[at(i)];
    if (e.wc.qp_num != qp_num) ring_[at(kept++)] = e;
  }
  if (kept == 0) head_ = 0;  // see allocate_ring
  count_.store(kept, std::memory_order_release);
}

int Cq::resize(uint32_t entries) {
  std::lock_guard lock(mu_);
  uint32_t n = count_.load(std::memory_order_relaxed);
  if (entries == 0 || entries < n) return EINVAL;
  auto ring = allocate_ring(entries);
  for (uint32_t i = 0; i < n; ++i) ring[i] = ring_[at(i)];
  ring_ = std::move(ring);
  capacity_ = entries;
  head_ = 0;
  ibcq.cqe = int(entries);
  return 0;
}

int Cq::poll(int max, ibv_wc* out) noexcept {
  if (max <= 0 || count_.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard lock(mu_);
  uint32_t n = std::min<uint32_t>(uint32_t(max), count_.load(std::memory_order_relaxed));
  for (uint32_t i = 0; i < n; ++i) {
    out[i] = ring_[head_].wc;
    head_ = at(1);
  }
  uint32_t left = count_.load(std::memory_order_relaxed) - n;
  if (left == 0) head_ = 0;  // see allocate_ring: the ring stays in its first pages
  count_.store(left, std::memory_order_release);
  return int(n);
}

bool Cq::pop(CqEntry* out) noexcept {
  if (count_.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(mu_);
  uint32_t n = count_.load(std::memory_order_relaxed);
  if (n == 0) return false;
  *out = ring_[head_];
  head_ = n == 1 ? 0 : at(1);
  count_.store(n - 1, std::memory_order_release);
  return true;
}

int Cq::arm(bool solicited_only) noexcept {
  std::lock_guard lock(mu_);
  if (arm_ == Arm::kNone) note_arm(+1);
  // A stronger arm is not weakened by a later solicited-only arm.
  if (!solicited_only)
    arm_ = Arm::kNext;
  else if (arm_ == Arm::kNone)
    arm_ = Arm::kSolicited;
  return 0;
}

}  // namespace uroce::core
