#!/usr/bin/env bash
# atomic-counter: one server, three concurrent clients of M increments each. The server
# checks the final value; here the fetched values of all clients, merged, must be exactly
# 0..3M-1 (each once), and exactly one client must have won the claim.
#   run_atomic.sh LAUNCHER BINDIR OUTDIR PORT M
set -euo pipefail
launcher=$1 bindir=$2 outdir=$3 port=$4 iters=$5
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
values=$outdir/atomic_values
rm -rf "$values"
mkdir -p "$values"
"$here/../conformance/run_pair.sh" --launcher "$launcher" --name atomic_counter --outdir "$outdir" --port "$port" \
  --timeout 30 --clients 3 --server-expect "^final counter $((3 * iters)) == expected $((3 * iters))" \
  --client-expect "^$iters FETCH_AND_ADDs .* server: final value OK" \
  --server "$bindir/atomic-counter" --port "$port" --clients 3 \
  --client "$bindir/atomic-counter" --port "$port" --iters "$iters" --values-dir "$values" 127.0.0.1
files=("$values"/atomic-counter.*.values)
((${#files[@]} == 3)) || { echo "FAILED: expected 3 value files, found ${#files[@]}"; exit 1; }
if ! diff -q <(sort -n "${files[@]}") <(seq 0 $((3 * iters - 1))) >/dev/null; then
  echo "FAILED: the fetched values are not exactly 0..$((3 * iters - 1)) (duplicates or gaps)"
  exit 1
fi
winners=$(cat "$outdir"/atomic_counter.client.*.log | grep -c "; won the claim;" || true)
((winners == 1)) || { echo "FAILED: $winners clients won the claim, expected 1"; exit 1; }
echo "PASSED: $((3 * iters)) unique fetched values 0..$((3 * iters - 1)), one claim winner"
