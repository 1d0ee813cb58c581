#!/usr/bin/env bash
# bench/noncontig.sh — the non-contiguous transfer study in one command:
# N buffers of S bytes moved by one WR with an N-entry SGL, by a CPU pack (+ unpack) around
# one WR, or by N WRs, for RDMA WRITE, RDMA READ and SEND/RECV (bench/noncontig.cc says how
# each method works; docs/noncontig.md what the figures show).
#
#   bench/noncontig.sh            (builds build/ when needed; about 2 minutes on 2 cores)
#
# Runs bench/noncontig under `uroce run` (client and server as two processes on this host,
# uroce's default same-host path): N = 1, 2, 4, ... up to the device's max_sge, S = 8 B ..
# 1 MiB. Then a subset over UDP (UROCE_SHM=0). Prints the tables and the crossovers (for each
# family and N, the S where SGL and pack swap places), writes into OUT:
#   noncontig.csv, noncontig_table.txt, noncontig_crossovers.csv,
#   noncontig_{write,read,send}_{bw,lat}.png            (same-host path)
#   udp_noncontig.csv, udp_noncontig_table.txt, ...     (UDP path, the subset)
# Figures are printed, never asserted; the exit status is non-zero if the harness failed or
# a destination byte was wrong.
#
# Environment:
#   BUILD_DIR   build to use (default build/)      OUT   output dir (default build/bench-noncontig)
#   PORT        TCP control port (default 18995)   UDP=0 skip the UDP subset
#   ARGS        extra arguments for noncontig, e.g. ARGS="--ns 1,8 --tput-ms 100"
#   UDP_ARGS    the UDP subset (default "--ns 1,8,32 --sizes 32,4096,1048576")
#   RUN_TIMEOUT seconds per noncontig run (default 600)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
[[ $build == /* ]] || build=$PWD/$build
out=${OUT:-$build/bench-noncontig}
[[ $out == /* ]] || out=$PWD/$out
port=${PORT:-18995}
limit=${RUN_TIMEOUT:-600}
read -ra extra <<<"${ARGS:-}"
read -ra udp_args <<<"${UDP_ARGS:---ns 1,8,32 --sizes 32,4096,1048576}"

say() { printf 'noncontig: %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

if [[ ! -e $build/CMakeCache.txt ]]; then
  say "configuring $build"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
fi
say "building uroce, its launcher and noncontig in $build"
cmake --build "$build" -j"${JOBS:-2}" --target uroce uroce_launcher noncontig >&2
prog=$build/bin/noncontig
[[ -x $prog && -x $build/bin/uroce ]] || die "$prog or $build/bin/uroce missing after the build"
mkdir -p "$out"

# study NAME ENV... -- ARGS...: one run into OUT/NAME.csv (stderr to OUT/NAME.log).
status=0
study() {
  local name=$1 envs=() rc=0
  shift
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  say "running noncontig $* > $out/$name.csv (progress in $name.log)"
  env ${envs[@]+"${envs[@]}"} timeout -k 5 "$limit" "$build/bin/uroce" run -- "$prog" --port "$port" "$@" \
    >"$out/$name.csv" 2>"$out/$name.log" || rc=$?
  if ((rc != 0)); then
    say "$name: noncontig exited with $rc:"
    tail -5 "$out/$name.log" >&2
    status=1
  fi
  port=$((port + 1))
}

study noncontig -- ${extra[@]+"${extra[@]}"}
[[ ${UDP:-1} == 0 ]] || study udp_noncontig UROCE_SHM=0 -- "${udp_args[@]}" ${extra[@]+"${extra[@]}"}

# Debian's matplotlib is /usr/bin/python3's; a python3 earlier in PATH (pyenv, venv) may lack it.
py=python3 plot_args=(--no-plots)
for p in /usr/bin/python3 python3; do
  if "$p" -c 'import matplotlib' 2>/dev/null; then py=$p plot_args=(); break; fi
done
((${#plot_args[@]} == 0)) || say "python3-matplotlib not installed: tables only, no plots"
"$py" "$root/bench/noncontig_plot.py" "$out/noncontig.csv" "$out" --label "same-host path" \
  ${plot_args[@]+"${plot_args[@]}"} || status=1
if [[ ${UDP:-1} != 0 && -s $out/udp_noncontig.csv ]]; then
  "$py" "$root/bench/noncontig_plot.py" "$out/udp_noncontig.csv" "$out" --label "UDP path, UROCE_SHM=0" \
    --prefix udp_noncontig_ ${plot_args[@]+"${plot_args[@]}"} || status=1
fi
say "results in $out"
exit $status
