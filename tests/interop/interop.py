#!/usr/bin/env python3
"""Host side of the interop tests: uroce (host, `uroce run`) against rxe (the qemu guest).

    interop.py probe --uroce L --logdir D --state F --pid QEMU_PID --timeout S
        (vm.sh start) waits for the guest's agent, finds both sides' GID index of their
        address on the link and writes the state file the tests read.
    interop.py pair [options] --server PROG ARGS... --client PROG ARGS...
        one test: the server on one side, the client on the other (see below).
    interop.py pyverbs [--save F] [--timeout S] [--cm-address] [--uroce L] [-k PATTERN]...
        rdma-core's pyverbs suite in the guest on rxe0 (run_pyverbs.py --native): prints
        its summary, writes its outcomes to F (JSON, for run_pyverbs.py --compare). With
        --uroce, then runs it under uroce on the host too and compares the two: fails if a
        test passes on rxe but not on uroce, unless pyverbs-known.txt lists it.
    interop.py mpi --uroce L --logdir D --program P [--rank0 uroce|rxe] [-- ARGS...]
        Open MPI's mpirun (on the host) with one rank under uroce here and one on rxe in
        the guest, both running P (a guest tool): passes when mpirun exits 0 and both
        ranks print "rank R of 2: OK".
    interop.py rsh HOST COMMAND...
        Open MPI's rsh agent for the guest (mpi): runs COMMAND there through its agent.
    interop.py shutdown
        (vm.sh stop) asks the guest's agent to power the guest off.

pair options:
    --name NAME             logs go to LOGDIR/NAME.*
    --logdir DIR
    --uroce LAUNCHER        the host side runs `LAUNCHER run -- PROG ARGS...`
    --direction D           rxe_server (server in the guest, uroce client) or uroce_server
    --timeout S             limit of each program (default 60)
    --port P                TCP port the server listens on: the client starts once it does
    --cm-port P             instead: the port of the server's rdma_cm listener (rxe: a cm_id
                            in LISTEN in `rdma res show cm_id`; uroce: its UDP socket there)
    --ready-delay S         instead of --port: start the client S seconds after the server
    --expect RE             both outputs must have a line matching RE (Python re); repeatable
    --server-expect RE, --client-expect RE   one side's output only
    --reject RE             neither output may match RE; repeatable
    --skip REASON           report the test as skipped (exit 77) with REASON, unless
                            UROCE_INTEROP_RUN_SKIPPED=1 (then it runs)
    --capture ALLOW_LIST    capture the test on the tap and compare the two sides' packets
                            (pcap_compare.py with that allow-list)
    --persistent-server yes a server that serves until stopped (cmtime): it is stopped once
                            the client is done, and only an exit of its own is judged
    --rxe-grows NAMES       one of rxe's port counters NAMES (comma-separated hw_counters, e.g.
                            send_rnr_err,rcvd_rnr_err) must grow in the run: what the test
                            is about happened
    --loss PCT              a lossy link: PCT % of the RoCE packets each way (UDP port 4791)
                            but QP1's (the CM's: --drop-cm) are dropped at random on the tap
    --drop-cm yes           the first copy of every CM message kind each way (REQ, REP, RTU,
                            DREP, SIDR_REQ, SIDR_REP: every other copy, by kind) is dropped,
                            so that each side's CM must resend or answer again (but for
                            Loss.KEPT: what no CM recovers from)
                            With either, the test fails if nothing was dropped.
In the commands, @DEV@ @GID@ @SELF@ @PEER@ @PORT@ stand for the side's device, its GID
index, its own and its peer's address, and --port (@GID6@ @SELF6@ @PEER6@: the same over
IPv6; a test that names them skips where the link has no IPv6); @TOOLS@ for the folder where
`vm.sh start --guest-tool` put the build's programs that both sides run.

A test passes when both programs exit 0 within the limit and every expectation holds. It
is skipped (77) when not run as root or when the guest is not up (interop.setup skipped).
Runs itself inside the namespace (ip netns exec) when started outside it.
"""
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

NS, TAP = "uroce-interop", "uitap0"
HOST_IP, GUEST_IP, AGENT_PORT = "198.51.100.1", "198.51.100.2", 7070
HOST_IP6, GUEST_IP6 = "2001:db8:100::1", "2001:db8:100::2"  # vm.sh's, where the kernel has IPv6
CACHE = os.environ.get("CACHE", "/var/tmp/uroce-interop")
HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77


def say(msg):
    print("interop: " + msg, flush=True)


def connect(budget=60):
    """A connection to the guest's agent; retried for `budget` s (a flooded link drops SYNs)."""
    deadline = time.time() + budget
    while True:
        try:
            return socket.create_connection((GUEST_IP, AGENT_PORT), timeout=5)
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(1)


