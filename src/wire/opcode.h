// RoCEv2 opcodes: one constexpr table that says, for every opcode, which
// extended headers follow the BTH, whether it carries payload and where it sits
// in a message (roce-facts.md §1.2, after Linux rxe_opcode.c). Header offsets
// are computed from the header sizes, never written by hand.
#pragma once

#include <array>
#include <cstdint>

namespace uroce::wire {

inline constexpr unsigned kBthSize = 12;
inline constexpr unsigned kIcrcSize = 4;

// Extended headers, in the order they follow the BTH when several are present
// (RETH before ImmDt, DETH before ImmDt, AETH before AtomicAckETH; XRCETH, the
// XRC SRQ number of XRC requests, right after the BTH, as rxe's XRC patches).
enum class Hdr : uint8_t { kRdeth, kDeth, kXrceth, kReth, kAtomicEth, kAeth, kAtomicAckEth, kImmDt, kIeth, kCount };
inline constexpr unsigned kHdrCount = static_cast<unsigned>(Hdr::kCount);
inline constexpr std::array<uint8_t, kHdrCount> kHdrSize = {4, 8, 4, 16, 28, 4, 8, 4, 4};

constexpr uint16_t hdr_bit(Hdr h) { return uint16_t(1u << static_cast<unsigned>(h)); }

// Service (bits 7:5 of the opcode).
enum class Service : uint8_t { kRc = 0x00, kUc = 0x20, kRd = 0x40, kUd = 0x60, kCnp = 0x80, kXrc = 0xA0 };

// Operation (bits 4:0 of the opcode).
enum class Operation : uint8_t {
  kSendFirst = 0x00,
  kSendMiddle = 0x01,
  kSendLast = 0x02,
  kSendLastImm = 0x03,
  kSendOnly = 0x04,
  kSendOnlyImm = 0x05,
  kWriteFirst = 0x06,
  kWriteMiddle = 0x07,
  kWriteLast = 0x08,
  kWriteLastImm = 0x09,
  kWriteOnly = 0x0A,
  kWriteOnlyImm = 0x0B,
  kReadRequest = 0x0C,
  kReadResponseFirst = 0x0D,
  kReadResponseMiddle = 0x0E,
  kReadResponseLast = 0x0F,
  kReadResponseOnly = 0x10,
  kAcknowledge = 0x11,
  kAtomicAcknowledge = 0x12,
  kCompareSwap = 0x13,
  kFetchAdd = 0x14,
  kSendLastInv = 0x16,
  kSendOnlyInv = 0x17,
};

constexpr uint8_t make_opcode(Service s, Operation o) { return uint8_t(uint8_t(s) | uint8_t(o)); }
constexpr Service service_of(uint8_t opcode) { return Service(opcode & 0xE0); }
constexpr Operation operation_of(uint8_t opcode) { return Operation(opcode & 0x1F); }

inline constexpr uint8_t kOpCnp = 0x81;

// What an opcode is and does.
enum OpFlag : uint32_t {
  kOpValid = 1u << 0,
  kOpPayload = 1u << 1,   // carries payload
  kOpStart = 1u << 2,     // first packet of a message (FIRST or ONLY)
  kOpEnd = 1u << 3,       // last packet of a message (LAST or ONLY)
  kOpRequest = 1u << 4,   // requester -> responder
  kOpResponse = 1u << 5,  // responder -> completer (read responses, ACKs)
  kOpSend = 1u << 6,
  kOpWrite = 1u << 7,
  kOpRead = 1u << 8,  // READ request
  kOpReadResponse = 1u << 9,
  kOpAtomic = 1u << 10,  // CompareSwap / FetchAdd request
  kOpAck = 1u << 11,     // ACKNOWLEDGE / ATOMIC_ACKNOWLEDGE
  kOpImm = 1u << 12,     // carries ImmDt
  kOpInv = 1u << 13,     // carries IETH
  kOpRwqe = 1u << 14,    // consumes a receive WQE at the responder (RWQE column)
  kOpRcqe = 1u << 15,    // produces a receive completion (RCQE column)
};

struct OpcodeInfo {
  const char* name = nullptr;
  uint32_t flags = 0;
  uint16_t headers = 0;                     // hdr_bit() set
  uint8_t header_len = 0;                   // BTH + extended headers
  std::array<uint8_t, kHdrCount> offset{};  // from the start of the BTH; 0 = absent

