#!/usr/bin/env bash
# perftest's RC figures under uroce, one run of each (server and client as two processes
# under `uroce run`, 1 QP over 127.0.0.1): bandwidth of SEND, RDMA WRITE and RDMA READ for
# 64 KiB and 1 MiB messages and of 8-byte atomics; latency for 2 B and 64 B (atomics: 8 B).
#
#   bench/run_perftest.sh        (after scripts/setup.sh has built build/)
#
# Environment: BUILD_DIR (default build), KEEP_LOGS=1 to keep the programs' output.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
launcher=${BUILD_DIR:-$root/build}/bin/uroce
[[ -x $launcher ]] || { echo "run_perftest: $launcher not found; build first (scripts/setup.sh)" >&2; exit 1; }
command -v ib_write_bw >/dev/null || { echo "run_perftest: perftest not installed" >&2; exit 1; }
logs=$(mktemp -d /tmp/uroce-perftest.XXXXXX)
if [[ ${KEEP_LOGS:-0} == 1 ]]; then echo "run_perftest: logs in $logs"; else trap 'rm -rf "$logs"' EXIT; fi

port=18900
# run PROGRAM COLUMN ARGS...: prints column COLUMN of the client's first result row, or "failed".
run() {
  local program=$1 column=$2 name
  shift 2
  port=$((port + 1))
  name="$program.$port"
  local opts=(-d uroce0 -x 0 -p "$port" "$@")
  if "$root/tests/conformance/run_pair.sh" --launcher "$launcher" --timeout 120 --name "$name" --outdir "$logs" \
       --port "$port" --server "$program" "${opts[@]}" --client "$program" "${opts[@]}" 127.0.0.1 \
       >/dev/null 2>&1; then
    awk -v c="$column" '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= c { print $c; found = 1; exit }
                        END { if (!found) print "failed" }' "$logs/$name.client.log"
  else
    echo failed
  fi
}

echo "perftest over uroce on $(uname -n): $(nproc) CPUs, Linux $(uname -r)"
echo
echo "Bandwidth (BW average, Gbit/s; atomics: Mops/s)"
printf '  %-8s %10s %10s\n' op "64 KiB" "1 MiB"
for op in send write read; do
  printf '  %-8s %10s %10s\n' "$op" "$(run "ib_${op}_bw" 4 -s 65536 -n 2000 --report_gbits)" \
    "$(run "ib_${op}_bw" 4 -s 1048576 -n 200 --report_gbits)"
done
printf '  %-8s %10s\n' atomic "$(run ib_atomic_bw 5 -n 5000) Mops/s (8 B fetch-and-add)"
echo
echo "Latency (t_typical, usec; one way for send/write, round trip for read/atomic as perftest reports)"
printf '  %-8s %10s %10s\n' op "2 B" "64 B"
for op in send write read; do
  printf '  %-8s %10s %10s\n' "$op" "$(run "ib_${op}_lat" 5 -s 2 -n 2000)" "$(run "ib_${op}_lat" 5 -s 64 -n 2000)"
done
printf '  %-8s %10s\n' atomic "$(run ib_atomic_lat 5 -n 2000) (8 B)"
