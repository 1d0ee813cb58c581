// uroce C++ API: completion channels, completion queues and completions as values.
//
//   auto cq = CompletionQueue::create(ctx, 64);          // or (ctx, 64, &channel)
//   auto c = cq->wait(std::chrono::seconds(1));          // Result<Completion>
//   if (c && c->ok()) ... c->opcode, c->byte_len, c->imm, c->wr_id
//
// A completion with an error status is still a value (Completion::ok() is false);
// wait_ok() turns it into an Error carrying the ibv_wc_status.
#pragma once

#include <endian.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "uroce/device.hpp"
#include "uroce/handle.hpp"
#include "uroce/result.hpp"
#include "uroce/wr_id.hpp"

namespace uroce {

// "success", "remote access error", ... (ibv_wc_status_str).
inline std::string_view to_string(ibv_wc_status status) noexcept { return ::ibv_wc_status_str(status); }

// One work completion (ibv_wc), immediate data in host byte order.
struct Completion {
  WrId wr_id;
  ibv_wc_status status = IBV_WC_SUCCESS;
  ibv_wc_opcode opcode = IBV_WC_SEND;
  std::uint32_t byte_len = 0;
  std::optional<std::uint32_t> imm;  // set for *_WITH_IMM receives
  std::uint32_t qp_num = 0;
  std::uint32_t src_qp = 0;  // UD receives: the sender's QPN
  std::uint32_t vendor_err = 0;
  unsigned wc_flags = 0;
  std::uint16_t slid = 0;

  bool ok() const noexcept { return status == IBV_WC_SUCCESS; }
  bool is_recv() const noexcept { return (opcode & IBV_WC_RECV) != 0; }

  static Completion from_ibv(const ibv_wc& wc) noexcept {
    Completion c;
    c.wr_id = WrId(wc.wr_id);
    c.status = wc.status;
    c.opcode = wc.opcode;
    c.byte_len = wc.byte_len;
    if (wc.wc_flags & IBV_WC_WITH_IMM) c.imm = be32toh(wc.imm_data);
    c.qp_num = wc.qp_num;
    c.src_qp = wc.src_qp;
    c.vendor_err = wc.vendor_err;
    c.wc_flags = wc.wc_flags;
    c.slid = wc.slid;
    return c;
  }
  // Success, or an Error (errno EIO) carrying the status: "work completion of wr_id 7
  // failed: remote access error".
  Status to_status() const {
    if (ok()) return {};
    return Error(
        EIO, status,
        "work completion of wr_id " + std::to_string(wr_id.value()) + " failed: " + std::string(to_string(status)));
  }
};

// A completion channel (ibv_create_comp_channel); fd() can be put in poll/epoll.
class CompletionChannel {
 public:
  static Result<CompletionChannel> create(const Context& context) {
    errno = 0;
    ibv_comp_channel* raw = ::ibv_create_comp_channel(context.raw());
    if (raw == nullptr) return Error::from_errno(last_errno(), "ibv_create_comp_channel");
    return CompletionChannel(raw);
  }

  ibv_comp_channel* raw() const noexcept { return handle_.get(); }
  int fd() const noexcept { return raw()->fd; }

  // Waits up to `timeout` for the next event and acknowledges it; returns the CQ that
  // fired (ETIMEDOUT when none did).
  Result<ibv_cq*> wait_event(Milliseconds timeout) const {
    pollfd p{fd(), POLLIN, 0};
    int n = ::poll(&p, 1, int(timeout.count()));
    if (n < 0) return Error::from_errno(errno, "poll(completion channel)");
    if (n == 0) return Error(ETIMEDOUT, "no completion event within " + std::to_string(timeout.count()) + " ms");
    ibv_cq* cq = nullptr;
    void* cq_context = nullptr;
    if (::ibv_get_cq_event(raw(), &cq, &cq_context) != 0) return Error::from_errno(last_errno(), "ibv_get_cq_event");
    ::ibv_ack_cq_events(cq, 1);
    return cq;
  }

 private:
  struct Release {
    void operator()(ibv_comp_channel* c) const noexcept { ::ibv_destroy_comp_channel(c); }
  };
  explicit CompletionChannel(ibv_comp_channel* raw) noexcept : handle_(raw) {}

