// Fault injection for every datagram a process sends (design §5): loss,
// duplication, reordering (with extra delay), corruption, and a slow link
// (a rate with a bounded queue: a slower peer or a congested port) — seeded
// and reproducible, configured by UROCE_FAULT, so any program, prebuilt ones
// included, can be run over a bad network.
//
// FaultyTransport decorates another DatagramTransport. Datagrams it must
// alter or hold are copied first: the originals point into application
// memory, which is never modified.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "transport/datagram.h"

namespace uroce::transport {

struct FaultSpec {
  double loss = 0;
  double dup = 0;
  double reorder = 0;
  double corrupt = 0;
  uint32_t delay_us = 200;  // how long a reordered datagram is held back
  // A slow link: rate_mbit Mbit/s (0: unlimited) and latency_us of one-way
  // delay (0: none). Datagrams leave in order, each when the link has carried
  // the ones before it, latency_us later; one that finds queue_kb KiB not yet
  // carried is dropped (counted as overflowed), as at a switch port. What is
  // on the path (latency_us) takes no queue space.
  uint32_t rate_mbit = 0;
  uint32_t latency_us = 0;
  uint32_t queue_kb = 1024;
  uint64_t seed = 1;

  bool slow_link() const { return rate_mbit > 0 || latency_us > 0; }
  // Whether a fault acts on each packet (all but latency alone, which delays a
  // GSO message as a whole: a long path does not change how the sender batches).
  bool per_packet() const { return loss > 0 || dup > 0 || reorder > 0 || corrupt > 0 || rate_mbit > 0; }
  bool any() const { return loss > 0 || dup > 0 || reorder > 0 || corrupt > 0 || slow_link(); }
  // Parses "loss=0.05,dup=0.01,reorder=0.05,corrupt=0.02,delay_us=500,
  // rate_mbit=400,latency_us=5000,queue_kb=512,seed=7" (probabilities in [0, 1]; the others
  // whole decimal numbers, taken exactly); nullopt (with a message in *error)
  // on a malformed spec.
  static std::optional<FaultSpec> parse(const std::string& text, std::string* error);
};

struct FaultCounters {
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> lost{0};
  std::atomic<uint64_t> duplicated{0};
  std::atomic<uint64_t> reordered{0};
  std::atomic<uint64_t> corrupted{0};
  std::atomic<uint64_t> overflowed{0};  // dropped at the slow link's full queue
};

class FaultyTransport final : public DatagramTransport {
 public:
  FaultyTransport(std::unique_ptr<DatagramTransport> inner, const FaultSpec& spec);

  size_t send_burst(std::span<TxDatagram> burst) noexcept override;
  size_t recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept override;
  void wake() noexcept override { inner_->wake(); }
  void wait(int timeout_ms) noexcept override;
  uint16_t local_port() const noexcept override { return inner_->local_port(); }
  uint16_t host_port() const noexcept override { return inner_->host_port(); }
  DatagramTransport* decorated() noexcept override { return inner_.get(); }
  // No GSO: faults apply to single packets (every datagram sent is one).
  bool gro() const noexcept override { return inner_->gro(); }
  // GSO messages only where no fault acts on single packets.
  unsigned max_gso_segments() const noexcept override { return spec_.per_packet() ? 1 : inner_->max_gso_segments(); }
  bool more_ready() const noexcept override { return inner_->more_ready(); }

  const FaultCounters& counters() const { return counters_; }
  const FaultSpec& spec() const { return spec_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Copy {
    Endpoint dst;
    IpAddress src_ip;
    std::vector<uint8_t> bytes;
    Clock::time_point due;
    uint16_t segment_size = 0;  // a GSO message's (latency alone: see FaultSpec::per_packet)
  };
  // What befalls one datagram, drawn in this order from the seeded stream.
  struct Fate {
    bool lost, corrupt, dup, reorder;
  };
  // The datagrams that leave now, in the burst's order, and the copies they
  // point into (reserved up front so that the pointers stay valid).
  struct Outgoing {
    explicit Outgoing(size_t burst);
    void send_copy(Copy&& c);
    std::vector<TxDatagram> out;
    std::vector<Copy> copies;
    std::vector<iovec> copy_iov;
  };
  static uint64_t mix64(uint64_t z);
  double next_uniform();  // caller holds mu_
  Fate draw_fate();       // caller holds mu_
  // `d` through the slow link, in order (a reordered datagram holds back the
  // ones behind it too). Caller holds mu_.
  void inject_slow_link(const TxDatagram& d, Fate f, Clock::time_point now);
  // `d` straight to the inner transport: a corrupted datagram in its own place,
  // a duplicate right behind its original; only `reorder` moves one. Caller holds mu_.
  void inject_direct(TxDatagram& d, Fate f, Clock::time_point now, Outgoing& o);
  Copy copy_of(const TxDatagram& d) const;
  void flip_bit(Copy& c);  // caller holds mu_
  // The datagram that sends `c` through `*iov` (both must outlive the send).
  static TxDatagram datagram_of(Copy& c, iovec* iov);
  void release_due(Clock::time_point now);  // caller holds mu_
  // A reordered datagram: due delay_us from now, counted. Caller holds mu_.
  void hold_back(Copy& c, Clock::time_point now);
  // Keeps `c` in held_ until it is due. Caller holds mu_.
  void hold(Copy&& c);
  // Queues `c` behind the slow link, or drops it (counted as overflowed) when
  // the link's queue is full. Caller holds mu_.
  void enter_link(Copy&& c, Clock::time_point now);
  // What the slow link still has to carry at `now` (its queue), in bytes.
  size_t bytes_waiting_for_link(Clock::time_point now) const;
  int timeout_for_held(int timeout_ms) const;  // caller holds mu_
  void send_copies(std::vector<Copy>& copies);

  std::unique_ptr<DatagramTransport> inner_;
  FaultSpec spec_;
  FaultCounters counters_;
  std::mutex mu_;
  uint64_t rng_;
  std::deque<Copy> held_;
  Clock::time_point link_free_{};  // when the slow link has carried what it holds
};

}  // namespace uroce::transport
