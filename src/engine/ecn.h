// RoCEv2 congestion notification (annex A17.9), as a NIC's congestion control
// uses it: a queue on the path that would drop a packet marks its IP ECN field
// Congestion Experienced instead (everything uroce sends is ECN-capable,
// UdpConfig::ecn). The receiver of a marked packet, the notification point,
// answers with a CNP to the QP that sent it; that QP, the reaction point,
// slows down: its congestion window halves, once per window, as on a loss
// (completer_receive_cnp), with nothing resent.
#pragma once

#include <chrono>
#include <cstdint>

#include "engine/engine_qp.h"
#include "engine/tx_batch.h"

namespace uroce::engine {

// At most one CNP per QP in this long (DCQCN's default at the notification
// point: a burst of marked packets is one notice, not one per packet).
inline constexpr Clock::duration kCnpInterval = std::chrono::microseconds(50);

// Builds a CNP to QP `dest_qp` over `path` into `tx`: BTH opcode 0x81 with
// BECN set, the default P_Key, PSN 0, then 16 zero bytes (roce-facts.md §1.1,
// as ConnectX hardware sends it). Returns its length (0 if dropped).
uint32_t build_cnp(TxBatch& tx, const Path& path, uint32_t dest_qp);

// A packet of connected QP `qp` (caller holds qp.mu) arrived marked Congestion
// Experienced at `now`: counted in `stats`, and answered with a CNP to the
// peer QP unless one went less than kCnpInterval ago.
void answer_congestion_mark(EngineQp& qp, TxBatch& tx, Clock::time_point now, PortCounters& stats);

}  // namespace uroce::engine
