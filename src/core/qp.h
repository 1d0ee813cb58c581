// Queue pair: the verbs-visible part (ABI object, attributes, state machine,
// work queues). The transport roles that act on it live in src/engine.
//
// Lock contract: mu guards every field below except the immutable ones set
// at construction (ctx, pd, CQs, type, caps, qp number).
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "base/fast_mutex.h"
#include "core/container_of.h"
#include "core/work_queue.h"

namespace uroce::core {

class Context;
class Cq;
struct Pd;
class Srq;

struct QpCaps {
  uint32_t max_send_wr = 0;
  uint32_t max_recv_wr = 0;
  uint32_t max_send_sge = 0;
  uint32_t max_recv_sge = 0;
  uint32_t max_inline_data = 0;
};

// Validates the requested capabilities of a new QP and rounds them to what
// uroce provides; EINVAL when a limit is exceeded.
int validate_qp_caps(ibv_qp_type type, const ibv_qp_cap& requested, QpCaps* out);

// The rules of ibv_modify_qp on the attributes alone: checks a modify of a
// `type` QP whose current attributes are `cur` (the state machine, the masks,
// the value limits; `ctx`: whose GID table the AV must name) and stores the new
// attributes there. Returns an errno; `cur` is unchanged on error. Also used
// for XRC target QPs, whose attributes live in their domain's shared memory.
int modify_qp_attrs(ibv_qp_type type, const Context& ctx, ibv_qp_attr& cur, const ibv_qp_attr& a, int mask);

class Qp {
 public:
  Qp(Context* ctx, Pd* pd, Cq* send_cq, Cq* recv_cq, ibv_qp_type type, const QpCaps& caps, bool sq_sig_all,
     uint32_t qp_num, void* qp_context);
  ~Qp();  // not virtual: Qp stays standard-layout for offsetof; delete the most-derived type
  Qp(const Qp&) = delete;
  Qp& operator=(const Qp&) = delete;

  ibv_qp_ex ibqp{};  // ABI object; ibqp.qp_base is the ibv_qp
  Context* const ctx;
  Pd* const pd;
  Cq* const send_cq;
  Cq* const recv_cq;
  const ibv_qp_type type;
  const bool sq_sig_all;
  const QpCaps caps;

  Srq* srq = nullptr;  // receives come from here when set (ibv_qp_init_attr::srq)

  base::FastMutex mu;
  ibv_qp_attr attr{};  // current attributes; attr.qp_state is the state
  SendQueue sq;
  RecvQueue rq;

  uint32_t qp_num() const { return ibqp.qp_base.qp_num; }
  ibv_qp_state state() const { return attr.qp_state; }
  // The state, everywhere it shows: attr.qp_state, attr.cur_qp_state and the
  // ABI object's state (read by rdma-core's inline helpers). Caller holds mu.
  void set_state(ibv_qp_state s) {
    attr.qp_state = attr.cur_qp_state = s;
    ibqp.qp_base.state = s;
  }

  // Checks a modify against the state machine, the masks and the value
  // limits, then stores the attributes. Caller holds mu. Returns an errno.
  int apply_modify(const ibv_qp_attr& a, int mask);
  void query(ibv_qp_attr* a, ibv_qp_init_attr* init) const;

  // Validate one work request and copy it into the queue (caller holds mu).
  // `type1_bind`: the WR comes from ibv_bind_mw (type 1 windows are bound
  // through the send queue too, but never by a user's IBV_WR_BIND_MW).
  int enqueue_send(const ibv_send_wr& wr, bool type1_bind = false);
  int enqueue_recv(const ibv_recv_wr& wr);

  static Qp* from(ibv_qp* q) { return UROCE_CONTAINER_OF(reinterpret_cast<ibv_qp_ex*>(q), Qp, ibqp); }

 private:
  int check_send_opcode(const ibv_send_wr& wr) const;
};

}  // namespace uroce::core
