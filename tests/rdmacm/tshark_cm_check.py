#!/usr/bin/env python3
"""Wireshark reads back uroce's CM messages.

Runs cm_mad_dump (one REQ, REP, REJ and DREQ as 256-byte MADs), wraps each MAD
as the IB CM carries it on RoCEv2 (roce-facts 7.1: UD SEND_ONLY to QP 1, Q_Key
0x80010000, UDP port 4791), writes a pcap and checks the fields tshark decodes
against the values cm_mad_dump encoded. The ICRC is not filled in: tshark does
not check it (roce-facts 8).

Usage: tshark_cm_check.py CM_MAD_DUMP   (exit 77 = skipped: no tshark)
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

EXPECTED = {
    # REQ
    "infiniband.cm.req.serviceid.protocol": "0x06",  # IP CM service ID, TCP port space
    "infiniband.cm.req.serviceid.dport": "0x1d2f",   # 7471
    "infiniband.cm.req.localcaguid": "0x0211223344556677",
    "infiniband.cm.req.localqpn": "0xabcdef",
    "infiniband.cm.req.responderres": "0x01",
    "infiniband.cm.req.initdepth": "0x01",
    "infiniband.cm.req.transpsvctype": "0x00",  # RC
    "infiniband.cm.req.startpsn": "0x123456",
    "infiniband.cm.req.retrcount": "0x07",
    "infiniband.cm.req.pkey": "0xffff",
    "infiniband.cm.req.pppmtu": "0x05",  # 4096
    "infiniband.cm.req.rnrretrcount": "0x07",
    "infiniband.cm.req.maxcmretr": "0x0f",
    "infiniband.cm.req.prim_locallid": "4791",  # the UDP port (design 3)
    "infiniband.cm.req.prim_remotelid": "30000",
    "infiniband.cm.req.prim_localgid_ipv4": "127.0.0.1",
    "infiniband.cm.req.prim_remotegid_ipv4": "192.0.2.2",
    "infiniband.cm.req.prim_hoplim": "0x40",
    "infiniband.cm.req.prim_localacktout": "0x0e",
    "infiniband.cm.req.ip_cm.ipv": "0x04",
    "infiniband.cm.req.ip_cm.sport": "0x9c40",  # 40000
    "infiniband.cm.req.ip_cm.sip4": "127.0.0.1",
    "infiniband.cm.req.ip_cm.dip4": "192.0.2.2",
    # REP
    "infiniband.cm.rep.remotecommid": "0x11223344",
    "infiniband.cm.rep.localqpn": "0x000042",
    "infiniband.cm.rep.startpsn": "0x654321",
    "infiniband.cm.rep.rnrretrcount": "0x07",
    "infiniband.cm.rep.localcaguid": "0x02aabbccddeeff00",
    # REJ
    "infiniband.cm.rej.remotecommid": "0x11223344",
    "infiniband.cm.rej.reason": "0x001c",  # 28, consumer defined
    # DREQ
    "infiniband.cm.dreq.remotecommid": "0x11223344",
    "infiniband.cm.req.remoteqpneecn": "0xabcdef",  # (tshark's name for the DREQ's remote QPN)
}


def frame(mad: bytes) -> bytes:
    bth = struct.pack("!BBHII", 0x64, 0, 0xFFFF, 1, 0)  # UD SEND_ONLY, dest QP 1
    deth = struct.pack("!II", 0x80010000, 1)             # GSI Q_Key, source QP 1
    payload = bth + deth + mad + b"\0" * 4                # ICRC not checked by tshark
    udp = struct.pack("!HHHH", 49152, 4791, 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                     bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1]))
    csum = sum(struct.unpack("!10H", ip))
    while csum >> 16:
        csum = (csum & 0xFFFF) + (csum >> 16)
    ip = ip[:10] + struct.pack("!H", ~csum & 0xFFFF) + ip[12:]
    return b"\x02\0\0\0\0\x01\x02\0\0\0\0\x02\x08\x00" + ip + udp


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    tshark = shutil.which("tshark")
    if not tshark:
        print("tshark not found: skipped")
        return 77
    dump = subprocess.run([sys.argv[1]], check=True, capture_output=True, text=True).stdout
    mads = [bytes.fromhex(line.split()[1]) for line in dump.splitlines()]
    with tempfile.TemporaryDirectory() as tmp:
        pcap = os.path.join(tmp, "cm.pcap")
        with open(pcap, "wb") as f:
            f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))  # Ethernet
            for i, mad in enumerate(mads):
                fr = frame(mad)
                f.write(struct.pack("<IIII", i, 0, len(fr), len(fr)) + fr)
        fields = list(EXPECTED)
        cmd = [tshark, "-r", pcap, "-T", "fields", "-E", "separator=|"]
        for name in fields:
            cmd += ["-e", name]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    seen = {}
    for line in out.splitlines():
        for name, value in zip(fields, line.split("|")):
            if value:
                seen[name] = value
    bad = [f"{n}: expected {v}, tshark says {seen.get(n, '(nothing)')}" for n, v in EXPECTED.items()
           if seen.get(n) != v]
    for b in bad:
        print("MISMATCH", b)
    print(f"{len(EXPECTED) - len(bad)}/{len(EXPECTED)} CM fields decoded as encoded")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
