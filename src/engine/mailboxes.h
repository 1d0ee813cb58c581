// The receiver's side of same-host mailboxes (mailbox.h): the RC QPs of an
// engine whose mailboxes are open, and the receive turn's look at them.
//
// A QP opens its mailbox at RTR (open: any thread, under the QP's lock) when
// its peer is a process of this host reached without ICRC (Delivery), and
// closes it when it leaves the receiving states or is destroyed. As
// BoardWatch's, the list belongs to the receive turn's holder (rx_mu_, the
// QP table's lock shared) and to withdraw (the table's lock exclusive);
// joiners wait in a list of their own until the next turn admits them.
//
// take() runs at the start of every receive turn, before the rings: a record
// written before a packet of the same sender is then taken before it, as
// the two would have been in one ring (a packet taken first, ahead of its
// PSN, costs a sequence NAK and a resend, never a wrong delivery).
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <vector>

#include "engine/tx_batch.h"

namespace uroce::transport {
class DatagramTransport;
}

namespace uroce::engine {

class EngineQp;

class Mailboxes {
 public:
  explicit Mailboxes(transport::DatagramTransport* transport) : transport_(transport) {}

  // An RC QP going to RTR (caller holds qp.mu): its mailbox opened for its
  // peer QP under a new tag, if the peer is a process of this host.
  void open(EngineQp& qp);
  // The QP no longer receives (RESET, ERR; caller holds qp.mu): its
  // mailbox closed, so that its sender's records stay where they are.
  static void close(EngineQp& qp);
  // The QP is being destroyed (caller holds the QP table's lock exclusively).
  void withdraw(EngineQp* qp);
  // Whether any QP has a mailbox listed or joining (any thread, a hint).
  bool any() const { return count_.load(std::memory_order_relaxed) != 0; }
  // In a receive turn (the QP table's lock shared): whether a listed
  // mailbox has a record; then takes the records waiting, and says how many.
  // The turn reads the board between the two (EngineContext::take_mail).
  bool ready();
  size_t take(TxBatch& tx);

 private:
  void admit_joiners();
  static bool has_record(const EngineQp& qp);
  static size_t take_from(EngineQp& qp, TxBatch& tx);

  static constexpr size_t kAlwaysLooked = 4;

  transport::DatagramTransport* transport_;
  std::vector<EngineQp*> listed_;  // the turn's holder; withdraw
  uint64_t gen_seen_ = 0;          // the turn's holder: the mail generation last seen
  bool left_ = false;              // the turn's holder: a record was left where it was
  std::mutex join_mu_;             // guards joining_
  std::vector<EngineQp*> joining_;
  std::atomic<size_t> joining_count_{0};  // joining_.size(), read without the lock
  std::atomic<size_t> count_{0};          // listed and joining
};

}  // namespace uroce::engine
