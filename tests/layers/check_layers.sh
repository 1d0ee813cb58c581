#!/bin/sh
# layers.includes: the dependency rule, enforced on the project's #includes.
#
# Every layer's CMake target exposes all of src/ (target_include_directories
# ... PUBLIC src/ in src/CMakeLists.txt), so an upward #include would compile;
# this check is what keeps dependencies pointing down. For every source file
# under src/, include/, tools/ and bench/ it lists the project includes
# ("layer/file.h" or <layer/file.h>, where layer is a folder of src/, or
# "uroce/..." for the C++ API) and fails on each one the table below does not
# allow, printing file:line and the rule it breaks. Relative includes that
# leave the file's folder ("../x.h") are refused: they would hide the layer.
#
# usage: check_layers.sh [SOURCE_DIR]   (default: .)
# Exits 1 on any violation or stale exception, 2 on setup errors.
set -eu

root=${1:-.}
root=${root%/}
if [ ! -d "$root/src" ]; then
    echo "check_layers: $root/src not found (pass the source directory)" >&2
    exit 2
fi
cd "$root"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# Who may include what: "UNIT: ALLOWED...". UNIT is a folder; a file belongs
# to the longest UNIT its path starts with. A folder src/L may always include
# its own layer L. ALLOWED names a layer (any of its headers) or one header
# (layer/file.h: that header only); "-" is nothing but itself. The public C
# ABI headers (<infiniband/verbs.h>, <rdma/rdma_cma.h>...) and the C and C++
# libraries are not project includes and are always allowed.
#
# From ../shared/design.md section 7 ("Dependencies point down only:
# wire <- core <- engine -> transport (interface); verbs and rdmacm use core
# and engine; include/, tools/ and bench/ use the public C ABI only") and
# docs/architecture.md "Layers" (the same, with rdmacm narrowed: it "uses
# core (addresses, configuration, logging) and reaches devices and QPs only
# through the public verbs API"; the launcher "also links core for the table
# of environment variables it prints"; and the engine's same-host part split
# off below it: "wire <- core <- host <- engine", transport below host and
# engine). Down means a layer may include the layers it uses and what those
# stand on, so each row lists that closure:
#   - host (uroce_host, linked by uroce_engine: what the engines of one host
#     share): core, transport and wire. Not the engine: the engine passes
#     what host needs (a core::Qp, a datagram) and does the sending and the
#     counting.
#   - engine: host, core and transport, and wire below them.
#   - verbs: engine and core, and below them host, wire and transport.
#   - rdmacm: core and wire (below core); not the engine (architecture.md's
#     narrower rule); of transport only datagram.h, for transport::IpAddress,
#     the address type of "everything above the transport" (architecture.md
#     "IPv6"); rdmacm does not use the transport's sockets. Of the engine
#     only gsi.h: QP1, which carries the CM's MADs to a kernel's CM.
# Folders the two documents' tables do not name, placed by what CMake links
# them against and what the documents say of them elsewhere:
#   - src/base (uroce_base, linked by uroce_wire and uroce_transport): the
#     floor under every layer of the library (the data path's mutex); it
#     includes nothing of the project, and every layer that is part of the
#     engine's library may include it (not rsockets, on the C ABI only).
#   - src/rsockets: compiled into liburoce with verbs and rdmacm (which links
#     uroce_engine), so the build would let it include anything; src/
#     CMakeLists.txt and architecture.md ("Middleware": "on uroce's own
#     rdma_cm and verbs ABI only") put it above both, on the C ABI: itself
#     only.
#   - include/ (the C++ API, uroce_cxx: an INTERFACE target linking no
#     layer): only its own uroce/*.hpp.
#   - tools/ (the launcher, uroce_launcher: links liburoce and uroce_core):
#     core. tools/samples (uroce_samples_common and the sample programs: link
#     libibverbs and librdmacm only): nothing.
#   - bench/ (links libibverbs and Threads only): nothing.
#   - tests/ is not checked: unit tests reach into the layer they test.
# A folder added under src/ without a row here fails the check: give it one.
cat >"$tmp/table" <<'EOF'
src/base: -
src/wire: base
src/transport: base
src/core: wire base
src/host: core transport wire base
src/engine: host core transport wire base
src/verbs: engine host core transport wire base
src/rdmacm: core wire base transport/datagram.h engine/gsi.h
src/rsockets: -
include: uroce
tools: core
tools/samples: -
bench: -
EOF

