#include "transport/step_probe.h"

#ifdef UROCE_STEP_PROBES
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace uroce::transport::step_probe {
namespace {

// One stamp as the file holds it (bench/step_timeline.py reads '<QII').
struct Stamp {
  uint64_t tsc;
  uint32_t step;
  uint32_t tid;
};
constexpr size_t kMaxStamps = size_t(1) << 22;

// The process's stamps, written to $UROCE_STEP_PROBE_DIR/steps.<pid>.bin
// (default /tmp) when the process exits.
struct Log {
  std::unique_ptr<Stamp[]> stamps{new Stamp[kMaxStamps]};
  std::atomic<size_t> count{0};
  ~Log() {
    const char* dir = std::getenv("UROCE_STEP_PROBE_DIR");
    char path[512];
    std::snprintf(path, sizeof path, "%s/steps.%d.bin", dir ? dir : "/tmp", int(getpid()));
    if (FILE* f = std::fopen(path, "wb")) {
      std::fwrite(stamps.get(), sizeof(Stamp), std::min(count.load(), kMaxStamps), f);
      std::fclose(f);
    }
  }
};

Log& log() {
  static Log l;
  return l;
}

}  // namespace

void stamp(Step step) noexcept {
  static thread_local uint32_t tid = uint32_t(gettid());
  Log& l = log();
  size_t i = l.count.fetch_add(1, std::memory_order_relaxed);
  if (i < kMaxStamps) l.stamps[i] = Stamp{__rdtsc(), uint32_t(step), tid};
}

}  // namespace uroce::transport::step_probe
#endif
