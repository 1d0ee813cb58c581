#!/usr/bin/env python3
"""Independent RoCEv2 ICRC checker.

Recomputes the invariant CRC of every RoCEv2 packet in a capture file and compares it
with the 4 bytes the packet carries, exactly as /work/shared/reference/roce-facts.md §3.1
describes it:

    CRC-32 (zlib) over  8 x 0xFF  +  IP header (variant fields set to all-ones)
                      + UDP header (checksum set to all-ones)
                      + BTH (byte 4 set to all-ones) + extended headers + payload + pad
    appended to the packet least-significant byte first.

It shares no code with uroce (only Python's zlib.crc32), so it is an independent check of
the library's ICRC. The capture parser is our own too: classic pcap (any byte order,
µs or ns timestamps) and pcapng; link types Ethernet (1, also what Linux `lo` captures
are), BSD loopback (0), raw IP (101, 228, 229), Linux cooked (113, 276).

    icrc_check.py CAPTURE [--port P ...] [--any-port] [-v]
    icrc_check.py --selftest

A UDP packet is taken as RoCEv2 when its destination or source port is one of the --port
values (default: 4791 only; uroce uses its bound UDP port as the LID, so its packets often
use other ports), or any UDP packet with --any-port. Exit status: 0 when at least one packet
was checked and all matched, 1 otherwise, 2 on a usage/format error.
"""

import argparse
import os
import struct
import sys
import tempfile
import zlib

ROCE_PORT = 4791
BTH_LEN = 12
ICRC_LEN = 4

# ----------------------------------------------------------------------------------
# ICRC


def icrc_input(ip_hdr: bytes, udp_hdr: bytes, roce: bytes) -> bytes:
    """Scratch buffer of §3.1: 8 x 0xFF, masked IP and UDP headers, BTH with byte 4
    masked, everything up to (not including) the ICRC. `roce` is the UDP payload
    including its trailing ICRC."""
    ip = bytearray(ip_hdr)
    version = ip[0] >> 4
    if version == 4:
        ip[1] = 0xFF                      # TOS (DSCP + ECN)
        ip[8] = 0xFF                      # TTL
        ip[10:12] = b"\xff\xff"           # header checksum
    elif version == 6:
        ip[0] |= 0x0F                     # traffic class (low nibble of byte 0) ...
        ip[1:4] = b"\xff\xff\xff"         # ... rest of traffic class + flow label
        ip[7] = 0xFF                      # hop limit
    else:
        raise ValueError("not an IP header")
    udp = bytearray(udp_hdr)
    udp[6:8] = b"\xff\xff"                # UDP checksum
    body = bytearray(roce[:-ICRC_LEN])
    body[4] = 0xFF                        # BTH byte 4: FECN, BECN, Resv6a
    return b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(body)


def icrc(ip_hdr: bytes, udp_hdr: bytes, roce: bytes) -> int:
    return zlib.crc32(icrc_input(ip_hdr, udp_hdr, roce)) & 0xFFFFFFFF


def carried_icrc(roce: bytes) -> int:
    return int.from_bytes(roce[-ICRC_LEN:], "little")


# ----------------------------------------------------------------------------------
# Capture files


class FormatError(Exception):
    pass


def read_pcap(data: bytes):
    """Yields (linktype, captured_bytes, original_length) from a classic pcap file."""
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise FormatError("not a pcap file")
    if len(data) < 24:
        raise FormatError("truncated pcap header")
    linktype = struct.unpack(endian + "I", data[20:24])[0] & 0x0FFFFFFF
    off = 24
    while off + 16 <= len(data):
        _, _, incl, orig = struct.unpack(endian + "IIII", data[off:off + 16])
        off += 16
        if off + incl > len(data):
            raise FormatError("truncated pcap record")
        yield linktype, data[off:off + incl], orig
        off += incl


