// Requester (IBA 9.7, rxe_req.c): send WQEs -> request packets.
//
// The requester walks the send queue from req.index, cutting each message
// into path-MTU packets. It stops when the PSN window is full, when a READ
// has no initiator credit left (max_rd_atomic), when a fenced WQE waits for
// earlier READs, or while an RNR NAK's timer runs. The completer moves it
// back (RequesterLink::rewind) for go-back-N retransmission. How the requests
// travel — the window, jumbo packets, direct placement, whether a post waits
// for the next ACK — it asks the QP's Delivery (delivery.h), decided at RTR;
// it never looks at the transport.
#include <endian.h>
#include <sys/uio.h>

#include <array>
#include <bit>
#include <cstring>
#include <utility>

#include "core/config.h"
#include "core/context.h"
#include "core/cq.h"
#include "core/guarded_access.h"
#include "core/mr_access.h"
#include "core/wr_opcode.h"
#include "engine/ack.h"
#include "engine/engine_context.h"
#include "engine/ip_flow.h"
#include "engine/mailbox.h"
#include "engine/roles.h"
#include "host/direct_placement.h"
#include "wire/headers.h"
#include "wire/psn.h"

namespace uroce::engine {

namespace {

using host::DirectPlacement;
using wire::Operation;

// Each sending QP keeps at least 32 PSNs of the context's window
// (Delivery::window_psns); AckReq at least every 64 packets, and every half
// of the QP's share (with more than 8 QPs sending, a share of 32 PSNs filled
// without one would wait for the tail-loss probe: measured, -q 64 ran at a
// third of -q 1 with 2.7 % of its packets sent twice).
constexpr uint32_t kMinWindowPsns = 32;
constexpr uint32_t kMaxPacketsPerAckReq = 64;
// Same-host SEND/WRITE messages from this size on go as jumbo packets
// (send_jumbo_packet); smaller ones keep the MTU packets' batching.
constexpr uint32_t kJumboMinBytes = 64 * 1024;
constexpr uint32_t kJumboMaxWrite = 2u << 20;     // larger WRITEs are placed (streams_as_jumbo)
constexpr unsigned kJumboMaxWriters = 1;          // QPs streaming large WRITEs; with more, placed
constexpr uint32_t kJumboWindowBytes = 2u << 20;  // in flight per engine: half a shared-memory ring

// Moves the next PSN on by `n` packets sent; psn_end keeps the newest.
void advance_psn(EngineQp& qp, uint32_t n) {
  qp.req.psn = wire::psn_add(qp.req.psn, n);
  if (wire::psn_diff(qp.req.psn, qp.req.psn_end) > 0) qp.req.psn_end = qp.req.psn;
}

// READs and atomics: one request packet, answered by responses.
bool is_read(const core::SendWqe& w) { return core::is_read_or_atomic(w.opcode); }

Operation send_operation(const core::SendWqe& w, bool first, bool last) {
  bool imm = w.opcode == IBV_WR_SEND_WITH_IMM;
  bool inv = w.opcode == IBV_WR_SEND_WITH_INV;
  bool write = w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  bool wimm = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (write) {
    if (first && last) return wimm ? Operation::kWriteOnlyImm : Operation::kWriteOnly;
    if (first) return Operation::kWriteFirst;
    if (last) return wimm ? Operation::kWriteLastImm : Operation::kWriteLast;
    return Operation::kWriteMiddle;
  }
  if (first && last) return imm ? Operation::kSendOnlyImm : inv ? Operation::kSendOnlyInv : Operation::kSendOnly;
  if (first) return Operation::kSendFirst;
  if (last) return imm ? Operation::kSendLastImm : inv ? Operation::kSendLastInv : Operation::kSendLast;
  return Operation::kSendMiddle;
}

// XRC requests name the target's XRC SRQ (XRCETH, right after the BTH).
void fill_xrceth(const wire::OpcodeInfo& info, uint8_t* h, const core::SendWqe& w) {
  if (info.has(wire::Hdr::kXrceth)) wire::Xrceth(h + info.offset[unsigned(wire::Hdr::kXrceth)]).fill(w.remote_srqn);
}

enum class Walk { kDone, kStopped, kLocalError };

// Walks [offset, offset+len) of a WQE's scatter/gather list (not inline
// data), checking each piece's L_Key against the MR table, whose lock the
// caller holds (core/mr.h: the lifetime rule), and calls piece(mr, host
// address, length) for each until it returns false (kStopped). kLocalError: a
// key check failed (a local protection error, IBV_WC_LOC_PROT_ERR).
template <typename Piece>
Walk walk_sges(EngineQp& qp, uint32_t index, const core::SendWqe& w, uint32_t offset, uint32_t len, Piece&& piece) {
  const core::Sge* sge = qp.sq.sges(index);
  uint32_t skip = offset;
  for (uint16_t i = 0; i < w.num_sge && len > 0; ++i) {
    if (skip >= sge[i].length) {
      skip -= sge[i].length;
      continue;
    }
    uint32_t n = std::min(sge[i].length - skip, len);
    const core::Mr* mr = nullptr;
    if (qp.ctx->mrs.check_locked(sge[i].lkey, qp.pd, sge[i].addr + skip, n, 0, false, &mr) != core::KeyCheck::kOk)
      return Walk::kLocalError;
    if (!piece(*mr, mr->host_at(sge[i].addr + skip, false), n)) return Walk::kStopped;
    len -= n;
    skip = 0;
  }
  return Walk::kDone;
}

// Gathers [offset, offset+len) of a WQE's payload into the packet, under the
// MR table's lock (copied, or referenced until send_burst's end:
// TxBatch::ReferenceScope). Returns false on a local protection error.
bool gather_payload(EngineQp& qp, uint32_t index, const core::SendWqe& w, uint32_t offset, uint32_t len, TxBatch& tx) {
  if (w.is_inline) return tx.add_payload(qp.sq.inline_buf(index) + offset, len);
  auto copy = [&tx](const core::Mr& mr, uint8_t* host, uint32_t n) { return tx.add_payload_from(mr, host, n); };
  return walk_sges(qp, index, w, offset, len, copy) == Walk::kDone;
}

// Validates every SGE of a WQE against the MR table before its first packet.
bool local_keys_ok(EngineQp& qp, uint32_t index, const core::SendWqe& w, unsigned need) {
  const core::Sge* sge = qp.sq.sges(index);
  for (uint16_t i = 0; i < w.num_sge; ++i) {
    if (sge[i].length == 0) continue;
    const core::Mr* mr = nullptr;
    if (qp.ctx->mrs.check_locked(sge[i].lkey, qp.pd, sge[i].addr, sge[i].length, need, false, &mr) !=
        core::KeyCheck::kOk)
      return false;
  }
  return true;
}

// Response packets from packet `done` of a READ WQE (of `total`) to the end
// of the part it lies in. Parts are read_part_packets long from the WQE's
// start, so a re-request from a lost response asks for no more than the
// request it repeats did: the responder replays only a range inside one it
// remembers (responder.cc, duplicate).
uint32_t read_part_left(const core::SendWqe& w, uint32_t done, uint32_t total) {
  uint32_t part_end = (done / w.read_part_packets + 1) * w.read_part_packets;
  return std::min(part_end, total) - done;
}

// Builds a READ request for the next part of a READ WQE: at most `packets`
// response packets of what is left from qp.req.offset, which moves on by the
// part's length (the whole rest when it fits: a part ends at a multiple of
// the MTU, so that only the WQE's last response may be short).
void send_read_request(EngineQp& qp, const core::SendWqe& w, TxBatch& tx, uint32_t packets) {
  uint32_t len = uint32_t(std::min<uint64_t>(w.length - qp.req.offset, uint64_t(packets) * qp.path.mtu));
  uint8_t opcode = opcode_of_qp(qp.type, Operation::kReadRequest);
  const wire::OpcodeInfo& info = wire::opcode_info(opcode);
  uint8_t* h = tx.begin_packet(qp.path.dst, qp.path.src_ip, info.header_len);
  wire::Bth(h).fill(opcode, false, 0, wire::kDefaultPkey, qp.attr.dest_qp_num, true, qp.req.psn);
  fill_xrceth(info, h, w);
  wire::Reth(h + info.offset[unsigned(wire::Hdr::kReth)]).fill(w.remote_addr + qp.req.offset, w.rkey, len);
  qp.count_sent(tx.end_packet(qp.path.flow, qp.delivery.icrc()));
  advance_psn(qp, wire::packets_for(len, qp.path.mtu));
  qp.req.offset += len;
  qp.req.pkts_since_ack_req = 0;
}

// Builds the COMPARE_SWAP / FETCH_ADD request of an atomic WQE (AckReq set:
// its response is the ATOMIC_ACKNOWLEDGE).
void send_atomic_request(EngineQp& qp, const core::SendWqe& w, TxBatch& tx) {
  bool cas = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
  uint8_t opcode = opcode_of_qp(qp.type, cas ? Operation::kCompareSwap : Operation::kFetchAdd);
  const wire::OpcodeInfo& info = wire::opcode_info(opcode);
  uint8_t* h = tx.begin_packet(qp.path.dst, qp.path.src_ip, info.header_len);
  wire::Bth(h).fill(opcode, false, 0, wire::kDefaultPkey, qp.attr.dest_qp_num, true, qp.req.psn);
  fill_xrceth(info, h, w);
  // AtomicETH: Swap (CmpSwap) or Add (FetchAdd) data, then Compare data.
  wire::AtomicEth(h + info.offset[unsigned(wire::Hdr::kAtomicEth)])
      .fill(w.remote_addr, w.rkey, cas ? w.swap : w.compare_add, cas ? w.compare_add : 0);
  qp.count_sent(tx.end_packet(qp.path.flow, qp.delivery.icrc()));
  advance_psn(qp, 1);
  qp.req.pkts_since_ack_req = 0;
}

// The extended headers of a SEND/WRITE packet after its BTH.
void fill_request_headers(EngineQp& qp, const wire::OpcodeInfo& info, uint8_t* h, const core::SendWqe& w) {
  fill_xrceth(info, h, w);
  if (info.has(wire::Hdr::kDeth)) {
    // IBA 10.2.5 (roce-facts §2.5): a WR Q_Key with bit 31 set means "use the QP's own".
    uint32_t qkey = (w.ud.remote_qkey & 0x80000000u) ? qp.attr.qkey : w.ud.remote_qkey;
    wire::Deth(h + info.offset[unsigned(wire::Hdr::kDeth)]).fill(qkey, qp.qp_num());
  }
  if (info.has(wire::Hdr::kReth))
    wire::Reth(h + info.offset[unsigned(wire::Hdr::kReth)]).fill(w.remote_addr, w.rkey, w.length);
  if (info.has(wire::Hdr::kImmDt)) wire::ImmDt(h + info.offset[unsigned(wire::Hdr::kImmDt)]).fill_raw(w.imm_data);
  if (info.has(wire::Hdr::kIeth)) {
    uint32_t key = htobe32(w.invalidate_rkey);  // IETH: the R_Key, big-endian
    wire::Ieth(h + info.offset[unsigned(wire::Hdr::kIeth)]).fill_raw(key);
  }
}

// Starts the RTT sample on a new packet with AckReq (one sample in flight);
// requester_run stamps its time with the timer's.
void sample_rtt(EngineQp& qp) {
  RttSample& s = qp.timers.rtt;
  if (!s.active && qp.req.psn == qp.req.psn_end) {
    s.active = true;
    s.unstamped = true;
    s.psn = qp.req.psn;
  }
}

// Where a request packet goes: the connected path (RC/UC), or for UD the
// WQE's address handle.
struct Destination {
  transport::Endpoint dst;
  transport::IpAddress src_ip;
  uint32_t dest_qp = 0;
  const wire::IpFlow* flow = nullptr;
  wire::IpFlow ud_flow;  // UD: `flow` points here
};

void resolve_destination(EngineQp& qp, const core::SendWqe& w, Destination& d) {
  if (qp.type != IBV_QPT_UD) {
    d.dst = qp.path.dst;
    d.src_ip = qp.path.src_ip;
    d.dest_qp = qp.attr.dest_qp_num;
    d.flow = &qp.path.flow;
    return;
  }
  // The AH's source GID (checked by resolve_ah against its own context's table).
  const core::HostAddress* src = qp.ctx->gid_address(w.ud.sgid_index);
  uint32_t scope = src ? src->scope() : 0;
  d.dst = qp.engine()->direct_endpoint(transport::Endpoint{ip_of(w.ud.dgid, scope), w.ud.dst_port}, w.ud.remote_qpn);
  d.src_ip = src ? ip_of(src->gid, scope) : transport::IpAddress{};
  d.ud_flow = ip_flow(d.src_ip, d.dst.ip, qp.engine()->lid(), d.dst.port);
  d.flow = &d.ud_flow;
  d.dest_qp = w.ud.remote_qpn;
}

// Builds the next packet of a SEND/WRITE WQE; returns false on a local error.
bool send_data_packet(EngineQp& qp, uint32_t index, core::SendWqe& w, TxBatch& tx) {
  uint32_t offset = qp.req.offset;
  uint32_t len = std::min(qp.path.mtu, w.length - offset);
  bool first = offset == 0;
  bool last = offset + len == w.length;
  uint8_t opcode = opcode_of_qp(qp.type, send_operation(w, first, last));
  const wire::OpcodeInfo& info = wire::opcode_info(opcode);
  bool ack_req = is_reliable(qp.type) && (last || ++qp.req.pkts_since_ack_req >= qp.req.ack_req_every);
  if (ack_req) qp.req.pkts_since_ack_req = 0;
  bool se = last && (w.send_flags & IBV_SEND_SOLICITED);
  Destination d;
  resolve_destination(qp, w, d);
  TxBatch::Icrc icrc = qp.delivery.icrc();
  uint8_t* h = tx.begin_packet(d.dst, d.src_ip, info.header_len, icrc, len);
  wire::Bth(h).fill(opcode, se, wire::pad_for(len), wire::kDefaultPkey, d.dest_qp, ack_req, qp.req.psn);
  fill_request_headers(qp, info, h, w);
  if (!gather_payload(qp, index, w, offset, len, tx)) {
    tx.abort_packet();
    return false;
  }
  qp.count_sent_in_burst(tx.end_packet(*d.flow, icrc));  // send_burst publishes
  if (ack_req) sample_rtt(qp);
  advance_psn(qp, 1);
  qp.req.offset += len;
  return true;
}

enum class Jumbo { kNotUsed, kSent, kLocalError };

// A jumbo packet's pieces: its header, then [offset, offset+len) of the
// WQE's payload in place (at most kJumboPieces in all, with the trailer).
// kStopped: a piece that may not be read in place, or too many.
constexpr unsigned kJumboPieces = 16;
Walk jumbo_payload(EngineQp& qp, uint32_t index, const core::SendWqe& w, uint32_t len, iovec* iov, unsigned* n) {
  uint32_t offset = qp.req.offset;
  if (w.is_inline) {
    iov[(*n)++] = iovec{qp.sq.inline_buf(index) + offset, len};
    return Walk::kDone;
  }
  auto point = [iov, n](const core::Mr& mr, uint8_t* host, uint32_t take) {
    if (*n == kJumboPieces - 1 || !core::readable_in_place(mr, host, take)) return false;
    iov[(*n)++] = iovec{host, take};
    return true;
  };
  return walk_sges(qp, index, w, offset, len, point);
}

// Same-host bulk (Delivery::send_jumbo): the next packets of a large RC
// SEND/WRITE WQE, up to `psns` of them, as one jumbo packet copied straight
// from registered memory into the receiver's ring, under the MR table's lock
// (the lifetime rule, core/mr.h). It takes the PSNs of the MTU packets it
// stands for, so acknowledgements, rewinds and retransmissions work as for
// those. kNotUsed: send MTU packets (the peer is no longer reached through
// shared memory, or on-demand memory or a page made unreadable since
// registration, which only the fault-tolerant copy of add_payload_from may
// read).
Jumbo send_jumbo_packet(EngineQp& qp, uint32_t index, core::SendWqe& w, TxBatch& tx, uint32_t psns) {
  static const uint8_t kTrailer[8] = {};  // pad and the ICRC's place (not computed)
  uint32_t mtu = qp.path.mtu;
  uint32_t len = std::min(w.length - qp.req.offset, psns * mtu);
  bool first = qp.req.offset == 0, last = qp.req.offset + len == w.length;
  uint8_t opcode = opcode_of_qp(qp.type, send_operation(w, first, last));
  const wire::OpcodeInfo& info = wire::opcode_info(opcode);
  uint8_t h[TxBatch::kMaxHeader] = {};
  wire::Bth(h).fill(opcode, last && (w.send_flags & IBV_SEND_SOLICITED), wire::pad_for(len), wire::kDefaultPkey,
                    qp.attr.dest_qp_num, true, qp.req.psn);
  fill_request_headers(qp, info, h, w);
  iovec iov[kJumboPieces];
  unsigned n = 0;
  iov[n++] = iovec{h, info.header_len};
  Walk walk = jumbo_payload(qp, index, w, len, iov, &n);
  if (walk != Walk::kDone) return walk == Walk::kLocalError ? Jumbo::kLocalError : Jumbo::kNotUsed;
  iov[n++] = iovec{const_cast<uint8_t*>(kTrailer), wire::pad_for(len) + wire::kIcrcSize};
  if (tx.pending()) tx.flush();  // earlier packets first: they share the receiver's ring
  if (qp.delivery.send_jumbo(qp.path.src_ip, iov, n) == transport::JumboSend::kNotLocal) return Jumbo::kNotUsed;
  qp.req.jumbo_sent = true;
  qp.count_sent(info.header_len + len + wire::pad_for(len) + wire::kIcrcSize);
  qp.req.pkts_since_ack_req = 0;
  sample_rtt(qp);
  advance_psn(qp, wire::packets_for(len, mtu));
  qp.req.offset += len;
  return Jumbo::kSent;
}

void fail_local(EngineQp& qp, core::SendWqe& w, ibv_wc_status status) {
  complete_send_wqe(qp, w, status);
  qp.enter_error();
}

enum class Placement { kPlaced, kPackets, kWait };

// Whether a large RC WRITE goes as jumbo packets rather than placed. Jumbos
// are two memcpys pipelined across the two processes (the sender into the
// ring, the target's thread out of it), which outrun one process_vm_writev
// (it pins every target page) — but only for a stream of WRITEs from sources
// the caches hold:
// - a stream: the WRITE is unsignaled, or WQEs are posted behind it or are
//   still in flight ahead of it (placing it would wait for their ACKs), or
//   its send CQ holds completions the application has not polled yet
//   (ib_write_bw polls in batches). A lone signaled WRITE is placed:
//   ib_write_lat polls each completion before it posts again, and its target
//   spins on memory, leaving its progress thread no CPU for jumbos;
// - at most kJumboMaxWrite (ib_write_bw -s 4M: 10-19 GB/s as jumbos, 20-21
//   placed) and one QP of the context streaming large WRITEs (-q 8: 11-14
//   against 12-19; mixing the two ways starved the target's thread into
//   retransmissions). Larger or more sources no longer fit the caches: the
//   copy into the ring then runs at memory speed on one CPU, while placement
//   reads them on two.
bool streams_as_jumbo(EngineQp& qp, uint32_t index, const core::SendWqe& w) {
  if (qp.type != IBV_QPT_RC || w.length < kJumboMinBytes || w.length > kJumboMaxWrite || !core::config().shm_jumbo)
    return false;
  if (qp.engine()->note_large_write(qp.qp_num(), Clock::now()) > kJumboMaxWriters) return false;
  bool stream =
      !w.signaled || qp.sq.posted - index > 1 || index != qp.sq.retired || (qp.send_cq && !qp.send_cq->empty());
  return stream && qp.delivery.jumbo_limit() >= qp.path.mtu;
}

// A WQE's local ranges: the host address of each (SGEs with bytes, or its
// inline bytes) and the MR it lies in (null for inline bytes).
struct LocalPieces {
  std::array<iovec, core::kMaxSge> at;  // (the first `count` are set)
  std::array<const core::Mr*, core::kMaxSge> mr;
  unsigned count = 0;
};

// Finds a WQE's local pieces through the MR table, whose lock the caller
// holds for as long as it uses them (a device memory MR's addresses are
// offsets); false if a key no longer checks.
bool find_local_pieces(EngineQp& qp, uint32_t index, const core::SendWqe& w, LocalPieces& p) {
  if (w.is_inline) {
    p.mr[p.count] = nullptr;
    p.at[p.count++] = iovec{qp.sq.inline_buf(index), w.length};
    return true;
  }
  const core::Sge* sge = qp.sq.sges(index);
  for (uint16_t i = 0; i < w.num_sge && p.count < p.at.size(); ++i) {
    if (!sge[i].length) continue;
    const core::Mr* mr = nullptr;
    if (qp.ctx->mrs.check_locked(sge[i].lkey, qp.pd, sge[i].addr, sge[i].length, 0, false, &mr) != core::KeyCheck::kOk)
      return false;
    p.mr[p.count] = mr;
    p.at[p.count++] = iovec{mr->host_at(sge[i].addr, false), sge[i].length};
  }
  return true;
}

// A placed WQE: counted, completed now, occupying no PSN.
void complete_placed(EngineQp& qp, core::SendWqe& w) {
  qp.count(&QpCounters::placed_ops);
  qp.counters->placed_bytes.fetch_add(w.length, std::memory_order_relaxed);
  qp.engine()->stats.placed_ops.fetch_add(1, std::memory_order_relaxed);
  qp.engine()->stats.placed_bytes.fetch_add(w.length, std::memory_order_relaxed);
  w.started = true;
  w.first_psn = w.last_psn = wire::psn_add(qp.req.psn, wire::kPsnMask);  // occupies no PSN
  ++qp.req.index;
  qp.req.offset = 0;
  complete_send_wqe(qp, w, IBV_WC_SUCCESS);
  retire_send_wqes(qp);
}

// Same-host direct placement (Delivery::placement, direct_placement.h) of an
// RDMA WRITE or READ whose predecessors have all completed and with nothing
// in flight: copied now, completed now, occupying no PSN. kPackets: send it
// as packets. kWait: a large one behind WQEs in flight to a target that can
// be placed into waits for their ACKs (the completer runs the requester
// again).
Placement try_place(EngineQp& qp, uint32_t index, core::SendWqe& w, TxBatch& tx) {
  DirectPlacement* dp = qp.delivery.placement();
  if (!dp) return Placement::kPackets;
  bool read = w.opcode == IBV_WR_RDMA_READ;
  if ((!read && w.opcode != IBV_WR_RDMA_WRITE) || w.length == 0) return Placement::kPackets;
  if (!read && streams_as_jumbo(qp, index, w)) return Placement::kPackets;
  if (index != qp.sq.retired || (qp.type == IBV_QPT_RC && qp.req.psn != qp.comp.unacked_psn)) {
    bool wait = qp.type == IBV_QPT_RC && w.length >= DirectPlacement::kWaitToPlace &&
                dp->reachable(qp.path.dst.ip, qp.attr.dest_qp_num);
    return wait ? Placement::kWait : Placement::kPackets;
  }
  LocalPieces local;
  if (!find_local_pieces(qp, index, w, local)) return Placement::kPackets;
  if (tx.pending()) tx.flush();  // UC packets of earlier WQEs go first
  DirectPlacement::Op op{qp.type,       qp.qp_num(), qp.attr.dest_qp_num, qp.path.dst.ip, w.rkey,
                         w.remote_addr, w.length,    local.at.data(),     local.count,    read};
  if (!dp->place(op)) return Placement::kPackets;
  complete_placed(qp, w);
  return Placement::kPlaced;
}

bool is_local_op(const core::SendWqe& w) { return core::wr_has(w.opcode, core::kWrLocal); }

// Memory-window bind and local invalidate execute in send-queue order and
// send nothing (rxe's do_local_ops); a failure completes in error and moves
// the QP to ERR: IBV_WC_MW_BIND_ERR / IBV_WC_LOC_QP_OP_ERR as rxe.
bool run_local_op(EngineQp& qp, core::SendWqe& w) {
  w.started = true;
  w.first_psn = w.last_psn = wire::psn_add(qp.req.psn, wire::kPsnMask);  // occupies no PSN
  ++qp.req.index;
  qp.req.offset = 0;
  if (w.opcode == IBV_WR_BIND_MW) {
    if (qp.ctx->mrs.bind_window(w.bind_mw, qp.pd, w.bind, qp.qp_num()) != 0) {
      fail_local(qp, w, IBV_WC_MW_BIND_ERR);
      return false;
    }
  } else if (qp.ctx->mrs.invalidate(w.invalidate_rkey, qp.pd) != 0) {
    fail_local(qp, w, IBV_WC_LOC_QP_OP_ERR);
    return false;
  }
  complete_send_wqe(qp, w, IBV_WC_SUCCESS);
  return true;
}

// The started, not yet completed WQE holding `psn` (the first in send-queue
// order), or null; `*index` is its position, or else where the search ended
// (the first WQE not started yet).
core::SendWqe* wqe_holding(EngineQp& qp, uint32_t psn, uint32_t* index) {
  uint32_t i = qp.sq.retired;
  for (; i != qp.sq.posted; ++i) {
    core::SendWqe& w = qp.sq.at(i);
    if (!w.started) break;
    if (!w.completed && wire::psn_diff(psn, w.first_psn) >= 0 && wire::psn_diff(psn, w.last_psn) <= 0) {
      *index = i;
      return &w;
    }
  }
  *index = i;
  return nullptr;
}

// Go-back-N: the next request packet sent will be `psn` again.
void rewind_to(EngineQp& qp, uint32_t psn) {
  // Acknowledged PSNs are never sent again (a late NAK may name one).
  if (wire::psn_diff(psn, qp.comp.unacked_psn) < 0) return;
  qp.timers.rtt.active = false;  // Karn: a resent packet's ACK times nothing
  uint32_t i;
  if (const core::SendWqe* w = wqe_holding(qp, psn, &i)) {
    qp.req.index = i;
    qp.req.offset = uint32_t(wire::psn_diff(psn, w->first_psn)) * qp.path.mtu;
    qp.req.psn = psn;
    qp.req.pkts_since_ack_req = 0;
    return;
  }
  // `psn` follows every started WQE: continue with the first unstarted one
  // (also after a rewind whose resends an ACK made needless: catch_up).
  if (psn == qp.req.psn) return;
  bool follows_started =
      i == qp.sq.retired ? psn == qp.comp.unacked_psn : wire::psn_add(qp.sq.at(i - 1).last_psn, 1) == psn;
  if (follows_started) {
    qp.req.index = i;
    qp.req.offset = 0;
    qp.req.psn = psn;
  }
}

// The next request packet sent carries AckReq (a tail-loss probe).
void force_ack_req(EngineQp& qp) { qp.req.pkts_since_ack_req = kMaxPacketsPerAckReq - 1; }

}  // namespace

// --- the completer's requests (roles.h, RequesterLink) ---------------------------

// With nothing queued, no ACK waiting to go with a post and nothing in the
// batch, requester_run would only count the QP in or out of the senders
// (what an ACK that completes the last WQE leaves, once a message in a
// ping-pong): done here, without the run.
void RequesterLink::resume() const {
  bool ack_waits = qp_.in_ack_list && qp_.resp.ack_pending;
  if (qp_.req.index == qp_.sq.posted && !ack_waits && tx_.pending() == 0 && is_reliable(qp_.type)) {
    qp_.engine()->count_sender(qp_, qp_.req.psn != qp_.comp.unacked_psn);
    return;
  }
  requester_run(qp_, tx_);
}

void RequesterLink::rewind(uint32_t psn) const { rewind_to(qp_, psn); }

void RequesterLink::rewind_asking(uint32_t psn) const {
  rewind_to(qp_, psn);
  force_ack_req(qp_);
}

void RequesterLink::resend_one(uint32_t psn) const {
  const RequesterState before = qp_.req;
  const RttSample sample = qp_.timers.rtt;
  rewind_to(qp_, psn);
  // Karn's rule only when the probe repeats the sampled packet: responses
  // come in PSN order, so the first ACK past an earlier or later PSN still
  // answers the original (had the sampled packet been lost, a later one
  // draws a NAK, not an ACK). Probes discarding every sample left srtt at a
  // few ms against rxe in a starved guest answering ~700 ms behind its
  // backlog: probes every ~30 ms, each one a duplicate.
  if (sample.psn != psn) qp_.timers.rtt = sample;
  if (qp_.req.psn != psn) return;  // not outstanding
  force_ack_req(qp_);
  qp_.req.single_packet = true;
  requester_run(qp_, tx_);
  qp_.req.single_packet = false;
  if (wire::psn_diff(before.psn, qp_.req.psn) <= 0) return;
  // The packets after it are still in flight: back to where the requester was.
  qp_.req.index = before.index;
  qp_.req.offset = before.offset;
  qp_.req.psn = before.psn;
  qp_.req.pkts_since_ack_req = before.pkts_since_ack_req;
}

void RequesterLink::catch_up() const {
  // An ACK may acknowledge packets the requester was about to resend after a
  // rewind; never resend what is already acknowledged.
  if (wire::psn_diff(qp_.req.psn, qp_.comp.unacked_psn) < 0) rewind_to(qp_, qp_.comp.unacked_psn);
}

void RequesterLink::read_done() const {
  if (qp_.req.reads_outstanding > 0) --qp_.req.reads_outstanding;
  read_part_done();
}

void RequesterLink::read_part_done() const {
  if (qp_.req.read_requests > 0) --qp_.req.read_requests;
}

uint32_t RequesterLink::next_psn() const { return qp_.req.psn; }

uint32_t RequesterLink::sent_end() const { return qp_.req.psn_end; }

bool RequesterLink::reads_outstanding() const { return qp_.req.reads_outstanding > 0; }

namespace {

// READ and atomic requests a QP may have unanswered (max_rd_atomic, its initiator depth).
uint32_t max_reads(const EngineQp& qp) { return qp.attr.max_rd_atomic ? qp.attr.max_rd_atomic : 1; }

enum class Start { kSend, kPlaced, kStop };

// A WQE's first packet is next: it takes `packets` PSNs from here on (READ:
// one per expected response packet), the requester at its start.
void take_psns(EngineQp& qp, core::SendWqe& w, uint32_t packets) {
  w.started = true;
  w.first_psn = qp.req.psn;
  w.last_psn = wire::psn_add(w.first_psn, packets - 1);
  qp.req.offset = 0;
}

// Starts the WQE at `index`: what must hold before its first packet (read
// credits, the fence, the local keys), then placement; kSend: it goes as
// packets from here.
Start start_wqe(EngineQp& qp, uint32_t index, core::SendWqe& w, TxBatch& tx) {
  if (is_read(w) && qp.req.read_requests >= max_reads(qp)) return Start::kStop;
  // Fence: wait until every earlier READ/ATOMIC has completed.
  if ((w.send_flags & IBV_SEND_FENCE) && qp.req.reads_outstanding > 0) return Start::kStop;
  if (!w.is_inline && !local_keys_ok(qp, index, w, is_read(w) ? IBV_ACCESS_LOCAL_WRITE : 0)) {
    fail_local(qp, w, IBV_WC_LOC_PROT_ERR);
    return Start::kStop;
  }
  Placement placed = try_place(qp, index, w, tx);
  if (placed == Placement::kPlaced) return Start::kPlaced;
  if (placed == Placement::kWait) return Start::kStop;
  take_psns(qp, w, wire::packets_for(w.length, qp.path.mtu));
  if (is_read(w)) ++qp.req.reads_outstanding;
  if (core::is_atomic(w.opcode)) ++qp.req.read_requests;  // a READ's parts count as they go
  return Start::kSend;
}

// The next step of a started WQE: the PSNs it takes, as a jumbo packet or
// not, and the window it must fit.
struct Step {
  uint32_t need = 1;
  bool jumbo = false;
  uint32_t window = 0;
};

// The QP's share of its Delivery's window among the context's sending QPs;
// sets how often a message's packets ask for an ACK.
uint32_t window_share(EngineQp& qp, uint32_t senders) {
  uint32_t window = std::max(kMinWindowPsns, qp.delivery.window_psns() / senders);
  // Through a socket the peer may be slower than this process: the
  // congestion window bounds what is in flight (CompleterState::cwnd).
  if (qp.delivery.congestion_controlled()) window = std::min(window, qp.comp.cwnd);
  qp.req.ack_req_every = std::min(kMaxPacketsPerAckReq, window / 2);
  return window;
}

// Jumbo packets (same host): a window of bytes rather than PSNs, and only
// whole jumbos (or a message's rest) go: partial ones would cut the stream
// into ever smaller pieces as ACKs free the window bit by bit.
void plan_jumbo(EngineQp& qp, const core::SendWqe& w, uint32_t senders, Step& step) {
  uint32_t mtu = qp.path.mtu;
  uint32_t psns = qp.delivery.jumbo_limit() / mtu;
  if (is_read(w) || w.length < kJumboMinBytes || psns == 0) return;
  step.window = std::max(step.window, kJumboWindowBytes / senders / mtu);
  // At most half the window each, so that a QP always has the next jumbo on
  // its way while one is acknowledged (eight QPs share 2 MiB).
  psns = std::max(1u, std::min(psns, step.window / 2));
  step.need = std::min(psns, wire::packets_for(w.length - qp.req.offset, mtu));
  step.jumbo = true;
}

// The next step of the started WQE `w` under the QP's Delivery.
Step plan_step(EngineQp& qp, core::SendWqe& w) {
  uint32_t senders = qp.engine()->senders() + (qp.req.counted_sending ? 0 : 1);
  Step step;
  step.window = window_share(qp, senders);
  // A READ asks for at most the window's worth of responses at a time
  // (send_read_request): 64 QPs reading 1 MiB each asked for 64 MiB at
  // once, more than the receiving socket holds, and collapsed in drops
  // and re-requests (ib_read_bw -q 64: 2-4 GB/s, 2.4 M ghost responses).
  if (is_read(w) && !core::is_atomic(w.opcode)) {
    uint32_t total = wire::packets_for(w.length, qp.path.mtu);
    if (w.read_part_packets == 0) w.read_part_packets = std::min(total, step.window);
    step.need = read_part_left(w, qp.req.offset / qp.path.mtu, total);
  }
  plan_jumbo(qp, w, senders, step);
  return step;
}

// Sends the next READ part or atomic of a started WQE; false: no credit.
bool send_read_step(EngineQp& qp, core::SendWqe& w, TxBatch& tx, uint32_t need) {
  if (core::is_atomic(w.opcode)) {
    send_atomic_request(qp, w, tx);
  } else {
    // A new part takes a credit; a request below what was asked for
    // already repeats one (after a rewind) and takes none.
    uint32_t done = qp.req.offset / qp.path.mtu;
    bool new_part = done >= w.read_requested;
    if (new_part && qp.req.read_requests >= max_reads(qp)) return false;
    send_read_request(qp, w, tx, need);
    if (new_part) ++qp.req.read_requests;
    w.read_requested = std::max(w.read_requested, done + need);
  }
  if (core::is_atomic(w.opcode) || qp.req.offset >= w.length) {
    qp.req.offset = 0;
    ++qp.req.index;
  }
  return true;
}

// Sends the next packet (or jumbo) of a started SEND/WRITE WQE; false after
// a local protection error.
bool send_data_step(EngineQp& qp, uint32_t index, core::SendWqe& w, TxBatch& tx, const Step& step) {
  Jumbo jumbo = step.jumbo ? send_jumbo_packet(qp, index, w, tx, step.need) : Jumbo::kNotUsed;
  if (jumbo == Jumbo::kLocalError || (jumbo == Jumbo::kNotUsed && !send_data_packet(qp, index, w, tx))) {
    fail_local(qp, w, IBV_WC_LOC_PROT_ERR);
    return false;
  }
  if (qp.req.offset >= w.length) {
    qp.req.offset = 0;
    ++qp.req.index;
    // UC and UD have no acknowledgements: the WQE is done once sent.
    if (!is_reliable(qp.type)) complete_send_wqe(qp, w, IBV_WC_SUCCESS);
  }
  return true;
}

// Publishes the packets a burst counted (EngineQp::publish_sent) at its end.
struct PublishSent {
  EngineQp& qp;
  ~PublishSent() { qp.publish_sent(); }
};

// Sends what the window, credits and fences allow, under the MR table's
// shared lock. Returns true when it stopped at a local operation that may run
// now (it changes the table, so it runs outside the lock).
bool send_burst(EngineQp& qp, TxBatch& tx, bool* sent) {
  PublishSent publish{qp};
  auto mr_lock = qp.ctx->mrs.read_lock();
  TxBatch::ReferenceScope references(tx);  // ends first: its packets leave under the lock
  while (qp.req.index != qp.sq.posted && qp.state() == IBV_QPS_RTS) {
    // After a local ACK timeout only its resend goes, until an answer tells
    // whether the originals behind it were lost (completer.cc, undo_spurious_timeout).
    if (qp.comp.timeout.open && wire::psn_diff(qp.req.psn, qp.comp.timeout.end) >= 0) break;
    uint32_t index = qp.req.index;
    core::SendWqe& w = qp.sq.at(index);
    if (!w.started && is_local_op(w)) return !((w.send_flags & IBV_SEND_FENCE) && qp.req.reads_outstanding > 0);
    if (!w.started) {
      Start start = start_wqe(qp, index, w, tx);
      if (start == Start::kPlaced) continue;
      if (start == Start::kStop) break;
    }
    uint32_t in_flight = uint32_t(wire::psn_diff(qp.req.psn, qp.comp.unacked_psn));
    Step step = plan_step(qp, w);
    // The window bounds unacknowledged PSNs; UC has no acknowledgements.
    if (is_reliable(qp.type) && in_flight > 0 && in_flight + step.need > step.window) break;
    bool ok = is_read(w) ? send_read_step(qp, w, tx, step.need) : send_data_step(qp, index, w, tx, step);
    if (!ok) break;
    *sent = true;
    if (qp.req.single_packet) break;
  }
  return false;
}

// Whether a post to the QP now sends nothing itself and leaves its WQEs to
// the next ACK's run (Delivery::coalesce_from): an RC stream through a socket.
bool post_waits_for_ack(EngineQp& qp) {
  uint32_t from = qp.delivery.coalesce_from();
  return from != 0 && is_reliable(qp.type) && qp.state() == IBV_QPS_RTS && qp.timers.retransmit_armed &&
         wire::psn_diff(qp.req.psn, qp.comp.unacked_psn) >= int32_t(from);
}

}  // namespace

void requester_after_post(EngineQp& qp, std::unique_lock<base::FastMutex>& lock) {
  bool jumbo = std::exchange(qp.req.jumbo_sent, false);
  lock.unlock();
  if (jumbo) qp.engine()->poll_receive();
}

namespace {

// Whether an ACK that covers a receive may go behind the reply the
// application is posting, in the same GSO message. The peer's kernel then
// hands both to one receive, and the peer's burst makes the ACK's send
// completion visible before the reply's receive completion
// (EngineContext::process_burst, which publishes receive completions at its
// end): ACK before completion holds as with the ACK first, and the message
// costs one datagram, not two (ib_send_lat). It takes: the reply is the one
// WQE to send, one packet at least as long as the ACK (which then joins its
// message) and first in the batch; GSO; and a path through a socket (through
// shared memory each packet is a record of its own, which the peer may take
// alone). Never a plain WRITE where the same host may place it: placed, the
// data would be there before the ACK.
bool ack_may_close_reply(EngineQp& qp, const TxBatch& tx) {
  if (!tx.gso() || tx.pending() != 0 || qp.req.index + 1 != qp.sq.posted) return false;
  const core::SendWqe& w = qp.sq.at(qp.req.index);
  if (w.started || is_read(w) || is_local_op(w) || w.length > qp.path.mtu) return false;
  if (w.opcode == IBV_WR_RDMA_WRITE && qp.delivery.placement()) return false;
  const wire::OpcodeInfo& info = wire::opcode_info(opcode_of_qp(qp.type, send_operation(w, true, true)));
  if (info.header_len + w.length + wire::pad_for(w.length) + wire::kIcrcSize < kAckPacketBytes) return false;
  return !qp.delivery.through_memory();
}

// One clock read for the packets a post sent: the RTT sample they start and
// the local ACK timer (and the poller's stamp: requester_post).
Clock::time_point stamp_sent(EngineQp& qp) {
  auto now = Clock::now();
  if (qp.timers.rtt.unstamped) qp.timers.rtt.sent = now;
  qp.timers.rtt.unstamped = false;
  completer_start_timer(qp, now);
  return now;
}

// --- a lone packet through shared memory (requester_post) --------------------

// Whether the WQE just posted is a lone packet: the one WQE left to send, a
// SEND or WRITE of at most one MTU (never placed: a plain WRITE only where
// the QP has no direct placement), on an RC QP in RTS whose packets go bare
// through shared memory (Delivery::icrc), with room in the window (a share
// is never below kMinWindowPsns), no RNR wait, no fence to hold and no ACK
// waiting to go with the post (requester_run sends it beside the request).
// A ping-pong's message, on either side, is one.
bool is_lone_packet(const EngineQp& qp, const core::SendWqe& w) {
  if (qp.req.index + 1 != qp.sq.posted || w.started || (qp.in_ack_list && qp.resp.ack_pending)) return false;
  if (qp.type != IBV_QPT_RC || qp.state() != IBV_QPS_RTS || qp.timers.rnr_armed) return false;
  if (qp.delivery.icrc() != TxBatch::Icrc::kOmit || w.length > qp.path.mtu) return false;
  if (is_read(w) || is_local_op(w) || (w.opcode == IBV_WR_RDMA_WRITE && qp.delivery.placement())) return false;
  if ((w.send_flags & IBV_SEND_FENCE) && qp.req.reads_outstanding > 0) return false;
  return uint32_t(wire::psn_diff(qp.req.psn, qp.comp.unacked_psn)) < kMinWindowPsns;
}

// Copies a WQE's pieces to `to`, each by a copy that survives a fault on
// either side (core/mr_access.h; `to` may be a mailbox page its receiver
// gave back): false if a piece cannot be read or `to` written.
bool copy_pieces(const LocalPieces& p, uint8_t* to) {
  for (unsigned i = 0; i < p.count; ++i) {
    const iovec& at = p.at[i];
    bool ok = p.mr[i] ? core::copy_from_mr(*p.mr[i], to, at.iov_base, at.iov_len)
                      : core::guarded_copy(to, at.iov_base, at.iov_len) == 0;
    if (!ok) return false;
    to += at.iov_len;
  }
  return true;
}

// Writes the lone packet of the WQE at `index` straight into the peer's ring
// (Delivery::reserve_bare): the header and payload in place, no batch, no
// burst, one key check per piece. Its WQE and the requester then stand as
// start_wqe, send_data_packet and send_data_step leave them. False, having
// changed nothing, when it cannot (a key that does not check, an unreadable
// page, a full ring, a peer no longer reached through memory): the caller
// runs the requester, which sends it or reports the error as ever.
bool send_lone_packet(EngineQp& qp, uint32_t index, core::SendWqe& w) {
  uint8_t opcode = opcode_of_qp(qp.type, send_operation(w, true, true));
  const wire::OpcodeInfo& info = wire::opcode_info(opcode);
  unsigned pad = wire::pad_for(w.length);
  uint32_t bytes = info.header_len + w.length + pad + wire::kIcrcSize;
  auto mr_lock = qp.ctx->mrs.read_lock();  // the pieces stay valid until the copy is done
  LocalPieces pieces;
  if (!find_local_pieces(qp, index, w, pieces)) return false;
  transport::BareSlot slot;
  if (!qp.delivery.reserve_bare(qp.path.src_ip, bytes, slot)) return false;
  uint8_t* h = slot.data;
  std::memset(h, 0, info.header_len);
  wire::Bth(h).fill(opcode, w.send_flags & IBV_SEND_SOLICITED, pad, wire::kDefaultPkey, qp.attr.dest_qp_num, true,
                    qp.req.psn);
  fill_request_headers(qp, info, h, w);
  if (!copy_pieces(pieces, h + info.header_len)) {
    qp.delivery.abandon_bare(slot);
    return false;
  }
  std::memset(h + info.header_len + w.length, 0, pad + wire::kIcrcSize);
  qp.delivery.commit_bare(slot);
  take_psns(qp, w, 1);  // (at most one MTU: no division)
  ++qp.req.index;
  qp.req.pkts_since_ack_req = 0;
  qp.count_sent(bytes);
  sample_rtt(qp);
  advance_psn(qp, 1);
  return true;
}

// --- a lone SEND into the peer's mailbox (requester_post) ---------------------

// The peer's mailbox page faulted (mailbox.h: given back by its receiver,
// and not found again): no more records to it until the QP's next RTR.
MailboxSlot* lose_mailbox(MailboxSender& m) {
  m.peer.box = nullptr;
  return nullptr;
}

// The slot of the sender's next record, if the peer's mailbox is open for
// this QP pair and has room; a new tag (the peer opened it again) starts
// the count anew.
MailboxSlot* next_mail_slot(EngineQp& qp) {
  MailboxSender& m = qp.mail_tx;
  auto* box = reinterpret_cast<Mailbox*>(m.peer.box);
  uint64_t tag = 0;
  if (!core::guarded_load(&box->open, &tag)) return lose_mailbox(m);
  if (tag == 0) return nullptr;  // closed
  if (tag != m.tag) {
    if (!mailbox_tag_of_pair(tag, qp.qp_num(), qp.attr.dest_qp_num)) return nullptr;
    m.tag = tag;
    m.seq = m.consumed = 0;
  }
  if (m.seq - m.consumed >= kMailboxSlots && !core::guarded_load(&box->consumed, &m.consumed)) return lose_mailbox(m);
  if (m.seq - m.consumed >= kMailboxSlots) return nullptr;
  return &box->slots[m.seq % kMailboxSlots];
}

// Writes the lone packet of a short SEND as a record in the peer's mailbox
// (mailbox.h): the payload and the fields, then the stamp. Its WQE and the
// requester then stand as send_lone_packet leaves them. False, having
// changed nothing, when it cannot (no mailbox open for the pair, no room,
// another operation, a key that does not check): the caller goes on.
bool send_mail(EngineQp& qp, uint32_t index, core::SendWqe& w) {
  if (!qp.mail_tx.peer.box || w.length > kMailboxPayload) return false;
  if (w.opcode != IBV_WR_SEND && w.opcode != IBV_WR_SEND_WITH_IMM) return false;
  MailboxSlot* slot = next_mail_slot(qp);
  if (!slot) return false;
  {
    auto mr_lock = qp.ctx->mrs.read_lock();
    LocalPieces pieces;
    if (!find_local_pieces(qp, index, w, pieces) || !copy_pieces(pieces, slot->payload)) return false;
  }
  bool imm = w.opcode == IBV_WR_SEND_WITH_IMM;
  MailHead head{.psn = qp.req.psn,
                .length = w.length,
                .imm = imm ? w.imm_data : 0,
                .op = uint8_t(imm ? MailOp::kSendWithImm : MailOp::kSend),
                .flags = uint8_t((w.send_flags & IBV_SEND_SOLICITED) ? kMailSolicited : 0),
                .reserved = 0};
  auto words = std::bit_cast<std::array<uint64_t, 2>>(head);  // two stores: cheaper than a copy's
  auto* at = reinterpret_cast<uint64_t*>(&slot->head);
  if (!core::guarded_store(at, words[0]) || !core::guarded_store(at + 1, words[1]) ||
      !core::guarded_store(&slot->stamp, mailbox_stamp(qp.mail_tx.tag, qp.mail_tx.seq))) {
    lose_mailbox(qp.mail_tx);
    return false;
  }
  ++qp.mail_tx.seq;
  uint8_t opcode = opcode_of_qp(qp.type, send_operation(w, true, true));
  unsigned pad = wire::pad_for(w.length);
  qp.engine()->transport().notify_mailbox(qp.mail_tx.peer);
  qp.engine()->stats.mail_out.fetch_add(1, std::memory_order_relaxed);
  take_psns(qp, w, 1);
  ++qp.req.index;
  qp.req.pkts_since_ack_req = 0;
  qp.count_sent(wire::opcode_info(opcode).header_len + w.length + pad + wire::kIcrcSize);  // the packet it stands for
  sample_rtt(qp);
  advance_psn(qp, 1);
  return true;
}

}  // namespace

Clock::time_point requester_post(EngineQp& qp) {
  qp.delivery.count_post();
  uint32_t index = qp.req.index;
  core::SendWqe& w = qp.sq.at(index);  // (when none is left to send, a free slot: not lone)
  if (is_lone_packet(qp, w) && (send_mail(qp, index, w) || send_lone_packet(qp, index, w))) {
    qp.engine()->count_sender(qp, true);
    return stamp_sent(qp);
  }
  return post_waits_for_ack(qp) ? Clock::time_point{} : requester_run(qp, TxBatch::local());
}

Clock::time_point requester_run(EngineQp& qp, TxBatch& tx) {
  // The ACK an application turn left for this post (EngineContext::process_burst)
  // goes in the same burst as the requests, mostly behind them: shorter than
  // they are, it closes their GSO message, so a peer that polls its CQ for
  // its own WRITE's completion takes the reply with it in one receive. With
  // the ACK first it took the ACK alone, and the reply waited for its
  // progress thread (ib_write_lat 64 B over UDP, whose target spins on
  // memory: 12.2 -> 3.3 us). An ACK that covers a receive (SEND, WRITE with
  // immediate) goes first unless ack_may_close_reply: ACK before completion,
  // a reply to a SEND never completes at the peer before the SEND.
  bool acked = qp.in_ack_list && qp.resp.ack_pending;
  bool may_send = qp.state() == IBV_QPS_RTS && !qp.timers.rnr_armed;
  tx.use(&qp.engine()->transport());
  bool ack_behind = acked && may_send && (!qp.resp.ack_covers_receive || ack_may_close_reply(qp, tx));
  if (acked && !ack_behind) responder_flush_ack(qp, tx);
  if (!may_send) {
    if (acked) tx.flush();
    return {};
  }
  bool sent = false;
  // (With nothing queued — the run an ACK starts, mostly — no burst, nor the MR table's lock.)
  while (qp.req.index != qp.sq.posted && send_burst(qp, tx, &sent)) {
    if (!run_local_op(qp, qp.sq.at(qp.req.index))) break;
    retire_send_wqes(qp);
  }
  if (!is_reliable(qp.type)) retire_send_wqes(qp);
  if (is_reliable(qp.type)) qp.engine()->count_sender(qp, qp.req.psn != qp.comp.unacked_psn);
  if (ack_behind) responder_flush_ack(qp, tx);
  if (!tx.in_burst()) {
    // An application's post: its packets leave, then the clock is read for
    // them (~60 ns a read on the VMs measured: kept out of a same-host
    // one-way's path). No ACK of them is taken before: that needs qp.mu.
    tx.flush();
    return sent ? stamp_sent(qp) : Clock::time_point{};
  }
  Clock::time_point sent_at = sent ? stamp_sent(qp) : Clock::time_point{};
  // In a receive burst a stream's packets may wait for the burst's end
  // (TxBatch::BurstScope): the other ACKs of the burst release more, and all
  // leave in one system call (ib_write_bw 1 MiB -q 64: ~13 ACKs a receive,
  // each run flushing its own sendmmsg). Nothing overtakes them: until an
  // ACK comes — which only this receive turn takes — a post to this QP sends
  // nothing itself (post_waits_for_ack), and this thread flushes before it
  // takes another datagram.
  if (!post_waits_for_ack(qp)) tx.flush();
  return sent_at;
}

}  // namespace uroce::engine
