#include "host/copy_helper.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "core/guarded_access.h"
#include "host/spin_advisor.h"

namespace uroce::host {

namespace {

constexpr uint64_t kPage = 4096;

// The local ranges of bytes [from, from + len) of `in` into `out` (capacity
// `cap`); the number of ranges, or 0 if they do not fit.
unsigned slice(const iovec* in, unsigned n, size_t from, size_t len, iovec* out, unsigned cap) {
  unsigned k = 0;
  for (unsigned i = 0; i < n && len > 0; ++i) {
    if (from >= in[i].iov_len) {
      from -= in[i].iov_len;
      continue;
    }
    if (k == cap) return 0;
    size_t take = std::min(in[i].iov_len - from, len);
    out[k++] = iovec{static_cast<char*>(in[i].iov_base) + from, take};
    len -= take;
    from = 0;
  }
  return len == 0 ? k : 0;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

CopyHelper::~CopyHelper() {
  if (!running_) return;
  state_.store(kStop, std::memory_order_release);
  state_.notify_one();
  thread_.join();
}

ssize_t CopyHelper::copy_one(const Job& j) noexcept {
  return j.read ? process_vm_readv(j.pid, j.local, j.nlocal, &j.remote, 1, 0)
                : process_vm_writev(j.pid, j.local, j.nlocal, &j.remote, 1, 0);
}

bool CopyHelper::start() noexcept {
  std::call_once(started_, [this] {
    // A helper confined to the caller's only CPU (taskset) would take turns
    // with it, not copy beside it.
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) != 0 || CPU_COUNT(&cpus) < 2) return;
    // The helper takes no signal of the application's (it inherits the mask).
    sigset_t all, old;
    core::blockable_signals(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    try {
      thread_ = std::thread([this] { run(); });
      running_ = true;
    } catch (...) {
      running_ = false;
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  });
  return running_;
}

void CopyHelper::run() noexcept {
  SpinAdvisor::note_internal_thread();
  struct Forget {
    ~Forget() { SpinAdvisor::forget_internal_thread(); }
  } forget;
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = Clock::now();
  for (;;) {
    uint32_t s = state_.load(std::memory_order_acquire);
    if (s == kStop) return;
    if (s == kPosted && state_.compare_exchange_strong(s, kRunning, std::memory_order_acq_rel)) {
      ssize_t n = copy_one(job_);
      job_.error = n < 0 ? errno : 0;
      job_.result = n;
      state_.store(kDone, std::memory_order_release);
      last = Clock::now();
      continue;
    }
    // A split copy in progress (the caller filling or taking back a job, or
    // collecting ours) is activity too: without this, a helper woken too late
    // for one job (its part taken back) stopped lingering during the caller's
    // double-length copy, slept again before the next job, and every later
    // job was taken back as well.
    if (s != kIdle) last = Clock::now();
    if (Clock::now() - last < std::chrono::microseconds(kLingerUs)) {
      cpu_relax();
      continue;
    }
    state_.wait(s, std::memory_order_acquire);
    last = Clock::now();
  }
}

// The local ranges of bytes [from, from + len) of `local` and the remote
// range they go to or come from, as one job; false if they do not fit.
bool CopyHelper::make_job(Job& j, pid_t pid, bool read, const iovec* local, unsigned nlocal, size_t from,
                          uint64_t remote, size_t len) noexcept {
  j.pid = pid;
  j.read = read;
  j.remote = iovec{reinterpret_cast<void*>(remote), len};
  j.nlocal = slice(local, nlocal, from, len, j.local, kMaxIov);
  return j.nlocal != 0;
}

// Claims the helper and fills both parts: `own` [0, cut) for the caller, the
// helper's [cut, cut + second_len). False (helper left idle) if it is busy,
// cannot start, or a part does not fit in kMaxIov ranges.
bool CopyHelper::claim_split(Job& own, pid_t pid, bool read, const iovec* local, unsigned nlocal, uint64_t base,
                             size_t cut, size_t second_len) noexcept {
  uint32_t idle = kIdle;
  if (!start() || !state_.compare_exchange_strong(idle, kClaimed, std::memory_order_acquire)) return false;
  // Ours while claimed: fill the helper's part, then post it.
  if (make_job(job_, pid, read, local, nlocal, cut, base + cut, second_len) &&
      make_job(own, pid, read, local, nlocal, 0, base, cut))
    return true;
  state_.store(kIdle, std::memory_order_release);
  return false;
}

// The helper's part: taken back if it has not started, else waited for. Its
// result, with errno set when negative; the helper is idle again.
ssize_t CopyHelper::collect_helper_part() noexcept {
  uint32_t posted = kPosted;
  ssize_t n;
  int error;
  if (state_.compare_exchange_strong(posted, kClaimed, std::memory_order_acquire)) {
    taken_back_.fetch_add(1, std::memory_order_relaxed);
    n = copy_one(job_);
    error = n < 0 ? errno : 0;
  } else {
    while (state_.load(std::memory_order_acquire) != kDone) cpu_relax();
    n = job_.result;
    error = job_.error;
  }
  state_.store(kIdle, std::memory_order_release);
  errno = error;
  return n;
}

ssize_t CopyHelper::copy(pid_t pid, bool read, const iovec* local, unsigned nlocal, iovec remote) noexcept {
  const size_t len = remote.iov_len;
  const uint64_t base = reinterpret_cast<uint64_t>(remote.iov_base);
  // The cut: the page boundary nearest the middle of the remote range. A
  // write's last kTailBytes are held back and copied once both parts are in,
  // so that they land last, as in one ascending copy (an application polling
  // the last byte of a WRITE, like ib_write_lat, then finds the rest there).
  const size_t cut = len >= kSplitBytes ? size_t(((base + len / 2) & ~(kPage - 1)) - base) : 0;
  const size_t tail = read ? 0 : kTailBytes;
  const size_t second_len = len - cut - tail;
  Job own;
  if (cut == 0 || cut >= len || !claim_split(own, pid, read, local, nlocal, base, cut, second_len))
    return read ? process_vm_readv(pid, local, nlocal, &remote, 1, 0)
                : process_vm_writev(pid, local, nlocal, &remote, 1, 0);
  splits_.fetch_add(1, std::memory_order_relaxed);
  state_.store(kPosted, std::memory_order_release);
  state_.notify_one();
  ssize_t first = copy_one(own);
  int first_error = first < 0 ? errno : 0;
  ssize_t second = collect_helper_part();
  int second_error = errno;
  if (first < 0) {
    errno = first_error;
    return -1;
  }
  if (size_t(first) != cut) return first;
  if (second < 0) {
    errno = second_error;
    return -1;
  }
  if (size_t(second) != second_len || tail == 0) return ssize_t(cut) + second;
  Job last;
  if (!make_job(last, pid, read, local, nlocal, len - tail, base + len - tail, tail)) {
    errno = EINVAL;
    return -1;
  }
  ssize_t third = copy_one(last);
  return third < 0 ? -1 : ssize_t(cut + second_len) + third;
}

}  // namespace uroce::host
