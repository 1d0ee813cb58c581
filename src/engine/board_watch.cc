#include "engine/board_watch.h"

#include <algorithm>

#include "engine/ack_board.h"
#include "engine/engine_qp.h"
#include "engine/roles.h"
#include "transport/shm_transport.h"

namespace uroce::engine {

void BoardWatch::join(EngineQp& qp) {
  if (!board_ || qp.type != IBV_QPT_RC) return;
  board_->clear_board(board_cell(qp.qp_num()));
  qp.board.seen.store(0, std::memory_order_relaxed);
  qp.board.behind_read.store(false, std::memory_order_relaxed);
  if (qp.board.watched) return;
  qp.board.watched = true;
  std::lock_guard lock(join_mu_);
  joining_.push_back(&qp);
  joining_count_.store(joining_.size(), std::memory_order_relaxed);
}

void BoardWatch::withdraw(EngineQp* qp) {
  std::erase(watched_, qp);
  std::lock_guard lock(join_mu_);
  std::erase(joining_, qp);
  joining_count_.store(joining_.size(), std::memory_order_relaxed);
}

bool BoardWatch::moved() { return board_ && board_->take_board_change(); }

void BoardWatch::admit_joiners() {
  std::lock_guard lock(join_mu_);
  watched_.insert(watched_.end(), joining_.begin(), joining_.end());
  joining_.clear();
  joining_count_.store(0, std::memory_order_relaxed);
}

void BoardWatch::take(TxBatch& tx, bool moved) {
  if (joining_count_.load(std::memory_order_relaxed) != 0) admit_joiners();
  if (!moved && !behind_read_) return;
  bool behind = false;
  for (EngineQp* qp : watched_) {
    // Unlocked first: most watched QPs' cells did not change.
    bool held = qp->board.behind_read.load(std::memory_order_relaxed);
    if (!held && board_->board_word(board_cell(qp->qp_num())) == qp->board.seen.load(std::memory_order_relaxed))
      continue;
    std::lock_guard ql(qp->mu);
    read_cell(*qp, tx);
    behind = behind || qp->board.behind_read.load(std::memory_order_relaxed);
  }
  behind_read_ = behind;
}

// A word that changed (or waits behind a READ: take() chose the QP) is the
// responder's latest ACK, if the QP's connected responder wrote it; the
// completer checks it as the ACK packet it stands for. A QP that sends no
// more (not RTS/SQD) takes none, as the completer would drop it, uncounted.
void BoardWatch::read_cell(EngineQp& qp, TxBatch& tx) {
  uint64_t word = board_->board_word(board_cell(qp.qp_num()));
  qp.board.seen.store(word, std::memory_order_relaxed);
  ibv_qp_state st = qp.state();
  std::optional<BoardAck> ack;
  if (st == IBV_QPS_RTS || st == IBV_QPS_SQD) ack = board_ack(word, qp.attr.dest_qp_num);
  if (ack)
    completer_receive_board(qp, *ack, tx);
  else
    qp.board.behind_read.store(false, std::memory_order_relaxed);
}

}  // namespace uroce::engine
