#!/usr/bin/env bash
# Installs a uroce build tree into a temporary prefix and uses it as an out-of-tree user
# would (tests/install/consumer/):
#   1. cmake --install BUILD --prefix P; checks what is (and is not) in P
#   2. consumer_pc: plain Makefile, pkg-config --cflags --libs uroce (PKG_CONFIG_PATH=P/...)
#   3. consumer_cmake: find_package(uroce CONFIG REQUIRED), uroce::uroce (CMAKE_PREFIX_PATH=P);
#      consumer_cxx too (uroce::cxx) when P/include/uroce/uroce.hpp is installed
#   4. runs both (liburoce found through their rpath), and consumer_ibverbs (-libverbs) under
#      P/bin/uroce run, which must preload P's library; ibv_devices likewise when installed
# Every step has a time limit; the prefix and the consumers' builds are removed at exit.
#
# Usage: run_install_test.sh --build-dir DIR --consumer-dir DIR [--cmake PATH] [--cc PATH]
#                            [--cxx PATH] [--sanitize LIST]
set -Eeuo pipefail  # -E: the ERR trap below also reports failures inside functions

build_dir='' consumer_dir='' cmake=cmake cc=cc cxx=c++ sanitize=''
while (($#)); do
  (($# >= 2)) || { echo "run_install_test: '$1' needs a value" >&2; exit 2; }
  case $1 in
    --build-dir) build_dir=$2 ;;
    --consumer-dir) consumer_dir=$2 ;;
    --cmake) cmake=$2 ;;
    --cc) cc=$2 ;;
    --cxx) cxx=$2 ;;
    --sanitize) sanitize=$2 ;;
    *) echo "run_install_test: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift 2
done
[[ -d $build_dir && -f $consumer_dir/consumer.c ]] || {
  echo "usage: run_install_test.sh --build-dir DIR --consumer-dir DIR [--cmake PATH] [--cc PATH]" \
    "[--cxx PATH] [--sanitize LIST]" >&2
  exit 2
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/uroce-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
tmp=$(realpath "$tmp")
prefix=$tmp/prefix

fail() { echo "run_install_test: FAIL: $*" >&2; exit 1; }
trap 'echo "run_install_test: FAIL: line $LINENO: $BASH_COMMAND (status $?)" >&2' ERR
# step SECONDS COMMAND...: runs COMMAND (echoed) with a time limit and without any preload
# inherited from the caller.
step() {
  local seconds=$1
  shift
  echo "+ $*" >&2
  timeout --kill-after=5 "$seconds" env -u LD_PRELOAD -u UROCE_LIB "$@"
}

# Sanitizer builds: liburoce needs the sanitizer runtime first in the process, so the
# consumers are instrumented too.
san_flags=${sanitize:+-fsanitize=$sanitize}

# 1. Install, and check the layout.
step 120 "$cmake" --install "$build_dir" --prefix "$prefix" >/dev/null
[[ -x $prefix/bin/uroce ]] || fail "no bin/uroce in the prefix"
lib=$(find "$prefix" -name liburoce.so -print -quit)
[[ -n $lib ]] || fail "no liburoce.so in the prefix"
libdir=$(dirname "$lib")
for f in "$libdir"/liburoce.so.0 "$libdir/pkgconfig/uroce.pc" "$libdir/cmake/uroce/uroceConfig.cmake" \
  "$libdir/cmake/uroce/uroceConfigVersion.cmake"; do
  [[ -e $f ]] || fail "missing ${f#"$prefix"/}"
done
static=$(find "$prefix" -name '*.a')
[[ -z $static ]] || fail "static libraries installed: $static"
if readelf -d "$prefix/bin/uroce" "$libdir/liburoce.so" | grep -F -- "$(realpath "$build_dir")"; then
  fail "an installed binary still refers to the build tree"
fi

# 2. pkg-config and a plain Makefile.
export PKG_CONFIG_PATH=$libdir/pkgconfig
flags=$(step 30 pkg-config --cflags --libs uroce)
echo "pkg-config --cflags --libs uroce: $flags"
[[ " $flags " == *" -I$prefix/include "* && " $flags " == *" -L$libdir "* && " $flags " == *" -luroce "* ]] ||
  fail "pkg-config gives '$flags'"
[[ " $flags " != *" -libverbs "* ]] || fail "pkg-config links libibverbs: '$flags'"
mkdir "$tmp/make"
step 120 make -s -C "$tmp/make" -f "$consumer_dir/Makefile" SRCDIR="$consumer_dir" CC="$cc" \
  CFLAGS="-O2 $san_flags"
# (grep without -q reads all its input: no SIGPIPE for readelf under pipefail)
needed=$(readelf -d "$tmp/make/consumer_pc" | grep NEEDED)
[[ $needed == *"[liburoce.so.0]"* ]] || fail "consumer_pc does not need liburoce: $needed"
[[ $needed != *libibverbs* ]] || fail "consumer_pc needs libibverbs: $needed"

# 3. find_package(uroce CONFIG REQUIRED).
cxx_args=()
if [[ -f $prefix/include/uroce/uroce.hpp ]]; then
  cxx_args=(-DUROCE_CONSUMER_CXX=ON -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$san_flags")
fi
step 120 "$cmake" -S "$consumer_dir" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$san_flags" ${cxx_args[@]+"${cxx_args[@]}"} >/dev/null
step 180 "$cmake" --build "$tmp/cmake" >/dev/null

# 4. Run them: linked with liburoce, and with libibverbs under the installed launcher.
step 60 "$tmp/make/consumer_pc"
step 60 "$tmp/cmake/consumer_cmake"
step 60 "$prefix/bin/uroce" run -- "$tmp/make/consumer_ibverbs"
if ((${#cxx_args[@]})); then
  step 60 "$tmp/cmake/consumer_cxx"
else
  echo "run_install_test: no include/uroce/uroce.hpp installed; C++ consumer not built"
fi
# shellcheck disable=SC2016  # $LD_PRELOAD is expanded by the launched shell
preload=$(step 30 "$prefix/bin/uroce" run -- sh -c 'echo "$LD_PRELOAD"')
[[ $preload == *"$(realpath "$lib")"* ]] || fail "the installed launcher preloads '$preload', not $lib"
if command -v ibv_devices >/dev/null; then
  step 30 "$prefix/bin/uroce" run -- ibv_devices | grep -E '^[[:space:]]*uroce0[[:space:]]' ||
    fail "ibv_devices under the installed launcher does not list uroce0"
fi
echo "run_install_test: PASS"
