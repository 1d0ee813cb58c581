#!/usr/bin/env bash
# A hostile network around two unmodified programs. Starts a server
# and a client under `uroce run` with UROCE_STATS=1, learns each one's LID (= UDP port),
# QPN, PSN and GID (and, for ib_write_bw, R_Key and address) from its "local address"
# lines, fires crafted packets (hostile_send) at both while they transfer, and checks:
#   1. both finish successfully with correct data and the expected byte counts;
#   2. the packets were dropped and counted: for every "expect COUNTERS N" line of
#      hostile_send, the sum of COUNTERS in the stats line the victim prints at close
#      is at least N.
# Attacks per victim: every request and response opcode from an address off the QP's
# path (source, or destination, differs: bad_path), with live PSNs and the real R_Key;
# forged ACKs / NAKs (each code) / RNR NAKs / READ responses / atomic ACKs on the path
# with PSNs outside the window (ghost); requests on the path with out-of-window PSNs;
# a blind scan of 1001 QPNs around the victim's; QPN 0/1; truncated, runt, oversized,
# bad-version, bad-ICRC and random datagrams.
#
#   run_hostile.sh --launcher PATH --tool PATH --program rc_pingpong|write_bw --port TCP_PORT
#                  [--name NAME] [--outdir DIR] [--iters N] [--timeout S] [--netns SUBNET]
#
# --iters: the programs' iterations (default 20000). A program that ends before the attack
# does makes the script start over with 4x the iterations, at most --retries times (2).
#
# --netns N: server and client in two network namespaces joined by a veth pair
# (10.232.N.1 and .2, each with a second address .11/.12 for wrong-destination packets);
# the off-path attacker uses .3/.13, the on-path one spoofs the peer from the peer's
# namespace. Needs root; exits 77 (skipped) otherwise. Every process started here is
# stopped when the script exits.
set -euo pipefail

launcher= tool= program= port= name=hostile outdir=. iters= timeout_s=150 subnet= retries=2
args=("$@")
while (($#)); do
  case $1 in
    --launcher) launcher=$2; shift 2 ;;
    --tool) tool=$2; shift 2 ;;
    --program) program=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --outdir) outdir=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --netns) subnet=$2; shift 2 ;;
    --retries) retries=$2; shift 2 ;;
    *) echo "run_hostile: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[[ -x $launcher && -x $tool && -n $port ]] || { echo "run_hostile: --launcher, --tool and --port are required" >&2; exit 2; }

# The programs and what their successful end looks like.
case $program in
  rc_pingpong)
    iters=${iters:-20000}
    server_cmd=(ibv_rc_pingpong -g 0 -c -p "$port" -n "$iters")
    client_cmd=("${server_cmd[@]}")
    expect=("^$((2 * 4096 * iters)) bytes in [0-9.]+ seconds" "^$iters iters in [0-9.]+ seconds")
    reject='invalid data in page|Failed status|Completion for unknown|Couldn'"'"'t'
    ;;
  write_bw)
    iters=${iters:-20000}
    server_cmd=(ib_write_bw -d uroce0 -x 0 -s 65536 -n "$iters" -p "$port")
    client_cmd=("${server_cmd[@]}")
    expect=("^ *65536 +$iters +[0-9.]+ +[0-9.]+")
    reject='Completion with error|Couldn'"'"'t|Unable|failed'
    ;;
  *) echo "run_hostile: --program must be rc_pingpong or write_bw" >&2; exit 2 ;;
esac

mkdir -p "$outdir"
log_s=$outdir/$name.server.log log_c=$outdir/$name.client.log
att_s=$outdir/$name.attack-server.log att_c=$outdir/$name.attack-client.log
: >"$log_s"; : >"$log_c"; : >"$att_s"; : >"$att_c"