  detail::Handle<ibv_comp_channel, Release> handle_;
};

// A completion queue (ibv_create_cq / ibv_destroy_cq).
class CompletionQueue {
 public:
  // `channel` (optional) must outlive the CQ; wait() then sleeps on it instead of polling.
  static Result<CompletionQueue> create(const Context& context, int entries, const CompletionChannel* channel = nullptr,
                                        int comp_vector = 0) {
    errno = 0;
    ibv_cq* raw = ::ibv_create_cq(context.raw(), entries, nullptr, channel ? channel->raw() : nullptr, comp_vector);
    if (raw == nullptr)
      return Error::from_errno(last_errno(), "ibv_create_cq(" + std::to_string(entries) + " entries)");
    return CompletionQueue(raw, channel);
  }

  ibv_cq* raw() const noexcept { return handle_.get(); }
  int capacity() const noexcept { return raw()->cqe; }

  // Polls up to out.size() completions without waiting; returns how many were written.
  Result<std::size_t> poll(std::span<Completion> out) const {
    std::size_t done = 0;
    ibv_wc wcs[16];
    while (done < out.size()) {
      int want = int(std::min<std::size_t>(16, out.size() - done));
      int n = ::ibv_poll_cq(raw(), want, wcs);
      if (n < 0) return Error(EIO, "ibv_poll_cq failed");
      for (int i = 0; i < n; ++i) out[done++] = Completion::from_ibv(wcs[i]);
      if (n < want) break;
    }
    return done;
  }
  // One completion if there is one, without waiting.
  Result<std::optional<Completion>> poll_one() const {
    ibv_wc wc;
    int n = ::ibv_poll_cq(raw(), 1, &wc);
    if (n < 0) return Error(EIO, "ibv_poll_cq failed");
    if (n == 0) return std::optional<Completion>();
    return std::optional<Completion>(Completion::from_ibv(wc));
  }

  // Arms the CQ's channel for the next completion (ibv_req_notify_cq).
  Status request_notify(bool solicited_only = false) const {
    return status_from_rc(::ibv_req_notify_cq(raw(), solicited_only ? 1 : 0), "ibv_req_notify_cq");
  }

  // The next completion, waiting up to `timeout` (ETIMEDOUT). With a channel it sleeps on
  // the channel (assumed to serve this CQ only), otherwise it polls. A completion with an
  // error status is returned as a value.
  Result<Completion> wait(Milliseconds timeout) const {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto got = poll_one();
      if (!got) return std::move(got).error();
      if (*got) return **got;
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return Error(ETIMEDOUT, "no completion within " + std::to_string(timeout.count()) + " ms");
      if (channel_ == nullptr) {
        std::this_thread::yield();
        continue;
      }
      if (auto s = request_notify(); !s) return std::move(s).error();
      got = poll_one();  // a completion that arrived before the CQ was armed
      if (!got) return std::move(got).error();
      if (*got) return **got;
      auto left = std::chrono::ceil<Milliseconds>(deadline - now);
      auto event = channel_->wait_event(left);
      if (!event && event.error().errnum() != ETIMEDOUT) return std::move(event).error();
    }
  }
  // Like wait(), but a failed completion is an Error carrying its ibv_wc_status.
  Result<Completion> wait_ok(Milliseconds timeout) const {
    auto c = wait(timeout);
    if (!c) return c;
    if (auto s = c->to_status(); !s) return std::move(s).error();
    return c;
  }
  // Exactly `count` completions (whatever their status) within `timeout` overall.
  Result<std::vector<Completion>> wait_n(std::size_t count, Milliseconds timeout) const {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<Completion> out;
    out.reserve(count);
    while (out.size() < count) {
      auto left = std::chrono::ceil<Milliseconds>(deadline - std::chrono::steady_clock::now());
      auto c = wait(std::max(left, Milliseconds(0)));
      if (!c) return std::move(c).error();
      out.push_back(*c);
    }
    return out;
  }

 private:
  struct Release {
    void operator()(ibv_cq* cq) const noexcept { ::ibv_destroy_cq(cq); }
  };
  CompletionQueue(ibv_cq* raw, const CompletionChannel* channel) noexcept : handle_(raw), channel_(channel) {}

  detail::Handle<ibv_cq, Release> handle_;
  const CompletionChannel* channel_ = nullptr;
};

}  // namespace uroce
