#include "core/work_queue.h"

namespace uroce::core {

uint32_t round_up_pow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

void SendQueue::init(uint32_t max_wr, uint32_t max_sge, uint32_t max_inline) {
  uint32_t cap = round_up_pow2(max_wr ? max_wr : 1);
  mask_ = cap - 1;
  max_sge_ = max_sge ? max_sge : 1;
  max_inline_ = max_inline;
  wqes_.assign(cap, SendWqe{});
  sges_.assign(size_t(cap) * max_sge_, Sge{});
  inline_.assign(size_t(cap) * max_inline_, 0);
  posted = retired = 0;
}

void RecvQueue::init(uint32_t max_wr, uint32_t max_sge) {
  uint32_t cap = round_up_pow2(max_wr ? max_wr : 1);
  mask_ = cap - 1;
  max_sge_ = max_sge ? max_sge : 1;
  wqes_.assign(cap, RecvWqe{});
  sges_.assign(size_t(cap) * max_sge_, Sge{});
  posted = consumed = 0;
}

void RecvQueue::push(const ibv_recv_wr& wr) {
  uint32_t index = posted;
  RecvWqe& w = at(index);
  w.wr_id = wr.wr_id;
  w.num_sge = uint16_t(wr.num_sge);
  w.length = 0;
  Sge* s = sges(index);
  for (int i = 0; i < wr.num_sge; ++i) {
    s[i] = Sge{wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
    w.length += wr.sg_list[i].length;
  }
  ++posted;
}

}  // namespace uroce::core
