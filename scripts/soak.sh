#!/usr/bin/env bash
# Soak: a long RC transfer over a bad network, checking that neither
# process grows. Not part of CI.
#
#   scripts/soak.sh [--minutes N] [options]
#
# Runs Debian's perftest `ib_write_bw -q QPS --run_infinitely -D 5` server and client under
# `uroce run` on 127.0.0.1, both with UROCE_FAULT=loss=L,dup=L,reorder=L (seeded, a different
# seed per side), for N minutes. Every INTERVAL seconds it samples each process's resident
# set (VmRSS) and open file descriptors (/proc/PID/fd). After the warm-up it fails if
#   - either process's RSS rises above its value at the end of the warm-up by more than
#     RSS_TOL_KIB + RSS_TOL_PCT % of that value, or its fd count changes;
#   - either process dies, prints a completion error, or the client stops reporting
#     bandwidth (no new result row for 3 periods).
# With --stress, uroce's own rc_stress (every byte and completion verified) runs over and
# over beside it under the same faults, and any failed run fails the soak.
#
# Options:
#   --minutes N        duration (default 10)
#   --warmup S         seconds before the baseline is taken (default: 60, or a quarter of
#                      the run if shorter)
#   --interval S       sampling period (default 5)
#   --qps N            QPs (default 4)
#   --fault SPEC       UROCE_FAULT without the seed (default loss=0.01,dup=0.01,reorder=0.01)
#   --seed S           seed of the server's faults; the client's is S+1 (default 1)
#   --size BYTES       ib_write_bw message size (default 65536)
#   --port P           perftest's TCP port (default 18999)
#   --rss-tol-kib K    RSS tolerance, absolute part (default 4096)
#   --rss-tol-pct P    RSS tolerance, relative part (default 5)
#   --stress           also loop rc_stress (needs BUILD/bin/rc_stress)
#   --build DIR        build directory with bin/uroce (default build; e.g. build-asan)
#   --outdir DIR       logs and samples.csv (default BUILD/soak)
# Exit status: 0 passed, 1 failed, 2 usage or setup error.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

minutes=10 warmup= interval=5 qps=4 fault=loss=0.01,dup=0.01,reorder=0.01 seed=1
size=65536 port=18999 rss_tol_kib=4096 rss_tol_pct=5 stress=0 build=build outdir=

die() { echo "soak: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --minutes) minutes=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --qps) qps=$2; shift 2 ;;
    --fault) fault=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --rss-tol-kib) rss_tol_kib=$2; shift 2 ;;
    --rss-tol-pct) rss_tol_pct=$2; shift 2 ;;
    --stress) stress=1; shift ;;
    --build) build=$2; shift 2 ;;
    --outdir) outdir=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
for v in minutes interval qps seed size port rss_tol_kib rss_tol_pct; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "--${v//_/-} must be a whole number"
done
((minutes > 0 && interval > 0)) || die "--minutes and --interval must be positive"
duration=$((minutes * 60))
if [[ -z $warmup ]]; then
  warmup=$((duration / 4 < 60 ? duration / 4 : 60))
fi
[[ $warmup =~ ^[0-9]+$ ]] || die "--warmup must be a whole number"
launcher=$build/bin/uroce
[[ -x $launcher ]] || die "$launcher not found (build first: scripts/setup.sh)"
command -v ib_write_bw >/dev/null || die "ib_write_bw not found (Debian package perftest)"
if ((stress)); then
  [[ -x $build/bin/rc_stress ]] || die "$build/bin/rc_stress not found"
fi
outdir=${outdir:-$build/soak}
mkdir -p "$outdir"
server_log=$outdir/server.log client_log=$outdir/client.log
stress_log=$outdir/stress.log samples=$outdir/samples.csv

server_pid='' client_pid='' stress_pid=''
cleanup() {
  local pid
  for pid in $stress_pid $client_pid $server_pid; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in $stress_pid $client_pid $server_pid; do
    # Bounded: a process that ignores TERM for 10 s is killed.
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

common=(ib_write_bw -d uroce0 -x 0 -p "$port" -q "$qps" -s "$size" --run_infinitely -D "$interval")
echo "soak: $minutes min, $qps QPs, UROCE_FAULT=$fault, warm-up ${warmup}s, sampling every ${interval}s"
echo "soak: logs and samples in $outdir"

# `uroce run` execs the program, so $! is ib_write_bw's own pid.
UROCE_FAULT=$fault,seed=$seed "$launcher" run -- "${common[@]}" >"$server_log" 2>&1 &
server_pid=$!

port_listening() {
  local hex
  hex=$(printf ':%04X' "$1")
  awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 }
                   END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
for ((i = 0; i < 600; i++)); do
  port_listening "$port" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$server_log" >&2; die "server exited before listening"; }
  sleep 0.1
done
port_listening "$port" || die "server not listening on TCP port $port after 60 s"

UROCE_FAULT=$fault,seed=$((seed + 1)) "$launcher" run -- "${common[@]}" 127.0.0.1 >"$client_log" 2>&1 &
client_pid=$!

stress_runs=0 stress_failures=0
if ((stress)); then
  (
    child=''
    trap '[[ -n $child ]] && kill -TERM "$child" 2>/dev/null; exit 0' TERM
    n=0
    while :; do
      n=$((n + 1))
      UROCE_FAULT=$fault,seed=$((seed + 100 + n)) timeout 300 "$launcher" run -- \
        "$build/bin/rc_stress" --mib 64 --seed "$n" >>"$stress_log" 2>&1 &
      child=$!
      if wait "$child"; then
        echo "soak: rc_stress run $n passed" >>"$stress_log"
      else
        echo "soak: rc_stress run $n FAILED" >>"$stress_log"
      fi
      child=''
    done
  ) &
  stress_pid=$!
fi

# rss_kib PID / fd_count PID: empty if the process is gone.
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || true; }
fd_count() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
rows() { grep -cE '^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+' "$client_log" || true; }
bad_output() { grep -hE 'Completion with error|Couldn.t|Unable|failed|ERROR: |runtime error' "$server_log" "$client_log" || true; }

