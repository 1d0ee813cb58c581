#!/usr/bin/env python3
"""Writes the seed corpus of the `packet` fuzz target (tests/fuzz/packet_fuzz.cc).

Each seed is a list of framed datagrams: [u16 length LE][u8 control][u8 psn_delta][bytes].
The datagrams are well-formed RoCEv2 requests and responses (ICRC left zero: control bit 4
makes the target compute it), aimed at the target's RC, UC and UD QPs with PSNs relative to
what they expect, so that fuzzing starts deep in the responder and completer.
    tests/fuzz/packet_seeds.py tests/fuzz/corpus/packet
"""
import os
import struct
import sys

ICRC = 0x10  # control: fix the ICRC
PSN = 0x08   # control: PSN = expected + delta - 8
RKEY = 0x40  # control: R_Key = the MR's
END = 0x20   # control: end of burst
TICK = 0x80  # control: timers + READ responses


def bth(opcode, pad=0, ack_req=True):
    return struct.pack(">BBHII", opcode, (pad & 3) << 4, 0xFFFF, 0, (0x80 << 24) if ack_req else 0)


def reth(va, length):
    return struct.pack(">QII", va, 0, length)


def aeth(syndrome, msn=1):
    return struct.pack(">I", syndrome << 24 | msn)


def atomic_eth(va, swap_add, compare=0):
    return struct.pack(">QIQQ", va, 0, swap_add, compare)


def deth(qkey, src_qp):
    return struct.pack(">II", qkey, src_qp)


def frame(packet, qp, control, delta=8):
    pad = (4 - len(packet) % 4) % 4
    data = packet + b"\0" * pad + b"\0\0\0\0"  # pad + room for the ICRC
    if pad:
        data = bytes([data[0], data[1] | pad << 4]) + data[2:]
    return struct.pack("<HBB", len(data), control | ICRC | (qp << 1), delta) + data


def seeds():
    mr = 0x40000000
    payload = bytes(range(64))
    yield "send_only", frame(bth(0x04) + payload, 0, PSN)
    yield "send_multi", (frame(bth(0x00) + bytes(1024), 0, PSN) + frame(bth(0x01) + bytes(1024), 0, PSN, 9) +
                         frame(bth(0x02) + payload, 0, PSN | END, 10))
    yield "write_only", frame(bth(0x0A) + reth(mr + 64, 64) + payload, 0, PSN | RKEY)
    yield "write_imm", frame(bth(0x0B) + reth(mr, 16) + b"\1\2\3\4" + payload[:16], 0, PSN | RKEY)
    yield "read_req", frame(bth(0x0C) + reth(mr, 5000), 0, PSN | RKEY | TICK)
    yield "fetch_add", frame(bth(0x14) + atomic_eth(mr + 8, 5), 0, PSN | RKEY)
    yield "cmp_swap", frame(bth(0x13) + atomic_eth(mr + 16, 7, 0), 0, PSN | RKEY)
    yield "duplicate", frame(bth(0x04) + payload, 0, PSN | END) + frame(bth(0x04) + payload, 0, PSN, 7)
    yield "ack", frame(bth(0x11, ack_req=False) + aeth(0x1F), 0, PSN, 8)
    yield "nak_seq", frame(bth(0x11, ack_req=False) + aeth(0x60), 0, PSN, 8)
    yield "rnr_nak", frame(bth(0x11, ack_req=False) + aeth(0x21), 0, PSN | TICK, 8)
    yield "read_resp", (frame(bth(0x11, ack_req=False) + aeth(0x1F), 0, PSN, 8) +
                        frame(bth(0x0D, ack_req=False) + aeth(0x1F) + bytes(1024), 0, PSN, 9) +
                        frame(bth(0x0E, ack_req=False) + bytes(1024), 0, PSN, 10))
    yield "atomic_ack", frame(bth(0x12, ack_req=False) + aeth(0x1F) + struct.pack(">Q", 99), 0, PSN, 11)
    yield "uc_send", frame(bytes([0x24]) + bth(0x24)[1:] + payload, 1, PSN)
    yield "ud_send", frame(bytes([0x64]) + bth(0x64)[1:] + deth(0x11223344, 9) + payload, 2, 0)
    yield "unconnected", frame(bth(0x04) + payload, 0, PSN | 0x01)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "packet")
    os.makedirs(out, exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
