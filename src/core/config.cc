#include "core/config.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace uroce::core {

namespace {

// wire::kRoceV2Port in decimal, UROCE_PORT's default in the table below.
constexpr std::array<char, 6> kRoceV2PortText = [] {
  std::array<char, 6> text{};  // at most 5 digits and the NUL
  unsigned len = 1;
  for (unsigned v = wire::kRoceV2Port / 10; v != 0; v /= 10) ++len;
  for (unsigned v = wire::kRoceV2Port, i = len; i-- > 0; v /= 10) text[i] = char('0' + v % 10);
  return text;
}();

constexpr EnvVarDoc kDocs[] = {
    {"UROCE_DEVICE", "uroce0", "Name of the uroce device reported by ibv_get_device_list."},
    {"UROCE_PORT", kRoceV2PortText.data(),
     "The host's RoCE UDP port, shared by every uroce process of the host (SO_REUSEPORT): a packet sent "
     "there reaches any QP of the host by its QP number. Each process also binds a private port below "
     "0xC000, which is the port's LID; dlid 0 and dlid 0xC000 and up address the host's port."},
    {"UROCE_HOST_REGISTRY", "/dev/shm/uroce-host-<uid>-<netns>",
     "The host registry file (QP-number slots of the host's uroce processes; docs/architecture.md, one RoCE "
     "address per host). Processes that should see each other as one host use the same file."},
    {"UROCE_LOG", "warn", "Log level on stderr: error, warn, info or debug."},
    {"UROCE_ICRC_CHECK", "1",
     "1: verify the ICRC of received packets and drop (and count) mismatches; 0: accept packets "
     "without checking (diagnosis only: packets of rxe and RoCE NICs verify whatever IPv4 identification they "
     "carry)."},
    {"UROCE_STATS", "0", "1: print the device's packet counters to stderr when it is closed."},
    {"UROCE_LIVE_STATS", "1",
     "0: keep the counters private (no /dev/shm/uroce-stats-<uid>-<pid>-<lid> file for `uroce stats`)."},
    {"UROCE_STATS_DIR", "/dev/shm", "Folder of the live counters files (`uroce stats` reads the same one)."},
    {"UROCE_PCAP", "(none)",
     "Capture every packet a device sends and receives (also through shared memory) into this pcap file "
     "(raw IPv4; %p is replaced by the process ID, %l by the device's UDP port; a second device of the "
     "process adds -<port>). Read it with tshark -d udp.port==PORT,infiniband."},
    {"UROCE_PCAP_LIMIT_MB", "256", "Largest capture file in MiB; later packets are counted, not written."},
    {"UROCE_MTU", "(from the interface)", "Active MTU of the port in bytes (256, 512, 1024, 2048 or 4096)."},
    {"UROCE_FAULT", "(none)",
     "Fault injection on every packet sent: comma-separated loss=P,dup=P,reorder=P,corrupt=P "
     "(probabilities 0-1), delay_us=N, seed=S."},
    {"UROCE_GSO", "1",
     "1: send bulk traffic as UDP GSO messages and receive with UDP GRO where the kernel has them; 0: one "
     "datagram per packet each way (docs/architecture.md, UDP GSO and GRO)."},
    {"UROCE_ECN", "1",
     "1: send ECN-capable (ECT(0)); answer packets marked Congestion Experienced with RoCEv2 CNPs and halve "
     "the congestion window on a CNP, as a RoCE NIC's congestion control; 0: none of it."},
    {"UROCE_SHM", "1",
     "1: packets between uroce processes of one host go through shared memory (the same-host path); 0: over "
     "UDP, so that a capture on the interface sees every packet."},
    {"UROCE_SHM_DIRECT", "1",
     "1: RDMA WRITE and READ between RC/UC QPs of one host are copied directly between the two processes' "
     "registered memory (process_vm_writev/readv) when the kernel allows it; 0: they go as packets through "
     "the same-host path (docs/architecture.md, direct placement). Off when UROCE_SHM=0 or UROCE_FAULT is set."},
    {"UROCE_POLL", "auto",
     "How the progress thread waits for packets: block sleeps at once; auto (auto:N) keeps polling 50 (N) "
     "microseconds after a burst of at most 8 packets while no application thread of the process is runnable "
     "(an RDMA READ target that sleeps: round trips twice as fast over UDP here); spin:N polls N microseconds "
     "regardless (docs/architecture.md, \"How the progress thread waits\")."},
    {"UROCE_PROGRESS_SLICE_US", "0",
     "Scheduler time slice the progress thread asks for (Linux 6.12+), so that it preempts a thread spinning "
     "on its core when a packet arrives; 0: the default slice (measured: no gain here, see docs/architecture.md)."},
    {"UROCE_LIB", "(beside the launcher)", "Path of liburoce.so used by `uroce run`."},
};

LogLevel parse_level(std::string_view s) {
  if (s == "error") return LogLevel::kError;
  if (s == "info") return LogLevel::kInfo;
  if (s == "debug") return LogLevel::kDebug;
  return LogLevel::kWarn;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

Config load() {
  Config c;
  if (const char* v = env("UROCE_DEVICE")) c.device_name = v;
  if (const char* v = env("UROCE_PORT")) {
    long p = std::strtol(v, nullptr, 0);
    if (p > 0 && p < 0xC000) c.udp_port = uint16_t(p);
  }
  if (const char* v = env("UROCE_LOG")) c.log_level = parse_level(v);
  if (const char* v = env("UROCE_ICRC_CHECK")) c.icrc_check = std::strcmp(v, "0") != 0;
  if (const char* v = env("UROCE_GSO")) c.gso = std::strcmp(v, "0") != 0;
  if (const char* v = env("UROCE_ECN")) c.ecn = std::strcmp(v, "0") != 0;
  if (const char* v = env("UROCE_SHM")) c.shm = std::strcmp(v, "0") != 0;
  if (const char* v = env("UROCE_SHM_DIRECT")) c.shm_direct = std::strcmp(v, "0") != 0;
  if (const char* v = env("UROCE_SHM_JUMBO")) c.shm_jumbo = std::strcmp(v, "0") != 0;
  if (const char* v = env("UROCE_POLL")) {
    // block | auto | auto:N | spin | spin:N
    c.progress_spin_auto = std::strncmp(v, "auto", 4) == 0;
    if (std::strncmp(v, "spin:", 5) == 0 || std::strncmp(v, "auto:", 5) == 0)
      c.progress_spin_us = uint32_t(std::strtoul(v + 5, nullptr, 0));
    else if (std::strcmp(v, "spin") == 0 || std::strcmp(v, "auto") == 0)
      c.progress_spin_us = 50;
    else
      c.progress_spin_us = 0;  // "block"
  }
  if (const char* v = env("UROCE_PROGRESS_SLICE_US")) c.progress_slice_us = uint32_t(std::strtoul(v, nullptr, 0));
  if (const char* v = env("UROCE_STATS")) c.stats_at_exit = std::strcmp(v, "0") != 0;
  if (const char* v = env("UROCE_LIVE_STATS")) c.live_stats = std::strcmp(v, "0") != 0;
  if (const char* v = env("UROCE_MTU")) c.mtu_override = uint32_t(std::strtoul(v, nullptr, 0));
  if (const char* v = env("UROCE_FAULT")) c.fault = v;
  if (const char* v = env("UROCE_PCAP")) c.pcap = v;
  if (const char* v = env("UROCE_PCAP_LIMIT_MB")) c.pcap_limit_mb = std::strtoull(v, nullptr, 0);
  return c;
}

}  // namespace

std::span<const EnvVarDoc> env_var_docs() { return kDocs; }

const Config& config() {
  static const Config* const c = new Config(load());  // never destroyed: read by threads outliving main()
  return *c;
}

}  // namespace uroce::core
