#!/bin/bash
# PID 1 of the interop guest, after the initramfs switch_roots into the host's root
# (read-only, under a tmpfs overlay). Brings eth0 up with uroce.ip=, uroce.ip6= and uroce.mtu= (kernel
# command line), loads Soft-RoCE, creates rxe0 on eth0 and serves agent.py until the host asks it to shut
# down; then powers off. Everything it prints goes to the serial console (LOGDIR/vm/console.log).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
here=$(dirname "$(readlink -f "$0")")
exec >/dev/console 2>&1
# The agent, read now: the checkout may live under /tmp or /run, which the tmpfs mounts
# below cover in the guest.
agent=$(<"$here/agent.py")
say() { echo "interop-guest: $*"; }
poweroff_now() { sync; echo o >/proc/sysrq-trigger; sleep 30; }

ip_cidr=198.51.100.2/24 ip6_cidr='' mtu=1500
for arg in $(cat /proc/cmdline); do
  case $arg in
    uroce.ip=*) ip_cidr=${arg#uroce.ip=} ;;
    uroce.ip6=*) ip6_cidr=${arg#uroce.ip6=} ;;
    uroce.mtu=*) mtu=${arg#uroce.mtu=} ;;
  esac
done

mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
hostname interop-guest
ulimit -l unlimited

say "kernel $(uname -r), $(nproc) CPUs"
modprobe virtio_net || { say "FAILED: modprobe virtio_net"; poweroff_now; }
for _ in $(seq 50); do [[ -e /sys/class/net/eth0 ]] && break; sleep 0.1; done
# rxe's GID table then holds its link-local GID (index 0) and one RoCEv2 GID for each
# address: the IPv4 one, and the IPv6 one (uroce.ip6=, no duplicate address detection).
ip link set lo up
ip link set eth0 mtu "$mtu" up
ip addr add "$ip_cidr" dev eth0
[[ -n $ip6_cidr ]] && { ip -6 addr add "$ip6_cidr" dev eth0 nodad || say "no IPv6 address"; }
for m in rdma_rxe ib_uverbs rdma_ucm; do modprobe "$m" || { say "FAILED: modprobe $m"; poweroff_now; }; done
rdma link add rxe0 type rxe netdev eth0 || { say "FAILED: rdma link add"; poweroff_now; }
for _ in $(seq 50); do ibv_devices 2>/dev/null | grep -q rxe0 && break; sleep 0.1; done
say "rxe0 ready; starting the agent"
printf '%s\n' "$agent" >/run/uroce-interop-agent.py
python3 /run/uroce-interop-agent.py "${ip_cidr%/*}" 7070
say "agent exited; powering off"
poweroff_now
