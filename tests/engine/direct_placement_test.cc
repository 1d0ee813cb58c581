// Same-host direct placement (host/direct_placement.h): a WRITE or READ between
// two QPs of this host is copied at once and completes at once, with no
// packet, when the target's published QP and MR pass the responder's checks
// and nothing of the QP is in flight; otherwise it goes as packets (so the
// responder reports errors). Revocation waits for a busy placer.
//
// The QP under test (qp) and the target QP (target) are in one engine: the
// requester places into its own process, through the same window and checks
// as into another.
#include "host/direct_placement.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include "engine_harness.h"
#include "host/host_registry.h"

namespace uroce::engine::test {
namespace {

using host::DirectPlacement;
using host::HostRegistry;
using host::kLastHostSlot;

class DirectPlacementTest : public EngineTest {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "uroce-placement-test-" + std::to_string(getpid());
    ::unlink(path_.c_str());
    ::setenv("UROCE_HOST_REGISTRY", path_.c_str(), 1);
    configure_engine = [](EngineContext* e) {
      auto mine = HostRegistry::open(kLocalPort);
      ASSERT_TRUE(mine.ok()) << mine.err();
      e->attach_host_registry(std::move(*mine));
      ASSERT_TRUE(e->start_placement()) << errno;
    };
    EngineTest::SetUp();
    ASSERT_NE(engine->placement(), nullptr);
    core::QpCaps caps{64, 64, 4, 4, 64};
    target = new EngineQp(engine, pd.get(), scq.get(), rcq.get(), IBV_QPT_RC, caps, false, engine->allocate_qp_num(),
                          nullptr);
    engine->register_qp(target);
    connect(target, qp->qp_num(), target_access);
    connect(qp, target->qp_num(), IBV_ACCESS_LOCAL_WRITE);
  }
  void TearDown() override {
    if (target) {
      engine->unregister_qp(target);
      delete target;
    }
    EngineTest::TearDown();
    ::unlink(path_.c_str());
    ::unsetenv("UROCE_HOST_REGISTRY");
  }

