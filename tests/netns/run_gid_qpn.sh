#!/usr/bin/env bash
# A GID and a QPN are enough, across hosts: two network namespaces ("hosts")
# joined by a veth pair, three gid_qpn_test processes in each, every one of the 15 process
# pairs (across the hosts and within each) running its own session: the two exchange only
# GIDs, QP numbers, PSNs and an MR's address and rkey over TCP (plus the LID with
# --dlid lid), then run RC and UD traffic through GRH address vectors with the DLID --dlid
# names (lid: the peer's LID; 0 or >= 0xC000: the host's RoCE port 4791).
#
#   run_gid_qpn.sh --launcher PATH --program PATH [--dlid lid|0|0xC123] [--subnet N]
#                  [--iters N] [--kill-restart] [--ipv6] [--outdir DIR] [--timeout SECONDS]
#
# Processes p0..p5, p0 p2 p4 on host A (10.231.N.1), p1 p3 p5 on host B (10.231.N.2);
# pi listens on TCP 18780+i and accepts the i sessions of p0..p(i-1), and connects to each
# of p(i+1)..p5 (one thread, QPs and MR per session, one device context per process).
# p0 starts first and the others only once it has opened its device, so on host A it is
# the first to have joined UDP 4791.
#
# --kill-restart: the sessions are paced (--pace-ms) so that they last a few seconds; once
# every session of p0 has finished two rounds (while no session anywhere has finished), p0 is
# killed with SIGKILL and started again. Its five peers must see their session with it lost
# (its TCP connection closed) and accept the restarted p0's new one (--max-lost 1), their
# other sessions must pass untouched, and the restarted p0 must pass all five sessions.
#
# --ipv6: the veth ends also get fd10:231:N::1 and ::2 (no DAD), and every process uses its
# host's IPv6 GID (--gid-index: the index of that address in uroce0's table), so the RoCE
# traffic, 4791 and the relay between a host's processes included, is IPv6; the TCP side
# channel stays IPv4.
#
# Needs root and iproute2 (CI runs as root); exits 77 (skipped) otherwise. Every process
# started is killed when the script exits; every wait is bounded by --timeout (default 60,
# times UROCE_TIMEOUT_SCALE), and each process's waits by 5 s times UROCE_TIMEOUT_SCALE.
# Logs: OUTDIR/gid_qpn.<dlid>[.kill].pI.log.
set -euo pipefail

launcher='' program='' dlid=lid subnet=74 iters='' kill_restart=0 ipv6=0 outdir=. timeout_s=60
die() { echo "run_gid_qpn: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --launcher) launcher=$2; shift 2 ;;
    --program) program=$2; shift 2 ;;
    --dlid) dlid=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --kill-restart) kill_restart=1; shift ;;
    --ipv6) ipv6=1; shift ;;
    --outdir) outdir=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    *) die "unknown option '$1' (see the comment at the top of $0)" ;;
  esac
done
[[ -x $launcher && -x $program ]] || die "--launcher and --program must name executables"
{ [[ $subnet =~ ^[0-9]+$ ]] && ((subnet <= 255)); } || die "--subnet must be 0-255"
[[ ${UROCE_TIMEOUT_SCALE:-1} =~ ^[1-9][0-9]*$ ]] || die "UROCE_TIMEOUT_SCALE must be a positive whole number"
timeout_s=$((timeout_s * ${UROCE_TIMEOUT_SCALE:-1}))
wait_ms=$((5000 * ${UROCE_TIMEOUT_SCALE:-1})) # each process's limit of one wait (--timeout-ms)

