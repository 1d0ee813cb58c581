#!/usr/bin/env python3
"""Compares the RoCEv2 packets uroce and rxe sent in one capture, field by field.

    pcap_compare.py CAPTURE --uroce IP [--uroce IP6] --rxe IP [--rxe IP6] --allow ALLOW_LIST

Every IPv4 or IPv6 UDP packet to UDP port 4791 between the two sides' addresses is taken
as RoCEv2. Each packet's ICRC is recomputed by tests/tools/icrc_check.py (which shares no
code with uroce) and must match; so must the IPv4 header checksum and a non-zero UDP
checksum. Then, for each header field below, the set of values each side sent is compared:

  ip.version ip.dscp ip.ecn; IPv4: ip.ihl ip.flags ip.frag_offset ip.ttl ip.id (0 or
  nonzero) ip.header_checksum; IPv6: ip6.flow_label (0 or nonzero) ip6.hop_limit;
  udp.dport udp.sport (below or from 0xC000) udp.checksum (0, valid,
  INVALID) bth.tver bth.pkey bth.migreq bth.byte4 (FECN, BECN, resv6a) bth.resv7 (the 7
  bits beside AckReq), and for each opcode both sent: bth.se, bth.ackreq, bth.padcnt,
  payload length; aeth.syndrome of ACKs and atomic ACKs.

A request packet whose destination QP and PSN its side already sent is a retransmission:
it is counted and checked like the others, but its AckReq is not compared (uroce's
tail-loss probe resends one packet, whichever it is, with AckReq: docs/architecture.md
"Reliability"; the first transmissions of both sides are compared as they are).

A field whose sets differ fails the comparison unless the allow-list has a line
`FIELD RXE_VALUES UROCE_VALUES REASON...` with exactly those sets (values comma-separated,
'#' starts a comment; a field may have several lines, one per pair of sets). A field
whose allowed differences are none of them seen is reported (its lines can go). Exit status 0 when both sides sent packets, every check held and every
difference was allowed; 1 otherwise.
"""
import argparse
import collections
import ipaddress
import os
import struct
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import icrc_check  # noqa: E402  (tests/tools: the project's independent ICRC checker)

OPCODES = {
    0x00: "RC_SEND_FIRST", 0x01: "RC_SEND_MIDDLE", 0x02: "RC_SEND_LAST", 0x04: "RC_SEND_ONLY",
    0x06: "RC_WRITE_FIRST", 0x07: "RC_WRITE_MIDDLE", 0x08: "RC_WRITE_LAST", 0x0A: "RC_WRITE_ONLY",
    0x0C: "RC_READ_REQUEST", 0x0D: "RC_READ_RESPONSE_FIRST", 0x0E: "RC_READ_RESPONSE_MIDDLE",
    0x0F: "RC_READ_RESPONSE_LAST", 0x10: "RC_READ_RESPONSE_ONLY", 0x11: "RC_ACK",
    0x12: "RC_ATOMIC_ACK", 0x13: "RC_CMP_SWAP", 0x14: "RC_FETCH_ADD",
}
# Bytes of extended headers after the BTH: RETH 16, AETH 4, AtomicETH 28, AtomicAckETH 8.
EXT_HEADERS = {0x06: 16, 0x0A: 16, 0x0C: 16, 0x0D: 4, 0x0F: 4, 0x10: 4, 0x11: 4, 0x12: 12, 0x13: 28,
               0x14: 28}


def ones_complement_sum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def udp_checksum(ip, udp, payload):
    if struct.unpack(">H", udp[6:8])[0] == 0:
        return "0"
    if ip[0] >> 4 == 6:  # source, destination, upper-layer length, next header
        pseudo = ip[8:40] + b"\0\0" + udp[4:6] + b"\0\0\0\x11"
    else:
        pseudo = ip[12:20] + b"\0\x11" + udp[4:6]
    return "valid" if ones_complement_sum(pseudo + udp + payload) == 0xFFFF else "INVALID"


