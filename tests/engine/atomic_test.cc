// Atomic operations (IBA 9.4.5, roce-facts.md §1.2/§2.3): COMPARE_SWAP and
// FETCH_ADD requests in, ATOMIC_ACKNOWLEDGE out (responder); atomic WQEs out,
// ATOMIC_ACKNOWLEDGE in (requester).
#include <cstring>

#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

class Atomic : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    qp_access |= IBV_ACCESS_REMOTE_ATOMIC;
    bring_up();
    mem.assign(64, 0);
    mr = reg(mem, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  }

  uint64_t word(size_t off) const {
    uint64_t v;
    std::memcpy(&v, mem.data() + off, 8);
    return v;
  }
  void set_word(size_t off, uint64_t v) { std::memcpy(mem.data() + off, &v, 8); }
  uint64_t va(size_t off) const { return reinterpret_cast<uint64_t>(mem.data()) + off; }

  // The single packet sent must be ATOMIC_ACKNOWLEDGE(psn) carrying `orig`.
  void expect_atomic_ack(uint32_t psn, uint64_t orig) {
    auto tx = take();
    ASSERT_EQ(tx.size(), 1u);
    EXPECT_EQ(tx[0].opcode, kAtomicAck);
    EXPECT_EQ(tx[0].psn, psn);
    ASSERT_TRUE(tx[0].syndrome.has_value());
    EXPECT_EQ(*tx[0].syndrome, 0x1F);
    ASSERT_TRUE(tx[0].atomic_orig.has_value());
    EXPECT_EQ(*tx[0].atomic_orig, orig);
  }

  void expect_nak(uint8_t syndrome, uint32_t psn) {
    auto tx = take();
    ASSERT_EQ(tx.size(), 1u);
    EXPECT_EQ(tx[0].opcode, kAck);
    ASSERT_TRUE(tx[0].syndrome.has_value());
    EXPECT_EQ(*tx[0].syndrome, syndrome);
    EXPECT_EQ(tx[0].psn, psn);
  }

  Craft fetch_add(uint32_t psn, size_t off, uint64_t add) {
    return Craft{.opcode = kFetchAdd,
                 .psn = psn,
                 .ack_req = true,
                 .atomic_va = va(off),
                 .atomic_rkey = mr->ibmr.rkey,
                 .swap_add = add};
  }

  std::vector<uint8_t> mem;
  core::Mr* mr = nullptr;
};

// Receive FETCH_ADD(+5) on a word holding 10 / Expect the word 15 and
// ATOMIC_ACKNOWLEDGE carrying the original 10.
TEST_F(Atomic, FetchAddReturnsOriginal) {
  set_word(8, 10);
  deliver(fetch_add(rq(0), 8, 5));
  EXPECT_EQ(word(8), 15u);
  expect_atomic_ack(rq(0), 10);
}

// Receive FETCH_ADD(+1) on a word holding 0x0102030405060708 / Expect the
// ATOMIC_ACKNOWLEDGE's bytes exactly: BTH (no SE, MigReq, pad or FECN/BECN,
// TVer 0, default P_Key, the peer's QP 0x000777, no AckReq, the request's
// PSN 1000), AETH (0x1F, MSN 1), AtomicAckETH (the original, big-endian),
// then a correct ICRC.
TEST_F(Atomic, AtomicAckBytesOnTheWire) {
  set_word(8, 0x0102030405060708);
  deliver(fetch_add(rq(0), 8, 1));
  ASSERT_EQ(sent.size(), 1u);
  const std::vector<uint8_t> golden = {
      0x12, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x07, 0x77, 0x00, 0x00, 0x03, 0xE8,  // BTH
      0x1F, 0x00, 0x00, 0x01,                                                  // AETH
      0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,                          // AtomicAckETH
  };
  EXPECT_EQ(without_icrc(sent[0]), golden);
  EXPECT_EQ(take().size(), 1u);  // parses, ICRC correct
}

// Receive the same FETCH_ADD twice (a retransmission after a lost response) /
// Expect one addition only; the duplicate's response replays the saved original.
TEST_F(Atomic, DuplicateIsReplayedNotReexecuted) {
  set_word(0, 100);
  deliver(fetch_add(rq(0), 0, 1));
  expect_atomic_ack(rq(0), 100);
  deliver(fetch_add(rq(0), 0, 1));
  EXPECT_EQ(word(0), 101u);
  expect_atomic_ack(rq(0), 100);
  // The next new atomic sees the one addition.
  deliver(fetch_add(rq(1), 0, 1));
  EXPECT_EQ(word(0), 102u);
  expect_atomic_ack(rq(1), 101);
}

// Receive COMPARE_SWAP with a matching, then a stale compare value / Expect the
// swap once; both responses carry the value found.
TEST_F(Atomic, CompareSwapSwapsOnlyOnMatch) {
  set_word(16, 7);
  Craft c{.opcode = kCompareSwap,
          .psn = rq(0),
          .ack_req = true,
          .atomic_va = va(16),
          .atomic_rkey = mr->ibmr.rkey,
          .swap_add = 99,
          .compare = 7};
  deliver(c);
  EXPECT_EQ(word(16), 99u);
  expect_atomic_ack(rq(0), 7);
  c.psn = rq(1);
  c.swap_add = 1234;  // compare 7 no longer matches
  deliver(c);
  EXPECT_EQ(word(16), 99u);
  expect_atomic_ack(rq(1), 99);
}

