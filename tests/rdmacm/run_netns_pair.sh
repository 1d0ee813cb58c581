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
# server's address. Needs root (CI runs as root); exits 77 (skipped) otherwise.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run_pair=$here/../conformance/run_pair.sh
launcher= name=netns subnet= outdir=. pass=() server=() client=()
while (($#)); do
  case $1 in
    --launcher) launcher=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
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

if [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null; then
  echo "run_netns_pair: needs root and iproute2: skipped"; exit 77
fi
server_ip=10.231.$subnet.1 client_ip=10.231.$subnet.2
ns_s=uroce-$name-s-$$ ns_c=uroce-$name-c-$$
veth_s=urs$$x$subnet veth_c=urc$$x$subnet  # interface names: at most 15 characters
veth_s=${veth_s:0:15} veth_c=${veth_c:0:15}

cleanup() {
  ip netns del "$ns_s" 2>/dev/null || true
  ip netns del "$ns_c" 2>/dev/null || true
}
trap cleanup EXIT
if ! ip netns add "$ns_s" 2>/dev/null; then
  echo "run_netns_pair: cannot create network namespaces here: skipped"; exit 77
fi
ip netns add "$ns_c"
ip link add "$veth_s" type veth peer name "$veth_c"
ip link set "$veth_s" netns "$ns_s"
ip link set "$veth_c" netns "$ns_c"
ip -n "$ns_s" addr add "$server_ip/24" dev "$veth_s"
ip -n "$ns_c" addr add "$client_ip/24" dev "$veth_c"
for ns in "$ns_s" "$ns_c"; do ip -n "$ns" link set lo up; done
ip -n "$ns_s" link set "$veth_s" up
ip -n "$ns_c" link set "$veth_c" up

subst() { local a; for a in "$@"; do printf '%s\n' "${a//@SERVER@/$server_ip}"; done; }
mapfile -t server < <(subst "${server[@]}")
mapfile -t client < <(subst "${client[@]}")

echo "run_netns_pair: $name: server $server_ip in $ns_s, client $client_ip in $ns_c"
ip netns exec "$ns_s" "$run_pair" --launcher "$launcher" --name "$name" --outdir "$outdir" "${pass[@]}" \
  --server "${server[@]}" --client ip netns exec "$ns_c" "${client[@]}"
