#!/usr/bin/env python3
"""Where a same-host one-way's time goes: joins the step stamps of the two
processes of a ping-pong (src/transport/step_probe.h, files steps.<pid>.bin)
and prints the median, 25th and 75th percentile of each step, in ns.

  step_timeline.py GHZ FILE_A FILE_B

A one-way runs from one side's ibv_post_send to the other side's ibv_poll_cq
returning its receive completion: the post until its record is published;
the record's trip through the ring until the receiver takes it; the
receiver's dispatch until the responder is done; the ACK published (an RC
ACK's word on the peer's board, through shared memory); the
burst settled (completions released); the poll returning. Then the other
side's turn to post. Over UDP (step_timeline.sh UDP=1) a record is a
sendmmsg/recvmmsg, and the ACK rides with the reply: its step reads 0.
"""
import bisect
import statistics
import struct
import sys

POST, PUBLISHED, TAKEN, RESPONDER, COMPLETER, SETTLED, POLLED = range(1, 8)
STEPS = ['post -> record published', 'ring -> record taken', 'taken -> responder done',
         'responder -> ACK published', 'ACK -> burst settled', 'settled -> poll returns',
         'one-way (post -> poll returns)', 'poll returns -> next post']
ONE_WAY = STEPS.index('one-way (post -> poll returns)')


def load(path):
    steps = {s: [] for s in range(POST, POLLED + 1)}
    with open(path, 'rb') as f:
        for tsc, step, _tid in struct.iter_unpack('<QII', f.read()):
            if step in steps:
                steps[step].append(tsc)
    return {s: sorted(v) for s, v in steps.items()}


def after(stamps, t):
    i = bisect.bisect_right(stamps, t)
    return stamps[i] if i < len(stamps) else None


def before(stamps, t):
    i = bisect.bisect_left(stamps, t) - 1
    return stamps[i] if i >= 0 else None


def one_way(p, q, t_post):
    """The steps of the one-way p posted at t_post, or None if incomplete."""
    t_pub = after(p[PUBLISHED], t_post)
    t_resp = t_pub and after(q[RESPONDER], t_pub)
    t_taken = t_resp and before(q[TAKEN], t_resp)
    t_settled = t_resp and after(q[SETTLED], t_resp)
    t_ack = t_resp and after(q[PUBLISHED], t_resp)
    if t_ack and t_settled and t_ack > t_settled:
        t_ack = t_resp  # the ACK waits for the reply (over UDP): no step of its own
    t_polled = t_settled and after(q[POLLED], t_settled)
    t_next = t_polled and after(q[POST], t_polled)
    times = [t_post, t_pub, t_taken, t_resp, t_ack, t_settled, t_polled, t_next]
    if None in times or t_taken < t_pub:
        return None
    return [t_pub - t_post, t_taken - t_pub, t_resp - t_taken, t_ack - t_resp, t_settled - t_ack,
            t_polled - t_settled, t_polled - t_post, t_next - t_polled]


def main():
    ghz = float(sys.argv[1])
    a, b = load(sys.argv[2]), load(sys.argv[3])
    rows = [[] for _ in STEPS]
    for p, q in ((a, b), (b, a)):
        for t_post in p[POST][100:-100]:  # past the warm-up and before the teardown
            steps = one_way(p, q, t_post)
            if steps and steps[ONE_WAY] < 50_000 * ghz:  # not across a preemption
                for row, cycles in zip(rows, steps):
                    row.append(cycles / ghz)
    if not rows[0]:
        sys.exit('step_timeline: no complete one-way found (a same-host RC ping-pong, built with UROCE_STEP_PROBES?)')
    for name, row in zip(STEPS, rows):
        row.sort()
        n = len(row)
        print(f'  {name:32s} {statistics.median(row):6.0f} ns   (p25 {row[n // 4]:5.0f}, p75 {row[3 * n // 4]:5.0f})')
    print(f'  one-ways: {len(rows[0])}')


if __name__ == '__main__':
    main()