# Includes the table forbids that stay, each with why it is not fixed:
# "FILE INCLUDE: why". Keep the list short and the reasons true; an entry
# that no longer matches an include fails the check (remove it).
cat >"$tmp/exceptions" <<'EOF'
# verbs/export.h is not the verbs layer's API but liburoce's export mechanism:
# UROCE_API (default visibility in a -fvisibility=hidden library) and the
# abi_guard family that keeps C++ exceptions from crossing the ABI (design.md
# section 2; tests/abi/check_abi_guard.sh checks every UROCE_API definition
# of verbs, rdmacm and rsockets against it). rdmacm and rsockets export their
# own functions from the same library and need it; no layer below rsockets
# may hold it (rsockets sits on the C ABI only), so moving it would mean a
# new bottom layer for ABI plumbing: a decision for docs/architecture.md,
# not a move.
src/rdmacm/api_util.h verbs/export.h: librdmacm exports (UROCE_API, abi_guard in cm_call)
src/rsockets/rsocket_api.cc verbs/export.h: rsocket exports (UROCE_API, abi_guard in with_socket)
# `uroce stats` reads the live counters file an engine writes: the header is
# the file format (layout, magic, version, folder and name), inline on
# purpose so that the launcher "uses this header's layout and names without
# linking the engine" (live_counters.h). Moving the format out of the engine
# (to core, or a format header of its own) is a larger change than this check.
tools/stats.cc engine/live_counters.h: the live counters file format (header only, not linked)
EOF

