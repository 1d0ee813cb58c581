#!/usr/bin/env bash
# rdmacm-utils' mckey over uroce: rdma_join_multicast / rdma_leave_multicast.
#
#   run_mckey.sh LAUNCHER OUTDIR NAME [--netns SUBNET] [MCKEY OPTIONS...]
#
# Receive: one mckey receiver joined to 239.1.2.3, then one mckey sender (the options go to
#          both; a leading -o goes to the sender only: a send-only join). On one host both
#          bind 127.0.0.1 (run it in a namespace whose lo carries multicast:
#          tests/verbs_c/in_mcast_netns.sh); with --netns the receiver runs on namespace
#          host A and the sender on host B (tests/netns/netns_pair.sh), each bound to its
#          veth address, with 224.0.0.0/4 routed over the veth.
# Expect:  both print "joined dgid: ::ffff:239.1.2.3", the receiver gets every message
#          ("data transfers complete") and both end with "return status 0".
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
launcher=$1 outdir=$2 name=$3
shift 3
rx=() tx=() rx_ip=127.0.0.1 tx_ip=127.0.0.1
if [[ ${1:-} == --netns ]]; then
  # shellcheck source=../netns/netns_pair.sh
  source "$here/../netns/netns_pair.sh"
  trap netns_pair_down EXIT
  netns_pair_up mckey "$2"
  shift 2
  for ns in "$netns_a" "$netns_b"; do
    dev=$(ip -n "$ns" -o link show type veth | awk -F': ' '{ print $2 }' | cut -d@ -f1)
    ip -n "$ns" route add 224.0.0.0/4 dev "$dev"
  done
  rx=(ip netns exec "$netns_a") tx=(ip netns exec "$netns_b") rx_ip=$netns_ip_a tx_ip=$netns_ip_b
fi
sender_only=()
if [[ ${1:-} == -o ]]; then sender_only=(-o); shift; fi
mkdir -p "$outdir"
rlog=$outdir/$name.receiver.log slog=$outdir/$name.sender.log
fail() { echo "run_mckey: FAIL: $*" >&2; echo "--- receiver"; cat "$rlog"; echo "--- sender"; cat "$slog" 2>/dev/null; exit 1; }
"${rx[@]}" timeout 30 "$launcher" run mckey -m 239.1.2.3 -b "$rx_ip" "$@" >"$rlog" 2>&1 &
receiver=$!
[[ -n ${netns_a:-} ]] || trap 'kill $receiver 2>/dev/null || true' EXIT
# The receiver has joined once its host's kernel lists 239.1.2.3 (0x030201EF in the byte
# order of /proc/net/igmp) among the groups joined (mckey's stdout is block-buffered).
joined() { "${rx[@]}" grep -qi "030201EF" /proc/net/igmp; }
for _ in $(seq 200); do joined && break; sleep 0.05; done
joined || fail "the receiver did not join"
"${tx[@]}" timeout 30 "$launcher" run mckey -m 239.1.2.3 -b "$tx_ip" -s "${sender_only[@]}" "$@" >"$slog" 2>&1 ||
  fail "the sender failed"
wait $receiver || fail "the receiver failed"
for log in "$rlog" "$slog"; do
  grep -q "joined dgid: ::ffff:239.1.2.3" "$log" || fail "$log: no join"
  grep -q "data transfers complete" "$log" || fail "$log: transfers not complete"
  grep -q "return status 0" "$log" || fail "$log: bad status"
done
echo "run_mckey: $name PASSED"