def agent(op, timeout=30, budget=60, **kw):
    """One request to the guest's agent. `timeout`: what the op may take in the guest."""
    with connect(budget) as s:
        s.settimeout(timeout + 90)  # the agent's kill may take 60 s more
        s.sendall((json.dumps(dict(kw, op=op, timeout=timeout)) + "\n").encode())
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                raise OSError("the agent closed the connection")
            data += chunk
    rep = json.loads(data)
    if "error" in rep:
        raise RuntimeError("agent: " + rep["error"])
    return rep


def listening(port, proto="tcp"):
    """Is a TCP socket of this namespace listening on `port` (proto "udp": a UDP socket
    bound there)?"""
    for name in ("/proc/net/%s" % proto, "/proc/net/%s6" % proto):
        with open(name) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if (proto == "udp" or state == "0A") and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


# ---------------------------------------------------------------------------------------
# probe


def probe(a):
    deadline = time.time() + a.timeout
    t0 = time.time()
    while True:
        try:
            kernel = agent("ping", timeout=5, budget=0)["kernel"]
            break
        except (OSError, ValueError):
            pass
        if not os.path.exists("/proc/%d" % a.pid):
            say("qemu (pid %d) exited" % a.pid)
            return 1
        if time.time() > deadline:
            say("the guest's agent did not answer within %d s" % a.timeout)
            return 1
        time.sleep(1)
    say("guest agent up after %.0f s (kernel %s)" % (time.time() - t0, kernel))
    info = agent("run", cmd="uname -a; rdma link show; ibv_devinfo -v -d rxe0", timeout=60)["out"]
    with open(os.path.join(a.logdir, "vm", "guest-info.txt"), "w") as f:
        f.write(info)
    m = re.search(r"GID\[\s*(\d+)\]:\s+::ffff:%s, RoCE v2" % re.escape(GUEST_IP), info)
    if not m:
        say("rxe0 has no RoCE v2 GID for %s:\n%s" % (GUEST_IP, info))
        return 1
    guest_gid = int(m.group(1))
    out = subprocess.run([a.uroce, "devices"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"GID\[(\d+)\] ::ffff:%s\b" % re.escape(HOST_IP), out)
    if not m:
        say("uroce has no GID for %s:\n%s" % (HOST_IP, out))
        return 1
    state = dict(guest_gid=guest_gid, host_gid=int(m.group(1)), kernel=kernel)
    say("rxe0 GID index %d (%s), uroce0 GID index %d (%s)" %
        (guest_gid, GUEST_IP, state["host_gid"], HOST_IP))
    m6 = re.search(r"GID\[\s*(\d+)\]:\s+%s, RoCE v2" % re.escape(GUEST_IP6), info)
    h6 = re.search(r"GID\[(\d+)\] %s," % re.escape(HOST_IP6), out)
    if m6 and h6:
        state.update(guest_gid6=int(m6.group(1)), host_gid6=int(h6.group(1)))
        say("over IPv6: rxe0 GID index %d (%s), uroce0 GID index %d (%s)" %
            (state["guest_gid6"], GUEST_IP6, state["host_gid6"], HOST_IP6))
    else:
        say("no IPv6 GID on %s: the tests over IPv6 will skip" % ("rxe0" if not m6 else "uroce0"))
    with open(a.state, "w") as f:
        json.dump(state, f)
    return 0


# ---------------------------------------------------------------------------------------
# pair


class HostSide:
    def __init__(self, argv, timeout, log, uroce):
        self.log, self.uroce, self.stats = log, uroce, ""
        with open(log, "wb") as f:
            self.p = subprocess.Popen(["timeout", "-k", "5", str(timeout)] + argv, stdout=f,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True,
                                      env=dict(os.environ, UROCE_STATS="1"))

    def done(self):
        return self.p.poll() is not None

    def listening(self, port):
        return listening(port)

    def cm_listening(self, port):
        return listening(port, "udp")  # a uroce id bound at the port holds a UDP socket there

    def sample_stats(self):
        """Keeps `uroce stats` of the program (timeout's child): one that a signal stops
        does not print its counters, so a failed run's log gets the last sample."""
        try:
            with open("/proc/%d/task/%d/children" % (self.p.pid, self.p.pid)) as f:
                pid = f.read().split()[0]
            r = subprocess.run([self.uroce, "stats", pid], capture_output=True, text=True,
                               timeout=10)
            if r.returncode == 0:
                self.stats = "\n# `uroce stats %s` at %s:\n%s" % (pid, time.strftime("%T"), r.stdout)
        except (OSError, IndexError, subprocess.TimeoutExpired):
            pass

    def finish(self):
        """-> (rc, output); stops the program if it still runs (rc None)."""
        if self.p.poll() is None:
            for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.p.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    self.p.wait(grace)
                    break
                except subprocess.TimeoutExpired:
                    pass
            rc = None
        else:
            rc = self.p.returncode
        if rc != 0 and self.stats:
            with open(self.log, "a") as f:
                f.write(self.stats)
            self.stats = ""
        with open(self.log, "rb") as f:
            return rc, f.read().decode("utf-8", "replace")


class GuestSide:
    def __init__(self, jid, argv, timeout):
        self.jid, self.rep = jid, None
        agent("start", id=jid, cmd="exec timeout -k 5 %d stdbuf -oL -eL %s" %
              (timeout, " ".join(shlex.quote(x) for x in argv)))

    def done(self):
        if self.rep is None:
            rep = agent("wait", id=self.jid, timeout=0)
            if rep["done"]:
                self.rep = rep
        return self.rep is not None

    def listening(self, port):
        return agent("listening", port=port)["listening"]

    def cm_listening(self, port):
        out = agent("run", cmd="rdma res show cm_id", timeout=30)["out"]
        return re.search(r"state LISTEN .*src-addr \S+:%d " % port, out) is not None

    def sample_stats(self):
        pass

    def finish(self):
        if self.rep is None:
            rep = agent("kill", id=self.jid)
            if not rep["done"]:
                say("the guest's program did not exit 60 s after SIGKILL")
            return None, rep["out"]
        return self.rep["rc"], self.rep["out"]


def expand(argv, side, port, state):
    guest = side == "guest"
    subst = {"@DEV@": "rxe0" if guest else "uroce0",
             "@GID@": str(state["guest_gid" if guest else "host_gid"]),
             "@GID6@": str(state.get("guest_gid6" if guest else "host_gid6")),
             "@SELF@": GUEST_IP if guest else HOST_IP,
             "@PEER@": HOST_IP if guest else GUEST_IP,
             "@SELF6@": GUEST_IP6 if guest else HOST_IP6,
             "@PEER6@": HOST_IP6 if guest else GUEST_IP6,
             "@PORT@": str(port),
             "@TOOLS@": CACHE + "/tools"}
    return [re.sub("|".join(subst), lambda m: subst[m.group(0)], x) for x in argv]


def status_text(rc, timeout):
    if rc is None:
        return "still running when the test stopped it"
    if rc < 0:
        return "%d (killed by signal %d)" % (rc, -rc)
    return {0: "0", 124: "124 (timed out after %d s)" % timeout,
            137: "137 (killed: it did not stop at the time limit)"}.get(rc, str(rc))


def parse_pair(argv):
    opts = dict(name="pair", logdir=".", uroce=None, direction=None, timeout=60, port=0,
                ready_delay=None, cm_port=0, expect=[], server_expect=[], client_expect=[], reject=[],
                skip=None, capture=None, max_waste=None, persistent_server=None, rxe_grows=None, loss=None,
                drop_cm=None)
    multi = {"--expect": "expect", "--server-expect": "server_expect",
             "--client-expect": "client_expect", "--reject": "reject"}
    i = 0
    while i < len(argv) and argv[i] != "--server":
        key = argv[i]
        if i + 1 >= len(argv):
            raise SystemExit("interop.py pair: %s needs a value" % key)
        val = argv[i + 1]
        if key in multi:
            opts[multi[key]].append(val)
        elif key in ("--timeout", "--port", "--cm-port"):
            opts[key[2:].replace("-", "_")] = int(val)
        elif key in ("--ready-delay", "--max-waste", "--loss"):
            opts[key[2:].replace("-", "_")] = float(val)
        elif key.startswith("--") and key[2:].replace("-", "_") in opts:
            opts[key[2:].replace("-", "_")] = val
        else:
            raise SystemExit("interop.py pair: unknown option %s" % key)
        i += 2
    rest = argv[i + 1:]
    if "--client" not in rest:
        raise SystemExit("interop.py pair: needs --server PROG... --client PROG...")
    k = rest.index("--client")
    opts["server"], opts["client"] = rest[:k], rest[k + 1:]
    if opts["direction"] not in ("rxe_server", "uroce_server") or not opts["uroce"] or \
            not opts["server"] or not opts["client"]:
        raise SystemExit("interop.py pair: --direction rxe_server|uroce_server, --uroce, "
                         "--server and --client are required")
    return opts


def pair(o, state):
    os.makedirs(o["logdir"], exist_ok=True)
    base = os.path.join(o["logdir"], o["name"])
    srv_side = "guest" if o["direction"] == "rxe_server" else "host"
    cli_side = "host" if srv_side == "guest" else "guest"
    cmds = {"server": expand(o["server"], srv_side, o["port"], state),
            "client": expand(o["client"], cli_side, o["port"], state)}
    t = o["timeout"]

    def start(role, side):
        argv = cmds[role]
        say("%s (%s): %s" % (role, "rxe, guest" if side == "guest" else "uroce, host",
                             " ".join(shlex.quote(x) for x in argv)))
        if side == "guest":
            return GuestSide("%s.%s.%d" % (o["name"], role, os.getpid()), argv, t)
        return HostSide(["stdbuf", "-oL", "-eL", o["uroce"], "run", "--"] + argv, t,
                        "%s.%s.host.log" % (base, role), o["uroce"])

    agent("run", cmd="dmesg -c >/dev/null", timeout=30)
    rxe_before = rxe_counters() if o["max_waste"] is not None or o["rxe_grows"] else {}
    problems = []
    capture = None
    if o["capture"]:
        capture = Capture(base + ".pcap")
    Loss.remove()
    loss = Loss(o["loss"], o["drop_cm"]) if o["loss"] or o["drop_cm"] else None
    sides = {}
    t0 = time.time()
    try:
        sides["server"] = srv = start("server", srv_side)
        deadline = t0 + t
        if o["ready_delay"] is not None:
            time.sleep(o["ready_delay"])
        else:
            ready, what = ((srv.cm_listening, "its rdma_cm port %d" % o["cm_port"]) if o["cm_port"]
                           else (srv.listening, "TCP port %d" % o["port"]))
            while not ready(o["cm_port"] or o["port"]):
                if srv.done() or time.time() > deadline:
                    problems.append("the server did not listen on " + what)
                    break
                time.sleep(0.2)
        if not problems:
            sides["client"] = cli = start("client", cli_side)
            # Both programs are bounded by `timeout`; this loop only notices the end.
            # Once one side failed, the other gets 10 s (it may wait for its dead peer).
            failed_at, sampled, end = None, 0, time.time() + t + 15
            while time.time() < end:
                if time.time() > sampled + 5:
                    sampled = time.time()
                    srv.sample_stats()
                    cli.sample_stats()
                s_done, c_done = srv.done(), cli.done()
                if c_done and (s_done or o["persistent_server"]):
                    break
                for side in (srv, cli):
                    if failed_at is None and side.done() and side.finish()[0] != 0:
                        failed_at = time.time()
                if failed_at and time.time() > failed_at + 10:
                    break
                time.sleep(0.3)
    finally:
        results = {}
        for role, side in sides.items():  # every side is stopped, whatever happens to one
            try:
                results[role] = side.finish()
            except (OSError, RuntimeError, ValueError) as e:
                results[role] = (None, "(interop.py: could not stop it: %s)" % e)
        if capture:
            problems += capture.stop()
        if loss:
            problems += loss.stop()
    secs = time.time() - t0
    dmesg = agent("run", cmd="dmesg -c", timeout=30)["out"]
    with open(base + ".guest-dmesg.txt", "w") as f:
        f.write(dmesg)

    outs = {}
    for role, (rc, out) in results.items():
        side = srv_side if role == "server" else cli_side
        outs[role] = out
        with open("%s.%s.%s.log" % (base, role, side), "w") as f:
            f.write("$ %s\n# exit status %s\n%s" % (" ".join(map(shlex.quote, cmds[role])),
                                                    status_text(rc, t), out))
        if rc is None and role == "server" and o["persistent_server"]:
            continue  # stopped once the client was done, as such a server must be
        if rc != 0:
            problems.append("%s (%s) exit status %s" % (role, side, status_text(rc, t)))
    for role in outs:
        for rx in o["expect"] + o[role + "_expect"]:
            if not re.search(rx, outs[role], re.M):
                problems.append("%s output has no line matching /%s/" % (role, rx))
        for rx in o["reject"]:
            m = re.search(rx, outs[role], re.M)
            if m:
                problems.append("%s output matches /%s/: %r" % (role, rx, m.group(0)))
    for line in dmesg.splitlines():
        if re.search(r"WARNING:|BUG:|Oops", line):  # rxe's own; judged only with --max-waste
            say("guest kernel: " + line.strip())
            if o["max_waste"] is not None:
                problems.append("the guest kernel warned: " + line.strip())
    rxe_after = rxe_counters() if rxe_before else {}
    if o["max_waste"] is not None:
        host_out = outs.get("server" if srv_side == "host" else "client", "")
        problems += waste_problems(o["max_waste"], host_out, rxe_before, rxe_after)
    if o["rxe_grows"]:
        grown = {k: rxe_after.get(k, 0) - rxe_before.get(k, 0) for k in o["rxe_grows"].split(",")}
        say("rxe's counters in the run: %s" % ", ".join("%s +%d" % kv for kv in grown.items()))
        if not any(n > 0 for n in grown.values()):
            problems.append("none of rxe's counters %s grew" % o["rxe_grows"])
    if capture and not problems:
        problems += capture.compare(o["capture"], base)

    for role in outs:
        side = srv_side if role == "server" else cli_side
        print("----- %s (%s) output:\n%s" % (role, side, outs[role].rstrip()), flush=True)
    if problems:
        say("%s FAILED after %.1f s: %s" % (o["name"], secs, "; ".join(problems)))
        say("logs: %s.*" % base)
        return 1
    say("%s passed in %.1f s" % (o["name"], secs))
    return 0


RXE_COUNTERS = "/sys/class/infiniband/rxe0/ports/1/hw_counters"


def rxe_counters():
    """rxe's port counters in the guest (name -> value)."""
    out = agent("run", cmd="grep -H . %s/*" % RXE_COUNTERS, timeout=30)["out"]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"/(\w+):(\d+)$", out, re.M)}


