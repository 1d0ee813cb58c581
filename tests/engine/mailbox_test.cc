// Same-host mailboxes (engine/mailbox.h): a lone short SEND of an RC QP
// whose peer opened its mailbox for the pair is written there as a record,
// with the requester's state as for a packet; a record in the QP's own
// mailbox is taken at its expected PSN, dropped behind it, left ahead of it,
// and anything else about it (no receive WQE: an RNR NAK) is the responder's
// state machine's, as for the packet it stands for.
#include "engine/mailbox.h"

#include <endian.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/guarded_access.h"
#include "engine/ack_board.h"
#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

class MailboxTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    transport->memory_path = true;
    transport->board_open = true;
    transport->mailboxes = true;
    transport->in_place_room = 1 << 16;
    bring_up();
    a_mr = reg(a, IBV_ACCESS_LOCAL_WRITE);
  }

  // Points this QP's sender at `box` instead of the page it found at RTR.
  void set_peer_box(Mailbox& box) {
    std::lock_guard lock(qp->mu);
    qp->mail_tx.peer.box = reinterpret_cast<uint8_t*>(&box);
  }
  Mailbox& peer_box() { return *reinterpret_cast<Mailbox*>(transport->peer_page->data()); }
  Mailbox& own_box() { return *reinterpret_cast<Mailbox*>(transport->own_page->data()); }
  uint64_t peer_tag(uint16_t generation = 7) const { return mailbox_tag(generation, qp->qp_num(), kPeerQpn); }

  void post(uint32_t len, ibv_wr_opcode op = IBV_WR_SEND, unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr wr{};
    wr.wr_id = 40 + len;
    wr.opcode = op;
    wr.send_flags = flags;
    wr.imm_data = htobe32(0xA1B2C3D4);
    post_send(wr, {sge(a.data(), len, a_mr)});
  }

  // Writes record `seq` of the peer into this QP's mailbox, as a sender does.
  void write_record(uint32_t seq, uint32_t psn, const std::vector<uint8_t>& payload, MailOp op = MailOp::kSend) {
    MailboxSlot& s = own_box().slots[seq % kMailboxSlots];
    s.head.psn = psn;
    s.head.length = uint32_t(payload.size());
    s.head.imm = htobe32(0x01020304);
    s.head.op = uint8_t(op);
    s.head.flags = 0;
    std::memcpy(s.payload, payload.data(), std::min<size_t>(payload.size(), kMailboxPayload));
    s.stamp.store(mailbox_stamp(own_box().open.load(), seq));
  }

  std::vector<uint8_t> a = pattern(4096, 3);
  core::Mr* a_mr = nullptr;
};

// The sender's side.

TEST_F(MailboxTest, LoneShortSendIsARecordInTheOpenMailbox) {
  peer_box().open.store(peer_tag());
  uint32_t psn0 = qp->req.psn;
  post(64, IBV_WR_SEND_WITH_IMM, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
  EXPECT_TRUE(sent.empty()) << "no packet: the record stands for it";
  EXPECT_EQ(transport->mail_notices, 1u);
  const MailboxSlot& s = peer_box().slots[0];
  EXPECT_EQ(s.stamp.load(), mailbox_stamp(peer_tag(), 0));
  EXPECT_EQ(s.head.psn, psn0);
  EXPECT_EQ(s.head.length, 64u);
  EXPECT_EQ(s.head.op, uint8_t(MailOp::kSendWithImm));
  EXPECT_EQ(s.head.imm, htobe32(0xA1B2C3D4));
  EXPECT_EQ(s.head.flags, kMailSolicited);
  EXPECT_EQ(0, std::memcmp(s.payload, a.data(), 64));
  {
    std::lock_guard lock(qp->mu);
    EXPECT_EQ(qp->req.psn, wire::psn_add(psn0, 1));
    EXPECT_TRUE(qp->timers.retransmit_armed) << "timed as a packet: resent as one if no ACK comes";
    EXPECT_EQ(qp->sq.at(0).first_psn, psn0);
  }
  EXPECT_EQ(engine->stats.mail_out.load(), 1u);
  // Its ACK, as for a packet, completes it.
  deliver(Craft{.opcode = kAck, .psn = psn0, .syndrome = 0x1F, .msn = 1});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].wr_id, 40u + 64);
}