# The layer names: the folders of src/, and uroce (include/uroce, the C++ API).
layers=$(for d in src/*/; do [ -d "$d" ] && basename "$d"; done)
layers="$layers uroce"

files=$(for dir in src include tools bench; do
    [ -d "$dir" ] || continue
    find "$dir" -type f \( -name '*.h' -o -name '*.hh' -o -name '*.hpp' -o -name '*.c' \
        -o -name '*.cc' -o -name '*.cpp' -o -name '*.cxx' -o -name '*.inc' -o -name '*.ipp' \)
done | LC_ALL=C sort)
if [ -z "$files" ]; then
    echo "check_layers: no source files under $root" >&2
    exit 2
fi

status=0
# shellcheck disable=SC2086 # one argument per file (the paths have no spaces)
awk -v table="$tmp/table" -v exceptions="$tmp/exceptions" -v layer_names="$layers" \
    -v used="$tmp/used" '
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
BEGIN {
    n = split(layer_names, l, /[ \t\n]+/)
    for (i = 1; i <= n; i++) if (l[i] != "") is_layer[l[i]] = 1
    while ((getline line < table) > 0) {
        if (line ~ /^[ \t]*(#|$)/) continue
        unit = trim(substr(line, 1, index(line, ":") - 1))
        allowed[unit] = trim(substr(line, index(line, ":") + 1))
        units[unit] = 1
    }
    close(table)
    while ((getline line < exceptions) > 0) {
        if (line ~ /^[ \t]*(#|$)/) continue
        split(trim(substr(line, 1, index(line, ":") - 1)), kv, /[ \t]+/)
        exc[kv[1] " " kv[2]] = trim(substr(line, index(line, ":") + 1))
    }
    close(exceptions)
    # Every layer of src/ needs a row.
    for (name in is_layer)
        if (name != "uroce" && !(("src/" name) in units)) {
            printf "src/%s: a folder of src/ with no row in the layer table of check_layers.sh\n", name
            bad = 1
        }
}
FNR == 1 {
    # The file'"'"'s unit: the longest table folder its path starts with.
    u = ""
    for (unit in units)
        if (index(FILENAME, unit "/") == 1 && length(unit) > length(u)) u = unit
    own = (u ~ /^src\//) ? substr(u, 5) : ""
}
/^[ \t]*#[ \t]*include[ \t]*["<]/ {
    line = $0
    sub(/^[ \t]*#[ \t]*include[ \t]*["<]/, "", line)
    inc = substr(line, 1, match(line, /[">]/) - 1)
    if (inc ~ /(^|\/)\.\.\//) {
        printf "%s:%d: #include \"%s\": a relative include leaving the folder; name the header as layer/file.h\n", FILENAME, FNR, inc
        bad = 1
        next
    }
    slash = index(inc, "/")
    if (slash == 0) next                    # a header of the same folder
    dep = substr(inc, 1, slash - 1)
    if (!(dep in is_layer)) next            # not a project layer (<infiniband/verbs.h>...)
    if (u == "") {
        printf "%s:%d: #include \"%s\": the file is in no folder of the layer table\n", FILENAME, FNR, inc
        bad = 1
        next
    }
    if (dep == own) next
    m = split(allowed[u], a, /[ \t]+/)
    for (i = 1; i <= m; i++)
        if (a[i] == dep || a[i] == inc) next
    if ((FILENAME " " inc) in exc) {
        print FILENAME " " inc > used
        next
    }
    what = (own != "") ? own : u
    if (allowed[u] == "-") rule = (own != "") ? own " only" : "no layer"
    else rule = (own != "" ? own " " : "") allowed[u]
    printf "%s:%d: #include \"%s\": %s may not include %s (it may include: %s; the table in tests/layers/check_layers.sh, after design.md section 7 and docs/architecture.md \"Layers\")\n", FILENAME, FNR, inc, what, dep, rule
    bad = 1
}
END {
    close(used)
    while ((getline line < used) > 0) seen[line] = 1
    for (k in exc)
        if (!(k in seen)) {
            printf "stale exception in check_layers.sh: %s (no such include any more: remove the entry)\n", k
            bad = 1
        }
    exit bad
}
' $files || status=$?

# Within a layer's folder, no two modules include each other. A module is a
# file's name without its extension (engine_qp.h and engine_qp.cc are module
# engine_qp); modules A and B are a pair when some file of A includes
# "layer/B.h" and some file of B includes "layer/A.h". Such a pair is one
# concept cut in two, or a caller and its callee that each know the other:
# pass what is needed, declare instead of including, or move the function to
# the module that owns what it touches (a third module may include both).
# Checked for the layers whose modules call each other most: engine and host.
for layer in engine host; do
    dir=src/$layer
    [ -d "$dir" ] || continue
    # shellcheck disable=SC2046 # one argument per file (the paths have no spaces)
    awk -v layer="$layer" '
function module_of(path,    name) {
    name = path
    sub(/.*\//, "", name)
    sub(/\.[^.]*$/, "", name)
    return name
}
/^[ \t]*#[ \t]*include[ \t]*"/ {
    line = $0
    sub(/^[ \t]*#[ \t]*include[ \t]*"/, "", line)
    inc = substr(line, 1, index(line, "\"") - 1)
    if (index(inc, layer "/") != 1) next
    a = module_of(FILENAME)
    b = module_of(inc)
    if (a == b || ((a " " b) in by)) next
    by[a " " b] = FILENAME ":" FNR " includes " inc
}
END {
    for (k in by) {
        split(k, ab, " ")
        if (ab[1] < ab[2] && ((ab[2] " " ab[1]) in by)) {
            printf "src/%s: modules %s and %s include each other (%s; %s): one of them must not know the other (see check_layers.sh)\n", layer, ab[1], ab[2], by[k], by[ab[2] " " ab[1]]
            bad = 1
        }
    }
    exit bad
}
' $(find "$dir" -type f \( -name '*.h' -o -name '*.cc' \) | LC_ALL=C sort) || status=1
done

if [ "$status" -eq 0 ]; then
    echo "check_layers: $(echo "$files" | wc -l) files, every project include points down, no module pair of src/engine or src/host includes each other"
fi
exit $status
