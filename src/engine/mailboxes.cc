#include "engine/mailboxes.h"

#include <algorithm>

#include "engine/engine_qp.h"
#include "engine/mailbox.h"
#include "engine/roles.h"

namespace uroce::engine {

void Mailboxes::open(EngineQp& qp) {
  close(qp);
  if (!transport_ || qp.type != IBV_QPT_RC || qp.srq || !qp.delivery.through_memory()) return;
  if (qp.delivery.icrc() != TxBatch::Icrc::kOmit) return;  // captured or faulty: packets, where they are seen
  auto* box = reinterpret_cast<Mailbox*>(transport_->own_mailbox(mailbox_cell(qp.qp_num())));
  if (!box) return;
  uint32_t generation = box->generation.load(std::memory_order_relaxed) + 1;
  if (uint16_t(generation) == 0) ++generation;
  box->generation.store(generation, std::memory_order_relaxed);
  uint64_t tag = mailbox_tag(uint16_t(generation), qp.attr.dest_qp_num, qp.qp_num());
  box->consumed.store(0, std::memory_order_relaxed);
  qp.mail_rx.seq.store(0, std::memory_order_relaxed);
  qp.mail_rx.tag.store(tag, std::memory_order_relaxed);
  qp.mail_rx.box.store(box, std::memory_order_release);
  box->open.store(tag, std::memory_order_release);  // last: the sender may write from here on
  if (qp.mail_rx.listed) return;
  qp.mail_rx.listed = true;
  std::lock_guard lock(join_mu_);
  joining_.push_back(&qp);
  joining_count_.store(joining_.size(), std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void Mailboxes::close(EngineQp& qp) {
  if (Mailbox* box = qp.mail_rx.box.exchange(nullptr, std::memory_order_relaxed))
    box->open.store(0, std::memory_order_release);
}

void Mailboxes::withdraw(EngineQp* qp) {
  {
    std::lock_guard ql(qp->mu);
    close(*qp);
    if (!qp->mail_rx.listed) return;
    qp->mail_rx.listed = false;
  }
  transport_->release_mailbox(mailbox_cell(qp->qp_num()));
  std::erase(listed_, qp);
  std::lock_guard lock(join_mu_);
  std::erase(joining_, qp);
  joining_count_.store(joining_.size(), std::memory_order_relaxed);
  count_.fetch_sub(1, std::memory_order_relaxed);
}

void Mailboxes::admit_joiners() {
  std::lock_guard lock(join_mu_);
  listed_.insert(listed_.end(), joining_.begin(), joining_.end());
  joining_.clear();
  joining_count_.store(0, std::memory_order_relaxed);
}

// Unlocked: whether the QP's next record is there.
bool Mailboxes::has_record(const EngineQp& qp) {
  Mailbox* box = qp.mail_rx.box.load(std::memory_order_acquire);
  if (!box) return false;
  uint32_t seq = qp.mail_rx.seq.load(std::memory_order_relaxed);
  uint64_t stamp = mailbox_stamp(qp.mail_rx.tag.load(std::memory_order_relaxed), seq);
  return box->slots[seq % kMailboxSlots].stamp.load(std::memory_order_acquire) == stamp;
}

// A few mailboxes are looked at directly (a ping-pong's record then costs
// one line, not the generation's line and then its own); more only when the
// generation moved or a record was left where it was.
bool Mailboxes::ready() {
  if (joining_count_.load(std::memory_order_relaxed) != 0) admit_joiners();
  if (listed_.size() > kAlwaysLooked && !left_) {
    uint64_t gen = transport_->mail_generation();
    if (gen == gen_seen_) return false;
    gen_seen_ = gen;
  }
  return std::any_of(listed_.begin(), listed_.end(), [](const EngineQp* qp) { return has_record(*qp); });
}

size_t Mailboxes::take(TxBatch& tx) {
  size_t taken = 0;
  bool left = false;
  for (EngineQp* qp : listed_) {
    if (!has_record(*qp)) continue;  // most mailboxes hold nothing new
    std::lock_guard ql(qp->mu);
    taken += take_from(*qp, tx);
    left = left || has_record(*qp);
  }
  left_ = left;
  return taken;
}

// The records at the head of the QP's mailbox, in order, until one is left
// where it is (responder_take_mail); each slot handed back (`consumed`) once
// read.
size_t Mailboxes::take_from(EngineQp& qp, TxBatch& tx) {
  Mailbox* box = qp.mail_rx.box.load(std::memory_order_relaxed);  // closed meanwhile: null
  uint64_t tag = qp.mail_rx.tag.load(std::memory_order_relaxed);
  size_t taken = 0;
  for (unsigned i = 0; box && i < kMailboxSlots; ++i) {
    uint32_t seq = qp.mail_rx.seq.load(std::memory_order_relaxed);
    MailboxSlot& s = box->slots[seq % kMailboxSlots];
    if (s.stamp.load(std::memory_order_acquire) != mailbox_stamp(tag, seq)) break;
    const MailHead& h = s.head;
    MailRecord r{h.psn, h.length, h.imm, MailOp(h.op), (h.flags & kMailSolicited) != 0, s.payload};
    if (responder_take_mail(qp, r, tx) == MailTake::kLeft) break;
    qp.mail_rx.seq.store(seq + 1, std::memory_order_relaxed);
    box->consumed.store(seq + 1, std::memory_order_release);
    ++taken;
  }
  return taken;
}

}  // namespace uroce::engine
