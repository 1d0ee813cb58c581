#include "engine/ecn.h"

#include "wire/headers.h"
#include "wire/opcode.h"

namespace uroce::engine {

uint32_t build_cnp(TxBatch& tx, const Path& path, uint32_t dest_qp) {
  const wire::OpcodeInfo& info = wire::opcode_info(wire::kOpCnp);
  uint8_t* h = tx.begin_packet(path.dst, path.src_ip, info.header_len);
  wire::Bth bth(h);
  bth.fill(wire::kOpCnp, false, 0, wire::kDefaultPkey, dest_qp, false, 0);
  bth.set_becn(true);  // the 16 reserved bytes stay as begin_packet zeroed them
  return tx.end_packet(path.flow);
}

void answer_congestion_mark(EngineQp& qp, TxBatch& tx, Clock::time_point now, PortCounters& stats) {
  stats.rx_ecn_ce.fetch_add(1, std::memory_order_relaxed);
  if (now - qp.cnp_sent_at < kCnpInterval) return;  // (the first: cnp_sent_at is the clock's epoch)
  uint32_t bytes = build_cnp(tx, qp.path, qp.attr.dest_qp_num);
  if (!bytes) return;
  qp.cnp_sent_at = now;
  qp.count_sent(bytes);
  stats.tx_cnps.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace uroce::engine
