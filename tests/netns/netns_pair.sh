# Sourced (bash): two "hosts" for a test, network namespaces joined by a veth pair.
#
#   netns_pair_up NAME SUBNET   creates them: host A is $netns_a with address $netns_ip_a
#                               (10.231.SUBNET.1), host B is $netns_b with $netns_ip_b
#                               (10.231.SUBNET.2), both with lo up; exits the script
#                               with 77 (skipped) when namespaces cannot be made here
#                               (not root, no iproute2)
#   netns_pair_down             kills every process still in either namespace, deletes them
#
# With NETNS_IPV6=1 set, the veth ends also get IPv6 addresses: $netns_ip6_a
# (fd10:231:SUBNET::1/64) and $netns_ip6_b (fd10:231:SUBNET::2/64), without duplicate
# address detection, and their link-local addresses $netns_ll_a and $netns_ll_b
# (fe80::/64, also without DAD, so usable at once) on the interfaces $netns_if_a and
# $netns_if_b.
#
# SUBNET (0-255) must differ between tests that run at the same time. Callers install
#   trap netns_pair_down EXIT
# before netns_pair_up, so that every process and namespace is gone however they exit.

netns_a='' netns_b='' netns_ip_a='' netns_ip_b=''
netns_ip6_a='' netns_ip6_b='' netns_ll_a='' netns_ll_b='' netns_if_a='' netns_if_b=''

netns_pair_up() {
  local name=$1 subnet=$2
  if [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null; then
    echo "netns_pair: needs root and iproute2: skipped"; exit 77
  fi
  netns_ip_a=10.231.$subnet.1 netns_ip_b=10.231.$subnet.2
  local a=uroce-$name-a-$$ b=uroce-$name-b-$$
  local veth_a=ura$$x$subnet veth_b=urb$$x$subnet # interface names: at most 15 characters
  veth_a=${veth_a:0:15} veth_b=${veth_b:0:15}
  if ! ip netns add "$a" 2>/dev/null; then
    echo "netns_pair: cannot create network namespaces here: skipped"; exit 77
  fi
  netns_a=$a
  ip netns add "$b"
  netns_b=$b
  ip link add "$veth_a" type veth peer name "$veth_b"
  ip link set "$veth_a" netns "$a"
  ip link set "$veth_b" netns "$b"
  ip -n "$a" addr add "$netns_ip_a/24" dev "$veth_a"
  ip -n "$b" addr add "$netns_ip_b/24" dev "$veth_b"
  netns_if_a=$veth_a netns_if_b=$veth_b
  if [[ ${NETNS_IPV6:-0} == 1 ]]; then
    netns_ip6_a=fd10:231:$subnet::1 netns_ip6_b=fd10:231:$subnet::2
    ip netns exec "$a" sysctl -qw "net.ipv6.conf.$veth_a.accept_dad=0"
    ip netns exec "$b" sysctl -qw "net.ipv6.conf.$veth_b.accept_dad=0"
    ip -n "$a" -6 addr add "$netns_ip6_a/64" dev "$veth_a" nodad
    ip -n "$b" -6 addr add "$netns_ip6_b/64" dev "$veth_b" nodad
  fi
  ip -n "$a" link set lo up
  ip -n "$b" link set lo up
  ip -n "$a" link set "$veth_a" up
  ip -n "$b" link set "$veth_b" up
  if [[ ${NETNS_IPV6:-0} == 1 ]]; then
    netns_ll_a=$(netns_link_local "$a" "$veth_a") netns_ll_b=$(netns_link_local "$b" "$veth_b")
    [[ -n $netns_ll_a && -n $netns_ll_b ]] || { echo "netns_pair: no IPv6 link-local address on the veth" >&2; exit 1; }
  fi
}

# The link-local IPv6 address of interface $2 in namespace $1 (waits up to 5 s for the
# kernel to configure it once the link is up), or nothing.
netns_link_local() {
  local ns=$1 dev=$2 addr='' i
  for ((i = 0; i < 100; i++)); do
    addr=$(ip -n "$ns" -6 -o addr show dev "$dev" scope link 2>/dev/null | awk '$3 == "inet6" { sub(/\/.*/, "", $4); print $4; exit }')
    [[ -n $addr ]] && break
    sleep 0.05
  done
  printf '%s' "$addr"
}

netns_pair_down() {
  local ns pids
  for ns in "$netns_a" "$netns_b"; do
    [[ -n $ns ]] || continue
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [[ -n $pids ]]; then
      # shellcheck disable=SC2086 # one pid per word
      kill -KILL $pids 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true
  done
}
