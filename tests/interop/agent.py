#!/usr/bin/env python3
"""The interop guest's command runner (started by guest-init.sh; python3 stdlib only).

Listens on TCP ADDR:PORT (198.51.100.2:7070: the guest's address on the tap link, which
exists only inside the host's network namespace uroce-interop). One JSON request per
connection, one JSON reply, each a line:

  {"op": "ping"}                          -> {"ok": true, "kernel": RELEASE}
  {"op": "start", "id": ID, "cmd": SH}    -> {"ok": true}  (bash -c SH, own session)
  {"op": "wait", "id": ID, "timeout": S}  -> {"done": B, "rc": N, "out": TEXT}
  {"op": "kill", "id": ID}                -> {"done": B, "rc": N, "out": TEXT}
  {"op": "run", "cmd": SH, "timeout": S}  -> start + wait + kill if still running
  {"op": "listening", "port": P}          -> {"listening": B}  (a TCP socket in LISTEN)
  {"op": "shutdown"}                      -> {"ok": true}; then every job is killed, the
                                             agent exits and guest-init.sh powers off

"kill" sends SIGTERM to the job's process group, SIGKILL 3 s later, and waits up to 60 s
for it to go (rxe can take long to destroy a killed process's QPs); a job that outlives
that is reported with done false. Output (stdout and stderr) is kept in /tmp/jobs/ID.log.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

JOBDIR = "/tmp/jobs"
jobs = {}  # id -> (Popen, log path)
lock = threading.Lock()


def output(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def start(jid, cmd):
    os.makedirs(JOBDIR, exist_ok=True)
    path = os.path.join(JOBDIR, jid + ".log")
    with lock:
        if jid in jobs:
            raise ValueError("job %s exists" % jid)
        with open(path, "wb") as f:
            p = subprocess.Popen(["bash", "-c", cmd], stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        jobs[jid] = (p, path)


def result(jid, p, path):
    with lock:
        jobs.pop(jid, None)
    return {"done": True, "rc": p.returncode, "out": output(path)}


def wait(jid, timeout):
    with lock:
        p, path = jobs[jid]
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"done": False, "rc": None, "out": output(path)}
    return result(jid, p, path)


def kill(jid):
    with lock:
        p, path = jobs[jid]
    for sig, grace in ((signal.SIGTERM, 3), (signal.SIGKILL, 60)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=grace)
            return result(jid, p, path)
        except subprocess.TimeoutExpired:
            pass
    return {"done": False, "rc": None, "out": output(path)}


def listening(port):
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def handle(req):
    op = req.get("op")
    if op == "ping":
        return {"ok": True, "kernel": os.uname().release}
    if op == "start":
        start(req["id"], req["cmd"])
        return {"ok": True}
    if op == "wait":
        return wait(req["id"], float(req.get("timeout", 0)))
    if op == "kill":
        return kill(req["id"])
    if op == "run":
        jid = "run-%d" % threading.get_ident()
        start(jid, req["cmd"])
        r = wait(jid, float(req.get("timeout", 60)))
        return r if r["done"] else dict(kill(jid), timed_out=True)
    if op == "listening":
        return {"listening": listening(int(req["port"]))}
    if op == "shutdown":
        return {"ok": True}
    raise ValueError("unknown op %r" % op)


def serve(addr, port):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(16)
    srv.settimeout(0.5)
    print("agent: listening on %s:%d" % (addr, port), flush=True)
    stop = threading.Event()

    def connection(c):
        with c:
            try:
                c.settimeout(600)
                data = b""
                while not data.endswith(b"\n"):
                    chunk = c.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                req = json.loads(data)
                try:
                    rep = handle(req)
                except Exception as e:  # reported to the host, the agent goes on
                    rep = {"error": "%s: %s" % (type(e).__name__, e)}
                c.sendall((json.dumps(rep) + "\n").encode())
                if req.get("op") == "shutdown":
                    stop.set()
            except (OSError, ValueError) as e:
                print("agent: connection: %s" % e, flush=True)

    while not stop.is_set():
        try:
            c, _ = srv.accept()
        except socket.timeout:
            continue
        threading.Thread(target=connection, args=(c,), daemon=True).start()
    for jid in list(jobs):
        kill(jid)
    print("agent: shut down", flush=True)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
