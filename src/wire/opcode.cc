#include "wire/opcode.h"

namespace uroce::wire {

static_assert(opcode_info(0x04).header_len == kBthSize, "RC SEND_ONLY has only the BTH");
static_assert(opcode_info(0x64).offset[unsigned(Hdr::kDeth)] == 12, "UD SEND_ONLY: DETH right after BTH");
static_assert(opcode_info(0x65).offset[unsigned(Hdr::kImmDt)] == 20, "UD SEND_ONLY_IMM: ImmDt after DETH");
static_assert(opcode_info(0x0B).header_len == 12 + 16 + 4, "WRITE_ONLY_IMM: BTH RETH ImmDt");
static_assert(opcode_info(0x12).offset[unsigned(Hdr::kAtomicAckEth)] == 16, "ATOMIC_ACK: AETH then AtomicAckETH");
static_assert(!opcode_info(0x2C).valid(), "UC has no READ");
static_assert(!opcode_info(0x15).valid(), "0x15 is reserved");

const char* opcode_name(uint8_t opcode) {
  const OpcodeInfo& info = opcode_info(opcode);
  return info.valid() ? info.name : "UNKNOWN";
}

const char* service_name(uint8_t opcode) {
  switch (service_of(opcode)) {
    case Service::kRc:
      return "RC";
    case Service::kUc:
      return "UC";
    case Service::kRd:
      return "RD";
    case Service::kUd:
      return "UD";
    case Service::kCnp:
      return "CNP";
    case Service::kXrc:
      return "XRC";
  }
  return "?";
}

}  // namespace uroce::wire

#include "wire/headers.h"

namespace uroce::wire {

const char* parse_error_name(ParseError e) {
  switch (e) {
    case ParseError::kNone:
      return "none";
    case ParseError::kTooShort:
      return "too short";
    case ParseError::kBadVersion:
      return "bad transport version";
    case ParseError::kUnknownOpcode:
      return "unknown opcode";
    case ParseError::kBadLength:
      return "payload on an opcode without payload";
    case ParseError::kBadPad:
      return "pad exceeds payload";
  }
  return "?";
}

ParseError PacketView::parse(uint8_t* data, size_t len, PacketView& out) {
  if (len < kBthSize + kIcrcSize) return ParseError::kTooShort;
  Bth bth(data);
  if (bth.tver() != 0) return ParseError::kBadVersion;
  const OpcodeInfo& info = opcode_info(bth.opcode());
  if (!info.valid()) return ParseError::kUnknownOpcode;
  if (len < size_t(info.header_len) + kIcrcSize) return ParseError::kTooShort;
  size_t body = len - info.header_len - kIcrcSize;
  if (!(info.flags & kOpPayload) && body != 0 && bth.opcode() != kOpCnp) return ParseError::kBadLength;
  if (bth.pad() > body) return ParseError::kBadPad;
  out.data = data;
  out.len = uint32_t(len);
  out.info = &info;
  out.payload_len = uint32_t(body - bth.pad());
  return ParseError::kNone;
}

}  // namespace uroce::wire
