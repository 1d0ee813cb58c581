#!/usr/bin/env bash
# bench/middleware.sh — the middleware people run on RDMA, over uroce and over kernel TCP,
# side by side on this machine, two processes on 127.0.0.1:
#
#   UCX         ucx_perftest tag_lat 64 B, tag_bw 1 MiB: UCX_TLS=rc_verbs,ud_verbs (uroce)
#               against UCX_TLS=tcp
#   libfabric   fi_pingpong 64 B and 1 MiB ping-pong: -p verbs -e rdm (verbs;ofi_rxm over
#               uroce) and -e msg, against -p tcp -e rdm (tcp;ofi_rxm) and -e msg
#   qperf       rc_lat / rc_bw (RC through rdma_cm, -cm1) against tcp_lat / tcp_bw, 64 B / 1 MiB
#   rsockets    rstream 64 B round trips (-S 64 -I N) and 1 MiB transfers: rsockets
#               (uroce) against rstream -T s (kernel sockets)
#   Open MPI    tests/middleware/mpi_check.c's ping-pong, 64 B and 1 MiB round trips: pml
#               ucx (rc_verbs) and pml cm/mtl ofi (verbs;ofi_rxm) against pml ob1/btl tcp
#
# Every figure is what the program printed (latency one way in µs where the program reports
# one way, round trips where it says so; bandwidth in MB/s as the program reports it). The
# table goes to stdout (also OUT/middleware.txt), every program's output to OUT/logs/.
# Figures are printed, never asserted. Needs the packages scripts/setup.sh installs and a
# build (BUILD_DIR, default build/, with bin/mpi_check). Unpinned; run on a quiet machine.
#
# Environment: BUILD_DIR, OUT (default bench/out), PORT_BASE (19300), ITERS (latency
# iterations, 20000), BW_ITERS (1 MiB transfers, 500), RUN_TIMEOUT (120 s per program).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
out=${OUT:-$root/bench/out}
port=${PORT_BASE:-19300}
iters=${ITERS:-20000}
bw_iters=${BW_ITERS:-500}
limit=${RUN_TIMEOUT:-120}
uroce=$build/bin/uroce
mkdir -p "$out/logs"
[[ -x $uroce ]] || { echo "middleware: $uroce missing: build first (scripts/setup.sh)" >&2; exit 1; }

