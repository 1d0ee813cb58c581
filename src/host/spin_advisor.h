// Whether the progress thread may keep polling its sockets after traffic
// (UROCE_POLL=auto:N, docs/architecture.md "How the progress thread waits").
//
// A progress thread that blocks is woken through the scheduler for every
// datagram; on a virtual machine whose idle CPU halts, that costs 20-30 us
// (the blocking UDP ping-pong's one-way latency). Polling avoids it, but a
// poller on the core of an application thread that spins (a WRITE target
// polling memory) takes that core in scheduler slices, which costs far
// more. So the progress thread polls only while no application thread of
// this process is runnable: the application sleeps (an RDMA READ or WRITE
// target that waits for the end of the test, a server blocked in a socket),
// and its core is the progress thread's for the asking.
//
// The test reads the state letter of every thread of the process
// (/proc/self/task/<tid>/stat), skipping uroce's own threads that register
// themselves (note_internal_thread: progress threads, the copy helper; the
// rdma_cm service and capture writer threads, in lower layers, mostly sleep
// and are not skipped: when runnable they only end a poll early). The thread
// list is read again every kRelist; each look costs one pread per thread.
//
// Threads: one SpinAdvisor per progress thread, used by that thread only;
// note_internal_thread/forget_internal_thread may be called by any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <vector>

namespace uroce::host {

class SpinAdvisor {
 public:
  static constexpr auto kRelist = std::chrono::milliseconds(100);
  // A process with more threads than this is not looked at thread by thread
  // (one look would cost more than the wake-up it saves): it counts as busy.
  static constexpr size_t kMaxThreads = 16;

  SpinAdvisor() = default;
  ~SpinAdvisor();
  SpinAdvisor(const SpinAdvisor&) = delete;
  SpinAdvisor& operator=(const SpinAdvisor&) = delete;

  // Marks the calling thread as uroce's own (a progress thread, the copy
  // helper): its state does not keep the progress thread from polling.
  static void note_internal_thread() noexcept;
  static void forget_internal_thread() noexcept;

  // True when some thread of the process other than uroce's own is
  // runnable, or when the threads cannot be read or are more than
  // kMaxThreads (then polling is not known to be free).
  bool application_runnable();

 private:
  struct Task {
    pid_t tid;
    int fd;
  };
  void relist();
  void close_all();

  std::vector<Task> tasks_;
  std::chrono::steady_clock::time_point listed_{};
  bool listed_ok_ = false;
};

}  // namespace uroce::host
