#!/usr/bin/env python3
"""rdma-core's own test suite (pyverbs, Debian's python3-pyverbs) run under uroce.

  run_pyverbs.py --uroce BUILD/bin/uroce [--expected FILE] [--timeout S] [--dev uroce0]
                 [--gid 0] [--cm-address] [--huge-pages N] [--keep DIR] [--save OUT.json]
                 [-k PATTERN]...
  run_pyverbs.py --native --dev rxe0 --gid 1 [--cm-address] [--timeout S] [--save OUT.json] ...
  run_pyverbs.py --compare REF.json UROCE.json

Copies /usr/share/doc/rdma-core/tests (where Debian installs the suite, some files
gzipped) to a temporary directory, runs it with Debian's Python under `uroce run`, prints
the outcome of every test and a summary (passes, failures, errors, skips grouped by their
reason), and exits
  0   every test passed or was skipped, or failed/errored and is listed in FILE;
  1   a test failed or errored that FILE does not list, or the run did not finish in time;
  77  python3-pyverbs is not installed (ctest reports the test as skipped).
UROCE_PYVERBS_SUITE names another copy of the suite.
FILE lists expected failures, one test id a line ("tests.test_x.Class.test_y  reason");
'#' starts a comment. An entry whose test passed is reported as stale, not failed.

Inside `uroce run` the script runs itself with --inner: it loads the suite as rdma-core's
run_tests.py does and writes each test's outcome as JSON.

--huge-pages N: the suite's huge-page tests (ODP and parent-domain traffic in 2 MiB pages)
skip when the host has no free huge page. As root, N pages are reserved for the run (when
none is free) and the old reservation is put back after; otherwise they skip as before.

--cm-address: the suite's rdma_cm tests take their address from the device's netdev in
sysfs (/sys/class/infiniband/DEV/device/net/) and skip without one; uroce has no sysfs
entry, nor has rxe, a RoCE NIC has. With it they get the address behind --gid instead
(ctest's pyverbs.suite passes it).

--native runs the suite without `uroce run`, on a kernel device (--dev, --gid): the
reference run, e.g. on the interop guest's rxe0. --save writes the outcomes (and the
device, kernel, date and duration) as JSON. --compare reads two such files, prints both
sides' counts, every test that passes on REF but not on UROCE, every other difference, and
UROCE's skips by reason; it exits 1 when a test passes on REF but not on UROCE, unless
--expected FILE lists it (same format).
The comparison with rxe (as root; the guest runs the suite in about 30 s, even under TCG;
docs/measurements.md has the last one):
  tests/interop/vm.sh start --uroce build/bin/uroce --logdir /tmp/pv
  tests/interop/interop.py pyverbs --cm-address --save /tmp/pv/rxe.json   # rxe0, in the guest
  tests/interop/vm.sh stop
  tests/pyverbs/run_pyverbs.py --uroce build/bin/uroce --cm-address --save /tmp/pv/uroce.json
  tests/pyverbs/run_pyverbs.py --compare /tmp/pv/rxe.json /tmp/pv/uroce.json
"""
import argparse
import collections
import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# UROCE_PYVERBS_SUITE overrides where the suite is looked for.
SUITE = os.environ.get("UROCE_PYVERBS_SUITE", "/usr/share/doc/rdma-core/tests")
# python3-pyverbs installs for Debian's interpreter; another python3 first in PATH
# (pyenv, a venv) would not find it.
PYTHON = "/usr/bin/python3"
SKIP = 77


def copy_suite(dest):
    """The suite in `dest`, gunzipped. False if it is not installed."""
    if not os.path.isdir(SUITE):
        return False
    for name in os.listdir(SUITE):
        src = os.path.join(SUITE, name)
        if name.endswith(".gz"):
            with gzip.open(src, "rb") as f, open(os.path.join(dest, name[:-3]), "wb") as out:
                shutil.copyfileobj(f, out)
        elif os.path.isfile(src):
            shutil.copy(src, dest)
    return os.path.isfile(os.path.join(dest, "run_tests.py"))