  // RESET -> INIT -> RTR -> RTS towards `dest_qpn` of this engine (loopback).
  void connect(EngineQp* q, uint32_t dest_qpn, unsigned access) {
    std::lock_guard lock(q->mu);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(q->modify(a, IBV_QP_STATE), 0);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = access;
    ASSERT_EQ(q->modify(a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = 7;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = core::ipv4_to_gid(kLoopback);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.dlid = kLocalPort;
    a.ah_attr.port_num = 1;
    ASSERT_EQ(q->modify(a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 7;
    a.timeout = 14;
    a.retry_cnt = 3;
    a.rnr_retry = 3;
    a.max_rd_atomic = 4;
    ASSERT_EQ(q->modify(a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                               IBV_QP_MAX_QP_RD_ATOMIC),
              0);
    sent.clear();
  }

  void post_rdma(ibv_wr_opcode op, std::vector<uint8_t>& local, const core::Mr* lmr, uint64_t va, uint32_t rkey,
                 uint64_t wr_id = 1) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = va;
    wr.wr.rdma.rkey = rkey;
    post_send(wr, {sge(local.data(), uint32_t(local.size()), lmr)});
  }

  // The opcodes of the packets sent (to this engine's own port), cleared.
  std::vector<uint8_t> take_opcodes() {
    std::vector<uint8_t> out;
    for (const Sent& p : sent) {
      EXPECT_EQ(p.dst, (transport::Endpoint{kLoopback, kLocalPort}));
      out.push_back(p.bytes.at(0));  // the BTH's first byte
    }
    sent.clear();
    return out;
  }

  // The window's busy word of `slot` (layout of DirectPlacement::Window:
  // magic, owner pid, slot, then one 64-byte {word, pid} per slot).
  struct BusyView {
    void* map = nullptr;
    size_t len = 0;
    std::atomic<uint32_t>* word = nullptr;
    std::atomic<uint32_t>* pid = nullptr;
    ~BusyView() {
      if (map) munmap(map, len);
    }
  };
  void map_busy(unsigned slot, BusyView* v) {
    std::string window =
        path_ + ".place." + std::to_string(getpid()) + "." + std::to_string(engine->host_registry()->slot());
    int fd = ::open(window.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << window;
    v->len = 64 * (kLastHostSlot + 2);
    v->map = mmap(nullptr, v->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(v->map, MAP_FAILED);
    auto* base = static_cast<uint8_t*>(v->map) + 64 * (size_t(slot) + 1);
    v->word = reinterpret_cast<std::atomic<uint32_t>*>(base);
    v->pid = reinterpret_cast<std::atomic<uint32_t>*>(base + 4);
  }

  unsigned target_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  std::string path_;
  EngineQp* target = nullptr;
};

uint64_t addr(const std::vector<uint8_t>& b) { return reinterpret_cast<uint64_t>(b.data()); }

// Post: a 3000-byte WRITE into a target MR with REMOTE_WRITE.
// Expect: no packet, a successful completion at once, the bytes there.
TEST_F(DirectPlacementTest, WriteIsPlacedAndCompletesAtPost) {
  std::vector<uint8_t> src = pattern(3000, 5), dst(4096, 0);
  core::Mr* smr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* dmr = reg(dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  post_rdma(IBV_WR_RDMA_WRITE, src, smr, addr(dst) + 100, dmr->ibmr.rkey);
  EXPECT_TRUE(sent.empty());
  auto wcs = poll(*scq);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin() + 100));
  EXPECT_EQ(dst[99], 0);
  EXPECT_EQ(dst[3100], 0);
  EXPECT_EQ(engine->placement()->placed_writes(), 1u);
  EXPECT_EQ(engine->placement()->placed_bytes(), 3000u);
}

// Post: a READ of a target MR with REMOTE_READ, through an iova-based MR.
// Expect: no packet, completion with byte_len, the bytes here.
TEST_F(DirectPlacementTest, ReadIsPlacedThroughTheIova) {
  std::vector<uint8_t> remote = pattern(2048, 9), local(512, 0);
  core::Mr* rmr = reg(remote, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, 0x10000);
  core::Mr* lmr = reg(local, IBV_ACCESS_LOCAL_WRITE);
  post_rdma(IBV_WR_RDMA_READ, local, lmr, 0x10000 + 1000, rmr->ibmr.rkey);
  EXPECT_TRUE(sent.empty());
  auto wcs = poll(*scq);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].byte_len, 512u);
  EXPECT_TRUE(std::equal(local.begin(), local.end(), remote.begin() + 1000));
  EXPECT_EQ(engine->placement()->placed_reads(), 1u);
}

// Post: WRITEs that the responder would refuse (wrong key, out of bounds, MR
// without REMOTE_WRITE, deregistered MR) and a READ of an MR without REMOTE_READ.
// Expect: each goes as packets (the responder answers them), nothing is written,
// nothing completes yet.
TEST_F(DirectPlacementTest, WhatTheResponderWouldRefuseGoesAsPackets) {
  std::vector<uint8_t> src = pattern(256, 1), dst(1024, 0), ro(1024, 0), gone(1024, 0);
  core::Mr* smr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* dmr = reg(dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  core::Mr* romr = reg(ro, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* gmr = reg(gone, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  uint32_t gone_rkey = gmr->ibmr.rkey;
  ASSERT_EQ(engine->mrs.remove(gmr), 0);
  std::erase(mrs, gmr);

  struct Case {
    const char* what;
    ibv_wr_opcode op;
    uint64_t va;
    uint32_t rkey;
  } cases[] = {
      {"wrong key", IBV_WR_RDMA_WRITE, addr(dst), dmr->ibmr.rkey ^ 0x1},
      {"out of bounds", IBV_WR_RDMA_WRITE, addr(dst) + 800, dmr->ibmr.rkey},
      {"no REMOTE_WRITE", IBV_WR_RDMA_WRITE, addr(ro), romr->ibmr.rkey},
      {"deregistered", IBV_WR_RDMA_WRITE, addr(gone), gone_rkey},
      {"no REMOTE_READ", IBV_WR_RDMA_READ, addr(dst), dmr->ibmr.rkey},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    // A fresh pair per case: the previous one waits for its ACK.
    connect(target, qp->qp_num(), target_access);
    connect(qp, target->qp_num(), IBV_ACCESS_LOCAL_WRITE);
    post_rdma(c.op, src, smr, c.va, c.rkey);
    EXPECT_EQ(take_opcodes(), std::vector<uint8_t>{c.op == IBV_WR_RDMA_READ ? kReadRequest : kWriteOnly});
    EXPECT_TRUE(poll(*scq).empty());
  }
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 1024);
  EXPECT_EQ(std::count(ro.begin(), ro.end(), 0), 1024);
  EXPECT_EQ(std::count(gone.begin(), gone.end(), 0), 1024);
  EXPECT_EQ(engine->placement()->placed_writes() + engine->placement()->placed_reads(), 0u);
}

// Post: a WRITE to a target QP without REMOTE_WRITE, and to a target QP in ERR.
// Expect: packets; nothing written.
TEST_F(DirectPlacementTest, TargetQpStateAndAccessAreChecked) {
  std::vector<uint8_t> src = pattern(64, 2), dst(64, 0);
  core::Mr* smr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* dmr = reg(dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  connect(target, qp->qp_num(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  connect(qp, target->qp_num(), IBV_ACCESS_LOCAL_WRITE);
  post_rdma(IBV_WR_RDMA_WRITE, src, smr, addr(dst), dmr->ibmr.rkey);
  EXPECT_EQ(take_opcodes(), std::vector<uint8_t>{kWriteOnly});

  connect(target, qp->qp_num(), target_access);
  connect(qp, target->qp_num(), IBV_ACCESS_LOCAL_WRITE);
  {
    std::lock_guard lock(target->mu);
    target->enter_error();
  }
  post_rdma(IBV_WR_RDMA_WRITE, src, smr, addr(dst), dmr->ibmr.rkey);
  EXPECT_EQ(take_opcodes(), std::vector<uint8_t>{kWriteOnly});
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 64);
}

// Post: a SEND (unacknowledged), then a WRITE. Expect: the WRITE goes as a
// packet behind the SEND (placement would overtake it), and nothing completes.
TEST_F(DirectPlacementTest, NothingOvertakesAMessageInFlight) {
  std::vector<uint8_t> src = pattern(64, 4), dst(64, 0);
  core::Mr* smr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* dmr = reg(dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  post_send(wr, {sge(src.data(), 64, smr)});
  post_rdma(IBV_WR_RDMA_WRITE, src, smr, addr(dst), dmr->ibmr.rkey);
  EXPECT_EQ(take_opcodes(), (std::vector<uint8_t>{kSendOnly, kWriteOnly}));
  EXPECT_TRUE(poll(*scq).empty());
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 64);
}

// A live engine's slot is busy placing into our window: deregistration waits
// until it is done. Expect: ibv_dereg_mr has not returned while the word is
// set (within 30 ms, well inside the 100 ms bound), and returns once it clears.
TEST_F(DirectPlacementTest, DeregistrationWaitsForABusyPlacer) {
  auto other = HostRegistry::open(kLocalPort + 1);  // another live engine of this host
  ASSERT_TRUE(other.ok()) << other.err();
  BusyView busy;
  map_busy((*other)->slot(), &busy);
  busy.pid->store(uint32_t(getpid()));
  busy.word->store(1);
  std::vector<uint8_t> dst(64, 0);
  core::Mr* dmr = reg(dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  std::erase(mrs, dmr);
  auto removed = std::async(std::launch::async, [&] { return engine->mrs.remove(dmr); });
  EXPECT_EQ(removed.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout);
  busy.word->store(0);
  ASSERT_EQ(removed.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(removed.get(), 0);
}

// A word left set by a slot's previous owner (another pid), or by an engine
// that is gone: revocation does not wait for it.
TEST_F(DirectPlacementTest, AStaleBusyWordIsNotWaitedFor) {
  auto other = HostRegistry::open(kLocalPort + 1);
  ASSERT_TRUE(other.ok()) << other.err();
  unsigned live = (*other)->slot();
  BusyView stale, dead;
  map_busy(live, &stale);
  stale.pid->store(uint32_t(getpid()) + 1);  // not the slot's owner
  stale.word->store(1);
  map_busy(kLastHostSlot, &dead);  // no engine has this slot
  dead.word->store(3);
  std::vector<uint8_t> dst(64, 0);
  core::Mr* dmr = reg(dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  std::erase(mrs, dmr);
  auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(engine->mrs.remove(dmr), 0);
  // Waiting for either word would take the whole bound.
  EXPECT_LT(std::chrono::steady_clock::now() - started, DirectPlacement::kRevokeWait);
  stale.word->store(0);
  dead.word->store(0);
}

}  // namespace
}  // namespace uroce::engine::test
