// Posting to a send queue: the one path ibv_post_send and ibv_wr_complete
// (the ibv_wr_* builders) both end in, so that the state and QP-type checks,
// the validation of each WR (core::Qp::enqueue_send, the opcode table
// core/wr_opcode.h), the requester's run and the poller hint happen once.
#pragma once

#include <infiniband/verbs.h>

#include "engine/engine_qp.h"

namespace uroce::engine {

enum class PostMode {
  kEach,          // ibv_post_send(3): WRs before the refused one stay posted
  kAllOrNothing,  // ibv_wr_post(3): "the entire posting will be aborted"
};

// Posts the chain `wr` (takes qp.mu). Returns 0 or an errno; on error
// `*bad_wr` is the refused WR (or the first, when the QP cannot send at all).
int post_send(EngineQp& qp, ibv_send_wr* wr, ibv_send_wr** bad_wr, PostMode mode);

}  // namespace uroce::engine
