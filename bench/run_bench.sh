#!/usr/bin/env bash
# uroce's RC RDMA WRITE throughput beside the raw UDP throughput of this machine.
#
#   bench/run_bench.sh        (after scripts/setup.sh has built build/)
#
# uroce: Debian's perftest `ib_write_bw` (server and client as two processes under
# `uroce run`, one RC QP over 127.0.0.1) for 4 KiB, 64 KiB and 1 MiB messages.
# Raw UDP: bench/udp_burst, sendmmsg/recvmmsg bursts of 32 datagrams of 4156 bytes,
# about the size of uroce's packets at the loopback MTU of 4096.
# Then 64 KiB WRITEs under 0%, 1% and 5% random packet loss (UROCE_FAULT, both sides).
# Environment: BUILD_DIR (default build), ITERS_4K / ITERS_64K / ITERS_1M / ITERS_LOSS,
# UDP_SECONDS (default 3), KEEP_LOGS=1 to keep the programs' output.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
launcher=$build/bin/uroce
udp_burst=$build/bin/udp_burst
for f in "$launcher" "$udp_burst"; do
  [[ -x $f ]] || { echo "run_bench: $f not found; build first (scripts/setup.sh)" >&2; exit 1; }
done
command -v ib_write_bw >/dev/null || { echo "run_bench: ib_write_bw not found (apt-get install perftest)" >&2; exit 1; }

logs=$(mktemp -d /tmp/uroce-bench.XXXXXX)
if [[ ${KEEP_LOGS:-0} == 1 ]]; then
  echo "run_bench: logs in $logs"
else
  trap 'rm -rf "$logs"' EXIT
fi

sizes=(4096 65536 1048576)
labels=("4 KiB" "64 KiB" "1 MiB")
iters=("${ITERS_4K:-50000}" "${ITERS_64K:-5000}" "${ITERS_1M:-500}")
tcp_ports=(18811 18812 18813)

echo "uroce benchmark on $(uname -n): $(nproc) CPUs, Linux $(uname -r)"

# Raw UDP first, while nothing else runs.
udp_line=$("$udp_burst" -t "${UDP_SECONDS:-3}")
echo "$udp_line"
udp_gbits=$(sed -n 's/.*: \([0-9.]*\) Gbit\/s.*/\1/p' <<<"$udp_line")
udp_mpps=$(sed -n 's/.* \([0-9.]*\) Mpps received.*/\1/p' <<<"$udp_line")

# One ib_write_bw run under uroce; prints the client's average Gbit/s, or "failed".
# UROCE_FAULT (if $4 is not empty) is set for both server and client.
write_bw() {
  local size=$1 n=$2 port=$3 fault=$4 name="write_bw_$1_$3"
  local opts=(-d uroce0 -x 0 -s "$size" -n "$n" -F --report_gbits -p "$port")
  echo "${fault:+UROCE_FAULT=$fault }ib_write_bw ${opts[*]} ..." >&2
  if env ${fault:+UROCE_FAULT=$fault} "$root/tests/conformance/run_pair.sh" --launcher "$launcher" \
       --timeout 180 --name "$name" --outdir "$logs" --port "$port" \
       --server ib_write_bw "${opts[@]}" --client ib_write_bw "${opts[@]}" 127.0.0.1 >/dev/null 2>&1; then
    # Result row: "#bytes #iterations BW-peak BW-average MsgRate", printed by the client.
    awk -v s="$size" -v n="$n" '$1 == s && $2 == n { print $4; found = 1; exit } END { if (!found) print "failed" }' \
      "$logs/$name.client.log"
  else
    echo "  failed; output:" >&2
    sed 's/^/    /' "$logs/$name.server.log" "$logs/$name.client.log" >&2
    echo failed
  fi
}

results=()
status=0
for i in "${!sizes[@]}"; do
  results+=("$(write_bw "${sizes[i]}" "${iters[i]}" "${tcp_ports[i]}" "")")
  [[ ${results[i]} != failed ]] || status=1
done

# RC reliability cost: 64 KiB WRITEs with packets lost at random on both sides.
losses=(0 0.01 0.05)
loss_iters=${ITERS_LOSS:-2000}
loss_results=()
for i in "${!losses[@]}"; do
  fault=""
  [[ ${losses[i]} == 0 ]] || fault="loss=${losses[i]},seed=7"
  loss_results+=("$(write_bw 65536 "$loss_iters" $((18821 + i)) "$fault")")
  [[ ${loss_results[i]} != failed ]] || status=1
done

echo
echo "RC RDMA WRITE over uroce (ib_write_bw, 1 QP, 127.0.0.1) vs raw UDP (udp_burst)"
printf '  %-8s %10s %14s %16s %9s\n' message iterations "uroce Gbit/s" "raw UDP Gbit/s" "uroce/UDP"
for i in "${!sizes[@]}"; do
  ratio=$(awk -v a="${results[i]}" -v b="$udp_gbits" \
            'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.0f%%", 100 * a / b; else print "-" }')
  printf '  %-8s %10s %14s %16s %9s\n' "${labels[i]}" "${iters[i]}" "${results[i]}" \
    "$udp_gbits" "$ratio"
done
echo "  (raw UDP: 4156-byte datagrams, bursts of 32, $udp_mpps Mpps received)"
echo
echo "RC RDMA WRITE 64 KiB over uroce under packet loss (UROCE_FAULT=loss=P on both sides)"
printf '  %-8s %10s %14s\n' loss iterations "uroce Gbit/s"
for i in "${!losses[@]}"; do
  printf '  %-8s %10s %14s\n' "$(awk -v p="${losses[i]}" 'BEGIN { printf "%g%%", 100 * p }')" "$loss_iters" \
    "${loss_results[i]}"
done
exit $status
