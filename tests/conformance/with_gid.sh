#!/usr/bin/env bash
# Runs a command with the GID index of an address: every argument GID_INDEX becomes the
# index of ADDRESS in uroce0's GID table, as `uroce devices` lists it (the index of an
# IPv6 address depends on the host's addresses).
#
#   with_gid.sh LAUNCHER ADDRESS -- COMMAND [ARGS...]
#
# Exits 77 (CTest: skipped) when ADDRESS is not in the table (a host without IPv6),
# else with the command's status.
set -euo pipefail

die() { echo "with_gid: $*" >&2; exit 2; }
(($# >= 4)) && [[ $3 == -- ]] || die "usage: with_gid.sh LAUNCHER ADDRESS -- COMMAND [ARGS...]"
launcher=$1 address=$2
shift 3
[[ -x $launcher ]] || die "launcher '$launcher' not found or not executable"

table=$(timeout 20 "$launcher" devices) || die "'$launcher devices' failed"
index=$(awk -v a="$address" '$1 ~ /^GID\[[0-9]+\]$/ { g = $2; sub(/,$/, "", g)
          if (g == a) { gsub(/[^0-9]/, "", $1); print $1; exit } }' <<<"$table")
if [[ -z $index ]]; then
  echo "with_gid: $address is not among uroce0's GIDs: skipped"
  printf '%s\n' "$table"
  exit 77
fi
echo "with_gid: $address is GID index $index"
args=()
for a in "$@"; do args+=("${a//GID_INDEX/$index}"); done
exec "${args[@]}"
