#!/bin/sh
# abi.exports: uroce must export exactly what Debian's libibverbs.so.1 and
# librdmacm.so.1 export (design.md section 2): the same (name, version node,
# default-or-compat, function-or-object) set in `objdump -T`, and the same
# version nodes with the same inheritance in `readelf -V` — plus exactly the libc
# functions of src/verbs/interpose.map (listed below).
#
# usage: check_exports.sh [LIB [REFERENCE_LIB...]]
#   LIB defaults to build/lib/liburoce.so; the references default to Debian's
#   libibverbs.so.1 and librdmacm.so.1 (found through ldconfig).
# Prints every missing/extra entry and exits 1 on any difference (2 on setup
# errors).
set -eu

lib=${1:-build/lib/liburoce.so}
[ $# -gt 0 ] && shift
if [ $# -eq 0 ]; then
    for name in libibverbs.so.1 librdmacm.so.1; do
        path=$(/sbin/ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && /x86-64|x86_64/ { print $NF; exit }')
        [ -n "$path" ] || path=/usr/lib/x86_64-linux-gnu/$name
        set -- "$@" "$path"
    done
fi
for f in "$lib" "$@"; do
    if [ ! -r "$f" ]; then
        echo "check_exports: cannot read $f" >&2
        exit 2
    fi
done
if ! command -v objdump >/dev/null || ! command -v readelf >/dev/null; then
    echo "check_exports: objdump/readelf (binutils) not found" >&2
    exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# One line per defined dynamic symbol: "NAME VERSION default|compat function|object".
# objdump prints a non-default (hidden) version as "(NODE)"; the linker's
# per-node *ABS* symbols (NAME == NODE) are covered by the readelf check.
symbols() {
    objdump -T "$1" | awk '
        $1 !~ /^[0-9a-f]+$/ || NF < 6 { next }
        {
            type = ""; sect = ""
            for (i = 2; i <= 4 && i < NF; i++)
                if ($i ~ /D[FO]$/) { type = $i; sect = $(i + 1); break }
            if (type == "" || sect == "*UND*") next
            ver = $(NF - 1); name = $NF
            if (sect == "*ABS*" && ver == name) next
            def = "default"
            if (ver ~ /^\(.*\)$/) { def = "compat"; ver = substr(ver, 2, length(ver) - 2) }
            print name, ver, def, (type ~ /O$/ ? "object" : "function")
        }'
}

# One line per version definition: "node NODE [parent PARENT]" (BASE excluded).
nodes() {
    readelf -V "$1" | awk '
        /^Version needs/ { exit }
        /Flags: BASE/ { cur = ""; next }
        /Name:/ { if (cur != "") print line; cur = $NF; line = "node " cur; next }
        /Parent 1:/ && cur != "" { line = line " parent " $NF }
        END { if (cur != "") print line }'
}

for ref in "$@"; do
    symbols "$ref"
    nodes "$ref"
done | sort -u >"$tmp/want"
{ symbols "$lib"; nodes "$lib"; } | sort -u >"$tmp/have"

if [ ! -s "$tmp/want" ]; then
    echo "check_exports: no symbols read from the reference libraries" >&2
    exit 2
fi

comm -23 "$tmp/want" "$tmp/have" >"$tmp/missing"
# Beyond rdma-core's surface, exactly the libc functions liburoce answers for its own
# device files (src/verbs/device_file.cc, src/verbs/interpose.map) may be exported.
cat >"$tmp/allowed" <<'EOF2'
access GLIBC_2.2.5 default function
node GLIBC_2.2.5
node GLIBC_2.33
stat GLIBC_2.33 default function
stat64 GLIBC_2.33 default function
EOF2
sort -o "$tmp/allowed" "$tmp/allowed"
comm -13 "$tmp/want" "$tmp/have" | comm -23 - "$tmp/allowed" >"$tmp/extra"

nwant=$(grep -vc '^node ' "$tmp/want" || true)
nhave=$(grep -vc '^node ' "$tmp/have" || true)
nodes_want=$(grep -c '^node ' "$tmp/want" || true)
nodes_have=$(grep -c '^node ' "$tmp/have" || true)
echo "reference: $nwant symbol versions, $nodes_want version nodes ($*)"
echo "uroce:     $nhave symbol versions, $nodes_have version nodes ($lib)"

# Informational: exports still served by the weak "not supported" stubs.
nweak=$(objdump -T "$lib" | awk '$2 == "w" && / D[FO] / && !/\*UND\*/' | wc -l)
echo "uroce:     $nweak exports are still weak stubs (src/*/abi_stubs.cc)"

status=0
if [ -s "$tmp/missing" ]; then
    echo "MISSING from uroce ($(wc -l <"$tmp/missing")):"
    sed 's/^/  - /' "$tmp/missing"
    status=1
fi
if [ -s "$tmp/extra" ]; then
    echo "EXTRA in uroce ($(wc -l <"$tmp/extra")):"
    sed 's/^/  + /' "$tmp/extra"
    status=1
fi
[ $status -eq 0 ] && echo "OK: export sets match"
exit $status
