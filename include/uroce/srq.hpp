// uroce C++ API: shared receive queues.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <span>

#include "uroce/device.hpp"
#include "uroce/handle.hpp"
#include "uroce/result.hpp"
#include "uroce/work_request.hpp"

namespace uroce {

struct SrqOptions {
  std::uint32_t max_wr = 64;
  std::uint32_t max_sge = 4;
  std::uint32_t srq_limit = 0;
};

class SharedReceiveQueue {
 public:
  static Result<SharedReceiveQueue> create(const ProtectionDomain& pd, const SrqOptions& options = {}) {
    ibv_srq_init_attr init{};
    init.attr.max_wr = options.max_wr;
    init.attr.max_sge = options.max_sge;
    init.attr.srq_limit = options.srq_limit;
    errno = 0;
    ibv_srq* raw = ::ibv_create_srq(pd.raw(), &init);
    if (raw == nullptr) return Error::from_errno(last_errno(), "ibv_create_srq");
    return SharedReceiveQueue(raw);
  }

  ibv_srq* raw() const noexcept { return handle_.get(); }

  Status post_recv(const RecvRequest& request) const { return post_recv(std::span<const RecvRequest>(&request, 1)); }
  Status post_recv(std::span<const RecvRequest> requests) const {
    return detail::post_chain<ibv_recv_wr>(requests, "ibv_post_srq_recv", [this](ibv_recv_wr* wr, ibv_recv_wr** bad) {
      return ::ibv_post_srq_recv(raw(), wr, bad);
    });
  }
  // Arms the limit event (IBV_EVENT_SRQ_LIMIT_REACHED) at `limit` outstanding receives.
  Status arm_limit(std::uint32_t limit) const {
    ibv_srq_attr attr{};
    attr.srq_limit = limit;
    return status_from_rc(::ibv_modify_srq(raw(), &attr, IBV_SRQ_LIMIT), "ibv_modify_srq");
  }

 private:
  struct Release {
    void operator()(ibv_srq* srq) const noexcept { ::ibv_destroy_srq(srq); }
  };
  explicit SharedReceiveQueue(ibv_srq* raw) noexcept : handle_(raw) {}

  detail::Handle<ibv_srq, Release> handle_;
};

}  // namespace uroce
