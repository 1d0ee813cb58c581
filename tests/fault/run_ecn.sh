#!/usr/bin/env bash
# ECN and CNPs end to end (src/engine/ecn.h): two uroce "hosts" in network namespaces
# joined by a veth pair, Debian's ib_write_bw between them, and on each host an nftables
# rule that stands in for a congested switch queue: it marks PERMILLE per mille (default 5)
# of the UDP datagrams leaving the host Congestion Experienced (and counts those that left
# ECN-capable, ECT(0)). Two runs:
#   UROCE_ECN=1 (the default): every datagram left ECT(0); the receiver counted marks and
#                answered with CNPs, the sender received CNPs;
#   UROCE_ECN=0: nothing left ECN-capable, no CNP was sent or received.
# Both runs must complete; each prints its bandwidth (the marks slow the first down: each
# CNP halves the sender's window, once per window).
#
#   run_ecn.sh --launcher PATH --port TCP_PORT [--subnet N] [--permille P] [--outdir DIR]
#
# Needs root, iproute2 and nft; exits 77 (skipped) otherwise. Every process and namespace
# is gone when the script exits. Logs: OUTDIR/ecn.{on,off}.{server,client}.log.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
launcher='' port='' subnet=120 permille=5 outdir=. timeout_s=60
die() { echo "run_ecn: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --launcher) launcher=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --permille) permille=$2; shift 2 ;;
    --outdir) outdir=$2; shift 2 ;;
    *) die "unknown option '$1' (see the comment at the top of $0)" ;;
  esac
done
[[ -x $launcher && -n $port ]] || die "--launcher (an executable) and --port are required"
command -v ib_write_bw >/dev/null || { echo "run_ecn: no ib_write_bw (perftest): skipped"; exit 77; }
command -v nft >/dev/null || { echo "run_ecn: no nft (nftables): skipped"; exit 77; }
mkdir -p "$outdir"
source "$here/../netns/netns_pair.sh"
trap netns_pair_down EXIT
netns_pair_up ecn "$subnet"

# The congested queue, made afresh for each run (its counter at 0): every UDP datagram
# leaving the host is counted if ECT(0), then marked CE with probability PERMILLE per mille.
mark_queue() {
  local ns
  for ns in "$netns_a" "$netns_b"; do
    ip netns exec "$ns" nft delete table ip uroce_ecn 2>/dev/null || true
    ip netns exec "$ns" nft -f - <<NFT
table ip uroce_ecn {
  chain out {
    type filter hook output priority 0; policy accept;
    ip protocol udp ip ecn ect0 counter
    ip protocol udp numgen random mod 1000 < $permille ip ecn set ce
  }
}
NFT
  done
}
ect0_sent() { ip netns exec "$1" nft list chain ip uroce_ecn out | sed -n 's/.*ect0 counter packets \([0-9]*\).*/\1/p'; }
# field LINE NAME: the number after "NAME " in a uroce stats line.
field() { sed -n "s/.*[:,] $2 \([0-9]*\),.*/\1/p" <<<"$1"; }

# run MODE ECN: ib_write_bw server on host A, client on host B; prints nothing, fails on error.
run() {
  local mode=$1 ecn=$2 args=(-d uroce0 -x 0 -s 65536 -n 2000 -p "$port")
  local env=(env UROCE_ECN="$ecn" UROCE_STATS=1)
  local slog=$outdir/ecn.$mode.server.log clog=$outdir/ecn.$mode.client.log
  ip netns exec "$netns_a" timeout "$timeout_s" "${env[@]}" "$launcher" run ib_write_bw "${args[@]}" >"$slog" 2>&1 &
  local server=$!
  for _ in $(seq 100); do
    ip netns exec "$netns_a" grep -q ":$(printf %04X "$port") 00000000:0000 0A" /proc/net/tcp && break
    sleep 0.1
  done
  if ! ip netns exec "$netns_b" timeout "$timeout_s" "${env[@]}" "$launcher" run ib_write_bw "${args[@]}" \
    "$netns_ip_a" >"$clog" 2>&1; then
    kill "$server" 2>/dev/null || true
    echo "run_ecn: $mode: the client failed:" >&2; tail -5 "$clog" >&2; return 1
  fi
  wait "$server" || { echo "run_ecn: $mode: the server failed:" >&2; tail -5 "$slog" >&2; return 1; }
  grep -Eq '^ *65536 +2000 ' "$clog" || { echo "run_ecn: $mode: no result row" >&2; return 1; }
}

status=0
check() { # check DESCRIPTION CONDITION...
  local what=$1; shift
  if "$@"; then echo "run_ecn: ok: $what"; else echo "run_ecn: FAILED: $what" >&2; status=1; fi
}
for mode in on off; do
  mark_queue
  ecn=1; [[ $mode == off ]] && ecn=0
  run "$mode" "$ecn" || { status=1; continue; }
  s=$(grep -o -m1 'uroce stats.*' "$outdir/ecn.$mode.server.log") c=$(grep -o -m1 'uroce stats.*' "$outdir/ecn.$mode.client.log")
  s_ce=$(field "$s" ecn_ce) s_out=$(field "$s" cnps_out) c_in=$(field "$c" cnps_in) c_out=$(field "$c" cnps_out)
  sent_a=$(ect0_sent "$netns_a") sent_b=$(ect0_sent "$netns_b")
  echo "run_ecn: $mode: ECT(0) sends (a GSO message is one) A $sent_a B $sent_b; server: ecn_ce $s_ce, cnps_out $s_out;" \
    "client: cnps_in $c_in, cnps_out $c_out; $(grep -E '^ *65536' "$outdir/ecn.$mode.client.log" | awk '{print $4 " MB/s"}')"
  if [[ $mode == on ]]; then
    check "on: the client's datagrams left ECN-capable" test "$sent_b" -gt 100
    check "on: the server counted marks and sent CNPs" test "$s_ce" -gt 0 -a "$s_out" -gt 0
    check "on: the client received CNPs" test "$c_in" -gt 0
  else
    check "off: nothing left ECN-capable" test "$sent_a" -eq 0 -a "$sent_b" -eq 0
    check "off: no CNP sent or received" test "$s_out" -eq 0 -a "$c_in" -eq 0 -a "$c_out" -eq 0
  fi
done
exit $status
