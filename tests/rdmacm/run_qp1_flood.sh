#!/usr/bin/env bash
# The CM under a flood: while qp1_flood sends the host's RoCE port junk,
# malformed CM MADs and CM MADs that name no connection (20,000 datagrams a
# second), rdma_cm connections between uroce processes (cm_test
# endpoint_pingpong) must still be made, used and closed; the process that owns
# the port must drop and count the junk, answer nothing but the REQs and
# SIDR_REQs (REJ / SIDR_REP), and still serve its own connection afterwards.
# The processes use a host port and host registry of their own (UROCE_PORT,
# UROCE_HOST_REGISTRY), so that the port's owner is known even when other
# tests run beside this one: an ibv_rc_pingpong server started first.
#
#   run_qp1_flood.sh --launcher UROCE --flood QP1_FLOOD --cm-test CM_TEST --port PORT
#
# Exits 0 if every connection passed and the owner's counters show the junk
# dropped; 1 otherwise.
set -euo pipefail
launcher= flood= cm_test= port=
while (($#)); do
  case $1 in
    --launcher) launcher=$2 ;;
    --flood) flood=$2 ;;
    --cm-test) cm_test=$2 ;;
    --port) port=$2 ;;
    *) echo "run_qp1_flood: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
host_port=$((14000 + port % 1000))
registry=/dev/shm/uroce-qp1-flood-$$
log=$(mktemp -d)
holder=
cleanup() {
  [[ -n $holder ]] && kill "$holder" 2>/dev/null || true
  rm -rf "$log" "$registry"
}
trap cleanup EXIT
export UROCE_PORT=$host_port UROCE_HOST_REGISTRY=$registry
fail() { echo "run_qp1_flood: $*" >&2; exit 1; }

# The port's owner: the first process of the group.
UROCE_STATS=1 timeout 120 "$launcher" run ibv_rc_pingpong -g 1 -p $((port + 1)) >"$log/holder" 2>&1 &
holder=$!
for _ in $(seq 100); do
  ss -ltn "sport = :$((port + 1))" | grep -q LISTEN && break
  sleep 0.1
done

"$flood" 127.0.0.1 "$host_port" 8 20000 >"$log/flood" 2>&1 &
flood_pid=$!
sleep 0.5
for i in 1 2 3; do
  timeout 60 "$launcher" run "$cm_test" endpoint_pingpong "$port" >"$log/cm.$i" 2>&1 ||
    { cat "$log/cm.$i"; fail "connection $i during the flood failed"; }
  echo "run_qp1_flood: connection $i during the flood: $(tail -n 1 "$log/cm.$i")"
done
wait "$flood_pid" || fail "qp1_flood failed: $(cat "$log/flood")"
cat "$log/flood"

timeout 30 "$launcher" run ibv_rc_pingpong -g 1 -p $((port + 1)) 127.0.0.1 >"$log/client" 2>&1 ||
  { cat "$log/client"; fail "the port owner's own connection after the flood failed"; }
status=0
wait "$holder" || status=$?
((status == 0)) || { cat "$log/holder"; fail "the port owner exited with status $status"; }
holder=
stats=$(grep -o -m1 'uroce stats.*' "$log/holder") || fail "no stats line from the port owner"
echo "run_qp1_flood: owner: $stats"
field() { sed -n "s/.*[:,] $1 \([0-9]*\),.*/\1/p" <<<"$stats"; }
for f in bad_icrc malformed qp1_dropped qp1_out; do
  (($(field $f) > 0)) || fail "the owner counted no $f: the flood did not reach it, or was not counted"
done
echo "run_qp1_flood: passed"