TEST_F(MailboxTest, ClosedOrAnotherPairsMailboxTakesNoRecord) {
  post(32);  // never opened
  EXPECT_EQ(take().size(), 1u);
  deliver(Craft{.opcode = kAck, .psn = sq(0), .syndrome = 0x1F, .msn = 1});
  peer_box().open.store(mailbox_tag(7, qp->qp_num() + 1, kPeerQpn));
  post(32);
  EXPECT_EQ(take().size(), 1u);
  EXPECT_EQ(peer_box().slots[0].stamp.load(), 0u);
  EXPECT_EQ(transport->mail_notices, 0u);
}

TEST_F(MailboxTest, LongOtherOrNotLoneGoesAsAPacket) {
  peer_box().open.store(peer_tag());
  post(kMailboxPayload + 1);
  EXPECT_EQ(take().size(), 1u) << "longer than a slot";
  deliver(Craft{.opcode = kAck, .psn = sq(0), .syndrome = 0x1F, .msn = 1});
  post(8, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(take().size(), 1u) << "not a SEND";
  EXPECT_EQ(transport->mail_notices, 0u);
}

TEST_F(MailboxTest, FullMailboxWaitsForConsumed) {
  peer_box().open.store(peer_tag());
  for (uint32_t i = 0; i < kMailboxSlots; ++i) post(8);
  EXPECT_TRUE(sent.empty());
  post(8);
  EXPECT_EQ(take().size(), 1u) << "no slot free: a packet";
  peer_box().consumed.store(3);
  uint32_t psn = qp->req.psn;
  post(8);
  EXPECT_TRUE(sent.empty());
  EXPECT_EQ(peer_box().slots[0].stamp.load(), mailbox_stamp(peer_tag(), kMailboxSlots)) << "slot 0's next lap";
  EXPECT_EQ(peer_box().slots[0].head.psn, psn);
}

TEST_F(MailboxTest, ReopenedMailboxCountsFromZero) {
  peer_box().open.store(peer_tag(7));
  post(8);
  deliver(Craft{.opcode = kAck, .psn = sq(0), .syndrome = 0x1F, .msn = 1});
  peer_box().open.store(peer_tag(8));
  post(8);
  EXPECT_EQ(peer_box().slots[0].stamp.load(), mailbox_stamp(peer_tag(8), 0));
}

// A shared page as a peer's mailbox, whose file can be cut under the
// mapping: the next touch raises SIGBUS, as a mailbox page its receiver gave
// back does on a full /dev/shm.
class SharedPage {
 public:
  SharedPage() {
    fd_ = memfd_create("mailbox", MFD_CLOEXEC);
    if (fd_ >= 0 && ftruncate(fd_, kBytes) == 0)
      map_ = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  }
  ~SharedPage() {
    if (map_ != MAP_FAILED) munmap(map_, kBytes);
    if (fd_ >= 0) close(fd_);
  }
  SharedPage(const SharedPage&) = delete;
  SharedPage& operator=(const SharedPage&) = delete;

  bool ok() const { return map_ != MAP_FAILED; }
  Mailbox& box() const { return *static_cast<Mailbox*>(map_); }
  bool cut() const { return ftruncate(fd_, 0) == 0; }
  bool read_only() const { return mprotect(map_, kBytes, PROT_READ) == 0; }

 private:
  static constexpr size_t kBytes = transport::kMailboxBytes;
  int fd_ = -1;
  void* map_ = MAP_FAILED;
};

TEST_F(MailboxTest, PageThatFaultsSendsAPacketAndClosesTheMailbox) {
  core::arm_fault_guard();
  SharedPage page;
  ASSERT_TRUE(page.ok());
  page.box().open.store(peer_tag());
  set_peer_box(page.box());
  post(8);
  ASSERT_TRUE(sent.empty()) << "a record while the page is there";
  deliver(Craft{.opcode = kAck, .psn = sq(0), .syndrome = 0x1F, .msn = 1});
  ASSERT_TRUE(page.cut());
  post(8);  // SIGBUS on the tag's load, taken by the guard
  EXPECT_EQ(take().size(), 1u) << "sent as a packet";
  {
    std::lock_guard lock(qp->mu);
    EXPECT_EQ(qp->mail_tx.peer.box, nullptr) << "not tried again";
  }
  EXPECT_EQ(engine->stats.mail_out.load(), 1u);
}

// The tag reads, the slot's writes fault: the payload's copy (inline bytes
// or registered memory) and, for an empty SEND, the fields.
TEST_F(MailboxTest, SlotThatCannotBeWrittenSendsAPacket) {
  core::arm_fault_guard();
  SharedPage page;
  ASSERT_TRUE(page.ok());
  page.box().open.store(peer_tag());
  set_peer_box(page.box());
  ASSERT_TRUE(page.read_only());
  post(8, IBV_WR_SEND, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  EXPECT_EQ(take().size(), 1u) << "inline bytes: sent as a packet";
  post(8);
  EXPECT_EQ(take().size(), 1u) << "registered memory: sent as a packet";
  {
    std::lock_guard lock(qp->mu);
    EXPECT_NE(qp->mail_tx.peer.box, nullptr) << "a payload's fault may be the source's: the mailbox stays";
  }
  post(0);
  EXPECT_EQ(take().size(), 1u) << "no payload, the fields' write faults: sent as a packet";
  {
    std::lock_guard lock(qp->mu);
    EXPECT_EQ(qp->mail_tx.peer.box, nullptr) << "not tried again";
  }
  EXPECT_EQ(page.box().slots[0].stamp.load(), 0u);
  EXPECT_EQ(transport->mail_notices, 0u);
}

// The receiver's side.

TEST_F(MailboxTest, OpenedAtRtrForThePeerQp) {
  uint64_t tag = own_box().open.load();
  EXPECT_TRUE(mailbox_tag_of_pair(tag, kPeerQpn, qp->qp_num()));
  EXPECT_EQ(own_box().consumed.load(), 0u);
}

TEST_F(MailboxTest, RecordAtTheExpectedPsnIsDeliveredAckedAndCompleted) {
  std::vector<uint8_t> buf(256, 0);
  recv_buf(buf, 77);
  auto payload = pattern(100, 5);
  write_record(0, rq(0), payload, MailOp::kSendWithImm);
  EXPECT_TRUE(engine->poll_receive());
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 77u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 100u);
  EXPECT_TRUE(wc[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(wc[0].imm_data, htobe32(0x01020304));
  EXPECT_EQ(wc[0].src_qp, kPeerQpn);
  EXPECT_EQ(0, std::memcmp(buf.data(), payload.data(), payload.size()));
  EXPECT_EQ(own_box().consumed.load(), 1u);
  ASSERT_EQ(transport->board.size(), 1u) << "the ACK, a word on the peer's board";
  EXPECT_EQ(transport->board[0].word, board_word(BoardAck{rq(0), 1}, qp->qp_num()));
  EXPECT_TRUE(sent.empty());
  EXPECT_EQ(engine->stats.mail_in.load(), 1u);
}

TEST_F(MailboxTest, RecordBehindTheExpectedPsnIsDroppedAheadIsLeft) {
  std::vector<uint8_t> buf(256, 0), buf2(256, 0);
  recv_buf(buf, 1);
  recv_buf(buf2, 2);
  // The packet with rq(0) (a resend) got there first.
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(10, 1), .bare = true});
  ASSERT_EQ(poll(*rcq).size(), 1u);
  write_record(0, rq(0), pattern(10, 1));
  write_record(1, rq(2), pattern(10, 2));  // rq(1) not here yet
  EXPECT_TRUE(engine->poll_receive());
  EXPECT_EQ(own_box().consumed.load(), 1u) << "the duplicate handed back, the one ahead left";
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_EQ(engine->stats.rx_duplicates.load(), 1u);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(1), .ack_req = true, .payload = pattern(10, 3), .bare = true});
  EXPECT_EQ(poll(*rcq).size(), 1u);
  take();
  EXPECT_TRUE(engine->poll_receive());
  EXPECT_EQ(own_box().consumed.load(), 2u) << "at its PSN now: taken (no receive WQE left: an RNR NAK)";
  auto pkts = take();
  ASSERT_EQ(pkts.size(), 1u);
  EXPECT_EQ(pkts[0].syndrome, rnr_nak(min_rnr_timer));
  EXPECT_EQ(pkts[0].psn, rq(2));
  EXPECT_TRUE(poll(*rcq).empty());
}

