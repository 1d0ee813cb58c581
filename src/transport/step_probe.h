// Step probes: TSC stamps at the steps of a one-way, same host or UDP (the
// post, the record or datagram published and taken, the responder and
// completer done, the burst settled, the completion polled), written to a
// file per process at exit for bench/step_timeline.sh, which joins the two
// processes of a ping-pong into the time each step takes. Instruction counts
// (callgrind) say what the software does; these say where a one-way's time
// goes, cache misses and atomics included.
//
// Compiled in only with -DUROCE_STEP_PROBES=ON; otherwise stamp() is empty
// and the call sites cost nothing.
#pragma once

#include <cstdint>

namespace uroce::transport::step_probe {

enum class Step : uint32_t {
  kPost = 1,   // a post entered (engine::post_send: ibv_post_send, ibv_wr_complete)
  kPublished,  // a record published into a peer's ring (ShmTransport::commit_bare) or a
               // word into its board (post_board), or datagrams handed to sendmmsg (UdpTransport)
  kTaken,      // a record taken from an inbound ring, or datagrams from recvmmsg
  kResponder,  // the responder done with a request
  kCompleter,  // the completer done with a response
  kSettled,    // a burst settled (ACKs sent, completions released)
  kPolled,     // ibv_poll_cq returning completions
};

#ifdef UROCE_STEP_PROBES
void stamp(Step step) noexcept;
#else
inline void stamp(Step) noexcept {}
#endif

}  // namespace uroce::transport::step_probe