def waste_problems(limit, host_out, before, after):
    """Work wasted on the wire, each at most `limit` % (RC timing against real
    peers): uroce's ghost responses (answers to requests it had re-sent too early) and
    duplicate requests, of the packets it received (its `uroce stats` line), and rxe's
    duplicate requests, of the packets rxe received in the run (its hw_counters)."""
    problems = []
    m = re.search(r"uroce stats .*: rx \d+,.*", host_out)  # the packet counters' line
    if not m:
        return ["no `uroce stats` line in uroce's output"]
    line = m.group(0)
    field = lambda name: int(re.search(r"[:,] %s (\d+)," % name, line).group(1))
    rx = field("rx")
    shares = [("uroce ghost responses", field("ghost"), rx),
              ("uroce duplicate requests", field("duplicates"), rx)]
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    if "duplicate_request" in delta and "rcvd_pkts" in delta:
        shares.append(("rxe duplicate requests", delta["duplicate_request"], delta["rcvd_pkts"]))
    else:
        problems.append("rxe's hw_counters have no duplicate_request / rcvd_pkts")
    for what, n, total in shares:
        say("%s: %d of %d packets received" % (what, n, total))
        if n * 100 > limit * max(total, 1):
            problems.append("%s: %d, over %g %% of %d" % (what, n, limit, total))
    return problems


