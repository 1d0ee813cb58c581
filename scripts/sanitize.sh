#!/usr/bin/env bash
# Sanitizer builds of uroce: configures, builds and runs
#
#   asan  everything built with -fsanitize=address,undefined in build-asan/, the whole
#         suite run from there (minus the interop tests, label interop: they belong to
#         their own phase of scripts/test.sh, and the labels in UROCE_ASAN_EXCLUDE_LABELS);
#   tsan  everything built with -fsanitize=thread in build-tsan/ (only the targets the
#         host and engine unit tests and the C tests need), and those tests run: the ones
#         defined in tests/host, tests/engine and tests/verbs_c.
#
#   scripts/sanitize.sh [asan|tsan|all] [CTEST_ARGS...]     (default: all)
#   e.g. scripts/sanitize.sh asan -R conformance -j2
#
# Any sanitizer report fails the test that triggered it: UBSan is compiled with
# -fno-sanitize-recover=all, and the options below make ASan, UBSan and TSan abort at the
# first report. Unmodified programs (Debian's ibverbs-utils, perftest) run on the
# instrumented liburoce through `uroce run`, which preloads the sanitizer runtime first and
# turns leak detection off for them only (their leaks are not ours); uroce's own test
# programs keep it. Suppressions, each a real false positive with its reason, are in
# scripts/sanitizers/.
#
# Environment: JOBS (build jobs, default 2); UROCE_TIMEOUT_SCALE (factor for the
# conformance scripts' time limits, default 2); UROCE_ASAN_EXCLUDE_LABELS (ctest -LE regex of
# labels left out of the ASan suite; default: none); ASAN_OPTIONS / UBSAN_OPTIONS /
# TSAN_OPTIONS are appended to the defaults below (later options win).
# Exit status: 0 if every selected suite built and passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

which=all
case ${1:-} in
  asan | tsan | all) which=$1; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
jobs=${JOBS:-2}
build_type=RelWithDebInfo

join_options() { local IFS=:; echo "$*"; }

# ASan: stop and abort (SIGABRT, so no test mistakes it for a normal failure) at the first
# report; leaks are reported for uroce's own programs (see above).
asan_options=$(join_options abort_on_error=1 halt_on_error=1 \
  check_initialization_order=1 strict_init_order=1 detect_stack_use_after_return=1 \
  ${ASAN_OPTIONS:+"$ASAN_OPTIONS"})
ubsan_options=$(join_options print_stacktrace=1 halt_on_error=1 abort_on_error=1 \
  ${UBSAN_OPTIONS:+"$UBSAN_OPTIONS"})
lsan_options=$(join_options "suppressions=$root/scripts/sanitizers/lsan.supp" ${LSAN_OPTIONS:+"$LSAN_OPTIONS"})
# TSan: the largest history, so that both stacks of a report (and so its suppressions) are
# restored even in the long stress runs.
tsan_options=$(join_options halt_on_error=1 abort_on_error=1 second_deadlock_stack=1 history_size=7 \
  "suppressions=$root/scripts/sanitizers/tsan.supp" ${TSAN_OPTIONS:+"$TSAN_OPTIONS"})

# Instrumented programs run two to three times slower: the time limits of the conformance
# scripts (tests/conformance/run_pair.sh, run_one.sh) are doubled, and every test's CTest
# limit by the same factor (configure: UROCE_TEST_TIMEOUT_SCALE, tests/CMakeLists.txt).
export UROCE_TIMEOUT_SCALE=${UROCE_TIMEOUT_SCALE:-2}

# configure BUILD_DIR SANITIZERS
# -O1 -g1 (the sanitizers' own advice: -O1 keeps reports exact, line tables are enough
# for their stacks): the instrumented trees then compile in about half the time of
# -O2 -g (a large engine test: 39 -> 21 s), which is most of these phases' CI time.
# Unity builds (eight sources a translation unit) halve it again: the GoogleTest and
# standard headers are compiled once for eight files. The normal build is not one, so
# a file that leans on another's includes still fails there.
configure() {
  local flags="-O1 -g1 -DNDEBUG"
  cmake -S "$root" -B "$1" -DCMAKE_BUILD_TYPE="$build_type" -DUROCE_SANITIZE="$2" \
    -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 \
    -DUROCE_TEST_TIMEOUT_SCALE="$UROCE_TIMEOUT_SCALE" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$flags" >/dev/null
}

run_asan() {
  echo "sanitize: asan: building build-asan (-fsanitize=address,undefined)"
  configure build-asan address,undefined
  cmake --build build-asan -j"$jobs"
  # One -LE regex (several -LE would have to match together to exclude a test).
  local exclude=interop${UROCE_ASAN_EXCLUDE_LABELS:+|$UROCE_ASAN_EXCLUDE_LABELS}
  echo "sanitize: asan: running the suite (excluding labels /$exclude/)"
  ASAN_OPTIONS=$asan_options UBSAN_OPTIONS=$ubsan_options LSAN_OPTIONS=$lsan_options \
    ctest --test-dir build-asan --output-on-failure --timeout 600 -LE "$exclude" "$@"
}

run_tsan() {
  echo "sanitize: tsan: building build-tsan (-fsanitize=thread): host, engine and C tests"
  configure build-tsan thread
  cmake --build build-tsan -j"$jobs" --target uroce_tsan_suite
  echo "sanitize: tsan: running tests/host, tests/engine and tests/verbs_c"
  local dir status=0
  for dir in tests/host tests/engine tests/verbs_c; do
    TSAN_OPTIONS=$tsan_options ctest --test-dir "build-tsan/$dir" --output-on-failure --timeout 600 -LE interop "$@" ||
      status=1
  done
  return $status
}

status=0
if [[ $which == asan || $which == all ]]; then
  run_asan "$@" || { status=1; echo "sanitize: asan: FAILED"; }
fi
if [[ $which == tsan || $which == all ]]; then
  run_tsan "$@" || { status=1; echo "sanitize: tsan: FAILED"; }
fi
exit $status
