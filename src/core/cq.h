// Completion queue: a ring of work completions.
//
// Lock and memory-order contract: producers (the progress thread and posting
// threads) and the consumer (ibv_poll_cq) serialize on mu_. count_ mirrors the
// number of entries; it is written under mu_ with release order and read
// without the lock (acquire) so that polling an empty CQ costs one atomic load
// and never blocks. Arming (ibv_req_notify_cq) is also under mu_, so an event
// is raised exactly once per arm.
//
// The extended polling API (ibv_start_poll … ibv_end_poll, src/verbs/
// cq_ex_verbs.cc) pops entries one at a time into `current`; its batch lock
// (poll_batch_mu) is a consumer-only lock, never taken by producers, because
// applications post work (which may push completions) inside a poll batch.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "base/fast_mutex.h"
#include "core/container_of.h"
#include "core/result.h"

namespace uroce::core {

class CompChannel;

// One completion as the ring stores it: the work completion plus the times it
// was produced, sampled only if the CQ records them (ibv_create_cq_ex).
struct CqEntry {
  ibv_wc wc{};
  uint64_t timestamp_ns = 0;  // completion_clock_ns() at push
  uint64_t wallclock_ns = 0;  // wallclock_ns() at push
};

class Cq {
 public:
  Cq(ibv_context* ctx, uint32_t entries, CompChannel* channel, void* cq_context);

  ibv_cq_ex ibcq{};  // ABI object; ibv_cq is its prefix
  std::atomic<int> qp_users{0};

  // Adds a completion; `solicited` marks completions that satisfy a
  // solicited-only arm (the verb Request Completion Notification, as
  // ibv_req_notify_cq(3) words it: a receive with the solicited event bit,
  // or a completion in error). Returns false if the CQ is full (overrun: the
  // completion is lost and counted).
  bool push(const ibv_wc& wc, bool solicited);
  // poll, pop and arm are noexcept: the data path (verbs/ops.h) is.
  int poll(int max, ibv_wc* out) noexcept;
  // Removes the oldest completion into *out; false if the CQ is empty.
  bool pop(CqEntry* out) noexcept;
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }
  // Removes every queued completion of QP `qp_num`, the others keeping their
  // order (a QP's move to RESET, as mlx5 cleans its CQs: no completion of the
  // QP's previous life is polled after it restarts).
  void discard_qp(uint32_t qp_num) noexcept;
  // Which clocks push() samples. Set before the CQ is given to any QP.
  void record_timestamps(bool completion, bool wallclock) {
    record_completion_ts_ = completion;
    record_wallclock_ = wallclock;
  }
  int arm(bool solicited_only) noexcept;
  // Keeps `*armed` (the context's count, Context::armed_cqs) at the number of
  // this context's CQs armed with a channel: some thread then waits for an
  // event that only the progress thread can raise. Set before the CQ is used.
  void count_arms_in(std::atomic<int>* armed) { armed_count_ = armed; }
  ~Cq();
  // ibv_resize_cq: keeps every queued completion; EINVAL if they would not fit.
  [[nodiscard]] int resize(uint32_t entries);
  uint32_t capacity() const { return capacity_; }
  uint64_t overruns() const { return overruns_.load(std::memory_order_relaxed); }
  CompChannel* channel() const { return channel_; }

  // Extended polling state (see the contract above): poll_batch_mu is held
  // from a successful ibv_start_poll to ibv_end_poll; current is the
  // completion the ibv_wc_read_* functions report.
  std::mutex poll_batch_mu;
  CqEntry current;

  static Cq* from(ibv_cq* c) { return UROCE_CONTAINER_OF(reinterpret_cast<ibv_cq_ex*>(c), Cq, ibcq); }

 private:
  enum class Arm : uint8_t { kNone, kNext, kSolicited };
  CompChannel* channel_;
  struct FreeRing {
    void operator()(CqEntry* p) const { std::free(p); }
  };
  // calloc'ed: a large ring is zero pages the kernel commits only when they are
  // first written, and head_ returns to 0 whenever the ring empties, so a CQ
  // costs the memory of the most completions it has held at once, not of its
  // size (applications such as libfabric's rxm ask for hundreds of thousands).
  static std::unique_ptr<CqEntry[], FreeRing> allocate_ring(uint32_t entries);
  base::FastMutex mu_;
  std::unique_ptr<CqEntry[], FreeRing> ring_;
  uint32_t capacity_;
  uint32_t head_ = 0;  // next to poll
  // The ring index k entries after head_ (k < capacity_): without a division,
  // which a push and a poll would otherwise each pay (~25 cycles).
  uint32_t at(uint32_t k) const {
    uint32_t i = head_ + k;
    return i < capacity_ ? i : i - capacity_;
  }
  std::atomic<uint32_t> count_{0};
  Arm arm_ = Arm::kNone;
  std::atomic<int>* armed_count_ = nullptr;  // see count_arms_in
  void note_arm(int delta) {
    if (channel_ && armed_count_) armed_count_->fetch_add(delta, std::memory_order_relaxed);
  }
  std::atomic<uint64_t> overruns_{0};
  bool record_completion_ts_ = false;
  bool record_wallclock_ = false;
};

}  // namespace uroce::core
