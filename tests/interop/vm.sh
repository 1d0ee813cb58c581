#!/usr/bin/env bash
# The interop tests' guest: Debian 12's kernel with Soft-RoCE (rdma_rxe) in a QEMU guest,
# reachable from the host only inside network namespace uroce-interop.
#
#   vm.sh start --uroce LAUNCHER --logdir DIR [--guest-tool FILE]...
#                                               prepare (once), boot, write the state file;
#                                               each FILE is copied to $CACHE/tools first
#   vm.sh stop                                  power the guest off, delete the namespace
#   vm.sh prepare                               only the cached, idempotent preparation
#
# prepare: installs the Debian packages the tests need when missing (qemu-system-x86,
# busybox-static, tcpdump, ibverbs-utils, perftest, rdmacm-utils, ...); downloads Debian's
# kernel package (`apt-get download` of the package linux-image-amd64 depends on; extracted
# with dpkg -x, never installed) and builds a busybox initramfs. Cached in $CACHE
# (default /var/tmp/uroce-interop).
#
# start: namespace uroce-interop with tap uitap0 (198.51.100.1/24 and 2001:db8:100::1/64,
# documentation ranges, only inside the namespace), then the guest on it (198.51.100.2,
# 2001:db8:100::2): the host's root read-only
# over 9p under a tmpfs overlay, so the guest runs the host's own programs; guest-init.sh
# loads rdma_rxe, creates rxe0 on eth0 and serves agent.py on 198.51.100.2:7070. KVM where
# the CPU has hardware virtualisation, TCG otherwise; qemu runs under `nice`. Then
# `interop.py probe` writes $CACHE/state.json (GID indexes of both sides), which the tests
# read. The guest's console and qemu's messages go to LOGDIR/vm/.
#
# Exit status: 0 up / stopped, 77 when this machine cannot run the guest (not root, no
# network namespaces, qemu not installable or not able to run), 1 when the guest failed.
# Environment: CACHE, VCPUS (2), MEM_MB (2048), ACCEL (auto|kvm|tcg), NICE (10),
# BOOT_TIMEOUT (300 s), MTU (1500: the link's, on the tap and the guest's eth0).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${CACHE:-/var/tmp/uroce-interop}
NS=uroce-interop TAP=uitap0 HOST_CIDR=198.51.100.1/24 GUEST_CIDR=198.51.100.2/24
HOST6_CIDR=2001:db8:100::1/64 GUEST6_CIDR=2001:db8:100::2/64
pidfile=$CACHE/qemu.pid state=$CACHE/state.json

skip() { echo "vm.sh: SKIPPED: $*"; exit 77; }
die() { echo "vm.sh: FAILED: $*" >&2; exit 1; }

