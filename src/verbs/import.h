// What ibv_import_device / ibv_import_pd / ibv_import_dm need to know of a
// context's objects (verbs/import_verbs.cc).
#pragma once

#include <infiniband/verbs.h>

namespace uroce::verbs {

// An opened context, which ibv_import_device can find by its cmd_fd.
void track_context(ibv_context* context);
// ibv_close_device: true if `context` still has imported references, of which
// one is now closed (with the descriptor it was imported from); false if the
// caller closes the context itself (its objects are forgotten).
bool close_imported(ibv_context* context);
// PDs (by ibv_pd::handle) and device memory (ibv_dm::handle, given here) that
// ibv_import_pd / ibv_import_dm can find.
void track_pd(ibv_pd* pd);
void untrack_pd(ibv_pd* pd);
void track_dm(ibv_dm* dm);
void untrack_dm(ibv_dm* dm);

}  // namespace uroce::verbs
