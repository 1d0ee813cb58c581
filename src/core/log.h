// Minimal leveled logging to stderr, prefixed "uroce: ".
#pragma once

#include "core/config.h"

namespace uroce::core {

bool log_enabled(LogLevel level);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace uroce::core

#define UROCE_LOG(level, ...)                                                              \
  do {                                                                                     \
    if (::uroce::core::log_enabled(level)) ::uroce::core::log_message(level, __VA_ARGS__); \
  } while (0)
#define LOG_ERROR(...) UROCE_LOG(::uroce::core::LogLevel::kError, __VA_ARGS__)
#define LOG_WARN(...) UROCE_LOG(::uroce::core::LogLevel::kWarn, __VA_ARGS__)
#define LOG_INFO(...) UROCE_LOG(::uroce::core::LogLevel::kInfo, __VA_ARGS__)
#define LOG_DEBUG(...) UROCE_LOG(::uroce::core::LogLevel::kDebug, __VA_ARGS__)
