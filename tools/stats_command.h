// `uroce stats [PID]` (stats.cc): prints the live counters of running uroce processes.
#pragma once

#include <span>

int cmd_stats(std::span<char*> args);