def read_pcapng(data: bytes):
    """Yields (linktype, captured_bytes, original_length) from a pcapng file."""
    endian = "<"
    interfaces = []
    off = 0
    while off + 12 <= len(data):
        btype = struct.unpack(endian + "I", data[off:off + 4])[0]
        if btype == 0x0A0D0D0A:                       # section header: learn byte order
            bom = data[off + 8:off + 12]
            endian = "<" if bom == b"\x4d\x3c\x2b\x1a" else ">"
            interfaces = []
        blen = struct.unpack(endian + "I", data[off + 4:off + 8])[0]
        if blen < 12 or off + blen > len(data):
            raise FormatError("truncated pcapng block")
        body = data[off + 8:off + blen - 4]
        if btype == 0x00000001:                       # interface description
            interfaces.append(struct.unpack(endian + "H", body[0:2])[0])
        elif btype == 0x00000006:                     # enhanced packet
            ifid, _, _, incl, orig = struct.unpack(endian + "IIIII", body[0:20])
            yield interfaces[ifid], body[20:20 + incl], orig
        elif btype == 0x00000003:                     # simple packet
            orig = struct.unpack(endian + "I", body[0:4])[0]
            yield interfaces[0], body[4:4 + orig], orig
        off += blen


def read_capture(path: str):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] == b"\x0a\x0d\x0d\x0a":
        return read_pcapng(data)
    return read_pcap(data)


def ip_packet(linktype: int, frame: bytes):
    """The IP packet inside a link-layer frame, or None."""
    if linktype == 1:                                 # Ethernet (Linux lo too)
        off, ethertype = 14, struct.unpack(">H", frame[12:14])[0] if len(frame) >= 14 else 0
        while ethertype in (0x8100, 0x88A8) and len(frame) >= off + 4:   # VLAN tags
            ethertype = struct.unpack(">H", frame[off + 2:off + 4])[0]
            off += 4
        return frame[off:] if ethertype in (0x0800, 0x86DD) else None
    if linktype == 0:                                 # BSD loopback: 4-byte family
        return frame[4:]
    if linktype in (101, 228, 229):                   # raw IP / IPv4 / IPv6
        return frame
    if linktype == 113:                               # Linux cooked (SLL)
        return frame[16:] if frame[14:16] in (b"\x08\x00", b"\x86\xdd") else None
    if linktype == 276:                               # Linux cooked v2 (SLL2)
        return frame[20:] if frame[0:2] in (b"\x08\x00", b"\x86\xdd") else None
    return None


def udp_datagram(ip: bytes):
    """(ip_header, udp_header, udp_payload) of an unfragmented UDP/IP packet, else None.
    Raises ValueError for a UDP packet that cannot be checked (options, fragments)."""
    if len(ip) < 20:
        return None
    version = ip[0] >> 4
    if version == 4:
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack(">H", ip[2:4])[0]
        if ip[9] != 17:
            return None
        if ihl != 20:
            raise ValueError("IPv4 header with options")
        if struct.unpack(">H", ip[6:8])[0] & 0x3FFF:
            raise ValueError("fragmented IPv4 packet")
        hdr_len = 20
        ip = ip[:total]                               # drop Ethernet padding
    elif version == 6:
        if len(ip) < 40 or ip[6] != 17:              # no extension headers expected
            return None
        hdr_len = 40
        ip = ip[:40 + struct.unpack(">H", ip[4:6])[0]]
    else:
        return None
    udp = ip[hdr_len:hdr_len + 8]
    if len(udp) < 8:
        raise ValueError("truncated UDP header")
    udp_len = struct.unpack(">H", udp[4:6])[0]
    if udp_len < 8 or hdr_len + udp_len > len(ip):
        raise ValueError("UDP length does not match the IP packet")
    return ip[:hdr_len], udp, ip[hdr_len + 8:hdr_len + udp_len]


# ----------------------------------------------------------------------------------
# Checking a capture