// As rxe answers a SEND that finds no receive WQE: an RNR NAK at once, so
// that the sender's RNR timer and rnr_retry apply (not its ACK timer and
// retry_cnt); the record is handed back and the resend is a packet.
TEST_F(MailboxTest, RecordWithoutAReceiveWqeIsAnRnrNak) {
  write_record(0, rq(0), pattern(10, 1));
  EXPECT_TRUE(engine->poll_receive());
  EXPECT_EQ(own_box().consumed.load(), 1u);
  auto pkts = take();
  ASSERT_EQ(pkts.size(), 1u);
  EXPECT_EQ(pkts[0].opcode, kAck);
  EXPECT_EQ(pkts[0].syndrome, rnr_nak(min_rnr_timer));
  EXPECT_EQ(pkts[0].psn, rq(0));
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
  std::vector<uint8_t> buf(64, 0);
  recv_buf(buf, 9);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(10, 1), .bare = true});
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 9u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
}

// Longer than the receive WQE: what the packet would have done — a NAK
// (invalid request), the receive completed in error, the QP in ERR — and
// the mailbox closed with it.
TEST_F(MailboxTest, RecordTooLongForItsWqeIsTheStateMachinesError) {
  std::vector<uint8_t> buf(16, 0);
  recv_buf(buf, 5);
  write_record(0, rq(0), pattern(64, 1));
  EXPECT_TRUE(engine->poll_receive());
  auto pkts = take();
  ASSERT_EQ(pkts.size(), 1u);
  EXPECT_EQ(pkts[0].opcode, kAck);
  EXPECT_EQ(pkts[0].syndrome, nak(1));
  auto wc = poll(*rcq);
  ASSERT_GE(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_LOC_LEN_ERR);
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  EXPECT_EQ(own_box().open.load(), 0u);
}

