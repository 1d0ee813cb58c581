// Coroutines awaiting completions: a ping-pong between two coroutines on one thread.
#include "uroce/coro.hpp"

#include <cstring>

#include "test_util.hpp"

namespace uroce::test {
namespace {

class CoroTest : public RcPair {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(build(QpType::kRc));
    ASSERT_NO_FATAL_FAILURE(connect());
  }
};

// A nested task: the next successful completion of `cq`.
Task<Completion> next_ok(CompletionLoop& loop, const CompletionQueue& cq) {
  auto c = co_await loop.next(cq, kWait);
  if (!c) co_return std::move(c).error();
  UROCE_CO_TRY(c->to_status());
  co_return *c;
}

// Receives a message into `in` and answers with `out`, `rounds` times.
Task<> pong(CompletionLoop& loop, const QueuePair& qp, const CompletionQueue& cq, LocalSlice in, LocalSlice out,
            int rounds) {
  for (int i = 0; i < rounds; ++i) {
    UROCE_CO_TRY(qp.post_recv(RecvRequest(in, WrId{std::uint64_t(i)})));
    auto got = co_await next_ok(loop, cq);
    if (!got) co_return std::move(got).error();
    std::memcpy(out.data(), in.data(), got->byte_len);
    UROCE_CO_TRY(qp.post_send(SendRequest::send(out.first(got->byte_len)).id(WrId{1000})));
    UROCE_CO_TRY(co_await next_ok(loop, cq));  // the answer's own completion
  }
  co_return {};
}

Task<int> ping(CompletionLoop& loop, const QueuePair& qp, const CompletionQueue& cq, LocalSlice out, LocalSlice in,
               int rounds) {
  int answered = 0;
  for (int i = 0; i < rounds; ++i) {
    std::memset(out.data(), 'a' + i, 16);
    UROCE_CO_TRY(qp.post_recv(RecvRequest(in, WrId{2000})));
    UROCE_CO_TRY(qp.post_send(SendRequest::send(out.first(16)).id(WrId{3000})));
    // The send's completion and the answer, in either order.
    for (int k = 0; k < 2; ++k) {
      auto c = co_await next_ok(loop, cq);
      if (!c) co_return std::move(c).error();
      if (c->opcode == IBV_WC_RECV && c->byte_len == 16 && std::memcmp(in.data(), out.data(), 16) == 0) ++answered;
    }
  }
  co_return answered;
}

TEST_F(CoroTest, PingPongBetweenTwoCoroutines) {
  CompletionLoop loop;
  constexpr int kRounds = 5;
  loop.spawn(pong(loop, *qp_b_, *cq_b_, mr_b_->slice(0, 64), mr_b_->slice(64, 64), kRounds));
  Result<int> answered = loop.run(ping(loop, *qp_a_, *cq_a_, mr_a_->slice(0, 64), mr_a_->slice(64, 64), kRounds));
  ASSERT_OK(answered);
  EXPECT_EQ(*answered, kRounds);
}

Task<> wait_for_nothing(CompletionLoop& loop, const CompletionQueue& cq) {
  auto c = co_await loop.next(cq, Milliseconds(20));
  if (c) co_return Error(EPROTO, "a completion out of nowhere");
  co_return std::move(c).error();
}

TEST_F(CoroTest, TimeoutAndDeadlockAreErrors) {
  CompletionLoop loop;
  Status timed_out = loop.run(wait_for_nothing(loop, *cq_a_));
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.error().errnum(), ETIMEDOUT);

  auto stuck = []() -> Task<int> {
    co_await std::suspend_always{};  // nothing the loop drives will resume it
    co_return 1;
  };
  Result<int> deadlocked = loop.run(stuck());
  ASSERT_FALSE(deadlocked.ok());
  EXPECT_EQ(deadlocked.error().errnum(), EDEADLK);
}

}  // namespace
}  // namespace uroce::test
