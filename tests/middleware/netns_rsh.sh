#!/usr/bin/env bash
# Open MPI's rsh agent for namespace "hosts" (run_mpi.sh --hosts): called as
#   netns_rsh.sh HOST COMMAND...
# it runs COMMAND (a shell command line) in the namespace that UROCE_NETNS_HOSTS
# ("IP=NAMESPACE IP=NAMESPACE") gives for HOST, as ssh would run it on that host.
set -euo pipefail
host=$1
shift
for pair in ${UROCE_NETNS_HOSTS:-}; do
  if [[ ${pair%%=*} == "$host" ]]; then
    exec ip netns exec "${pair#*=}" /bin/sh -c "$*"
  fi
done
echo "netns_rsh: no namespace for host '$host' in UROCE_NETNS_HOSTS='${UROCE_NETNS_HOSTS:-}'" >&2
exit 255
