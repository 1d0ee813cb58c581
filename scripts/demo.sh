#!/usr/bin/env bash
# A demo to watch: sets up and builds uroce (scripts/setup.sh), then runs Debian's own,
# unmodified RDMA programs over uroce - two processes on this machine talking RoCEv2
# over UDP through 127.0.0.1, no RDMA hardware and no kernel module involved.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh

uroce=build/bin/uroce
pair=tests/conformance/run_pair.sh
bold=$(tput bold 2>/dev/null || true) normal=$(tput sgr0 2>/dev/null || true)
step() { echo; echo "${bold}==> $*${normal}"; }

step "uroce is a library; 'uroce run PROGRAM' starts PROGRAM with it preloaded, so the
    program's libibverbs calls land in uroce. The device it offers:"
echo "\$ $uroce devices"
"$uroce" devices

step "Debian's ibv_devices (from ibverbs-utils, not rebuilt) sees it too:"
echo "\$ $uroce run ibv_devices"
"$uroce" run ibv_devices

step "A ping-pong over a reliable-connected (RC) queue pair: a server and a client
    process exchange 1000 messages of 4096 bytes through RDMA SEND/RECV, each side
    checking the data it receives (-c). They swap addresses over TCP port 18600, then
    every byte travels as RoCEv2 packets over UDP; 'LID' is the UDP port of each side.
\$ $uroce run ibv_rc_pingpong -g 0 -c -p 18600 &           # server
\$ $uroce run ibv_rc_pingpong -g 0 -c -p 18600 127.0.0.1   # client"
"$pair" --launcher "$uroce" --name demo_pingpong --outdir build/demo --port 18600 --show \
  --expect '^[0-9]+ iters in' \
  --server ibv_rc_pingpong -g 0 -c -p 18600 \
  --client ibv_rc_pingpong -g 0 -c -p 18600 127.0.0.1

step "perftest's ib_write_bw: the client RDMA-WRITEs 2000 messages of 64 KiB straight
    into the server's registered memory; the server program posts nothing per message
    (uroce's progress thread inside the server process places the data).
\$ $uroce run ib_write_bw -d uroce0 -x 0 -s 65536 -n 2000 -F --report_gbits -p 18601 &
\$ $uroce run ib_write_bw -d uroce0 -x 0 -s 65536 -n 2000 -F --report_gbits -p 18601 127.0.0.1"
bw_opts=(-d uroce0 -x 0 -s 65536 -n 2000 -F --report_gbits -p 18601)
"$pair" --launcher "$uroce" --name demo_write_bw --outdir build/demo --port 18601 --show \
  --client-expect '^ *65536 +2000 ' \
  --server ib_write_bw "${bw_opts[@]}" \
  --client ib_write_bw "${bw_opts[@]}" 127.0.0.1

step "Done. The full test suite: scripts/test.sh - uroce beside the UDP ceilings and UCX/libfabric: bench/compare.sh"
