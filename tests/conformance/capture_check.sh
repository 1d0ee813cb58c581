#!/usr/bin/env bash
# Captures the traffic of an ibv_rc_pingpong pair, of an ibv_xsrq_pingpong pair (XRC:
# opcodes 0xA0-0xB7, requests with an XRCETH) and of an ibv_rc_pingpong pair over IPv6
# (::1, by its GID index; the kernel's own IPv6 headers) running over uroce on `lo` and
# checks it with two independent tools:
#   (a) tshark decodes every uroce packet as InfiniBand (RoCEv2), none malformed, no
#       expert warning or error;
#   (b) tests/tools/icrc_check.py recomputes every ICRC (zlib.crc32, facts sheet §3.1).
#
#   capture_check.sh [--outdir DIR] [--port TCPPORT] [--launcher PATH]
#
# The pairs use TCP ports TCPPORT (RC), TCPPORT+1 (XRC) and TCPPORT+2 (IPv6).
#
# Everything runs in a network namespace of its own whose `lo` takes GSO messages of one
# segment only (gso_max_segs 1): uroce's GSO messages are then split into datagrams before
# the capture point, as a NIC's would be on the wire, each with the IP identification the
# kernel gives it (0, 1, 2, ... within the message) — which the ICRCs must match. (On a
# plain `lo` the capture would see each GSO message as one 64 KiB datagram.)
#
# Needs root to capture (CI runs as root); otherwise exits 77, which CTest reports as
# skipped. Keeps cap.pcap and the logs in DIR (default: ./capture_check).
set -euo pipefail
# The pairs are processes of one host: without this their packets would take the
# same-host path (shared memory), which no capture on an interface sees.
export UROCE_SHM=0

if [[ -z ${CAPTURE_CHECK_NETNS:-} ]]; then
  ((EUID == 0)) || { echo "SKIP: capturing needs root (CI runs as root)"; exit 77; }
  ns=uroce-capture-$$
  ip netns add "$ns" || { echo "capture_check: FAILED: cannot create a network namespace" >&2; exit 1; }
  trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
  ip -n "$ns" link set lo up
  ip -n "$ns" link set dev lo gso_max_segs 1
  rc=0
  ip netns exec "$ns" env CAPTURE_CHECK_NETNS="$ns" bash "${BASH_SOURCE[0]}" "$@" || rc=$?
  exit "$rc"
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
launcher=${UROCE_LAUNCHER:-$here/../../build/bin/uroce}
outdir=capture_check
tcp_port=18730
launcher_args=()
size=4097
iters=20
mtu=1024

while (($#)); do
  case $1 in
    --outdir) outdir=$2; shift 2 ;;
    --port) tcp_port=$2; shift 2 ;;
    --launcher) launcher_args=(--launcher "$2"); launcher=$2; shift 2 ;;
    *) echo "capture_check: unknown option '$1'" >&2; exit 2 ;;
  esac
done

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "capture_check: FAILED: $*" >&2; exit 1; }

((EUID == 0)) || skip "capturing on lo needs root (CI runs as root); run as root to check tshark decoding and ICRCs"
for tool in dumpcap tshark python3; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/setup.sh installs it)"
done

mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
pcap=$outdir/cap.pcap
rm -f "$pcap" "$outdir"/*.log

# 1. Capture: bounded in packets and time; pcap format (icrc_check.py reads pcapng too).
dumpcap_pid=''
cleanup() {
  if [[ -n $dumpcap_pid ]] && kill -0 "$dumpcap_pid" 2>/dev/null; then
    kill -TERM "$dumpcap_pid" 2>/dev/null || true
    wait "$dumpcap_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

dumpcap -q -P -i lo -f "udp portrange 4791-49151" -c 20000 -a duration:120 -w "$pcap" \
  >"$outdir/dumpcap.log" 2>&1 &
dumpcap_pid=$!
for _ in $(seq 100); do
  grep -q "Capturing on" "$outdir/dumpcap.log" && break
  kill -0 "$dumpcap_pid" 2>/dev/null || { cat "$outdir/dumpcap.log" >&2; fail "dumpcap did not start"; }
  sleep 0.1
done
grep -q "Capturing on" "$outdir/dumpcap.log" || fail "dumpcap not capturing after 10 s"
sleep 0.5   # the filter is attached before the message; a little margin costs nothing

# 2. Traffic: ping-pong pairs with a message that is not a multiple of the MTU: RC, then
#    XRC (one client: the target QPs deliver into their own process's SRQ, so there are no
#    relayed datagrams, which are uroce-internal and not RoCE).
"$here/run_pair.sh" ${launcher_args[@]+"${launcher_args[@]}"} --name pingpong \
  --outdir "$outdir" --port "$tcp_port" \
  --expect "^$((2 * size * iters)) bytes in" --expect "^$iters iters in" \
  --reject 'invalid data in page' \
  --server ibv_rc_pingpong -g 0 -c -s "$size" -n "$iters" -m "$mtu" -p "$tcp_port" \
  --client ibv_rc_pingpong -g 0 -c -s "$size" -n "$iters" -m "$mtu" -p "$tcp_port" 127.0.0.1
xrc_port=$((tcp_port + 1))
"$here/run_pair.sh" ${launcher_args[@]+"${launcher_args[@]}"} --name xsrq_pingpong \
  --outdir "$outdir" --port "$xrc_port" --expect '^success$' \
  --server ibv_xsrq_pingpong -g 0 -s "$size" -n "$iters" -m "$mtu" -p "$xrc_port" \
  --client ibv_xsrq_pingpong -g 0 -s "$size" -n "$iters" -m "$mtu" -p "$xrc_port" 127.0.0.1
# IPv6: ::1 by its GID index (the namespace's lo has it unless IPv6 is off).
gid6=$(timeout 20 "$launcher" devices | awk '$1 ~ /^GID\[[0-9]+\]$/ && $2 == "::1," { gsub(/[^0-9]/, "", $1); print $1; exit }')
[[ -n $gid6 ]] || fail "::1 is not among uroce0's GIDs in the capture namespace"
v6_port=$((tcp_port + 2))
"$here/run_pair.sh" ${launcher_args[@]+"${launcher_args[@]}"} --name pingpong6 \
  --outdir "$outdir" --port "$v6_port" \
  --expect "^$((2 * size * iters)) bytes in" --expect "^$iters iters in" --expect "GID ::1$" \
  --reject 'invalid data in page' \
  --server ibv_rc_pingpong -g "$gid6" -c -s "$size" -n "$iters" -m "$mtu" -p "$v6_port" \
  --client ibv_rc_pingpong -g "$gid6" -c -s "$size" -n "$iters" -m "$mtu" -p "$v6_port" 127.0.0.1

sleep 0.5
kill -INT "$dumpcap_pid"
wait "$dumpcap_pid" || true
dumpcap_pid=''
[[ -s $pcap ]] || fail "no capture file written"

# 3. The UDP ports used: uroce reports its UDP port as the LID, and both programs print
#    both sides' LIDs (ibv_rc_pingpong "LID 0x12b7", ibv_xsrq_pingpong "LID 12b7"). LID 0
#    would mean 4791. Only these ports are examined: other traffic on lo is none of this
#    test's business.
lid_ports() {  # LOG... -> the distinct ports, one per line
  grep -ohE 'LID (0x)?[0-9a-fA-F]+' "$@" | sed -E 's/^LID (0x)?//' | while read -r hex; do
    echo $((16#$hex == 0 ? 4791 : 16#$hex))
  done | sort -u
}
mapfile -t rc_ports < <(lid_ports "$outdir"/pingpong.*.log)
mapfile -t xrc_ports < <(lid_ports "$outdir"/xsrq_pingpong.*.log)
mapfile -t v6_ports < <(lid_ports "$outdir"/pingpong6.*.log)
echo "capture_check: UDP ports of the RC pair: ${rc_ports[*]}; of the XRC pair: ${xrc_ports[*]}; of the IPv6 pair: ${v6_ports[*]}"
((${#rc_ports[@]} == 2 && ${#xrc_ports[@]} == 2 && ${#v6_ports[@]} == 2)) ||
  fail "expected each pair's two LIDs (UDP ports) in the output, found: ${rc_ports[*]:-none} / ${xrc_ports[*]:-none} / ${v6_ports[*]:-none}"
ports=("${rc_ports[@]}" "${xrc_ports[@]}" "${v6_ports[@]}")

decode_as=()
for p in "${ports[@]}"; do decode_as+=(-d "udp.port==$p,infiniband"); done
# SEND payloads are application bytes (ibv_rc_pingpong's buffer); Wireshark's heuristic
# upper-layer dissectors (RPC-over-RDMA, SMB Direct, iSER, ...) sometimes take them for
# their protocol and then report them malformed. Only the RoCE headers are checked here.
for h in rpcrdma_infiniband smb_direct_infiniband smcr_infiniband iser_infiniband lnet_ib sdp_infiniband \
  eth_over_ib fc_infiniband nvme_rdma; do
  decode_as+=(--disable-heuristic "$h")
done
filter="udp.port in {$(IFS=,; echo "${ports[*]}")} && !icmp"

# (a) tshark: every frame on those ports decoded as infiniband, nothing malformed, no
#     expert info of severity warning (0x600000) or error (0x800000).
tshark -r "$pcap" "${decode_as[@]}" -Y "$filter" -T fields -E separator=/t \
  -e frame.number -e frame.protocols -e _ws.malformed -e _ws.expert.severity \
  -e _ws.expert.message -e udp.srcport -e udp.dstport \
  >"$outdir/tshark.tsv" 2>"$outdir/tshark.log" \
  || { cat "$outdir/tshark.log" >&2; fail "tshark could not read the capture"; }
frames=$(wc -l <"$outdir/tshark.tsv")
bad=$(awk -F'\t' -v rc=" ${rc_ports[*]} " -v xrc=" ${xrc_ports[*]} " -v v6=" ${v6_ports[*]} " '
  !(index(rc, " " $6 " ") && index(rc, " " $7 " ")) && !(index(xrc, " " $6 " ") && index(xrc, " " $7 " ")) &&
  !(index(v6, " " $6 " ") && index(v6, " " $7 " ")) {
    print "frame " $1 ": UDP " $6 " -> " $7 " is not between the two ports of one pair"; next }
  $2 !~ /(^|:)infiniband(:|$)/ { print "frame " $1 ": not decoded as infiniband: " $2; next }
  $3 != ""                     { print "frame " $1 ": malformed: " $5; next }
  {
    n = split($4, sev, ",")
    for (i = 1; i <= n; i++)
      if (sev[i] + 0 >= 6291456) { print "frame " $1 ": expert info: " $5; next }
  }' "$outdir/tshark.tsv")
echo "capture_check: tshark decoded $frames frames on ports ${ports[*]}; opcodes:"
tshark -r "$pcap" "${decode_as[@]}" -Y "$filter" -T fields -e infiniband.bth.opcode \
  2>/dev/null | sort | uniq -c | sed 's/^/    /'
if [[ -n $bad ]]; then
  echo "$bad" | head -20 >&2
  fail "tshark: $(echo "$bad" | wc -l) bad frames (full list: $outdir/tshark.tsv)"
fi

# Every request packet of the exchanges must be there: each side of each pair sends $iters
# messages of ceil(size/mtu) packets (ACKs come on top); the XRC ones with XRC opcodes
# (0xA0-0xB7: Wireshark names them "Extended Reliable Connection (XRC)").
min_frames=$((3 * 2 * iters * ((size + mtu - 1) / mtu)))
((frames >= min_frames)) || fail "only $frames frames captured, expected at least $min_frames"
xrc_frames=$(tshark -r "$pcap" "${decode_as[@]}" -Y "$filter && infiniband.bth.opcode >= 0xa0 && infiniband.bth.opcode <= 0xb7" \
  -T fields -e frame.number 2>/dev/null | wc -l)
((xrc_frames >= 2 * iters * ((size + mtu - 1) / mtu))) || fail "only $xrc_frames XRC frames captured"
# ... and the IPv6 pair's over IPv6, between ::1 and ::1.
v6_filter="udp.port in {$(IFS=,; echo "${v6_ports[*]}")}"
v6_frames=$(tshark -r "$pcap" "${decode_as[@]}" -Y "$v6_filter && ipv6.src == ::1 && ipv6.dst == ::1 && infiniband" \
  -T fields -e frame.number 2>/dev/null | wc -l)
v6_all=$(tshark -r "$pcap" "${decode_as[@]}" -Y "$v6_filter" -T fields -e frame.number 2>/dev/null | wc -l)
((v6_frames >= 2 * iters * ((size + mtu - 1) / mtu) && v6_frames == v6_all)) ||
  fail "the IPv6 pair: $v6_frames of $v6_all frames are RoCEv2 over IPv6 between ::1 and ::1"
echo "capture_check: the IPv6 pair: $v6_frames frames, all RoCEv2 over IPv6"

# (b) independent ICRC check over the same packets.
port_args=()
for p in "${ports[@]}"; do port_args+=(--port "$p"); done
icrc_out=$(python3 "$here/../tools/icrc_check.py" "$pcap" "${port_args[@]}") \
  || { echo "$icrc_out" | tail -20 >&2; fail "ICRC check failed"; }
echo "capture_check: icrc_check: ${icrc_out##*$'\n'}"
checked=$(sed -n 's/^\([0-9]*\) packets checked.*/\1/p' <<<"$icrc_out")
((checked == frames)) || fail "icrc_check saw $checked packets but tshark $frames"

echo "capture_check: passed"
