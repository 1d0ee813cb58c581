// `uroce stats [PID]`: the live counters of running uroce processes
// (src/engine/live_counters.h has the file layout and its reader contract).
//
// Lists the counters files of this user in the folder (/dev/shm, or
// UROCE_STATS_DIR), one per open device of a process, skips those of
// processes that are gone (and removes them), and prints each device's port
// counters, then one line per QP. Counters are read one by one while the
// process runs: a snapshot is not consistent across counters.

#include <dirent.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/live_counters.h"
#include "stats_command.h"

namespace {

using uroce::engine::LiveCounters;
using uroce::engine::PortCounters;
using uroce::engine::QpCounters;
using Layout = LiveCounters::Layout;

struct Named {
  const char* name;
  const std::atomic<uint64_t>& value;
};

uint64_t get(const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); }

void print_list(const char* indent, std::initializer_list<Named> list) {
  std::printf("%s", indent);
  size_t column = std::strlen(indent);
  for (const Named& n : list) {
    char item[96];
    int len = std::snprintf(item, sizeof item, "%s %llu", n.name, (unsigned long long)get(n.value));
    if (column > std::strlen(indent) && column + size_t(len) + 2 > 100) {
      std::printf("\n%s", indent);
      column = std::strlen(indent);
    } else if (column > std::strlen(indent)) {
      std::printf(", ");
      column += 2;
    }
    std::printf("%s", item);
    column += size_t(len);
  }
  std::printf("\n");
}

void print_port(const PortCounters& p) {
  // rdma-core hw_counters names where one exists (rxe / mlx5), else uroce's.
  print_list("  ", {{"sent_pkts", p.tx_packets},
                    {"sent_bytes", p.tx_bytes},
                    {"rcvd_pkts", p.rx_packets},
                    {"rcvd_bytes", p.rx_bytes},
                    {"retransmits", p.tx_retransmits},
                    {"local_ack_timeout_err", p.timeouts},
                    {"duplicate_request", p.rx_duplicates},
                    {"out_of_seq_request", p.rx_out_of_sequence},
                    {"naks_sent", p.tx_naks},
                    {"rcvd_seq_err", p.rx_seq_naks},
                    {"send_rnr_err", p.rnr_naks_sent},
                    {"rcvd_rnr_err", p.rx_rnr_naks},
                    {"placed_ops", p.placed_ops},
                    {"placed_bytes", p.placed_bytes},
                    {"same_host_out", p.same_host_out},
                    {"same_host_in", p.same_host_in},
                    {"mail_out", p.mail_out},
                    {"mail_in", p.mail_in},
                    {"relayed_out", p.tx_host_relayed},
                    {"relayed_in", p.rx_host_relayed},
                    {"xrc_relayed", p.tx_xrc_relayed},
                    {"cm_mads_in", p.rx_gsi},
                    {"cm_mads_out", p.tx_gsi},
                    {"ecn_ce", p.rx_ecn_ce},
                    {"cnps_out", p.tx_cnps},
                    {"cnps_in", p.rx_cnps}});
  std::printf("  dropped:\n");
  print_list("    ", {{"malformed", p.rx_malformed},
                      {"icrc_errors", p.rx_bad_icrc},
                      {"no_qp", p.rx_no_qp},
                      {"wrong_service", p.rx_wrong_service},
                      {"bad_state", p.rx_dropped_state},
                      {"bad_path", p.rx_bad_path},
                      {"qkey_violations", p.rx_qkey_violations},
                      {"no_recv_wqe", p.rx_no_recv_wqe},
                      {"ghost_responses", p.rx_ghost},
                      {"same_host_full", p.same_host_full_drops},
                      {"qp1_dropped", p.rx_gsi_dropped}});
}

const char* qp_type_name(uint32_t t) {
  switch (t) {
    case IBV_QPT_RC:
      return "RC";
    case IBV_QPT_UC:
      return "UC";
    case IBV_QPT_UD:
      return "UD";
    case IBV_QPT_XRC_SEND:
      return "XRC_INI";
    case IBV_QPT_XRC_RECV:
      return "XRC_TGT";
    default:
      return "?";
  }
}

const char* qp_state_name(uint32_t s) {
  static const char* const kNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return s < std::size(kNames) ? kNames[s] : "?";
}

