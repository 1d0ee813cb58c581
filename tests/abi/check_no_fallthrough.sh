#!/bin/sh
# abi.no_fallthrough: run unmodified Debian programs with uroce preloaded and
# fail if any symbol is bound to the real libibverbs.so.1 / librdmacm.so.1
# instead of uroce (design.md section 2: "never let that happen").
#
# usage: check_no_fallthrough.sh [--require-success] [LIB] [-- PROGRAM [ARGS...]]
#        check_no_fallthrough.sh --all-debian-utils [LIB]
#
#   LIB                 the uroce library (default build/lib/liburoce.so)
#   PROGRAM             default: ibv_devices.  It must not crash or hang; its
#                       exit status is otherwise ignored unless
#                       --require-success is given.
#   --all-debian-utils  every installed program of ibverbs-utils, rdmacm-utils
#                       and perftest, each started with an invalid option so
#                       it exits at once; only the bindings are checked.
#
# LD_BIND_NOW=1 makes the dynamic linker resolve every imported function at
# start-up, so the check covers all of a program's imports, not only the
# functions that the run happens to call.  LD_DEBUG=bindings logs where each
# one went.  Exit: 0 ok, 1 fall-through (or crash/hang), 2 setup error,
# 77 nothing to run (CTest SKIP_RETURN_CODE).
set -eu

require_success=0
all_utils=0
while [ $# -gt 0 ]; do
    case $1 in
        --require-success) require_success=1; shift ;;
        --all-debian-utils) all_utils=1; shift ;;
        --) break ;;
        -*) echo "check_no_fallthrough: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
lib=build/lib/liburoce.so
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    lib=$1
    shift
fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift

if [ ! -r "$lib" ]; then
    echo "check_no_fallthrough: cannot read $lib" >&2
    exit 2
fi
# ld.so reports a preloaded object under the path given in LD_PRELOAD.
lib=$(cd "$(dirname "$lib")" && pwd -P)/$(basename "$lib")

DEBIAN_UTILS="
ibv_asyncwatch ibv_devices ibv_devinfo ibv_rc_pingpong ibv_srq_pingpong
ibv_uc_pingpong ibv_ud_pingpong ibv_xsrq_pingpong
cmtime mckey rcopy rdma_client rdma_server rdma_xclient rdma_xserver riostream
rping rstream ucmatose udaddy udpong
ib_atomic_bw ib_atomic_lat ib_read_bw ib_read_lat ib_send_bw ib_send_lat
ib_write_bw ib_write_lat raw_ethernet_burst_lat raw_ethernet_bw
raw_ethernet_fs_rate raw_ethernet_lat"

# A sanitizer build of uroce needs its runtime preloaded ahead of it (the
# Debian programs are not instrumented).
preload=$lib
for rt in ubsan tsan asan; do  # the last one prepended comes first
    dep=$(ldd "$lib" 2>/dev/null | awk -v r="lib$rt.so" 'index($1, r) == 1 { print $3; exit }')
    [ -n "$dep" ] && preload="$dep $preload"
done
# Their leaks are not uroce's: no leak detection unless ASAN_OPTIONS asks for it.
case ${ASAN_OPTIONS:-} in
    *detect_leaks*) ;;
    *) ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 ;;
esac
export ASAN_OPTIONS

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

status=0
ran=0

# check PROGRAM_PATH BIND_ONLY ARGS...
check() {
    prog=$1
    bind_only=$2
    shift 2
    name=$(basename "$prog")
    rm -f "$tmp"/ld.* "$tmp/out"
    rc=0
    timeout 60 env LD_PRELOAD="$preload" LD_BIND_NOW=1 LD_DEBUG=bindings \
        LD_DEBUG_OUTPUT="$tmp/ld" "$prog" "$@" </dev/null >"$tmp/out" 2>&1 || rc=$?
    ran=$((ran + 1))

    cat "$tmp"/ld.* 2>/dev/null | awk -v lib="$lib" '
        /binding file / && / symbol `/ {
            to = ""; sym = ""; ver = ""
            for (i = 1; i < NF; i++) if ($i == "to") { to = $(i + 1); break }
            for (i = 1; i <= NF; i++) if ($i == "symbol") { sym = $(i + 1); ver = $(i + 2); break }
            gsub(/[`'\'']/, "", sym)
            base = to; sub(/.*\//, "", base)
            if (to == lib) print "uroce", sym, ver
            else if (base ~ /^lib(ibverbs|rdmacm)\.so/) print "FALLTHROUGH", sym, ver, to
        }' | sort -u >"$tmp/bindings"

    n_uroce=$(grep -c '^uroce ' "$tmp/bindings" || true)
    bad=$(grep '^FALLTHROUGH ' "$tmp/bindings" || true)
    ok=1
    if [ -n "$bad" ]; then
        echo "FAIL $name: symbols bound to the real rdma-core libraries:"
        echo "$bad" | sed 's/^FALLTHROUGH /  /'
        ok=0
    fi
    if [ "$n_uroce" -eq 0 ]; then
        echo "FAIL $name: nothing was bound to $lib (was it preloaded?)"
        ok=0
    fi
    # timeout(1): 124 timed out, 125-127 could not run, 128+N killed by signal N.
    if [ $rc -eq 124 ]; then
        echo "FAIL $name: timed out"
        ok=0
    elif [ $rc -ge 125 ] && [ $rc -le 127 ]; then
        echo "FAIL $name: could not be run (exit status $rc)"
        ok=0
    elif [ $rc -gt 128 ] && [ $rc -le 192 ]; then
        echo "FAIL $name: killed by signal $((rc - 128))"
        ok=0
    elif [ "$bind_only" = 0 ] && [ $require_success -eq 1 ] && [ $rc -ne 0 ]; then
        echo "FAIL $name: exit status $rc (--require-success)"
        ok=0
    fi
    if [ $ok -eq 1 ]; then
        echo "ok   $name: $n_uroce symbol bindings to uroce, none to rdma-core (exit status $rc)"
    else
        status=1
    fi
    if [ "$bind_only" = 0 ]; then
        sed -n '1,20s/^/     | /p' "$tmp/out"
    elif [ $ok -eq 0 ]; then
        sed -n '1,3s/^/     | /p' "$tmp/out"
    fi
}

if [ $all_utils -eq 1 ]; then
    for name in $DEBIAN_UTILS; do
        prog=$(command -v "$name" 2>/dev/null) || continue
        check "$prog" 1 --uroce-no-such-option
    done
else
    [ $# -eq 0 ] && set -- ibv_devices
    name=$1
    shift
    if ! prog=$(command -v "$name" 2>/dev/null); then
        echo "SKIP: $name is not installed"
        exit 77
    fi
    check "$prog" 0 "$@"
fi

if [ $ran -eq 0 ]; then
    echo "SKIP: none of the Debian rdma utilities is installed"
    exit 77
fi
exit $status
