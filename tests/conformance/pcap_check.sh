#!/usr/bin/env bash
# UROCE_PCAP: each process's own capture of what it sends and receives, including the
# same-host path that no capture on an interface sees.
#
#   pcap_check.sh LAUNCHER TCP_PORT OUTDIR
#
# Receive: an ibv_rc_pingpong pair (4097-byte messages, MTU 1024: first/middle/last
#          packets and ACKs) on 127.0.0.1 with UROCE_PCAP=OUTDIR/cap-%p.pcap — over the
#          same-host path by default, over UDP when the suite runs with UROCE_SHM=0.
# Expect:  one file per process; tshark decodes every frame on the two LIDs' ports as
#          infiniband, none malformed, with SEND first/middle/last and ACK opcodes;
#          tests/tools/icrc_check.py verifies every ICRC; the two files hold the same
#          packets (each side sees what the other sent, and its own; compared as
#          distinct ports/opcode/PSN, since a late retransmission may find its receiver gone).
#          Then with UROCE_PCAP_LIMIT_MB=1 and 64 KiB messages (5 MB of traffic): the
#          file stays within 1 MiB and still holds only whole, valid packets.
#          Then over IPv6 (the GID of ::1, when the host has it): every record is an
#          IPv6 packet (the files are LINKTYPE_RAW, which carries both), decoded as
#          infiniband with the same checks and every ICRC (IPv6 pseudo-header) valid.
# No root needed: nothing is captured on an interface. Skipped (77) without tshark.
set -euo pipefail
launcher=$1 port=$2 outdir=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v tshark >/dev/null || { echo "SKIP: tshark is not installed (scripts/setup.sh installs it)"; exit 77; }
fail() { echo "pcap_check: FAIL: $*" >&2; exit 1; }
rm -rf "$outdir" && mkdir -p "$outdir"

run_pair() { # NAME ARGS...: the pair with captures in OUTDIR/NAME-<pid>.pcap; LID ports in $ports
  local name=$1            # ($gid: the GID index, default 0)
  shift
  UROCE_PCAP="$outdir/$name-%p.pcap" timeout 30 "$launcher" run ibv_rc_pingpong -g "${gid:-0}" -p "$port" "$@" \
    >"$outdir/$name.server.log" 2>&1 &
  local server=$!
  for _ in $(seq 100); do grep -q ":$(printf '%04X' "$port") 00000000:0000 0A" /proc/net/tcp && break; sleep 0.05; done
  UROCE_PCAP="$outdir/$name-%p.pcap" timeout 30 "$launcher" run ibv_rc_pingpong -g "${gid:-0}" -p "$port" "$@" 127.0.0.1 \
    >"$outdir/$name.client.log" 2>&1 || { kill "$server" 2>/dev/null; fail "$name: client failed"; }
  wait "$server" || fail "$name: server failed"
  ports=$(grep -ho 'local address:  LID 0x[0-9a-f]*' "$outdir/$name".*.log | while read -r _ _ _ lid; do echo $((lid)); done)
  [[ $(wc -w <<<"$ports") == 2 ]] || fail "$name: no LIDs in the logs"
}

# The distinct packets between the pair's ports (ports, opcode, PSN), one per line. Only
# those: every engine also joins the host port 4791, so a MAD another test's process sends
# there may land in either capture.
packet_keys() {
  local decode
  mapfile -t decode < <(decode_args)
  tshark -r "$1" "${decode[@]}" -Y "$(pair_filter)" -T fields -e udp.srcport -e udp.dstport \
    -e infiniband.bth.opcode -e infiniband.bth.psn 2>/dev/null | sort -u
}

same_packets() { # NAME FILE1 FILE2: both processes recorded the same packets
  # Compared as distinct packets: a retransmission whose receiver had already exited (a
  # tail-loss probe that crossed the peer's last ACK) is in the sender's file only.
  local k2 k3 d
  k2=$(packet_keys "$2") k3=$(packet_keys "$3")
  [[ -n $k2 ]] || fail "$1: no packets between the pair's ports in $2"
  d=$(diff <(echo "$k2") <(echo "$k3") | grep '^[<>]' | head -5 || true)
  [[ -z $d ]] || fail "$1: the two captures differ (ports, opcode, PSN; < only in $2, > only in $3): $d"
}

