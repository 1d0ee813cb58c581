#include "core/srq.h"

#include <algorithm>
#include <cerrno>

namespace uroce::core {

int validate_srq_attr(const ibv_srq_attr& a) {
  if (a.max_wr == 0 || a.max_wr > kMaxSrqWr || a.max_sge == 0 || a.max_sge > kMaxSrqSge) return EINVAL;
  if (a.srq_limit > a.max_wr) return EINVAL;
  return 0;
}

Srq::Srq(Context* c, Pd* p, uint32_t max_wr, uint32_t max_sge) : ctx(c), pd(p), max_wr_(max_wr), max_sge_(max_sge) {
  rq_.init(max_wr, max_sge);
}

int Srq::post(const ibv_recv_wr& wr) noexcept {
  if (wr.num_sge < 0 || uint32_t(wr.num_sge) > max_sge_) return EINVAL;
  std::lock_guard lock(mu_);
  if (rq_.size() >= max_wr_) return ENOMEM;
  rq_.push(wr);
  return 0;
}

bool Srq::take(RecvWqe* w, Sge* sges, bool* limit_reached) {
  std::lock_guard lock(mu_);
  *limit_reached = false;
  if (rq_.empty()) return false;
  uint32_t index = rq_.consumed++;
  *w = rq_.at(index);
  const Sge* s = rq_.sges(index);
  for (uint16_t i = 0; i < w->num_sge; ++i) sges[i] = s[i];
  // The event fires once; the application re-arms with ibv_modify_srq.
  if (limit_ && rq_.size() < limit_) {
    limit_ = 0;
    *limit_reached = true;
  }
  return true;
}

int Srq::modify(const ibv_srq_attr& a, int mask) {
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
  std::lock_guard lock(mu_);
  if (mask & IBV_SRQ_MAX_WR) {
    // Resize (IBV_DEVICE_SRQ_RESIZE): the posted WQEs move to the new ring, in order.
    if (a.max_wr == 0 || a.max_wr > kMaxSrqWr || a.max_wr < rq_.size()) return EINVAL;
    RecvQueue bigger;
    bigger.init(a.max_wr, max_sge_);
    for (uint32_t i = rq_.consumed; i != rq_.posted; ++i) {
      uint32_t slot = bigger.posted++;
      bigger.at(slot) = rq_.at(i);
      std::copy_n(rq_.sges(i), max_sge_, bigger.sges(slot));
    }
    rq_ = std::move(bigger);
    max_wr_ = a.max_wr;
  }
  if (mask & IBV_SRQ_LIMIT) {
    if (a.srq_limit > max_wr_) return EINVAL;
    limit_ = a.srq_limit;
  }
  return 0;
}

void Srq::query(ibv_srq_attr* a) {
  std::lock_guard lock(mu_);
  a->max_wr = max_wr_;
  a->max_sge = max_sge_;
  a->srq_limit = limit_;
}

}  // namespace uroce::core
