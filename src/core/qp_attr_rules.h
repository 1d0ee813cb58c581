// QP state machine and attribute-mask rules (roce-facts §6.2–6.3, kernel
// verbs.c qp_state_table / ib_modify_qp_is_ok).
#pragma once

#include <infiniband/verbs.h>

namespace uroce::core {

// The required and optional attribute masks of one transition.
struct TransitionRule {
  bool valid = false;
  int required = 0;
  int optional = 0;
};

TransitionRule transition_rule(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next);

// `mask` without the attributes the kernel's uverbs ignores for `type`
// (uverbs_cmd.c, modify_qp_mask), before any check: an XRC initiator has no
// responder (MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER), an XRC target no requester
// (MAX_QP_RD_ATOMIC, RETRY_CNT, RNR_RETRY). Programs that set up every
// connected QP alike (perftest -c XRC) pass them, and a NIC takes the modify.
int without_ignored_attrs(ibv_qp_type type, int mask);

// 0 if `mask` is a legal modify of a `type` QP in state `cur`, else EINVAL.
// Without IBV_QP_STATE in the mask the QP stays in `cur`.
int check_modify_mask(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next, int mask);

const char* qp_state_name(ibv_qp_state s);

}  // namespace uroce::core