prepare() {
  mkdir -p "$CACHE"
  local log=$CACHE/prepare.log need=() p
  for p in qemu-system-x86 busybox-static kmod iproute2 tcpdump ibverbs-utils ibverbs-providers \
    perftest rdmacm-utils python3; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
  done
  if ((${#need[@]})); then
    echo "vm.sh: apt-get install ${need[*]}"
    # A fresh machine's package lists may be missing or stale: update them once, then retry.
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y --no-install-recommends \
      "${need[@]}" >>"$log" 2>&1 ||
      { DEBIAN_FRONTEND=noninteractive timeout 600 apt-get update -q >>"$log" 2>&1 &&
        DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y --no-install-recommends \
          "${need[@]}" >>"$log" 2>&1; } ||
      { tail -5 "$log"; skip "apt-get install ${need[*]} failed (see $log)"; }
  fi
  command -v qemu-system-x86_64 >/dev/null || skip "no qemu-system-x86_64"

  # Debian's kernel, the one linux-image-amd64 depends on (its name is cached: apt's view
  # may move on, the extracted tree stays).
  kpkg=$(cat "$CACHE/kernel.pkg" 2>/dev/null ||
    apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
  [[ -n $kpkg ]] || skip "apt-cache knows no kernel package behind linux-image-amd64"
  kver=${kpkg#linux-image-}
  local kdir=$CACHE/kernel moddir=$CACHE/kernel/lib/modules/$kver
  if [[ ! -f $kdir/boot/vmlinuz-$kver || ! -f $moddir/modules.dep ]]; then
    echo "vm.sh: downloading and extracting $kpkg"
    rm -rf "$kdir" "$CACHE/kernel.tmp" "$CACHE"/linux-image-*.deb
    (cd "$CACHE" && timeout 600 apt-get download "$kpkg" >>"$log" 2>&1) ||
      (timeout 600 apt-get update -q >>"$log" 2>&1 && cd "$CACHE" && timeout 600 apt-get download "$kpkg" >>"$log" 2>&1) ||
      skip "apt-get download $kpkg failed (see $log)"
    dpkg -x "$CACHE/$kpkg"_*.deb "$CACHE/kernel.tmp"
    depmod -b "$CACHE/kernel.tmp" "$kver"
    mv "$CACHE/kernel.tmp" "$kdir"
    rm -f "$CACHE/$kpkg"_*.deb
  fi
  echo "$kpkg" >"$CACHE/kernel.pkg"
  for p in rdma_rxe ib_uverbs rdma_ucm; do
    grep -q "/$p.ko:" "$moddir/modules.dep" || die "$p.ko is not in $kpkg"
  done

  # The initramfs: busybox, init, and the modules init needs before it can mount the host's
  # root (virtio-pci, 9p over virtio, overlay) with their dependencies first.
  local stamp
  stamp="$kver $(sha256sum "$here/initramfs-init" | cut -c1-16)"
  [[ -f $CACHE/initramfs.cpio.gz && "$(cat "$CACHE/initramfs.stamp" 2>/dev/null)" == "$stamp" ]] && return
  echo "vm.sh: building the initramfs"
  local work order=() m
  work=$(mktemp -d "$CACHE/initramfs.XXXXXX")
  mkdir -p "$work/bin" "$work/mods"
  cp /bin/busybox "$work/bin/busybox"
  install -m 0755 "$here/initramfs-init" "$work/init"
  add_module() {
    local line dep x
    line=$(grep -m1 "/$1.ko:" "$moddir/modules.dep") || die "module $1 not in $kpkg"
    for dep in ${line#*:}; do dep=${dep##*/}; add_module "${dep%.ko}"; done
    for x in ${order[@]+"${order[@]}"}; do [[ $x == "$1" ]] && return 0; done
    cp "$moddir/${line%%:*}" "$work/mods/$1.ko"
    order+=("$1")
  }
  for m in virtio_pci 9pnet_virtio 9p overlay; do add_module "$m"; done
  printf '%s\n' "${order[@]}" >"$work/modules.order"
  (cd "$work" && find . -mindepth 1 | busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$CACHE/initramfs.tmp"
  mv "$CACHE/initramfs.tmp" "$CACHE/initramfs.cpio.gz"
  rm -rf "$work"
  echo "$stamp" >"$CACHE/initramfs.stamp"
}

stop() {  # the guest (the agent powers it off; qemu killed by its pid if it lingers), the namespace
  rm -f "$state"
  if [[ -f $pidfile ]]; then
    local pid
    pid=$(cat "$pidfile")
    if [[ -n $pid ]] && grep -qs qemu-system "/proc/$pid/cmdline"; then
      ip netns exec "$NS" timeout 20 python3 "$here/interop.py" shutdown >/dev/null 2>&1 || true
      for _ in $(seq 60); do [[ -d /proc/$pid ]] || break; sleep 0.5; done
      if [[ -d /proc/$pid ]]; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 20); do [[ -d /proc/$pid ]] || break; sleep 0.5; done
        kill -9 "$pid" 2>/dev/null || true
      fi
    fi
    rm -f "$pidfile"
  fi
  if ip netns list 2>/dev/null | grep -qw "$NS"; then ip netns del "$NS"; fi
}

start() {
  local uroce='' logdir='' tools=()
  while (($#)); do
    case $1 in
      --uroce) uroce=$2; shift 2 ;;
      --logdir) logdir=$2; shift 2 ;;
      --guest-tool) tools+=("$2"); shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  [[ -x $uroce && -n $logdir ]] || die "usage: vm.sh start --uroce LAUNCHER --logdir DIR [--guest-tool FILE]..."
  ((EUID == 0)) || skip "needs root (network namespace, tap device, apt-get)"
  local t0=$SECONDS
  prepare
  stop  # what an interrupted run left behind
  # Programs of the build the guest runs too (@TOOLS@ in interop.py): copied before the
  # boot to where the guest sees the host's files (its /tmp and /run are its own).
  rm -rf "$CACHE/tools" && mkdir -p "$CACHE/tools"
  ((${#tools[@]} == 0)) || cp "${tools[@]}" "$CACHE/tools/"

  local accel=${ACCEL:-auto} accel_args
  if [[ $accel == auto ]]; then
    # KVM only with hardware virtualisation (a /dev/kvm of kvm_pvm runs PVM guest kernels only).
    if [[ -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo && [[ ! -d /sys/module/kvm_pvm ]]; then
      accel=kvm
    else
      accel=tcg
    fi
  fi
  case $accel in
    kvm) accel_args=(-enable-kvm -cpu host) ;;
    tcg) accel_args=(-accel "tcg,thread=multi" -cpu max) ;;
    *) die "ACCEL must be auto, kvm or tcg" ;;
  esac

  ip netns add "$NS" 2>/dev/null || skip "cannot create a network namespace"
  ip -n "$NS" link set lo up
  ip -n "$NS" tuntap add dev "$TAP" mode tap || { stop; skip "cannot create a tap device"; }
  ip -n "$NS" addr add "$HOST_CIDR" dev "$TAP"
  # IPv6 beside it (documentation prefixes, no duplicate address detection), for the tests
  # over IPv6 GIDs; where the kernel has no IPv6 the probe finds no IPv6 GID and they skip.
  ip netns exec "$NS" sysctl -qw "net.ipv6.conf.$TAP.disable_ipv6=0" 2>/dev/null &&
    ip -n "$NS" -6 addr add "$HOST6_CIDR" dev "$TAP" nodad 2>/dev/null ||
    echo "vm.sh: no IPv6 on $TAP: the tests over IPv6 will skip"
  ip -n "$NS" link set "$TAP" mtu "${MTU:-1500}" up
  # No checksum offload on the tap (vnet_hdr off here and in qemu): checksums are complete
  # before the capture sees a packet, so the capture test can check them.

  local vmlog=$logdir/vm
  mkdir -p "$vmlog"
  : >"$vmlog/console.log"
  echo "vm.sh: booting kernel $kver ($accel, ${VCPUS:-2} vCPUs, ${MEM_MB:-2048} MiB); console: $vmlog/console.log"
  ip netns exec "$NS" nice -n "${NICE:-10}" qemu-system-x86_64 "${accel_args[@]}" \
    -smp "${VCPUS:-2}" -m "${MEM_MB:-2048}" -nodefaults -display none -no-reboot \
    -kernel "$CACHE/kernel/boot/vmlinuz-$kver" -initrd "$CACHE/initramfs.cpio.gz" \
    -append "console=ttyS0 panic=-1 loglevel=4 uroce.modules=$CACHE/kernel/lib/modules uroce.init=$here/guest-init.sh uroce.ip=$GUEST_CIDR uroce.ip6=$GUEST6_CIDR uroce.mtu=${MTU:-1500}" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no,vnet_hdr=off" \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:51:00:02 \
    -serial "file:$vmlog/console.log" -monitor none >"$vmlog/qemu.log" 2>&1 &
  local qpid=$!
  echo "$qpid" >"$pidfile"
  if ! ip netns exec "$NS" python3 "$here/interop.py" probe --uroce "$uroce" --logdir "$logdir" \
    --state "$state.tmp" --pid "$qpid" --timeout "${BOOT_TIMEOUT:-300}"; then
    local ran_kernel=0
    [[ -s $vmlog/console.log ]] && ran_kernel=1
    echo "--- qemu:"; cat "$vmlog/qemu.log"; echo "--- console (last 30 lines):"; tail -30 "$vmlog/console.log"
    stop
    ((ran_kernel)) || skip "qemu cannot run here (it exited before the guest's kernel printed anything)"
    die "the guest did not come up"
  fi
  mv "$state.tmp" "$state"
  echo "vm.sh: guest up, $((SECONDS - t0)) s from start (prepare and boot)"
}

case ${1:-} in
  prepare) ((EUID == 0)) || skip "needs root"; prepare; echo "vm.sh: prepared ($kpkg)" ;;
  start) shift; start "$@" ;;
  stop) ((EUID == 0)) || skip "needs root"; stop; echo "vm.sh: stopped" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
