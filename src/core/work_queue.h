// Send and receive work queues: fixed-capacity rings of WQEs copied from the
// application's work requests at post time (so the application may reuse its
// ibv_send_wr/ibv_sge immediately, as verbs promise).
//
// Lock contract: every field is guarded by the owning QP's mutex.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <vector>

#include "core/mr.h"
#include "core/wr_opcode.h"  // is_atomic, is_read_or_atomic

namespace uroce::core {

struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

// Destination of a UD send (from its address handle).
struct UdDest {
  ibv_gid dgid{};  // IPv4-mapped or IPv6
  uint16_t dst_port = 0;
  uint8_t sgid_index = 0;
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
};

struct SendWqe {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned send_flags = 0;
  uint32_t imm_data = 0;  // network order, as in ibv_send_wr
  uint32_t invalidate_rkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  UdDest ud;
  uint32_t remote_srqn = 0;      // XRC: the target's XRC SRQ
  struct Mr* bind_mw = nullptr;  // IBV_WR_BIND_MW / ibv_bind_mw: the window
  MwBind bind;
  uint32_t length = 0;  // total message length
  uint16_t num_sge = 0;
  bool is_inline = false;
  bool signaled = false;

  // Requester/completer bookkeeping.
  uint32_t first_psn = 0;
  uint32_t last_psn = 0;
  bool started = false;  // first packet assigned its PSN
  // READ: response packets one request asks for at most, fixed at the first
  // (the requester's window share then): its parts, and any re-request stays
  // inside the part it repeats (engine/requester.cc, send_read_request).
  uint32_t read_part_packets = 0;
  uint32_t read_requested = 0;  // READ: response packets asked for so far (a request below repeats one)
  bool completed = false;       // completion decided (status below)
  ibv_wc_status status = IBV_WC_SUCCESS;
  uint64_t atomic_orig = 0;  // returned value of an atomic
};

struct RecvWqe {
  uint64_t wr_id = 0;
  uint16_t num_sge = 0;
  uint32_t length = 0;  // sum of SGE lengths
};

// Ring indices are free-running 32-bit counters; slot = index & mask.
class SendQueue {
 public:
  void init(uint32_t max_wr, uint32_t max_sge, uint32_t max_inline);
  uint32_t capacity() const { return mask_ + 1; }
  uint32_t max_sge() const { return max_sge_; }
  uint32_t max_inline() const { return max_inline_; }
  bool full() const { return posted - retired == capacity(); }
  bool empty() const { return posted == retired; }

  SendWqe& at(uint32_t index) { return wqes_[index & mask_]; }
  Sge* sges(uint32_t index) { return &sges_[size_t(index & mask_) * max_sge_]; }
  uint8_t* inline_buf(uint32_t index) { return &inline_[size_t(index & mask_) * max_inline_]; }

  uint32_t posted = 0;   // producer: next index to post
  uint32_t retired = 0;  // oldest WQE not yet completed/removed

 private:
  uint32_t mask_ = 0;
  uint32_t max_sge_ = 0;
  uint32_t max_inline_ = 0;
  std::vector<SendWqe> wqes_;
  std::vector<Sge> sges_;
  std::vector<uint8_t> inline_;
};

class RecvQueue {
 public:
  void init(uint32_t max_wr, uint32_t max_sge);
  uint32_t capacity() const { return mask_ + 1; }
  uint32_t max_sge() const { return max_sge_; }
  bool full() const { return posted - consumed == capacity(); }
  bool empty() const { return posted == consumed; }
  uint32_t size() const { return posted - consumed; }

  RecvWqe& at(uint32_t index) { return wqes_[index & mask_]; }
  Sge* sges(uint32_t index) { return &sges_[size_t(index & mask_) * max_sge_]; }
  // Copies a receive WR into the next slot (the caller checked num_sge and room).
  void push(const ibv_recv_wr& wr);

  uint32_t posted = 0;
  uint32_t consumed = 0;

 private:
  uint32_t mask_ = 0;
  uint32_t max_sge_ = 0;
  std::vector<RecvWqe> wqes_;
  std::vector<Sge> sges_;
};

uint32_t round_up_pow2(uint32_t v);

}  // namespace uroce::core
