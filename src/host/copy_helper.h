// A second thread for large cross-process copies (direct_placement.h).
//
// process_vm_writev/readv is bound by the CPU that runs it (the kernel pins
// and copies the other process's pages 16 at a time: ~14 GB/s here), not by
// memory (memcpy: 46 GB/s). So a copy of at least kSplitBytes is cut in two
// at a page boundary of the remote range: the calling thread copies the
// first part while the helper copies the second. The helper, woken through
// an atomic wait, keeps looking for work for kLingerUs after each job (a
// stream of large WRITEs finds it awake) and then sleeps. If it has not
// started on its part when the caller has finished its own, the caller takes
// the part back and copies it itself, so a sleeping or descheduled helper
// costs one wake-up, never a wait. The last kTailBytes of a split write are
// copied after both parts, so that they land last as in a single copy.
//
// Threads: any thread may call copy(); one split copy at a time (a caller
// that finds the helper busy copies alone). The helper starts with the first
// large copy — unless the process may run on one CPU only (sched_getaffinity:
// then nothing is split) — and stops with the object.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>

namespace uroce::host {

class CopyHelper {
 public:
  static constexpr size_t kSplitBytes = 64 * 1024;
  static constexpr unsigned kLingerUs = 50;
  static constexpr unsigned kMaxIov = 64;
  static constexpr size_t kTailBytes = 64;  // a split write's last bytes, copied last

  CopyHelper() = default;
  ~CopyHelper();
  CopyHelper(const CopyHelper&) = delete;
  CopyHelper& operator=(const CopyHelper&) = delete;

  // As process_vm_readv (read) or process_vm_writev between the local
  // ranges and one remote range of `pid`: the bytes copied, or -1 and errno.
  // A split copy reports the first part's shortfall or error, else the
  // second's, so a full count means every byte was copied.
  ssize_t copy(pid_t pid, bool read, const iovec* local, unsigned nlocal, iovec remote) noexcept;

  uint64_t split_copies() const { return splits_.load(std::memory_order_relaxed); }
  uint64_t taken_back() const { return taken_back_.load(std::memory_order_relaxed); }

 private:
  // kClaimed: a caller owns job_ (filling it, or copying it itself).
  enum State : uint32_t { kIdle, kClaimed, kPosted, kRunning, kDone, kStop };
  struct Job {
    pid_t pid = 0;
    bool read = false;
    iovec local[kMaxIov];
    unsigned nlocal = 0;
    iovec remote{};
    ssize_t result = 0;
    int error = 0;
  };
  bool start() noexcept;
  void run() noexcept;
  static ssize_t copy_one(const Job& j) noexcept;
  static bool make_job(Job& j, pid_t pid, bool read, const iovec* local, unsigned nlocal, size_t from, uint64_t remote,
                       size_t len) noexcept;
  bool claim_split(Job& own, pid_t pid, bool read, const iovec* local, unsigned nlocal, uint64_t base, size_t cut,
                   size_t second_len) noexcept;
  ssize_t collect_helper_part() noexcept;

  std::atomic<uint32_t> state_{kIdle};
  Job job_;  // written by the caller in kIdle -> kPosted, by the helper in kRunning
  std::once_flag started_;
  bool running_ = false;
  std::thread thread_;
  std::atomic<uint64_t> splits_{0}, taken_back_{0};
};

}  // namespace uroce::host
