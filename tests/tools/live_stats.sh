#!/usr/bin/env bash
# `uroce stats` reads the counters of running processes.
#
#   live_stats.sh LAUNCHER TCP_PORT
#
# Receive: an unmodified ib_write_bw pair (perftest, 64 KiB WRITEs for up to 30 s) on
#          127.0.0.1, each under `uroce run`.
# Expect:  while both run, `uroce stats PID` shows each one's device and its RC QP connected
#          to the other's QPN; the client's QP counters move between two reads (WRITEs
#          placed directly on the same host, or packets sent with UROCE_SHM=0), and the
#          port's totals are at least the QP's. After both are killed: `uroce stats PID` and
#          `uroce stats` fail (exit 1) and the dead processes' counters files are gone (the
#          reader removes them). With UROCE_LIVE_STATS=0 a running process publishes nothing.
set -euo pipefail
launcher=$1 port=$2
export UROCE_STATS_DIR=$(mktemp -d /tmp/uroce-live-stats.XXXXXX)
pids=() # the programs themselves (env and uroce run exec them); the trap stops them
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$UROCE_STATS_DIR"
}
trap cleanup EXIT
fail() { echo "live_stats: FAIL: $*" >&2; exit 1; }

start_pair() { # ENV...: starts server and client with the extra environment
  env "$@" "$launcher" run ib_write_bw -x 0 -p "$port" -s 65536 -D 30 >/dev/null 2>&1 &
  pids+=($!) server=$!
  for _ in $(seq 100); do grep -q ":$(printf '%04X' "$port") 00000000:0000 0A" /proc/net/tcp && break; sleep 0.05; done
  env "$@" "$launcher" run ib_write_bw -x 0 -p "$port" -s 65536 -D 30 127.0.0.1 >/dev/null 2>&1 &
  pids+=($!) client=$!
}

moved() { # QP LINES: packets sent plus WRITEs placed
  echo $(($(field sent_pkts "$1") + $(field placed_ops "$1")))
}

field() { # NAME TEXT: the first value of counter NAME in TEXT
  grep -o "$1 [0-9]*" <<<"$2" | head -1 | awk '{ print $2 }'
}

qp_block() { # STATS: the lines of the first QP
  awk '/^  qp /{ on = 1 } on' <<<"$1"
}

start_pair
# Wait (bounded) until the client's QP has sent something.
for _ in $(seq 200); do
  out=$("$launcher" stats "$client" 2>/dev/null || true)
  qp=$(qp_block "$out")
  [[ -n $qp && $(moved "$qp") -gt 0 ]] 2>/dev/null && break
  sleep 0.05
done
echo "$out"
[[ $out == *"uroce0 pid $client "* ]] || fail "no device of pid $client"
grep -Eq '^  qp 0x[0-9a-f]{6} RC RTS -> 0x[0-9a-f]{6}:$' <<<"$qp" || fail "no RC QP in RTS"
moved1=$(moved "$qp")
((moved1 > 0)) || fail "QP counters not counting"
sleep 0.3
out2=$("$launcher" stats "$client")
qp2=$(qp_block "$out2")
moved2=$(moved "$qp2")
((moved2 > moved1)) || fail "counters did not advance: $moved1 -> $moved2 packets sent + WRITEs placed"
# Counters are read one by one (no snapshot): the port's totals follow the QP's a moment
# later, so compare the QP's from this read with the port's from a later one.
port_moved=$(moved "$("$launcher" stats "$client")")
((port_moved >= moved2)) || fail "port totals $port_moved < the QP's $moved2 of an earlier read"

# The server's QP is connected to the client's and the other way round.
client_qpn=$(grep -Eo '^  qp 0x[0-9a-f]+' <<<"$qp2" | awk '{ print $2 }')
server_out=$("$launcher" stats "$server")
grep -q -- "-> $client_qpn:" <<<"$server_out" || fail "server's QP not connected to $client_qpn"
# Without a PID, both processes are listed.
all=$("$launcher" stats)
[[ $all == *"pid $client "* && $all == *"pid $server "* ]] || fail "uroce stats does not list both"

kill -9 "$server" "$client"
wait "$server" "$client" 2>/dev/null || true
pids=() # the programs themselves (env and uroce run exec them); the trap stops them
if "$launcher" stats "$client" 2>/dev/null; then fail "stats of a dead process"; fi
if "$launcher" stats 2>/dev/null; then fail "stats lists dead processes"; fi
left=$(find "$UROCE_STATS_DIR" -name 'uroce-stats-*' | wc -l)
((left == 0)) || fail "$left counters files left after the processes died"

start_pair UROCE_LIVE_STATS=0
sleep 0.5
if "$launcher" stats "$client" 2>/dev/null; then fail "UROCE_LIVE_STATS=0 still published"; fi
echo "live_stats: PASSED"
