// Helpers of the C++ API tests: assertions on Result/Status and an RC pair in one process.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <vector>

#include "uroce/uroce.hpp"

#define ASSERT_OK(expr)                                                          \
  do {                                                                           \
    const auto& uroce_ok_ = (expr);                                              \
    ASSERT_TRUE(uroce_ok_.ok()) << #expr << ": " << uroce_ok_.error().message(); \
  } while (0)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) ASSERT_OK_AND_ASSIGN_(UROCE_CONCAT_(uroce_r_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_(tmp, lhs, expr)                      \
  auto tmp = (expr);                                               \
  ASSERT_TRUE(tmp.ok()) << #expr << ": " << tmp.error().message(); \
  lhs = std::move(tmp).value()

namespace uroce::test {

using namespace std::chrono_literals;
inline constexpr Milliseconds kWait = 5s;

// TCP ports of the tests: kPortBase + 0..9 (the binary linked with rdma-core's libraries
// gets another base so that both binaries may run at once).
#ifndef UROCE_CXX_TEST_PORT_BASE
#define UROCE_CXX_TEST_PORT_BASE 18971
#endif
inline constexpr std::uint16_t kPortBase = UROCE_CXX_TEST_PORT_BASE;

inline std::vector<std::byte> pattern(std::size_t size, unsigned seed) {
  std::vector<std::byte> out(size);
  for (std::size_t i = 0; i < size; ++i) out[i] = std::byte((i * 7 + seed) & 0xFF);
  return out;
}

// Two RC QPs of one process connected to each other, each with its own CQ and a 4 KiB
// buffer registered with every access right.
class RcPair : public ::testing::Test {
 protected:
  static constexpr std::size_t kBufferSize = 4096;

  void SetUp() override { ASSERT_NO_FATAL_FAILURE(build(QpType::kRc)); }

  void build(QpType type, const SharedReceiveQueue* srq_for_b = nullptr) {
    ASSERT_OK_AND_ASSIGN(ctx_, Context::open());
    ASSERT_OK_AND_ASSIGN(pd_, ProtectionDomain::alloc(*ctx_));
    ASSERT_OK_AND_ASSIGN(cq_a_, CompletionQueue::create(*ctx_, 64));
    ASSERT_OK_AND_ASSIGN(cq_b_, CompletionQueue::create(*ctx_, 64));
    ASSERT_OK_AND_ASSIGN(qp_a_, QueuePair::create(*pd_, type, *cq_a_, *cq_a_));
    QpOptions options_b;
    options_b.srq = srq_for_b;
    ASSERT_OK_AND_ASSIGN(qp_b_, QueuePair::create(*pd_, type, *cq_b_, *cq_b_, options_b));
    ASSERT_OK_AND_ASSIGN(mr_a_, MemoryRegion::reg(*pd_, std::span(buf_a_), Access::kAll));
    ASSERT_OK_AND_ASSIGN(mr_b_, MemoryRegion::reg(*pd_, std::span(buf_b_), Access::kAll));
  }
  void connect() {
    ASSERT_OK_AND_ASSIGN(QpEndpoint a, qp_a_->local_endpoint());
    ASSERT_OK_AND_ASSIGN(QpEndpoint b, qp_b_->local_endpoint());
    ASSERT_OK(qp_a_->connect(b));
    ASSERT_OK(qp_b_->connect(a));
  }

  std::vector<std::byte> buf_a_ = std::vector<std::byte>(kBufferSize);
  std::vector<std::byte> buf_b_ = std::vector<std::byte>(kBufferSize);
  // Declaration order is destruction order reversed: MRs and QPs go before PD and context.
  std::optional<Context> ctx_;
  std::optional<ProtectionDomain> pd_;
  std::optional<CompletionQueue> cq_a_, cq_b_;
  std::optional<QueuePair> qp_a_, qp_b_;
  std::optional<MemoryRegion> mr_a_, mr_b_;
};

}  // namespace uroce::test