class Loss:
    """A lossy link (pair's --loss and --drop-cm): an nftables table in this namespace that
    drops RoCE packets on the tap, uroce's on the way out (output hook), rxe's on the way in
    (input hook); the rules count what they drop."""

    TABLE = "uroce_interop_loss"
    # CM attribute IDs (IBA 12.6): the messages whose loss a CM must survive.
    CM_KINDS = {"REQ": 0x10, "REP": 0x13, "RTU": 0x14, "DREP": 0x16, "SIDR_REQ": 0x17,
                "SIDR_REP": 0x18}
    # What --drop-cm never drops, because the loss is fatal whichever stack the peer is:
    # - a DREQ (0x15): the kernel's CM stops resending it when the id is destroyed
    #   (cm_destroy_id cancels the MAD), which programs do right after rdma_disconnect
    #   (rping), so its peer stays connected;
    # - the kernel's SIDR_REP: its CM forgets a SIDR_REQ once answered
    #   (cm_send_sidr_rep_locked), so the copy the loss makes the client resend is a new
    #   request, which udaddy's server takes for another client.
    KEPT = {"uroce": set(), "rxe": {"SIDR_REP"}}
    # Offsets from the UDP header (nft's @th), in bits: BTH's destination QP (UDP 8 + 5
    # bytes), the MAD's management class (8 + BTH 12 + DETH 8 + 1) and attribute ID (+ 16).
    DEST_QP, MGMT_CLASS, ATTR_ID = "@th,104,24", "@th,232,8", "@th,352,16"

    def __init__(self, loss_pct, drop_cm):
        chains = [self.chain(name, hook, '%s "%s" udp dport 4791' % (iface, TAP), direction,
                             loss_pct, drop_cm)
                  for name, hook, iface, direction in (("out", "output", "oifname", "uroce"),
                                                       ("in", "input", "iifname", "rxe"))]
        self.remove()
        self.nft("table inet %s {\n%s\n}" % (self.TABLE, "\n".join(chains)))
        say("lossy link: %s" % ", ".join(
            (["%g %% at random" % loss_pct] if loss_pct else []) +
            (["the first of each CM message kind"] if drop_cm else [])))

    @classmethod
    def chain(cls, name, hook, match, direction, loss_pct, drop_cm):
        """One hook's chain: its rules, each commented "DIRECTION WHAT" (dropped())."""
        rules = []
        if drop_cm:  # MADs to QP1 of management class 7 (CM), by attribute
            for kind, attr in cls.CM_KINDS.items():
                if kind not in cls.KEPT[direction]:
                    rules.append('%s %s 1 %s 7 %s %#x numgen inc mod 2 0 counter drop comment "%s %s"' %
                                 (match, cls.DEST_QP, cls.MGMT_CLASS, cls.ATTR_ID, attr, direction, kind))
        if loss_pct:
            per_mille = max(1, int(round(loss_pct * 10)))
            rules.append('%s %s != 1 numgen random mod 1000 < %d counter drop comment "%s random"' %
                         (match, cls.DEST_QP, per_mille, direction))
        return "  chain %s { type filter hook %s priority 0; policy accept;\n%s\n  }" % (
            name, hook, "\n".join("    " + r for r in rules))

    @classmethod
    def remove(cls):
        """No lossy link (also one a killed test left behind: pair starts with this)."""
        try:
            cls.nft("delete table inet " + cls.TABLE, check=False)
        except FileNotFoundError:
            pass  # no nft here: no table either (a lossy test then fails in __init__)

    @staticmethod
    def nft(script, check=True):
        r = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=30)
        if check and r.returncode != 0:
            raise RuntimeError("nft: %s" % r.stderr.strip())
        return r

    def dropped(self):
        """{(direction, what): packets dropped} from the rules' counters."""
        r = subprocess.run(["nft", "-j", "list", "table", "inet", self.TABLE],
                           capture_output=True, text=True, timeout=30, check=True)
        counts = {}
        for item in json.loads(r.stdout)["nftables"]:
            rule = item.get("rule")
            if not rule or "comment" not in rule:
                continue
            direction, what = rule["comment"].split(" ", 1)
            n = [e["counter"]["packets"] for e in rule["expr"] if "counter" in e]
            counts[(direction, what)] = n[0] if n else 0
        return counts

    def stop(self):
        """Removes the table -> problems (nothing dropped: the test tested no loss). One
        way may lose nothing: few packets (ACKs), or none that --drop-cm drops."""
        try:
            counts = self.dropped()
        finally:
            self.remove()
        for direction in ("uroce", "rxe"):
            mine = {what: n for (d, what), n in counts.items() if d == direction and n}
            say("dropped of %s's packets: %s" % (
                direction, ", ".join("%s %d" % kv for kv in sorted(mine.items())) or "none"))
        return [] if any(counts.values()) else ["the lossy link dropped no packet"]


