// Same-host ACKs as words (docs/architecture.md, "ACKs on the board"): a
// responder whose peer requester is reached through shared memory does not
// send it an ACKNOWLEDGE packet but stores the ACK, as one 64-bit word, in the
// cell of the requester's QP on the requester's segment board
// (ShmTransport::post_board; the cell is the requester's QPN's low 16 bits,
// unique within its engine: host_registry.h). The requester's receive turn
// reads the cells of its RC QPs when the board moved and hands a word that
// changed to the completer as the ACK it stands for (completer_receive_board).
// What the ACK packet would cost both sides — building it, a ring record
// published and taken, parsed and dispatched — becomes a store and a load, in
// the time between a receive and its completion (ACK before completion).
//
// Only plain ACKs (syndrome ACK, no credit) go on the board; NAKs, RNR NAKs
// and atomic ACKs stay packets, in order with READ responses. A word is the
// responder's latest ACK: PSN and MSN only grow (a duplicate is answered
// with ePSN - 1), so a word read late loses nothing that a later one does not
// say. The word carries 15 bits of the responder's QPN: a word left by an
// earlier user of the cell is told apart (and anything it might still say is
// also checked as any ACK: a PSN never sent is a ghost).
#pragma once

#include <cstdint>
#include <optional>

#include "wire/psn.h"

namespace uroce::engine {

struct BoardAck {
  uint32_t psn = 0;  // the last PSN acknowledged
  uint32_t msn = 0;
};

inline constexpr uint64_t kBoardWritten = uint64_t(1) << 63;

// The board cell of a requester QP.
constexpr uint32_t board_cell(uint32_t requester_qpn) { return requester_qpn & 0xFFFF; }

constexpr uint64_t board_word(const BoardAck& a, uint32_t responder_qpn) {
  return kBoardWritten | uint64_t(responder_qpn & 0x7FFF) << 48 | uint64_t(a.msn & wire::kPsnMask) << 24 |
         (a.psn & wire::kPsnMask);
}

// The ACK in `word` if a responder of QPN `responder_qpn` wrote it.
constexpr std::optional<BoardAck> board_ack(uint64_t word, uint32_t responder_qpn) {
  if (!(word & kBoardWritten) || ((word >> 48) & 0x7FFF) != (responder_qpn & 0x7FFF)) return std::nullopt;
  return BoardAck{uint32_t(word & wire::kPsnMask), uint32_t((word >> 24) & wire::kPsnMask)};
}

}  // namespace uroce::engine
