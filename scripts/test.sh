#!/usr/bin/env bash
# Sets up and builds (scripts/setup.sh), then runs the test suite in phases:
#
#   normal  the whole suite in build/, but the interop tests (ctest -LE interop)
#   interop uroce against the kernel's Soft-RoCE in a qemu guest (ctest -L interop; root
#           only: reported skipped otherwise; tests/interop/README.md)
#   noshm   the conformance tests again with the same-host path off (UROCE_SHM=0: every
#           packet between the processes of one host goes over UDP)
#   asan    ASan+UBSan build of the whole suite, build-asan/ (scripts/sanitize.sh asan)
#   tsan    TSan build of the engine and C tests, build-tsan/ (scripts/sanitize.sh tsan)
#   fuzz    the fuzzers for their CI budget                  (scripts/fuzz.sh --ci, if present)
#
# Every phase runs even if an earlier one failed; the end prints one summary line per
# phase, and the exit status is 0 only if every phase passed.
#
# Extra arguments go to ctest, and then only the normal phase runs, for quick subsets:
#   scripts/test.sh -R conformance -j2
# UROCE_TEST_PHASES selects the phases explicitly (space-separated), e.g.
#   UROCE_TEST_PHASES=normal scripts/test.sh           # no sanitizer or fuzzing phase
#   UROCE_TEST_PHASES="asan tsan" scripts/test.sh -R rc_pingpong
# (with arguments, each selected ctest phase gets them). UROCE_ASAN_EXCLUDE_LABELS: labels
# left out of the ASan suite (see scripts/sanitize.sh; default here: none). UROCE_TEST_JOBS:
# how many tests ctest runs at once (default: the number of cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if (($#)); then
  phases=${UROCE_TEST_PHASES:-normal}
else
  phases=${UROCE_TEST_PHASES:-normal interop noshm asan tsan fuzz}
fi
for phase in $phases; do
  case $phase in
    normal | interop | noshm | asan | tsan | fuzz) ;;
    *) echo "test.sh: unknown phase '$phase' in UROCE_TEST_PHASES (normal interop noshm asan tsan fuzz)" >&2; exit 2 ;;
  esac
done

scripts/setup.sh

# Every ctest run uses the machine's cores (tests that share a port, a file or the guest
# say so with RESOURCE_LOCK, and the suite is written for ctest -j). UROCE_TEST_JOBS=1
# runs them one at a time.
export CTEST_PARALLEL_LEVEL=${UROCE_TEST_JOBS:-$(nproc)}

# The interop phase is skipped (77) when its guest could not be set up here (not root, no
# qemu): then every interop test reports skipped, which ctest counts as passed.
run_interop() {
  local log rc=0
  log=$(mktemp)
  ctest --test-dir build --output-on-failure -L interop "$@" 2>&1 | tee "$log" || rc=$?
  if ((rc == 0)) && grep -Eq 'interop\.setup \.+\*+Skipped' "$log"; then rc=77; fi
  rm -f "$log"
  return $rc
}

run_phase() {
  case $1 in
    normal) ctest --test-dir build --output-on-failure --timeout 300 -LE interop "${@:2}" ;;
    interop) run_interop "${@:2}" ;;
    noshm) UROCE_SHM=0 ctest --test-dir build --output-on-failure --timeout 300 -L conformance -LE interop "${@:2}" ;;
    asan | tsan) scripts/sanitize.sh "$1" "${@:2}" ;;
    fuzz)
      if [[ -x scripts/fuzz.sh ]]; then
        scripts/fuzz.sh --ci
      else
        echo "test.sh: scripts/fuzz.sh not present"
        return 77
      fi ;;
  esac
}

# What a failed phase's ctest reported: the names of its failed tests, and the last lines of
# each one's output (CI keeps only the head and tail of a long log, so the summary repeats
# them at the end).
failure_digest() {
  sed -n '/The following tests FAILED:/,/^Errors while running/p' "$1"
  awk '/^ *Start +[0-9]+:|tests passed, [0-9]+ tests failed/ { if (failed) flush(); failed = 0; n = 0; next }
       /Test +#[0-9]+: .*\*\*\*(Failed|Timeout|Exception)/ { failed = 1; name = $0; n = 0; next }
       failed { tail[n++ % 15] = $0 }
       function flush(  i, from) {
         print "--- " name; from = n > 15 ? n - 15 : 0
         for (i = from; i < n; i++) print "  " tail[i % 15]
       }
       END { if (failed) flush() }' "$1" | head -200
}

logs=$(mktemp -d)
summary=() digests=() status=0
for phase in $phases; do
  echo "test.sh: ===== phase $phase ====="
  start=$SECONDS
  rc=0
  set +e
  run_phase "$phase" "$@" 2>&1 | tee "$logs/$phase.log"
  rc=${PIPESTATUS[0]}
  set -e
  took=$((SECONDS - start))
  took_text=$(printf '%dm%02ds' $((took / 60)) $((took % 60)))
  case $rc in
    0) result=passed ;;
    77) result="skipped" ;;
    *) result="FAILED (exit status $rc)"; status=1
       digests+=("test.sh: ----- phase $phase failed -----" "$(failure_digest "$logs/$phase.log")") ;;
  esac
  summary+=("$(printf 'test.sh: phase %-6s %s in %s' "$phase" "$result" "$took_text")")
  echo "${summary[-1]}"
done

echo "test.sh: ===== summary ====="
((${#digests[@]})) && printf '%s\n' "${digests[@]}"
printf '%s\n' "${summary[@]}"
rm -rf "$logs"
if ((status)); then
  echo "test.sh: FAILED"
else
  echo "test.sh: all phases passed"
fi
exit $status