def pyverbs_importable():
    if not os.access(PYTHON, os.X_OK):
        return False
    return subprocess.run([PYTHON, "-c", "import pyverbs.device"], capture_output=True).returncode == 0


def read_expected(path):
    expected = {}
    if not path:
        return expected
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                test, _, reason = line.partition(" ")
                expected[test] = reason.strip()
    return expected


def inner(args):
    """Runs the suite in this process (under uroce) and writes the outcomes to args.json."""
    import unittest
    from importlib.machinery import SourceFileLoader

    sys.path.insert(0, args.suite)
    sys.argv = ["run_tests.py", "--dev", args.dev, "--gid", str(args.gid), "-v"]
    from args_parser import parser  # rdma-core's; run_tests.py does the same

    tests = SourceFileLoader("tests", os.path.join(args.suite, "__init__.py")).load_module()
    parser.parse_args()
    if args.cm_address:
        give_cm_address(sys.modules["tests.base"])
    suite = unittest.defaultTestLoader.loadTestsFromModule(tests)
    if args.k:
        suite = unittest.TestSuite(t for t in iter_tests(suite) if any(k in t.id() for k in args.k))
    outcomes = []

    class Result(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            outcomes.append((test.id(), "pass", ""))

        def addFailure(self, test, err):
            super().addFailure(test, err)
            outcomes.append((test.id(), "fail", last_line(self.failures[-1][1])))

        def addError(self, test, err):
            super().addError(test, err)
            outcomes.append((test.id(), "error", last_line(self.errors[-1][1])))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            outcomes.append((test.id(), "skip", reason))

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            outcomes.append((test.id(), "pass", "expected failure"))

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            outcomes.append((test.id(), "fail", "unexpected success"))

    unittest.TextTestRunner(verbosity=2, resultclass=Result, stream=sys.stdout).run(suite)
    with open(args.json, "w") as f:
        json.dump(outcomes, f)
    return 0


def give_cm_address(base):
    """The suite's rdma_cm tests learn their address from the device's netdev in sysfs
    (/sys/class/infiniband/DEV/device/net/, base.py's _get_ip_mac) and skip without one
    ("doesn't have net interface"): uroce has no sysfs entry, nor has rxe (whose device is
    virtual). A RoCE NIC has. This gives them the address behind the GID index instead
    (IPv4-mapped or global IPv6) when that directory is missing."""
    import ipaddress
    import pyverbs.device as d

    orig = base.RDMATestCase._get_ip_mac

    def _get_ip_mac(self, dev, port, idx):
        if os.path.exists("/sys/class/infiniband/%s/device/net/" % dev) or idx is None:
            return orig(self, dev, port, idx)
        with d.Context(name=dev) as ctx:
            gid = ipaddress.IPv6Address(bytes.fromhex(str(ctx.query_gid(port, idx)).replace(":", "")))
        ip = gid.ipv4_mapped or (gid if not gid.is_link_local and not gid.is_unspecified else None)
        self.args.append([dev, port, idx, str(ip) if ip else None, None])

    base.RDMATestCase._get_ip_mac = _get_ip_mac


def iter_tests(suite):
    for t in suite:
        if hasattr(t, "__iter__"):
            yield from iter_tests(t)
        else:
            yield t


def last_line(traceback):
    lines = [l for l in traceback.strip().splitlines() if l.strip()]
    return lines[-1].strip() if lines else ""


def counts(outcomes):
    by = collections.defaultdict(list)
    for test, kind, why in outcomes:
        by[kind].append((test, why))
    return by, "%d tests: %d passed, %d failed, %d errors, %d skipped" % (
        len(outcomes), len(by["pass"]), len(by["fail"]), len(by["error"]), len(by["skip"]))


def summarize(outcomes, expected, label="uroce"):
    by, text = counts(outcomes)
    print("\npyverbs on %s: %s" % (label, text))
    reasons = collections.Counter(why for _, why in by["skip"])
    if reasons:
        print("skipped, by reason:")
        for why, n in reasons.most_common():
            print("  %3d  %s" % (n, why))
    unexpected = []
    for kind in ("fail", "error"):
        for test, why in by[kind]:
            known = test in expected
            print("%s %s: %s%s" % (kind.upper(), test, why, "  [expected: %s]" % expected[test] if known else ""))
            if not known:
                unexpected.append(test)
    seen = {t for t, kind, _ in outcomes if kind in ("fail", "error")}
    for test in sorted(set(expected) - seen):
        print("note: %s is listed as an expected failure but did not fail: remove it" % test)
    if unexpected:
        print("FAILED: %d unexpected failures/errors: %s" % (len(unexpected), " ".join(unexpected)))
        return 1
    print("passed: no unexpected failure or error")
    return 0


NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"


def free_huge_pages():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("HugePages_Free:"):
                return int(line.split()[1])
    return 0


@contextlib.contextmanager
def huge_pages(count):
    """`count` more huge pages of the default size (2 MiB here) reserved for the run when
    none is free and this process may (root), so that the suite's huge-page tests run
    instead of skipping; the old reservation is put back after."""
    old = None
    try:
        if count > 0 and free_huge_pages() == 0:
            with open(NR_HUGEPAGES) as f:
                old = int(f.read())
            with open(NR_HUGEPAGES, "w") as f:
                f.write(str(old + count))
            print("reserved %d huge pages for the run (%d free)" % (count, free_huge_pages()), flush=True)
    except OSError as e:
        old = None
        print("no huge pages reserved (%s): the huge-page tests skip" % e, flush=True)
    try:
        yield
    finally:
        if old is not None:
            with open(NR_HUGEPAGES, "w") as f:
                f.write(str(old))


def outer(args):
    with huge_pages(args.huge_pages):
        return run_outer(args)


def run_outer(args):
    work = args.keep or tempfile.mkdtemp(prefix="uroce-pyverbs-")
    os.makedirs(work, exist_ok=True)
    try:
        suite = os.path.join(work, "tests")
        os.makedirs(suite, exist_ok=True)
        if not copy_suite(suite) or not pyverbs_importable():
            print("SKIP: rdma-core's pyverbs tests are not installed (%s, 'import pyverbs' with %s): "
                  "apt-get install python3-pyverbs" % (SUITE, PYTHON))
            return SKIP
        out = os.path.join(work, "outcomes.json")
        cmd = [PYTHON, os.path.abspath(__file__), "--inner", "--suite", suite, "--json", out, "--dev", args.dev,
               "--gid", str(args.gid)]
        if not args.native:
            cmd = [os.path.abspath(args.uroce), "run", "--"] + cmd
        for k in args.k:
            cmd += ["-k", k]
        if args.cm_address:
            cmd.append("--cm-address")
        print("running:", " ".join(cmd), flush=True)
        t0 = time.time()
        try:
            # Its own session, so that a timeout ends the test processes it forked too.
            proc = subprocess.Popen(cmd, cwd=work, start_new_session=True)
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            print("FAILED: the suite did not finish within %d s" % args.timeout)
            return 1
        seconds = time.time() - t0
        if not os.path.exists(out):
            print("FAILED: the suite ended (status %d) without reporting its outcomes" % rc)
            return 1
        with open(out) as f:
            outcomes = json.load(f)
        label = args.dev if args.native else "uroce"
        if args.save:
            save(args.save, label, args, outcomes, seconds)
        print("the suite took %.0f s" % seconds)
        return summarize(outcomes, read_expected(args.expected), label)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def save(path, label, args, outcomes, seconds):
    with open(path, "w") as f:
        json.dump(dict(label=label, device=args.dev, gid=args.gid, cm_address=args.cm_address,
                       kernel=os.uname().release,
                       date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), seconds=round(seconds),
                       outcomes=outcomes), f, indent=0)


