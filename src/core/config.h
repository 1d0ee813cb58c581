// Run-time configuration from UROCE_* environment variables (design §3).
// Every variable is documented in env_var_docs(), which `uroce help env` prints.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "wire/headers.h"

namespace uroce::core {

struct EnvVarDoc {
  const char* name;
  const char* default_value;
  const char* meaning;
};

std::span<const EnvVarDoc> env_var_docs();

enum class LogLevel : uint8_t { kError, kWarn, kInfo, kDebug };

struct Config {
  std::string device_name = "uroce0";
  uint16_t udp_port = wire::kRoceV2Port;  // the host's RoCE port (UROCE_PORT)
  LogLevel log_level = LogLevel::kWarn;
  bool icrc_check = true;
  // UROCE_GSO=0: no UDP GSO/GRO (one datagram per packet each way).
  bool gso = true;
  // UROCE_ECN=0: send Not-ECT and neither answer CE marks with CNPs nor slow
  // down on CNPs (docs/architecture.md, "ECN and CNPs").
  bool ecn = true;
  bool shm = true;         // the same-host path (UROCE_SHM)
  bool shm_direct = true;  // same-host direct placement of WRITE/READ (UROCE_SHM_DIRECT)
  bool shm_jumbo = true;   // same-host jumbo packets for large SEND/WRITE (UROCE_SHM_JUMBO)
  // UROCE_POLL: after a packet the progress thread polls progress_spin_us
  // more (0, "block": it sleeps at once); with progress_spin_auto ("auto",
  // the default: 50 us) only while no application thread is runnable and
  // after small bursts (host/spin_advisor.h), with "spin:N" regardless.
  uint32_t progress_spin_us = 50;
  bool progress_spin_auto = true;
  // UROCE_PROGRESS_SLICE_US: the scheduler slice the progress thread asks for (0: the default).
  uint32_t progress_slice_us = 0;
  bool stats_at_exit = false;
  bool live_stats = true;     // counters readable by `uroce stats` while running (UROCE_LIVE_STATS)
  uint32_t mtu_override = 0;  // 0: derived from the interface
  std::string fault;          // fault-injection spec, see UROCE_FAULT
  std::string pcap;           // UROCE_PCAP: capture file ("": none)
  uint64_t pcap_limit_mb = 256;
};

// Parsed once, on first use; thread-safe.
const Config& config();

}  // namespace uroce::core
