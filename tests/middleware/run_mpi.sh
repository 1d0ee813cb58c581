#!/usr/bin/env bash
# Runs an MPI program with Open MPI's mpirun under `uroce run`, on one host or across two
# namespace hosts, and checks that every rank reported "rank R of N: OK".
#
#   run_mpi.sh --launcher PATH --np N [--hosts SUBNET] [--name NAME] [--outdir DIR]
#              [--timeout SECONDS] -- MPIRUN_OPTIONS... -- PROGRAM [ARGS...]
#
# --hosts SUBNET: two "hosts" (tests/netns/netns_pair.sh, 10.231.SUBNET.1 and .2); mpirun
# runs on the first and places N/2 ranks on each (rank order: the first host's, then the
# second's); Open MPI's rsh launcher starts the second host's daemon through netns_rsh.sh
# (`ip netns exec` instead of ssh). Needs root; exits 77 (skipped) otherwise.
#
# The output goes to OUTDIR/NAME.log and is printed. Succeeds only if mpirun exits 0 within
# the time limit (then it is killed, with every process of the namespaces) and N distinct
# "rank R of N: OK" lines appear.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
launcher='' np='' subnet='' name=mpi outdir=. timeout_s=120
die() { echo "run_mpi: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --launcher) launcher=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --hosts) subnet=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --outdir) outdir=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (see the comment at the top of $0)" ;;
  esac
done
mpirun_opts=()
while (($#)) && [[ $1 != -- ]]; do mpirun_opts+=("$1"); shift; done
(($#)) && shift
program=("$@")
[[ -x $launcher && $np =~ ^[1-9][0-9]*$ && ${#program[@]} -gt 0 ]] ||
  die "--launcher, --np and a program after the second -- are required"
command -v mpirun >/dev/null || die "mpirun not found (scripts/setup.sh installs openmpi-bin)"
timeout_s=$((timeout_s * ${UROCE_TIMEOUT_SCALE:-1}))
mkdir -p "$outdir"
log=$outdir/$name.log

# Open MPI refuses root unless told; the ranks may outnumber the CPUs.
common=(--allow-run-as-root --oversubscribe -np "$np")
in_ns=()
if [[ -n $subnet ]]; then
  ((np % 2 == 0)) || die "--hosts needs an even --np"
  # shellcheck source=../netns/netns_pair.sh
  source "$here/../netns/netns_pair.sh"
  trap netns_pair_down EXIT
  netns_pair_up "mpi$subnet" "$subnet"
  export UROCE_NETNS_HOSTS="$netns_ip_a=$netns_a $netns_ip_b=$netns_b"
  common+=(--host "$netns_ip_a:$((np / 2)),$netns_ip_b:$((np / 2))"
           --mca plm_rsh_agent "$here/netns_rsh.sh"
           --mca oob_tcp_if_include "$netns_ip_a/24") # the daemons' control links: the veth
  in_ns=(ip netns exec "$netns_a")
fi

echo "run_mpi: $name: mpirun -np $np ${mpirun_opts[*]} ${program[*]}${subnet:+ (hosts $netns_ip_a, $netns_ip_b)}"
rc=0
"${in_ns[@]}" timeout -k 5 "$timeout_s" "$launcher" run mpirun "${common[@]}" "${mpirun_opts[@]}" \
  "${program[@]}" >"$log" 2>&1 || rc=$?
cat "$log"
if ((rc != 0)); then
  ((rc == 124)) && echo "run_mpi: $name: time limit of $timeout_s s reached" >&2
  echo "run_mpi: $name: mpirun exited with status $rc" >&2
  exit 1
fi
ok=$(grep -Ec "rank [0-9]+ of $np: OK$" "$log" || true)
if ((ok != np)); then
  echo "run_mpi: $name: $ok of $np ranks reported OK" >&2
  exit 1
fi
echo "run_mpi: $name: all $np ranks OK"
