// A context's XRC target QPs kept for other handles after their creator's
// was destroyed, its ibv_open_qp handles (xrc_target.h, "Handles"), and the
// relay proxy that runs other processes' targets. EngineContext members,
// apart from engine_context.cc so that the context does not include
// xrc_target.h, which includes it back.
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "engine/engine_context.h"
#include "engine/xrc_domain.h"
#include "engine/xrc_target.h"

namespace uroce::engine {

void EngineContext::keep_xrc_target(EngineQp* qp) {
  std::lock_guard lock(xrc_mu_);
  xrc_kept_.push_back(qp);
  have_kept_xrc_.store(true);
  timer_armed();  // out of a deep sleep: the progress thread reclaims it
}

void EngineContext::track_xrc_handle(EngineQp* handle, bool open) {
  std::lock_guard lock(xrc_mu_);
  if (open)
    xrc_opened_.push_back(handle);
  else
    std::erase(xrc_opened_, handle);
}

void EngineContext::reclaim_xrc_targets(bool all) {
  std::vector<EngineQp*> gone;
  {
    std::lock_guard lock(xrc_mu_);
    std::erase_if(xrc_kept_, [&](EngineQp* qp) {
      if (!all && !xrc_target_unheld(*qp)) return false;
      gone.push_back(qp);
      return true;
    });
    have_kept_xrc_.store(!xrc_kept_.empty());
  }
  for (EngineQp* qp : gone) {  // as ibv_destroy_qp destroys a target
    unregister_qp(qp);
    xrc_target_detach(*qp);
    release(core::Resource::kQp);
    delete qp;
  }
}

// At close (the progress thread has stopped): this context's opened handles
// are dropped and its kept targets reclaimed; a target QP the application did
// not destroy ends with its context (other handles on it then get EIO).
void EngineContext::close_xrc_handles() {
  std::vector<EngineQp*> opened;
  {
    std::lock_guard lock(xrc_mu_);
    opened.swap(xrc_opened_);
  }
  for (EngineQp* h : opened) {
    (void)xrc_target_close(*h);
    delete h;
  }
  reclaim_xrc_targets(true);
  std::shared_lock lock(qps_.mu());
  qps_.for_each([](EngineQp& qp) {
    if (!qp.xrc) return;
    qp.xrc->domain->remove_local_handle(&qp);
    qp.xrc->domain->release_slot(qp.xrc->slot, qp.xrc->home_port, qp.xrc->qp_num);
  });
}

EngineQp& EngineContext::relay_proxy() {
  if (!relay_proxy_) {
    core::QpCaps caps{1, 1, 1, 1, 0};
    relay_proxy_ =
        std::make_unique<EngineQp>(this, nullptr, nullptr, nullptr, IBV_QPT_XRC_RECV, caps, false, 0, nullptr);
    relay_proxy_->relay_proxy = true;
  }
  return *relay_proxy_;
}

}  // namespace uroce::engine
