// Rate limiting for the log lines that a peer can cause (malformed CM
// messages, connections that never speak, accept failures): a flood of them
// must not become a flood of lines on the application's stderr.
#pragma once

#include <chrono>
#include <cstdint>

namespace uroce::rdmacm {

// At most kBurst lines per kWindow; the lines dropped in between are counted
// and the count is handed to the next line let through. Not thread-safe: the
// CM uses it under its mutex.
class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kBurst = 5;
  static constexpr auto kWindow = std::chrono::seconds(1);

  // True if a line may be printed at `now`; *suppressed is then the number of
  // lines dropped since the previous one printed.
  bool allow(Clock::time_point now, uint64_t* suppressed) {
    if (now - window_start_ >= kWindow) {
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= kBurst) {
      ++suppressed_;
      return false;
    }
    ++in_window_;
    *suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

 private:
  Clock::time_point window_start_{};
  int in_window_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace uroce::rdmacm
