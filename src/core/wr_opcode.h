// The work-request opcode table: what each ibv_wr_opcode is, as data (rxe's
// rxe_wr_opcode_info in rxe_opcode.c). One row per opcode says which QP types
// may post it, which completion opcode reports it and what it does (reads
// remote memory, is atomic, carries an immediate or an rkey, stays local).
// The post path (core::Qp::enqueue_send), ibv_create_qp_ex's send_ops_flags,
// the requester and the completer all decide from here.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>

namespace uroce::core {

// QP types, as bits of WrOpcodeInfo::qp_types.
enum WrQpType : uint8_t {
  kWrRc = 1 << 0,
  kWrUc = 1 << 1,
  kWrUd = 1 << 2,
  kWrXrcSend = 1 << 3,  // XRC initiator; an XRC target (XRC_RECV) has no send queue
};

enum WrFlag : uint8_t {
  kWrReads = 1 << 0,      // answered with response data (READ, atomics): max_rd_atomic credits
  kWrAtomic = 1 << 1,     // 8 bytes read and written at the responder (IBA 9.4.5)
  kWrImmediate = 1 << 2,  // carries imm_data
  kWrRkey = 1 << 3,       // names remote memory by rkey and address
  kWrLocal = 1 << 4,      // no packet: done by the requester itself (LOCAL_INV, BIND_MW)
  kWrInline = 1 << 5,     // ibv_wr_set_inline_data* applies (ibv_wr_post(3): SEND and RDMA_WRITE)
};

struct WrOpcodeInfo {
  const char* name = nullptr;  // nullptr: an opcode uroce does not implement
  uint8_t qp_types = 0;        // WrQpType bits
  ibv_wc_opcode wc_opcode = IBV_WC_SEND;
  uint8_t flags = 0;     // WrFlag bits
  uint64_t send_op = 0;  // its IBV_QP_EX_WITH_* bit (ibv_create_qp_ex's send_ops_flags)
};

inline constexpr uint8_t kWrRcXrc = kWrRc | kWrXrcSend;
inline constexpr uint8_t kWrConnected = kWrRcXrc | kWrUc;

// Indexed by ibv_wr_opcode. IBA 9.4 (table 41): UD sends only; UC adds RDMA
// WRITE; READ, atomics and SEND with Invalidate are RC/XRC only. Memory
// window operations (IBA 10.6.7) are local and allowed on RC, UC and XRC.
// TSO (raw packet QPs), driver-specific opcodes and ATOMIC_WRITE are not
// implemented: empty rows.
inline constexpr std::array<WrOpcodeInfo, IBV_WR_ATOMIC_WRITE + 1> kWrOpcodeInfo = [] {
  std::array<WrOpcodeInfo, IBV_WR_ATOMIC_WRITE + 1> t{};
  t[IBV_WR_RDMA_WRITE] = {"RDMA_WRITE", kWrConnected, IBV_WC_RDMA_WRITE, kWrRkey | kWrInline,
                          IBV_QP_EX_WITH_RDMA_WRITE};
  t[IBV_WR_RDMA_WRITE_WITH_IMM] = {"RDMA_WRITE_WITH_IMM", kWrConnected, IBV_WC_RDMA_WRITE,
                                   kWrRkey | kWrImmediate | kWrInline, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM};
  t[IBV_WR_SEND] = {"SEND", kWrConnected | kWrUd, IBV_WC_SEND, kWrInline, IBV_QP_EX_WITH_SEND};
  t[IBV_WR_SEND_WITH_IMM] = {"SEND_WITH_IMM", kWrConnected | kWrUd, IBV_WC_SEND, kWrImmediate | kWrInline,
                             IBV_QP_EX_WITH_SEND_WITH_IMM};
  t[IBV_WR_RDMA_READ] = {"RDMA_READ", kWrRcXrc, IBV_WC_RDMA_READ, kWrReads | kWrRkey, IBV_QP_EX_WITH_RDMA_READ};
  t[IBV_WR_ATOMIC_CMP_AND_SWP] = {"ATOMIC_CMP_AND_SWP", kWrRcXrc, IBV_WC_COMP_SWAP, kWrReads | kWrAtomic | kWrRkey,
                                  IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP};
  t[IBV_WR_ATOMIC_FETCH_AND_ADD] = {"ATOMIC_FETCH_AND_ADD", kWrRcXrc, IBV_WC_FETCH_ADD, kWrReads | kWrAtomic | kWrRkey,
                                    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD};
  t[IBV_WR_LOCAL_INV] = {"LOCAL_INV", kWrConnected, IBV_WC_LOCAL_INV, kWrLocal, IBV_QP_EX_WITH_LOCAL_INV};
  t[IBV_WR_BIND_MW] = {"BIND_MW", kWrConnected, IBV_WC_BIND_MW, kWrLocal, IBV_QP_EX_WITH_BIND_MW};
  t[IBV_WR_SEND_WITH_INV] = {"SEND_WITH_INV", kWrRcXrc, IBV_WC_SEND, 0, IBV_QP_EX_WITH_SEND_WITH_INV};
  return t;
}();

inline constexpr WrOpcodeInfo kWrOpcodeUnknown{};

// The row of `op`; an empty row for opcodes beyond the table.
constexpr const WrOpcodeInfo& wr_opcode_info(ibv_wr_opcode op) {
  return unsigned(op) < kWrOpcodeInfo.size() ? kWrOpcodeInfo[op] : kWrOpcodeUnknown;
}

constexpr bool wr_has(ibv_wr_opcode op, WrFlag f) { return wr_opcode_info(op).flags & f; }

// The WrQpType bit of a QP type; 0 for types that post no sends (XRC_RECV, …).
constexpr uint8_t wr_qp_type_bit(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_RC:
      return kWrRc;
    case IBV_QPT_UC:
      return kWrUc;
    case IBV_QPT_UD:
      return kWrUd;
    case IBV_QPT_XRC_SEND:
      return kWrXrcSend;
    default:
      return 0;
  }
}

constexpr bool wr_allowed(ibv_qp_type t, ibv_wr_opcode op) { return wr_opcode_info(op).qp_types & wr_qp_type_bit(t); }

inline bool is_atomic(ibv_wr_opcode op) { return wr_has(op, kWrAtomic); }
// READs and atomics are answered with responses and use the initiator's
// max_rd_atomic credits (ibv_modify_qp(3): outstanding RDMA READs and atomics).
inline bool is_read_or_atomic(ibv_wr_opcode op) { return wr_has(op, kWrReads); }

static_assert(wr_allowed(IBV_QPT_UD, IBV_WR_SEND_WITH_IMM) && !wr_allowed(IBV_QPT_UD, IBV_WR_RDMA_WRITE));
static_assert(!wr_allowed(IBV_QPT_UC, IBV_WR_RDMA_READ) && wr_allowed(IBV_QPT_XRC_SEND, IBV_WR_ATOMIC_FETCH_AND_ADD));
static_assert(!wr_allowed(IBV_QPT_XRC_RECV, IBV_WR_SEND) && !wr_opcode_info(IBV_WR_TSO).qp_types);

}  // namespace uroce::core
