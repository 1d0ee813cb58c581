// Shared receive queue (ibv_create_srq): receive WQEs that any QP attached to
// it consumes. A QP's responder takes one WQE at a time (a copy) when a
// message starts; the limit event fires once when the number of WQEs drops
// below an armed srq_limit (IBA 10.2.9, SRQs; IBV_EVENT_SRQ_LIMIT_REACHED).
//
// Lock contract: `mu` guards rq, limit and xrc fields; it may be taken while
// holding a QP's mutex (QP -> SRQ order), never the other way round.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "core/container_of.h"
#include "core/limits.h"
#include "core/work_queue.h"

namespace uroce::core {

class Context;
struct Pd;
class Cq;
struct Xrcd;

class Srq {
 public:
  Srq(Context* ctx, Pd* pd, uint32_t max_wr, uint32_t max_sge);
  Srq(const Srq&) = delete;
  Srq& operator=(const Srq&) = delete;

  ibv_srq ibsrq{};  // ABI object
  Context* const ctx;
  Pd* const pd;
  std::atomic<int> qp_users{0};  // QPs attached (destroy -> EBUSY while > 0)
  // XRC SRQ (set at creation, then immutable): its domain, the CQ its
  // completions go to, and the number that addresses it on the wire.
  Xrcd* xrcd = nullptr;
  Cq* xrc_cq = nullptr;
  uint32_t srq_num = 0;

  [[nodiscard]] int post(const ibv_recv_wr& wr) noexcept;  // ibv_post_srq_recv: the data path
  // Moves the oldest WQE into `w`/`sges` (max_sge entries). Returns false when
  // empty. `*limit_reached` is set when this take crossed the armed limit.
  bool take(RecvWqe* w, Sge* sges, bool* limit_reached);
  [[nodiscard]] int modify(const ibv_srq_attr& attr, int mask);
  void query(ibv_srq_attr* attr);
  uint32_t max_sge() const { return max_sge_; }

  static Srq* from(ibv_srq* s) { return UROCE_CONTAINER_OF(s, Srq, ibsrq); }

 private:
  std::mutex mu_;
  RecvQueue rq_;
  uint32_t max_wr_;
  uint32_t max_sge_;
  uint32_t limit_ = 0;  // armed when non-zero
};

// Validates ibv_srq_init_attr caps (EINVAL past the device limits).
[[nodiscard]] int validate_srq_attr(const ibv_srq_attr& attr);

}  // namespace uroce::core
