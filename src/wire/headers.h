// Header views over packet bytes (roce-facts.md §1.1, §2.1), after rxe_hdr.h:
// each view wraps a pointer to the start of its header and offers big-endian
// accessors. Views never own memory and never check bounds: PacketView::parse
// establishes that every header an opcode carries is present.
#pragma once

#include <cstddef>
#include <cstdint>

#include "wire/byte_order.h"
#include "wire/opcode.h"

namespace uroce::wire {

// The UDP destination port of RoCEv2 (IANA; roce-facts.md): where RoCE
// packets are sent, and the default of the host's shared port here
// (UROCE_PORT, design §3).
inline constexpr uint16_t kRoceV2Port = 4791;

// The UDP source ports of RoCEv2 flows (the kernel's
// IB_ROCE_UDP_ENCAP_VALID_PORT_MIN..MAX; rxe and NICs derive one per QP,
// roce-facts.md §5.5). uroce's own senders use their private port below it
// (design §3), which tells its receivers how strict the ICRC check can be
// (engine_context.cc, icrc_ok).
inline constexpr uint16_t kRoceSourcePortMin = 0xC000;

inline constexpr uint16_t kDefaultPkey = 0xFFFF;
inline constexpr uint32_t kGsiQkey = 0x80010000;

// The BTH PadCnt of a packet with `payload_len` payload bytes: payload and
// pad end on a 4-byte boundary (roce-facts.md §1.1).
constexpr unsigned pad_for(uint32_t payload_len) { return (4 - (payload_len & 3)) & 3; }

class Bth {
 public:
  explicit Bth(uint8_t* p) : p_(p) {}
  uint8_t opcode() const { return p_[0]; }
  bool se() const { return p_[1] & 0x80; }
  bool mig() const { return p_[1] & 0x40; }
  unsigned pad() const { return (p_[1] >> 4) & 3; }
  unsigned tver() const { return p_[1] & 0xF; }
  uint16_t pkey() const { return load_be16(p_ + 2); }
  bool fecn() const { return p_[4] & 0x80; }
  bool becn() const { return p_[4] & 0x40; }
  uint32_t dest_qp() const { return load_be24(p_ + 5); }
  bool ack_req() const { return p_[8] & 0x80; }
  uint32_t psn() const { return load_be24(p_ + 9); }

  // Writes a whole BTH: reserved bits and FECN/BECN zero, TVer 0.
  void fill(uint8_t opcode, bool se, unsigned pad, uint16_t pkey, uint32_t dest_qp, bool ack_req, uint32_t psn) {
    p_[0] = opcode;
    p_[1] = uint8_t((se ? 0x80 : 0) | (pad & 3) << 4);
    store_be16(p_ + 2, pkey);
    p_[4] = 0;
    store_be24(p_ + 5, dest_qp);
    p_[8] = ack_req ? 0x80 : 0;
    store_be24(p_ + 9, psn);
  }
  void set_becn(bool on) { p_[4] = uint8_t((p_[4] & ~0x40) | (on ? 0x40 : 0)); }  // a CNP's (roce-facts.md §1.1)
  void set_dest_qp(uint32_t qp) { store_be24(p_ + 5, qp); }
  void set_psn(uint32_t psn) { store_be24(p_ + 9, psn); }

 private:
  uint8_t* p_;
};

class Reth {
 public:
  explicit Reth(uint8_t* p) : p_(p) {}
  uint64_t va() const { return load_be64(p_); }
  uint32_t rkey() const { return load_be32(p_ + 8); }
  uint32_t dma_len() const { return load_be32(p_ + 12); }
  void fill(uint64_t va, uint32_t rkey, uint32_t dma_len) {
    store_be64(p_, va);
    store_be32(p_ + 8, rkey);
    store_be32(p_ + 12, dma_len);
  }

 private:
  uint8_t* p_;
};

// AETH syndrome byte: bits 6:5 type, bits 4:0 credit / RNR timer / NAK code.
enum class AckType : uint8_t { kAck = 0, kRnrNak = 1, kReserved = 2, kNak = 3 };
enum class NakCode : uint8_t {
  kPsnSeqError = 0,
  kInvalidRequest = 1,
  kRemoteAccess = 2,
  kRemoteOp = 3,
  kInvalidRd = 4
};
inline constexpr uint8_t kAckNoCredit = 0x1F;  // rxe: credit code 31, no flow control

constexpr uint8_t syndrome(AckType t, uint8_t low5) { return uint8_t(uint8_t(t) << 5 | (low5 & 0x1F)); }

class Aeth {
 public:
  explicit Aeth(uint8_t* p) : p_(p) {}
  uint8_t syndrome() const { return p_[0]; }
  AckType type() const { return AckType((p_[0] >> 5) & 3); }
  uint8_t code() const { return p_[0] & 0x1F; }
  uint32_t msn() const { return load_be24(p_ + 1); }
  void fill(uint8_t syndrome, uint32_t msn) {
    p_[0] = syndrome;
    store_be24(p_ + 1, msn);
  }

