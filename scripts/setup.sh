#!/usr/bin/env bash
# Sets up a Debian 12 machine for uroce and builds it into build/. Idempotent.
#   1. installs the Debian packages that are missing (as root, or through sudo);
#   2. configures and builds: cmake -S . -B build; cmake --build build.
# Environment: JOBS (parallel build jobs, default 2), BUILD_TYPE (default RelWithDebInfo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(
  build-essential cmake g++                     # toolchain
  libgtest-dev libgmock-dev libbenchmark-dev    # unit tests, micro-benchmarks
  zlib1g-dev                                    # CRC-32 for the ICRC
  libibverbs-dev librdmacm-dev                  # the ABI contract: rdma-core's headers
  ibverbs-utils rdmacm-utils perftest qperf     # unmodified programs for the tests/demo
  ucx-utils libfabric-bin                       # middleware: ucx_info/ucx_perftest, fi_pingpong
  openmpi-bin libopenmpi-dev                    # middleware: mpirun, mpicc (tests/middleware)
  tshark                                        # decodes captures as RoCEv2
  python3 iproute2                              # test tools, network namespaces
  nftables                                      # a congested queue that marks ECN (tests/fault)
  python3-pyverbs                               # rdma-core's own test suite (tests/pyverbs)
  python3-matplotlib                            # the benchmarks' plots (bench/*.py)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' \
    || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if ((EUID == 0)); then
    as_root=()
  elif command -v sudo >/dev/null; then
    as_root=(sudo)
  else
    echo "setup: these packages are missing and installing them needs root: ${missing[*]}" >&2
    exit 1
  fi
  # tshark's package asks whether non-root users may capture; answer "no" up front.
  echo "wireshark-common wireshark-common/install-setuid boolean false" \
    | "${as_root[@]}" debconf-set-selections
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}"
cmake --build build -j"${JOBS:-2}"
