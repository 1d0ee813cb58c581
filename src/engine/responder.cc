// Responder (IBA 9.7.4–9.7.5, rxe_resp.c): request packets -> receive
// completions, memory writes, READ responses and ACK/NAKs.
//
// Each request packet walks an explicit state machine; every state is one
// small function named after the IBA check it performs, and every error
// state after the NAK class it produces.
#include <endian.h>

#include <atomic>

#include "core/ah.h"
#include "core/context.h"
#include "core/cq.h"
#include "core/log.h"
#include "core/mr_access.h"
#include "core/remote_access.h"
#include "core/srq.h"
#include "engine/ack.h"
#include "engine/ack_board.h"
#include "engine/engine_context.h"
#include "engine/mailbox.h"
#include "engine/roles.h"
#include "wire/headers.h"
#include "wire/psn.h"

namespace uroce::engine {

namespace {

using wire::Operation;

enum class RespState : uint8_t {
  kCheckPsn,
  kCheckOpSeq,
  kCheckOpValid,
  kCheckResource,
  kCheckLength,
  kCheckRkey,
  kExecute,
  kComplete,
  kAcknowledge,
  kDuplicate,
  kErrPsnSequence,      // NAK 0x60
  kErrRnr,              // RNR NAK
  kErrInvalidRequest,   // NAK 0x61, class C/D fatal
  kErrRemoteAccess,     // NAK 0x62
  kErrRemoteOperation,  // NAK 0x63
  kDrop,                // silently discarded (UC errors, repeated sequence errors)
  kDone,
};

[[maybe_unused]] constexpr const char* kRespStateNames[] = {"CHECK_PSN",
                                                            "CHECK_OP_SEQ",
                                                            "CHECK_OP_VALID",
                                                            "CHECK_RESOURCE",
                                                            "CHECK_LENGTH",
                                                            "CHECK_RKEY",
                                                            "EXECUTE",
                                                            "COMPLETE",
                                                            "ACKNOWLEDGE",
                                                            "DUPLICATE",
                                                            "ERR_PSN_SEQUENCE",
                                                            "ERR_RNR",
                                                            "ERR_INVALID_REQUEST",
                                                            "ERR_REMOTE_ACCESS",
                                                            "ERR_REMOTE_OPERATION",
                                                            "DROP",
                                                            "DONE"};

// What the state functions share while one packet is processed.
struct Request {
  EngineQp& qp;
  const wire::PacketView& pkt;
  TxBatch& tx;
  uint32_t psn;
  uint32_t flags;  // OpcodeInfo flags
  Operation op;
  const transport::Endpoint& from;  // sender's address and UDP port (its LID)
  const transport::IpAddress& to_ip;
  uint32_t span = 1;                           // PSNs the packet stands for (jumbo_span; 0: a bad jumbo)
  ibv_wc_status recv_status = IBV_WC_SUCCESS;  // for a receive WQE failed by this packet
};

// The PSNs a same-host jumbo packet stands for (wire::PacketView::jumbo): as
// if it had been cut at the path MTU. Every packet of a message but the last
// is a full MTU (check_length), so a jumbo that does not end its message carries a
// whole number of them; 0 when it does not (an invalid request).
uint32_t jumbo_span(const wire::PacketView& pkt, uint32_t mtu) {
  if (!pkt.jumbo) return 1;
  uint32_t len = pkt.payload_len;
  if (pkt.info->flags & wire::kOpEnd) return wire::packets_for(len, mtu);
  return len % mtu == 0 ? len / mtu : 0;
}

// RC and XRC (target) requests are acknowledged; UC and UD ones are not.
bool is_rc(const EngineQp& qp) { return is_reliable(qp.type); }
bool is_ud(const EngineQp& qp) { return qp.type == IBV_QPT_UD; }
bool is_xrc(const EngineQp& qp) { return qp.type == IBV_QPT_XRC_RECV; }

// The PD remote accesses are checked against: the QP's, or for an XRC target
// (which has none) the PD of the XRC SRQ the request names (IBA Vol. 1 Annex A14, XRC).
const core::Pd* access_pd(const EngineQp& qp) {
  if (!is_xrc(qp)) return qp.pd;
  return qp.srq ? qp.srq->pd : nullptr;
}

void send_ack_packet(EngineQp& qp, TxBatch& tx, uint8_t syndrome, uint32_t psn) {
  qp.count_sent(build_ack(tx, qp.path, service_of_qp(qp.type), qp.attr.dest_qp_num, psn, syndrome, qp.resp.msn,
                          qp.delivery.icrc()));
}

void send_nak(EngineQp& qp, TxBatch& tx, uint8_t syndrome, uint32_t psn) {
  responder_flush_ack(qp, tx);  // keep ACK/NAK order
  send_ack_packet(qp, tx, syndrome, psn);
  qp.engine()->stats.tx_naks.fetch_add(1, std::memory_order_relaxed);
}

// READ responses go out at most this many packets at a time per QP, between
// other work (the progress loop keeps calling back until the streams end).
constexpr uint32_t kReadSlicePackets = TxBatch::kMaxPackets;

// Queues the response stream of a READ for [va, va+len) starting at `psn`
// (IBA 9.7.5.1.3: responses take consecutive PSNs starting with the
// request's) behind those already queued.
void queue_read(EngineQp& qp, uint32_t psn, uint64_t va, uint32_t rkey, uint32_t len) {
  ResponderState& s = qp.resp;
  if (s.read_count == s.resource_count) {  // more READs than max_dest_rd_atomic: the oldest gives way
    s.read_head = (s.read_head + 1) % s.resource_count;
    --s.read_count;
  }
  s.read_jobs[(s.read_head + s.read_count) % s.resource_count] = ReadJob{psn, va, rkey, len, 0};
  ++s.read_count;
}

void drop_read_jobs(ResponderState& s) {
  s.read_head = 0;
  s.read_count = 0;
}

// Sends up to `budget` packets of the oldest stream. Its key is checked again
// for every slice, under the MR table's lock, and the packets leave under it
// (core/mr.h: the MR lifetime rule; TxBatch::ReferenceScope). A region gone or
// unreadable since the request was checked is NAKed remote access error.
uint32_t send_read_slice(EngineQp& qp, TxBatch& tx, uint32_t budget) {
  ResponderState& s = qp.resp;
  ReadJob& job = s.read_jobs[s.read_head];
  uint32_t mtu = qp.path.mtu;
  uint32_t npkts = wire::packets_for(job.length, mtu);
  uint32_t sent = 0;
  bool failed = false;
  {
    auto lock = qp.ctx->mrs.read_lock();
    TxBatch::ReferenceScope references(tx);  // ends first: its packets leave under the lock
    const core::Mr* mr = nullptr;
    if (job.length && qp.ctx->mrs.check_locked(job.rkey, access_pd(qp), job.va + job.sent, job.length - job.sent,
                                               IBV_ACCESS_REMOTE_READ, true, &mr, qp.qp_num()) != core::KeyCheck::kOk)
      failed = true;
    for (uint32_t i = job.sent / mtu; !failed && i < npkts && sent < budget; ++i, ++sent) {
      uint32_t n = std::min(mtu, job.length - job.sent);
      Operation op = npkts == 1       ? Operation::kReadResponseOnly
                     : i == 0         ? Operation::kReadResponseFirst
                     : i == npkts - 1 ? Operation::kReadResponseLast
                                      : Operation::kReadResponseMiddle;
      uint8_t opcode = opcode_of_qp(qp.type, op);
      const wire::OpcodeInfo& info = wire::opcode_info(opcode);
      uint8_t* h = tx.begin_packet(qp.path.dst, qp.path.src_ip, info.header_len);
      wire::Bth(h).fill(opcode, false, wire::pad_for(n), wire::kDefaultPkey, qp.attr.dest_qp_num, false,
                        wire::psn_add(job.psn, i));
      if (info.has(wire::Hdr::kAeth))
        wire::Aeth(h + info.offset[unsigned(wire::Hdr::kAeth)]).fill(wire::kAckNoCredit, qp.resp.msn);
      if (n && !tx.add_payload_from(*mr, mr->host_at(job.va + job.sent, true), n)) {
        tx.abort_packet();
        failed = true;
        break;
      }
      qp.count_sent(tx.end_packet(qp.path.flow, qp.delivery.icrc()));
      job.sent += n;
    }
  }
  if (failed) {
    // The READ can no longer be served: a remote access error NAK (roce-facts
    // §2.3); the requester fails it with IBV_WC_REM_ACCESS_ERR. Later streams
    // are abandoned with it.
    uint32_t psn = wire::psn_add(job.psn, job.sent / mtu);
    drop_read_jobs(s);
    send_nak(qp, tx, wire::syndrome(wire::AckType::kNak, uint8_t(wire::NakCode::kRemoteAccess)), psn);
    return sent + 1;
  }
  if (job.sent >= job.length) {
    s.read_head = (s.read_head + 1) % s.resource_count;
    --s.read_count;
  }
  return sent == 0 ? 1 : sent;  // a zero-length READ is one packet
}

void send_atomic_ack(EngineQp& qp, TxBatch& tx, uint32_t psn, uint64_t orig) {
  qp.count_sent(build_ack(tx, qp.path, service_of_qp(qp.type), qp.attr.dest_qp_num, psn, wire::kAckNoCredit,
                          qp.resp.msn, qp.delivery.icrc(), orig));
}

// --- the checks -------------------------------------------------------------

// The responder's PSN check (as rxe's check_psn): PSN equal to ePSN is new,
// earlier is a duplicate (C9-105, C9-110), later means packets were lost.
RespState check_psn(Request& r) {
  ResponderState& s = r.qp.resp;
  int32_t d = wire::psn_diff(r.psn, s.epsn);
  if (is_ud(r.qp)) return RespState::kCheckOpSeq;  // single-packet messages: no sequence
  if (!is_rc(r.qp)) {
    // UC (as rxe; no NAKs): a gap drops the rest of the current message;
    // resynchronize on the next FIRST/ONLY.
    if (d != 0) {
      s.in_message = InMessage::kNone;
      s.recv_offset = 0;
      s.epsn = r.psn;
      if (!(r.flags & wire::kOpStart)) {
        s.epsn = wire::psn_add(r.psn, 1);
        return RespState::kDrop;
      }
    }
    return RespState::kCheckOpSeq;
  }
  if (d > 0) {
    r.qp.engine()->stats.rx_out_of_sequence.fetch_add(1, std::memory_order_relaxed);
    r.qp.count(&QpCounters::out_of_seq_request);
    return s.nak_sent ? RespState::kDrop : RespState::kErrPsnSequence;
  }
  if (d < 0) return RespState::kDuplicate;
  s.nak_sent = false;
  return RespState::kCheckOpSeq;
}

// Opcode sequence (as rxe's check_op_seq): FIRST/MIDDLE/LAST must follow each
// other within a message; on RC a break is an invalid request NAK.
RespState check_op_seq(Request& r) {
  InMessage m = r.qp.resp.in_message;
  bool send = r.flags & wire::kOpSend;
  bool write = r.flags & wire::kOpWrite;
  bool ok;
  if (m == InMessage::kSend)
    ok = send && !(r.flags & wire::kOpStart);
  else if (m == InMessage::kWrite)
    ok = write && !(r.flags & wire::kOpStart);
  else
    ok = r.flags & wire::kOpStart;
  if (ok) return RespState::kCheckOpValid;
  return is_rc(r.qp) ? RespState::kErrInvalidRequest : RespState::kDrop;
}

// Opcode validity (as rxe's check_op_valid): the QP must permit the operation.
RespState check_op_valid(Request& r) {
  if (is_ud(r.qp)) {
    // roce-facts §2.5: a Q_Key mismatch is dropped silently and counted.
    if (r.pkt.deth().qkey() != r.qp.attr.qkey) {
      r.qp.engine()->stats.rx_qkey_violations.fetch_add(1, std::memory_order_relaxed);
      return RespState::kDrop;
    }
    return RespState::kCheckResource;
  }
  if (is_xrc(r.qp)) {
    // The XRCETH must name an XRC SRQ of the target's domain, the same one for
    // every packet of a message. If it changes mid-message, the WQE the message
    // took fails on its own SRQ (when that SRQ is this context's).
    ResponderState& s = r.qp.resp;
    if (s.have_rwqe && (!r.qp.srq || s.srq_num != r.qp.srq->srq_num)) {
      core::Srq* own = r.qp.engine()->find_xrc_srq(s.srq_num);
      r.qp.srq = own && own->xrcd ? own : nullptr;
      if (!r.qp.srq) s.have_rwqe = false;  // taken in another process: lost with the message
      return RespState::kErrInvalidRequest;
    }
    if (!r.qp.srq) return RespState::kErrInvalidRequest;
  }
  // The QP's access flags and responder resources (core/remote_access.h).
  auto accepts = [&a = r.qp.attr](core::RemoteOp op) {
    return core::qp_accepts(a.qp_access_flags, a.max_dest_rd_atomic, op);
  };
  // UC has no NAK (IBA 9.8.3): a WRITE the QP does not permit is dropped, as
  // rxe's check_op_valid drops the message.
  if ((r.flags & wire::kOpWrite) && !accepts(core::RemoteOp::kWrite))
    return is_rc(r.qp) ? RespState::kErrInvalidRequest : RespState::kDrop;
  if ((r.flags & wire::kOpRead) && !accepts(core::RemoteOp::kRead)) return RespState::kErrInvalidRequest;
  if ((r.flags & wire::kOpAtomic) && !accepts(core::RemoteOp::kAtomic)) return RespState::kErrInvalidRequest;
  return RespState::kCheckResource;
}

// The receive WQE a message is delivered into: the head of the QP's own
// receive queue, or the copy taken from its SRQ.
const core::RecvWqe& recv_wqe(EngineQp& qp) { return qp.srq ? qp.resp.srq_wqe : qp.rq.at(qp.rq.consumed); }
const core::Sge* recv_sges(EngineQp& qp) { return qp.srq ? qp.resp.srq_sges.data() : qp.rq.sges(qp.rq.consumed); }

bool take_from_srq(EngineQp& qp) {
  bool limit_reached = false;
  if (!qp.srq->take(&qp.resp.srq_wqe, qp.resp.srq_sges.data(), &limit_reached)) return false;
  qp.resp.srq_num = qp.srq->srq_num;
  if (limit_reached) {
    ibv_async_event ev{};
    ev.element.srq = &qp.srq->ibsrq;
    ev.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
    qp.ctx->raise_async_event(ev);
  }
  return true;
}

// IBA 9.7.5.2.8 (RNR NAK): a message that consumes a receive WQE needs one, else RNR NAK.
RespState check_resource(Request& r) {
  if ((r.flags & wire::kOpRwqe) && !r.qp.resp.have_rwqe) {
    bool got = r.qp.srq ? take_from_srq(r.qp) : !r.qp.rq.empty();
    if (!got && is_rc(r.qp)) return RespState::kErrRnr;
    if (!got) {  // UD, UC: the message is lost (only RC answers RNR)
      r.qp.engine()->stats.rx_no_recv_wqe.fetch_add(1, std::memory_order_relaxed);
      return RespState::kDrop;
    }
    r.qp.resp.have_rwqe = true;
    r.qp.resp.recv_offset = 0;
  }
  return RespState::kCheckLength;
}

// Length checks (as rxe's check_length): packet payload lengths by position, and
// the receive buffer.
RespState check_length(Request& r) {
  uint64_t mtu = uint64_t(r.qp.path.mtu) * r.span;  // a jumbo packet: span packets' worth
  uint32_t len = r.pkt.payload_len;
  bool start = r.flags & wire::kOpStart, end = r.flags & wire::kOpEnd;
  if (r.span == 0) return RespState::kErrInvalidRequest;  // jumbo packets are RC only
  if (r.flags & wire::kOpPayload) {
    bool ok = (!end) ? len == mtu : (start ? len <= mtu : (len > 0 && len <= mtu));
    if (!ok) return is_rc(r.qp) ? RespState::kErrInvalidRequest : RespState::kDrop;
  }
  if (r.flags & wire::kOpSend) {
    const core::RecvWqe& w = recv_wqe(r.qp);
    uint32_t grh = is_ud(r.qp) ? core::kGrhSize : 0;  // roce-facts §5.3
    if (uint64_t(r.qp.resp.recv_offset) + grh + len > w.length) {
      r.recv_status = IBV_WC_LOC_LEN_ERR;
      return is_rc(r.qp) ? RespState::kErrInvalidRequest : RespState::kDrop;
    }
  }
  if (r.flags & wire::kOpWrite) {
    if (start) {
      uint32_t dma = r.pkt.reth().dma_len();
      if (dma > (1u << 31) || (end && dma != len) || (!end && dma <= len))
        return is_rc(r.qp) ? RespState::kErrInvalidRequest : RespState::kDrop;
    } else if (len > r.qp.resp.write_remaining || (end && len != r.qp.resp.write_remaining)) {
      return is_rc(r.qp) ? RespState::kErrInvalidRequest : RespState::kDrop;
    }
  }
  return RespState::kCheckRkey;
}

// R_Key, bounds and access of RDMA requests; zero-length requests need no
// valid R_Key (C9-88, as rxe's check_rkey cites it).
RespState check_rkey(Request& r) {
  if (r.flags & wire::kOpAtomic) {
    wire::AtomicEth a = r.pkt.atomic_eth();
    // IBA 9.4.5 (Atomic Operations): an atomic's VA must be 8-byte aligned, else
    // NAK invalid request (rxe: ERR_MISALIGNED_ATOMIC).
    if (a.va() & 7) return RespState::kErrInvalidRequest;
    unsigned need = core::remote_access_for(core::RemoteOp::kAtomic);
    if (r.qp.ctx->mrs.check(a.rkey(), access_pd(r.qp), a.va(), 8, need, true, r.qp.qp_num()) != core::KeyCheck::kOk)
      return RespState::kErrRemoteAccess;
    return RespState::kExecute;
  }
  bool write_start = (r.flags & wire::kOpWrite) && (r.flags & wire::kOpStart);
  if (!write_start && !(r.flags & wire::kOpRead)) return RespState::kExecute;
  wire::Reth reth = r.pkt.reth();
  uint32_t len = reth.dma_len();
  if (len != 0) {
    unsigned need = core::remote_access_for((r.flags & wire::kOpRead) ? core::RemoteOp::kRead : core::RemoteOp::kWrite);
    if (r.qp.ctx->mrs.check(reth.rkey(), access_pd(r.qp), reth.va(), len, need, true, r.qp.qp_num()) !=
        core::KeyCheck::kOk)
      return is_rc(r.qp) ? RespState::kErrRemoteAccess : RespState::kDrop;
  }
  if (write_start) {
    r.qp.resp.write_va = reth.va();
    r.qp.resp.write_rkey = reth.rkey();
    r.qp.resp.write_remaining = len;
    r.qp.resp.write_length = len;
  }
  return RespState::kExecute;
}

// --- execution ---------------------------------------------------------------

// Copies part of a SEND into the receive WQE at the current offset. An SRQ's
// buffers are checked against the SRQ's PD (IBA 10.2.9: the SRQ has its own).
bool scatter_send(EngineQp& qp, const uint8_t* data, uint32_t len) {
  const core::Pd* pd = qp.srq ? qp.srq->pd : qp.pd;
  return qp.ctx->mrs.scatter(pd, recv_sges(qp), recv_wqe(qp).num_sge, qp.resp.recv_offset, data, len);
}

// Writes an RDMA WRITE's payload through the R_Key, checked again under the
// MR table's lock (the MR may have been deregistered since the first packet).
bool write_payload(EngineQp& qp, uint32_t rkey, uint64_t va, const uint8_t* data, uint32_t len) {
  bool copied = false;
  auto c = qp.ctx->mrs.with_range(rkey, access_pd(qp), va, len, IBV_ACCESS_REMOTE_WRITE, true, qp.qp_num(),
                                  [&](const core::Mr& mr, uint8_t* dst) {
                                    copied = core::copy_to_mr(mr, dst, data, len);
                                    // The next WRITE packet's target, within the region.
                                    if (copied && !core::is_on_demand(mr))
                                      core::prefetch_for_write(dst + len, size_t(mr.host + mr.length - (dst + len)));
                                  });
  return c == core::KeyCheck::kOk && copied;
}

// Runs an atomic through the R_Key under the MR table's lock (core::atomic_on_mr:
// on an ODP region's unmapped or read-only page it fails, a remote access error).
bool atomic_payload(EngineQp& qp, const wire::AtomicEth& a, bool cas, uint64_t* orig) {
  bool done = false;
  auto c = qp.ctx->mrs.with_range(a.rkey(), access_pd(qp), a.va(), 8, IBV_ACCESS_REMOTE_ATOMIC, true, qp.qp_num(),
                                  [&](const core::Mr& mr, uint8_t* dst) {
                                    done = core::atomic_on_mr(mr, dst, cas, a.swap_add(), a.compare(), orig);
                                  });
  return c == core::KeyCheck::kOk && done;
}

RespState execute(Request& r) {
  EngineQp& qp = r.qp;
  ResponderState& s = qp.resp;
  uint32_t len = r.pkt.payload_len;
  if (r.flags & wire::kOpSend) {
    s.in_message = InMessage::kSend;
    if (is_ud(qp)) {
      uint8_t grh[core::kGrhSize];
      if (r.from.ip.is_v4())
        core::build_ipv4_grh(r.from.ip.v4(), r.to_ip.v4(), uint32_t(r.pkt.len), grh);
      else
        core::build_ipv6_grh(r.from.ip.bytes.data(), r.to_ip.bytes.data(), uint32_t(r.pkt.len), grh);
      if (!scatter_send(qp, grh, core::kGrhSize)) return RespState::kDrop;
      s.recv_offset = core::kGrhSize;
    }
    if (!scatter_send(qp, r.pkt.payload(), len)) {
      r.recv_status = IBV_WC_LOC_PROT_ERR;
      return is_rc(qp) ? RespState::kErrRemoteOperation : RespState::kDrop;
    }
    s.recv_offset += len;
  } else if (r.flags & wire::kOpWrite) {
    s.in_message = InMessage::kWrite;
    if (len && !write_payload(qp, s.write_rkey, s.write_va, r.pkt.payload(), len))
      return is_rc(qp) ? RespState::kErrRemoteAccess : RespState::kDrop;
    s.write_va += len;
    s.write_remaining -= len;
  } else if (r.flags & wire::kOpRead) {
    wire::Reth reth = r.pkt.reth();
    uint32_t npkts = wire::packets_for(reth.dma_len(), qp.path.mtu);
    ResponderResource& res = s.resources()[s.next_resource++ % s.resource_count];
    res = ResponderResource{true, r.psn, wire::psn_add(r.psn, npkts - 1), reth.va(), reth.rkey(), reth.dma_len()};
    queue_read(qp, r.psn, reth.va(), reth.rkey(), reth.dma_len());
    responder_send_reads(qp, r.tx, kReadSlicePackets);
    s.epsn = wire::psn_add(r.psn, npkts);
    ++s.msn;
    return RespState::kDone;
  } else if (r.flags & wire::kOpAtomic) {
    wire::AtomicEth a = r.pkt.atomic_eth();
    bool cas = r.op == Operation::kCompareSwap;
    uint64_t orig = 0;
    if (!atomic_payload(qp, a, cas, &orig)) return RespState::kErrRemoteAccess;
    ResponderResource& res = s.resources()[s.next_resource++ % s.resource_count];
    res = ResponderResource{true, r.psn, r.psn, a.va(), a.rkey(), 8, true, orig};
    ++s.msn;
    s.epsn = wire::psn_add(r.psn, 1);
    send_atomic_ack(qp, r.tx, r.psn, orig);
    return RespState::kDone;
  }
  return (r.flags & wire::kOpEnd) ? RespState::kComplete : RespState::kAcknowledge;
}

inline constexpr uint8_t kWcSlRoceV2Ipv4 = 0x8 | 0x2;
inline constexpr uint8_t kWcSlRoceV2Ipv6 = 0x8 | 0x1;

// `ud`: the UD request being completed (its sender and the GRH flag), else null.
// `flags`: IBV_WC_WITH_IMM (value = imm_data, network order) or IBV_WC_WITH_INV
// (value = the invalidated R_Key), else 0.
void complete_recv(EngineQp& qp, ibv_wc_status status, ibv_wc_opcode opcode, uint32_t byte_len, unsigned flags,
                   uint32_t value, bool solicited, const Request* ud = nullptr) {
  // Reliable service: published after the ACK of this message has left
  // (responder_publish), in order with the QP's other receive completions.
  // Such a completion is written where it waits, not built and copied: a copy
  // read back in 16-byte pieces what was just stored in smaller ones, and
  // each such load waited for the stores (perf: most of this function's samples).
  core::Cq* cq = qp.recv_completion_cq();
  bool held = cq && is_rc(qp);
  if (held && qp.deferred_count == EngineQp::kMaxDeferred) responder_publish(qp, TxBatch::local());
  ibv_wc unheld;
  ibv_wc& wc = held ? qp.deferred[qp.deferred_count].wc : unheld;
  wc = ibv_wc{};
  wc.wr_id = recv_wqe(qp).wr_id;
  wc.status = status;
  wc.opcode = opcode;
  wc.byte_len = byte_len;
  wc.qp_num = qp.qp_num();
  wc.src_qp = qp.attr.dest_qp_num;
  wc.slid = qp.path.dst.port;
  if (ud) {
    wc.src_qp = ud->pkt.deth().src_qp();
    wc.slid = ud->from.port;
    wc.wc_flags |= IBV_WC_GRH;
    // RoCE has no SL; a RoCE NIC's UD receive reports the packet type there
    // (mlx5: bit 3 = UDP header, bits 2:0 = L3 type, 1 = IPv6, 2 = IPv4), and
    // UCX reads it to find the destination address in the GRH area.
    wc.sl = ud->from.ip.is_v4() ? kWcSlRoceV2Ipv4 : kWcSlRoceV2Ipv6;
  }
  if (flags) {
    wc.wc_flags |= flags;
    wc.imm_data = value;  // a union with invalidated_rkey
  }
  if (!qp.srq) ++qp.rq.consumed;
  qp.resp.have_rwqe = false;
  qp.resp.recv_offset = 0;
  if (!held) {  // UC, UD: no ACK to wait for (or no CQ to complete to)
    if (cq) cq->push(wc, solicited);
    return;
  }
  DeferredCompletion& d = qp.deferred[qp.deferred_count++];
  d.cq = cq;
  d.solicited = solicited;
}

// End of a message: the receive completion (SEND, WRITE with immediate).
RespState complete(Request& r) {
  EngineQp& qp = r.qp;
  ResponderState& s = qp.resp;
  bool imm = r.flags & wire::kOpImm;
  uint32_t imm_data = imm ? r.pkt.imm().raw() : 0;
  unsigned flags = imm ? IBV_WC_WITH_IMM : 0;
  if (r.flags & wire::kOpInv) {
    // SEND with invalidate (IBA 9.4.1.1.1): the named type 2 window's key is
    // invalidated before the completion; a bad key is an invalid request.
    imm_data = be32toh(r.pkt.ieth().raw());
    if (qp.ctx->mrs.invalidate(imm_data, access_pd(qp)) != 0) return RespState::kErrInvalidRequest;
    flags = IBV_WC_WITH_INV;
  }
  if (r.flags & (wire::kOpSend | wire::kOpRcqe)) s.ack_covers_receive = true;
  if (r.flags & wire::kOpSend) {
    complete_recv(qp, IBV_WC_SUCCESS, IBV_WC_RECV, s.recv_offset, flags, imm_data, r.pkt.bth().se(),
                  is_ud(qp) ? &r : nullptr);
  } else if (r.flags & wire::kOpRcqe) {  // WRITE with immediate
    complete_recv(qp, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, s.write_length, IBV_WC_WITH_IMM, imm_data,
                  r.pkt.bth().se());
  }
  s.in_message = InMessage::kNone;
  ++s.msn;
  return RespState::kAcknowledge;
}

RespState acknowledge(Request& r) {
  ResponderState& s = r.qp.resp;
  uint32_t last = wire::psn_add(r.psn, r.span - 1);
  s.epsn = wire::psn_add(last, 1);
  if (is_rc(r.qp) && r.pkt.bth().ack_req()) {
    s.ack_pending = true;
    s.ack_psn = last;
  }
  return RespState::kDone;
}

// Duplicates are acknowledged again (C9-105), answered in PSN order (C9-110),
// READs replayed for a subset of the original (IBA 9.4.4), never re-executed.
RespState duplicate(Request& r) {
  EngineQp& qp = r.qp;
  ResponderState& s = qp.resp;
  qp.engine()->stats.rx_duplicates.fetch_add(1, std::memory_order_relaxed);
  qp.count(&QpCounters::duplicate_request);
  if (r.flags & wire::kOpRead) {
    wire::Reth reth = r.pkt.reth();
    for (const ResponderResource& res : s.resources()) {
      if (!res.valid || res.atomic || wire::psn_diff(r.psn, res.first_psn) < 0 ||
          wire::psn_diff(r.psn, res.last_psn) > 0)
        continue;
      // The retried READ must ask for a part of the original range.
      uint64_t end = res.va + res.length;
      if (reth.rkey() != res.rkey || reth.va() < res.va || reth.va() + reth.dma_len() > end) return RespState::kDrop;
      // The requester went back to this READ and resends every later request
      // too (go-back-N): the streams queued after it start over from those.
      drop_read_jobs(s);
      queue_read(qp, r.psn, reth.va(), reth.rkey(), reth.dma_len());
      responder_send_reads(qp, r.tx, kReadSlicePackets);
      return RespState::kDone;
    }
    return RespState::kDrop;
  }
  if (r.flags & wire::kOpAtomic) {
    // IBA 9.4.5 (Atomic Operations): a duplicate atomic is never executed again;
    // its saved result is replayed.
    for (const ResponderResource& res : s.resources()) {
      if (res.valid && res.atomic && res.first_psn == r.psn) {
        send_atomic_ack(qp, r.tx, r.psn, res.orig);
        return RespState::kDone;
      }
    }
    return RespState::kDrop;
  }
  // ACKs are cumulative, so the answers to a resent message coalesce: a
  // duplicate is acknowledged when it asks (AckReq) or ends its message, not
  // once per packet (a requester resending a message of N packets gets one
  // ACK, where rxe sends N). Acknowledge everything received so far (ePSN-1).
  if (!r.pkt.bth().ack_req() && !(r.flags & wire::kOpEnd)) return RespState::kDone;
  uint32_t psn = wire::psn_add(s.epsn, wire::kPsnMask);
  if (!s.ack_pending || wire::psn_diff(psn, s.ack_psn) > 0) s.ack_psn = psn;
  s.ack_pending = true;
  return RespState::kDone;
}

// --- errors -------------------------------------------------------------------

RespState err_psn_sequence(Request& r) {
  r.qp.resp.nak_sent = true;
  r.qp.count(&QpCounters::seq_naks_sent);
  send_nak(r.qp, r.tx, wire::syndrome(wire::AckType::kNak, uint8_t(wire::NakCode::kPsnSeqError)), r.qp.resp.epsn);
  return RespState::kDone;
}

RespState err_rnr(Request& r) {
  r.qp.engine()->stats.rnr_naks_sent.fetch_add(1, std::memory_order_relaxed);
  r.qp.count(&QpCounters::send_rnr_err);
  send_nak(r.qp, r.tx, wire::syndrome(wire::AckType::kRnrNak, r.qp.attr.min_rnr_timer), r.psn);
  return RespState::kDone;
}

// Responder class A/C errors (rxe_resp.c's names for the IBA error classes):
// NAK, fail the receive WQE if one was taken, and move the responder QP to
// ERR as rxe does.
RespState err_fatal(Request& r, wire::NakCode code) {
  EngineQp& qp = r.qp;
  send_nak(r.qp, r.tx, wire::syndrome(wire::AckType::kNak, uint8_t(code)), r.psn);
  if (qp.resp.have_rwqe && qp.recv_completion_cq()) {
    ibv_wc_status st = r.recv_status != IBV_WC_SUCCESS        ? r.recv_status
                       : code == wire::NakCode::kRemoteAccess ? IBV_WC_REM_ACCESS_ERR
                                                              : IBV_WC_REM_INV_REQ_ERR;
    complete_recv(qp, st, IBV_WC_RECV, qp.resp.recv_offset, 0, 0, true);
  }
  qp.raise_event(IBV_EVENT_QP_FATAL);  // a class A/C responder error (as rxe names them)
  qp.enter_error();
  return RespState::kDone;
}

RespState step(RespState s, Request& r) {
  switch (s) {
    case RespState::kCheckPsn:
      return check_psn(r);
    case RespState::kCheckOpSeq:
      return check_op_seq(r);
    case RespState::kCheckOpValid:
      return check_op_valid(r);
    case RespState::kCheckResource:
      return check_resource(r);
    case RespState::kCheckLength:
      return check_length(r);
    case RespState::kCheckRkey:
      return check_rkey(r);
    case RespState::kExecute:
      return execute(r);
    case RespState::kComplete:
      return complete(r);
    case RespState::kAcknowledge:
      return acknowledge(r);
    case RespState::kDuplicate:
      return duplicate(r);
    case RespState::kErrPsnSequence:
      return err_psn_sequence(r);
    case RespState::kErrRnr:
      return err_rnr(r);
    case RespState::kErrInvalidRequest:
      return err_fatal(r, wire::NakCode::kInvalidRequest);
    case RespState::kErrRemoteAccess:
      return err_fatal(r, wire::NakCode::kRemoteAccess);
    case RespState::kErrRemoteOperation:
      return err_fatal(r, wire::NakCode::kRemoteOp);
    case RespState::kDrop:
    case RespState::kDone:
      return RespState::kDone;
  }
  return RespState::kDone;
}

}  // namespace

void responder_receive(EngineQp& qp, const wire::PacketView& pkt, const transport::Endpoint& from,
                       const transport::IpAddress& to_ip, TxBatch& tx) {
  ibv_qp_state st = qp.state();
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE) {
    qp.engine()->stats.rx_dropped_state.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  tx.use(&qp.engine()->transport());
  Request r{qp, pkt, tx, pkt.bth().psn(), pkt.info->flags, wire::operation_of(pkt.bth().opcode()), from, to_ip};
  r.span = jumbo_span(pkt, qp.path.mtu);
  RespState s = RespState::kCheckPsn;
  while (s != RespState::kDone) {
    if (s >= RespState::kErrInvalidRequest && s <= RespState::kErrRemoteOperation)
      LOG_DEBUG("qp %u responder %s: %s psn %u epsn %u in_message %d payload %u", qp.qp_num(),
                kRespStateNames[unsigned(s)], wire::opcode_name(pkt.bth().opcode()), r.psn, qp.resp.epsn,
                int(qp.resp.in_message), pkt.payload_len);
    s = step(s, r);
  }
}

namespace {

// Whether a mailbox record may be delivered now by the common case's path:
// at the expected PSN, between messages, into the QP's own receive queue's
// head WQE, which is long enough. Anything else about it — a length or key
// error — is the state machine's (mail_as_packet).
bool mail_fits(EngineQp& qp, const MailRecord& r) {
  if (qp.srq || qp.resp.in_message != InMessage::kNone || qp.rq.empty()) return false;
  return r.length <= recv_wqe(qp).length;
}

// The record as the RoCE packet it stands for, run through the state
// machine (errors, and whatever mail_fits leaves out).
void mail_as_packet(EngineQp& qp, const MailRecord& r, TxBatch& tx) {
  bool imm = r.op == MailOp::kSendWithImm;
  uint8_t opcode = opcode_of_qp(qp.type, imm ? Operation::kSendOnlyImm : Operation::kSendOnly);
  const wire::OpcodeInfo& info = wire::opcode_info(opcode);
  alignas(8) uint8_t buf[64 + kMailboxPayload + 8] = {};
  unsigned pad = wire::pad_for(r.length);
  wire::Bth(buf).fill(opcode, r.solicited, pad, wire::kDefaultPkey, qp.qp_num(), true, r.psn);
  if (imm) wire::ImmDt(buf + info.offset[unsigned(wire::Hdr::kImmDt)]).fill_raw(r.imm);
  std::memcpy(buf + info.header_len, r.payload, r.length);
  size_t len = info.header_len + r.length + pad + wire::kIcrcSize;
  wire::PacketView pkt;
  if (wire::PacketView::parse(buf, len, pkt) != wire::ParseError::kNone) return;
  responder_receive(qp, pkt, qp.path.dst, qp.path.src_ip, tx);
  responder_publish(qp, tx);
}

// The common case: the payload into the head WQE, the ACK on the peer's
// board (ACK before completion), the completion.
bool deliver_mail(EngineQp& qp, const MailRecord& r, TxBatch& tx) {
  if (!scatter_send(qp, r.payload, r.length)) return false;
  ResponderState& s = qp.resp;
  s.epsn = wire::psn_add(r.psn, 1);
  ++s.msn;
  s.ack_pending = true;
  s.ack_psn = r.psn;
  s.ack_covers_receive = true;
  if (qp.deferred_count) responder_publish(qp, tx);  // their completions go first
  responder_flush_ack(qp, tx);
  if (tx.pending()) tx.flush();
  bool imm = r.op == MailOp::kSendWithImm;
  complete_recv(qp, IBV_WC_SUCCESS, IBV_WC_RECV, r.length, imm ? IBV_WC_WITH_IMM : 0, r.imm, r.solicited);
  responder_release_completions(qp);
  return true;
}

}  // namespace

MailTake responder_take_mail(EngineQp& qp, const MailRecord& r, TxBatch& tx) {
  ibv_qp_state st = qp.state();
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE) return MailTake::kLeft;
  int32_t ahead = wire::psn_diff(r.psn, qp.resp.epsn);
  if (ahead < 0) {
    qp.engine()->stats.rx_duplicates.fetch_add(1, std::memory_order_relaxed);
    return MailTake::kDropped;
  }
  if (ahead > 0) return MailTake::kLeft;
  if (r.length > kMailboxPayload || (r.op != MailOp::kSend && r.op != MailOp::kSendWithImm)) {
    qp.engine()->stats.rx_malformed.fetch_add(1, std::memory_order_relaxed);
    return MailTake::kDropped;
  }
  tx.use(&qp.engine()->transport());
  qp.counters->count_received(r.length);
  qp.engine()->stats.mail_in.fetch_add(1, std::memory_order_relaxed);
  if (!mail_fits(qp, r) || !deliver_mail(qp, r, tx)) mail_as_packet(qp, r, tx);
  return MailTake::kTaken;
}

