#!/usr/bin/env bash
# Runs one program under `uroce run` and checks its output.
#
#   run_one.sh [options] [--] PROGRAM [ARGS...]
#
# Options:
#   --expect REGEX     the output (stdout + stderr) must contain a line matching REGEX
#                      (grep -E); repeatable
#   --reject REGEX     the output must not contain a line matching REGEX; repeatable
#   --timeout SECONDS  time limit (default 60)
#   --launcher PATH    the uroce launcher (default: $UROCE_LAUNCHER, else build/bin/uroce
#                      of this repository)
#
# Succeeds only if the program exits 0 within the limit and every expectation holds.
# The output is always printed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
timeout_s=60
launcher=${UROCE_LAUNCHER:-$here/../../build/bin/uroce}
expect=() reject=()

die() { echo "run_one: $*" >&2; exit 2; }

while (($#)); do
  case $1 in
    --expect) expect+=("$2"); shift 2 ;;
    --reject) reject+=("$2"); shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --launcher) launcher=$2; shift 2 ;;
    --) shift; break ;;
    -*) die "unknown option '$1'" ;;
    *) break ;;
  esac
done
(($#)) || die "missing PROGRAM"
# Sanitizer builds run slower: scripts/sanitize.sh sets UROCE_TIMEOUT_SCALE (a whole factor).
[[ ${UROCE_TIMEOUT_SCALE:-1} =~ ^[1-9][0-9]*$ ]] || die "UROCE_TIMEOUT_SCALE must be a positive whole number"
timeout_s=$((timeout_s * ${UROCE_TIMEOUT_SCALE:-1}))
[[ -x $launcher ]] || die "launcher '$launcher' not found or not executable (build first, or set UROCE_LAUNCHER)"

log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "run_one: $*"
rc=0
timeout -k 5 "$timeout_s" "$launcher" run -- "$@" >"$log" 2>&1 </dev/null || rc=$?
cat "$log"

problems=()
case $rc in
  0) ;;
  124) problems+=("timed out after ${timeout_s}s") ;;
  *) problems+=("exited with status $rc") ;;
esac
for re in ${expect[@]+"${expect[@]}"}; do
  grep -Eq -- "$re" "$log" || problems+=("no line matching /$re/")
done
for re in ${reject[@]+"${reject[@]}"}; do
  if grep -Eq -- "$re" "$log"; then problems+=("output matches /$re/"); fi
done
if ((${#problems[@]})); then
  echo "run_one: FAILED: $(printf '%s; ' "${problems[@]}")" >&2
  exit 1
fi
echo "run_one: passed"
