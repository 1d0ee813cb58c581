// uroce C++ API: address handles (the destination of a UD send).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "uroce/device.hpp"
#include "uroce/endpoint.hpp"
#include "uroce/handle.hpp"
#include "uroce/result.hpp"
#include "uroce/work_request.hpp"

namespace uroce {

// Where a path starts: the local port and GID index, and its GRH/service level settings.
struct PathOptions {
  std::uint8_t port = 1;
  std::uint8_t sgid_index = 0;
  std::uint8_t service_level = 0;
  std::uint8_t hop_limit = 64;
  std::uint8_t traffic_class = 0;
};

// The ibv_ah_attr reaching `remote` (a GRH whenever the remote GID is set: RoCE needs it).
inline ibv_ah_attr make_ah_attr(const QpEndpoint& remote, const PathOptions& path = {}) noexcept {
  ibv_ah_attr attr{};
  attr.dlid = remote.lid;
  attr.sl = path.service_level;
  attr.port_num = path.port;
  if (!remote.gid.is_zero()) {
    attr.is_global = 1;
    attr.grh.dgid = remote.gid.to_ibv();
    attr.grh.sgid_index = path.sgid_index;
    attr.grh.hop_limit = path.hop_limit;
    attr.grh.traffic_class = path.traffic_class;
  }
  return attr;
}

class AddressHandle {
 public:
  static Result<AddressHandle> create(const ProtectionDomain& pd, ibv_ah_attr attr) {
    errno = 0;
    ibv_ah* raw = ::ibv_create_ah(pd.raw(), &attr);
    if (raw == nullptr) return Error::from_errno(last_errno(), "ibv_create_ah");
    return AddressHandle(raw);
  }
  static Result<AddressHandle> create(const ProtectionDomain& pd, const QpEndpoint& remote,
                                      const PathOptions& path = {}) {
    return create(pd, make_ah_attr(remote, path));
  }

  ibv_ah* raw() const noexcept { return handle_.get(); }

 private:
  struct Release {
    void operator()(ibv_ah* ah) const noexcept { ::ibv_destroy_ah(ah); }
  };
  explicit AddressHandle(ibv_ah* raw) noexcept : handle_(raw) {}

  detail::Handle<ibv_ah, Release> handle_;
};

inline SendRequest& SendRequest::to(const AddressHandle& ah, std::uint32_t remote_qpn,
                                    std::uint32_t remote_qkey) noexcept {
  ah_ = ah.raw();
  remote_qpn_ = remote_qpn;
  remote_qkey_ = remote_qkey;
  return *this;
}

}  // namespace uroce