TEST_F(MailboxTest, ResetClosesAndRtrReopensUnderANewTag) {
  uint64_t first = own_box().open.load();
  {
    std::lock_guard lock(qp->mu);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(qp->modify(a, IBV_QP_STATE), 0);
  }
  EXPECT_EQ(own_box().open.load(), 0u);
  bring_up();
  uint64_t second = own_box().open.load();
  EXPECT_TRUE(mailbox_tag_of_pair(second, kPeerQpn, qp->qp_num()));
  EXPECT_NE(first, second);
}

TEST(MailboxStamp, NeverZeroAndDistinctPerRecordAndTag) {
  uint64_t t1 = mailbox_tag(1, 5, 6), t2 = mailbox_tag(2, 5, 6);
  for (uint32_t seq = 0; seq < 64; ++seq) {
    EXPECT_NE(mailbox_stamp(t1, seq), 0u);
    EXPECT_NE(mailbox_stamp(t1, seq), mailbox_stamp(t1, seq + kMailboxSlots));
    EXPECT_NE(mailbox_stamp(t1, seq), mailbox_stamp(t2, seq));
  }
  EXPECT_TRUE(mailbox_tag_of_pair(t1, 5, 6));
  EXPECT_FALSE(mailbox_tag_of_pair(t1, 6, 5));
  EXPECT_FALSE(mailbox_tag_of_pair(0, 0, 0));
}

}  // namespace
}  // namespace uroce::engine::test
