// Same-host direct placement: an RDMA WRITE
// or READ between two RC/UC QPs of one host is carried out by the
// requester's thread with one process_vm_writev/readv between the two
// processes' registered memory — no packets, no target thread, one copy.
//
// Each engine publishes a placement window: a file next to the host registry
// (<registry>.place.<pid>.<slot>, mode 0600) holding its valid MRs (key, PD,
// iova, address, length, access) and its QPs that accept requests (RTR/RTS:
// QPN, connected QPN, PD, access flags). A requester looks the target up in
// that window and applies the responder's checks (C9-88 ff.: QP state and
// access flags, R_Key, PD, bounds, MR access) before it copies; anything it
// cannot place for sure (a window, an unknown key, a failed check, a partial
// copy, a target it may not ptrace) goes as packets instead, so every error is
// still reported by the target's responder with the IBA status.
//
// Ordering: a WQE is placed only when every earlier WQE of its QP has
// completed (acknowledged, so executed by the responder) and nothing is in
// flight; a placed WQE occupies no PSN. So placement never overtakes a
// message the responder has not executed, and later messages follow it.
// A large WRITE/READ (kWaitToPlace or more) behind WQEs in flight waits for
// their ACKs rather than going as packets (requester.cc, try_place): one
// same-host round trip is cheaper than a megabyte in packets, and a stream
// that mixes SENDs with READs (UCX's rendezvous) keeps being placed.
//
// Revocation (the MR lifetime rule across processes). Every engine that
// places into a window counts itself busy in the window's word for its slot
// (seq_cst) before it reads an entry, and idle after the copy; the window's
// owner clears an entry (seq_cst) and then waits until every live slot's
// word is zero before it deregisters, destroys or changes the state of a QP.
// One of the two sees the other. A placing process that dies leaves its
// word set: the owner skips slots whose owner is gone (host registry), and a
// slot's next owner resets its word when it first maps the window. The wait
// is bounded (kRevokeWait): a process of the same user that stops inside a
// copy could also ptrace us.
//
// Needs: the peer process may be ptraced by us (same user and dumpable, or
// CAP_SYS_PTRACE; Yama's ptrace_scope 0, or root). Where the kernel refuses
// (EPERM), that peer is reached by packets. UROCE_SHM=0 and fault injection
// turn placement off.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/mr.h"
#include "core/qp.h"
#include "host/copy_helper.h"
#include "host/host_registry.h"
#include "transport/datagram.h"
#include "transport/local_addresses.h"

namespace uroce::host {

class DirectPlacement final : public core::MrObserver {
 public:
  static constexpr auto kRevokeWait = std::chrono::milliseconds(100);
  static constexpr uint64_t kWaitToPlace = 64 * 1024;

  // Creates this engine's window next to `registry`'s file; nullptr + errno
  // when it cannot (the engine then sends packets to every peer).
  static std::unique_ptr<DirectPlacement> open(HostRegistry& registry);
  ~DirectPlacement();  // unlinks the window
  DirectPlacement(const DirectPlacement&) = delete;
  DirectPlacement& operator=(const DirectPlacement&) = delete;

  // Target side. MrObserver: called under the MR table's exclusive lock.
  void mr_added(const core::Mr& mr) noexcept override;
  void mr_removing(const core::Mr& mr) noexcept override;
  // Publishes the QP as its state, type and attributes say, withdrawing what
  // was published before if it differs (caller holds qp.mu). A relay proxy
  // (the engine's stand-in for other processes' XRC targets) is never published.
  void sync_qp(const core::Qp& qp, bool relay_proxy) noexcept;
  void withdraw_qp(uint32_t qpn) noexcept;

  // Requester side: one RDMA WRITE (or READ) of `len` bytes between the local
  // ranges and [va, va+len) under `rkey` at the QP `dest_qpn` of this host
  // (dst_ip one of its addresses), for the requester QP `src_qpn` of type
  // `type`. The caller holds its MR table's shared lock and has checked the
  // local keys. True when placed in full; false: send packets.
  struct Op {
    ibv_qp_type type;
    uint32_t src_qpn;
    uint32_t dest_qpn;
    transport::IpAddress dst_ip;
    uint32_t rkey;
    uint64_t va;
    uint64_t len;
    const iovec* local;
    unsigned nlocal;
    bool read;
  };
  bool place(const Op& op) noexcept;
  // Whether place() may succeed for QP `dest_qpn` at `dst_ip`: a local
  // address and a live peer whose window is mapped and who has not refused us.
  bool reachable(const transport::IpAddress& dst_ip, uint32_t dest_qpn) noexcept;

  uint64_t placed_writes() const { return writes_.load(std::memory_order_relaxed); }
  uint64_t placed_reads() const { return reads_.load(std::memory_order_relaxed); }
  uint64_t placed_bytes() const { return bytes_.load(std::memory_order_relaxed); }
  uint64_t declined() const { return declined_.load(std::memory_order_relaxed); }
  const CopyHelper& copier() const { return copier_; }

  struct Window;  // the shared layout (direct_placement.cc)

 private:
  struct Peer;
  DirectPlacement(HostRegistry& registry, std::string path, Window* own);
  std::shared_ptr<Peer> peer_for(unsigned slot) noexcept;
  std::shared_ptr<Peer> attach(unsigned slot, uint32_t pid) noexcept;
  void wait_for_placers() noexcept;
  static std::string window_path(const HostRegistry& registry, uint32_t pid, unsigned slot);

  HostRegistry& registry_;
  std::string path_;
  Window* own_;
  transport::LocalAddresses local_;
  std::mutex peers_mu_;  // guards peers_ (attach and lookup; the copy runs outside)
  std::vector<std::shared_ptr<Peer>> peers_;
  std::atomic<uint64_t> writes_{0}, reads_{0}, bytes_{0}, declined_{0};
  CopyHelper copier_;  // large copies on two CPUs
};

}  // namespace uroce::host
