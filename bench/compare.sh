#!/usr/bin/env bash
# bench/compare.sh — uroce beside what this machine can do and what a user would pick
# instead, measured in one run, printed as a table with ratios, plotted.
#
#   bench/compare.sh            (builds build/ through scripts/setup.sh when it is missing)
#
# Where: on loopback (127.0.0.1) over UDP (UROCE_SHM=0), on loopback through uroce's same-host
# path (shared memory — large SEND/WRITE streams as jumbo packets — and direct placement, the
# default between processes of one host), then across two network-namespace "hosts" joined by
# a veth pair with MTU 9000 (needs root; skipped with a message otherwise). Servers run on CPU
# 1, clients on CPU 0 (taskset) — except on the same-host path, which is not pinned (its large
# transfers are copied on two CPUs).
# What:
#   - ceilings, bench/udp_ceiling between two processes: UDP datagrams the size of uroce's
#     packets — 4112 B at MTU 4096 and 1040 B at MTU 1024 (MTU + 12 B BTH + 4 B ICRC, a
#     middle packet of a multi-packet message) — with sendmmsg/recvmmsg (32 a call) and with
#     UDP GSO (as many segments as fit in 64 KiB a send) + UDP_GRO on the receiver; 64 B
#     ping-pong one-way latency (RTT/2) with both sides busy-polling and both blocking, and
#     busy-polling with a 20 B datagram behind each 64 B one in one GSO message (the shape
#     of an RC reply that carries the ACK of the message it answers);
#   - uroce through unmodified perftest (each under `uroce run`, RC, one QP): ib_write_bw,
#     ib_send_bw, ib_read_bw at 4 KiB, 64 KiB, 1 MiB; ib_write_bw -q 8 and -q 64 at 1 MiB,
#     ib_send_bw and ib_read_bw -q 64 at 1 MiB
#     (aggregate);
#     ib_send_lat, ib_write_lat, ib_read_lat at 64 B (t_typical and 99 %). On loopback
#     UROCE_MTU=4096 (GID of 127.0.0.1); across the namespaces the veth's MTU 9000 makes the
#     port's active MTU 4096 by itself;
#   - peers over TCP, where installed: UCX (ucx_perftest, UCX_TLS=tcp: tag_bw 1 MiB,
#     tag_lat 64 B) and libfabric (fi_pingpong -p tcp -e msg: 64 B and 1 MiB ping-pong);
#   - on the same-host path: ib_write_bw 1 MiB three times (the 20 GB/s target is set against
#     the median; this VM's two CPUs move data at very different speeds from minute to
#     minute), each after a run of bench/copy_ceiling (two threads copying 1 MiB messages
#     through a shared-memory ring in 256 KiB chunks, the same-host stream's shape: its
#     ceiling); ROUNDS rounds against libfabric's shm provider, each round ib_send_lat 64 B
#     and ib_write_bw 1 MiB beside fi_pingpong -p shm -e rdm 64 B and 1 MiB, uroce first in
#     odd rounds and libfabric first in even ones (the acceptance rows: the median of the
#     rounds' own ratios; beside them, not a target, ib_send_lat's mean t_avg against
#     fi_pingpong's figure, which is a mean, where the acceptance row uses t_typical, a median);
#     ring_floor's ping-pongs (tests/transport/ring_floor.cc) through uroce's same-host ring
#     between two processes (a cache line each way, a record per message, a record and an
#     ACK per message): the latency floors under ib_send_lat 64 B and libfabric's figure;
#   - sweeps over message sizes (loopback only) for two plots: bandwidth and latency
#     against size for uroce, the UDP ceilings and the peers (matplotlib, bench/plot.py).
# Units: GB/s = 1e9 B/s (perftest is run with --report_gbits, Gbit/s / 8; UCX's MB/s are
# MiB/s, converted; the UDP ceilings count UDP payload bytes); latencies in µs, one way —
# except ib_read_lat, which perftest reports as the full round trip of a READ.
# Output: the table on stdout (also OUT/table.txt), progress on stderr; OUT/results.csv
# (every figure of the table), OUT/sweep_bw.csv and OUT/sweep_lat.csv, OUT/bandwidth.png
# and OUT/latency.png, every program's output in OUT/logs/. Figures are printed, never
# asserted; the exit status is 0 unless the harness itself failed.
#
# Environment:
#   BUILD_DIR        uroce build to measure (default build/; must hold bin/uroce,
#                    bin/udp_ceiling, lib/liburoce.so — built when missing)
#   OUT              output directory (default bench/out/)
#   UROCE_GSO        passed through to uroce (UROCE_GSO=0: the sendmmsg/recvmmsg fallback);
#                    the table's header says which send/receive path uroce reported
#   NETNS=0          skip the namespace half;  PEERS=0 skip UCX/libfabric;  SWEEP=0 no sweeps;
#                    SHM=0 skip the same-host half (the loopback half runs with UROCE_SHM=0)
#   ROUNDS (3)       the loopback and namespace halves, and the same-host half's match against
#                    libfabric shm, are measured this many times in a row; each figure is the
#                    median of its rounds; each acceptance ratio is the median of the rounds'
#                    own ratios, which the row prints too
#   UDP_SECONDS (2)  UDP_LAT_ITERS (20000)  BW_ITERS_4K (50000)  BW_ITERS_64K (10000)
#   BW_ITERS_1M (5000: ~2 s over UDP, as long as a ceiling run)  LAT_ITERS (10000)  PEER_BW_ITERS (UCX, 2000)  PEER_LAT_ITERS (UCX,
#   20000)  FABRIC_BW_ITERS (500)  FABRIC_LAT_ITERS (10000)  SWEEP_SIZES ("4 16 ... 8388608")
#   SWEEP_BYTES (268435456: bytes per bandwidth point)  RUN_TIMEOUT (120 s per program)
#   PORT_BASE (19100: TCP/UDP ports used from there on)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
[[ $build == /* ]] || build=$PWD/$build
out=${OUT:-$root/bench/out}
[[ $out == /* ]] || out=$PWD/$out
launcher=$build/bin/uroce
ceiling=$build/bin/udp_ceiling
copy_ceiling=$build/bin/copy_ceiling
ring_floor=$build/bin/ring_floor

udp_seconds=${UDP_SECONDS:-2}
udp_lat_iters=${UDP_LAT_ITERS:-20000}
bw_iters_4k=${BW_ITERS_4K:-50000}
bw_iters_64k=${BW_ITERS_64K:-10000}
bw_iters_1m=${BW_ITERS_1M:-5000}
lat_iters=${LAT_ITERS:-10000}
ucx_bw_iters=${PEER_BW_ITERS:-2000}
ucx_lat_iters=${PEER_LAT_ITERS:-20000}
fi_iters_1m=${FABRIC_BW_ITERS:-500}
fi_lat_iters=${FABRIC_LAT_ITERS:-10000}
read -ra sweep_sizes <<<"${SWEEP_SIZES:-4 16 64 256 1024 4096 16384 65536 262144 1048576 4194304 8388608}"
sweep_bytes=${SWEEP_BYTES:-268435456}
run_timeout=${RUN_TIMEOUT:-120}
port=${PORT_BASE:-19100}
size_4096=4112 # UDP payload of a middle packet at MTU 4096: 4096 + BTH 12 + ICRC 4
size_1024=1040 # the same at MTU 1024
[[ -z ${UROCE_GSO:-} ]] || export UROCE_GSO

say() { printf 'compare: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# ---------------------------------------------------------------------------------------
# Cleanup: every background program is stopped and every namespace deleted on exit.

pids=()
namespaces=()
cleanup() {
  local pid ns
  for pid in ${pids[@]+"${pids[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" 2>/dev/null || true; done
  for ns in ${namespaces[@]+"${namespaces[@]}"}; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

forget() { # PID: no longer to be stopped on exit
  local p kept=()
  for p in ${pids[@]+"${pids[@]}"}; do [[ $p == "$1" ]] || kept+=("$p"); done
  pids=(${kept[@]+"${kept[@]}"})
}

# stop PID: TERM (timeout forwards it; KILL follows 5 s later), wait, forget. Returns the
# program's exit status.
stop() {
  local rc=0
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || rc=$?
  forget "$1"
  return $rc
}

# run LOG LIMIT CMD...: CMD under `timeout LIMIT`, output to LOG, waited for with `wait` (not
# as a foreground command) so that a signal to this script stops it at once.
run() {
  local log=$1 limit=$2 pid rc=0
  shift 2
  timeout -k 5 "$limit" "$@" >"$log" 2>&1 &
  pid=$!
  pids+=("$pid")
  wait "$pid" || rc=$?
  forget "$pid"
  return $rc
}

# ---------------------------------------------------------------------------------------
# Build and packages.

ensure_built() {
  if ! [[ -x $launcher && -x $ceiling && -x $copy_ceiling && -e $build/lib/liburoce.so ]]; then
    if [[ ! -e $build/CMakeCache.txt ]]; then
      if [[ $build == "$root/build" ]]; then
        say "building build/ (scripts/setup.sh)"
        "$root/scripts/setup.sh" >&2
      else
        cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
      fi
    fi
    say "building uroce, its launcher, udp_ceiling and copy_ceiling in $build"
    cmake --build "$build" -j"${JOBS:-2}" --target uroce_launcher uroce udp_ceiling copy_ceiling >&2
    [[ -x $launcher && -x $ceiling && -x $copy_ceiling ]] || die "$launcher, $ceiling or $copy_ceiling missing after the build"
  fi
  # ring_floor is built with the tests (it reaches into the transport): without them, n/a.
  [[ -x $ring_floor ]] || cmake --build "$build" -j"${JOBS:-2}" --target ring_floor >&2 ||
    say "no ring_floor (the tests are not configured): its rows read n/a"
}

ensure_packages() {
  local p missing=()
  for p in perftest ibverbs-utils ucx-utils libfabric-bin python3-matplotlib; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  if ((EUID == 0)) && command -v apt-get >/dev/null; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 ||
      { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; } ||
      say "could not install ${missing[*]}: the parts that need them are skipped"
  else
    say "not installed (and not root to install them): ${missing[*]}; the parts that need them are skipped"
  fi
}

# ---------------------------------------------------------------------------------------
# Running a server and a client. A location sets: loc (label), srv_ns/cli_ns (namespace or
# ''), S/C (prefixes: namespace + CPU), srv_addr, gid, uroce_env, ucx_env_s/ucx_env_c.

next_port() { port=$((port + 1)); }

in_ns() { # NS CMD...: runs CMD in namespace NS ('' = this one)
  local ns=$1
  shift
  if [[ -n $ns ]]; then ip netns exec "$ns" "$@"; else "$@"; fi
}

listening() { # tcp|udp PORT: is the port bound/listening in the server's namespace?
  local hex files state
  hex=$(printf ':%04X' "$2")
  if [[ $1 == tcp ]]; then files=(/proc/net/tcp /proc/net/tcp6) state=0A; else files=(/proc/net/udp /proc/net/udp6) state=07; fi
  in_ns "$srv_ns" awk -v p="$hex" -v s="$state" '$4 == s && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
    "${files[@]}" 2>/dev/null
}

# start_server NAME PROTO PORT CMD...: starts CMD (with its prefixes) in the background and
# waits until it listens; sets server_pid. Fails if it exits or does not listen within 30 s.
# Its time limit is $server_limit when set (a persistent server), else RUN_TIMEOUT.
start_server() {
  local name=$1 proto=$2 p=$3 deadline
  shift 3
  timeout -k 5 "${server_limit:-$run_timeout}" "$@" >"$logs/$name.server.log" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  deadline=$((SECONDS + 30))
  until listening "$proto" "$p"; do
    if ! kill -0 "$server_pid" 2>/dev/null || ((SECONDS >= deadline)); then
      echo "compare: server did not listen on $proto port $p" >>"$logs/$name.server.log"
      stop "$server_pid" || true
      return 1
    fi
    sleep 0.05
  done
}

# pair NAME PROTO PORT: the server "${srv[@]}" and the client "${cli[@]}" (full commands),
# each under a timeout; logs in $logs/NAME.{server,client}.log. The server gets 15 s after
# the client to finish. Succeeds if both exit 0.
pair() {
  local name=$1 proto=$2 p=$3 crc=0 src=0 i
  say "$loc: $name"
  start_server "$name" "$proto" "$p" "${srv[@]}" || return 1
  run "$logs/$name.client.log" "$run_timeout" "${cli[@]}" || crc=$?
  for ((i = 0; i < 150; i++)); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
  stop "$server_pid" || src=$?
  ((crc == 0 && src == 0)) || { say "$loc: $name failed (client $crc, server $src; logs in $logs)"; return 1; }
}

# ---------------------------------------------------------------------------------------
# Results: R[KEY] = figure ("failed" when the run failed; "n/a" when it was not run).

declare -A R
num() { [[ ${1:-} =~ ^[0-9]+(\.[0-9]+)?$ ]]; }
put() { R[$1]=$2; }
get() { echo "${R[$1]:-n/a}"; }

middle() { # FIGURE...: the middle figure (of an even count, the lower of the two middle ones)
  printf '%s\n' "$@" | sort -g | sed -n "$((($# + 1) / 2))p"
}
median() { # A B C: the median of three figures ("failed" if any is not a number)
  if num "$1" && num "$2" && num "$3"; then middle "$1" "$2" "$3"; else echo failed; fi
}
kv() { # LINE KEY: value of KEY=value in a udp_ceiling line, or "failed"
  local v
  v=$(sed -n "s/.* $2=\([0-9.]*\).*/\1/p" <<<"$1")
  echo "${v:-failed}"
}

# udp_drops: UDP datagrams dropped for a full receive buffer (RcvbufErrors of /proc/net/snmp),
# summed over the server's and the client's namespaces (once when they are the same). On
# loopback the count is the whole host's, other programs' drops included.
udp_drops() {
  local ns total=0 n
  for ns in "$srv_ns" ${cli_ns:+"$cli_ns"}; do
    n=$(in_ns "$ns" awk '$1 == "Udp:" { if (!h) { for (i = 2; i <= NF; i++) col[$i] = i; h = 1 }
                                        else { print $col["RcvbufErrors"]; exit } }' /proc/net/snmp 2>/dev/null)
    total=$((total + ${n:-0}))
    [[ $cli_ns != "$srv_ns" ]] || break
  done
  echo "$total"
}

# retransmits NAME: uroce's retransmitted packets in both logs of a run (UROCE_STATS).
retransmits() {
  cat "$logs/$1".server.log "$logs/$1".client.log 2>/dev/null | grep -o 'retransmits [0-9]*' | awk '{ n += $2 } END { print n + 0 }'
}

# perftest: BW average (Gbit/s, column 4) of the client's result row, as GB/s.
pt_bw() { awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 5 { printf "%.3f", $4 / 8; f = 1; exit }
               END { if (!f) print "failed" }' "$1" 2>/dev/null || echo failed; }
# perftest latency: column COL (5 t_typical, 8 99 %) of the client's result row.
pt_lat() { awk -v c="$2" '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 8 { printf "%.2f", $c; f = 1; exit }
                         END { if (!f) print "failed" }' "$1" 2>/dev/null || echo failed; }

# ---------------------------------------------------------------------------------------
# Measurements at one location.

# uroce_pair PROGRAM ARGS...: srv and cli, a perftest program under uroce on both sides
# (the client gets the server's address last).
uroce_pair() {
  srv=("${S[@]}" env UROCE_STATS=1 ${uroce_env[@]+"${uroce_env[@]}"} "$launcher" run -- "$@")
  cli=("${C[@]}" env UROCE_STATS=1 ${uroce_env[@]+"${uroce_env[@]}"} "$launcher" run -- "$@" "$srv_addr")
}

measure_ceilings() {
  local p line mode size
  next_port
  p=$port
  ceiling_up=0
  if server_limit=900 start_server "$loc.udp_ceiling" udp "$p" "${S[@]}" "$ceiling" server -p "$p" -W 10; then
    ceiling_up=1
  else
    say "$loc: udp_ceiling server did not start"
    for size in $size_4096 $size_1024; do put "$loc:udp_mmsg:$size" failed; put "$loc:udp_gso:$size" failed; done
    put "$loc:udp_poll:64" failed
    put "$loc:udp_block:64" failed
    put "$loc:udp_ack:64" failed
    return
  fi
  for size in $size_4096 $size_1024; do
    for mode in mmsg gso; do
      say "$loc: UDP $mode ${size} B"
      run "$logs/udp.out" 60 "${C[@]}" "$ceiling" client "$srv_addr" -p "$p" -m "$mode" -s "$size" -t "$udp_seconds" || true
      line=$(tail -1 "$logs/udp.out")
      cat "$logs/udp.out" >>"$logs/$loc.udp_ceiling.client.log"
      put "$loc:udp_$mode:$size" "$(kv "$line" rx_GBps)"
      put "$loc:udp_$mode:$size:segs" "$(kv "$line" segments_per_send)"
    done
  done
  for mode in poll block ack; do
    say "$loc: UDP 64 B ping-pong ($mode)"
    run "$logs/udp.out" 120 "${C[@]}" "$ceiling" client "$srv_addr" -p "$p" -m "$mode" -s 64 -n "$udp_lat_iters" || true
    line=$(tail -1 "$logs/udp.out")
    cat "$logs/udp.out" >>"$logs/$loc.udp_ceiling.client.log"
    put "$loc:udp_$mode:64" "$(kv "$line" typical_us)"
    put "$loc:udp_$mode:64:p99" "$(kv "$line" p99_us)"
  done
}

# measure_ring_floor MODE: one ring_floor run (tests/transport/ring_floor.cc; 64 B, 200,000
# round trips, not pinned) -> R[shm:ring_floor:MODE] (µs one way).
measure_ring_floor() {
  local log=$logs/shm.ring_floor.$1.log line
  [[ -x $ring_floor ]] || return 0
  say "shm: ring floor ($1)"
  run "$log" 60 "$ring_floor" -m "$1" -s 64 -n 200000 || true
  line=$(grep '^ring_floor ' "$log" || true)
  put "shm:ring_floor:$1" "$(kv "$line" typical_us)"
}

# measure_copy_ceiling K: one bench/copy_ceiling run (1 s) -> R[shm:copy_ceiling:K] (GB/s).
measure_copy_ceiling() {
  local log=$logs/shm.copy_ceiling.$1.log line
  say "shm: copy ceiling ($1)"
  run "$log" 30 "$copy_ceiling" -t 1 || true
  line=$(tail -1 "$log")
  put "shm:copy_ceiling:$1" "$(kv "$line" GBps)"
}

stop_ceiling_server() {
  if ((ceiling_up)); then stop "$server_pid" || true; fi
  ceiling_up=0
}

perftest_bw() { # PROGRAM SIZE ITERS [EXTRA...] -> R[loc:PROGRAM:SIZE(:EXTRA)(:run_tag)]
  local prog=$1 size=$2 n=$3 key name opts extra
  shift 3
  extra="$*"
  extra=${extra// /}
  key="$loc:$prog:$size${extra:+:$extra}${run_tag:+:$run_tag}"
  name="$loc.$prog.$size${extra:+.$extra}${run_tag:+.$run_tag}"
  next_port
  opts=(-d uroce0 -x "$gid" -F --report_gbits -p "$port" -s "$size" -n "$n" "$@")
  uroce_pair "$prog" "${opts[@]}"
  local drops0
  drops0=$(udp_drops)
  if pair "$name" tcp "$port"; then put "$key" "$(pt_bw "$logs/$name.client.log")"; else put "$key" failed; fi
  put "$key:rexmit" "$(retransmits "$name")"
  put "$key:drops" $(($(udp_drops) - drops0))
}

perftest_lat() { # PROGRAM SIZE ITERS -> R[loc:PROGRAM:SIZE(:run_tag)] (t_typical), R[...:p99], R[...:avg]
  local prog=$1 size=$2 n=$3 key name
  key="$loc:$prog:$size${run_tag:+:$run_tag}"
  name="$loc.$prog.$size${run_tag:+.$run_tag}"
  next_port
  local opts=(-d uroce0 -x "$gid" -F -p "$port" -s "$size" -n "$n") drops0
  uroce_pair "$prog" "${opts[@]}"
  drops0=$(udp_drops)
  if pair "$name" tcp "$port"; then
    put "$key" "$(pt_lat "$logs/$name.client.log" 5)"
    put "$key:p99" "$(pt_lat "$logs/$name.client.log" 8)"
    put "$key:avg" "$(pt_lat "$logs/$name.client.log" 6)"
  else
    put "$key" failed
  fi
  put "$key:rexmit" "$(retransmits "$name")"
  put "$key:drops" $(($(udp_drops) - drops0))
}

measure_uroce() {
  command -v ib_write_bw >/dev/null || { say "$loc: perftest not installed: uroce skipped"; return; }
  local prog
  for prog in ib_write_bw ib_send_bw ib_read_bw; do
    perftest_bw "$prog" 4096 "$bw_iters_4k"
    perftest_bw "$prog" 65536 "$bw_iters_64k"
    perftest_bw "$prog" 1048576 "$bw_iters_1m"
  done
  perftest_bw ib_write_bw 1048576 $(((bw_iters_1m + 7) / 8)) -q 8
  perftest_bw ib_write_bw 1048576 $(((bw_iters_1m + 63) / 64)) -q 64
  perftest_bw ib_send_bw 1048576 $(((bw_iters_1m + 63) / 64)) -q 64
  perftest_bw ib_read_bw 1048576 $(((bw_iters_1m + 63) / 64)) -q 64
  for prog in ib_send_lat ib_write_lat ib_read_lat; do perftest_lat "$prog" 64 "$lat_iters"; done
}

# ucx_batch NAME FILE: one ucx_perftest pair running every test of a batch file; the client
# prints CSV rows "name,iterations,50%ile_lat,avg_lat,overall_lat,avg_bw,overall_bw,...".
ucx_batch() {
  local name=$1 file=$2
  next_port
  srv=("${S[@]}" env UCX_TLS=tcp "${ucx_env_s[@]}" ucx_perftest -p "$port" -b "$file")
  cli=("${C[@]}" env UCX_TLS=tcp "${ucx_env_c[@]}" ucx_perftest "$srv_addr" -p "$port" -b "$file" -f -v)
  pair "$name" tcp "$port"
}
ucx_get() { # LOG TEST COLUMN: figure of a batch row (bandwidth columns converted to GB/s)
  awk -F, -v t="$2" -v c="$3" '$1 == t { v = $c + 0; if (c >= 6) v = v * 1048576 / 1e9; printf "%.3f", v; f = 1; exit }
                              END { if (!f) print "failed" }' "$1" 2>/dev/null || echo failed
}

# fi_pp NAME SIZE ITERS [PROVIDER ENDPOINT]: libfabric ping-pong (default tcp, msg); sets
# fi_lat and fi_bw: one-way µs and GB/s (MB/s = 1e6 B/s).
fi_pp() {
  local name=$1 size=$2 n=$3 prov=${4:-tcp} ep=${5:-msg} log
  next_port
  srv=("${S[@]}" fi_pingpong -p "$prov" -e "$ep" -B "$port" -S "$size" -I "$n")
  cli=("${C[@]}" fi_pingpong -p "$prov" -e "$ep" -P "$port" -S "$size" -I "$n" "$srv_addr")
  log=$logs/$name.client.log
  if pair "$name" tcp "$port"; then
    # "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec"; bytes like 64, 64k, 1m.
    fi_lat=$(awk '$3 ~ /^=/ && NF >= 8 { printf "%.2f", $7; f = 1; exit } END { if (!f) print "failed" }' "$log")
    fi_bw=$(awk '$3 ~ /^=/ && NF >= 8 { printf "%.3f", $6 / 1000; f = 1; exit } END { if (!f) print "failed" }' "$log")
  else
    fi_lat=failed fi_bw=failed
  fi
}

measure_peers() {
  ((${PEERS:-1})) || { say "$loc: PEERS=0: peers skipped"; return; }
  if command -v ucx_perftest >/dev/null; then
    local batch=$logs/$loc.ucx.batch
    printf '%s\n' "bw1m -t tag_bw -s 1048576 -n $ucx_bw_iters -w $((ucx_bw_iters / 10))" \
      "lat64 -t tag_lat -s 64 -n $ucx_lat_iters -w $((ucx_lat_iters / 10))" >"$batch"
    if ucx_batch "$loc.ucx" "$batch"; then
      put "$loc:ucx_tag_bw:1048576" "$(ucx_get "$logs/$loc.ucx.client.log" bw1m 7)"
      put "$loc:ucx_tag_lat:64" "$(ucx_get "$logs/$loc.ucx.client.log" lat64 3)"
    else
      put "$loc:ucx_tag_bw:1048576" failed
      put "$loc:ucx_tag_lat:64" failed
    fi
  else
    say "$loc: ucx_perftest not installed: UCX skipped"
  fi
  if command -v fi_pingpong >/dev/null; then
    fi_pp "$loc.fi_pingpong.64" 64 "$fi_lat_iters"
    put "$loc:fi_lat:64" "$fi_lat"
    fi_pp "$loc.fi_pingpong.1048576" 1048576 "$fi_iters_1m"
    put "$loc:fi_bw:1048576" "$fi_bw"
  else
    say "$loc: fi_pingpong not installed: libfabric skipped"
  fi
}

# uroce's port as the programs see it: GID index of ADDR and the active MTU.
probe_uroce() { # ADDR
  local info
  info=$(in_ns "$srv_ns" timeout 30 env "${uroce_env[@]}" "$launcher" run -- ibv_devinfo -v 2>&1) || true
  gid=$(awk -v a="::ffff:$1," '/GID\[/ && index($0, a) { s = $0; sub(/.*GID\[ */, "", s); sub(/\].*/, "", s); print s; exit }' <<<"$info")
  active_mtu=$(awk '/active_mtu:/ { print $2; exit }' <<<"$info")
  [[ -n $gid ]] || { say "$loc: no GID for $1 in ibv_devinfo under uroce:"; echo "$info" >&2; gid=0; }
}

paths_used() { # which send/receive path uroce reported (UROCE_STATS) in this location's logs
  local tx rx
  tx=$(cat "$logs/$loc".ib_*.log 2>/dev/null | grep -o 'tx_path [a-z_]*' | sort -u | awk '{ print $2 }' | paste -sd/ -)
  rx=$(cat "$logs/$loc".ib_*.log 2>/dev/null | grep -o 'rx_path [a-z_]*' | sort -u | awk '{ print $2 }' | paste -sd/ -)
  echo "tx_path ${tx:-unknown}, rx_path ${rx:-unknown}"
}

perftest_mtu() { # the MTU perftest printed in its header ("Mtu : 4096[B]") in this location's logs
  local m
  m=$(cat "$logs/$loc".ib_*.client.log 2>/dev/null | sed -n 's/^ *Mtu *: *\([0-9]*\).*/\1/p' | sort -u | paste -sd/ -)
  echo "${m:-?}"
}

# ---------------------------------------------------------------------------------------
# The table.

emit() { printf '%s\n' "$*" | tee -a "$out/table.txt"; }
fmt() { if num "$1"; then printf "%.${2}f" "$1"; else echo "${1:-failed}"; fi; }
unit4() { if [[ $1 == µs ]]; then printf 'µs  '; else printf '%-4s' "$1"; fi; } # 4 columns wide
times() { if [[ $1 == - ]]; then echo -; else echo "$1×"; fi; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b > 0) printf "%.2f", a / b; else print "-" }'; }

csv() { # LOCATION METRIC SIZE VALUE UNIT REFERENCE REF_VALUE RATIO
  local IFS=,
  echo "$*" >>"$out/results.csv"
}

# row LABEL VALUE UNIT [REF_LABEL REF_VALUE [EXTRA]]: "label  value unit | reference value unit | ratio×"
row() {
  local label=$1 value=$2 unit=$3 rlabel=${4:-} rvalue=${5:-} extra=${6:-} digits=2 r="" line
  [[ $unit != GB/s ]] || digits=3
  line=$(printf '  %-40s %9s %s' "$label" "$(fmt "$value" "$digits")" "$(unit4 "$unit")")
  if [[ -n $rlabel ]]; then
    r=$(ratio "$value" "$rvalue")
    line+=$(printf ' | %-36s %9s %s | %6s' "$rlabel" "$(fmt "$rvalue" "$digits")" "$(unit4 "$unit")" "$(times "$r")")
  fi
  emit "$line${extra:+  $extra}"
  csv "$loc" "$label" "" "$value" "$unit" "$rlabel" "${rvalue:-}" "${r:-}"
}

# target LABEL A B OP LIMIT: an acceptance row: A/B against LIMIT ("met"/"not met").
target() { # LABEL A B OP LIMIT [NOTE]
  target_ratio "$1" "$(ratio "$2" "$3")" "${@:4}"
}

target_ratio() { # LABEL RATIO OP LIMIT [NOTE]; OP "-": a ratio shown beside the targets, not one
  local label=$1 r=$2 op=$3 limit=$4 note=${5:-} verdict goal="(target $3 $4×)" kind=acceptance
  if [[ $op == - ]]; then
    verdict="" goal="(not a target)" kind=ratio
  elif [[ $r == - ]]; then
    verdict="not measured"
  elif awk -v r="$r" -v l="$limit" -v op="$op" 'BEGIN { exit !((op == ">=") ? r >= l : r <= l) }'; then
    verdict=met
  else
    verdict="not met"
  fi
  emit "$(printf '  %-62s %7s  %s' "$label" "$(times "$r")" "$goal")${verdict:+  $verdict}${note:+  $note}"
  csv "$loc" "$kind: $label" "" "$r" ratio "$op $limit" "" "${verdict:-not a target}"
}

rexmit_note() { # KEY [SEPARATOR]: "retransmits N, UDP rcvbuf drops M" when not zero
  local n=${R[$1:rexmit]:-0} d=${R[$1:drops]:-0} note=""
  ((n == 0)) || note="retransmits $n"
  ((d == 0)) || note+="${note:+, }UDP rcvbuf drops $d"
  [[ -z $note ]] || echo "${2:-}$note"
}

# A UDP location's figures, ROUNDS times over (default 3): this machine switches between
# speeds that differ by up to 2x within a minute (docs/architecture.md, "Two speeds"), so
# one run's ratio can set a fast uroce run against a slow ceiling or the reverse. Each
# figure R[$loc:KEY] is then the median of its rounds, which are kept as R[$loc#K:KEY], and
# the acceptance rows also print each round's ratio.
rounds=${ROUNDS:-3}
measure_location() {
  local k key name v
  for ((k = 1; k <= rounds; k++)); do
    ((rounds == 1)) || say "$loc: round $k of $rounds"
    measure_ceilings
    stop_ceiling_server
    measure_uroce
    measure_peers
    for key in "${!R[@]}"; do
      [[ $key != "$loc:"* ]] || R["$loc#$k:${key#"$loc:"}"]=${R[$key]}
    done
  done
  ((rounds > 1)) || return 0
  for key in "${!R[@]}"; do
    [[ $key == "$loc#1:"* ]] || continue
    name=${key#"$loc#1:"}
    v=$(rounds_median "$name") && R["$loc:$name"]=$v
  done
  return 0
}

rounds_median() { # KEY: the middle of R[$loc#1..ROUNDS:KEY]; status 1 unless every round has a number
  local k v values=()
  for ((k = 1; k <= rounds; k++)); do
    v=$(get "$loc#$k:$1")
    num "$v" || return 1
    values+=("$v")
  done
  middle "${values[@]}"
}

# The acceptance ratio KEY_A / KEY_B at $loc. With several rounds: the median of the
# rounds' own ratios, each of two figures measured in the same minutes ("-" unless every
# round has both). The ratio of the two medians could set a fast minute's figure against
# a slow minute's: rounds of 0.72, 0.96 and 0.72 once read 0.96 that way.
accept_ratio() {
  if ((rounds == 1)); then
    ratio "$(get "$loc:$1")" "$(get "$loc:$2")"
    return
  fi
  local k r list=()
  for ((k = 1; k <= rounds; k++)); do
    r=$(ratio "$(get "$loc#$k:$1")" "$(get "$loc#$k:$2")")
    [[ $r != - ]] || {
      echo -
      return
    }
    list+=("$r")
  done
  middle "${list[@]}"
}

# The ratio KEY_A / KEY_B of every round at $loc: "r1, r2, ..." (empty with one round).
round_ratios() {
  ((rounds > 1)) || return 0
  local k list=""
  for ((k = 1; k <= rounds; k++)); do list+="$(ratio "$(get "$loc#$k:$1")" "$(get "$loc#$k:$2")"), "; done
  echo "rounds: ${list%, }"
}

print_location() {
  local gso4 poll ucxl w1
  gso4=$(get "$loc:udp_gso:$size_4096") poll=$(get "$loc:udp_poll:64") ucxl=$(get "$loc:ucx_tag_lat:64")
  w1=$(get "$loc:ib_write_bw:1048576")
  emit ""
  emit "== $loc_title =="
  emit "uroce: active MTU $active_mtu ($mtu_note; perftest reports $(perftest_mtu)), GID index $gid, $(paths_used)${UROCE_GSO:+ (UROCE_GSO=$UROCE_GSO)}"
  emit ""
  emit "Raw UDP ceilings (udp_ceiling, two processes)"
  local size mode
  for size in $size_4096 $size_1024; do
    local mtu=4096
    [[ $size != "$size_1024" ]] || mtu=1024
    row "UDP $size B (MTU $mtu) sendmmsg/recvmmsg" "$(get "$loc:udp_mmsg:$size")" GB/s "" "" "32 datagrams a call"
    row "UDP $size B (MTU $mtu) GSO+GRO" "$(get "$loc:udp_gso:$size")" GB/s "" "" \
      "$(get "$loc:udp_gso:$size:segs") segments a send"
  done
  row "UDP 64 B ping-pong, busy-poll" "$poll" µs "" "" "99 %: $(fmt "$(get "$loc:udp_poll:64:p99")" 2) µs"
  row "UDP 64 B ping-pong, blocking" "$(get "$loc:udp_block:64")" µs "" "" "99 %: $(fmt "$(get "$loc:udp_block:64:p99")" 2) µs"
  row "UDP 64 B + 20 B ACK, GSO, busy-poll" "$(get "$loc:udp_ack:64")" µs "UDP busy-poll one-way" "$poll" \
    "an RC reply with its ACK behind it: one GSO message of two datagrams"
  emit ""
  emit "uroce through perftest (RC, 1 QP unless noted)"
  emit "$(printf '  %-40s %9s %4s | %-51s | %s' "" measured "" reference ratio)"
  emit "  (after a row: packets uroce retransmitted (UROCE_STATS) and UDP datagrams dropped for a full"
  emit "   receive buffer during the run (/proc/net/snmp RcvbufErrors; on loopback the whole host's))"
  local prog label s
  for prog in ib_write_bw ib_send_bw ib_read_bw; do
    for s in 4096 65536 1048576; do
      case $s in 4096) label="4 KiB" ;; 65536) label="64 KiB" ;; *) label="1 MiB" ;; esac
      row "$prog $label" "$(get "$loc:$prog:$s")" GB/s "UDP GSO+GRO ceiling ($size_4096 B)" "$gso4" \
        "$(rexmit_note "$loc:$prog:$s")"
    done
  done
  local q
  for q in 8 64; do
    row "ib_write_bw 1 MiB -q $q (aggregate)" "$(get "$loc:ib_write_bw:1048576:-q$q")" GB/s "ib_write_bw 1 MiB, 1 QP" \
      "$w1" "$(rexmit_note "$loc:ib_write_bw:1048576:-q$q")"
  done
  for prog in ib_send_bw ib_read_bw; do
    row "$prog 1 MiB -q 64 (aggregate)" "$(get "$loc:$prog:1048576:-q64")" GB/s "$prog 1 MiB, 1 QP" \
      "$(get "$loc:$prog:1048576")" "$(rexmit_note "$loc:$prog:1048576:-q64")"
  done
  for prog in ib_send_lat ib_write_lat ib_read_lat; do
    local rlabel="UCX tag_lat (TCP)" rvalue=$ucxl
    label="$prog 64 B t_typical"
    [[ $prog != ib_send_lat ]] || rlabel="UDP busy-poll one-way" rvalue=$poll
    [[ $prog != ib_read_lat ]] || label+=" (RTT)"
    row "$label" "$(get "$loc:$prog:64")" µs "$rlabel" "$rvalue" \
      "99 %: $(fmt "$(get "$loc:$prog:64:p99")" 2) µs$(rexmit_note "$loc:$prog:64" ", ")"
    [[ $prog != ib_send_lat ]] ||
      row "$label" "$(get "$loc:$prog:64")" µs "UDP 64 B + 20 B ACK, GSO" "$(get "$loc:udp_ack:64")" \
        "the same floor with the ACK's datagram (RC's wire shape)"
  done
  if ((${PEERS:-1})); then
    emit ""
    emit "Peers over TCP"
    row "UCX tag_bw 1 MiB" "$(get "$loc:ucx_tag_bw:1048576")" GB/s "UDP GSO+GRO ceiling ($size_4096 B)" "$gso4"
    row "UCX tag_lat 64 B (median)" "$ucxl" µs "UDP busy-poll one-way" "$poll"
    row "libfabric tcp fi_pingpong 1 MiB" "$(get "$loc:fi_bw:1048576")" GB/s "UDP GSO+GRO ceiling ($size_4096 B)" "$gso4" \
      "ping-pong: one message in flight"
    row "libfabric tcp fi_pingpong 64 B" "$(get "$loc:fi_lat:64")" µs "UDP busy-poll one-way" "$poll"
    emit ""
    emit "uroce against the peers"
    row "ib_write_bw 1 MiB" "$w1" GB/s "UCX tag_bw 1 MiB" "$(get "$loc:ucx_tag_bw:1048576")"
    row "ib_write_bw 1 MiB" "$w1" GB/s "libfabric tcp 1 MiB" "$(get "$loc:fi_bw:1048576")"
    row "ib_send_lat 64 B" "$(get "$loc:ib_send_lat:64")" µs "UCX tag_lat 64 B" "$ucxl"
    row "ib_send_lat 64 B" "$(get "$loc:ib_send_lat:64")" µs "libfabric tcp 64 B" "$(get "$loc:fi_lat:64")"
  fi
  emit ""
  emit "Targets: uroce against its peers and ceilings (ratios from this run)"
  ((rounds == 1)) || emit "  (each figure above: the median of $rounds rounds, measured one after the other; each ratio below: the median of the rounds' own ratios)"
  local a b k1 k2 op limit
  for a in "ib_write_bw:1048576 udp_gso:$size_4096 >= 0.8 ib_write_bw 1 MiB / UDP GSO+GRO ceiling ($size_4096 B)" \
    "ib_send_lat:64 udp_poll:64 <= 1.25 ib_send_lat 64 B / UDP busy-poll one-way floor" \
    "ib_write_lat:64 ucx_tag_lat:64 <= 1 ib_write_lat 64 B / UCX tag_lat 64 B" \
    "ib_read_lat:64 ucx_tag_lat:64 <= 1 ib_read_lat 64 B / UCX tag_lat 64 B" \
    "ib_write_bw:1048576:-q8 ib_write_bw:1048576 >= 1 ib_write_bw 1 MiB -q 8 / -q 1" \
    "ib_write_bw:1048576:-q64 ib_write_bw:1048576 >= 1 ib_write_bw 1 MiB -q 64 / -q 1"; do
    read -r k1 k2 op limit b <<<"$a"
    target_ratio "$b" "$(accept_ratio "$k1" "$k2")" "$op" "$limit" "$(round_ratios "$k1" "$k2")"
  done
}

# ---------------------------------------------------------------------------------------
# Sweeps for the plots (loopback).

clamp() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { v = int(v); if (v < lo) v = lo; if (v > hi) v = hi; print v }'; }

sweep() {
  ((${SWEEP:-1})) || { say "SWEEP=0: no sweeps, no plots"; return; }
  local s n bw_csv=$out/sweep_bw.csv lat_csv=$out/sweep_lat.csv line
  echo "series,size_bytes,GBps" >"$bw_csv"
  echo "series,size_bytes,us" >"$lat_csv"
  # Flat ceilings measured above.
  for s in "${sweep_sizes[@]}"; do
    echo "UDP GSO+GRO ceiling ($size_4096 B datagrams),$s,$(get "lo:udp_gso:$size_4096")" >>"$bw_csv"
    echo "UDP sendmmsg ceiling ($size_4096 B datagrams),$s,$(get "lo:udp_mmsg:$size_4096")" >>"$bw_csv"
  done
  # UDP busy-poll ping-pong per size (one datagram: sizes up to 65507 B).
  next_port
  if server_limit=900 start_server "sweep.udp_ceiling" udp "$port" "${S[@]}" "$ceiling" server -p "$port" -W 10; then
    for s in "${sweep_sizes[@]}"; do
      ((s <= 65507)) || continue
      say "sweep: UDP ping-pong $s B"
      run "$logs/udp.out" 60 "${C[@]}" "$ceiling" client "$srv_addr" -p "$port" -m poll -s "$s" -n 5000 -w 500 || true
      line=$(tail -1 "$logs/udp.out")
      cat "$logs/udp.out" >>"$logs/sweep.udp_ceiling.client.log"
      echo "UDP ping-pong busy-poll,$s,$(kv "$line" typical_us)" >>"$lat_csv"
    done
    stop "$server_pid" || true
  fi
  if command -v ib_write_bw >/dev/null; then
    for s in "${sweep_sizes[@]}"; do
      perftest_bw ib_write_bw "$s" "$(clamp $((sweep_bytes / s)) 32 20000)"
      echo "uroce ib_write_bw,$s,$(get "sweep:ib_write_bw:$s")" >>"$bw_csv"
    done
    for s in "${sweep_sizes[@]}"; do
      n=$(clamp $((sweep_bytes / 16 / s)) 50 5000)
      perftest_lat ib_send_lat "$s" "$n"
      echo "uroce ib_send_lat,$s,$(get "sweep:ib_send_lat:$s")" >>"$lat_csv"
      perftest_lat ib_write_lat "$s" "$n"
      echo "uroce ib_write_lat,$s,$(get "sweep:ib_write_lat:$s")" >>"$lat_csv"
    done
  fi
  if ((${PEERS:-1})) && command -v ucx_perftest >/dev/null; then
    local batch=$logs/sweep.ucx.batch
    : >"$batch"
    for s in "${sweep_sizes[@]}"; do
      n=$(clamp $((sweep_bytes / s)) 100 100000)
      echo "bw$s -t tag_bw -s $s -n $n -w $((n / 10))" >>"$batch"
      n=$(clamp $((sweep_bytes / 16 / s)) 100 10000)
      echo "lat$s -t tag_lat -s $s -n $n -w $((n / 10))" >>"$batch"
    done
    if ucx_batch sweep.ucx "$batch"; then
      for s in "${sweep_sizes[@]}"; do
        echo "UCX tag_bw (TCP),$s,$(ucx_get "$logs/sweep.ucx.client.log" "bw$s" 7)" >>"$bw_csv"
        echo "UCX tag_lat (TCP),$s,$(ucx_get "$logs/sweep.ucx.client.log" "lat$s" 3)" >>"$lat_csv"
      done
    fi
  fi
  if ((${PEERS:-1})) && command -v fi_pingpong >/dev/null; then
    for s in "${sweep_sizes[@]}"; do
      fi_pp "sweep.fi_pingpong.$s" "$s" "$(clamp $((sweep_bytes / 8 / s)) 20 5000)"
      echo "libfabric tcp ping-pong,$s,$fi_bw" >>"$bw_csv"
      echo "libfabric tcp ping-pong,$s,$fi_lat" >>"$lat_csv"
    done
  fi
  # Debian's matplotlib is /usr/bin/python3's; a python3 earlier in PATH (pyenv, venv) may lack it.
  local py=""
  for py in /usr/bin/python3 python3 ""; do
    [[ -z $py ]] || ! "$py" -c 'import matplotlib' 2>/dev/null || break
  done
  if [[ -n $py ]]; then
    "$py" "$root/bench/plot.py" --bw "$bw_csv" --lat "$lat_csv" --outdir "$out" \
      --title "$(uname -n), $(nproc) CPUs, loopback, uroce MTU $active_lo_mtu" >&2 ||
      say "plot.py failed"
  else
    say "python3-matplotlib not installed: no plots (the CSV files are there)"
  fi
}

# ---------------------------------------------------------------------------------------
# Locations.

at_loopback() {
  loc=lo loc_title="loopback: 127.0.0.1, server on CPU 1, client on CPU 0"
  srv_ns='' cli_ns='' srv_addr=127.0.0.1
  S=(taskset -c 1) C=(taskset -c 0)
  uroce_env=(UROCE_MTU=4096 UROCE_SHM=0) mtu_note="UROCE_MTU=4096, UROCE_SHM=0: over UDP"
  ucx_env_s=(UCX_NET_DEVICES=lo) ucx_env_c=(UCX_NET_DEVICES=lo)
  probe_uroce 127.0.0.1
  active_lo_mtu=$active_mtu lo_gid=$gid
  measure_location
  print_location
}

# uroce's same-host path against libfabric's shm provider, ROUNDS times (default 3):
# ib_send_lat 64 B against fi_pingpong 64 B and ib_write_bw 1 MiB against fi_pingpong
# 1 MiB, uroce first in odd rounds and libfabric first in even ones, so that each round's
# two figures come from the same minutes. R[shm#K:h2h_*] are round K's figures, R[shm:h2h_*]
# their medians; the acceptance rows take the median of the rounds' own ratios.
measure_shm_rounds() {
  local k key v
  for ((k = 1; k <= rounds; k++)); do
    say "$loc: against libfabric shm, round $k of $rounds"
    if ((k % 2)); then
      h2h_uroce "$k"
      h2h_libfabric "$k"
    else
      h2h_libfabric "$k"
      h2h_uroce "$k"
    fi
  done
  for key in h2h_send_lat h2h_fi_lat h2h_write_bw h2h_fi_bw; do
    if v=$(rounds_median "$key"); then put "$loc:$key" "$v"; else put "$loc:$key" failed; fi
  done
}
h2h_uroce() { # ROUND
  run_tag=h2h$1 perftest_lat ib_send_lat 64 "$lat_iters"
  run_tag=h2h$1 perftest_bw ib_write_bw 1048576 "$bw_iters_1m"
  put "$loc#$1:h2h_send_lat" "$(get "$loc:ib_send_lat:64:h2h$1")"
  put "$loc#$1:h2h_send_lat_avg" "$(get "$loc:ib_send_lat:64:h2h$1:avg")"
  put "$loc#$1:h2h_write_bw" "$(get "$loc:ib_write_bw:1048576:h2h$1")"
}
h2h_libfabric() { # ROUND
  fi_pp "$loc.fi_pingpong_shm.64.h2h$1" 64 "$fi_lat_iters" shm rdm
  put "$loc#$1:h2h_fi_lat" "$fi_lat"
  fi_pp "$loc.fi_pingpong_shm.1048576.h2h$1" 1048576 "$fi_iters_1m" shm rdm
  put "$loc#$1:h2h_fi_bw" "$fi_bw"
}
h2h_note() { # KEY_A KEY_B UNIT: each round's ratio and figures, for an acceptance row
  local k a="" b="" rr
  for ((k = 1; k <= rounds; k++)); do
    a+="$(fmt "$(get "$loc#$k:$1")" 2), "
    b+="$(fmt "$(get "$loc#$k:$2")" 2), "
  done
  rr=$(round_ratios "$1" "$2")
  echo "${rr:+$rr; }uroce ${a%, }, libfabric ${b%, } $3"
}

# The same two processes on loopback with uroce's same-host path (shared memory, the
# default): beside the UDP path's figures of the loopback half.
at_same_host() {
  loc=shm loc_title="same host: 127.0.0.1 through uroce's same-host path (the default), not pinned"
  srv_ns='' cli_ns='' srv_addr=127.0.0.1 gid=$lo_gid
  # Not pinned: a large same-host transfer uses two CPUs (a stream of WRITEs/SENDs: the
  # sender copies into shared memory while the target's thread copies out; a lone
  # WRITE/READ: host/copy_helper.h), which a client confined to one CPU cannot do.
  S=() C=()
  uroce_env=(UROCE_MTU=4096) mtu_note="UROCE_MTU=4096"
  measure_copy_ceiling 1
  measure_uroce
  # The same-host target, ib_write_bw 1 MiB, twice more (the first ran in measure_uroce), each
  # after a ceiling run; the target is set against the median of the three.
  local k
  for k in 2 3; do
    measure_copy_ceiling "$k"
    run_tag=run$k perftest_bw ib_write_bw 1048576 "$bw_iters_1m"
  done
  put "shm:ib_write_bw:1048576:run1" "$(get shm:ib_write_bw:1048576)"
  put "shm:ib_write_bw:1048576:median" "$(median "$(get shm:ib_write_bw:1048576:run1)" \
    "$(get shm:ib_write_bw:1048576:run2)" "$(get shm:ib_write_bw:1048576:run3)")"
  put "shm:copy_ceiling:median" "$(median "$(get shm:copy_ceiling:1)" "$(get shm:copy_ceiling:2)" \
    "$(get shm:copy_ceiling:3)")"
  local h2h=0
  if ((${PEERS:-1})) && command -v fi_pingpong >/dev/null && command -v ib_send_lat >/dev/null; then
    h2h=1
    measure_shm_rounds
  fi
  local mode
  for mode in line message acked; do measure_ring_floor "$mode"; done
  emit ""
  emit "== $loc_title =="
  emit "uroce: GID index $gid, $(paths_used), packets through shared memory: $(same_host_packets) (of them jumbo packets: $(jumbo_packets)), WRITEs/READs placed directly: $(placed_ops)"
  emit "$(printf '  %-40s %9s %4s | %-51s | %s' "" measured "" reference ratio)"
  local prog s label
  for prog in ib_write_bw ib_send_bw ib_read_bw; do
    for s in 4096 65536 1048576; do
      case $s in 4096) label="4 KiB" ;; 65536) label="64 KiB" ;; *) label="1 MiB" ;; esac
      row "$prog $label" "$(get "shm:$prog:$s")" GB/s "the same over UDP (loopback)" "$(get "lo:$prog:$s")" \
        "$(rexmit_note "shm:$prog:$s")"
    done
  done
  local q
  for q in 8 64; do
    row "ib_write_bw 1 MiB -q $q (aggregate)" "$(get "shm:ib_write_bw:1048576:-q$q")" GB/s "the same over UDP (loopback)" \
      "$(get "lo:ib_write_bw:1048576:-q$q")"
  done
  for prog in ib_send_bw ib_read_bw; do
    row "$prog 1 MiB -q 64 (aggregate)" "$(get "shm:$prog:1048576:-q64")" GB/s "the same over UDP (loopback)" \
      "$(get "lo:$prog:1048576:-q64")"
  done
  for prog in ib_send_lat ib_write_lat ib_read_lat; do
    label="$prog 64 B t_typical"
    [[ $prog != ib_read_lat ]] || label+=" (RTT)"
    row "$label" "$(get "shm:$prog:64")" µs "the same over UDP (loopback)" "$(get "lo:$prog:64")" \
      "99 %: $(fmt "$(get "shm:$prog:64:p99")" 2) µs"
  done
  local runs
  runs="runs: $(fmt "$(get shm:ib_write_bw:1048576:run1)" 2), $(fmt "$(get shm:ib_write_bw:1048576:run2)" 2), $(fmt "$(get shm:ib_write_bw:1048576:run3)" 2) GB/s"
  row "ib_write_bw 1 MiB, median of three runs" "$(get shm:ib_write_bw:1048576:median)" GB/s \
    "copy ceiling (median of three)" "$(get shm:copy_ceiling:median)" "$runs"
  row "copy ceiling: 2 threads, 256 KiB chunks" "$(get shm:copy_ceiling:median)" GB/s "" "" \
    "runs: $(fmt "$(get shm:copy_ceiling:1)" 2), $(fmt "$(get shm:copy_ceiling:2)" 2), $(fmt "$(get shm:copy_ceiling:3)" 2) GB/s (bench/copy_ceiling)"
  if ((h2h)); then
    row "libfabric shm fi_pingpong 1 MiB" "$(get shm:h2h_fi_bw)" GB/s "uroce ib_write_bw 1 MiB" \
      "$(get shm:h2h_write_bw)" "(a ping-pong: one message in flight; rounds below)"
    row "libfabric shm fi_pingpong 64 B" "$(get shm:h2h_fi_lat)" µs "uroce ib_send_lat 64 B" "$(get shm:h2h_send_lat)" \
      "(rounds below)"
  fi
  row "ring floor: a cache line each way" "$(get shm:ring_floor:line)" µs "" "" "(ring_floor -m line)"
  row "ring floor: a record per message" "$(get shm:ring_floor:message)" µs "libfabric shm fi_pingpong 64 B" \
    "$(get shm:h2h_fi_lat)" "(64 B; -m message)"
  row "ring floor: a record and an ACK" "$(get shm:ring_floor:acked)" µs "uroce ib_send_lat 64 B" \
    "$(get shm:ib_send_lat:64)" "(an RC SEND's records; -m acked)"
  emit ""
  emit "Targets: uroce against its peers and ceilings on this host (the same-host path carries loopback traffic)"
  target "ib_send_lat 64 B / UDP busy-poll one-way floor" "$(get "shm:ib_send_lat:64")" "$(get "lo:udp_poll:64")" "<=" 1.25
  target "ib_write_lat 64 B / UCX tag_lat 64 B" "$(get "shm:ib_write_lat:64")" "$(get "lo:ucx_tag_lat:64")" "<=" 1
  target "ib_read_lat 64 B / UCX tag_lat 64 B" "$(get "shm:ib_read_lat:64")" "$(get "lo:ucx_tag_lat:64")" "<=" 1
  emit "Same-host targets (absolute)"
  target "ib_write_bw 1 MiB (median of three runs) / 20 GB/s" "$(get "shm:ib_write_bw:1048576:median")" 20 ">=" 1
  target "ib_send_lat 64 B / 2 µs" "$(get "shm:ib_send_lat:64")" 2 "<=" 1
  ((h2h)) || return 0
  emit "Same-host targets against libfabric's shm provider ($rounds rounds, uroce and libfabric alternated; each ratio the median of the rounds' own)"
  target_ratio "ib_send_lat 64 B / libfabric shm fi_pingpong 64 B" "$(accept_ratio h2h_send_lat h2h_fi_lat)" "<=" 1 \
    "$(h2h_note h2h_send_lat h2h_fi_lat µs)"
  target_ratio "ib_write_bw 1 MiB / libfabric shm fi_pingpong 1 MiB" "$(accept_ratio h2h_write_bw h2h_fi_bw)" ">=" 1 \
    "$(h2h_note h2h_write_bw h2h_fi_bw GB/s)"
  # fi_pingpong prints a mean (usec/xfer), perftest's t_typical is a median: the row above
  # follows each tool's own figure; this one sets mean against mean (not a target).
  target_ratio "ib_send_lat 64 B mean (t_avg) / fi_pingpong 64 B (a mean)" \
    "$(accept_ratio h2h_send_lat_avg h2h_fi_lat)" - - "$(h2h_note h2h_send_lat_avg h2h_fi_lat µs)"
}