void print_qp(const QpCounters& q, uint32_t qpn) {
  std::printf("  qp 0x%06x %s %s", qpn, qp_type_name(q.type.load(std::memory_order_relaxed)),
              qp_state_name(q.state.load(std::memory_order_relaxed)));
  if (uint32_t d = q.dest_qpn.load(std::memory_order_relaxed)) std::printf(" -> 0x%06x", d);
  std::printf(":\n");
  print_list("    ", {{"sent_pkts", q.sent_pkts},
                      {"sent_bytes", q.sent_bytes},
                      {"rcvd_pkts", q.rcvd_pkts},
                      {"rcvd_bytes", q.rcvd_bytes},
                      {"retransmits", q.retransmits},
                      {"local_ack_timeout_err", q.local_ack_timeout_err},
                      {"duplicate_request", q.duplicate_request},
                      {"out_of_seq_request", q.out_of_seq_request},
                      {"seq_naks_sent", q.seq_naks_sent},
                      {"rcvd_seq_err", q.rcvd_seq_err},
                      {"send_rnr_err", q.send_rnr_err},
                      {"rcvd_rnr_err", q.rcvd_rnr_err},
                      {"placed_ops", q.placed_ops},
                      {"placed_bytes", q.placed_bytes}});
}

bool process_alive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

// Maps the counters file `path` read-only: null (with a reason) unless it is
// a regular file of ours with this build's layout.
const Layout* map_counters(const std::string& path, const char** why) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    *why = std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  void* map = MAP_FAILED;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid())
    *why = "not a regular file of this user";
  else if (size_t(st.st_size) != sizeof(Layout))
    *why = "not a counters file of this build (size)";
  else
    map = mmap(nullptr, sizeof(Layout), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    if (!*why) *why = std::strerror(errno);
    return nullptr;
  }
  const auto* l = static_cast<const Layout*>(map);
  if (l->header.magic.load(std::memory_order_acquire) != LiveCounters::kMagic ||
      l->header.version != LiveCounters::kVersion) {
    *why = "not a counters file of this build (magic/version)";
    munmap(map, sizeof(Layout));
    return nullptr;
  }
  return l;
}

// (pid, path) of the counters files in the folder, by pid then name.
std::vector<std::pair<pid_t, std::string>> list_files() {
  std::vector<std::pair<pid_t, std::string>> out;
  std::string dir = LiveCounters::folder(), prefix = LiveCounters::prefix();
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    pid_t pid = pid_t(std::strtol(name.c_str() + prefix.size(), nullptr, 10));
    if (pid > 0) out.emplace_back(pid, dir + "/" + name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int cmd_stats(std::span<char*> args) {
  pid_t only = 0;
  if (!args.empty()) {
    char* end = nullptr;
    long v = std::strtol(args[0], &end, 10);
    if (args.size() > 1 || !end || *end || v <= 0) {
      std::fprintf(stderr, "usage: uroce stats [PID]\n");
      return 2;
    }
    only = pid_t(v);
  }
  unsigned shown = 0;
  for (const auto& [pid, path] : list_files()) {
    if (only && pid != only) continue;
    if (!process_alive(pid)) {
      unlink(path.c_str());  // left by a process that was killed
      continue;
    }
    const char* why = nullptr;
    const Layout* l = map_counters(path, &why);
    if (!l) {
      std::fprintf(stderr, "uroce stats: %s: %s\n", path.c_str(), why);
      continue;
    }
    const LiveCounters::Header& h = l->header;
    std::printf("%.*s pid %u port 1 lid %u slot %u tx_path %.*s rx_path %.*s\n", int(sizeof h.device), h.device, h.pid,
                h.lid, h.slot, int(sizeof h.tx_path), h.tx_path, int(sizeof h.rx_path), h.rx_path);
    print_port(l->port);
    for (const QpCounters& q : l->qps)
      if (uint32_t qpn = q.qpn.load(std::memory_order_acquire)) print_qp(q, qpn);
    if (uint64_t n = h.qps_not_listed.load(std::memory_order_relaxed))
      std::printf("  (%llu QPs beyond the first %u not listed)\n", (unsigned long long)n, h.max_qps);
    munmap(const_cast<Layout*>(l), sizeof(Layout));
    ++shown;
  }
  if (shown == 0) {
    if (only)
      std::fprintf(stderr, "uroce stats: no uroce device open in process %d (or UROCE_LIVE_STATS=0 there)\n", only);
    else
      std::fprintf(stderr, "uroce stats: no process of this user has a uroce device open\n");
    return 1;
  }
  return 0;
}
