#!/usr/bin/env bash
# Runs Debian's cmtime server and client under `uroce run` and prints the client's
# connection set-up figures.
#
#   run_cmtime.sh --launcher PATH --port PORT --connections N [--outdir DIR] [--timeout S]
#
# cmtime's server (rdma-core 44) never exits: it handles connections until it is
# killed. So the client must exit 0 and report every step, while the server must
# still be running (not crashed) when the client is done; it is then stopped.
set -euo pipefail

launcher= port= conns=200 outdir=. timeout_s=60
while (($#)); do
  case $1 in
    --launcher) launcher=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --connections) conns=$2; shift 2 ;;
    --outdir) outdir=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    *) echo "run_cmtime: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $launcher && -n $port ]] || { echo "run_cmtime: --launcher and --port are required" >&2; exit 2; }
mkdir -p "$outdir"
slog=$outdir/cmtime.server.log clog=$outdir/cmtime.client.log

# The UDP socket an rdma_cm id binds at its port (src/rdmacm/cm_address.cc), where
# engines pass the requests for it.
port_listening() {
  local hex
  hex=$(printf ':%04X' "$1")
  awk -v p="$hex" '$4 == "07" && substr($2, length($2) - 4) == p { found = 1 }
                   END { exit !found }' /proc/net/udp /proc/net/udp6 2>/dev/null
}

timeout -k 5 "$timeout_s" "$launcher" run -- cmtime -b 127.0.0.1 -p "$port" -c "$conns" >"$slog" 2>&1 &
server_pid=$!
trap 'kill -TERM $server_pid 2>/dev/null || true; wait $server_pid 2>/dev/null || true' EXIT

deadline=$((SECONDS + 20))
until port_listening "$port"; do
  kill -0 "$server_pid" 2>/dev/null || { echo "run_cmtime: server exited early"; cat "$slog"; exit 1; }
  ((SECONDS < deadline)) || { echo "run_cmtime: server not listening"; cat "$slog"; exit 1; }
  sleep 0.05
done

rc=0
timeout -k 5 "$timeout_s" "$launcher" run -- cmtime -s 127.0.0.1 -p "$port" -c "$conns" >"$clog" 2>&1 || rc=$?
cat "$clog"
if ((rc != 0)); then
  echo "run_cmtime: client exited with status $rc"; cat "$slog"; exit 1
fi
if ! kill -0 "$server_pid" 2>/dev/null; then
  echo "run_cmtime: the server died during the run"; cat "$slog"; exit 1
fi
for step in "create id" "resolve addr" "resolve route" "create qp" "connect" "disconnect" "destroy"; do
  grep -Eq "^$step *: +[0-9.]+" "$clog" || { echo "run_cmtime: no '$step' figure"; exit 1; }
done
if grep -Eq "error|failure|event: " "$clog" "$slog"; then
  echo "run_cmtime: errors reported"; cat "$slog"; exit 1
fi
echo "run_cmtime: passed"
