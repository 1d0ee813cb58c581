// The opcode table against roce-facts.md §1.2, written out independently here:
// which opcodes exist per service, which extended headers follow the BTH and at
// which offsets, payload, start/end, RWQE/RCQE.
#include "wire/opcode.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "wire/headers.h"

namespace uroce::wire {
namespace {

// One row of the facts-sheet table (RC numbering).
struct Row {
  uint8_t op;  // low 5 bits
  const char* name;
  bool uc;                   // has a UC opcode
  std::vector<Hdr> headers;  // in wire order (RC/UC)
  bool payload;
  bool start, end;
  bool rwqe, rcqe;
};

const std::vector<Row>& rows() {
  static const std::vector<Row> r = {
      {0x00, "SEND_FIRST", true, {}, true, true, false, true, false},
      {0x01, "SEND_MIDDLE", true, {}, true, false, false, false, false},
      {0x02, "SEND_LAST", true, {}, true, false, true, false, true},
      {0x03, "SEND_LAST_WITH_IMMEDIATE", true, {Hdr::kImmDt}, true, false, true, false, true},
      {0x04, "SEND_ONLY", true, {}, true, true, true, true, true},
      {0x05, "SEND_ONLY_WITH_IMMEDIATE", true, {Hdr::kImmDt}, true, true, true, true, true},
      {0x06, "RDMA_WRITE_FIRST", true, {Hdr::kReth}, true, true, false, false, false},
      {0x07, "RDMA_WRITE_MIDDLE", true, {}, true, false, false, false, false},
      {0x08, "RDMA_WRITE_LAST", true, {}, true, false, true, false, false},
      {0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", true, {Hdr::kImmDt}, true, false, true, true, true},
      {0x0A, "RDMA_WRITE_ONLY", true, {Hdr::kReth}, true, true, true, false, false},
      {0x0B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", true, {Hdr::kReth, Hdr::kImmDt}, true, true, true, true, true},
      {0x0C, "RDMA_READ_REQUEST", false, {Hdr::kReth}, false, true, true, false, false},
      {0x0D, "RDMA_READ_RESPONSE_FIRST", false, {Hdr::kAeth}, true, true, false, false, false},
      {0x0E, "RDMA_READ_RESPONSE_MIDDLE", false, {}, true, false, false, false, false},
      {0x0F, "RDMA_READ_RESPONSE_LAST", false, {Hdr::kAeth}, true, false, true, false, false},
      {0x10, "RDMA_READ_RESPONSE_ONLY", false, {Hdr::kAeth}, true, true, true, false, false},
      {0x11, "ACKNOWLEDGE", false, {Hdr::kAeth}, false, true, true, false, false},
      {0x12, "ATOMIC_ACKNOWLEDGE", false, {Hdr::kAeth, Hdr::kAtomicAckEth}, false, true, true, false, false},
      {0x13, "COMPARE_SWAP", false, {Hdr::kAtomicEth}, false, true, true, false, false},
      {0x14, "FETCH_ADD", false, {Hdr::kAtomicEth}, false, true, true, false, false},
      {0x16, "SEND_LAST_WITH_INVALIDATE", false, {Hdr::kIeth}, true, false, true, false, true},
      {0x17, "SEND_ONLY_WITH_INVALIDATE", false, {Hdr::kIeth}, true, true, true, true, true},
  };
  return r;
}

// Header sizes from §2.1.
unsigned size_of(Hdr h) {
  switch (h) {
    case Hdr::kRdeth:
      return 4;
    case Hdr::kDeth:
      return 8;
    case Hdr::kXrceth:
      return 4;
    case Hdr::kReth:
      return 16;
    case Hdr::kAtomicEth:
      return 28;
    case Hdr::kAeth:
      return 4;
    case Hdr::kAtomicAckEth:
      return 8;
    case Hdr::kImmDt:
      return 4;
    case Hdr::kIeth:
      return 4;
    default:
      return 0;
  }
}

const char* hdr_name(Hdr h) {
  static const char* const n[] = {"RDETH", "DETH",         "XRCETH", "RETH", "AtomicETH",
                                  "AETH",  "AtomicAckETH", "ImmDt",  "IETH"};
  return n[unsigned(h)];
}

void expect_opcode(uint8_t opcode, const Row& row, const std::vector<Hdr>& headers) {
  SCOPED_TRACE(testing::Message() << "opcode 0x" << std::hex << unsigned(opcode) << " " << row.name);
  const OpcodeInfo& info = opcode_info(opcode);
  ASSERT_TRUE(info.valid());
  EXPECT_STREQ(info.name, row.name);
  // Presence and offsets: each header right after the previous one.
  unsigned off = kBthSize;
  std::set<Hdr> present(headers.begin(), headers.end());
  for (Hdr h : headers) {
    EXPECT_TRUE(info.has(h)) << hdr_name(h);
    EXPECT_EQ(info.offset[unsigned(h)], off) << hdr_name(h);
    off += size_of(h);
  }
  for (unsigned i = 0; i < kHdrCount; ++i) {
    Hdr h = Hdr(i);
    if (present.count(h)) continue;
    EXPECT_FALSE(info.has(h)) << hdr_name(h);
    EXPECT_EQ(info.offset[i], 0) << hdr_name(h);
  }
  EXPECT_EQ(info.header_len, off);
  EXPECT_EQ(bool(info.flags & kOpPayload), row.payload);
  EXPECT_EQ(bool(info.flags & kOpStart), row.start);
  EXPECT_EQ(bool(info.flags & kOpEnd), row.end);
  EXPECT_EQ(bool(info.flags & kOpRwqe), row.rwqe);
  EXPECT_EQ(bool(info.flags & kOpRcqe), row.rcqe);
  EXPECT_EQ(bool(info.flags & kOpImm), present.count(Hdr::kImmDt) == 1);
  EXPECT_EQ(bool(info.flags & kOpInv), present.count(Hdr::kIeth) == 1);
  // Responses (0x0D–0x12) go to the completer, everything else to the
  // responder.
  bool response = row.op >= 0x0D && row.op <= 0x12;
  EXPECT_EQ(bool(info.flags & kOpResponse), response);
  EXPECT_EQ(bool(info.flags & kOpRequest), !response);
}

// Expect every RC opcode of §1.2 with its headers, offsets and flags.
TEST(OpcodeTable, RcOpcodes) {
  for (const Row& r : rows()) expect_opcode(uint8_t(0x00 | r.op), r, r.headers);
}

// Expect UC to have exactly the SEND and RDMA WRITE families (0x20–0x2B), same
// layout.
TEST(OpcodeTable, UcOpcodes) {
  for (const Row& r : rows()) {
    uint8_t opcode = uint8_t(0x20 | r.op);
    if (r.uc)
      expect_opcode(opcode, r, r.headers);
    else
      EXPECT_FALSE(opcode_info(opcode).valid()) << "UC has no " << r.name;
  }
  EXPECT_FALSE(opcode_info(0x2C).valid()) << "UC has no READ";
  EXPECT_FALSE(opcode_info(0x33).valid()) << "UC has no atomics";
  EXPECT_FALSE(opcode_info(0x34).valid()) << "UC has no atomics";
  EXPECT_FALSE(opcode_info(0x31).valid()) << "UC has no ACKNOWLEDGE";
}

// Expect UD to have only SEND_ONLY (DETH at 12) and SEND_ONLY_WITH_IMMEDIATE
// (DETH at 12, ImmDt at 20).
TEST(OpcodeTable, UdOpcodes) {
  for (unsigned op = 0x60; op <= 0x7F; ++op) {
    if (op == 0x64 || op == 0x65) continue;
    EXPECT_FALSE(opcode_info(uint8_t(op)).valid()) << std::hex << op;
  }
  expect_opcode(0x64, rows()[4], {Hdr::kDeth});
  expect_opcode(0x65, rows()[5], {Hdr::kDeth, Hdr::kImmDt});
  EXPECT_EQ(opcode_info(0x64).offset[unsigned(Hdr::kDeth)], 12);
  EXPECT_EQ(opcode_info(0x64).header_len, 20);
  EXPECT_EQ(opcode_info(0x65).offset[unsigned(Hdr::kImmDt)], 20);
  EXPECT_EQ(opcode_info(0x65).header_len, 24);
}

// Spot checks named in the brief, as literal numbers.
TEST(OpcodeTable, SpotChecks) {
  EXPECT_EQ(opcode_info(0x0B).offset[unsigned(Hdr::kReth)], 12);
  EXPECT_EQ(opcode_info(0x0B).offset[unsigned(Hdr::kImmDt)], 28);
  EXPECT_EQ(opcode_info(0x0B).header_len, 32);
  EXPECT_EQ(opcode_info(0x12).offset[unsigned(Hdr::kAeth)], 12);
  EXPECT_EQ(opcode_info(0x12).offset[unsigned(Hdr::kAtomicAckEth)], 16);
  EXPECT_EQ(opcode_info(0x12).header_len, 24);
  EXPECT_EQ(opcode_info(0x13).header_len, 12 + 28);
  EXPECT_EQ(opcode_info(0x0C).header_len, 28);
  EXPECT_EQ(opcode_info(0x11).header_len, 16);
  EXPECT_EQ(opcode_info(0x0E).header_len, 12);  // READ_RESPONSE_MIDDLE: no AETH
  EXPECT_FALSE(opcode_info(0x15).valid());
  EXPECT_FALSE(opcode_info(0x35).valid());
  EXPECT_STREQ(opcode_name(0x15), "UNKNOWN");
  EXPECT_STREQ(opcode_name(0x04), "SEND_ONLY");
}

// Expect CNP 0x81 to be accepted: BTH + 16 reserved bytes, no payload.
TEST(OpcodeTable, Cnp) {
  const OpcodeInfo& info = opcode_info(kOpCnp);
  ASSERT_TRUE(info.valid());
  EXPECT_EQ(kOpCnp, 0x81);
  EXPECT_EQ(info.header_len, 12 + 16);
  EXPECT_FALSE(info.flags & kOpPayload);
  EXPECT_STREQ(service_name(0x81), "CNP");
}

// Expect reserved RC opcodes to be invalid, and the valid set to be exactly the
// table (RC 23 + UC 12 + UD 2 + CNP).
TEST(OpcodeTable, NothingElseIsValid) {
  for (unsigned op = 0x15; op <= 0x1F; ++op) {
    if (op == 0x16 || op == 0x17) continue;
    if (op == 0x1C || op == 0x1D) continue;  // FLUSH / ATOMIC_WRITE: out of scope, not asserted
    EXPECT_FALSE(opcode_info(uint8_t(op)).valid()) << std::hex << op;
  }
  unsigned valid = 0;
  for (unsigned op = 0; op < 256; ++op) {
    if (op >= 0x40 && op < 0x60) continue;  // RD: not needed, not asserted
    if (op == 0x1C || op == 0x1D) continue;
    valid += opcode_info(uint8_t(op)).valid();
  }
  EXPECT_EQ(valid, 23u + 12u + 2u + 1u + 23u);  // RC, UC, UD, CNP, XRC
}

// Expect XRC requests to carry XRCETH right after the BTH (before RETH), and XRC
// responses none (rxe's XRC opcode table).
TEST(OpcodeTable, XrcOpcodes) {
  const OpcodeInfo& send = opcode_info(0xA4);
  ASSERT_TRUE(send.valid());
  EXPECT_EQ(send.offset[unsigned(Hdr::kXrceth)], 12);
  EXPECT_EQ(send.header_len, 16);
  const OpcodeInfo& write = opcode_info(0xA6);
  EXPECT_EQ(write.offset[unsigned(Hdr::kXrceth)], 12);
  EXPECT_EQ(write.offset[unsigned(Hdr::kReth)], 16);
  EXPECT_EQ(write.header_len, 32);
  const OpcodeInfo& ack = opcode_info(0xB1);
  EXPECT_FALSE(ack.has(Hdr::kXrceth));
  EXPECT_EQ(ack.offset[unsigned(Hdr::kAeth)], 12);
  EXPECT_EQ(ack.header_len, 16);
  EXPECT_STREQ(service_name(0xA4), "XRC");
}

// Expect the service/operation split of the opcode byte (§1.1 byte 0).
TEST(OpcodeTable, ServiceAndOperation) {
  EXPECT_EQ(service_of(0x24), Service::kUc);
  EXPECT_EQ(service_of(0x64), Service::kUd);
  EXPECT_EQ(service_of(0x0A), Service::kRc);
  EXPECT_EQ(operation_of(0x2A), Operation::kWriteOnly);
  EXPECT_EQ(make_opcode(Service::kUd, Operation::kSendOnlyImm), 0x65);
  EXPECT_STREQ(service_name(0x24), "UC");
  EXPECT_STREQ(service_name(0x0C), "RC");
  EXPECT_STREQ(service_name(0x65), "UD");
}

}  // namespace
}  // namespace uroce::wire
