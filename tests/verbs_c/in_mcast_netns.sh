#!/usr/bin/env bash
# Runs COMMAND in a network namespace of its own whose only interface, lo, carries
# multicast (route 224.0.0.0/4 dev lo), so a multicast test's packets stay on this host
# (without it they would follow the default route out of the machine). Needs root (CI
# runs as root); exits 77 (skipped) otherwise. With --no-route, lo carries multicast but
# no route names it, as on a host whose only routes are unicast: a group must be joined
# on the interface itself, as a NIC joins on its netdev.
#
#   in_mcast_netns.sh [--no-route] COMMAND [ARGS...]
set -euo pipefail
((EUID == 0)) || { echo "SKIP: a network namespace of its own needs root"; exit 77; }
route='ip route add 224.0.0.0/4 dev lo'
if [[ ${1:-} == --no-route ]]; then
  route=true
  shift
fi
exec unshare -n bash -c 'ip link set lo up && ip link set lo multicast on && '"$route"' && exec "$@"' \
  in_mcast_netns "$@"