// Receive FETCH_ADD at an address that is not 8-byte aligned / Expect NAK
// invalid request (0x61) and memory untouched.
TEST_F(Atomic, MisalignedIsInvalidRequest) {
  set_word(8, 3);
  deliver(fetch_add(rq(0), 12, 1));
  EXPECT_EQ(word(8), 3u);
  expect_nak(nak(1), rq(0));
}

// Receive FETCH_ADD on an MR without REMOTE_ATOMIC / Expect NAK remote access
// (0x62) and memory untouched.
TEST_F(Atomic, MrWithoutRemoteAtomicIsRemoteAccessNak) {
  std::vector<uint8_t> other(16, 0);
  core::Mr* plain = reg(other, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  Craft c{.opcode = kFetchAdd,
          .psn = rq(0),
          .ack_req = true,
          .atomic_va = reinterpret_cast<uint64_t>(other.data()),
          .atomic_rkey = plain->ibmr.rkey,
          .swap_add = 1};
  deliver(c);
  EXPECT_EQ(other[0], 0);
  expect_nak(nak(2), rq(0));
}

class AtomicNoQpAccess : public Atomic {
 protected:
  void SetUp() override {
    EngineTest::SetUp();  // QP without REMOTE_ATOMIC
    bring_up();
    mem.assign(64, 0);
    mr = reg(mem, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  }
};

// Receive FETCH_ADD on a QP that does not permit remote atomics / Expect NAK
// invalid request (as rxe's check_op_valid: the QP's access flags are checked first).
TEST_F(AtomicNoQpAccess, IsInvalidRequest) {
  deliver(fetch_add(rq(0), 0, 1));
  EXPECT_EQ(word(0), 0u);
  expect_nak(nak(1), rq(0));
}

// Post FETCH_ADD and COMPARE_SWAP / Expect the request packets with their
// AtomicETH fields and AckReq; the ATOMIC_ACKNOWLEDGEs put the original values
// in the local buffers and complete in order with byte_len 8.
TEST_F(Atomic, RequesterSendsAndCompletes) {
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.atomic.remote_addr = 0x10008;
  wr.wr.atomic.rkey = 0x33;
  wr.wr.atomic.compare_add = 42;
  post_send(wr, {sge(mem.data(), 8, mr)});
  wr.wr_id = 2;
  wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  wr.wr.atomic.compare_add = 5;
  wr.wr.atomic.swap = 6;
  post_send(wr, {sge(mem.data() + 8, 8, mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 2u);
  EXPECT_EQ(tx[0].opcode, kFetchAdd);
  EXPECT_EQ(tx[0].psn, sq(0));
  EXPECT_TRUE(tx[0].ack_req);
  EXPECT_EQ(*tx[0].atomic_va, 0x10008u);
  EXPECT_EQ(tx[0].atomic_rkey, 0x33u);
  EXPECT_EQ(tx[0].swap_add, 42u);
  EXPECT_EQ(tx[1].opcode, kCompareSwap);
  EXPECT_EQ(tx[1].psn, sq(1));
  EXPECT_EQ(tx[1].swap_add, 6u);
  EXPECT_EQ(tx[1].compare, 5u);

  deliver(Craft{.opcode = kAtomicAck, .psn = sq(0), .msn = 1, .atomic_orig = 0x1122334455667788});
  deliver(Craft{.opcode = kAtomicAck, .psn = sq(1), .msn = 2, .atomic_orig = 5});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(wc[0].byte_len, 8u);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].opcode, IBV_WC_COMP_SWAP);
  EXPECT_EQ(word(0), 0x1122334455667788u);
  EXPECT_EQ(word(8), 5u);
}

// Post two FETCH_ADDs; receive only the second's ATOMIC_ACKNOWLEDGE (the first
// one's was lost) / Expect both requests resent at once from the first one's PSN
// (go-back-N), then both complete in order with their own original values.
TEST_F(Atomic, LaterResponseResendsLostOne) {
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.atomic.remote_addr = 0x10000;
  wr.wr.atomic.rkey = 0x33;
  wr.wr.atomic.compare_add = 1;
  for (uint64_t id : {1, 2}) {
    wr.wr_id = id;
    post_send(wr, {sge(mem.data() + 8 * (id - 1), 8, mr)});
  }
  ASSERT_EQ(take().size(), 2u);
  deliver(Craft{.opcode = kAtomicAck, .psn = sq(1), .msn = 2, .atomic_orig = 41});
  EXPECT_TRUE(poll(*scq).empty());
  auto re = take();
  ASSERT_EQ(re.size(), 2u);
  EXPECT_EQ(re[0].opcode, kFetchAdd);
  EXPECT_EQ(re[0].psn, sq(0));
  EXPECT_EQ(re[1].psn, sq(1));
  // The responder replays both saved results.
  deliver(Craft{.opcode = kAtomicAck, .psn = sq(0), .msn = 1, .atomic_orig = 40});
  deliver(Craft{.opcode = kAtomicAck, .psn = sq(1), .msn = 2, .atomic_orig = 41});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(word(0), 40u);
  EXPECT_EQ(word(8), 41u);
}

// Post an atomic whose local buffer is not 8 bytes / Expect EINVAL at post (as rxe).
TEST_F(Atomic, LocalLengthMustBeEight) {
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  ibv_sge s = sge(mem.data(), 4, mr);
  wr.sg_list = &s;
  wr.num_sge = 1;
  std::lock_guard lock(qp->mu);
  EXPECT_EQ(qp->enqueue_send(wr), EINVAL);
}

}  // namespace
}  // namespace uroce::engine::test
