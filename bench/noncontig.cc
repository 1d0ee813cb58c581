// noncontig — the non-contiguous transfer study: N buffers of S bytes
// moved by one WR with an N-entry SGL, by a CPU pack (+ unpack) around one WR, or by N WRs;
// for RDMA WRITE, RDMA READ and SEND/RECV. Written against the public verbs C ABI only:
// linked with libibverbs, run under `uroce run` (or on RDMA hardware as it is).
//
//   noncontig [OPTIONS]                 client and server as two processes on this host
//   noncontig --server [--port P]       the server alone (another host's client connects)
//   noncontig --client HOST [--port P]  the client alone
//
// The client prints one CSV row per (family, method, N, S): throughput (payload bytes N*S a
// transfer, windows of transfers in flight) and the latency of one transfer at a time (until
// the data is in its final layout and the initiator knows: for WRITE and SEND this includes
// the receiver's unpack and its zero-byte reply). Each point runs in rounds, every method once
// a round: mbps and lat_us are the best round's (throughput; median latency), mbps_med and
// mbps_min the median and worst round's, lat_med_us and lat_p90_us over all rounds' samples. See noncontig_transfer.h
// for the methods and docs/noncontig.md for the study. Every point's destination is checked byte by byte (gaps between
// buffers included); the exit status is 1 if any byte was wrong.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "noncontig_control.h"
#include "noncontig_endpoint.h"
#include "noncontig_layout.h"
#include "noncontig_transfer.h"

extern char** environ;

namespace noncontig {
namespace {

constexpr int kControlMs = 60000;  // bound on every wait on the control connection
constexpr int kConnectMs = 10000;  // how long the client retries while the server starts

struct Options {
  enum class Role { kPair, kServer, kClient } role = Role::kPair;
  std::string host = "127.0.0.1";
  uint16_t port = 18990;
  EndpointOptions ep;
  std::vector<uint32_t> ns;     // empty: powers of 2 up to the device's max_sge, and max_sge
  std::vector<uint32_t> sizes;  // empty: 8, 32, ... 512 KiB (powers of 4), 1 MiB
  std::vector<Family> families{Family::kWrite, Family::kRead, Family::kSend};
  std::vector<Method> methods{Method::kSgl, Method::kPack, Method::kMulti};
  double warm_ms = 10, tput_ms = 60, lat_ms = 30;
  uint32_t min_batches = 2;  // a round
  uint32_t rounds = 3;
  uint32_t max_window = kMaxWindow;
  bool quick = false;
};

void usage(FILE* f) {
  std::fprintf(f,
               "usage: noncontig [--server | --client HOST] [--port P] [--dev NAME] [--gid IDX]\n"
               "                 [--spin-us 1000 (then block on the completion channel; -1: spin only)]\n"
               "                 [--quick] [--ns 1,2,4] [--sizes 8,4096] [--families write,read,send]\n"
               "                 [--methods sgl,pack,multi] [--tput-ms 60] [--lat-ms 30] [--warm-ms 10]\n"
               "                 [--rounds 3 (each method once a round; times are per point)]\n"
               "  --quick: N 1,4; S 8,4096; windows of 8; one short run a point (a correctness check: every method,\n"
               "           every family, destination bytes checked). CSV rows on stdout.\n");
}

std::optional<std::vector<std::string>> split(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string_view::npos) comma = s.size();
    if (comma == start) return std::nullopt;
    out.emplace_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

bool parse_uints(std::string_view s, std::vector<uint32_t>& out) {
  auto parts = split(s);
  if (!parts) return false;
  for (const auto& p : *parts) {
    char* end = nullptr;
    unsigned long v = std::strtoul(p.c_str(), &end, 10);
    if (*end == 'K' || *end == 'k') v <<= 10, ++end;
    if (*end == 'M' || *end == 'm') v <<= 20, ++end;
    if (*end != '\0' || v == 0 || v > 0xFFFFFFFFul) return false;
    out.push_back(uint32_t(v));
  }
  return true;
}

template <typename E>
bool parse_names(std::string_view s, std::vector<E>& out, std::string_view (*name)(E), int count) {
  auto parts = split(s);
  if (!parts) return false;
  out.clear();
  for (const auto& p : *parts) {
    int found = -1;
    for (int k = 0; k < count; ++k)
      if (name(E(k)) == p) found = k;
    if (found < 0) return false;
    out.push_back(E(found));
  }
  return true;
}

// Returns the options, or nullopt after a one-line error.
std::optional<Options> parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    bool ok = true;
    if (a == "--server") {
      o.role = Options::Role::kServer;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--help" || a == "-h") {
      usage(stdout);
      std::exit(0);
    } else if (!(v = value())) {
      ok = false;
    } else if (a == "--client") {
      o.role = Options::Role::kClient, o.host = v;
    } else if (a == "--port") {
      long p = std::strtol(v, nullptr, 10);
      ok = p > 0 && p < 65536, o.port = uint16_t(p);
    } else if (a == "--dev") {
      o.ep.device = v;
    } else if (a == "--gid") {
      o.ep.gid_index = std::atoi(v);
    } else if (a == "--rounds") {
      long r = std::strtol(v, nullptr, 10);
      ok = r >= 1 && r <= 100, o.rounds = uint32_t(r);
    } else if (a == "--spin-us") {
      o.ep.spin_us = std::atoi(v);
    } else if (a == "--ns") {
      ok = parse_uints(v, o.ns) && std::all_of(o.ns.begin(), o.ns.end(), [](uint32_t n) { return n <= kMaxN; });
    } else if (a == "--sizes") {
      ok = parse_uints(v, o.sizes) && std::all_of(o.sizes.begin(), o.sizes.end(), [](uint32_t s) {
             return s >= kMinSize && s <= kMaxSize && s % 8 == 0;
           });
    } else if (a == "--families") {
      ok = parse_names<Family>(v, o.families, family_name, 3);
    } else if (a == "--methods") {
      ok = parse_names<Method>(v, o.methods, method_name, 3);
    } else if (a == "--tput-ms" || a == "--lat-ms" || a == "--warm-ms") {
      double ms = std::strtod(v, nullptr);
      ok = ms >= 0 && ms <= 10000;
      (a == "--tput-ms" ? o.tput_ms : a == "--lat-ms" ? o.lat_ms : o.warm_ms) = ms;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "noncontig: bad argument %s%s%s (N <= %u; S a multiple of 8 in [%u, %u]); see --help\n",
                   argv[i - (v ? 1 : 0)], v ? " " : "", v ? v : "", kMaxN, kMinSize, kMaxSize);
      return std::nullopt;
    }
  }
  if (o.quick) {
    if (o.ns.empty()) o.ns = {1, 4};
    if (o.sizes.empty()) o.sizes = {8, 4096};
    o.warm_ms = 0, o.tput_ms = 1, o.lat_ms = 1, o.min_batches = 1, o.rounds = 1, o.max_window = 8;
  }
  if (o.sizes.empty()) o.sizes = {8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288, 1048576};
  return o;
}