def load(path):
    """A --save file (or the bare outcome list --inner writes) -> (label, {test: (kind, why)})."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, list):
        data = dict(label=os.path.basename(path), outcomes=data)
    return data, {t: (kind, why) for t, kind, why in data["outcomes"]}


def compare(ref_path, new_path, known):
    """Test by test: what passes on REF and not on NEW (exit 1 if any not in `known`), the
    other differences, and NEW's skips by reason."""
    ref, a = load(ref_path)
    new, b = load(new_path)
    for data, path in ((ref, ref_path), (new, new_path)):
        extra = ", ".join("%s %s" % (k, data[k]) for k in ("kernel", "date", "seconds") if k in data)
        print("%-8s %s  (%s%s)" % (data["label"] + ":", counts(data["outcomes"])[1], path,
                                   "; " + extra if extra else ""))

    def show(title, tests, side):
        print("\n%s: %d" % (title, len(tests)))
        for t in tests:
            kind, why = side[t]
            print("  %-72s %s%s" % (t, kind, ": " + why if why else ""))
            if t in known:
                print("  %-72s [known: %s]" % ("", known[t]))

    lost = sorted(t for t in a if a[t][0] == "pass" and b.get(t, ("missing",))[0] != "pass")
    gained = sorted(t for t in b if b[t][0] == "pass" and a.get(t, ("missing",))[0] != "pass")
    b_full = dict(b, **{t: ("missing", "not run") for t in a if t not in b})
    a_full = dict(a, **{t: ("missing", "not run") for t in b if t not in a})
    show("passed on %s, not on %s (%s's outcome)" % (ref["label"], new["label"], new["label"]), lost, b_full)
    show("passed on %s, not on %s (%s's outcome)" % (new["label"], ref["label"], ref["label"]), gained, a_full)
    other = sorted(t for t in set(a) | set(b) if t not in lost and t not in gained and
                   a_full[t][0] != b_full[t][0])
    print("\nother differences: %d" % len(other))
    for t in other:
        print("  %-72s %s: %s / %s: %s" % (t, ref["label"], a_full[t][0], new["label"], b_full[t][0]))
    reasons = collections.defaultdict(list)
    for t, (kind, why) in b.items():
        if kind == "skip":
            reasons[why].append(t)
    print("\nskipped on %s, by reason (%s's outcome in brackets where it differs):" %
          (new["label"], ref["label"]))
    for why, tests in sorted(reasons.items(), key=lambda x: (-len(x[1]), x[0])):
        print("  %3d  %s" % (len(tests), why))
        for t in sorted(tests):
            kind = a.get(t, ("missing",))[0]
            print("         %s%s" % (t, "" if kind == "skip" else "  [%s]" % kind))
    unknown = [t for t in lost if t not in known]
    if unknown:
        print("\nFAILED: %d tests pass on %s but not on %s" % (len(unknown), ref["label"], new["label"]))
        return 1
    print("\npassed: every test that passes on %s passes on %s%s" %
          (ref["label"], new["label"], ", but %d known ones" % len(lost) if lost else ""))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--uroce", help="the uroce launcher (build/bin/uroce)")
    p.add_argument("--native", action="store_true", help="run on a kernel device, without uroce")
    p.add_argument("--compare", nargs=2, metavar=("REF.json", "UROCE.json"),
                   help="compare two --save files test by test")
    p.add_argument("--save", help="write the outcomes to this JSON file")
    p.add_argument("--expected", help="the expected-failures list")
    p.add_argument("--timeout", type=int, default=240, help="seconds for the whole suite (default 240)")
    p.add_argument("--dev", default=None, help="device (default uroce0; with --native required)")
    p.add_argument("--gid", type=int, default=0)
    p.add_argument("--cm-address", action="store_true",
                   help="give the rdma_cm tests the GID's address (the device has no netdev in sysfs)")
    p.add_argument("--keep", help="work in this directory and keep it")
    p.add_argument("--huge-pages", type=int, default=0,
                   help="reserve this many huge pages for the run when none is free (root)")
    p.add_argument("-k", action="append", default=[], help="run only tests whose id contains this")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--suite", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.compare:
        return compare(*args.compare, read_expected(args.expected))
    if args.native:
        if not args.dev:
            p.error("--native needs --dev")
    else:
        args.dev = args.dev or "uroce0"
    if args.inner:
        return inner(args)
    if not args.uroce and not args.native:
        p.error("--uroce, --native or --compare is required")
    return outer(args)


if __name__ == "__main__":
    sys.exit(main())
