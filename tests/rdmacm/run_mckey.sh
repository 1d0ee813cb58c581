#!/usr/bin/env bash
# rdmacm-utils' mckey over uroce: rdma_join_multicast / rdma_leave_multicast (issue 15).
#
#   run_mckey.sh LAUNCHER OUTDIR NAME [MCKEY OPTIONS...]
#
# Receive: one mckey receiver joined to 239.1.2.3 on 127.0.0.1, then one mckey sender (the
#          options go to both; a leading -o goes to the sender only: a send-only join).
# Expect:  both print "joined dgid: ::ffff:239.1.2.3", the receiver gets every message
#          ("data transfers complete") and both end with "return status 0".
# Run it in a namespace whose lo carries multicast (tests/verbs_c/in_mcast_netns.sh).
set -euo pipefail
launcher=$1 outdir=$2 name=$3
shift 3
sender_only=()
if [[ ${1:-} == -o ]]; then sender_only=(-o); shift; fi
mkdir -p "$outdir"
rlog=$outdir/$name.receiver.log slog=$outdir/$name.sender.log
fail() { echo "run_mckey: FAIL: $*" >&2; echo "--- receiver"; cat "$rlog"; echo "--- sender"; cat "$slog" 2>/dev/null; exit 1; }
# Line-buffered, so that the receiver's "receiving data transfers" shows before it ends.
timeout 30 stdbuf -oL "$launcher" run mckey -m 239.1.2.3 -b 127.0.0.1 "$@" >"$rlog" 2>&1 &
receiver=$!
trap 'kill $receiver 2>/dev/null || true' EXIT
for _ in $(seq 200); do grep -q "receiving data transfers" "$rlog" && break; sleep 0.05; done
grep -q "receiving data transfers" "$rlog" || fail "the receiver did not join"
timeout 30 "$launcher" run mckey -m 239.1.2.3 -b 127.0.0.1 -s "${sender_only[@]}" "$@" >"$slog" 2>&1 ||
  fail "the sender failed"
wait $receiver || fail "the receiver failed"
for log in "$rlog" "$slog"; do
  grep -q "joined dgid: ::ffff:239.1.2.3" "$log" || fail "$log: no join"
  grep -q "data transfers complete" "$log" || fail "$log: transfers not complete"
  grep -q "return status 0" "$log" || fail "$log: bad status"
done
echo "run_mckey: $name PASSED"
