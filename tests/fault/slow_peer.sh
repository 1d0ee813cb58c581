#!/usr/bin/env bash
# A slow peer on one machine: runs tests/conformance/run_pair.sh with the arguments given
# (the programs under UROCE_STATS=1, one side behind UROCE_FAULT's slow link), then reads
# the "uroce stats" line each process printed at exit and checks that the run was clean:
# ghost responses (answers to requests already answered, e.g. to READs re-sent too
# early) and duplicate requests each at most MAX_PERCENT % of the packets that process
# received, and on the side behind the slow link, the datagrams its full queue dropped
# at most OVERFLOW_PERCENT % of those sent (a sender that does not adapt its window
# loses most of a burst there).
#
#   slow_peer.sh --max-percent P [--max-overflow-percent Q] --name NAME --outdir DIR
#                [run_pair.sh options...]
#
# Prints each process's figures; exits 1 if run_pair.sh failed, a stats line is missing
# or a share is over the limit.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
max= max_overflow=5 name= outdir=. args=()
while (($#)); do
  case $1 in
    --max-percent) max=$2; shift 2 ;;
    --max-overflow-percent) max_overflow=$2; shift 2 ;;
    --name) name=$2; args+=("$1" "$2"); shift 2 ;;
    --outdir) outdir=$2; args+=("$1" "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ -n $max && -n $name ]] || { echo "slow_peer: --max-percent and --name are required" >&2; exit 2; }
"$here/../conformance/run_pair.sh" "${args[@]}"

# field LINE NAME: the number after "NAME " in a stats line.
field() { sed -n "s/.*[:,] $2 \([0-9]*\),.*/\1/p" <<<"$1"; }
status=0
for side in server client; do
  log=$outdir/$name.$side.log
  line=$(grep -o -m1 'uroce stats.*' "$log" || true)
  if [[ -z $line ]]; then
    echo "slow_peer: $side: no 'uroce stats' line in $log" >&2
    status=1
    continue
  fi
  rx=$(field "$line" rx) ghost=$(field "$line" ghost) dup=$(field "$line" duplicates)
  retx=$(field "$line" retransmits)
  echo "slow_peer: $side: rx $rx, ghost $ghost, duplicates $dup, retransmits $retx"
  for what in ghost dup; do
    if ((${!what} * 100 > max * rx)); then
      echo "slow_peer: $side: $what ${!what} is over $max % of rx $rx" >&2
      status=1
    fi
  done
  fault=$(grep -o -m1 'uroce fault injection.*' "$log" || true)
  [[ -n $fault ]] || continue
  sent=$(sed -n 's/.*: \([0-9]*\) sent,.*/\1/p' <<<"$fault") over=$(sed -n 's/.*, \([0-9]*\) overflowed.*/\1/p' <<<"$fault")
  echo "slow_peer: $side: slow link: $sent sent, $over overflowed"
  if ((over * 100 > max_overflow * sent)); then
    echo "slow_peer: $side: $over overflowed is over $max_overflow % of $sent sent" >&2
    status=1
  fi
done
exit $status
