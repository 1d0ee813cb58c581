// A device context (ibv_open_device): the ABI's verbs_context, the port and
// GID table, and the object tables of this context.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/container_of.h"
#include "core/device.h"
#include "core/mr.h"

namespace uroce::core {

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
  // IPv4 address behind a GID index; false if the index is out of range.
  bool gid_ip(unsigned index, uint32_t* ip) const;

  void query_device(ibv_device_attr* attr) const;
  int query_port(uint8_t port, ibv_port_attr* attr) const;
  int query_gid(uint8_t port, int index, ibv_gid* gid) const;
  int query_pkey(uint8_t port, int index, uint16_t* pkey) const;

  int async_fd_write_end() const { return async_write_fd_; }
  // Queues an event for ibv_get_async_event. Never blocks: if the application
  // leaves events unread until the pipe is full, further ones are dropped.
  void raise_async_event(const ibv_async_event& event) const;

 private:
  std::vector<HostAddress> addrs_;
  uint16_t lid_ = 0;
  ibv_mtu active_mtu_ = IBV_MTU_1024;
  int async_write_fd_ = -1;
};

ibv_mtu mtu_enum_for_bytes(unsigned bytes);
unsigned mtu_bytes(ibv_mtu mtu);

}  // namespace uroce::core