 private:
  uint8_t* p_;
};

class AtomicEth {
 public:
  explicit AtomicEth(uint8_t* p) : p_(p) {}
  uint64_t va() const { return load_be64(p_); }
  uint32_t rkey() const { return load_be32(p_ + 8); }
  uint64_t swap_add() const { return load_be64(p_ + 12); }
  uint64_t compare() const { return load_be64(p_ + 20); }
  void fill(uint64_t va, uint32_t rkey, uint64_t swap_add, uint64_t compare) {
    store_be64(p_, va);
    store_be32(p_ + 8, rkey);
    store_be64(p_ + 12, swap_add);
    store_be64(p_ + 20, compare);
  }

 private:
  uint8_t* p_;
};

class AtomicAckEth {
 public:
  explicit AtomicAckEth(uint8_t* p) : p_(p) {}
  uint64_t orig() const { return load_be64(p_); }
  void fill(uint64_t orig) { store_be64(p_, orig); }

 private:
  uint8_t* p_;
};

// ImmDt and IETH: opaque 32 bits. Verbs expose imm_data already in network
// order, so these accessors copy the raw bytes.
class Raw32 {
 public:
  explicit Raw32(uint8_t* p) : p_(p) {}
  uint32_t raw() const {
    uint32_t v;
    std::memcpy(&v, p_, 4);
    return v;
  }
  uint32_t value() const { return load_be32(p_); }
  void fill_raw(uint32_t v) { std::memcpy(p_, &v, 4); }
  void fill_value(uint32_t v) { store_be32(p_, v); }

 private:
  uint8_t* p_;
};
using ImmDt = Raw32;
using Ieth = Raw32;

// XRCETH: reserved byte, then the 24-bit XRC SRQ number.
class Xrceth {
 public:
  explicit Xrceth(uint8_t* p) : p_(p) {}
  uint32_t srq_num() const { return load_be24(p_ + 1); }
  void fill(uint32_t srq_num) {
    p_[0] = 0;
    store_be24(p_ + 1, srq_num);
  }

 private:
  uint8_t* p_;
};

class Deth {
 public:
  explicit Deth(uint8_t* p) : p_(p) {}
  uint32_t qkey() const { return load_be32(p_); }
  uint32_t src_qp() const { return load_be24(p_ + 5); }
  void fill(uint32_t qkey, uint32_t src_qp) {
    store_be32(p_, qkey);
    p_[4] = 0;
    store_be24(p_ + 5, src_qp);
  }

 private:
  uint8_t* p_;
};

// Why a datagram is not a packet we accept.
enum class ParseError : uint8_t { kNone, kTooShort, kBadVersion, kUnknownOpcode, kBadLength, kBadPad };
const char* parse_error_name(ParseError e);

// A received packet: BTH at data[0], ICRC in the last 4 bytes.
struct PacketView {
  uint8_t* data = nullptr;
  uint32_t len = 0;  // BTH .. ICRC inclusive
  const OpcodeInfo* info = nullptr;
  uint32_t payload_len = 0;
  // A same-host jumbo packet (transport::RxDatagram::jumbo): an RC SEND or
  // WRITE packet whose payload stands for several path-MTU packets, one PSN
  // each (the responder's jumbo_span). Set by the receiver, never by parse.
  bool jumbo = false;

  Bth bth() const { return Bth(data); }
  uint8_t* hdr(Hdr h) const { return data + info->offset[unsigned(h)]; }
  Reth reth() const { return Reth(hdr(Hdr::kReth)); }
  Aeth aeth() const { return Aeth(hdr(Hdr::kAeth)); }
  AtomicEth atomic_eth() const { return AtomicEth(hdr(Hdr::kAtomicEth)); }
  AtomicAckEth atomic_ack_eth() const { return AtomicAckEth(hdr(Hdr::kAtomicAckEth)); }
  ImmDt imm() const { return ImmDt(hdr(Hdr::kImmDt)); }
  Ieth ieth() const { return Ieth(hdr(Hdr::kIeth)); }
  Deth deth() const { return Deth(hdr(Hdr::kDeth)); }
  Xrceth xrceth() const { return Xrceth(hdr(Hdr::kXrceth)); }
  uint8_t* payload() const { return data + info->header_len; }
  uint32_t icrc_wire() const { return load_le32(data + len - kIcrcSize); }

  static uint32_t load_le32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }

  // Validates lengths, TVer, opcode and pad; fills info and payload_len.
  [[nodiscard]] static ParseError parse(uint8_t* data, size_t len, PacketView& out);
};

}  // namespace uroce::wire
