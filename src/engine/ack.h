// The acknowledgement packets (roce-facts.md §1.2, §2.1-§2.3): ACKNOWLEDGE,
// a BTH and an AETH, and ATOMIC_ACKNOWLEDGE, which adds an AtomicAckETH; each
// ends with its ICRC (or its zeroed room, sent bare through shared memory).
// One builder for everything that sends them: the responder's ACKs, NAKs and
// atomic ACKs, and a destroyed QP's tombstone. Inline, allocation-free,
// written in place in the batch: every ACK of a bulk transfer comes through
// here, and where `atomic_orig` is known to be absent the compiler drops the
// AtomicAckETH branch.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/engine_qp.h"
#include "engine/tx_batch.h"
#include "wire/headers.h"

namespace uroce::engine {

// The ACKNOWLEDGE packet's length on the wire after the UDP header: BTH,
// AETH, ICRC (the same in every service).
constexpr uint32_t kAckPacketBytes =
    wire::opcode_info(wire::make_opcode(wire::Service::kRc, wire::Operation::kAcknowledge)).header_len +
    wire::kIcrcSize;

// Builds one ACK/NAK of `service` into `tx` and ends it: to QP `dest_qp` over
// `path`, an ACKNOWLEDGE, or with `atomic_orig` (the value an atomic found) an
// ATOMIC_ACKNOWLEDGE carrying it; BTH PSN `psn` with no SE, pad or AckReq and
// the default P_Key; AETH `syndrome` and `msn`; with or without its ICRC
// (Delivery::icrc). Returns the packet's length (TxBatch::end_packet: 0 if
// dropped).
inline uint32_t build_ack(TxBatch& tx, const Path& path, wire::Service service, uint32_t dest_qp, uint32_t psn,
                          uint8_t syndrome, uint32_t msn, TxBatch::Icrc icrc,
                          std::optional<uint64_t> atomic_orig = std::nullopt) {
  uint8_t opcode =
      wire::make_opcode(service, atomic_orig ? wire::Operation::kAtomicAcknowledge : wire::Operation::kAcknowledge);
  const wire::OpcodeInfo& info = wire::opcode_info(opcode);
  uint8_t* h = tx.begin_packet(path.dst, path.src_ip, info.header_len, icrc, 0);
  wire::Bth(h).fill(opcode, false, 0, wire::kDefaultPkey, dest_qp, false, psn);
  wire::Aeth(h + info.offset[unsigned(wire::Hdr::kAeth)]).fill(syndrome, msn);
  if (atomic_orig) wire::AtomicAckEth(h + info.offset[unsigned(wire::Hdr::kAtomicAckEth)]).fill(*atomic_orig);
  return tx.end_packet(path.flow, icrc);
}

}  // namespace uroce::engine