def ip_fields(ip):
    """-> {field: value} of an IPv4 or IPv6 header."""
    f = {"ip.version": ip[0] >> 4}
    if f["ip.version"] == 6:
        tclass = (ip[0] & 0xF) << 4 | ip[1] >> 4
        f["ip.dscp"], f["ip.ecn"] = tclass >> 2, tclass & 3
        f["ip6.flow_label"] = "0" if struct.unpack(">I", ip[0:4])[0] & 0xFFFFF == 0 else "nonzero"
        f["ip6.hop_limit"] = ip[7]
        return f
    flags = struct.unpack(">H", ip[6:8])[0]
    f["ip.ihl"] = (ip[0] & 0xF) * 4
    f["ip.dscp"], f["ip.ecn"] = ip[1] >> 2, ip[1] & 3
    f["ip.flags"] = ("DF" if flags & 0x4000 else "") + ("MF" if flags & 0x2000 else "") or "none"
    f["ip.frag_offset"] = flags & 0x1FFF
    f["ip.ttl"] = ip[8]
    f["ip.id"] = "0" if ip[4:6] == b"\0\0" else "nonzero"
    f["ip.header_checksum"] = "valid" if ones_complement_sum(bytes(ip)) == 0xFFFF else "INVALID"
    return f


def addresses(ip):
    """-> (source, destination) of an IPv4 or IPv6 header, as ipaddress writes them."""
    if ip[0] >> 4 == 6:
        return str(ipaddress.IPv6Address(bytes(ip[8:24]))), str(ipaddress.IPv6Address(bytes(ip[24:40])))
    return str(ipaddress.IPv4Address(bytes(ip[12:16]))), str(ipaddress.IPv4Address(bytes(ip[16:20])))


def fields_of(ip, udp, roce):
    """-> {field: value} of one packet."""
    f = ip_fields(ip)
    sport, dport = struct.unpack(">HH", udp[0:4])
    f["udp.dport"] = dport
    f["udp.sport"] = ">=0xC000" if sport >= 0xC000 else "<0xC000"
    f["udp.checksum"] = udp_checksum(ip, udp, roce)
    op = roce[0]
    name = OPCODES.get(op, "op0x%02x" % op)
    f["bth.tver"] = roce[1] & 0xF
    f["bth.pkey"] = "0x%04x" % struct.unpack(">H", roce[2:4])[0]
    f["bth.migreq"] = (roce[1] >> 6) & 1
    f["bth.byte4"] = "0x%02x" % roce[4]
    f["bth.resv7"] = roce[8] & 0x7F
    f["bth.se[%s]" % name] = roce[1] >> 7
    f["bth.ackreq[%s]" % name] = roce[8] >> 7
    pad = (roce[1] >> 4) & 3
    f["bth.padcnt[%s]" % name] = pad
    hdr = 12 + EXT_HEADERS.get(op, 0)
    f["payload_len[%s]" % name] = len(roce) - hdr - 4 - pad
    if op in (0x11, 0x12):
        f["aeth.syndrome[%s]" % name] = "0x%02x" % roce[12]
    return f


def analyse(path, addrs):
    """-> ({side: {field: Counter}}, {side: packets}, [problems])"""
    seen = {side: collections.defaultdict(collections.Counter) for side in addrs.values()}
    count, resent = collections.Counter(), collections.Counter()
    sent = set()  # (side, destination QPN, PSN) of the request packets seen
    problems = []
    for number, (linktype, frame, orig_len) in enumerate(icrc_check.read_capture(path), 1):
        ip = icrc_check.ip_packet(linktype, frame)
        if ip is None or ip[0] >> 4 not in (4, 6):
            continue
        try:
            d = icrc_check.udp_datagram(ip)
        except ValueError as e:
            problems.append("frame %d: %s" % (number, e))
            continue
        if d is None:
            continue
        iph, udp, roce = d
        src, dst = addresses(iph)
        if src not in addrs or dst not in addrs or struct.unpack(">H", udp[2:4])[0] != 4791:
            continue
        side = addrs[src]
        count[side] += 1
        if len(frame) < orig_len or len(roce) < 16:
            problems.append("frame %d (%s): truncated" % (number, side))
            continue
        if icrc_check.icrc(iph, udp, roce) != icrc_check.carried_icrc(roce):
            problems.append("frame %d (%s): bad ICRC" % (number, side))
        again = is_request(roce) and (side, roce[5:8], roce[9:12]) in sent
        if is_request(roce):
            sent.add((side, roce[5:8], roce[9:12]))
        resent[side] += again
        for k, v in fields_of(iph, udp, roce).items():
            if not (again and k.startswith("bth.ackreq[")):
                seen[side][k][v] += 1
    for side in addrs.values():
        if not count[side]:
            problems.append("no RoCEv2 packet from %s" % side)
        for k, c in seen[side].items():
            for bad in ("INVALID",):
                if c.get(bad):
                    problems.append("%s: %d packets with an %s %s" % (side, c[bad], bad.lower(), k))
    return seen, count, resent, problems


