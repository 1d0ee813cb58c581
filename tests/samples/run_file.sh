#!/usr/bin/env bash
# file-send / file-recv over 127.0.0.1: a deterministic 2.6 MB file (not a multiple of the
# 64 KiB chunk) goes through run_pair.sh; the received copy must be identical.
#   run_file.sh LAUNCHER BINDIR OUTDIR PORT
set -euo pipefail
launcher=$1 bindir=$2 outdir=$3 port=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$outdir"
in=$outdir/file.in out=$outdir/file.out
seq 1 400000 >"$in"
rm -f "$out"
"$here/../conformance/run_pair.sh" --launcher "$launcher" --name file_transfer --outdir "$outdir" --port "$port" \
  --timeout 30 --server-expect "checksum OK" --client-expect "receiver confirms the checksum" \
  --server "$bindir/file-recv" --port "$port" "$out" \
  --client "$bindir/file-send" --port "$port" "$in" 127.0.0.1
cmp "$in" "$out"
echo "PASSED: $(stat -c %s "$out") bytes received intact"
