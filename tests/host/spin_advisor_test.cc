// SpinAdvisor (host/spin_advisor.h): the progress thread keeps polling
// after traffic only while no application thread of the process is runnable.
// Each case controls every thread of the test process besides its own.
#include "host/spin_advisor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

namespace uroce::host {
namespace {

using namespace std::chrono_literals;

// Asks until the answer is `want` (threads take a moment to start or to
// block); the answer it ended with.
bool settles_to(SpinAdvisor& advisor, bool want) {
  for (int i = 0; i < 2000; ++i) {
    if (advisor.application_runnable() == want) return want;
    std::this_thread::sleep_for(1ms);
  }
  return !want;
}

struct Spinner {
  explicit Spinner(bool internal)
      : thread([this, internal] {
          if (internal) SpinAdvisor::note_internal_thread();
          started.store(true);
          while (!stop.load(std::memory_order_relaxed)) {
          }
          if (internal) SpinAdvisor::forget_internal_thread();
        }) {
    while (!started.load()) std::this_thread::yield();
  }
  ~Spinner() {
    stop.store(true);
    thread.join();
  }
  std::atomic<bool> started{false}, stop{false};
  std::thread thread;
};

TEST(SpinAdvisor, AnApplicationThreadSpinningKeepsTheProgressThreadOff) {
  // Receive: nothing. Expect: a thread of the process busy on its core is seen.
  Spinner app(false);
  SpinAdvisor advisor;
  EXPECT_TRUE(advisor.application_runnable());
}

TEST(SpinAdvisor, ApplicationThreadsThatSleepLeaveTheCoreToIt) {
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  std::thread sleeper([released] { released.wait(); });
  SpinAdvisor advisor;
  EXPECT_FALSE(settles_to(advisor, false));
  go.set_value();
  sleeper.join();
}

TEST(SpinAdvisor, UrocesOwnThreadsDoNotCount) {
  Spinner helper(true);  // as the copy helper or another context's progress thread
  SpinAdvisor advisor;
  EXPECT_FALSE(advisor.application_runnable());
}

// Threads of this process besides the caller (a sanitizer's runtime may
// have its own).
size_t other_threads() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)e;
    ++n;
  }
  return n - 1;
}

TEST(SpinAdvisor, AProcessWithManyThreadsCountsAsBusy) {
  // Receive: nothing. Expect: kMaxThreads sleeping threads are read one by
  // one (the core is free); one more and polling is not known to be free.
  if (size_t others = other_threads(); others >= SpinAdvisor::kMaxThreads) GTEST_SKIP() << others << " threads already";
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  std::vector<std::thread> sleepers;
  // One at a time: ThreadSanitizer starts a thread of its own with the first.
  while (other_threads() < SpinAdvisor::kMaxThreads) sleepers.emplace_back([released] { released.wait(); });
  SpinAdvisor advisor;
  EXPECT_FALSE(settles_to(advisor, false));
  sleepers.emplace_back([released] { released.wait(); });
  std::this_thread::sleep_for(SpinAdvisor::kRelist + 10ms);  // listed again, and asleep long since
  EXPECT_TRUE(advisor.application_runnable());
  go.set_value();
  for (std::thread& t : sleepers) t.join();
}

TEST(SpinAdvisor, SeesThreadsStartedAfterItsFirstLook) {
  SpinAdvisor advisor;
  EXPECT_FALSE(settles_to(advisor, false));
  Spinner app(false);
  // The thread list is read again every kRelist.
  std::this_thread::sleep_for(SpinAdvisor::kRelist + 10ms);
  EXPECT_TRUE(advisor.application_runnable());
}

}  // namespace
}  // namespace uroce::host
