#!/bin/sh
# abi.guarded: no C++ exception crosses the ABI (design.md section 2).
#
#   - Every UROCE_API definition (src/verbs/export.h) must run its body inside
#     abi_guard / abi_guard_errno / abi_guard_neg_errno -- directly, or through
#     one of the guard wrappers below -- unless it is on the allow-list below,
#     with the reason its body cannot throw.
#   - Every function that src/verbs stores into a field of an ABI struct (the
#     ops tables of verbs/ops.cc, the ibv_qp_ex / ibv_cq_ex / ibv_dm callbacks:
#     the entry points verbs.h's inline functions call) must be guarded the
#     same way or declared noexcept (the data path: verbs/ops.h).
#
# usage: check_abi_guard.sh [SRC_DIR]   (default: src)
# Lists every definition that is none of these, every wrapper that does not
# run abi_guard and every stale allow-list entry (no such unguarded function);
# exits 1 if there is any (2 on setup errors).
#
# The sources are read as text, comments and the contents of string and
# character literals removed: a definition starts at column 0 and its body is
# the balanced { ... } after the signature; a field store is "x.field = name;".
set -eu

src=${1:-src}
src=${src%/}
if [ ! -d "$src/verbs" ]; then
    echo "check_abi_guard: $src/verbs not found (pass the source directory)" >&2
    exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# Functions that run their argument inside abi_guard: "NAME FILE". A body
# calling one counts as guarded; the script checks that NAME's definition in
# FILE does contain abi_guard.
cat >"$tmp/wrappers" <<'EOF'
cm_call rdmacm/api_util.h
with_socket rsockets/rsocket_api.cc
EOF

# The exports that stay unguarded: "NAME: why its body cannot throw". Keep
# the reasons true when the code changes: an export that starts to allocate
# (std::vector, std::string, new, maps, std::function...) or calls a C++
# function that may throw must be guarded instead.
cat >"$tmp/allowed" <<'EOF'
# String tables: a switch or a lookup in a static array.
ibv_wc_status_str: static table lookup
ibv_node_type_str: static table lookup
ibv_port_state_str: static table lookup
ibv_event_type_str: static table lookup
rdma_event_str: switch over constant strings
# Trivial: free(3), a field or a constant.
ibv_free_device_list: free(3) only
rdma_free_devices: free(3) only
rdma_freeaddrinfo: free(3) only
ibv_get_device_name: reads a field
ibv_get_device_guid: reads a field
rdma_get_src_port: reads a field
rdma_get_dst_port: reads a field
ibv_fork_init: returns a constant
ibv_unimport_pd: does nothing (the imported PD is the PD itself)
ibv_unimport_mr: does nothing (the imported MR is the MR itself)
ibv_unimport_dm: does nothing (the imported DM is the DM itself)
ibv_is_fork_initialized: returns a constant
ibv_ack_async_event: empty body
ibv_get_pkey_index: compares its arguments
ibv_qp_to_qp_ex: reads a field
ibv_ack_cq_events: pthread mutex/condition calls only
ibv_get_async_event: read(2) only
rdma_getaddrinfo: C library calls only (calloc, getaddrinfo, strdup, malloc)
# Forwarding: the body only calls exports that are guarded themselves.
ibv_reg_mr: forwards to ibv_reg_mr_iova2 (guarded)
ibv_reg_mr_iova: forwards to ibv_reg_mr_iova2 (guarded)
rsendto: forwards to rsend (guarded)
rwrite: forwards to rsend (guarded)
rread: forwards to rrecv (guarded)
rsendmsg: a loop over rsend (guarded), no allocation
rwritev: forwards to rsendmsg (allow-listed)
rrecvmsg: a loop over rrecv (guarded), no allocation
rreadv: forwards to rrecvmsg (allow-listed)
rrecvfrom: rrecv and rgetpeername (both guarded)
ibv_create_ah_from_wc: ibv_init_ah_from_wc and ibv_create_ah (both guarded)
rdma_create_qp: memcpy and rdma_create_qp_ex (guarded)
rdma_create_srq: memcpy and rdma_create_srq_ex (guarded)
rdma_destroy_ep: rdma_destroy_qp, rdma_destroy_srq and rdma_destroy_id (all guarded)
EOF

