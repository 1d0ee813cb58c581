// The engine's clock: timers, deadlines and burst times (a monotonic clock).
#pragma once

#include <chrono>

namespace uroce::engine {

using Clock = std::chrono::steady_clock;

}  // namespace uroce::engine