def check_capture(path: str, ports=(), any_port=False, verbose=False, out=sys.stdout):
    """Returns (checked, ok, problems)."""
    roce_ports = set(ports) or {ROCE_PORT}
    checked = ok = 0
    problems = []
    for number, (linktype, frame, orig_len) in enumerate(read_capture(path), start=1):
        ip = ip_packet(linktype, frame)
        if ip is None:
            continue
        try:
            d = udp_datagram(ip)
        except ValueError as e:
            problems.append(f"frame {number}: cannot check: {e}")
            continue
        if d is None:
            continue
        ip_hdr, udp_hdr, roce = d
        sport, dport = struct.unpack(">HH", udp_hdr[0:4])
        if not any_port and sport not in roce_ports and dport not in roce_ports:
            continue
        if len(frame) < orig_len:
            problems.append(f"frame {number}: truncated by the capture's snap length")
            continue
        if len(roce) < BTH_LEN + ICRC_LEN:
            problems.append(f"frame {number}: {sport}->{dport}: {len(roce)} bytes is too "
                            "short for BTH + ICRC")
            continue
        checked += 1
        want, have = icrc(ip_hdr, udp_hdr, roce), carried_icrc(roce)
        psn = int.from_bytes(roce[9:12], "big")
        desc = (f"frame {number}: {sport}->{dport} opcode 0x{roce[0]:02x} "
                f"QP 0x{int.from_bytes(roce[5:8], 'big'):06x} PSN {psn} len {len(roce)}")
        if want == have:
            ok += 1
            if verbose:
                print(f"{desc}: ICRC 0x{want:08x} ok", file=out)
        else:
            problems.append(f"{desc}: ICRC mismatch: computed 0x{want:08x}, packet carries "
                            f"0x{have:08x} (wire bytes {roce[-4:].hex()})")
    return checked, ok, problems


# ----------------------------------------------------------------------------------
# Self-test with the facts sheet's vectors (roce-facts.md §3.2)

VECTORS = {
    # V1: CNP generated by ConnectX-4 Lx hardware; CRC32 0x2A00FD82.
    "V1": ("e41d2dab2bc27cfe90643b32080045c2003c718c400040119161 0a001101 0a001201"
           "000012b700280000 8100ffff40000118 00000000 00000000000000000000000000000000"
           "82fd002a", 0x2A00FD82),
    # V2: UC SEND_ONLY, MigReq, PadCnt 2, 20-byte payload.
    "V2": ("248a07a8fa22248a07a8fa22080045010040047840004011b4d5c0a80007c0a80007c00012b7"
           "002caca2 2460ffff000000d300cf17104630818be28935d90e9a95505401be885e500000"
           "78f353f3", 0xF353F378),
    # V3: RC ACKNOWLEDGE, AETH 0x1F, MSN 1, UDP checksum 0.
    "V3": ("020000000001020000000002080045000030000740004011b962c0a80002c0a80001c00212b7"
           "001c0000 1100ffff00000012000001001f000001 a60cd6fe", 0xFED60CA6),
}
V3_CRC_INPUT = ("ffffffffffffffff45ff003000074000ff11ffffc0a80002c0a80001c00212b7001cffff"
                "1100ffffff000012000001001f000001")
# V5 (IPv6) is self-derived in the facts sheet (marked unverified there); this checker
# (rxe_icrc.c's IPv6 masking) and uroce's wire::icrc_ipv6 agree on CRC32 0x4CA6BD05.
V5 = ("02000000000202000000000186dd6681234500201140fd000000000000000000000000000001fd00"
      "000000 0000000000000000000002c00112b7002069dd0430ffff000000118000010068656c6c6f"
      "000000 05bda64c")


def frame_of(hexstr: str) -> bytes:
    return bytes.fromhex("".join(hexstr.split()))


def write_pcap(path: str, frames) -> None:
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1))
        for i, fr in enumerate(frames):
            f.write(struct.pack("<IIII", 1700000000 + i, 0, len(fr), len(fr)))
            f.write(fr)


