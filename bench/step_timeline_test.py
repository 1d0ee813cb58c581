#!/usr/bin/env python3
"""bench.step_timeline_join: step_timeline.py joins two processes' stamps into
the steps of each one-way. Synthetic sides of a ping-pong at 1 GHz (one cycle
a nanosecond), each step of known length, must come back exactly: once with
the ACK published before the burst settles (the same-host path), once with
the ACK riding with the reply (over UDP)."""
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
POST, PUBLISHED, TAKEN, RESPONDER, COMPLETER, SETTLED, POLLED = range(1, 8)
# One one-way: post 400, ring 300, to the responder 500, then (same host) ACK 200 and
# settled 100, or (UDP) settled 300; poll 50; the other side posts 70 later. The receiver
# also takes the ACK of its own previous request, just before the request.
SAME_HOST = [(PUBLISHED, 400), (TAKEN, 300), (RESPONDER, 500), (PUBLISHED, 200), (SETTLED, 100), (POLLED, 50)]
UDP = [(PUBLISHED, 400), (TAKEN, 300), (RESPONDER, 500), (SETTLED, 300), (POLLED, 50)]
WANT = {
    'post -> record published': 400, 'ring -> record taken': 300, 'taken -> responder done': 500,
    'settled -> poll returns': 50, 'one-way (post -> poll returns)': 1550, 'poll returns -> next post': 70
}


def stamps(steps):
    sides = ([], [])
    t, who = 1000, 0
    for _ in range(1000):  # 500 posts a side: step_timeline skips 100 at each end
        sides[who].append((t, POST))
        for i, (step, length) in enumerate(steps):
            t += length
            sides[who if i == 0 else 1 - who].append((t, step))
            if step == TAKEN:
                sides[1 - who].extend([(t - 1, TAKEN), (t - 1, COMPLETER)])
        t += 70
        who = 1 - who
    return sides


def join(sides):
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, side in enumerate(sides):
            paths.append(os.path.join(d, f'steps.{i}.bin'))
            with open(paths[-1], 'wb') as f:
                for tsc, step in sorted(side):
                    f.write(struct.pack('<QII', tsc, step, 1))
        out = subprocess.run([sys.executable, os.path.join(HERE, 'step_timeline.py'), '1', *paths],
                             check=True, capture_output=True, text=True).stdout
    print(out)
    return {line[:34].strip(): float(line[34:].split()[0]) for line in out.splitlines() if ' ns ' in line}


def main():
    cases = [('same host', SAME_HOST, {'responder -> ACK published': 200, 'ACK -> burst settled': 100}),
             ('UDP', UDP, {'responder -> ACK published': 0, 'ACK -> burst settled': 300})]
    for name, steps, ack in cases:
        got, want = join(stamps(steps)), {**WANT, **ack}
        if got != want:
            sys.exit(f'step_timeline_join ({name}): got {got}, want {want}')
    print('step_timeline_join: ok')


if __name__ == '__main__':
    main()
