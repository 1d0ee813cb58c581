// Sharing a context's objects through a duplicate of its command file
// descriptor: ibv_import_device, ibv_import_pd / _mr / _dm and their unimport
// counterparts (rdma-core 31+).
//
// In rdma-core, cmd_fd is the kernel's uverbs file; another process or
// another ibv_context made from a dup of it reaches the same kernel objects by
// handle. uroce's cmd_fd is an empty memfd (core/context.cc) whose inode names
// its context; ibv_import_device of any descriptor of that file returns the
// same ibv_context, counted: each ibv_close_device of an imported reference
// drops one reference and closes the descriptor it was imported from, the
// last one closes the context. An imported PD, MR or DM is the object itself,
// found by its handle (PD: Pd::id, MR: its MR table slot, DM: a counter), and
// unimporting it does nothing (the object stays with whoever destroys it, as
// the kernel object outlives an unimport). Only the process that owns the
// context can import from it: another process's descriptor is EOPNOTSUPP.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/dm.h"
#include "core/mr.h"
#include "core/pd.h"
#include "engine/engine_context.h"
#include "verbs/export.h"
#include "verbs/import.h"

using uroce::core::Dm;
using uroce::core::Mr;
using uroce::core::Pd;
using uroce::engine::EngineContext;

namespace uroce::verbs {

namespace {

struct Shared {
  std::vector<int> import_fds;  // one per ibv_import_device not yet closed
  std::unordered_map<uint32_t, ibv_pd*> pds;
  std::unordered_map<uint32_t, ibv_dm*> dms;
};

struct Registry {
  std::mutex mu;
  std::unordered_map<ibv_context*, Shared> contexts;
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: used from static destructors' closes
  return *r;
}

// The context whose command file `fd` is a descriptor of, or null.
ibv_context* context_of_file(Registry& r, int fd) {
  struct stat want;
  if (fstat(fd, &want) != 0) return nullptr;
  for (auto& [ctx, shared] : r.contexts) {
    struct stat st;
    if (ctx->cmd_fd >= 0 && fstat(ctx->cmd_fd, &st) == 0 && st.st_dev == want.st_dev && st.st_ino == want.st_ino)
      return ctx;
  }
  return nullptr;
}

}  // namespace

void track_context(ibv_context* context) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.contexts.try_emplace(context);
}

bool close_imported(ibv_context* context) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.contexts.find(context);
  if (it == r.contexts.end()) return false;
  if (it->second.import_fds.empty()) {
    r.contexts.erase(it);  // the last reference: the caller closes the context
    return false;
  }
  close(it->second.import_fds.back());
  it->second.import_fds.pop_back();
  return true;
}

void track_pd(ibv_pd* pd) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.contexts[pd->context].pds[pd->handle] = pd;
}

void untrack_pd(ibv_pd* pd) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.contexts.find(pd->context);
  if (it != r.contexts.end()) it->second.pds.erase(pd->handle);
}

void track_dm(ibv_dm* dm) {
  static std::atomic<uint32_t> next{0};
  dm->handle = next.fetch_add(1, std::memory_order_relaxed) + 1;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.contexts[dm->context].dms[dm->handle] = dm;
}

void untrack_dm(ibv_dm* dm) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.contexts.find(dm->context);
  if (it != r.contexts.end()) it->second.dms.erase(dm->handle);
}

}  // namespace uroce::verbs

using uroce::verbs::abi_guard;
using uroce::verbs::registry;

UROCE_API ibv_context* ibv_import_device(int cmd_fd) {
  return abi_guard<ibv_context*>(nullptr, [&]() -> ibv_context* {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    ibv_context* ctx = uroce::verbs::context_of_file(r, cmd_fd);
    if (!ctx) {
      errno = EOPNOTSUPP;  // not a uroce context of this process
      return nullptr;
    }
    r.contexts[ctx].import_fds.push_back(cmd_fd);
    return ctx;
  });
}

UROCE_API ibv_pd* ibv_import_pd(ibv_context* context, uint32_t pd_handle) {
  return abi_guard<ibv_pd*>(nullptr, [&]() -> ibv_pd* {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.contexts.find(context);
    if (it == r.contexts.end() || !it->second.pds.count(pd_handle)) {
      errno = EINVAL;
      return nullptr;
    }
    return it->second.pds[pd_handle];
  });
}

UROCE_API ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t mr_handle) {
  return abi_guard<ibv_mr*>(nullptr, [&]() -> ibv_mr* {
    Mr* mr = pd ? EngineContext::from(pd->context)->mrs.find_mr(mr_handle) : nullptr;
    if (!mr || mr->pd != Pd::from(pd)) {
      errno = EINVAL;
      return nullptr;
    }
    return &mr->ibmr;
  });
}

UROCE_API ibv_dm* ibv_import_dm(ibv_context* context, uint32_t dm_handle) {
  return abi_guard<ibv_dm*>(nullptr, [&]() -> ibv_dm* {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.contexts.find(context);
    if (it == r.contexts.end() || !it->second.dms.count(dm_handle)) {
      errno = EINVAL;
      return nullptr;
    }
    return it->second.dms[dm_handle];
  });
}

// The imported object is the object itself; it stays until destroyed.
UROCE_API void ibv_unimport_pd(ibv_pd*) {}
UROCE_API void ibv_unimport_mr(ibv_mr*) {}
UROCE_API void ibv_unimport_dm(ibv_dm*) {}