same_host_packets() { # packets uroce sent through shared memory (UROCE_STATS) in this location's logs
  cat "$logs/$loc".ib_*.log 2>/dev/null | grep -o 'same_host_out [0-9]*' | awk '{ n += $2 } END { print n + 0 }'
}
jumbo_packets() { # same-host jumbo packets (large SEND/WRITE streams, UROCE_STATS) in this location's logs
  cat "$logs/$loc".ib_*.log 2>/dev/null | grep -o 'same_host_jumbo [0-9]*' | awk '{ n += $2 } END { print n + 0 }'
}
placed_ops() { # WRITEs and READs placed directly (UROCE_STATS) in this location's logs
  cat "$logs/$loc".ib_*.log 2>/dev/null | grep -o 'placed_\(writes\|reads\) [0-9]*' | awk '{ n += $2 } END { print n + 0 }'
}

at_namespaces() {
  loc=netns
  if ((EUID != 0)) || ! command -v ip >/dev/null; then
    emit ""
    emit "== namespaces: skipped (needs root and iproute2) =="
    return
  fi
  local ns_s=uroce-bench-s-$$ ns_c=uroce-bench-c-$$ veth_s=ubs$$ veth_c=ubc$$
  veth_s=${veth_s:0:15} veth_c=${veth_c:0:15}
  if ! ip netns add "$ns_s" 2>/dev/null; then
    emit ""
    emit "== namespaces: skipped (cannot create network namespaces here) =="
    return
  fi
  namespaces+=("$ns_s")
  ip netns add "$ns_c"
  namespaces+=("$ns_c")
  ip link add "$veth_s" type veth peer name "$veth_c"
  ip link set "$veth_s" netns "$ns_s"
  ip link set "$veth_c" netns "$ns_c"
  ip -n "$ns_s" addr add 10.233.7.1/24 dev "$veth_s"
  ip -n "$ns_c" addr add 10.233.7.2/24 dev "$veth_c"
  ip -n "$ns_s" link set "$veth_s" mtu 9000 up
  ip -n "$ns_c" link set "$veth_c" mtu 9000 up
  ip -n "$ns_s" link set lo up
  ip -n "$ns_c" link set lo up
  loc_title="namespaces: 10.233.7.1 ($ns_s) <- veth MTU 9000 -> 10.233.7.2 ($ns_c), server on CPU 1, client on CPU 0"
  srv_ns=$ns_s cli_ns=$ns_c srv_addr=10.233.7.1
  S=(ip netns exec "$ns_s" taskset -c 1) C=(ip netns exec "$ns_c" taskset -c 0)
  uroce_env=() mtu_note="from the veth's MTU 9000"
  ucx_env_s=(UCX_NET_DEVICES="$veth_s") ucx_env_c=(UCX_NET_DEVICES="$veth_c")
  probe_uroce 10.233.7.1
  measure_location
  print_location
}