# Every function definition that starts at column 0 under $src, one record each:
#   def FILE:LINE NAME EXPORT GUARDED ABI_GUARD NOEXCEPT
# (EXPORT: a UROCE_API definition; GUARDED: its body calls abi_guard* or a wrapper;
# ABI_GUARD: its body names abi_guard itself; NOEXCEPT: its signature says noexcept),
# and every function stored into a field in src/verbs (ops tables, ibv_qp_ex /
# ibv_cq_ex / ibv_dm callbacks: "ops.poll_cq = poll_cq;"):
#   assign NAME FILE:LINE
# shellcheck disable=SC2016 # an awk program, not shell
prog='
    BEGIN {
        while ((getline line < wrappers) > 0) {
            split(line, f, " ")
            if (f[1] != "") guard_re = guard_re "|" f[1] "[ \t]*[(<]"
        }
        guard_re = "abi_guard" guard_re
    }
    FNR == 1 { in_block = 0; capturing = 0; rel = substr(FILENAME, length(src) + 1) }
    {
        # Remove comments and the contents of string and character literals.
        s = $0; out = ""; i = 1; n = length(s)
        while (i <= n) {
            c = substr(s, i, 1)
            if (in_block) {
                if (substr(s, i, 2) == "*/") { in_block = 0; i += 2 } else i++
                continue
            }
            if (substr(s, i, 2) == "//") break
            if (substr(s, i, 2) == "/*") { in_block = 1; i += 2; continue }
            if (c == "\"" || c == "\047") {
                q = c; out = out q; i++
                while (i <= n && substr(s, i, 1) != q) { if (substr(s, i, 1) == "\\") i++; i++ }
                out = out q; i++
                continue
            }
            out = out c; i++
        }
        line = out

        if (rel ~ /^verbs\// && match(line, /\.[A-Za-z_0-9]+ = [A-Za-z_][A-Za-z_0-9]*;/)) {
            a = substr(line, RSTART, RLENGTH); sub(/.* = /, "", a); sub(/;$/, "", a)
            print "assign", a, rel ":" FNR
        }

        if (!capturing) {
            if (line !~ /^[A-Za-z_]/ || line !~ /\(/ || line ~ /^(return|using|namespace|template|typedef)[^A-Za-z_0-9]/)
                next
            capturing = 1; start = FNR; text = ""; depth = 0; opened = 0
        }
        text = text " " line
        for (i = 1; i <= length(line); i++) {
            c = substr(line, i, 1)
            if (c == "{") { depth++; opened = 1 }
            else if (c == "}") depth--
            else if (c == ";" && !opened) { capturing = 0; break }  # a declaration
        }
        if (capturing && opened && depth == 0) {
            capturing = 0
            head = substr(text, 1, index(text, "(") - 1)
            sub(/[ \t]+$/, "", head)
            name = head; sub(/.*[^A-Za-z0-9_]/, "", name)
            sig = substr(text, 1, index(text, "{") - 1)
            body = substr(text, index(text, "{"))
            print "def", rel ":" start, name, (text ~ /^ UROCE_API[ \t]/ ? 1 : 0), (body ~ guard_re ? 1 : 0),
                  (body ~ /abi_guard/ ? 1 : 0), (sig ~ /[^A-Za-z_0-9]noexcept([^A-Za-z_0-9]|$)/ ? 1 : 0)
        }
    }
'
find "$src" \( -name '*.cc' -o -name '*.h' \) -exec awk -v wrappers="$tmp/wrappers" -v src="$src/" "$prog" {} + |
    LC_ALL=C sort >"$tmp/records"

grep -v '^#' "$tmp/allowed" | sed -n 's/^\([A-Za-z0-9_]*\):.*/\1/p' | LC_ALL=C sort >"$tmp/allowed_names"

# The exports ("FILE:LINE NAME guarded|unguarded").
awk '$1 == "def" && $4 == 1 { print $2, $3, ($5 ? "guarded" : "unguarded") }' "$tmp/records" >"$tmp/exports"
# The entry points stored into fields: the verbs functions named by an assign
# record ("FILE:LINE NAME guarded|noexcept|unguarded").
awk '
    $1 == "assign" { assigned[$2] = 1; next }
    $1 == "def" && $2 ~ /^verbs\// && $4 == 0 { line[$3] = $2; state[$3] = $6 ? "guarded" : $7 ? "noexcept" : "unguarded" }
    END { for (n in assigned) if (n in line) print line[n], n, state[n] }
' "$tmp/records" | LC_ALL=C sort >"$tmp/entries"

awk '{ print $2 }' "$tmp/exports" | LC_ALL=C sort >"$tmp/all_names"
awk '$3 == "guarded" { print $2 }' "$tmp/exports" | LC_ALL=C sort >"$tmp/guarded_names"
cat "$tmp/exports" "$tmp/entries" | awk '$3 == "unguarded" { print $2 }' | LC_ALL=C sort >"$tmp/unguarded_names"

total=$(wc -l <"$tmp/all_names")
guarded=$(wc -l <"$tmp/guarded_names")
allowed=$(wc -l <"$tmp/allowed_names")
nentries=$(wc -l <"$tmp/entries")
nentries_noexcept=$(awk '$3 == "noexcept"' "$tmp/entries" | wc -l)
nentries_guarded=$(awk '$3 == "guarded"' "$tmp/entries" | wc -l)
echo "UROCE_API definitions: $total ($guarded guarded, $allowed on the allow-list)"
echo "entry points stored in ABI structs: $nentries ($nentries_guarded guarded, $nentries_noexcept noexcept)"

status=0
if [ "$total" -eq 0 ] || [ "$nentries" -eq 0 ]; then
    echo "check_abi_guard: no UROCE_API definition or ops-table entry point found under $src" >&2
    exit 2
fi
while read -r w file; do
    if ! awk -v w="$w" -v f="$file" '$1 == "def" && $3 == w && index($2, f ":") == 1 && $6 { found = 1 } END { exit !found }' \
        "$tmp/records"; then
        echo "WRAPPER $w: no definition running abi_guard in $src/$file"
        status=1
    fi
done <"$tmp/wrappers"
bad=$(LC_ALL=C comm -23 "$tmp/unguarded_names" "$tmp/allowed_names")
if [ -n "$bad" ]; then
    echo "UNGUARDED (run the body inside abi_guard, make an ops-table entry point noexcept, or allow-list it"
    echo "with the reason it cannot throw):"
    for name in $bad; do
        cat "$tmp/exports" "$tmp/entries" | awk -v n="$name" '$2 == n && $3 == "unguarded" { print "  " $1 " " n }'
    done
    status=1
fi
stale=$(LC_ALL=C comm -23 "$tmp/allowed_names" "$tmp/unguarded_names")
if [ -n "$stale" ]; then
    echo "STALE allow-list entries (no such unguarded definition):"
    for name in $stale; do echo "  $name"; done
    status=1
fi
[ $status -eq 0 ] && echo "OK: every UROCE_API definition is guarded or allow-listed, every entry point guarded or noexcept"
exit $status