def is_request(roce):
    """An RC SEND, RDMA WRITE or RDMA READ request packet (what a requester resends)."""
    return roce[0] <= 0x0C


def read_allow(path):
    """-> {field: [(rxe_values, uroce_values, reason)...]}"""
    allow = collections.defaultdict(list)
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(None, 3)
            if len(parts) < 4:
                raise SystemExit("%s:%d: want FIELD RXE_VALUES UROCE_VALUES REASON" % (path, n))
            allow[parts[0]].append((set(parts[1].split(",")), set(parts[2].split(",")), parts[3]))
    return allow


def allowed(allow, field, rxe_values, uroce_values):
    """The reason of the allow-list line for exactly these sets of the field, else None."""
    return next((reason for r, u, reason in allow.get(field, []) if (r, u) == (rxe_values, uroce_values)), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("capture")
    ap.add_argument("--uroce", required=True, action="append", help="repeatable (IPv4, IPv6)")
    ap.add_argument("--rxe", required=True, action="append", help="repeatable (IPv4, IPv6)")
    ap.add_argument("--allow", required=True)
    a = ap.parse_args()
    addrs = {str(ipaddress.ip_address(x)): "uroce" for x in a.uroce}
    addrs.update({str(ipaddress.ip_address(x)): "rxe" for x in a.rxe})
    seen, count, resent, problems = analyse(a.capture, addrs)
    allow = read_allow(a.allow)
    print("%s: %d packets from rxe (%s), %d from uroce (%s); retransmissions: rxe %d, uroce %d"
          % (a.capture, count["rxe"], " ".join(a.rxe), count["uroce"], " ".join(a.uroce), resent["rxe"],
             resent["uroce"]))
    print("%-34s %-28s %-28s %s" % ("field", "rxe", "uroce", "verdict"))
    unexpected = 0
    for k in sorted(set(seen["rxe"]) | set(seen["uroce"])):
        r = {str(v) for v in seen["rxe"].get(k, {})}
        u = {str(v) for v in seen["uroce"].get(k, {})}
        if not r or not u:
            verdict = "(one side only: not compared)"
        elif r == u:
            verdict = "same"
        elif (reason := allowed(allow, k, r, u)) is not None:
            verdict = "allowed: " + reason
        else:
            verdict = "DIFFERENT"
            unexpected += 1
        print("%-34s %-28s %-28s %s" % (k, ",".join(sorted(r)) or "-", ",".join(sorted(u)) or "-",
                                         verdict))
        if verdict == "DIFFERENT":
            problems.append("field %s differs: rxe %s, uroce %s (not in %s)" %
                            (k, sorted(r), sorted(u), a.allow))
    for k, lines in sorted(allow.items()):
        r, u = ({str(v) for v in seen[side].get(k, {})} for side in ("rxe", "uroce"))
        if allowed(allow, k, r, u) is None:  # none of the field's lines seen
            for r, u, _ in lines:
                print("note: allowed difference %s (rxe %s, uroce %s) not seen: the line can go"
                      % (k, ",".join(sorted(r)), ",".join(sorted(u))))
    checked = count["rxe"] + count["uroce"]
    if problems:
        for p in problems[:50]:
            print("PROBLEM: " + p)
        return 1
    print("every packet's ICRC (%d) and checksums correct; every difference allowed" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
