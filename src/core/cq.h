// Completion queue: a ring of work completions.
//
// Lock and memory-order contract: producers (the progress thread and posting
// threads) and the consumer (ibv_poll_cq) serialize on mu_. count_ mirrors the
// number of entries; it is written under mu_ with release order and read
// without the lock (acquire) so that polling an empty CQ costs one atomic load
// and never blocks. Arming (ibv_req_notify_cq) is also under mu_, so an event
// is raised exactly once per arm.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/container_of.h"
#include "core/result.h"

namespace uroce::core {

class CompChannel;

class Cq {
 public:
  Cq(ibv_context* ctx, uint32_t entries, CompChannel* channel, void* cq_context);

  ibv_cq_ex ibcq{};  // ABI object; ibv_cq is its prefix
  std::atomic<int> qp_users{0};

  // Adds a completion; `solicited` marks completions that satisfy a
  // solicited-only arm (IBA C11-xx: solicited receives and errors). Returns
  // false if the CQ is full (overrun: the completion is lost and counted).
  bool push(const ibv_wc& wc, bool solicited);
  int poll(int max, ibv_wc* out);
  int arm(bool solicited_only);
  // Removes every completion of a QP (the QP is being destroyed).
  void purge_qp(uint32_t qp_num);
  uint32_t capacity() const { return uint32_t(ring_.size()); }
  uint64_t overruns() const { return overruns_.load(std::memory_order_relaxed); }
  CompChannel* channel() const { return channel_; }

  static Cq* from(ibv_cq* c) { return UROCE_CONTAINER_OF(reinterpret_cast<ibv_cq_ex*>(c), Cq, ibcq); }

 private:
  enum class Arm : uint8_t { kNone, kNext, kSolicited };
  CompChannel* channel_;
  std::mutex mu_;
  std::vector<ibv_wc> ring_;
  uint32_t head_ = 0;  // next to poll
  std::atomic<uint32_t> count_{0};
  Arm arm_ = Arm::kNone;
  std::atomic<uint64_t> overruns_{0};
};

}  // namespace uroce::core
