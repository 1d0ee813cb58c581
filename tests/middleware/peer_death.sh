#!/usr/bin/env bash
# A middleware peer dies mid-run (bad input): the survivor must fail with the
# middleware's own error within a bounded time, never hang.
#
#   peer_death.sh --launcher PATH --port PORT --outdir DIR ucx
#       ucx_perftest tag_lat (rc_verbs, endpoints with error handling: -e; UCX keepalive
#       every second, its UD peer timeout 5 s) between two processes; the server is
#       SIGKILLed once the client is running; the client must report UCX's "Endpoint
#       timeout" within 30 s. (ucx_perftest itself keeps waiting after that error: the
#       script then stops it.)
#   peer_death.sh --launcher PATH --port PORT --outdir DIR mpi MPI_CHECK
#       mpirun -np 2 (pml ucx over uroce) running MPI_CHECK for a long time; rank 1 is
#       SIGKILLed; mpirun must exit non-zero, saying so, within 30 s.
# Every process started here is killed when the script exits.
set -euo pipefail
launcher='' port='' outdir=.
while [[ $1 == --* ]]; do
  case $1 in
    --launcher) launcher=$2 ;;
    --port) port=$2 ;;
    --outdir) outdir=$2 ;;
    *) echo "peer_death: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
mode=${1:?mode: ucx or mpi}
limit=$((30 * ${UROCE_TIMEOUT_SCALE:-1}))
mkdir -p "$outdir"
pids=() # cleanup kills each one, and its process group where it leads one (setsid)
watchdog=''
cleanup() {
  for p in ${pids[@]+"${pids[@]}"}; do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true; done
  if [[ -n $watchdog ]]; then pkill -KILL -P "$watchdog" 2>/dev/null || true; kill -KILL "$watchdog" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 124' TERM
# A watchdog inside ctest's 120 s: if the script has no verdict by then, it says what is still
# running (a ctest timeout shows nothing) and stops the script. The waits above it add up to
# at most 30 + 1 + limit s (91 at UROCE_TIMEOUT_SCALE=2).
deadline=100
(
  sleep "$deadline"
  echo "peer_death: no verdict after $deadline s; still running:"
  ps -eo pid,ppid,pgid,stat,etime,args | grep -E 'mpirun|mpi_check|ucx_perftest|prterun|orted|peer_death' | grep -v grep
  for f in "$outdir"/peer_death.*.log; do echo "--- tail of $f"; tail -c 2000 "$f"; done
  kill -TERM $$
) &
watchdog=$!

# wait_for FILE REGEX SECONDS: until a line of FILE matches (0) or the time is up (1).
wait_for() {
  local end=$((SECONDS + $3))
  while ((SECONDS < end)); do
    grep -Eq "$2" "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

case $mode in
  ucx)
    export UCX_TLS=rc_verbs,ud_verbs,self UCX_NET_DEVICES=uroce0:1 UCX_KEEPALIVE_INTERVAL=1s UCX_UD_TIMEOUT=5s
    slog=$outdir/peer_death.ucx.server.log clog=$outdir/peer_death.ucx.client.log
    setsid "$launcher" run ucx_perftest -p "$port" -e >"$slog" 2>&1 &
    server=$!
    pids+=("$server")
    # a LISTEN (state 0A) socket on the port in /proc/net/tcp
    wait_for /proc/net/tcp "$(printf ': [0-9A-F]+:%04X [0-9A-F]+:[0-9A-F]+ 0A ' "$port")" 10 ||
      { echo "peer_death: server not listening"; exit 1; }
    setsid "$launcher" run ucx_perftest 127.0.0.1 -p "$port" -e -t tag_lat -n 1000000000 >"$clog" 2>&1 &
    pids+=("$!")
    wait_for "$clog" '^\[thread 0\]' 20 || { echo "peer_death: client made no progress"; cat "$clog"; exit 1; }
    kill -KILL -- "-$server" 2>/dev/null || kill -KILL "$server"
    echo "peer_death: ucx server killed; waiting for the client's error"
    if wait_for "$clog" 'UCX +ERROR.*(Endpoint timeout|[Tt]ransport retry|Connection reset)' "$limit"; then
      grep -E 'UCX +ERROR' "$clog" | head -3
      echo "peer_death: ucx: passed"
      exit 0
    fi
    echo "peer_death: ucx: no error from the survivor within $limit s"; tail -5 "$clog"; exit 1 ;;
  mpi)
    mpi_check=${2:?mpi mode needs the MPI program}
    log=$outdir/peer_death.mpi.log
    "$launcher" run mpirun --allow-run-as-root -np 2 --mca pml ucx --mca osc ucx --mca btl self \
      -x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_NET_DEVICES=uroce0:1 "$mpi_check" --rounds 100000000 >"$log" 2>&1 &
    mpirun=$!
    pids+=("$mpirun")
    wait_for "$log" 'rank 1 of 2: running' 30 || { echo "peer_death: mpi: rank 1 never ran"; cat "$log"; exit 1; }
    sleep 1 # well into the ping-pong
    rank1=$(pgrep -P "$mpirun" -f "$mpi_check" | tail -n 1 || true)
    [[ -n $rank1 ]] || rank1=$(pgrep -f "^$mpi_check" | tail -n 1 || true)
    [[ -n $rank1 ]] || { echo "peer_death: mpi: no rank left to kill (the job ended by itself)"; cat "$log"; exit 1; }
    pids+=($(pgrep -P "$mpirun" || true)) # the ranks, so that cleanup stops a survivor too
    kill -KILL "$rank1"
    echo "peer_death: mpi rank (pid $rank1) killed; waiting for mpirun"
    end=$((SECONDS + limit))
    while kill -0 "$mpirun" 2>/dev/null && ((SECONDS < end)); do sleep 0.2; done
    if kill -0 "$mpirun" 2>/dev/null; then echo "peer_death: mpirun still running after $limit s"; exit 1; fi
    rc=0
    wait "$mpirun" || rc=$?
    grep -q "exited on signal 9" "$log" || { echo "peer_death: mpirun did not report the killed rank"; cat "$log"; exit 1; }
    ((rc != 0)) || { echo "peer_death: mpirun exited 0"; exit 1; }
    echo "peer_death: mpi: mpirun exited with status $rc and reported the killed rank: passed" ;;
  *) echo "peer_death: unknown mode $mode" >&2; exit 2 ;;
esac
