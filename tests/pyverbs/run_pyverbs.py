#!/usr/bin/env python3
"""rdma-core's own test suite (pyverbs, Debian's python3-pyverbs) run under uroce.

  run_pyverbs.py --uroce BUILD/bin/uroce [--expected FILE] [--timeout S] [--dev uroce0]
                 [--gid 0] [--keep DIR] [-k PATTERN]...

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
"""
import argparse
import collections
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

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


def iter_tests(suite):
    for t in suite:
        if hasattr(t, "__iter__"):
            yield from iter_tests(t)
        else:
            yield t


def last_line(traceback):
    lines = [l for l in traceback.strip().splitlines() if l.strip()]
    return lines[-1].strip() if lines else ""


def summarize(outcomes, expected):
    by = collections.defaultdict(list)
    for test, kind, why in outcomes:
        by[kind].append((test, why))
    print("\npyverbs under uroce: %d tests: %d passed, %d failed, %d errors, %d skipped" %
          (len(outcomes), len(by["pass"]), len(by["fail"]), len(by["error"]), len(by["skip"])))
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


def outer(args):
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
        cmd = [os.path.abspath(args.uroce), "run", "--", PYTHON, os.path.abspath(__file__), "--inner", "--suite", suite,
               "--json", out, "--dev", args.dev, "--gid", str(args.gid)]
        for k in args.k:
            cmd += ["-k", k]
        print("running:", " ".join(cmd), flush=True)
        try:
            # Its own session, so that a timeout ends the test processes it forked too.
            proc = subprocess.Popen(cmd, cwd=work, start_new_session=True)
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            print("FAILED: the suite did not finish within %d s" % args.timeout)
            return 1
        if not os.path.exists(out):
            print("FAILED: the suite ended (status %d) without reporting its outcomes" % rc)
            return 1
        with open(out) as f:
            outcomes = json.load(f)
        return summarize(outcomes, read_expected(args.expected))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--uroce", help="the uroce launcher (build/bin/uroce)")
    p.add_argument("--expected", help="the expected-failures list")
    p.add_argument("--timeout", type=int, default=240, help="seconds for the whole suite (default 240)")
    p.add_argument("--dev", default="uroce0")
    p.add_argument("--gid", type=int, default=0)
    p.add_argument("--keep", help="work in this directory and keep it")
    p.add_argument("-k", action="append", default=[], help="run only tests whose id contains this")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--suite", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inner:
        return inner(args)
    if not args.uroce:
        p.error("--uroce is required")
    return outer(args)


if __name__ == "__main__":
    sys.exit(main())
