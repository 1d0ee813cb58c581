#!/usr/bin/env bash
# rdma_resolve_addr to addresses whose route exists but whose next hop never
# answers ARP/NDP: each must give ADDR_ERROR with -ETIMEDOUT after the 500 ms
# timeout (cm_test addr_timeout PORT ADDR). Run in a network namespace of
# tests/netns/netns_pair.sh (host A; host B answers only for its own
# addresses), where the next hop is
#   - a gateway nobody has (198.51.100.0/24 via 10.231.N.3),
#   - the destination itself, on the link (203.0.113.0/24 dev veth),
#   - an IPv6 address on the link, and a link-local one with its interface.
# That is the neighbour wait (the kernel's rdma_resolve_addr for RoCE).
#
#   run_addr_timeout.sh --launcher PATH --cm-test PATH --subnet N --port PORT
#
# Needs root (CI runs as root); exits 77 (skipped) otherwise.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
launcher='' cm_test='' subnet='' port=''
while (($#)); do
  case $1 in
    --launcher) launcher=$2; shift 2 ;;
    --cm-test) cm_test=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) echo "run_addr_timeout: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $launcher && -x $cm_test && -n $subnet && -n $port ]] || {
  echo "run_addr_timeout: --launcher, --cm-test, --subnet and --port are required" >&2; exit 2; }

export NETNS_IPV6=1
# shellcheck source=../netns/netns_pair.sh
source "$here/../netns/netns_pair.sh"
trap netns_pair_down EXIT
netns_pair_up addr-timeout "$subnet"
ns=$netns_a dev=$netns_if_a
ip -n "$ns" route add 198.51.100.0/24 via "10.231.$subnet.3"
ip -n "$ns" route add 203.0.113.0/24 dev "$dev"

status=0
for addr in 198.51.100.77 203.0.113.9 "fd10:231:$subnet::77" "fe80::77%$dev"; do
  echo "run_addr_timeout: $addr"
  ip netns exec "$ns" "$launcher" run "$cm_test" addr_timeout "$port" "$addr" || status=1
done
exit $status