main() {
  ensure_packages
  ensure_built
  mkdir -p "$out"
  logs=$out/logs
  rm -rf "$logs"
  mkdir -p "$logs"
  : >"$out/table.txt"
  echo "location,metric,size_bytes,value,unit,reference,reference_value,ratio" >"$out/results.csv"
  local start=$SECONDS
  emit "uroce comparison on $(uname -n): $(nproc) CPUs, Linux $(uname -r), $(date -u '+%Y-%m-%d %H:%M UTC')"
  emit "uroce: $build ($(git -C "$root" describe --always --dirty 2>/dev/null || echo '?'))"
  emit "GB/s = 1e9 B/s; latencies in µs, one way (RTT/2) except ib_read_lat (a READ's round trip, as perftest reports)"
  at_loopback
  ((${SHM:-1})) && at_same_host
  if ((${NETNS:-1})); then
    at_namespaces
  else
    emit ""
    emit "== namespaces: NETNS=0: skipped =="
  fi
  # The sweeps run on loopback, like its half of the table.
  loc=sweep S=(taskset -c 1) C=(taskset -c 0) srv_ns='' cli_ns='' srv_addr=127.0.0.1 gid=$lo_gid
  uroce_env=(UROCE_MTU=4096 UROCE_SHM=0) ucx_env_s=(UCX_NET_DEVICES=lo) ucx_env_c=(UCX_NET_DEVICES=lo)
  sweep
  emit ""
  emit "Took $((SECONDS - start)) s. Results: $out/ (table.txt, results.csv, sweep_*.csv, *.png, logs/)"
}

# One line: bash has read all of it before main starts, so editing this file while it runs
# cannot make bash read on into the edited text.
main "$@"; exit $?
