#!/usr/bin/env bash
# Runs COMMAND in a network namespace of its own whose only interface, lo, carries
# multicast (route 224.0.0.0/4 dev lo), so a multicast test's packets stay on this host
# (without it they would follow the default route out of the machine). Needs root (CI
# runs as root); exits 77 (skipped) otherwise.
#
#   in_mcast_netns.sh COMMAND [ARGS...]
set -euo pipefail
((EUID == 0)) || { echo "SKIP: a network namespace of its own needs root"; exit 77; }
exec unshare -n bash -c 'ip link set lo up && ip link set lo multicast on &&
  ip route add 224.0.0.0/4 dev lo && exec "$@"' in_mcast_netns "$@"
