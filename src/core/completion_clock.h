// The clock behind completion timestamps (ibv_wc_read_completion_ts) and
// ibv_query_rt_values_ex: CLOCK_MONOTONIC in nanoseconds. uroce's "HCA core
// clock" therefore ticks at 1 GHz (hca_core_clock = 1,000,000 kHz), a
// timestamp converts to time without calibration, and the 64-bit counter
// never wraps in practice (completion_timestamp_mask is all ones).
#pragma once

#include <time.h>

#include <cstdint>

namespace uroce::core {

inline constexpr uint64_t kHcaCoreClockKhz = 1'000'000;
inline constexpr uint64_t kCompletionTimestampMask = ~uint64_t(0);

inline uint64_t clock_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

// Raw completion clock ticks (ns of CLOCK_MONOTONIC).
inline uint64_t completion_clock_ns() { return clock_ns(CLOCK_MONOTONIC); }
// Wall-clock time for IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK (ns since the epoch).
inline uint64_t wallclock_ns() { return clock_ns(CLOCK_REALTIME); }

}  // namespace uroce::core