class Capture:
    """tcpdump of the RoCEv2 (UDP 4791) packets on the tap."""

    def __init__(self, path):
        self.path = path
        self.err = path + ".tcpdump.log"
        with open(self.err, "w") as e:
            # Whole frames (MTU 1500): a small snaplen keeps the ring's slots small, so
            # its 16 MiB hold thousands of packets if tcpdump falls behind.
            self.p = subprocess.Popen(["tcpdump", "-i", TAP, "-n", "--immediate-mode", "-U",
                                       "-s", "2048", "-B", "16384", "-w", path,
                                       "udp port 4791"],
                                      stdout=subprocess.DEVNULL, stderr=e)
        deadline = time.time() + 20
        while time.time() < deadline and self.p.poll() is None:
            with open(self.err) as e:
                if "listening on" in e.read():
                    return
            time.sleep(0.1)
        raise RuntimeError("tcpdump did not start: " + open(self.err).read())

    def stop(self):
        """Stops tcpdump once its file has stopped growing (1 s, at most 15 s) -> problems."""
        size, stable_since, deadline = -1, time.time(), time.time() + 15
        while time.time() < deadline and time.time() - stable_since < 1:
            time.sleep(0.2)
            now = os.path.getsize(self.path) if os.path.exists(self.path) else 0
            if now != size:
                size, stable_since = now, time.time()
        self.p.send_signal(signal.SIGINT)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        with open(self.err) as e:
            err = e.read()
        got = re.search(r"^(\d+) packets? captured", err, re.M)
        seen = re.search(r"^(\d+) packets? received by filter", err, re.M)
        if not got or not seen or got.group(1) != seen.group(1):
            return ["incomplete capture (tcpdump: %s)" % " / ".join(err.splitlines()[1:])]
        return []

    def compare(self, allow, base):
        r = subprocess.run([sys.executable, os.path.join(HERE, "pcap_compare.py"), self.path,
                            "--uroce", HOST_IP, "--uroce", HOST_IP6, "--rxe", GUEST_IP,
                            "--rxe", GUEST_IP6, "--allow", allow],
                           capture_output=True, text=True, timeout=300)
        with open(base + ".compare.txt", "w") as f:
            f.write(r.stdout + r.stderr)
        print(r.stdout + r.stderr, flush=True)
        return [] if r.returncode == 0 else ["pcap_compare.py: see %s.compare.txt" % base]


