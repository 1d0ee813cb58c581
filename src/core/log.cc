#include "core/log.h"

#include <cstdarg>
#include <cstdio>

namespace uroce::core {

bool log_enabled(LogLevel level) { return level <= config().log_level; }

void log_message(LogLevel level, const char* fmt, ...) {
  static const char* const kNames[] = {"error", "warn", "info", "debug"};
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "uroce %s: %s\n", kNames[unsigned(level)], line);
}

}  // namespace uroce::core