// The N of the study for a device limit: 1, 2, 4, ... and the limit itself.
std::vector<uint32_t> ns_for(const Options& o, uint32_t limit) {
  std::vector<uint32_t> ns;
  if (!o.ns.empty()) {
    for (uint32_t n : o.ns)
      if (n <= limit) ns.push_back(n);
    return ns;
  }
  for (uint32_t n = 1; n <= limit; n *= 2) ns.push_back(n);
  if (ns.back() != limit) ns.push_back(limit);
  return ns;
}

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct RunResult {
  bool ok = false;
  size_t bad_bytes = 0;
  std::vector<double> batch_us;  // measured batches (after the warm-up)
};

// One run of a point: the server set up, batches until `target_ms` of measured batches (at
// least min_batches) after `warm_ms`, the destination checked.
RunResult run_point(int fd, Client& client, const Point& p, const Options& o, double warm_ms, double target_ms) {
  RunResult r;
  PointMsg m{uint32_t(p.family), uint32_t(p.method), p.shape.n, p.shape.size, p.shape.window, 0, p.seed};
  ReplyMsg reply{};
  client.prepare(p);
  if (!control_send(fd, &m, sizeof m) || !control_recv(fd, &reply, sizeof reply, kControlMs) || !reply.ok) return r;
  auto start = Clock::now();
  double measured_ms = 0;
  for (;;) {
    bool warm = ms_since(start) >= warm_ms;
    bool last = warm && measured_ms >= target_ms && r.batch_us.size() + 1 >= o.min_batches;
    auto t0 = Clock::now();
    if (!client.batch(p, last)) return r;
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (warm) r.batch_us.push_back(us), measured_ms += us / 1000;
    if (last) break;
  }
  if (p.family == Family::kRead) {
    r.bad_bytes = client.check(p);
  } else {
    if (!control_recv(fd, &reply, sizeof reply, kControlMs)) return r;
    r.bad_bytes = reply.bad_bytes;
  }
  r.ok = true;
  return r;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

// One method's runs at one point, over the rounds. Other jobs on the machine only ever slow
// a round down, so the best round is the estimate of what the method costs; the median of
// the rounds and of all samples are printed beside it.
struct Summary {
  std::vector<double> round_mbps;     // throughput of each round, 1e6 B/s
  std::vector<double> round_lat_med;  // median latency of each round, us
  std::vector<double> lat_us;         // every latency sample of every round
  size_t batches = 0;
  size_t bad_bytes = 0;
  void add(const RunResult& t, const RunResult& l, double batch_bytes) {
    double us = 0;
    for (double b : t.batch_us) us += b;
    round_mbps.push_back(double(t.batch_us.size()) * batch_bytes / us);
    round_lat_med.push_back(percentile(l.batch_us, 0.5));
    lat_us.insert(lat_us.end(), l.batch_us.begin(), l.batch_us.end());
    batches += t.batch_us.size();
    bad_bytes += t.bad_bytes + l.bad_bytes;
  }
};

// The study; CSV on stdout. Returns the exit status.
int run_client(const Options& o) {
  int fd = control_connect(o.host.c_str(), o.port, kConnectMs);
  if (fd < 0) return 2;
  Endpoint ep;
  Hello peer{};
  Hello self{};
  if (!ep.open(o.ep)) return 2;
  self = ep.hello();
  if (!control_send(fd, &self, sizeof self) || !control_recv(fd, &peer, sizeof peer, kControlMs) || !ep.connect(peer))
    return 2;
  Client client(ep, peer);
  std::printf(
      "family,method,n,size,bytes,window,rounds,batches,mbps,mbps_med,mbps_min,lat_iters,lat_us,lat_med_us,"
      "lat_p90_us,check\n");
  std::fflush(stdout);
  uint64_t seed = 0x5EED0000;
  size_t failures = 0;
  auto study_start = Clock::now();
  for (Family f : o.families) {
    uint32_t limit =
        f == Family::kRead ? std::min(ep.max_read_sge(), peer.max_read_sge) : std::min(ep.max_send_sge(), peer.max_sge);
    for (uint32_t n : ns_for(o, limit)) {
      for (uint32_t size : o.sizes) {
        std::vector<Summary> sums(o.methods.size());
        const uint32_t window = std::min(throughput_window(n, size), o.max_window);
        // Rounds: every method once a round, so that a change in the machine's load falls on
        // all methods of a point alike.
        for (uint32_t round = 0; round < o.rounds; ++round) {
          for (size_t k = 0; k < o.methods.size(); ++k) {
            Point tp{f, o.methods[k], {n, size, window}, ++seed};
            Point lp{f, o.methods[k], {n, size, 1}, ++seed};
            double warm = round == 0 ? o.warm_ms : 0;
            RunResult t = run_point(fd, client, tp, o, warm, o.tput_ms / o.rounds);
            RunResult l = t.ok ? run_point(fd, client, lp, o, warm, o.lat_ms / o.rounds) : RunResult{};
            if (!t.ok || !l.ok) {
              std::fprintf(stderr, "noncontig: %s %s N=%u S=%u failed\n", family_name(f).data(),
                           method_name(o.methods[k]).data(), n, size);
              return 2;
            }
            sums[k].add(t, l, double(tp.shape.window) * n * size);
          }
        }
        for (size_t k = 0; k < o.methods.size(); ++k) {
          const Summary& u = sums[k];
          failures += u.bad_bytes != 0;
          const std::vector<double>& bw = u.round_mbps;
          std::printf("%s,%s,%u,%u,%zu,%u,%u,%zu,%.3f,%.3f,%.3f,%zu,%.3f,%.3f,%.3f,%s\n", family_name(f).data(),
                      method_name(o.methods[k]).data(), n, size, size_t(n) * size, window, o.rounds, u.batches,
                      *std::max_element(bw.begin(), bw.end()), percentile(bw, 0.5),
                      *std::min_element(bw.begin(), bw.end()), u.lat_us.size(),
                      *std::min_element(u.round_lat_med.begin(), u.round_lat_med.end()), percentile(u.lat_us, 0.5),
                      percentile(u.lat_us, 0.9), u.bad_bytes ? ("bad:" + std::to_string(u.bad_bytes)).c_str() : "ok");
          if (u.bad_bytes)
            std::fprintf(stderr, "noncontig: %s %s N=%u S=%u: %zu destination bytes wrong\n", family_name(f).data(),
                         method_name(o.methods[k]).data(), n, size, u.bad_bytes);
        }
        std::fflush(stdout);
      }
      std::fprintf(stderr, "noncontig: %s N=%u done (%.1f s)\n", family_name(f).data(), n,
                   ms_since(study_start) / 1000);
    }
  }
  PointMsg quit{};
  quit.family = kQuit;
  (void)control_send(fd, &quit, sizeof quit);
  close(fd);
  if (failures) std::fprintf(stderr, "noncontig: %zu points with wrong destination bytes\n", failures);
  return failures ? 1 : 0;
}

int run_server(const Options& o) {
  int fd = control_listen(o.port, kControlMs);
  if (fd < 0) return 2;
  Endpoint ep;
  Hello peer{};
  if (!ep.open(o.ep) || !control_recv(fd, &peer, sizeof peer, kControlMs) || !ep.connect(peer)) return 2;
  Hello self = ep.hello();
  if (!control_send(fd, &self, sizeof self)) return 2;
  Server server(ep);
  for (;;) {
    PointMsg m{};
    if (!control_recv(fd, &m, sizeof m, kControlMs)) return 2;
    if (m.family == kQuit) break;
    if (m.family > 2 || m.method > 2 || m.n == 0 || m.n > kMaxN || m.size < kMinSize || m.size > kMaxSize ||
        m.size % 8 || m.window == 0 || size_t(m.window) * m.n * m.size > kBatchBytes || m.window * m.n > kMaxBatchWrs) {
      std::fprintf(stderr, "noncontig: server: bad point from the client\n");
      return 2;
    }
    Point p{Family(m.family), Method(m.method), {m.n, m.size, m.window}, m.seed};
    ReplyMsg ready{1, 0, 0};
    if (!server.prepare(p) || !control_send(fd, &ready, sizeof ready)) return 2;
    if (p.family == Family::kRead) continue;
    if (!server.serve(p)) return 2;
    size_t bad = server.check(p);
    ReplyMsg done{bad == 0, 0, bad};
    if (!control_send(fd, &done, sizeof done)) return 2;
  }
  close(fd);
  return 0;
}

// Both roles on this host: the server is this program again (/proc/self/exe, so `uroce run`'s
// environment carries over), started before the client connects and waited for after.
int run_pair(const Options& o, char** argv) {
  std::string port = std::to_string(o.port), gid = std::to_string(o.ep.gid_index);
  std::string spin = std::to_string(o.ep.spin_us);
  std::vector<const char*> args{argv[0], "--server",  "--port",    port.c_str(),
                                "--gid", gid.c_str(), "--spin-us", spin.c_str()};
  if (o.ep.device) args.insert(args.end(), {"--dev", o.ep.device});
  args.push_back(nullptr);
  pid_t pid = -1;
  if (int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, const_cast<char**>(args.data()), environ)) {
    std::fprintf(stderr, "noncontig: cannot start the server: %s\n", std::strerror(rc));
    return 2;
  }
  int status = run_client(o);
  auto deadline = Clock::now() + std::chrono::seconds(10);
  int ws = 0;
  while (waitpid(pid, &ws, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &ws, 0);
      std::fprintf(stderr, "noncontig: the server did not exit; killed\n");
      return status ? status : 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (status == 0 && !(WIFEXITED(ws) && WEXITSTATUS(ws) == 0)) {
    std::fprintf(stderr, "noncontig: the server failed\n");
    return 2;
  }
  return status;
}

}  // namespace
}  // namespace noncontig

int main(int argc, char** argv) {
  using noncontig::Options;
  auto o = noncontig::parse(argc, argv);
  if (!o) return 2;
  switch (o->role) {
    case Options::Role::kServer:
      return noncontig::run_server(*o);
    case Options::Role::kClient:
      return noncontig::run_client(*o);
    case Options::Role::kPair:
      return noncontig::run_pair(*o, argv);
  }
  return 2;
}
