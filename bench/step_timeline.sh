#!/usr/bin/env bash
# Where a same-host one-way's time goes (src/transport/step_probe.h): builds
# liburoce with -DUROCE_STEP_PROBES=ON in build-steps/ (once), runs
# ib_send_lat -s 64 on the same host through it, and prints the time of each
# step (bench/step_timeline.py).
#   bench/step_timeline.sh [ITERATIONS]     (default 20000; STEP_BUILD: the build tree;
#                                           UDP=1: over UDP loopback, UROCE_SHM=0, as compare.sh)
# Needs perftest (ib_send_lat). The figures are this machine's and this
# minute's: compare builds by alternating runs, as for any latency.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
iters=${1:-20000}
build=${STEP_BUILD:-build-steps}  # another tree (STEP_BUILD) for comparing two builds
if [[ ! -x $build/bin/uroce ]]; then
  cmake -S . -B $build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUROCE_BUILD_TESTS=OFF -DUROCE_STEP_PROBES=ON >/dev/null
fi
cmake --build $build -j"$(nproc)" --target uroce uroce_launcher >/dev/null
out=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$out"' EXIT
port=$((20000 + RANDOM % 20000))
env=(UROCE_STEP_PROBE_DIR="$out")
[[ ${UDP:-0} == 1 ]] && env+=(UROCE_SHM=0 UROCE_MTU=4096)
env "${env[@]}" timeout 120 $build/bin/uroce run -- \
  ib_send_lat -d uroce0 -x 0 -F -p $port -s 64 -n "$iters" >"$out/server.log" 2>&1 &
server=$!
sleep 0.5
env "${env[@]}" timeout 120 $build/bin/uroce run -- \
  ib_send_lat -d uroce0 -x 0 -F -p $port -s 64 -n "$iters" 127.0.0.1 >"$out/client.log" 2>&1
wait $server
# The TSC's rate: the kernel's calibration when its log is readable; else /proc/cpuinfo's
# "cpu MHz", which is the TSC's rate only on a CPU that does not change frequency (a VM).
mhz=$( (dmesg 2>/dev/null || true) | grep -oE 'tsc: (Refined TSC clocksource calibration:|Detected) [0-9.]+' | tail -1 | grep -oE '[0-9.]+$' || true)
[[ -n $mhz ]] || mhz=$(awk '/^cpu MHz/ {print $4; exit}' /proc/cpuinfo)
ghz=$(awk -v m="$mhz" 'BEGIN {print m / 1000}')
awk '/t_typical/ {getline; print "ib_send_lat 64 B t_typical (with the stamps): " $5 " us"}' "$out/client.log"
python3 bench/step_timeline.py "$ghz" "$out"/steps.*.bin