pair_filter() { # tshark's display filter: a packet from or to one of the pair's ports
  local filter="" p
  for p in $ports; do filter+="${filter:+ || }udp.port==$p"; done
  echo "$filter"
}

decode_args() { # tshark's arguments: the LIDs' ports as infiniband, no upper-layer heuristics
  for p in $ports; do printf '%s\n' -d "udp.port==$p,infiniband"; done
  # Heuristic dissectors (as in capture_check.sh) may take SEND payloads for their protocol.
  for h in rpcrdma_infiniband smb_direct_infiniband smcr_infiniband iser_infiniband lnet_ib sdp_infiniband \
    eth_over_ib fc_infiniband nvme_rdma; do printf '%s\n' --disable-heuristic "$h"; done
}

check_file() { # PCAP: decoded by tshark and every ICRC valid; prints its packet count
  local pcap=$1 decode
  mapfile -t decode < <(decode_args)
  local frames
  frames=$(tshark -r "$pcap" "${decode[@]}" -Y "$(pair_filter)" -T fields \
             -e frame.protocols -e _ws.malformed -e _ws.expert.severity 2>/dev/null)
  [[ -n $frames ]] || fail "$pcap: no frames"
  local bad
  bad=$(awk -F'\t' '$1 !~ /:infiniband/ || $2 != "" || $3 != "" ' <<<"$frames" | head -3)
  [[ -z $bad ]] || fail "$pcap: frames not decoded cleanly: $bad"
  python3 "$here/../tools/icrc_check.py" "$pcap" --any-port >"$pcap.icrc" || fail "$pcap: ICRC check: $(tail -1 "$pcap.icrc")"
  wc -l <<<"$frames"
}

run_pair small -n 50 -s 4097 -m 1024
files=("$outdir"/small-*.pcap)
((${#files[@]} == 2)) || fail "expected 2 capture files, found ${#files[@]}"
n1=$(check_file "${files[0]}") n2=$(check_file "${files[1]}")
echo "pcap_check: ${files[0]}: $n1 packets, ${files[1]}: $n2 packets, every ICRC valid"
same_packets "small" "${files[@]}"
mapfile -t decode < <(decode_args)
opcodes=$(tshark -r "${files[0]}" "${decode[@]}" -T fields -e infiniband.bth.opcode 2>/dev/null | sort -u | tr '\n' ' ')
for op in 0 1 2 17; do # SEND first, middle, last; ACK
  [[ " $opcodes " == *" $op "* ]] || fail "opcode $op not in the capture (saw: $opcodes)"
done

UROCE_PCAP_LIMIT_MB=1 run_pair limited -n 40 -s 65536
for f in "$outdir"/limited-*.pcap; do
  size=$(stat -c %s "$f")
  ((size <= 1048576)) || fail "$f: $size bytes beyond the 1 MiB limit"
  check_file "$f" >/dev/null
done
gid6=$(timeout 20 "$launcher" devices | awk '$1 ~ /^GID\[[0-9]+\]$/ && $2 == "::1," { gsub(/[^0-9]/, "", $1); print $1; exit }')
if [[ -n $gid6 ]]; then
  gid=$gid6 run_pair ipv6 -n 50 -s 4097 -m 1024
  files=("$outdir"/ipv6-*.pcap)
  ((${#files[@]} == 2)) || fail "ipv6: expected 2 capture files, found ${#files[@]}"
  n1=$(check_file "${files[0]}") n2=$(check_file "${files[1]}")
  same_packets ipv6 "${files[@]}"
  mapfile -t decode < <(decode_args)
  counts=("$n1" "$n2")
  for i in 0 1; do
    f=${files[$i]}
    v6=$(tshark -r "$f" "${decode[@]}" -Y 'ipv6.src == ::1 && ipv6.dst == ::1 && infiniband' 2>/dev/null | wc -l)
    ((v6 == counts[i])) || fail "$f: $v6 of ${counts[i]} packets are IPv6 packets between ::1 and ::1"
  done
  echo "pcap_check: IPv6 (GID $gid6, ::1): $n1 and $n2 packets, all IPv6, every ICRC valid"
else
  echo "pcap_check: ::1 is not among the GIDs: the IPv6 capture is skipped"
fi
echo "pcap_check: PASSED"
