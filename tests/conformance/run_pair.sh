#!/usr/bin/env bash
# Runs a server and a client program (or N copies of the client), all under `uroce run`,
# and checks their results.
#
#   run_pair.sh [options] --server PROGRAM [ARGS...] --client PROGRAM [ARGS...]
#
# Options (before --server):
#   --name NAME            label; logs go to OUTDIR/NAME.server.log, OUTDIR/NAME.client.log
#                          (with --clients N > 1: OUTDIR/NAME.client.K.log, K = 1..N)
#   --clients N            start N copies of the client command together, each its own
#                          process (default 1); every client expectation and rejection
#                          applies to each copy's output
#   --outdir DIR           where the logs go (default: current directory)
#   --port PORT            the server's port (TCP or rdma_cm); the client starts only once the
#                          port is listening (checked in /proc/net/{tcp,udp}*, never by
#                          connecting: servers like ibv_rc_pingpong accept one connection)
#   --expect REGEX         both outputs must contain a line matching REGEX (grep -E);
#                          repeatable
#   --server-expect REGEX  only the server's output must match; repeatable
#   --client-expect REGEX  only the client's output must match; repeatable
#   --reject REGEX         neither output may contain a line matching REGEX; repeatable
#   --timeout SECONDS      limit for each program (default 60)
#   --launcher PATH        the uroce launcher (default: $UROCE_LAUNCHER, else
#                          build/bin/uroce of this repository)
#   --show                 print all outputs at the end, prefixed [server] / [client]
#                          ([client K] with several clients)
#
# Succeeds only if every program exits 0 within the time limit and every expectation holds.
# If a client fails, the other clients and the server get 5 s to finish, then are stopped.
# A server still running a quarter of the time limit (at least 20 s) after its clients
# ended is stuck: its threads' stacks (gdb, where installed) go to OUTDIR/NAME.server.stacks
# and to the failure's output, before the time limit stops it.
# Every process started here is stopped when the script exits, whatever the reason.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=pair
outdir=.
port=
timeout_s=60
launcher=${UROCE_LAUNCHER:-$here/../../build/bin/uroce}
show=0
nclients=1
both_expect=() server_expect=() client_expect=() reject=()
server_cmd=() client_cmd=()

die() { echo "run_pair: $*" >&2; exit 2; }

