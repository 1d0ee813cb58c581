// Live counters: an engine's port counters and per-QP counters,
// readable by another process while the program runs (`uroce stats [PID]`).
//
// Each engine keeps its counters in one file mapped shared,
// /dev/shm/uroce-stats-<uid>-<pid>-<lid> (mode 0600: only the user who could
// ptrace the process reads them), removed when the device closes. The data
// path increments them in place with relaxed atomic adds — the same cost as
// the process-private counters they replace — so publishing costs no thread,
// no timer and no system call. When the file cannot be made (no /dev/shm,
// UROCE_LIVE_STATS=0) the same layout lives in private memory and only
// UROCE_STATS=1 shows it.
//
// Contract with readers (tools/uroce.cc, stats_reader): the header is
// written before `magic` is stored (release); counters are relaxed atomics,
// each read on its own (a snapshot is not consistent across counters). A
// QP entry is free when its qpn is 0; the owner sets type and state, then
// qpn (release), and clears qpn when the QP is destroyed, then zeroes the rest
// on reuse. At most kMaxQps QPs are listed; later ones count only in the port
// counters and in `qps_not_listed`.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

namespace uroce::engine {

// Names follow rdma-core's hw_counters where one exists (rxe: sent_pkts,
// rcvd_pkts, duplicate_request, out_of_seq_request, rcvd_seq_err,
// rcvd_rnr_err, send_rnr_err; mlx5: local_ack_timeout_err).
struct QpCounters {
  std::atomic<uint32_t> qpn{0};  // 0: entry free
  std::atomic<uint32_t> type{0};
  std::atomic<uint32_t> state{0};
  std::atomic<uint32_t> dest_qpn{0};
  std::atomic<uint64_t> sent_pkts{0};
  std::atomic<uint64_t> sent_bytes{0};  // UDP payload: RoCE headers, data and ICRC
  std::atomic<uint64_t> rcvd_pkts{0};
  std::atomic<uint64_t> rcvd_bytes{0};
  std::atomic<uint64_t> retransmits{0};    // packets sent again (go-back-N, probes)
  std::atomic<uint64_t> seq_naks_sent{0};  // NAK sequence error sent (responder)
  std::atomic<uint64_t> rcvd_seq_err{0};   // NAK sequence error received (requester)
  std::atomic<uint64_t> send_rnr_err{0};   // RNR NAKs sent
  std::atomic<uint64_t> rcvd_rnr_err{0};   // RNR NAKs received
  std::atomic<uint64_t> duplicate_request{0};
  std::atomic<uint64_t> out_of_seq_request{0};
  std::atomic<uint64_t> local_ack_timeout_err{0};  // retransmit timer expiries
  std::atomic<uint64_t> placed_ops{0};             // RDMA WRITEs/READs placed directly (same host, no packets)
  std::atomic<uint64_t> placed_bytes{0};