failures=()
echo "t_s,server_rss_kib,server_fds,client_rss_kib,client_fds,client_rows" >"$samples"
base_srss='' base_sfd='' base_crss='' base_cfd=''
max_srss=0 max_crss=0 last_rows=0 last_progress=0
start=$SECONDS
while ((SECONDS - start < duration)); do
  sleep "$interval"
  t=$((SECONDS - start))
  srss=$(rss_kib "$server_pid") crss=$(rss_kib "$client_pid")
  if [[ -z $srss || -z $crss ]]; then
    failures+=("$([[ -z $srss ]] && echo server || echo client) exited after ${t}s")
    break
  fi
  sfd=$(fd_count "$server_pid") cfd=$(fd_count "$client_pid") r=$(rows)
  echo "$t,$srss,$sfd,$crss,$cfd,$r" >>"$samples"
  ((r > last_rows)) && last_progress=$t
  last_rows=$r
  if ((t >= warmup)); then
    if [[ -z $base_srss ]]; then
      base_srss=$srss base_sfd=$sfd base_crss=$crss base_cfd=$cfd
      echo "soak: baseline at ${t}s: server RSS ${srss} KiB, $sfd fds; client RSS ${crss} KiB, $cfd fds"
    fi
    ((srss > max_srss)) && max_srss=$srss
    ((crss > max_crss)) && max_crss=$crss
    ((sfd == base_sfd)) || failures+=("server fds ${base_sfd} -> ${sfd} at ${t}s")
    ((cfd == base_cfd)) || failures+=("client fds ${base_cfd} -> ${cfd} at ${t}s")
  fi
  if ((t - last_progress > 3 * interval + 5)); then
    failures+=("client printed no result row for $((t - last_progress))s (at ${t}s)")
  fi
  bad=$(bad_output)
  [[ -z $bad ]] || failures+=("error output: $(head -n1 <<<"$bad")")
  if ((t % 60 < interval)); then
    echo "soak: ${t}s: server RSS ${srss} KiB $sfd fds, client RSS ${crss} KiB $cfd fds, $r result rows"
  fi
  ((${#failures[@]} == 0)) || break
done

# rss_limit BASE: the highest RSS (KiB) still within the tolerance.
rss_limit() { echo $(($1 + rss_tol_kib + $1 * rss_tol_pct / 100)); }
if [[ -n $base_srss ]]; then
  ((max_srss <= $(rss_limit "$base_srss"))) ||
    failures+=("server RSS grew ${base_srss} -> ${max_srss} KiB (limit $(rss_limit "$base_srss"))")
  ((max_crss <= $(rss_limit "$base_crss"))) ||
    failures+=("client RSS grew ${base_crss} -> ${max_crss} KiB (limit $(rss_limit "$base_crss"))")
elif ((${#failures[@]} == 0)); then
  failures+=("no sample after the warm-up")
fi
if ((stress)); then
  kill -TERM "$stress_pid" 2>/dev/null || true
  wait "$stress_pid" 2>/dev/null || true
  stress_pid=''
  stress_runs=$(grep -c '^soak: rc_stress run' "$stress_log" || true)
  stress_failures=$(grep -c '^soak: rc_stress run .* FAILED' "$stress_log" || true)
  echo "soak: rc_stress: $stress_runs runs finished, $stress_failures failed"
  ((stress_failures == 0)) || failures+=("$stress_failures rc_stress runs failed (see $stress_log)")
fi

echo "soak: server RSS ${base_srss:-?} -> max ${max_srss} KiB, client RSS ${base_crss:-?} -> max ${max_crss} KiB" \
  "after the warm-up; $last_rows result rows"
tail -n2 "$client_log" | awk '{ print "soak: client: " $0 }'
if ((${#failures[@]})); then
  printf 'soak: FAILED: %s\n' "${failures[@]}"
  exit 1
fi
echo "soak: passed"
