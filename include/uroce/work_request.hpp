// uroce C++ API: typed work requests.
//
// A SendRequest is built by one named constructor per operation from LocalSlices (the
// scatter/gather list: one slice, or several in braces) and, for RDMA operations, a
// RemoteBuffer; options are chained:
//
//   auto wr = SendRequest::write({a, b, c}, peer_buffer).with_imm(7).id(WrId{1});
//   UROCE_TRY(qp.post_send(wr));
//
// Requests are plain values (no pointers into themselves); the ibv_send_wr is built when
// posted. A request that cannot be valid (too many slices, an atomic whose slice is not
// 8 bytes, a WRITE longer than its RemoteBuffer) is refused with EINVAL when posted.
#pragma once

#include <endian.h>
#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <ranges>
#include <span>
#include <string>

#include "uroce/memory.hpp"
#include "uroce/wr_id.hpp"

namespace uroce {

class AddressHandle;

// At most this many slices per work request (real NICs offer 16-30 send SGEs; create the
// QP with QpCaps::max_send_sge / max_recv_sge large enough).
inline constexpr std::size_t kMaxSge = 16;

namespace detail {
// A fixed-capacity scatter/gather list of LocalSlices.
class SgList {
 public:
  SgList() = default;
  SgList(LocalSlice slice) { push(slice); }  // NOLINT: implicit, one slice
  SgList(std::initializer_list<LocalSlice> slices) {
    for (const auto& s : slices) push(s);
  }
  // Any contiguous range of LocalSlices (std::vector, std::array, std::span).
  template <class Range>
  requires(std::ranges::contiguous_range<Range>&&
               std::same_as<std::remove_cv_t<std::ranges::range_value_t<Range>>, LocalSlice>)
      SgList(const Range& slices) {  // NOLINT: implicit on purpose
    for (const auto& s : slices) push(s);
  }

  std::size_t size() const noexcept { return count_; }
  bool overflow() const noexcept { return overflow_; }
  std::uint64_t total_bytes() const noexcept {
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < count_; ++i) total += sges_[i].length;
    return total;
  }
  const ibv_sge* data() const noexcept { return sges_.data(); }

 private:
  void push(const LocalSlice& s) {
    if (count_ == kMaxSge) {
      overflow_ = true;
      return;
    }
    sges_[count_++] = s.sge();
  }

  std::array<ibv_sge, kMaxSge> sges_{};
  std::size_t count_ = 0;
  bool overflow_ = false;
};
}  // namespace detail

using SgList = detail::SgList;

class SendRequest {
 public:
  static SendRequest send(SgList sg) { return SendRequest(IBV_WR_SEND, sg); }
  static SendRequest send_with_imm(SgList sg, std::uint32_t imm) {
    return SendRequest(IBV_WR_SEND_WITH_IMM, sg).imm(imm);
  }
  static SendRequest write(SgList sg, RemoteBuffer remote) { return SendRequest(IBV_WR_RDMA_WRITE, sg).remote(remote); }
  static SendRequest write_with_imm(SgList sg, RemoteBuffer remote, std::uint32_t imm) {
    return SendRequest(IBV_WR_RDMA_WRITE_WITH_IMM, sg).remote(remote).imm(imm);
  }
  static SendRequest read(SgList sg, RemoteBuffer remote) { return SendRequest(IBV_WR_RDMA_READ, sg).remote(remote); }
  // 64-bit atomics: `result` (8 bytes, local) receives the old value at remote.addr.
  static SendRequest compare_and_swap(LocalSlice result, RemoteBuffer remote, std::uint64_t compare,
                                      std::uint64_t swap) {
    SendRequest r(IBV_WR_ATOMIC_CMP_AND_SWP, SgList(result));
    r.remote(remote);
    r.compare_add_ = compare;
    r.swap_ = swap;
    return r;
  }
  static SendRequest fetch_and_add(LocalSlice result, RemoteBuffer remote, std::uint64_t add) {
    SendRequest r(IBV_WR_ATOMIC_FETCH_AND_ADD, SgList(result));
    r.remote(remote);
    r.compare_add_ = add;
    return r;
  }

  SendRequest& id(WrId id) noexcept {
    wr_id_ = id;
    return *this;
  }
  // Adds 32 bits of immediate data (host order here): a SEND becomes SEND_WITH_IMM, a
  // WRITE becomes WRITE_WITH_IMM; on other operations the request is invalid.
  SendRequest& with_imm(std::uint32_t value) noexcept {
    if (opcode_ == IBV_WR_SEND) opcode_ = IBV_WR_SEND_WITH_IMM;
    if (opcode_ == IBV_WR_RDMA_WRITE) opcode_ = IBV_WR_RDMA_WRITE_WITH_IMM;
    return imm(value);
  }
  // Requests are signaled by default (a completion per request); unsignaled() opts out.
  SendRequest& unsignaled() noexcept {
    flags_ &= ~unsigned(IBV_SEND_SIGNALED);
    return *this;
  }
  SendRequest& fence() noexcept {
    flags_ |= IBV_SEND_FENCE;
    return *this;
  }
  SendRequest& solicited() noexcept {
    flags_ |= IBV_SEND_SOLICITED;
    return *this;
  }
  SendRequest& inline_data() noexcept {
    flags_ |= IBV_SEND_INLINE;
    return *this;
  }
  // UD: the destination (address handle, QPN, Q_Key).
  SendRequest& to(const AddressHandle& ah, std::uint32_t remote_qpn, std::uint32_t remote_qkey) noexcept;

  ibv_wr_opcode opcode() const noexcept { return opcode_; }
  WrId wr_id() const noexcept { return wr_id_; }