  // Packets the QP sent or took (per packet, under the QP's mutex: one writer
  // at a time, so a plain load and store, no locked instruction — four of
  // those per packet cost 3-5 % of a stream's CPU. Only the shared entry of
  // QPs not listed may lose counts, which it does not show).
  void count_sent(uint32_t bytes) noexcept {
    add_owned(sent_pkts, 1);
    add_owned(sent_bytes, bytes);
  }
  void count_received(uint32_t bytes) noexcept {
    add_owned(rcvd_pkts, 1);
    add_owned(rcvd_bytes, bytes);
  }
  static void add_owned(std::atomic<uint64_t>& c, uint64_t n) noexcept {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  void add(std::atomic<uint64_t>& c) noexcept { c.fetch_add(1, std::memory_order_relaxed); }
};

// Port counters (the device has one port). Dropped packets by cause, then
// the totals of the QP counters (kept here too, so destroyed QPs still count).
struct PortCounters {
  std::atomic<uint64_t> rx_packets{0};
  std::atomic<uint64_t> rx_malformed{0};
  std::atomic<uint64_t> rx_bad_icrc{0};
  std::atomic<uint64_t> rx_no_qp{0};
  std::atomic<uint64_t> rx_wrong_service{0};
  std::atomic<uint64_t> rx_dropped_state{0};
  std::atomic<uint64_t> rx_duplicates{0};
  std::atomic<uint64_t> rx_out_of_sequence{0};
  std::atomic<uint64_t> tx_retransmits{0};
  std::atomic<uint64_t> tx_naks{0};
  std::atomic<uint64_t> rnr_naks_sent{0};
  std::atomic<uint64_t> rx_qkey_violations{0};  // UD packets dropped for a wrong Q_Key
  std::atomic<uint64_t> tx_xrc_relayed{0};      // XRC requests passed to the SRQ's owner
  std::atomic<uint64_t> rx_bad_path{0};         // RC/UC/XRC packets not from the connected path
  std::atomic<uint64_t> rx_ghost{0};            // responses for PSNs not outstanding
  std::atomic<uint64_t> rx_no_recv_wqe{0};      // UD/UC messages dropped: no receive WQE posted
  std::atomic<uint64_t> tx_host_relayed{0};     // packets for another engine's QP, passed on (host/host_relay.h)
  std::atomic<uint64_t> rx_host_relayed{0};     // packets another engine passed to us
  std::atomic<uint64_t> rx_gsi{0};              // CM MADs received on QP1 (gsi.h)
  std::atomic<uint64_t> rx_gsi_dropped{0};      // QP1 packets dropped: not a CM MAD, no owner, inbox full
  std::atomic<uint64_t> tx_gsi{0};              // MADs sent from QP1
  std::atomic<uint64_t> tx_packets{0};          // RoCE packets built by this engine's QPs
  std::atomic<uint64_t> tx_bytes{0};
  std::atomic<uint64_t> rx_bytes{0};  // of packets delivered to a QP
  std::atomic<uint64_t> rx_seq_naks{0};
  std::atomic<uint64_t> rx_rnr_naks{0};
  std::atomic<uint64_t> timeouts{0};
  std::atomic<uint64_t> same_host_out{0};  // datagrams through shared memory (the same-host path)
  std::atomic<uint64_t> same_host_in{0};
  std::atomic<uint64_t> same_host_full_drops{0};
  std::atomic<uint64_t> placed_ops{0};
  std::atomic<uint64_t> placed_bytes{0};
  std::atomic<uint64_t> rx_ecn_ce{0};  // packets a queue marked Congestion Experienced (ecn.h)
  std::atomic<uint64_t> tx_cnps{0};    // CNPs sent in answer
  std::atomic<uint64_t> rx_cnps{0};    // CNPs received
  std::atomic<uint64_t> mail_out{0};   // records written into same-host mailboxes (mailbox.h)
  std::atomic<uint64_t> mail_in{0};    // records taken from this engine's mailboxes
};
using Stats = PortCounters;

class LiveCounters {
 public:
  static constexpr uint32_t kMagic = 0x75726373;  // "urcs"
  static constexpr uint32_t kVersion = 3;
  static constexpr unsigned kMaxQps = 1024;

  struct Header {
    std::atomic<uint32_t> magic;
    uint32_t version;
    uint32_t pid;
    uint32_t lid;
    uint32_t slot;
    uint32_t max_qps;
    char device[32];
    char tx_path[16];
    char rx_path[16];
    std::atomic<uint64_t> qps_not_listed;
  };
  struct Layout {
    Header header;
    PortCounters port;
    QpCounters qps[kMaxQps];
  };

  // The file of this process's engine at `lid` (`shared`), or private
  // memory when it cannot be made: counting never stops a device opening.
  static std::unique_ptr<LiveCounters> open(const char* device, uint16_t lid, bool shared);
  // Private memory only (tests).
  static std::unique_ptr<LiveCounters> open_private();
  ~LiveCounters();  // unmaps, and removes the file
  LiveCounters(const LiveCounters&) = delete;
  LiveCounters& operator=(const LiveCounters&) = delete;

  // "/dev/shm" and "uroce-stats-<uid>-" (the reader lists the folder);
  // UROCE_STATS_DIR overrides the folder (tests). Inline: `uroce stats`
  // uses this header's layout and names without linking the engine.
  static std::string folder() {
    const char* dir = std::getenv("UROCE_STATS_DIR");
    return dir && *dir ? dir : "/dev/shm";
  }
  static std::string prefix() { return "uroce-stats-" + std::to_string(getuid()) + "-"; }
  const std::string& path() const { return path_; }  // empty: private memory

  PortCounters& port() { return layout_->port; }
  Header& header() { return layout_->header; }
  void set_paths(const char* tx_path, const char* rx_path);

  // An entry for a new QP (zeroed, listed), or the shared overflow entry
  // when all are taken (not listed; counted in qps_not_listed). Thread-safe.
  QpCounters* claim_qp(uint32_t qpn, uint32_t type);
  void release_qp(QpCounters* c);  // unlists it
  // Where QPs that are not registered with an engine count (never read).
  static QpCounters& unlisted();

 private:
  LiveCounters(Layout* layout, size_t bytes, std::string path, bool mapped);
  Layout* layout_;
  size_t bytes_;
  std::string path_;
  bool mapped_;
  QpCounters overflow_;
};

}  // namespace uroce::engine
