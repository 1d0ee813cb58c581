#!/usr/bin/env python3
"""bench.step_timeline_join: step_timeline.py joins two processes' stamps into
the steps of each one-way. Two synthetic sides of a ping-pong at 1 GHz (one
cycle a nanosecond), each step of known length, must come back exactly."""
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
POST, PUBLISHED, TAKEN, RESPONDER, COMPLETER, SETTLED, POLLED = range(1, 8)
# One one-way: post 400, ring 300, to the responder 500, ACK 200, settled 100, poll 50; the
# other side posts 70 later. The receiver also takes the ACK of its own previous request.
STEP = [(PUBLISHED, 400), (TAKEN, 300), (RESPONDER, 500), (PUBLISHED, 200), (SETTLED, 100), (POLLED, 50)]


def main():
    sides = ([], [])
    t, who = 1000, 0
    for _ in range(1000):  # 500 posts a side: step_timeline skips 100 at each end
        sides[who].append((t, POST))
        t_sent = t
        for i, (step, length) in enumerate(STEP):
            t += length
            side = who if i == 0 else 1 - who
            sides[side].append((t, step))
            if step == TAKEN:  # the ACK of this side's own previous request, taken just before
                sides[side].append((t - 1, TAKEN))
                sides[side].append((t - 1, COMPLETER))
        t += 70
        who = 1 - who
        assert t - t_sent == 1620
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, stamps in enumerate(sides):
            p = os.path.join(d, f'steps.{i}.bin')
            with open(p, 'wb') as f:
                for tsc, step in sorted(stamps):
                    f.write(struct.pack('<QII', tsc, step, 1))
            paths.append(p)
        out = subprocess.run([sys.executable, os.path.join(HERE, 'step_timeline.py'), '1', *paths],
                             check=True, capture_output=True, text=True).stdout
    print(out)
    want = {'post -> record published': 400, 'ring -> record taken': 300, 'taken -> responder done': 500,
            'responder -> ACK published': 200, 'ACK -> burst settled': 100, 'settled -> poll returns': 50,
            'one-way (post -> poll returns)': 1550, 'poll returns -> next post': 70}
    got = {line[:34].strip(): float(line[34:].split()[0]) for line in out.splitlines() if ' ns ' in line}
    if got != want:
        sys.exit(f'step_timeline_join: got {got}, want {want}')
    print('step_timeline_join: ok')


if __name__ == '__main__':
    main()