  constexpr bool valid() const { return flags & kOpValid; }
  constexpr bool has(Hdr h) const { return headers & hdr_bit(h); }
  constexpr bool is(uint32_t f) const { return (flags & f) == f; }
};

namespace detail {

struct OpDesc {
  Operation op;
  const char* name;
  uint32_t flags;
  uint16_t headers;
};

inline constexpr uint16_t H(Hdr h) { return hdr_bit(h); }

// The operations and their headers (RC numbering; UC/UD reuse a subset).
inline constexpr OpDesc kOps[] = {
    {Operation::kSendFirst, "SEND_FIRST", kOpPayload | kOpStart | kOpRequest | kOpSend | kOpRwqe, 0},
    {Operation::kSendMiddle, "SEND_MIDDLE", kOpPayload | kOpRequest | kOpSend, 0},
    {Operation::kSendLast, "SEND_LAST", kOpPayload | kOpEnd | kOpRequest | kOpSend | kOpRcqe, 0},
    {Operation::kSendLastImm, "SEND_LAST_WITH_IMMEDIATE", kOpPayload | kOpEnd | kOpRequest | kOpSend | kOpImm | kOpRcqe,
     H(Hdr::kImmDt)},
    {Operation::kSendOnly, "SEND_ONLY", kOpPayload | kOpStart | kOpEnd | kOpRequest | kOpSend | kOpRwqe | kOpRcqe, 0},
    {Operation::kSendOnlyImm, "SEND_ONLY_WITH_IMMEDIATE",
     kOpPayload | kOpStart | kOpEnd | kOpRequest | kOpSend | kOpImm | kOpRwqe | kOpRcqe, H(Hdr::kImmDt)},
    {Operation::kWriteFirst, "RDMA_WRITE_FIRST", kOpPayload | kOpStart | kOpRequest | kOpWrite, H(Hdr::kReth)},
    {Operation::kWriteMiddle, "RDMA_WRITE_MIDDLE", kOpPayload | kOpRequest | kOpWrite, 0},
    {Operation::kWriteLast, "RDMA_WRITE_LAST", kOpPayload | kOpEnd | kOpRequest | kOpWrite, 0},
    {Operation::kWriteLastImm, "RDMA_WRITE_LAST_WITH_IMMEDIATE",
     kOpPayload | kOpEnd | kOpRequest | kOpWrite | kOpImm | kOpRwqe | kOpRcqe, H(Hdr::kImmDt)},
    {Operation::kWriteOnly, "RDMA_WRITE_ONLY", kOpPayload | kOpStart | kOpEnd | kOpRequest | kOpWrite, H(Hdr::kReth)},
    {Operation::kWriteOnlyImm, "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
     kOpPayload | kOpStart | kOpEnd | kOpRequest | kOpWrite | kOpImm | kOpRwqe | kOpRcqe,
     uint16_t(H(Hdr::kReth) | H(Hdr::kImmDt))},
    {Operation::kReadRequest, "RDMA_READ_REQUEST", kOpStart | kOpEnd | kOpRequest | kOpRead, H(Hdr::kReth)},
    {Operation::kReadResponseFirst, "RDMA_READ_RESPONSE_FIRST", kOpPayload | kOpStart | kOpResponse | kOpReadResponse,
     H(Hdr::kAeth)},
    {Operation::kReadResponseMiddle, "RDMA_READ_RESPONSE_MIDDLE", kOpPayload | kOpResponse | kOpReadResponse, 0},
    {Operation::kReadResponseLast, "RDMA_READ_RESPONSE_LAST", kOpPayload | kOpEnd | kOpResponse | kOpReadResponse,
     H(Hdr::kAeth)},
    {Operation::kReadResponseOnly, "RDMA_READ_RESPONSE_ONLY",
     kOpPayload | kOpStart | kOpEnd | kOpResponse | kOpReadResponse, H(Hdr::kAeth)},
    {Operation::kAcknowledge, "ACKNOWLEDGE", kOpStart | kOpEnd | kOpResponse | kOpAck, H(Hdr::kAeth)},
    {Operation::kAtomicAcknowledge, "ATOMIC_ACKNOWLEDGE", kOpStart | kOpEnd | kOpResponse | kOpAck,
     uint16_t(H(Hdr::kAeth) | H(Hdr::kAtomicAckEth))},
    {Operation::kCompareSwap, "COMPARE_SWAP", kOpStart | kOpEnd | kOpRequest | kOpAtomic, H(Hdr::kAtomicEth)},
    {Operation::kFetchAdd, "FETCH_ADD", kOpStart | kOpEnd | kOpRequest | kOpAtomic, H(Hdr::kAtomicEth)},
    {Operation::kSendLastInv, "SEND_LAST_WITH_INVALIDATE",
     kOpPayload | kOpEnd | kOpRequest | kOpSend | kOpInv | kOpRcqe, H(Hdr::kIeth)},
    {Operation::kSendOnlyInv, "SEND_ONLY_WITH_INVALIDATE",
     kOpPayload | kOpStart | kOpEnd | kOpRequest | kOpSend | kOpInv | kOpRwqe | kOpRcqe, H(Hdr::kIeth)},
};

constexpr bool uc_allows(Operation op) {
  // UC: SEND and RDMA WRITE families only.
  return uint8_t(op) <= uint8_t(Operation::kWriteOnlyImm);
}
constexpr bool ud_allows(Operation op) { return op == Operation::kSendOnly || op == Operation::kSendOnlyImm; }

constexpr OpcodeInfo make_info(const OpDesc& d, uint16_t extra_headers) {
  OpcodeInfo info;
  info.name = d.name;
  info.flags = d.flags | kOpValid;
  info.headers = uint16_t(d.headers | extra_headers);
  unsigned off = kBthSize;
  for (unsigned h = 0; h < kHdrCount; ++h) {
    if (info.headers & (1u << h)) {
      info.offset[h] = uint8_t(off);
      off += kHdrSize[h];
    }
  }
  info.header_len = uint8_t(off);
  return info;
}

constexpr std::array<OpcodeInfo, 256> make_table() {
  std::array<OpcodeInfo, 256> t{};
  for (const OpDesc& d : kOps) {
    t[make_opcode(Service::kRc, d.op)] = make_info(d, 0);
    if (uc_allows(d.op)) t[make_opcode(Service::kUc, d.op)] = make_info(d, 0);
    if (ud_allows(d.op)) t[make_opcode(Service::kUd, d.op)] = make_info(d, H(Hdr::kDeth));
    // XRC: every RC operation; requests name the target XRC SRQ (XRCETH).
    t[make_opcode(Service::kXrc, d.op)] = make_info(d, (d.flags & kOpRequest) ? H(Hdr::kXrceth) : 0);
  }
  // CNP: BTH, 16 reserved bytes (treated as header bytes), no payload.
  OpcodeInfo cnp;
  cnp.name = "CNP";
  cnp.flags = kOpValid | kOpStart | kOpEnd;
  cnp.header_len = kBthSize + 16;
  t[kOpCnp] = cnp;
  return t;
}

}  // namespace detail

inline constexpr std::array<OpcodeInfo, 256> kOpcodeTable = detail::make_table();

constexpr const OpcodeInfo& opcode_info(uint8_t opcode) { return kOpcodeTable[opcode]; }

// Human-readable opcode name ("RC SEND_ONLY"), "UNKNOWN" for invalid opcodes.
const char* opcode_name(uint8_t opcode);
const char* service_name(uint8_t opcode);

}  // namespace uroce::wire
