// Fuzz target: the receive path of the engine — PacketView::parse, the ICRC
// check, dispatch, the responder and the completer behind it — as a peer
// reaches it with datagrams (design §4, §5).
//
// One engine over a capturing fake transport (no thread) with three QPs in RTS
// connected to one peer: an RC QP with a SEND, a READ and an atomic of its own
// outstanding, a UC QP and a UD QP, receives posted, and one MR open to every
// remote access. The input is a list of datagrams, each
//
//   [u16 length][u8 control][u8 psn_delta][length bytes]
//
// control bit 0: deliver from an unconnected address; bits 1-2: rewrite the
// BTH's destination QP to QP 0..2 (3: leave it); bit 3: rewrite the PSN to the
// QP's expected PSN (responder) or oldest unacknowledged PSN (completer) plus
// psn_delta - 8; bit 4: fix the ICRC, so that the packet reaches the roles;
// bit 5: end the burst here; bit 6: rewrite the R_Key of a RETH/AtomicETH to
// the MR's (keys are random); bit 7: end the burst, run the timers (time moves
// on 10 ms) and send pending READ responses. ASan and UBSan watch every access;
// the engine must never touch memory outside the MR and the receive buffers
// (all guarded by the sanitizer's redzones: they are heap vectors).
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/cq.h"
#include "core/device.h"
#include "core/mr.h"
#include "core/pd.h"
#include "engine/engine_context.h"
#include "engine/engine_qp.h"
#include "engine/roles.h"
#include "engine/tx_batch.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/psn.h"

using namespace uroce;
using namespace uroce::engine;

namespace {

constexpr uint16_t kLocalPort = 18515;
constexpr uint16_t kPeerPort = 19875;
constexpr uint32_t kPeerIp = 0x7F000001;
constexpr uint32_t kPeerQpn = 0x000777;
constexpr uint32_t kQkey = 0x11223344;

// Captures nothing: what the engine sends is not examined here (the engine
// protocol tests do that), only what it does with what it receives.
class NullTransport : public transport::DatagramTransport {
 public:
  size_t send_burst(std::span<transport::TxDatagram> burst) noexcept override {
    // Touch every byte, so that ASan checks what the engine hands over.
    for (auto& d : burst)
      for (unsigned i = 0; i < d.iovcnt; ++i)
        for (size_t j = 0; j < d.iov[i].iov_len; ++j) sink_ = uint8_t(sink_ ^ static_cast<const uint8_t*>(d.iov[i].iov_base)[j]);
    return burst.size();
  }
  size_t recv_burst(std::span<transport::RxDatagram>, int) noexcept override { return 0; }
  void wake() noexcept override {}
  uint16_t local_port() const noexcept override { return kLocalPort; }

 private:
  volatile uint8_t sink_ = 0;
};

void check(bool ok) {
  if (!ok) std::abort();
}

// What lives for the whole run: the context, a PD, a CQ and the MRs (opening
// a context reads the host's interfaces: too slow to repeat per input).
struct Engine {
  EngineContext* engine = nullptr;
  uint32_t local_ip = 0;
  core::Pd pd;
  std::unique_ptr<core::Cq> cq;
  std::vector<uint8_t> mem = std::vector<uint8_t>(1 << 16);
  std::vector<uint8_t> recv = std::vector<uint8_t>(8192);
  std::vector<uint8_t> local = std::vector<uint8_t>(4096);
  core::Mr* mr = nullptr;
  core::Mr* recv_mr = nullptr;
  core::Mr* local_mr = nullptr;

  Engine() {
    engine = EngineContext::open_with(core::devices()[0], std::make_unique<NullTransport>(), false);
    check(engine && engine->gid_ip(0, &local_ip));
    pd.ctx = engine;
    pd.ibpd.context = engine->ib();
    cq = std::make_unique<core::Cq>(engine->ib(), 4096, nullptr, nullptr);
    mr = add(mem, 0x40000000,
             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    recv_mr = add(recv, reinterpret_cast<uint64_t>(recv.data()), IBV_ACCESS_LOCAL_WRITE);
    local_mr = add(local, reinterpret_cast<uint64_t>(local.data()), IBV_ACCESS_LOCAL_WRITE);
  }
  core::Mr* add(std::vector<uint8_t>& buf, uint64_t iova, unsigned access) {
    auto r = engine->mrs.add(&pd, buf.data(), buf.size(), iova, access);
    check(r.ok());
    return *r;
  }
};

Engine& shared() {
  static Engine* e = new Engine;  // lives for the process
  return *e;
}

// Per input: three fresh QPs in RTS (RC with a SEND, a READ and an atomic
// outstanding, UC, UD), receives posted.
struct Rig {
  Engine& e = shared();
  EngineContext* engine = e.engine;
  core::Mr* mr = e.mr;
  uint32_t local_ip = e.local_ip;
  EngineQp* qps[3] = {};

