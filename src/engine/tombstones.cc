#include "engine/tombstones.h"

#include <algorithm>

#include "engine/ack.h"
#include "engine/tx_batch.h"
#include "wire/psn.h"

namespace uroce::engine {

namespace {
// Whether the QP's path has lost, duplicated or reordered packets: it resent,
// timed out, or received a duplicate or out-of-sequence request.
bool lossy_path(const EngineQp& qp) {
  const QpCounters& c = *qp.counters;
  auto seen = [](const std::atomic<uint64_t>& n) { return n.load(std::memory_order_relaxed) != 0; };
  return seen(c.retransmits) || seen(c.local_ack_timeout_err) || seen(c.duplicate_request) ||
         seen(c.out_of_seq_request) || seen(c.rcvd_seq_err);
}
}  // namespace

void Tombstones::add(const EngineQp& qp) {
  if (qp.type != IBV_QPT_RC || (qp.state() != IBV_QPS_RTR && qp.state() != IBV_QPS_RTS && qp.state() != IBV_QPS_SQD))
    return;
  std::lock_guard lock(mu_);
  if (by_qpn_.size() >= kMax) {
    auto oldest = by_qpn_.begin();
    for (auto it = by_qpn_.begin(); it != by_qpn_.end(); ++it)
      if (it->second.created < oldest->second.created) oldest = it;
    by_qpn_.erase(oldest);
  }
  auto now = Clock::now();
  // Were this QP's last ACK lost, the peer resends after a tail-loss probe or its local
  // ACK timer, which backs off to four times the timeout (the peer's timeout is taken to
  // be this QP's; rxe resends only then). On a lossy path a uroce peer's probes have
  // often backed off to the timer too: wait that long from the start. On a clean path,
  // where the last ACK is rarely lost, kQuiet keeps a process's exit short. (Timeout 0,
  // no timer: local_ack_timeout() is 4 us, and the gap kQuiet.)
  Clock::duration gap = std::clamp<Clock::duration>(4 * qp.local_ack_timeout(), kQuiet, kLingerMax);
  Clock::duration quiet = lossy_path(qp) ? gap : Clock::duration(kQuiet);
  by_qpn_[qp.qp_num()] =
      Tombstone{qp.qp_num(), qp.attr.dest_qp_num, qp.resp.epsn, qp.resp.msn, qp.path, now, now, quiet, gap};
  any_.store(true, std::memory_order_relaxed);
}

size_t Tombstones::count() {
  std::lock_guard lock(mu_);
  return by_qpn_.size();
}

void Tombstones::prune(Clock::time_point now) {
  std::lock_guard lock(mu_);
  std::erase_if(by_qpn_, [now](const auto& e) {
    return now - e.second.last_heard >= kIdle || now - e.second.created >= kMaxAge;
  });
  any_.store(!by_qpn_.empty(), std::memory_order_relaxed);
}

bool Tombstones::answer(const transport::RxDatagram& d, const wire::PacketView& pkt, TxBatch& tx, Stats& stats) {
  std::lock_guard lock(mu_);
  auto it = by_qpn_.find(pkt.bth().dest_qp());
  if (it == by_qpn_.end()) return false;
  Tombstone& t = it->second;
  // Only the connected peer is heard (as by the live QP).
  if (d.src.ip != t.path.dst.ip || d.dst_ip != t.path.src_ip) {
    stats.rx_bad_path.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  t.last_heard = Clock::now();
  t.quiet = t.resend_gap;  // the peer resends: its next resend may be a local ACK timeout away
  // Only duplicates of what this QP already received are acknowledged.
  if ((pkt.info->flags & wire::kOpRequest) && !(pkt.info->flags & (wire::kOpRead | wire::kOpAtomic)) &&
      wire::psn_diff(pkt.bth().psn(), t.epsn) < 0) {
    // As the live QP answers a duplicate: PSN ePSN - 1 (roce-facts.md §4.2).
    build_ack(tx, t.path, wire::Service::kRc, t.dest_qp_num, wire::psn_add(t.epsn, wire::kPsnMask), wire::kAckNoCredit,
              t.msn, TxBatch::Icrc::kCompute);
  }
  return true;
}

bool Tombstones::quiet(Clock::time_point now) {
  std::lock_guard lock(mu_);
  return std::all_of(by_qpn_.begin(), by_qpn_.end(),
                     [now](const auto& e) { return now - e.second.last_heard >= e.second.quiet; });
}

}  // namespace uroce::engine
