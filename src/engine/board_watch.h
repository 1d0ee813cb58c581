// The requester's side of same-host ACKs on the board (ack_board.h): the RC
// QPs of an engine whose cells the receive turn reads, and the reading.
//
// A QP joins at RTR (join: any thread, under the QP's lock), which also
// clears its cell; joiners wait in a list of their own (under join_mu_,
// never held while a QP's lock is taken) until the next receive turn admits
// them, so that the watched list itself belongs to the turn's holder
// (rx_mu_, with the QP table's lock shared) and to withdraw (the QP table's
// lock exclusive), as the engine's other receive lists do.
//
// take() runs in every burst, after its datagrams and before its settling:
// a word that arrived with a reply is the ACK of the request the reply
// answers, and its send completion then comes before the reply's receive
// completion (which settling releases), as with the ACK packet first. It
// reads the cells when the board moved (ShmTransport::take_board_change) and
// those of QPs whose last word passed a READ or atomic whose responses had
// not come yet (they come as packets, in the ring, after the word may have
// been read): such a word acknowledges only up to the READ, and is read
// again at the next burst.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <vector>

#include "engine/tx_batch.h"

namespace uroce::transport {
class ShmTransport;
}

namespace uroce::engine {

class EngineQp;

class BoardWatch {
 public:
  // Reads `board` (null: no same-host path; join and take do nothing).
  explicit BoardWatch(transport::ShmTransport* board) : board_(board) {}

  // An RC QP going to RTR (caller holds qp.mu): its cell cleared, the QP
  // watched from the next burst on.
  void join(EngineQp& qp);
  // The QP is being destroyed (caller holds the QP table's lock exclusively).
  void withdraw(EngineQp* qp);
  // Whether the board moved since the last look (the receive turn's holder):
  // the turn then has a burst to run even without datagrams.
  bool moved();
  // In a burst (the turn's holder, the QP table's lock shared): hands the
  // changed words of watched QPs to their completers; `moved` is what
  // moved() said for this turn.
  void take(TxBatch& tx, bool moved);

 private:
  void admit_joiners();
  void read_cell(EngineQp& qp, TxBatch& tx);

  transport::ShmTransport* board_;
  std::vector<EngineQp*> watched_;  // the turn's holder; withdraw
  bool behind_read_ = false;        // a watched QP's word waits for READ responses
  std::mutex join_mu_;              // guards joining_
  std::vector<EngineQp*> joining_;
  std::atomic<size_t> joining_count_{0};  // joining_.size(), read without the lock
};

}  // namespace uroce::engine
