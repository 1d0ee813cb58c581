// The DREPs this process sent lately, sent once more when it exits.
//
// A DREP is a connection's last message, and a process often exits right
// after it (rping, ucmatose: DISCONNECTED, rdma_disconnect, exit). If it is
// lost, the peer's CM resends its DREQ (the kernel's about every 4.3 s, 16
// times) and waits for a DREP that nobody sends once the process is gone: the
// kernel's CM answers from the kernel, where an id outlives its process
// (time-wait, then cm_issue_drep for an id it no longer knows), uroce's CM
// lives in the process. While the process runs, a resent DREQ is answered
// (cm_gsi.cc); at exit (CmService::abandon_at_exit) every DREP sent within
// kKeepMs goes once more. A second copy is harmless: a CM ignores a DREP for
// a connection in time-wait or gone (the kernel's cm_drep_handler counts it
// as a duplicate).
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>

#include "rdmacm/cm_messages.h"
#include "transport/datagram.h"

namespace uroce::rdmacm {

class RecentDreps {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kKeepMs = 5000;  // past the kernel's first DREQ resend (~4.3 s)
  static constexpr size_t kMax = 256;   // beyond, the oldest is forgotten

  struct Sent {
    transport::IpAddress local_ip;
    transport::Endpoint peer;
    Mad mad;
    Clock::time_point at;
  };

  void remember(const transport::IpAddress& local_ip, const transport::Endpoint& peer, const Mad& mad,
                Clock::time_point now) {
    forget_expired(now);
    if (sent_.size() == kMax) sent_.pop_front();
    sent_.push_back(Sent{local_ip, peer, mad, now});
  }

  // Calls `send(const Sent&)` for each DREP sent within kKeepMs of `now`, oldest first.
  template <class Send>
  void resend(Clock::time_point now, Send&& send) {
    forget_expired(now);
    for (const Sent& s : sent_) send(s);
  }

  size_t size() const { return sent_.size(); }

 private:
  void forget_expired(Clock::time_point now) {
    while (!sent_.empty() && sent_.front().at + std::chrono::milliseconds(kKeepMs) <= now) sent_.pop_front();
  }

  std::deque<Sent> sent_;  // in the order sent: the oldest expires first
};

}  // namespace uroce::rdmacm
