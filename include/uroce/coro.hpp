// uroce C++ API: awaiting completions from C++20 coroutines (optional; one thread).
//
//   Task<std::uint32_t> echo(CompletionLoop& loop, const QueuePair& qp, const CompletionQueue& cq, ...) {
//     UROCE_CO_TRY(qp.post_send(SendRequest::send(slice)));
//     auto c = co_await loop.next(cq, 1s);          // Result<Completion>
//     if (!c) co_return std::move(c).error();
//     co_return c->byte_len;
//   }
//   CompletionLoop loop;
//   loop.spawn(other_task(loop, ...));               // runs alongside
//   Result<std::uint32_t> r = loop.run(echo(loop, qp, cq, ...));
//
// A Task is lazy and returns a Result<T> (Task<> returns a Status); tasks co_await each
// other and loop.next(cq, timeout). CompletionLoop::run polls the CQs its coroutines
// wait on, on the calling thread, until the task given to it is done. Coroutines waiting
// on the same CQ get its completions in the order they started waiting.
#pragma once

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <deque>
#include <exception>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "uroce/cq.hpp"
#include "uroce/result.hpp"

namespace uroce {

template <class T = void>
class [[nodiscard]] Task {
 public:
  struct promise_type {
    std::optional<Result<T>> result;
    std::coroutine_handle<> continuation = std::noop_coroutine();

    Task get_return_object() noexcept { return Task(Handle::from_promise(*this)); }
    std::suspend_always initial_suspend() noexcept { return {}; }
    auto final_suspend() noexcept {
      struct Final {
        bool await_ready() noexcept { return false; }
        std::coroutine_handle<> await_suspend(Handle h) noexcept { return h.promise().continuation; }
        void await_resume() noexcept {}
      };
      return Final{};
    }
    void return_value(Result<T> value) { result.emplace(std::move(value)); }
    void unhandled_exception() noexcept { std::terminate(); }
  };
  using Handle = std::coroutine_handle<promise_type>;

  Task(Task&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Task& operator=(Task&& other) noexcept {
    if (this != &other) {
      if (handle_) handle_.destroy();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() {
    if (handle_) handle_.destroy();
  }

  bool done() const noexcept { return !handle_ || handle_.done(); }

  // co_await task: starts it and resumes the awaiting coroutine with its Result<T>.
  auto operator co_await() && noexcept {
    struct Awaiter {
      Handle handle;
      bool await_ready() noexcept { return handle.done(); }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiting) noexcept {
        handle.promise().continuation = awaiting;
        return handle;
      }
      Result<T> await_resume() { return std::move(*handle.promise().result); }
    };
    return Awaiter{handle_};
  }

 private:
  friend class CompletionLoop;
  explicit Task(Handle handle) noexcept : handle_(handle) {}

  Handle handle_;
};

class CompletionLoop {
 public:
  CompletionLoop() = default;
  CompletionLoop(const CompletionLoop&) = delete;
  CompletionLoop& operator=(const CompletionLoop&) = delete;

  // An awaitable giving the next completion of `cq` (whatever its status) or ETIMEDOUT.
  auto next(const CompletionQueue& cq, Milliseconds timeout) {
    struct Awaiter {
      CompletionLoop& loop;
      const CompletionQueue& cq;
      Milliseconds timeout;
      std::optional<Result<Completion>> result;

      bool await_ready() {
        if (loop.has_waiter(cq)) return false;  // keep the order of earlier waiters
        auto got = cq.poll_one();
        if (!got)
          result.emplace(std::move(got).error());
        else if (*got)
          result.emplace(**got);
        return result.has_value();
      }
      void await_suspend(std::coroutine_handle<> h) {
        loop.waiters_.push_back(Waiter{&cq, std::chrono::steady_clock::now() + timeout, h, &result});
      }
      Result<Completion> await_resume() { return std::move(*result); }
    };
    return Awaiter{*this, cq, timeout, std::nullopt};
  }

  // Starts `task` now; run() drives it along with the task it is given.
  void spawn(Task<> task) {
    auto handle = task.handle_;
    spawned_.push_back(std::move(task));
    handle.resume();
  }

  // Runs `task` until it is done, polling the CQs the loop's coroutines wait on. If it
  // waits on something the loop cannot complete, EDEADLK.
  template <class T>
  Result<T> run(Task<T> task) {
    task.handle_.resume();
    while (!task.done()) {
      if (waiters_.empty()) return Error(EDEADLK, "CompletionLoop::run: the task waits on nothing the loop drives");
      if (!step()) std::this_thread::yield();
    }
    return std::move(*task.handle_.promise().result);
  }

 private:
  struct Waiter {
    const CompletionQueue* cq;
    std::chrono::steady_clock::time_point deadline;
    std::coroutine_handle<> handle;
    std::optional<Result<Completion>>* out;
  };

  bool has_waiter(const CompletionQueue& cq) const noexcept {
    for (const auto& w : waiters_)
      if (w.cq == &cq) return true;
    return false;
  }

  // Completes what it can (at most one waiter per CQ, the first one); true if any.
  bool step() {
    std::vector<Waiter> ready;
    std::vector<const CompletionQueue*> polled;
    auto now = std::chrono::steady_clock::now();
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      bool first_on_cq = std::find(polled.begin(), polled.end(), it->cq) == polled.end();
      polled.push_back(it->cq);
      std::optional<Result<Completion>> outcome;
      if (first_on_cq) {
        auto got = it->cq->poll_one();
        if (!got)
          outcome.emplace(std::move(got).error());
        else if (*got)
          outcome.emplace(**got);
      }
      if (!outcome && now >= it->deadline) outcome.emplace(Error(ETIMEDOUT, "CompletionLoop: no completion in time"));
      if (!outcome) {
        ++it;
        continue;
      }
      *it->out = std::move(outcome);
      ready.push_back(*it);
      it = waiters_.erase(it);
    }
    for (auto& w : ready) w.handle.resume();  // may add waiters; `ready` is ours
    return !ready.empty();
  }

  std::deque<Waiter> waiters_;
  std::vector<Task<>> spawned_;
};

}  // namespace uroce

// UROCE_TRY for coroutines: co_return the error of a failed Result or Status.
#define UROCE_CO_TRY(expr)                                            \
  do {                                                                \
    auto&& uroce_try_result_ = (expr);                                \
    if (!uroce_try_result_.ok()) co_return uroce_try_result_.error(); \
  } while (0)
