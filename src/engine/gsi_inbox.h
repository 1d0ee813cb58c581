// QP1's MADs for this process's connection manager, as the engine holds
// them during a burst (gsi.h: their routing and order). Apart from gsi.h so
// that EngineContext, which keeps the inbox, does not include gsi.h, whose
// functions take the context.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "transport/datagram.h"

namespace uroce::engine {

inline constexpr size_t kMadBytes = 256;

// A MAD received on QP1.
struct GsiMad {
  transport::Endpoint src;      // the sender's address and UDP port
  transport::IpAddress dst_ip;  // the address it was sent to
  uint32_t src_qpn = 0;
  std::array<uint8_t, kMadBytes> mad{};
};

// The MADs for the sink received in the current burst (under the engine's
// receive turn), delivered in their place in it: nothing is allocated per MAD.
class GsiInbox {
 public:
  static constexpr size_t kMax = 32;  // per burst; beyond, dropped and counted (the CM retries)
  // False when full or when the process has no sink.
  bool push(const GsiMad& m);
  bool pending() const { return count_ != 0; }
  void deliver();  // to the sink (set_gsi_sink), then empty

 private:
  std::array<GsiMad, kMax> mads_{};
  size_t count_ = 0;
};

}  // namespace uroce::engine
