// A device context (ibv_open_device): the ABI's verbs_context, the port and
// GID table, and the object tables of this context.
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/container_of.h"
#include "core/device.h"
#include "core/limits.h"
#include "core/mr.h"

namespace uroce::core {

// Objects a context counts against the limits it reports (ibv_query_device:
// max_qp, max_cq, max_pd, max_ah, max_srq; MRs and windows are counted by
// MrTable).
enum class Resource : uint8_t { kQp, kCq, kPd, kAh, kSrq, kCount };

uint32_t resource_limit(Resource r);

class Context {
 public:
  explicit Context(Device* device);
  ~Context();  // not virtual: standard-layout for offsetof; delete the most-derived type
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  verbs_context vctx{};  // ABI object; vctx.context is what the application holds
  Device* const device;
  MrTable mrs;

  ibv_context* ib() { return &vctx.context; }
  static Context* from(ibv_context* c) { return UROCE_CONTAINER_OF(verbs_get_ctx(c), Context, vctx); }

  // Port 1 (the only port).
  uint16_t lid() const { return lid_; }
  void set_lid(uint16_t udp_port) { lid_ = udp_port; }
  ibv_mtu active_mtu() const { return active_mtu_; }
  static constexpr ibv_mtu kMaxMtu = IBV_MTU_4096;

  const std::vector<HostAddress>& addresses() const { return addrs_; }
  size_t gid_count() const { return addrs_.size(); }
  // IPv4 address behind a GID index; false if the index is out of range or
  // the GID is an IPv6 address.
  bool gid_ip(unsigned index, uint32_t* ip) const;
  // The address behind a GID index, or null if out of range.
  const HostAddress* gid_address(unsigned index) const { return index < addrs_.size() ? &addrs_[index] : nullptr; }
  // Whether `ip` is this host's: a loopback address or one behind a GID.
  bool is_host_address(uint32_t ip) const;
  // The same for an address as a GID (IPv4-mapped or IPv6; ::1 is loopback).
  bool is_host_address(const ibv_gid& gid) const;

  void query_device(ibv_device_attr* attr) const;
  int query_port(uint8_t port, ibv_port_attr* attr) const;
  // EINVAL past the table (gid_table_len()), ENODATA for an empty slot (index >= gid_count()).
  int query_gid(uint8_t port, int index, ibv_gid* gid) const;
  size_t gid_table_len() const { return std::max<size_t>(addrs_.size(), kGidTableLen); }
  int query_pkey(uint8_t port, int index, uint16_t* pkey) const;

  // Takes one object of kind `r`: 0, or ENOMEM when the context holds its
  // limit already (as a device whose resources are exhausted). Exact under
  // concurrency. Every successful reserve is matched by one release when the
  // object is destroyed (or its creation fails later).
  [[nodiscard]] int reserve(Resource r);
  void release(Resource r);
  uint32_t in_use(Resource r) const { return used_[size_t(r)].load(std::memory_order_relaxed); }

  // Device memory (ibv_alloc_dm) in use, at most kMaxDmSize: false when
  // `bytes` more do not fit.
  bool take_dm_bytes(uint64_t bytes);
  void give_dm_bytes(uint64_t bytes) { dm_bytes_.fetch_sub(bytes); }

  // This context's CQs armed with a completion channel (Cq::count_arms_in): a
  // thread waits for their events, which only the progress thread raises.
  std::atomic<int> armed_cqs{0};

  int async_fd_write_end() const { return async_write_fd_; }
  // Queues an event for ibv_get_async_event. Never blocks: if the application
  // leaves events unread until the pipe is full, further ones are dropped.
  void raise_async_event(const ibv_async_event& event) const;

 private:
  std::atomic<uint64_t> dm_bytes_{0};
  std::vector<HostAddress> addrs_;
  uint16_t lid_ = 0;
  ibv_mtu active_mtu_ = IBV_MTU_1024;
  int async_write_fd_ = -1;
  std::array<std::atomic<uint32_t>, size_t(Resource::kCount)> used_{};
};

// One reserved object for a creation in progress: released when this goes
// out of scope unless keep() was called (the object was created).
class Reservation {
 public:
  Reservation(Context* ctx, Resource r) : ctx_(ctx), r_(r), err_(ctx->reserve(r)) {}
  ~Reservation() {
    if (err_ == 0 && !kept_) ctx_->release(r_);
  }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;

  int error() const { return err_; }  // 0, or ENOMEM at the limit
  void keep() { kept_ = true; }

 private:
  Context* ctx_;
  Resource r_;
  int err_;
  bool kept_ = false;
};

ibv_mtu mtu_enum_for_bytes(unsigned bytes);
unsigned mtu_bytes(ibv_mtu mtu);

}  // namespace uroce::core
