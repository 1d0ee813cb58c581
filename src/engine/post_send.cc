#include "engine/post_send.h"

#include <cerrno>
#include <mutex>

#include "engine/engine_context.h"
#include "engine/roles.h"
#include "transport/step_probe.h"

namespace uroce::engine {
namespace {

// Sends need RTS or a later state (rxe answers EINVAL before), and a send
// queue, which an XRC target (XRC_RECV) does not have: it only responds.
bool can_post_send(const EngineQp& qp) {
  ibv_qp_state st = qp.state();
  return st != IBV_QPS_RESET && st != IBV_QPS_INIT && st != IBV_QPS_RTR && qp.type != IBV_QPT_XRC_RECV;
}

// Queues the chain; on a refusal stops there. All or nothing: the WRs queued
// before it are taken back, which is safe because enqueue_send only fills the
// slot at sq.posted and then advances it, and nothing reads the queue before
// the requester runs, under the same lock.
int enqueue_chain(EngineQp& qp, ibv_send_wr* wr, ibv_send_wr** bad_wr, PostMode mode) {
  uint32_t mark = qp.sq.posted;
  for (; wr; wr = wr->next) {
    if (int err = qp.enqueue_send(*wr)) {
      *bad_wr = wr;
      if (mode == PostMode::kAllOrNothing) qp.sq.posted = mark;
      return err;
    }
  }
  return 0;
}

}  // namespace

int post_send(EngineQp& qp, ibv_send_wr* wr, ibv_send_wr** bad_wr, PostMode mode) {
  transport::step_probe::stamp(transport::step_probe::Step::kPost);  // ibv_post_send and ibv_wr_complete
  std::unique_lock lock(qp.mu);
  if (!can_post_send(qp)) {
    *bad_wr = wr;
    return EINVAL;
  }
  int err = enqueue_chain(qp, wr, bad_wr, mode);
  if (err && mode == PostMode::kAllOrNothing) return err;  // nothing new queued
  Clock::time_point sent_at{};  // the clock read that stamped what the post sent, if any (requester_post)
  if (qp.state() == IBV_QPS_ERR)
    qp.flush_send_queue();
  else
    sent_at = requester_post(qp);
  // A posting application polls next, usually.
  qp.engine()->note_poller(sent_at == Clock::time_point{} ? Clock::now() : sent_at);
  requester_after_post(qp, lock);
  return err;
}

}  // namespace uroce::engine