server_pid=''
cleanup() { [[ -n $server_pid ]] && kill -TERM "$server_pid" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT

# pair NAME SERVER... -- CLIENT...: the server in the background, the client once the server
# listens on $port (or after 2 s); logs OUT/logs/NAME.{server,client}.log; next port.
pair() {
  local name=$1 srv=() cli=()
  shift
  while [[ $1 != -- ]]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  echo "middleware: $name" >&2
  timeout -k 5 "$limit" "${srv[@]}" >"$out/logs/$name.server.log" 2>&1 &
  server_pid=$!
  local hex i
  hex=$(printf ':%04X ' "$port")
  for ((i = 0; i < 40; ++i)); do grep -q "$hex" /proc/net/tcp 2>/dev/null && break; sleep 0.05; done
  timeout -k 5 "$limit" "${cli[@]}" >"$out/logs/$name.client.log" 2>&1 || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=''
  port=$((port + 1))
}
log() { cat "$out/logs/$1.client.log" 2>/dev/null || true; }

# Figures: field extraction from each program's own output ('-' when absent).
ucx_final() { log "$1" | awk -v f="$2" '/^Final:/ {print $f; found=1} END {if (!found) print "-"}'; }
fi_col() { log "$1" | awk -v f="$2" '$1 ~ /^[0-9]/ {v=$f} END {print v==""?"-":v}'; }
qperf_val() { log "$1" | awk -v k="$2" '$1==k {print $3, $4; found=1} END {if (!found) print "-"}'; }
rstream_col() { log "$1" | awk -v f="$2" '$1=="custom" {v=$f} END {print v==""?"-":v}'; }
mpi_rt() { log "$1" | awk -v s="$2" '/ping-pong/ && $3==s {print $5; found=1} END {if (!found) print "-"}'; }

rows=()
row() { rows+=("$(printf '%-10s %-34s %14s %14s' "$1" "$2" "$3" "$4")"); }

# --- UCX --------------------------------------------------------------------------------
for tls in rc_verbs,ud_verbs tcp; do
  pre=(env UCX_TLS=$tls,self UCX_NET_DEVICES=$([[ $tls == tcp ]] && echo lo || echo uroce0:1))
  run=("$uroce" run)
  [[ $tls == tcp ]] && run=()
  pair ucx.$tls.lat "${pre[@]}" "${run[@]}" ucx_perftest -p $port -- \
    "${pre[@]}" "${run[@]}" ucx_perftest 127.0.0.1 -p $port -t tag_lat -n "$iters"
  pair ucx.$tls.bw "${pre[@]}" "${run[@]}" ucx_perftest -p $port -- \
    "${pre[@]}" "${run[@]}" ucx_perftest 127.0.0.1 -p $port -t tag_bw -s 1048576 -n "$bw_iters"
done
row UCX "tag_lat 64 B, µs (median)" "$(ucx_final ucx.rc_verbs,ud_verbs.lat 3)" "$(ucx_final ucx.tcp.lat 3)"
row UCX "tag_bw 1 MiB, MB/s" "$(ucx_final ucx.rc_verbs,ud_verbs.bw 6)" "$(ucx_final ucx.tcp.bw 6)"

# --- libfabric --------------------------------------------------------------------------
for ep in rdm msg; do
  for prov in verbs tcp; do
    run=("$uroce" run)
    [[ $prov == tcp ]] && run=()
    pair fi.$prov.$ep.lat "${run[@]}" fi_pingpong -p $prov -e $ep -S 64 -I "$iters" -B $port -- \
      "${run[@]}" fi_pingpong -p $prov -e $ep -S 64 -I "$iters" -P $port 127.0.0.1
    pair fi.$prov.$ep.bw "${run[@]}" fi_pingpong -p $prov -e $ep -S 1048576 -I "$bw_iters" -B $port -- \
      "${run[@]}" fi_pingpong -p $prov -e $ep -S 1048576 -I "$bw_iters" -P $port 127.0.0.1
  done
  row libfabric "fi_pingpong $ep 64 B, µs/xfer" "$(fi_col fi.verbs.$ep.lat 7)" "$(fi_col fi.tcp.$ep.lat 7)"
  row libfabric "fi_pingpong $ep 1 MiB, MB/s" "$(fi_col fi.verbs.$ep.bw 6)" "$(fi_col fi.tcp.$ep.bw 6)"
done

# --- qperf ------------------------------------------------------------------------------
pair qperf.rc "$uroce" run qperf -lp $port -- \
  "$uroce" run qperf 127.0.0.1 -lp $port -cm1 -t 2 -m 64 rc_lat -m 1048576 rc_bw quit
pair qperf.tcp qperf -lp $port -- qperf 127.0.0.1 -lp $port -t 2 -m 64 tcp_lat -m 1048576 tcp_bw quit
row qperf "rc_lat / tcp_lat 64 B" "$(qperf_val qperf.rc latency)" "$(qperf_val qperf.tcp latency)"
row qperf "rc_bw / tcp_bw 1 MiB" "$(qperf_val qperf.rc bw)" "$(qperf_val qperf.tcp bw)"

# --- rsockets ---------------------------------------------------------------------------
for mode in rs sockets; do
  run=("$uroce" run) t=()
  [[ $mode == sockets ]] && run=() t=(-T s)
  pair rstream.$mode.lat "${run[@]}" rstream -p $port "${t[@]}" -S 64 -I "$iters" -- \
    "${run[@]}" rstream -s 127.0.0.1 -p $port "${t[@]}" -S 64 -I "$iters"
  pair rstream.$mode.bw "${run[@]}" rstream -p $port "${t[@]}" -S 1048576 -C "$bw_iters" -- \
    "${run[@]}" rstream -s 127.0.0.1 -p $port "${t[@]}" -S 1048576 -C "$bw_iters"
done
row rsockets "rstream 64 B, µs/xfer" "$(rstream_col rstream.rs.lat 8)" "$(rstream_col rstream.sockets.lat 8)"
row rsockets "rstream 1 MiB, Gb/s" "$(rstream_col rstream.rs.bw 7)" "$(rstream_col rstream.sockets.bw 7)"

# --- Open MPI ---------------------------------------------------------------------------
mpi_check=$build/bin/mpi_check
if [[ -x $mpi_check ]] && command -v mpirun >/dev/null; then
  mpi=(mpirun --allow-run-as-root -np 2)
  run_mpi() { # NAME MPIRUN-OPTIONS...
    local name=$1
    shift
    echo "middleware: $name" >&2
    timeout -k 5 "$limit" "$@" "$mpi_check" --rounds 200 >"$out/logs/$name.client.log" 2>&1 || true
  }
  run_mpi mpi.ucx "$uroce" run "${mpi[@]}" --mca pml ucx --mca btl self -x UCX_TLS=rc_verbs,ud_verbs,self \
    -x UCX_NET_DEVICES=uroce0:1
  run_mpi mpi.ofi "$uroce" run "${mpi[@]}" --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include \
    "verbs;ofi_rxm" --mca osc pt2pt --mca btl self -x "FI_PROVIDER=verbs;ofi_rxm"
  run_mpi mpi.tcp "${mpi[@]}" --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo
  row "Open MPI" "ping-pong 64 B round trip, µs (ucx)" "$(mpi_rt mpi.ucx 64)" "$(mpi_rt mpi.tcp 64)"
  row "Open MPI" "ping-pong 64 B round trip, µs (ofi)" "$(mpi_rt mpi.ofi 64)" "$(mpi_rt mpi.tcp 64)"
  row "Open MPI" "ping-pong 1 MiB round trip, µs (ucx)" "$(mpi_rt mpi.ucx 1048576)" "$(mpi_rt mpi.tcp 1048576)"
  row "Open MPI" "ping-pong 1 MiB round trip, µs (ofi)" "$(mpi_rt mpi.ofi 1048576)" "$(mpi_rt mpi.tcp 1048576)"
fi

{
  printf '%-10s %-34s %14s %14s\n' client figure "over uroce" "over TCP"
  printf '%s\n' "${rows[@]}"
} | tee "$out/middleware.txt"