while (($#)); do
  case $1 in
    --name) name=$2; shift 2 ;;
    --outdir) outdir=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --expect) both_expect+=("$2"); shift 2 ;;
    --server-expect) server_expect+=("$2"); shift 2 ;;
    --client-expect) client_expect+=("$2"); shift 2 ;;
    --reject) reject+=("$2"); shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --clients) nclients=$2; shift 2 ;;
    --launcher) launcher=$2; shift 2 ;;
    --show) show=1; shift ;;
    --server)
      shift
      while (($#)) && [[ $1 != --client ]]; do server_cmd+=("$1"); shift; done ;;
    --client)
      shift
      while (($#)); do client_cmd+=("$1"); shift; done ;;
    *) die "unknown option '$1' (see the comment at the top of $0)" ;;
  esac
done
((${#server_cmd[@]})) || die "missing --server PROGRAM"
((${#client_cmd[@]})) || die "missing --client PROGRAM"
# Sanitizer builds run slower: scripts/sanitize.sh sets UROCE_TIMEOUT_SCALE (a whole factor).
[[ ${UROCE_TIMEOUT_SCALE:-1} =~ ^[1-9][0-9]*$ ]] || die "UROCE_TIMEOUT_SCALE must be a positive whole number"
timeout_s=$((timeout_s * ${UROCE_TIMEOUT_SCALE:-1}))
[[ -x $launcher ]] || die "launcher '$launcher' not found or not executable (build first, or set UROCE_LAUNCHER)"
[[ -z $port || $port =~ ^[0-9]+$ ]] || die "--port must be a number"
[[ $nclients =~ ^[1-9][0-9]*$ ]] || die "--clients must be a positive number"

mkdir -p "$outdir"
server_log=$outdir/$name.server.log
# client_logs[K-1], client_labels[K-1]: client K's log and name in messages.
client_logs=() client_labels=()
if ((nclients == 1)); then
  client_logs=("$outdir/$name.client.log")
  client_labels=(client)
else
  for ((k = 1; k <= nclients; k++)); do
    client_logs+=("$outdir/$name.client.$k.log")
    client_labels+=("client $k")
  done
fi
: >"$server_log"
for log in "${client_logs[@]}"; do : >"$log"; done

# client_pids[K-1]: client K's pid while it runs, '' once it has been waited for.
server_pid='' client_pids=()
cleanup() {
  local pid
  for pid in ${client_pids[@]+"${client_pids[@]}"} $server_pid; do
    [[ -n $pid ]] || continue
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  for pid in ${client_pids[@]+"${client_pids[@]}"} $server_pid; do
    [[ -n $pid ]] || continue
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Each program runs as `timeout -k 5 LIMIT uroce run -- PROGRAM...`, started directly
# (not through a function, so that $! is timeout's pid); timeout forwards a TERM to the
# program and sends KILL 5 s later if it lingers.

# Is port $1 listened on in this network namespace? A TCP socket listening on it
# (state 0A: the programs that swap their addresses over TCP), or a UDP socket
# bound to it: an rdma_cm id's port (src/rdmacm/cm_address.cc).
port_listening() {
  local hex
  hex=$(printf ':%04X' "$1")
  awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 }
                   END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
  awk -v p="$hex" '$4 == "07" && substr($2, length($2) - 4) == p { found = 1 }
                   END { exit !found }' /proc/net/udp /proc/net/udp6 2>/dev/null
}

show_logs() {
  local k
  sed 's/^/[server] /' "$server_log"
  for k in "${!client_logs[@]}"; do
    sed "s/^/[${client_labels[k]}] /" "${client_logs[k]}"
  done
}

fail() {
  local k
  echo "run_pair: $name: FAILED: $*" >&2
  if [[ -s ${stacks_log:-} ]]; then
    echo "--- the server outlived its clients by ${stuck_after}s; its stacks then:" >&2; cat "$stacks_log" >&2
  fi
  if ((!show)); then
    echo "--- server: ${server_cmd[*]}" >&2; cat "$server_log" >&2
    for k in "${!client_logs[@]}"; do
      echo "--- ${client_labels[k]}: ${client_cmd[*]}" >&2; cat "${client_logs[k]}" >&2
    done
    echo "---" >&2
  fi
  exit 1
}

echo "run_pair: $name: server: ${server_cmd[*]}"
timeout -k 5 "$timeout_s" "$launcher" run -- "${server_cmd[@]}" >"$server_log" 2>&1 &
server_pid=$!

if [[ -n $port ]]; then
  deadline=$((SECONDS + timeout_s))
  until port_listening "$port"; do
    kill -0 "$server_pid" 2>/dev/null || { wait "$server_pid" && rc=0 || rc=$?
      server_pid=; ((show)) && show_logs
      fail "server exited with status $rc before listening on TCP port $port"; }
    ((SECONDS < deadline)) || { ((show)) && show_logs
      fail "server not listening on port $port after ${timeout_s}s"; }
    sleep 0.05
  done
else
  sleep 1
fi

if ((nclients == 1)); then
  echo "run_pair: $name: client: ${client_cmd[*]}"
else
  echo "run_pair: $name: $nclients clients: ${client_cmd[*]}"
fi
for k in "${!client_logs[@]}"; do
  timeout -k 5 "$timeout_s" "$launcher" run -- "${client_cmd[@]}" >"${client_logs[k]}" 2>&1 &
  client_pids[k]=$!
done

# Wait for every client. Once one has failed, the others (which may wait for a server
# that waits for the failed one) get 5 s, then are stopped.
client_rcs=()
any_client_failed=0
grace_end=
while :; do
  running=0
  for k in "${!client_pids[@]}"; do
    pid=${client_pids[k]}
    [[ -n $pid ]] || continue
    if kill -0 "$pid" 2>/dev/null; then
      running=1
      continue
    fi
    rc=0; wait "$pid" || rc=$?
    client_rcs[k]=$rc
    client_pids[k]=
    if ((rc != 0)) && ((!any_client_failed)); then
      any_client_failed=1
      grace_end=$((SECONDS + 5))
    fi
  done
  ((running)) || break
  if ((any_client_failed && SECONDS >= grace_end)); then
    for pid in "${client_pids[@]}"; do
      [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null || true
    done
  fi
  sleep 0.05
done
if ((any_client_failed)); then
  # The server may wait for a peer that is gone: give it 5 s, then stop it.
  for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
  kill -TERM "$server_pid" 2>/dev/null || true
fi
# A stuck server's stacks, taken while it still runs (timeout would stop it unexamined).
stacks_log=$outdir/$name.server.stacks
rm -f "$stacks_log"
dump_server_stacks() {
  command -v gdb >/dev/null || { echo "(gdb not installed: no stacks)" >"$stacks_log"; return; }
  local pid
  for pid in $(pgrep -P "$server_pid" || true); do  # timeout's child: the program under uroce run
    echo "== pid $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)" >>"$stacks_log"
    timeout 30 gdb -p "$pid" -batch -ex "thread apply all bt" >>"$stacks_log" 2>&1 || true
  done
}
stuck_after=$((timeout_s / 4 > 20 ? timeout_s / 4 : 20))
stuck_at=$((SECONDS + stuck_after))
while kill -0 "$server_pid" 2>/dev/null; do
  if [[ ! -e $stacks_log ]] && ((SECONDS >= stuck_at)); then dump_server_stacks; fi
  sleep 0.1
done
server_rc=0; wait "$server_pid" || server_rc=$?
server_pid=

((show)) && show_logs

status_text() {
  case $1 in
    0) echo "0" ;;
    124) echo "124 (timed out after ${timeout_s}s)" ;;
    137) echo "137 (killed after not stopping on timeout)" ;;
    143) echo "143 (terminated)" ;;
    *) echo "$1" ;;
  esac
}
problems=()
((server_rc == 0)) || problems+=("server exited with status $(status_text "$server_rc")")
for k in "${!client_logs[@]}"; do
  ((client_rcs[k] == 0)) || problems+=("${client_labels[k]} exited with status $(status_text "${client_rcs[k]}")")
done

for re in ${both_expect[@]+"${both_expect[@]}"} ${server_expect[@]+"${server_expect[@]}"}; do
  grep -Eq -- "$re" "$server_log" || problems+=("server output has no line matching /$re/")
done
for re in ${both_expect[@]+"${both_expect[@]}"} ${client_expect[@]+"${client_expect[@]}"}; do
  for k in "${!client_logs[@]}"; do
    grep -Eq -- "$re" "${client_logs[k]}" || problems+=("${client_labels[k]} output has no line matching /$re/")
  done
done
for re in ${reject[@]+"${reject[@]}"}; do
  if grep -Eq -- "$re" "$server_log"; then problems+=("server output matches /$re/"); fi
  for k in "${!client_logs[@]}"; do
    if grep -Eq -- "$re" "${client_logs[k]}"; then problems+=("${client_labels[k]} output matches /$re/"); fi
  done
done

if ((${#problems[@]})); then
  fail "$(printf '%s; ' "${problems[@]}")"
fi
echo "run_pair: $name: passed"