# Where each side runs: in_s / in_c prefix commands for the server's / client's host.
in_s=() in_c=() server_addr=127.0.0.1 ns_s= ns_c=
pids=()
cleanup() {
  local pid
  for pid in ${pids[@]+"${pids[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" 2>/dev/null || true; done
  [[ -z $ns_s ]] || ip netns del "$ns_s" 2>/dev/null || true
  [[ -z $ns_c ]] || ip netns del "$ns_c" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  echo "run_hostile: $name: FAILED: $*" >&2
  local f
  for f in "$log_s" "$log_c" "$att_s" "$att_c"; do sed "s|^|[$(basename "$f" .log)] |" "$f" >&2; done
  exit 1
}

if [[ -n $subnet ]]; then
  if [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null; then echo "run_hostile: needs root and iproute2: skipped"; exit 77; fi
  net=10.232.$subnet
  ns_s=uroce-h$subnet-s-$$ ns_c=uroce-h$subnet-c-$$
  if ! ip netns add "$ns_s" 2>/dev/null; then echo "run_hostile: cannot create network namespaces: skipped"; exit 77; fi
  ip netns add "$ns_c"
  veth_s=uhs$$x$subnet veth_c=uhc$$x$subnet
  veth_s=${veth_s:0:15} veth_c=${veth_c:0:15}
  ip link add "$veth_s" type veth peer name "$veth_c"
  ip link set "$veth_s" netns "$ns_s"
  ip link set "$veth_c" netns "$ns_c"
  for a in 1 11 13; do ip -n "$ns_s" addr add "$net.$a/24" dev "$veth_s"; done
  for a in 2 12 3; do ip -n "$ns_c" addr add "$net.$a/24" dev "$veth_c"; done
  for ns in "$ns_s" "$ns_c"; do ip -n "$ns" link set lo up; done
  ip -n "$ns_s" link set "$veth_s" up
  ip -n "$ns_c" link set "$veth_c" up
  in_s=(ip netns exec "$ns_s") in_c=(ip netns exec "$ns_c") server_addr=$net.1
fi

# Is TCP port $1 listening on the server's host?
port_listening() {
  local hex
  hex=$(printf ':%04X' "$1")
  ${in_s[@]+"${in_s[@]}"} awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 }
                   END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# stdbuf: the "local address" lines must reach the log while the program runs.
run_side() {  # run_side LOG PREFIX... -- CMD...
  local log=$1; shift
  local pre=()
  while [[ $1 != -- ]]; do pre+=("$1"); shift; done
  shift
  ${pre[@]+"${pre[@]}"} env UROCE_STATS=1 timeout -k 5 "$timeout_s" "$launcher" run -- stdbuf -oL "$@" >"$log" 2>&1 &
  pids+=($!)
}

run_side "$log_s" ${in_s[@]+"${in_s[@]}"} -- "${server_cmd[@]}"
server_pid=$!
for ((i = 0; i < 200; i++)); do
  port_listening "$port" && break
  kill -0 "$server_pid" 2>/dev/null || fail "the server exited before listening"
  sleep 0.05
done
port_listening "$port" || fail "the server is not listening on port $port after 10 s"
run_side "$log_c" ${in_c[@]+"${in_c[@]}"} -- "${client_cmd[@]}" "$server_addr"
client_pid=$!

# Both sides' addresses: wait (bounded) for both "remote address" lines.
for ((i = 0; i < 400; i++)); do
  grep -q "remote address" "$log_s" && grep -q "remote address" "$log_c" && break
  sleep 0.05
done
grep -q "remote address" "$log_s" && grep -q "remote address" "$log_c" || fail "no address lines after 20 s"

# Prints "LID QPN PSN IP RKEY VADDR" (hex numbers with 0x) of the local address in LOG.
parse_local() {
  local line gid ip rkey=0 va=0
  line=$(grep -m1 "local address" "$1")
  local lid qpn psn
  lid=$(sed -nE 's/.*LID (0x[0-9a-fA-F]+).*/\1/p' <<<"$line")
  qpn=$(sed -nE 's/.*QPN (0x[0-9a-fA-F]+).*/\1/p' <<<"$line")
  psn=$(sed -nE 's/.*PSN (0x[0-9a-fA-F]+).*/\1/p' <<<"$line")
  if [[ $program == rc_pingpong ]]; then
    gid=$(sed -nE 's/.*GID ([0-9a-fA-F:.]+).*/\1/p' <<<"$line")
    ip=${gid##*:}  # ::ffff:a.b.c.d
  else
    rkey=$(sed -nE 's/.*RKey (0x[0-9a-fA-F]+).*/\1/p' <<<"$line")
    va=$(sed -nE 's/.*VAddr (0x[0-9a-fA-F]+).*/\1/p' <<<"$line")
    # perftest prints the GID on the next line as 16 decimal bytes: ...:255:255:a:b:c:d
    gid=$(grep -m1 -A1 "local address" "$1" | sed -nE 's/.*GID: *([0-9:]+).*/\1/p')
    ip=$(awk -F: '{ printf "%d.%d.%d.%d", $13, $14, $15, $16 }' <<<"$gid")
  fi
  [[ -n $lid && -n $qpn && -n $psn && $ip =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || return 1
  echo "$lid $qpn $psn $ip $rkey $va"
}
read -r s_lid s_qpn s_psn s_ip s_rkey s_va < <(parse_local "$log_s") || fail "cannot parse the server's local address"
read -r c_lid c_qpn c_psn c_ip c_rkey c_va < <(parse_local "$log_c") || fail "cannot parse the client's local address"
echo "run_hostile: $name: server LID $s_lid QPN $s_qpn PSN $s_psn IP $s_ip; client LID $c_lid QPN $c_qpn PSN $c_psn IP $c_ip"

# PSNs each victim can legitimately have outstanding during the run (its send window) and
# expect (its receive window): avoided by the on-path attacks. Generous: every message of
# the run plus slack on both sides.
window=$((iters * 70 + 100000))

# attack VICTIM_IP LID QPN PSN PEER_PSN RKEY VA PEER_IP OFF_SRC ALT_DST LOG PREFIX...
attack() {
  local ip=$1 lid=$2 qpn=$3 psn=$4 peer_psn=$5 rkey=$6 va=$7 peer_ip=$8 off_src=$9 alt_dst=${10} log=${11}
  shift 11
  local pre=("$@") t=("$tool" --seed "$RANDOM")
  local requests=(send write write_bad_rkey read_huge fetch_add_unaligned cswap_unaligned)
  local responses=(ack nak_seq nak_inv nak_access nak_op nak_rd rnr_nak read_resp read_resp_first atomic_ack)
  local avoid_send=$(((psn - 100000) & 0xFFFFFF)):$window avoid_recv=$(((peer_psn - 100000) & 0xFFFFFF)):$window
  {
    # Off the path, with live PSNs and the real key and address: only the path check stops these.
    ${pre[@]+"${pre[@]}"} "${t[@]}" --to "$ip:$lid" --from "$off_src" --path off --qpn "$qpn" --count 40 \
      --psn "$peer_psn" --psn-step 1 --rkey "$rkey" --va "$va" "${requests[@]}"
    ${pre[@]+"${pre[@]}"} "${t[@]}" --to "$ip:$lid" --from "$off_src" --path off --qpn "$qpn" --count 40 \
      --psn "$psn" --psn-step 1 "${responses[@]}"
    # Right source, wrong destination address of the victim.
    ${pre[@]+"${pre[@]}"} "${t[@]}" --to "$alt_dst:$lid" --from "$peer_ip" --path off --qpn "$qpn" --count 20 \
      --psn "$psn" --rkey "$rkey" --va "$va" write read_huge ack nak_seq nak_inv
    # On the path (spoofing the peer from another UDP port), PSNs outside the window.
    ${pre[@]+"${pre[@]}"} "${t[@]}" --to "$ip:$lid" --from "$peer_ip" --path on --qpn "$qpn" --count 40 \
      --psn random --avoid "$avoid_send" "${responses[@]}"
    ${pre[@]+"${pre[@]}"} "${t[@]}" --to "$ip:$lid" --from "$peer_ip" --path on --qpn "$qpn" --count 40 \
      --psn random --avoid "$avoid_recv" --rkey "$rkey" --va "$va" "${requests[@]}"
    # A blind scan: NAKs with random PSNs to 1001 QPNs around the victim's.
    ${pre[@]+"${pre[@]}"} "${t[@]}" --to "$ip:$lid" --from "$peer_ip" --path on --qpn $(((qpn - 500) & 0xFFFFFF)) \
      --qpn-count 1001 --psn random --avoid "$avoid_send" nak_inv
    # Never reach a QP.
    ${pre[@]+"${pre[@]}"} "${t[@]}" --to "$ip:$lid" --from "$off_src" --qpn "$qpn" --count 40 \
      truncated runt oversized bad_version bad_icrc garbage qp0 qp1
  } >"$log" 2>&1 || fail "hostile_send failed (see $log)"
}

if [[ -n $subnet ]]; then
  [[ $s_ip == "$net.1" && $c_ip == "$net.2" ]] || fail "GID 0 is $s_ip / $c_ip, expected $net.1 / $net.2"
  attack "$s_ip" "$s_lid" "$s_qpn" "$s_psn" "$c_psn" "$s_rkey" "$s_va" "$c_ip" "$net.3" "$net.11" "$att_s" "${in_c[@]}"
  attack "$c_ip" "$c_lid" "$c_qpn" "$c_psn" "$s_psn" "$c_rkey" "$c_va" "$s_ip" "$net.13" "$net.12" "$att_c" "${in_s[@]}"
else
  [[ $s_ip == "$c_ip" ]] || fail "server and client GIDs differ ($s_ip, $c_ip) on one host"
  alt=127.0.0.1
  [[ $s_ip != 127.0.0.1 ]] || alt=127.0.0.2
  attack "$s_ip" "$s_lid" "$s_qpn" "$s_psn" "$c_psn" "$s_rkey" "$s_va" "$c_ip" 127.0.0.3 "$alt" "$att_s"
  attack "$c_ip" "$c_lid" "$c_qpn" "$c_psn" "$s_psn" "$c_rkey" "$c_va" "$s_ip" 127.0.0.3 "$alt" "$att_c"
fi
# The attack is meaningful only if it hit running QPs: if a program finished first, run
# again with four times the iterations (at most --retries times; the later options win).
for log in "$log_s" "$log_c"; do
  if grep -qE "iters in|^ *65536 +$iters |uroce stats" "$log"; then
    ((retries > 0)) || fail "a program had finished before the attack ended: raise --iters"
    echo "run_hostile: $name: a program finished before the attack ended; again with $((iters * 4)) iterations"
    cleanup
    trap - EXIT
    exec "$0" "${args[@]}" --iters $((iters * 4)) --retries $((retries - 1))
  fi
done
echo "run_hostile: $name: $(awk '/^total/ { n += $2 } END { print n }' "$att_s" "$att_c") datagrams sent, waiting for the programs"

# 1. Both finish successfully with their data checked.
status=0
wait "$server_pid" || status=$?
((status == 0)) || fail "the server exited with status $status"
wait "$client_pid" || status=$?
((status == 0)) || fail "the client exited with status $status"
pids=()
for re in ${expect[@]+"${expect[@]}"}; do
  grep -qE "$re" "$log_s" || fail "the server's output lacks /$re/"
  grep -qE "$re" "$log_c" || fail "the client's output lacks /$re/"
done
if grep -qE "$reject" "$log_s" "$log_c"; then fail "an output matches /$reject/"; fi

# 2. Every expectation holds against the victim's own stats line.
check_counters() {  # check_counters LOG ATTACK_LOG LID
  local stats
  stats=$(grep -m1 "^uroce stats .* port $(($3)):" "$1") || fail "no 'uroce stats ... port $(($3))' line in $1"
  awk -v stats="$stats" -v who="$(basename "$1" .log)" '
    BEGIN {
      sub(/^[^:]*: /, "", stats)
      n = split(stats, kv, ", ")
      for (i = 1; i <= n; i++) { split(kv[i], p, " "); counter[p[1]] = p[2] }
    }
    /^expect / {
      m = split($2, names, "+"); sum = 0
      for (i = 1; i <= m; i++) {
        if (!(names[i] in counter)) { printf "%s: no counter %s in the stats line\n", who, names[i]; bad = 1; next }
        sum += counter[names[i]]
        # A QPN of another uroce process of the host is passed on to it (host relay),
        # which drops it there: for the victim it is gone, counted as relayed_out.
        if (names[i] == "no_qp" && ("relayed_out" in counter)) { sum += counter["relayed_out"]; union["relayed_out"] = 1 }
        # QPN 1 is the host'"'"'s QP1 (engine/gsi.h): what is not a CM MAD is dropped there.
        if (names[i] == "no_qp" && ("qp1_dropped" in counter)) { sum += counter["qp1_dropped"]; union["qp1_dropped"] = 1 }
      }
      need[$2] += $3; have[$2] = sum
      for (i = 1; i <= m; i++) union[names[i]] = 1
      need_all += $3
    }
    END {
      # Overlapping sets (ghost, ghost+no_qp) must not count one packet twice: the union
      # of all named counters must hold every packet sent.
      for (c in union) have_all += counter[c]
      if (have_all < need_all) { printf "%s: all named counters %d < %d packets sent\n", who, have_all, need_all; bad = 1 }
      for (k in need) {
        ok = have[k] >= need[k]
        printf "%s: %-40s counted %8d, sent %6d %s\n", who, k, have[k], need[k], ok ? "ok" : "MISSING"
        if (!ok) bad = 1
      }
      exit bad
    }' "$2" || fail "attack packets were not dropped and counted as expected (see above)"
}
check_counters "$log_s" "$att_s" "$s_lid"
check_counters "$log_c" "$att_c" "$c_lid"
echo "run_hostile: $name: passed"