  // Why this request cannot be posted, or nullptr.
  const char* invalid_reason() const noexcept {
    if (sg_.overflow()) return "more than kMaxSge slices";
    if (has_imm_ && opcode_ != IBV_WR_SEND_WITH_IMM && opcode_ != IBV_WR_RDMA_WRITE_WITH_IMM)
      return "immediate data on an operation that carries none";
    bool rdma = opcode_ == IBV_WR_RDMA_WRITE || opcode_ == IBV_WR_RDMA_WRITE_WITH_IMM || opcode_ == IBV_WR_RDMA_READ;
    if (rdma && sg_.total_bytes() > remote_.length) return "the slices are longer than the RemoteBuffer";
    bool atomic = opcode_ == IBV_WR_ATOMIC_CMP_AND_SWP || opcode_ == IBV_WR_ATOMIC_FETCH_AND_ADD;
    if (atomic && (sg_.size() != 1 || sg_.total_bytes() != 8)) return "an atomic's result slice must be 8 bytes";
    if (atomic && remote_.length < 8) return "an atomic's RemoteBuffer must hold 8 bytes";
    return nullptr;
  }

  // Fills `wr` (and `sges`, which it points to); next is left null.
  void fill(ibv_send_wr& wr, ibv_sge* sges) const noexcept {
    wr = ibv_send_wr{};
    wr.wr_id = wr_id_.value();
    for (std::size_t i = 0; i < sg_.size(); ++i) sges[i] = sg_.data()[i];
    wr.sg_list = sg_.size() ? sges : nullptr;
    wr.num_sge = int(sg_.size());
    wr.opcode = opcode_;
    wr.send_flags = flags_;
    if (has_imm_) wr.imm_data = htobe32(imm_);
    switch (opcode_) {
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM:
      case IBV_WR_RDMA_READ:
        wr.wr.rdma.remote_addr = remote_.addr;
        wr.wr.rdma.rkey = remote_.rkey;
        break;
      case IBV_WR_ATOMIC_CMP_AND_SWP:
      case IBV_WR_ATOMIC_FETCH_AND_ADD:
        wr.wr.atomic.remote_addr = remote_.addr;
        wr.wr.atomic.rkey = remote_.rkey;
        wr.wr.atomic.compare_add = compare_add_;
        wr.wr.atomic.swap = swap_;
        break;
      default:
        if (ah_ != nullptr) {
          wr.wr.ud.ah = ah_;
          wr.wr.ud.remote_qpn = remote_qpn_;
          wr.wr.ud.remote_qkey = remote_qkey_;
        }
        break;
    }
  }

 private:
  SendRequest(ibv_wr_opcode opcode, SgList sg) : opcode_(opcode), sg_(sg) {}
  SendRequest& imm(std::uint32_t value) noexcept {
    imm_ = value;
    has_imm_ = true;
    return *this;
  }
  SendRequest& remote(RemoteBuffer remote) noexcept {
    remote_ = remote;
    return *this;
  }

  ibv_wr_opcode opcode_;
  SgList sg_;
  WrId wr_id_;
  unsigned flags_ = IBV_SEND_SIGNALED;
  std::uint32_t imm_ = 0;
  bool has_imm_ = false;
  RemoteBuffer remote_;
  std::uint64_t compare_add_ = 0;
  std::uint64_t swap_ = 0;
  ibv_ah* ah_ = nullptr;
  std::uint32_t remote_qpn_ = 0;
  std::uint32_t remote_qkey_ = 0;
};

// A receive: where an incoming SEND (or the immediate of a WRITE_WITH_IMM) lands.
class RecvRequest {
 public:
  RecvRequest(SgList sg, WrId id = WrId{}) : sg_(sg), wr_id_(id) {}  // NOLINT: implicit from slices

  RecvRequest& id(WrId id) noexcept {
    wr_id_ = id;
    return *this;
  }
  WrId wr_id() const noexcept { return wr_id_; }
  const char* invalid_reason() const noexcept { return sg_.overflow() ? "more than kMaxSge slices" : nullptr; }
  void fill(ibv_recv_wr& wr, ibv_sge* sges) const noexcept {
    wr = ibv_recv_wr{};
    wr.wr_id = wr_id_.value();
    for (std::size_t i = 0; i < sg_.size(); ++i) sges[i] = sg_.data()[i];
    wr.sg_list = sg_.size() ? sges : nullptr;
    wr.num_sge = int(sg_.size());
  }

 private:
  SgList sg_;
  WrId wr_id_;
};

namespace detail {
// Links `requests` into ibv_*_wr chains and posts them with `post` (a verb taking the
// first WR and the bad-WR out-pointer). Requests beyond 16 are posted in further chains.
template <class Wr, class Request, class Post>
Status post_chain(std::span<const Request> requests, const char* what, Post post) {
  constexpr std::size_t kChunk = 16;
  for (std::size_t base = 0; base < requests.size(); base += kChunk) {
    std::size_t n = std::min(kChunk, requests.size() - base);
    std::array<Wr, kChunk> wrs;
    std::array<std::array<ibv_sge, kMaxSge>, kChunk> sges;
    for (std::size_t i = 0; i < n; ++i) {
      const Request& r = requests[base + i];
      if (const char* why = r.invalid_reason())
        return Error(EINVAL, std::string(what) + ": request " + std::to_string(base + i) + ": " + why);
      r.fill(wrs[i], sges[i].data());
      wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
    }
    Wr* bad = nullptr;
    int rc = post(wrs.data(), &bad);
    if (rc != 0) {
      std::size_t index = bad ? base + std::size_t(bad - wrs.data()) : base;
      return Error::from_errno(rc > 0 ? rc : last_errno(),
                               std::string(what) + " (request " + std::to_string(index) + ")");
    }
  }
  return {};
}
}  // namespace detail

}  // namespace uroce