  Rig() {
    const ibv_qp_type types[3] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};
    for (int i = 0; i < 3; ++i) {
      core::QpCaps caps{16, 16, 4, 4, 64};
      qps[i] = new EngineQp(engine, &e.pd, e.cq.get(), e.cq.get(), types[i], caps, false, engine->allocate_qp_num(),
                            nullptr);
      engine->register_qp(qps[i]);
      std::lock_guard lock(qps[i]->mu);
      bring_up(*qps[i]);
      for (int k = 0; k < 8; ++k) post_recv(*qps[i], k);
    }
    std::lock_guard lock(qps[0]->mu);
    post(*qps[0], IBV_WR_SEND, 3000);
    post(*qps[0], IBV_WR_RDMA_READ, 2500);
    post(*qps[0], IBV_WR_ATOMIC_FETCH_AND_ADD, 8);
  }

  ~Rig() {
    for (EngineQp* qp : qps) {
      engine->unregister_qp(qp);
      delete qp;
    }
    ibv_wc wc[64];
    while (e.cq->poll(64, wc) > 0) {
    }
  }

  void bring_up(EngineQp& qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = kQkey;
    a.qp_access_flags =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    bool ud = qp.type == IBV_QPT_UD, rc = qp.type == IBV_QPT_RC;
    check(qp.modify(a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS)) == 0);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = kPeerQpn;
    a.rq_psn = 1000;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = core::ipv4_to_gid(kPeerIp);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.dlid = kPeerPort;
    a.ah_attr.port_num = 1;
    int mask = ud ? IBV_QP_STATE
                  : IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        (rc ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0);
    check(qp.modify(a, mask) == 0);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 5000;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    mask = IBV_QP_STATE | IBV_QP_SQ_PSN |
           (rc ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC : 0);
    check(qp.modify(a, mask) == 0);
  }

  void post_recv(EngineQp& qp, int k) {
    ibv_sge sge{reinterpret_cast<uint64_t>(e.recv.data() + k * 1024), 1024, e.recv_mr->ibmr.lkey};
    ibv_recv_wr wr{};
    wr.wr_id = uint64_t(k);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    check(qp.enqueue_recv(wr) == 0);
  }

  void post(EngineQp& qp, ibv_wr_opcode op, uint32_t len) {
    ibv_sge sge{reinterpret_cast<uint64_t>(e.local.data()), len, e.local_mr->ibmr.lkey};
    ibv_send_wr wr{};
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.wr.rdma.remote_addr = 0x1000;
    wr.wr.rdma.rkey = 0x1234;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      wr.wr.atomic.remote_addr = 0x2000;
      wr.wr.atomic.rkey = 0x1234;
      wr.wr.atomic.compare_add = 1;
    }
    check(qp.enqueue_send(wr) == 0);
    requester_run(qp, TxBatch::local());
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  shared();  // process-wide state is made before libFuzzer starts counting leaks
  TxBatch::local();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Rig rig;
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<transport::RxDatagram> burst;
  auto now = Clock::now();
  auto deliver = [&] {
    if (!burst.empty()) rig.engine->process_burst(std::span(burst.data(), burst.size()));
    burst.clear();
    bufs.clear();
  };
  bufs.reserve(64);
  while (size >= 4) {
    uint16_t len = uint16_t(data[0] | data[1] << 8);
    uint8_t control = data[2], delta = data[3];
    data += 4;
    size -= 4;
    if (len > size) len = uint16_t(size);
    bufs.emplace_back(data, data + len);
    data += len;
    size -= len;
    std::vector<uint8_t>& p = bufs.back();
    EngineQp* qp = nullptr;
    if (p.size() >= wire::kBthSize) {
      wire::Bth bth(p.data());
      unsigned which = (control >> 1) & 3;
      if (which < 3) {
        qp = rig.qps[which];
        bth.set_dest_qp(qp->qp_num());
      }
      const wire::OpcodeInfo& info = wire::opcode_info(bth.opcode());
      if ((control & 64) && info.valid()) {
        for (wire::Hdr h : {wire::Hdr::kReth, wire::Hdr::kAtomicEth}) {
          size_t at = info.offset[unsigned(h)] + 8;  // VA, then R_Key
          if (info.has(h) && at + 4 <= p.size()) wire::store_be32(p.data() + at, rig.mr->ibmr.rkey);
        }
      }
      if ((control & 8) && qp) {
        bool response = bth.opcode() >= 0x0D && bth.opcode() <= 0x12;
        uint32_t base = response ? qp->comp.unacked_psn : qp->resp.epsn;
        bth.set_psn(wire::psn_add(base, uint32_t(delta) - 8));
      }
    }
    transport::RxDatagram d;
    d.src = transport::Endpoint{(control & 1) ? 0x0A000063u : kPeerIp, kPeerPort};
    d.dst_ip = rig.local_ip;
    if ((control & 16) && p.size() >= wire::kBthSize + wire::kIcrcSize) {
      wire::Ipv4Flow flow{d.src.ip.v4(), d.dst_ip.v4(), d.src.port, kLocalPort};
      uint32_t crc = wire::icrc_ipv4(flow, p.data(), p.size());
      std::memcpy(p.data() + p.size() - 4, &crc, 4);
    }
    d.data = p.data();
    d.len = uint32_t(p.size());
    burst.push_back(d);
    if ((control & 32) || burst.size() == 64) deliver();
    if (control & 128) {
      deliver();
      now += std::chrono::milliseconds(10);
      rig.engine->run_timers(now);
      for (int i = 0; i < 4 && rig.engine->send_reads(); ++i) {
      }
    }
  }
  deliver();
  while (rig.engine->send_reads()) {
  }
  return 0;
}
