// The host registry: which engine of this host owns which QP-number slot
// (design §3, "one RoCE address per host"; the relay is host_relay.h).
//
// Each engine (device context) claims a slot 1..254 for its lifetime; its QP
// numbers are slot << 16 | 16 random bits, so a packet's owner is qpn >> 16
// and no per-QP state is shared between processes. The registry is one small
// file, shared by the engines of one user in one network namespace (network
// namespaces are separate hosts, and they share /dev/shm):
// /dev/shm/uroce-host-<uid>-<inode of /proc/self/ns/net>, mode 0600 (the same
// rule as SO_REUSEPORT's: only one user's sockets share a port).
// UROCE_HOST_REGISTRY=PATH names another file (tests use a temporary one).
//
// Lock contract. A slot's owner holds an exclusive open-file-description
// record lock (F_OFD_SETLK) on byte `slot` of the file for its lifetime; the
// kernel drops it when the last descriptor of that open dies, so the slot of
// a killed process is free again without pid checks, and two engines of one
// process (two opens) get two slots. Byte 0 is the initialization lock, held
// only while an opener sizes the file and writes its header. The mapped
// records are written only by the lock holder of their slot: on claim pid,
// then port (release); on release port 0 (release), then pid 0, then the
// lock goes. Readers load the port with acquire and ask the kernel whether
// the lock is held (F_OFD_GETLK), caching the answer per slot for
// kRecheckMs, so port_of() makes no system call in the common case. A reader
// may therefore see, for at most kRecheckMs (or until invalidate()), a dead
// owner's port, and for an instant after a claim the previous owner's port:
// the relay hop is lossy like the network, and the receiver drops a packet
// for a QP it does not own.
//
// Hostile input: the file is validated once at open (regular file owned by
// us, exact size, magic and version, else EPROTO/EACCES). A process that
// later scribbles over the records misdirects relayed packets at worst:
// port_of() bounds the slot and returns whatever port word it finds. Only
// shrinking the mapped file (ftruncate) could fault a mapper, as with any
// shared mapping; a process that can do that (same user) can also ptrace us.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/result.h"

namespace uroce::host {

// 255 would allow QPN 0xFFFFFF (multicast); 0 is the QPs of engines without a slot.
inline constexpr unsigned kFirstHostSlot = 1, kLastHostSlot = 254;
inline constexpr unsigned qpn_slot(uint32_t qpn) { return qpn >> 16; }

class HostRegistry {
 public:
  // How long a slot's cached liveness is trusted.
  static constexpr uint64_t kRecheckMs = 100;

  // Opens (creating if needed) this host's registry (path()) and claims the
  // first free slot for an engine whose private UDP port is `private_port`.
  // ENOSPC when every slot is taken; EPROTO when the file is not a registry
  // of this build (wrong size, magic or version: a foreign or corrupt file);
  // EACCES when it is not a regular file of this user; ETIMEDOUT when its
  // initialization lock stays taken for a second; the errno of
  // open/fcntl/mmap otherwise.
  [[nodiscard]] static core::Result<std::unique_ptr<HostRegistry>> open(uint16_t private_port);
  // The same on the file at `path`.
  [[nodiscard]] static core::Result<std::unique_ptr<HostRegistry>> open_at(const std::string& path,
                                                                           uint16_t private_port);
  // The registry file of this process's user and network namespace, or the
  // UROCE_HOST_REGISTRY override; the errno of stat(/proc/self/ns/net).
  [[nodiscard]] static core::Result<std::string> default_path();

  ~HostRegistry();  // releases the slot (port cleared first); in a forked child, only unmaps
  HostRegistry(const HostRegistry&) = delete;
  HostRegistry& operator=(const HostRegistry&) = delete;

  unsigned slot() const { return slot_; }
  const std::string& path() const { return path_; }

  // The private port of the live engine owning `slot`, 0 when none does
  // (free slot, dead owner, slot out of range). Data path: thread-safe, no
  // allocation, no system call unless the slot's cached liveness is older
  // than kRecheckMs, was invalidated, or the slot's port changed.
  uint16_t port_of(unsigned slot) noexcept;
  // Forget the cached liveness of `slot` (e.g. after a relay to it failed).
  void invalidate(unsigned slot) noexcept;
  // The pid recorded for `slot` (diagnostics only: not a liveness test).
  uint32_t pid_of(unsigned slot) const noexcept;

  struct Record;  // one slot's shared words (host_registry.cc)

 private:
  HostRegistry(int fd, void* map, unsigned slot, uint16_t port, std::string path);
  bool lock_held(unsigned slot) const noexcept;

  int fd_;
  void* map_;
  Record* records_;
  unsigned slot_;
  uint16_t port_;
  uint32_t opener_pid_;  // the process that claimed the slot (a forked child does not release it)
  std::string path_;
  // Per slot: 0 (unknown) or the time of the last check (ms + 1) << 17 | port << 1 | alive.
  std::array<std::atomic<uint64_t>, kLastHostSlot + 1> liveness_{};
};

}  // namespace uroce::host