def pyverbs(argv, state):
    """rdma-core's pyverbs suite in the guest, natively on rxe0 (run_pyverbs.py --native)."""
    import argparse
    ap = argparse.ArgumentParser(prog="interop.py pyverbs")
    ap.add_argument("--save", default="pyverbs-rxe.json")
    ap.add_argument("--timeout", type=int, default=5400, help="seconds (default 5400)")
    ap.add_argument("-k", action="append", default=[])
    ap.add_argument("--cm-address", action="store_true", help="see run_pyverbs.py")
    ap.add_argument("--uroce", help="then run it under uroce here too (--save's name with 'uroce' "
                    "for 'rxe') and compare: exit 1 if a test passes on rxe but not on uroce")
    a = ap.parse_args(argv)
    # The script goes to the guest through the agent: the checkout may live under /tmp,
    # which the guest's own tmpfs hides.
    with open(os.path.join(HERE, "..", "pyverbs", "run_pyverbs.py")) as f:
        script = f.read()
    remote = "/tmp/uroce-run_pyverbs.py"
    out = "/tmp/pyverbs-rxe.json"
    args = ["--native", "--dev", "rxe0", "--gid", str(state["guest_gid"]), "--timeout", str(a.timeout),
            "--save", out]
    for k in a.k:
        args += ["-k", k]
    if a.cm_address:
        args.append("--cm-address")
    cmd = "cat >%s <<'UROCE_EOF'\n%sUROCE_EOF\nexec stdbuf -oL -eL /usr/bin/python3 %s %s" % (
        remote, script, remote, " ".join(shlex.quote(x) for x in args))
    jid = "pyverbs.%d" % os.getpid()
    say("pyverbs on rxe0 (GID index %d) in the guest, at most %d s" % (state["guest_gid"], a.timeout))
    t0 = time.time()
    agent("start", id=jid, cmd=cmd)
    rep = {"done": False}
    while not rep["done"] and time.time() < t0 + a.timeout + 120:
        rep = agent("wait", id=jid, timeout=60)
    if not rep["done"]:
        rep = agent("kill", id=jid)
    print(rep["out"], flush=True)
    say("the guest's run ended after %.0f s, exit status %s" % (time.time() - t0, rep["rc"]))
    data = agent("run", cmd="cat " + out, timeout=60)
    if data["rc"] != 0:
        say("FAILED: no outcomes from the guest")
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(a.save)), exist_ok=True)
    with open(a.save, "w") as f:
        f.write(data["out"])
    say("outcomes: %s" % a.save)
    if not a.uroce:
        return 0 if rep["rc"] == 0 else 1
    # The uroce side, in this namespace (GID 0: the tap's address), then the comparison.
    # The guest's own failures (rxe's) do not fail this test; uroce's are its pyverbs.suite's.
    script = os.path.join(HERE, "..", "pyverbs", "run_pyverbs.py")
    name = os.path.basename(a.save)
    mine = os.path.join(os.path.dirname(os.path.abspath(a.save)),
                        name.replace("rxe", "uroce") if "rxe" in name else "pyverbs-uroce.json")
    cmd = ["/usr/bin/python3", script, "--uroce", a.uroce, "--gid", str(state["host_gid"]), "--save", mine,
           "--timeout", "600", "--huge-pages", "64"] + (["--cm-address"] if a.cm_address else [])
    for k in a.k:
        cmd += ["-k", k]
    say("pyverbs under uroce here: " + " ".join(cmd))
    subprocess.run(cmd, timeout=700)
    say("comparison, test by test:")
    known = os.path.join(HERE, "pyverbs-known.txt")
    return subprocess.run(["/usr/bin/python3", script, "--compare", a.save, mine, "--expected", known],
                          timeout=60).returncode