void responder_flush_ack(EngineQp& qp, TxBatch& tx) {
  if (!qp.resp.ack_pending) return;
  qp.resp.ack_pending = false;
  qp.resp.ack_covers_receive = false;
  // Same host: a word on the requester's board (ack_board.h) has left at once.
  uint64_t word = board_word(BoardAck{qp.resp.ack_psn, qp.resp.msn}, qp.qp_num());
  if (qp.delivery.post_ack_word(board_cell(qp.attr.dest_qp_num), word)) return;
  send_ack_packet(qp, tx, wire::kAckNoCredit, qp.resp.ack_psn);
}

bool responder_reply_expected(EngineQp& qp) {
  // The application posted on the QP since the previous burst of requests,
  // and all it posted has completed: what it posts next answers these. Not
  // with receive completions held (ACK before completion: the application
  // must not see them before the ACK has left).
  bool posted = qp.sq.posted != qp.resp.sq_posted_seen;
  qp.resp.sq_posted_seen = qp.sq.posted;
  return posted && qp.sq.empty() && qp.deferred_count == 0;
}

void responder_release_completions(EngineQp& qp) {
  for (uint32_t i = 0; i < qp.deferred_count; ++i) qp.deferred[i].cq->push(qp.deferred[i].wc, qp.deferred[i].solicited);
  qp.deferred_count = 0;
}

void responder_publish(EngineQp& qp, TxBatch& tx) {
  if (qp.deferred_count == 0) return;
  tx.use(&qp.engine()->transport());
  responder_flush_ack(qp, tx);
  tx.flush();
  responder_release_completions(qp);
}

bool responder_send_reads(EngineQp& qp, TxBatch& tx, uint32_t budget) {
  ibv_qp_state st = qp.state();
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE) drop_read_jobs(qp.resp);
  tx.use(&qp.engine()->transport());
  while (qp.resp.read_count > 0 && budget > 0) budget -= std::min(budget, send_read_slice(qp, tx, budget));
  return qp.resp.read_count > 0;
}

}  // namespace uroce::engine
