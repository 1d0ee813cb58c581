#!/usr/bin/env bash
# Two "hosts" for one test: network namespaces joined by a veth pair, each with
# its own address. The server runs in the first, the client in the second, each
# under `uroce run` (through tests/conformance/run_pair.sh, run inside the first
# namespace so that its listening-port check sees the server).
#
#   run_netns_pair.sh --launcher PATH --name NAME --subnet N [--outdir DIR] [--port PORT]
#                     [run_pair.sh options...] --server CMD... --client CMD...
#
# The server's address is 10.231.N.1, the client's 10.231.N.2 (N: 0-255, one per
# test so that tests can run in parallel); @SERVER@ in a command is replaced by the
# server's address. With --ipv6 the veth also carries IPv6 (tests/netns/netns_pair.sh):
# @SERVER6@ / @CLIENT6@ are the two ends' fd10:231:N::1 / ::2, @SERVER_LL@ / @CLIENT_LL@
# their link-local addresses, and @SERVER_LL_SCOPED@ the server's link-local address as
# the client names it (fe80::...%<the client's interface>). Needs root (CI runs as
# root); exits 77 (skipped) otherwise.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run_pair=$here/../conformance/run_pair.sh
launcher= name=netns subnet= outdir=. pass=() server=() client=()
while (($#)); do
  case $1 in
    --launcher) launcher=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --ipv6) export NETNS_IPV6=1; shift ;;
    --outdir) outdir=$2; shift 2 ;;
    --server)
      shift
      while (($#)) && [[ $1 != --client ]]; do server+=("$1"); shift; done ;;
    --client)
      shift
      while (($#)); do client+=("$1"); shift; done ;;
    *) pass+=("$1"); shift ;;
  esac
done
[[ -x $launcher && -n $subnet && ${#server[@]} -gt 0 && ${#client[@]} -gt 0 ]] || {
  echo "run_netns_pair: --launcher, --subnet, --server and --client are required" >&2; exit 2; }

# shellcheck source=../netns/netns_pair.sh
source "$here/../netns/netns_pair.sh"
trap netns_pair_down EXIT
netns_pair_up "$name" "$subnet"
server_ip=$netns_ip_a client_ip=$netns_ip_b ns_s=$netns_a ns_c=$netns_b

subst() {
  local a
  for a in "$@"; do
    a=${a//@SERVER_LL_SCOPED@/$netns_ll_a%$netns_if_b}
    a=${a//@SERVER_LL@/$netns_ll_a} a=${a//@CLIENT_LL@/$netns_ll_b}
    a=${a//@SERVER6@/$netns_ip6_a} a=${a//@CLIENT6@/$netns_ip6_b}
    printf '%s\n' "${a//@SERVER@/$server_ip}"
  done
}
mapfile -t server < <(subst "${server[@]}")
mapfile -t client < <(subst "${client[@]}")

echo "run_netns_pair: $name: server $server_ip in $ns_s, client $client_ip in $ns_c"
ip netns exec "$ns_s" "$run_pair" --launcher "$launcher" --name "$name" --outdir "$outdir" "${pass[@]}" \
  --server "${server[@]}" --client ip netns exec "$ns_c" "${client[@]}"
