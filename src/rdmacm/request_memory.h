// What the passive side of a connection over QP1 answered, remembered after
// its id is destroyed, so that a copy of the REQ (or SIDR_REQ) that comes
// later is answered again instead of taken for a new request.
//
// The peer's CM resends its request every 0.5 s or more until the answer
// comes (cm_gsi.cc): a copy sent just before our REJ arrived, or held up in
// a loaded host, reached a listener whose new id was already rejected and
// destroyed, and became a second CONNECT_REQUEST for a connection the
// application had already refused (rdmacm.ipv6_dual_listener over QP1 under
// load: the server took the IPv4 client's copy for the IPv6 request it
// waited for). The kernel's CM keeps a connection's communication ID in its
// remote ID table while the connection is in time-wait, and cm_match_req
// answers a REQ that matches one there (cm_dup_req_handler): REJ "stale
// connection" (IBA table 112, reason 10) in time-wait. uroce keeps the last
// answer: the REJ or SIDR_REP it sent, else that REJ "stale connection".
// Entries are found by the peer's communication ID and address, as live ids
// are (answer_duplicate), and live for kKeepMs: longer than the peer's
// longest resend interval (kMaxResendMs), so that even a copy sent after a
// lost answer finds it.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

#include "rdmacm/cm_messages.h"
#include "transport/datagram.h"

namespace uroce::rdmacm {

class RequestMemory {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kKeepMs = 8000;
  static constexpr size_t kMax = 4096;  // beyond, the oldest is forgotten

  void remember(uint32_t remote_comm_id, const transport::IpAddress& peer, const Mad& answer, Clock::time_point now) {
    forget_expired(now);
    if (entries_.size() == kMax) entries_.pop_front();
    entries_.push_back(Entry{remote_comm_id, peer.bytes, answer, now + std::chrono::milliseconds(kKeepMs)});
  }

  // The answer to a request from `peer` naming `remote_comm_id` as its own.
  std::optional<Mad> find(uint32_t remote_comm_id, const transport::IpAddress& peer, Clock::time_point now) {
    forget_expired(now);
    for (const Entry& e : entries_)
      if (e.remote_comm_id == remote_comm_id && e.peer == peer.bytes) return e.answer;
    return std::nullopt;
  }

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    uint32_t remote_comm_id;
    std::array<uint8_t, 16> peer;
    Mad answer;
    Clock::time_point until;
  };

  void forget_expired(Clock::time_point now) {
    while (!entries_.empty() && entries_.front().until <= now) entries_.pop_front();
  }

  std::deque<Entry> entries_;  // in the order remembered: the oldest expires first
};

// What the kernel's CM answers a copy of a REQ whose connection is in
// time-wait (cm_dup_req_handler: REJ "stale connection", the message
// rejected "other").
inline Mad stale_connection_rej(uint64_t tid, uint32_t local_comm_id, uint32_t remote_comm_id) {
  RejMessage rej;
  rej.local_comm_id = local_comm_id;
  rej.remote_comm_id = remote_comm_id;
  rej.message_rejected = RejectedMessage::kOther;
  rej.reason = uint16_t(RejReason::kStaleConnection);
  return encode_mad(tid, rej);
}

}  // namespace uroce::rdmacm