if [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null; then
  echo "run_gid_qpn: needs root and iproute2: skipped"; exit 77
fi

# Paced sessions for the kill: 40 rounds at >= 50 ms each outlast the kill and restart.
if ((kill_restart)); then
  iters=${iters:-40} pace=(--pace-ms 50) max_lost=(--max-lost 1) tag=gid_qpn.$dlid.kill
else
  iters=${iters:-10} pace=() max_lost=() tag=gid_qpn.$dlid
fi
((ipv6)) && tag=$tag.ipv6
mkdir -p "$outdir"

ip_a=10.231.$subnet.1 ip_b=10.231.$subnet.2
ns_a=uroce-gq-a-$$ ns_b=uroce-gq-b-$$
veth_a=gqa$$x$subnet veth_b=gqb$$x$subnet # interface names: at most 15 characters
veth_a=${veth_a:0:15} veth_b=${veth_b:0:15}

# pids[i]: process pi while it may run ('' once waited for).
pids=('' '' '' '' '' '')
cleanup() {
  local pid
  for pid in "${pids[@]}"; do if [[ -n $pid ]]; then kill -KILL "$pid" 2>/dev/null || true; fi; done
  for pid in "${pids[@]}"; do if [[ -n $pid ]]; then wait "$pid" 2>/dev/null || true; fi; done
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! ip netns add "$ns_a" 2>/dev/null; then
  echo "run_gid_qpn: cannot create network namespaces here: skipped"; exit 77
fi
ip netns add "$ns_b"
ip link add "$veth_a" type veth peer name "$veth_b"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$ip_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$ip_b/24" dev "$veth_b"
if ((ipv6)); then
  ip -n "$ns_a" -6 addr add "fd10:231:$subnet::1/64" dev "$veth_a" nodad
  ip -n "$ns_b" -6 addr add "fd10:231:$subnet::2/64" dev "$veth_b" nodad
fi
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up

# The GID index of each host's address (0, the IPv4 one, unless --ipv6).
gid_index_in() { # NS ADDRESS
  ip netns exec "$1" "$launcher" devices |
    awk -v a="$2" '$1 ~ /^GID\[[0-9]+\]$/ { g = $2; sub(/,$/, "", g); if (g == a) { gsub(/[^0-9]/, "", $1); print $1; exit } }'
}
gid_a=0 gid_b=0
if ((ipv6)); then
  gid_a=$(gid_index_in "$ns_a" "fd10:231:$subnet::1") gid_b=$(gid_index_in "$ns_b" "fd10:231:$subnet::2")
  [[ -n $gid_a && -n $gid_b ]] || die "the IPv6 addresses are not among uroce0's GIDs in the namespaces"
fi

ns_of() { if (($1 % 2 == 0)); then echo "$ns_a"; else echo "$ns_b"; fi; }
ip_of() { if (($1 % 2 == 0)); then echo "$ip_a"; else echo "$ip_b"; fi; }
gid_of() { if (($1 % 2 == 0)); then echo "$gid_a"; else echo "$gid_b"; fi; }
log_of() { echo "$outdir/$tag.p$1${2:-}.log"; }

deadline=$((SECONDS + timeout_s))
fail() {
  local i f
  echo "run_gid_qpn: $tag: FAILED: $*" >&2
  for i in 0 1 2 3 4 5; do
    for f in "$(log_of "$i")" "$(log_of "$i" .restart)"; do
      [[ -f $f ]] || continue
      echo "--- $f (last 15 lines)" >&2
      tail -n 15 "$f" >&2
    done
  done
  exit 1
}

# start I [LOG_SUFFIX]: runs pi in its host under `uroce run`; `ip netns exec` and `uroce run`
# both exec, so $! is the program's own pid.
start() {
  local i=$1 j args
  args=(--name "p$i" --dlid "$dlid" --iters "$iters" --deadline-s "$timeout_s" --timeout-ms "$wait_ms"
        --gid-index "$(gid_of "$i")" "${pace[@]}")
  ((i > 0)) && args+=(--server --port $((18780 + i)) --peers "$i" "${max_lost[@]}")
  for ((j = i + 1; j < 6; j++)); do args+=(--connect "$(ip_of "$j"):$((18780 + j))"); done
  ip netns exec "$(ns_of "$i")" "$launcher" run -- "$program" "${args[@]}" >"$(log_of "$i" "${2:-}")" 2>&1 &
  pids[i]=$!
}

# wait_for I PATTERN COUNT LOG_SUFFIX WHAT: until pi's log has COUNT lines matching PATTERN.
wait_for() {
  local log n
  log=$(log_of "$1" "$4")
  until n=$(grep -cE -- "$2" "$log" 2>/dev/null) && ((n >= $3)); do
    kill -0 "${pids[$1]}" 2>/dev/null || fail "p$1 exited before $5"
    ((SECONDS < deadline)) || fail "p$1: timeout after ${timeout_s}s waiting for $5"
    sleep 0.05
  done
}

echo "run_gid_qpn: $tag: host A $ip_a ($ns_a): p0 p2 p4; host B $ip_b ($ns_b): p1 p3 p5; dlid $dlid"
start 0
wait_for 0 '^ready ' 1 '' "its device was open"
for i in 1 2 3 4 5; do start "$i"; done

if ((kill_restart)); then
  wait_for 0 ': round 2 ok$' 5 '' "every session reached round 2"
  for i in 1 2 3 4 5; do
    ! grep -q '^PASS ' "$(log_of "$i")" || fail "a session of p$i finished before the kill: raise --iters"
  done
  kill -KILL "${pids[0]}"
  wait "${pids[0]}" 2>/dev/null || true
  echo "run_gid_qpn: $tag: p0 (pid ${pids[0]}) killed with SIGKILL after round 2; restarting it"
  start 0 .restart
fi

# Every process must exit 0 before the deadline.
rcs=()
for i in 0 1 2 3 4 5; do
  while kill -0 "${pids[i]}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
  kill -0 "${pids[i]}" 2>/dev/null && fail "p$i: still running after ${timeout_s}s"
  rc=0; wait "${pids[i]}" || rc=$?
  pids[i]=''
  rcs[i]=$rc
done
for i in 0 1 2 3 4 5; do ((rcs[i] == 0)) || fail "p$i exited with status ${rcs[i]}"; done

# Each process passed its five sessions; with the kill, each survivor lost exactly one
# (p0's) and replaced it.
lost=0
((kill_restart)) && lost=1
for i in 0 1 2 3 4 5; do
  suffix=
  ((kill_restart && i == 0)) && suffix=.restart
  want="^PASSED p$i: 5 sessions, $iters rounds each \(($((i == 0 ? 0 : lost))) lost and replaced\)"
  grep -qE "$want" "$(log_of "$i" "$suffix")" || fail "p$i: no line matching '$want'"
done
echo "run_gid_qpn: $tag: passed: 6 processes, 15 sessions of $iters rounds by GID + QPN (dlid $dlid)$(
  ((kill_restart)) && echo ", p0 killed and restarted mid-run")$( ((ipv6)) && echo ", over IPv6 (GID indexes $gid_a, $gid_b)")"
