#!/bin/sh
# Runs uroce's libFuzzer targets (tests/fuzz) for a bounded time.
#
#   scripts/fuzz.sh [--ci | --seconds N] [--build-dir DIR] [TARGET ...]
#
#   --seconds N   fuzzing time per target (default 3600: the long run)
#   --ci          45 s per target (what CI runs)
#   --build-dir   where to configure and build (default: build-fuzz in the repo)
#   TARGET        only these targets (default: every one tests/fuzz declares)
#
# Configures a clang build with -DUROCE_FUZZ=ON (every target instrumented for
# libFuzzer, ASan and UBSan: tests/fuzz/CMakeLists.txt), builds the targets and
# runs each one on a working corpus (DIR/fuzz/corpus/TARGET, seeded from the
# checked-in tests/fuzz/corpus/TARGET, which is never written to). Prints the
# executions of every target; a crash, leak, sanitizer report or timeout of a
# single input leaves its input in DIR/fuzz/artifacts/TARGET/ and makes the
# script exit non-zero. Reproduce one with: DIR/bin/TARGET ARTIFACT.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
seconds=3600
build=
only=
while [ $# -gt 0 ]; do
  case "$1" in
    --ci) seconds=45 ;;
    --seconds) seconds=$2; shift ;;
    --build-dir) build=$2; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) only="$only $1" ;;
  esac
  shift
done
: "${build:=$root/build-fuzz}"

cc=$(command -v clang-14 || command -v clang || true)
cxx=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$cc" ] || [ -z "$cxx" ]; then
  echo "fuzz.sh: clang is needed (Debian: apt-get install clang)" >&2
  exit 2
fi

mkdir -p "$build/fuzz"
echo "== configuring $build (clang, libFuzzer + ASan + UBSan)"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DUROCE_FUZZ=ON -DUROCE_SANITIZE=fuzzer-no-link,address,undefined >"$build/fuzz/configure.log" 2>&1 ||
  { cat "$build/fuzz/configure.log" >&2; exit 1; }
echo "== building the fuzz targets"
cmake --build "$build" -j "$(nproc)" --target uroce_fuzz >"$build/fuzz/build.log" 2>&1 ||
  { tail -50 "$build/fuzz/build.log" >&2; exit 1; }

manifest=$build/tests/fuzz/fuzz_targets.txt
[ -s "$manifest" ] || { echo "fuzz.sh: no targets in $manifest" >&2; exit 1; }

failed=0
summary=
while read -r name binary seeds dict; do
  if [ -n "$only" ] && ! echo " $only " | grep -q " $name "; then continue; fi
  work=$build/fuzz/corpus/$name
  artifacts=$build/fuzz/artifacts/$name
  log=$build/fuzz/$name.log
  mkdir -p "$work" "$artifacts"
  echo "== $name: ${seconds} s (seeds: $seeds)"
  set -- -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/"
  [ -n "$dict" ] && set -- "$@" -dict="$dict"
  status=0
  start=$(date +%s)
  "$binary" "$@" "$work" "$seeds" </dev/null >"$log" 2>&1 || status=$?
  took=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  line="$name: ${execs:-?} executions in ${took} s, coverage ${cov:-?} edges, corpus $(ls "$work" | wc -l) inputs"
  if [ "$status" -ne 0 ]; then
    failed=1
    line="$line: FAILED (exit $status)"
    echo "---- $log (end)"
    tail -40 "$log"
    echo "---- artifacts: $(ls "$artifacts" | sed "s|^|$artifacts/|" | tr '\n' ' ')"
  fi
  echo "$line"
  summary="$summary$line
"
done <"$manifest"

echo "== summary"
printf '%s' "$summary"
exit $failed