def selftest() -> int:
    failures = 0

    def report(name, good, detail=""):
        nonlocal failures
        failures += 0 if good else 1
        print(f"  {'ok  ' if good else 'FAIL'} {name}{': ' + detail if detail else ''}")

    print("icrc_check self-test (vectors of roce-facts.md §3.2)")
    frames = {}
    for name, (hexstr, crc) in VECTORS.items():
        fr = frame_of(hexstr)
        frames[name] = fr
        ip = ip_packet(1, fr)
        ip_hdr, udp_hdr, roce = udp_datagram(ip)
        got = icrc(ip_hdr, udp_hdr, roce)
        report(f"{name} CRC32 0x{crc:08X}", got == crc == carried_icrc(roce),
               f"computed 0x{got:08X}, carried 0x{carried_icrc(roce):08X}")

    ip_hdr, udp_hdr, roce = udp_datagram(ip_packet(1, frames["V3"]))
    report("V3 masked CRC input matches the facts sheet",
           icrc_input(ip_hdr, udp_hdr, roce).hex() == V3_CRC_INPUT)
    report("~crc32(8 x 0xFF) == 0xDEBB20E3 (rxe's seed)",
           (~zlib.crc32(b"\xff" * 8)) & 0xFFFFFFFF == 0xDEBB20E3)

    # The whole pipeline: write the vectors into a pcap and check it like a capture.
    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "good.pcap")
        write_pcap(good, frames.values())
        checked, ok, problems = check_capture(good)
        report("pcap of V1-V3: 3 checked, 3 ok", (checked, ok, problems) == (3, 3, []),
               f"{checked} checked, {ok} ok, {problems}")

        bad = bytearray(frames["V2"])
        bad[60] ^= 0x01                               # flip one payload bit
        masked = bytearray(frames["V3"])
        masked[15] ^= 0xFC                            # IPv4 TOS: masked, ICRC still valid
        masked[22] = 1                                # TTL: masked too
        masked[42 + 4] = 0xC0                         # BTH FECN/BECN: masked
        unmasked = bytearray(frames["V3"])
        unmasked[42 + 8] ^= 0x80                      # BTH AckReq: covered by the ICRC
        path = os.path.join(tmp, "mixed.pcap")
        write_pcap(path, [bytes(bad), bytes(masked), bytes(unmasked)])
        checked, ok, problems = check_capture(path)
        report("corrupted payload and AckReq bit detected, masked fields ignored",
               (checked, ok, len(problems)) == (3, 1, 2),
               f"{checked} checked, {ok} ok, {len(problems)} problems")

        empty = os.path.join(tmp, "empty.pcap")
        write_pcap(empty, [])
        report("empty capture checks nothing", check_capture(empty)[0] == 0)

    ip_hdr, udp_hdr, roce = udp_datagram(ip_packet(1, frame_of(V5)))
    got = icrc(ip_hdr, udp_hdr, roce)
    report("V5 (IPv6) CRC32 0x4CA6BD05", got == 0x4CA6BD05 == carried_icrc(roce),
           f"computed 0x{got:08X}, carried 0x{carried_icrc(roce):08X}")
    masked6 = bytearray(frame_of(V5))
    masked6[14] ^= 0x0F                           # IPv6 traffic class nibble: masked
    masked6[15:18] = b"\x00\x00\x00"             # traffic class + flow label: masked
    masked6[21] = 1                               # hop limit: masked
    ip_hdr, udp_hdr, roce = udp_datagram(ip_packet(1, bytes(masked6)))
    report("V5 with other traffic class, flow label and hop limit still matches",
           icrc(ip_hdr, udp_hdr, roce) == 0x4CA6BD05)

    print("self-test " + ("passed" if failures == 0 else f"FAILED ({failures} failures)"))
    return 0 if failures == 0 else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Check the ICRC of every RoCEv2 packet in "
                                 "a pcap/pcapng capture (independent of uroce).")
    ap.add_argument("capture", nargs="?", help="pcap or pcapng file")
    ap.add_argument("--port", type=int, action="append", default=[],
                    help="treat UDP packets from/to this port as RoCEv2 (repeatable; "
                    "default 4791)")
    ap.add_argument("--any-port", action="store_true", help="treat every UDP packet as RoCEv2")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every packet")
    ap.add_argument("--selftest", action="store_true",
                    help="verify the facts sheet's vectors V1-V3 and V5 and exit")
    args = ap.parse_args(argv)
    if args.selftest:
        return selftest()
    if not args.capture:
        ap.error("a capture file is required (or --selftest)")
    try:
        checked, ok, problems = check_capture(args.capture, args.port, args.any_port,
                                              args.verbose)
    except (OSError, FormatError, IndexError, KeyError, struct.error) as e:
        print(f"icrc_check: {args.capture}: {e}", file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    print(f"{checked} packets checked, {ok} ok")
    if checked == 0:
        print("icrc_check: no RoCEv2 packets found", file=sys.stderr)
    return 0 if checked > 0 and ok == checked and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