# ---------------------------------------------------------------------------------------
# mpi


def rsh(argv):
    """Open MPI's rsh agent: `rsh HOST COMMAND...` runs COMMAND in the guest (the only
    remote host), waits for it as ssh would, prints its output, exits with its status."""
    jid = "mpi-rsh-%d" % os.getpid()
    agent("start", id=jid, cmd=" ".join(argv[1:]))
    while True:
        rep = agent("wait", id=jid, timeout=1)
        if rep["done"]:
            sys.stdout.write(rep["out"])
            return rep["rc"] if rep["rc"] is not None else 1


def mpi(argv, state):
    """Open MPI (pml cm, mtl ofi: libfabric's verbs;ofi_rxm) across the two stacks: each
    rank's context names its side, its GID index (FI_VERBS_GID_IDX) and a universe small
    enough for rxe's max_cqe (FI_UNIVERSE_SIZE; the fi_pingpong tests say why)."""
    import argparse
    ap = argparse.ArgumentParser(prog="interop.py mpi")
    for k in ("--uroce", "--logdir", "--program"):
        ap.add_argument(k, required=True)
    ap.add_argument("--rank0", choices=("uroce", "rxe"), default="uroce")
    ap.add_argument("--timeout", type=int, default=180)
    ap.add_argument("args", nargs="*")
    a = ap.parse_args(argv)
    tools = os.path.join(CACHE, "tools")
    program = os.path.join(tools, os.path.basename(a.program))
    def context(side):  # one rank's app context of mpirun
        guest = side == "rxe"
        return ["--host", GUEST_IP if guest else HOST_IP, "env",
                "FI_VERBS_GID_IDX=%d" % state["guest_gid" if guest else "host_gid"], "FI_UNIVERSE_SIZE=16"] + \
            ([] if guest else [a.uroce, "run"]) + [program] + a.args

    first = a.rank0
    second = "rxe" if first == "uroce" else "uroce"
    cmd = ["timeout", "-k", "5", str(a.timeout), "mpirun", "--allow-run-as-root", "--oversubscribe",
           "--mca", "plm_rsh_agent", os.path.join(tools, "guest_rsh.sh"), "--mca", "plm_rsh_no_tree_spawn", "1",
           "--mca", "oob_tcp_if_include", HOST_IP + "/24",
           "--mca", "pml", "cm", "--mca", "mtl", "ofi", "--mca", "mtl_ofi_provider_include", "verbs;ofi_rxm",
           "--mca", "osc", "pt2pt", "--mca", "btl", "self", "-x", "FI_PROVIDER=verbs;ofi_rxm",
           "-np", "1"] + context(first) + [":", "-np", "1"] + context(second)
    say("mpirun, rank 0 on %s, rank 1 on %s: %s" % (first, second, " ".join(shlex.quote(x) for x in cmd)))
    env = dict(os.environ, UROCE_INTEROP_PY=os.path.abspath(__file__))
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=a.timeout + 30)
    os.makedirs(a.logdir, exist_ok=True)
    with open(os.path.join(a.logdir, "mpi.rank0_%s.log" % first), "w") as f:
        f.write(r.stdout)
    print(r.stdout.rstrip())
    ok = {m.group(1) for m in re.finditer(r"rank (\d) of 2: OK$", r.stdout, re.M)}
    if r.returncode != 0 or ok != {"0", "1"}:
        say("mpi FAILED: mpirun exit status %d, ranks OK: %s" % (r.returncode, sorted(ok) or "none"))
        return 1
    say("mpi passed: both ranks OK")
    return 0


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("probe", "pair", "pyverbs", "mpi", "rsh", "shutdown"):
        print(__doc__)
        return 2
    cmd = sys.argv[1]
    if cmd == "shutdown":
        agent("shutdown", timeout=5, budget=5)
        return 0
    if cmd == "rsh":
        return rsh(sys.argv[2:])
    if cmd == "probe":
        import argparse
        ap = argparse.ArgumentParser()
        for k in ("--uroce", "--logdir", "--state"):
            ap.add_argument(k, required=True)
        ap.add_argument("--pid", type=int, required=True)
        ap.add_argument("--timeout", type=int, default=300)
        return probe(ap.parse_args(sys.argv[2:]))

    o = parse_pair(sys.argv[2:]) if cmd == "pair" else dict(skip=None, logdir=".")
    if o["skip"] and os.environ.get("UROCE_INTEROP_RUN_SKIPPED") != "1":
        say("SKIPPED: %s (UROCE_INTEROP_RUN_SKIPPED=1 runs it)" % o["skip"])
        return SKIP
    if os.geteuid() != 0:
        say("SKIPPED: needs root (the guest's network namespace)")
        return SKIP
    try:
        with open(os.path.join(CACHE, "state.json")) as f:
            state = json.load(f)
    except FileNotFoundError:
        say("SKIPPED: the guest is not running (interop.setup was skipped: see its output)")
        return SKIP
    if cmd == "pair" and "host_gid6" not in state and \
            any(re.search("@(GID6|SELF6|PEER6)@", x) for x in o["server"] + o["client"]):
        say("SKIPPED: no IPv6 between the host and the guest (see interop.setup's output)")
        return SKIP
    if os.environ.get("UROCE_INTEROP_NETNS") != NS:
        os.environ["UROCE_INTEROP_NETNS"] = NS
        os.execvp("ip", ["ip", "netns", "exec", NS, sys.executable] + sys.argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # ctest's timeout: clean up
    try:
        if cmd == "mpi":
            return mpi(sys.argv[2:], state)
        return pair(o, state) if cmd == "pair" else pyverbs(sys.argv[2:], state)
    except (OSError, RuntimeError, ValueError) as e:
        say("FAILED: %s: %s (is the guest still up? see its console in %s/vm/)" %
            (type(e).__name__, e, o["logdir"]))
        return 1


if __name__ == "__main__":
    sys.exit(main())
