#include "host/spin_advisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace uroce::host {

namespace {

// Never destroyed: a process may exit while its engines' threads still run
// (exit() destroys statics under them; ASan saw a progress thread push into
// the destroyed vector of a process that exited with a live context).
std::mutex& internal_mu() {
  static std::mutex* const mu = new std::mutex;
  return *mu;
}

std::vector<pid_t>& internal_tids() {  // guarded by internal_mu()
  static std::vector<pid_t>* const tids = new std::vector<pid_t>;
  return *tids;
}

pid_t own_tid() { return pid_t(syscall(SYS_gettid)); }

// The state letter of a /proc/<pid>/task/<tid>/stat line: the first field
// after the command name, which is in parentheses and may hold anything.
char state_of(const char* line) {
  const char* close = std::strrchr(line, ')');
  if (!close) return '?';
  for (const char* p = close + 1; *p; ++p)
    if (*p != ' ') return *p;
  return '?';
}

}  // namespace

void SpinAdvisor::note_internal_thread() noexcept {
  pid_t tid = own_tid();
  std::lock_guard lock(internal_mu());
  try {
    internal_tids().push_back(tid);
  } catch (...) {  // unlisted: the application seems busy while it runs, which only stops polling
  }
}

void SpinAdvisor::forget_internal_thread() noexcept {
  pid_t tid = own_tid();
  std::lock_guard lock(internal_mu());
  auto& tids = internal_tids();
  tids.erase(std::remove(tids.begin(), tids.end(), tid), tids.end());
}

SpinAdvisor::~SpinAdvisor() { close_all(); }

void SpinAdvisor::close_all() {
  for (const Task& t : tasks_) ::close(t.fd);
  tasks_.clear();
}

void SpinAdvisor::relist() {
  listed_ = std::chrono::steady_clock::now();
  listed_ok_ = false;
  DIR* dir = opendir("/proc/self/task");
  if (!dir) {
    close_all();
    return;
  }
  std::vector<pid_t> internal;
  {
    std::lock_guard lock(internal_mu());
    internal = internal_tids();
  }
  pid_t self = own_tid();
  std::vector<Task> next;
  bool ok = true;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    long tid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || tid <= 0) continue;
    if (tid == self || std::find(internal.begin(), internal.end(), pid_t(tid)) != internal.end()) continue;
    auto known = std::find_if(tasks_.begin(), tasks_.end(), [&](const Task& t) { return t.tid == tid; });
    if (known != tasks_.end()) {
      next.push_back(*known);
      known->fd = -1;  // moved
      continue;
    }
    char path[64];
    std::snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0)
      next.push_back(Task{pid_t(tid), fd});
    else if (errno != ENOENT)  // not a thread that just ended
      ok = false;
  }
  closedir(dir);
  for (const Task& t : tasks_)
    if (t.fd >= 0) ::close(t.fd);
  tasks_ = std::move(next);
  listed_ok_ = ok;
}

bool SpinAdvisor::application_runnable() {
  if (!listed_ok_ || std::chrono::steady_clock::now() - listed_ >= kRelist) relist();
  if (!listed_ok_ || tasks_.size() > kMaxThreads) return true;
  char line[512];
  for (const Task& t : tasks_) {
    ssize_t n = pread(t.fd, line, sizeof line - 1, 0);
    if (n <= 0) continue;  // the thread has ended
    line[n] = '\0';
    if (state_of(line) == 'R') return true;
  }
  return false;
}

}  // namespace uroce::host
