// The same-host path (design §3): datagrams between two transports of one
// host go through shared memory instead of the kernel's UDP stack.
//
// ShmTransport decorates the UDP transport. Each one owns an inbound segment
// (a /dev/shm file) holding one ShmRing per possible sender; a sender that
// sends to a local address and to the private port of a live transport of
// the host (asked of a ShmDirectory, which the engine answers from the host
// registry) pushes the datagram into its own ring of the receiver's segment.
// Everything else — other hosts, the host port 4791, a peer without a
// segment — goes to the inner transport. The datagrams are the same RoCE
// packets, ICRC included, so the engine above does not know which way a
// packet came (captures on an interface do not see this path: UROCE_SHM=0).
//
// Receiving copies each record out of shared memory before the engine sees
// it, so a peer that rewrites a record while it is being parsed cannot make
// a checked header differ from the one used. A full ring is waited on
// briefly (50 us), then the datagram is dropped, as on a congested network.
//
// Jumbo packets (send_jumbo): the requester's bulk path. One record carries
// a RoCE packet of up to kJumboBytes of payload, copied once from the
// sender's registered memory into the ring; the receiver hands it to the
// engine in place (no copy out) and frees it at its next receive, so the
// payload crosses memory twice in all (libfabric's shm provider moves large
// messages the same way). No ICRC: both ends are processes of one user on one
// host. A receiver that took a jumbo record keeps looking at its rings for
// kJumboLinger before it blocks (a stream finds it awake).
//
// Waking: a receiver about to block sets its segment's waiting word; a
// sender that pushed and takes that word sends a one-byte doorbell datagram
// (Envelope::kDoorbell, envelope.h) to the receiver's private port, which the
// receiver swallows. The thread that swallows it may be another one than the
// sleeper (the engine's progress thread waits without the receive turn, a CQ
// poller receives meanwhile): that one passes the wake-up on (wake()).
//
// The sockets beside the rings: while the rings deliver and the socket does
// not, a poller asks the socket only every kInnerQuietGap (a system call per
// ask would hold records up); a thread napping meanwhile (nap(), the engine's
// progress thread in poller mode) watches the sockets instead and tells the
// poller to ask when one has datagrams (inner_due_).
//
// Mailboxes (own_mailbox, peer_mailbox): after the board, a segment holds
// kMailboxes pages, one per QP number's low 16 bits, whose pages are
// allocated when the receiver opens one (engine/mailbox.h says what they
// hold). A sender that wrote one counts the segment's mail generation up
// (seq_cst) and wakes a receiver about to block (notify_mailbox), which
// wait() does not do while the generation moved unseen.
//
// The board (post_board): besides its rings, a segment holds kBoardCells
// words that its senders write and its receiver reads, one per cell, each the
// latest of a monotonic value (the engine keeps a same-host ACK there:
// engine/ack_board.h). A sender stores the word (release), counts the
// segment's board generation up (seq_cst) and wakes a receiver about to block,
// as a push does; the receiver asks whether the generation moved
// (take_board_change) before it reads the words it cares about, and wait()
// does not block while it has moved unseen. A cell's word is whatever its
// last writer stored: the reader checks it as it would a packet.
//
// Threads: send_burst is thread-safe (one mutex per outbound ring); one
// thread at a time receives (the engine's receive turn); one thread at a time
// waits (the progress thread), also while another receives.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/fast_mutex.h"
#include "transport/datagram.h"
#include "transport/local_addresses.h"
#include "transport/shm_ring.h"

namespace uroce::transport {

// Who the transports of this host are (implemented above the transport).
class ShmDirectory {
 public:
  virtual ~ShmDirectory() = default;
  // The segment of the live transport whose private port is `port` and the
  // ring index this transport sends into, or false when there is none.
  virtual bool lookup(uint16_t port, std::string* segment, unsigned* ring) noexcept = 0;
};

class ShmTransport final : public DatagramTransport {
 public:
  static constexpr unsigned kRings = 256;              // ring i: from the sender with index i
  static constexpr size_t kRingBytes = 4u << 20;       // per sender, allocated when it first sends
  static constexpr uint32_t kJumboBytes = 256u << 10;  // payload of one jumbo packet, at most
  static constexpr uint16_t kJumboRecord = 1;          // ShmRing::Meta::flags: a jumbo packet
  static constexpr uint16_t kBareRecord = 2;           // ShmRing::Meta::flags: a packet without ICRC
  static constexpr auto kJumboLinger = std::chrono::microseconds(50);
  static constexpr uint32_t kBoardCells = 1u << 16;  // the board's words, 8 bytes each

  // Creates the inbound segment `segment` (a path under /dev/shm) and wraps
  // `inner`; nullptr + errno when the segment cannot be made (the caller
  // then keeps `inner`, which is given back through *inner_back).
  static std::unique_ptr<ShmTransport> open(std::unique_ptr<DatagramTransport> inner, std::string segment,
                                            ShmDirectory* directory, std::unique_ptr<DatagramTransport>* inner_back);
  ~ShmTransport() override;  // unlinks the segment

  size_t send_burst(std::span<TxDatagram> burst) noexcept override;
  JumboSend send_jumbo(const Endpoint& dst, const IpAddress& src_ip, const iovec* iov,
                       unsigned iovcnt) noexcept override;
  uint32_t jumbo_limit(const Endpoint& dst) noexcept override;
  bool through_memory(const Endpoint& dst) noexcept override;
  bool reserve_bare(const Endpoint& dst, const IpAddress& src_ip, uint32_t len, BareSlot& slot) noexcept override;
  void commit_bare(BareSlot& slot) noexcept override;
  void abandon_bare(BareSlot& slot) noexcept override;
  bool post_board(const Endpoint& dst, uint32_t cell, uint64_t word) noexcept override;
  uint8_t* own_mailbox(uint32_t cell) noexcept override;
  bool peer_mailbox(const Endpoint& dst, uint32_t cell, PeerMailbox* out) noexcept override;
  void notify_mailbox(const PeerMailbox& m) noexcept override;
  void release_mailbox(uint32_t cell) noexcept override;
  uint64_t mail_generation() const noexcept override;
  size_t recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept override;
  // Receiver (the receive turn's holder): whether a sender wrote the board
  // since the last call that said so; then the word of `cell` (acquire), which
  // clear_board zeroes (the cell's next user starts from nothing).
  bool take_board_change() noexcept;
  uint64_t board_word(uint32_t cell) const noexcept;
  void clear_board(uint32_t cell) noexcept;
  // Byte offset of sender `index`'s ring in a segment (tests scribble on it).
  static size_t ring_offset(unsigned index) noexcept;
  void wake() noexcept override { inner_->wake(); }
  void wait(int timeout_ms) noexcept override;
  void nap(int timeout_us) noexcept override;
  // Whether the next receive asks the socket whatever its schedule: a wait
  // ended, or a nap saw the socket readable, since it was last asked.
  bool socket_due() const noexcept { return inner_due_.load(std::memory_order_relaxed); }
  uint16_t local_port() const noexcept override { return inner_->local_port(); }
  uint16_t host_port() const noexcept override { return inner_->host_port(); }
  unsigned max_gso_segments() const noexcept override { return inner_->max_gso_segments(); }
  bool gro() const noexcept override { return inner_->gro(); }
  DatagramTransport* decorated() noexcept override { return inner_.get(); }
  bool more_ready() const noexcept override {
    return rings_ready_.load(std::memory_order_relaxed) || inner_->more_ready();
  }

  uint64_t shm_sent() const { return sent_->load(std::memory_order_relaxed); }
  uint64_t shm_received() const { return received_->load(std::memory_order_relaxed); }
  uint64_t full_drops() const { return full_drops_->load(std::memory_order_relaxed); }
  uint64_t jumbo_sent() const { return jumbo_sent_.load(std::memory_order_relaxed); }
  // Bare datagrams (TxDatagram::bare) dropped for want of a ring to their destination.
  uint64_t bare_drops() const { return bare_drops_.load(std::memory_order_relaxed); }
  // Words this transport wrote into its peers' boards.
  uint64_t board_posts() const { return board_posts_.load(std::memory_order_relaxed); }
  // Counts into the caller's counters from now on (e.g. ones in shared
  // memory; set before any traffic, they must outlive this transport).
  // `received` must have no other writer (the receive adds to it unlocked).
  void count_into(std::atomic<uint64_t>& sent, std::atomic<uint64_t>& received,
                  std::atomic<uint64_t>& full_drops) noexcept {
    sent_ = &sent;
    received_ = &received;
    full_drops_ = &full_drops;
  }

  struct Mapping;  // a mapped segment (shm_transport.cc)

 private:
  struct Outbound {
    uint16_t key = 0;                  // the destination port it is kept for (set once)
    base::FastMutex mu;                // guards the ring's producer side and the mapping
    std::shared_ptr<Mapping> mapping;  // the receiver's segment, at least up to our ring's end
    void* map = nullptr;               // mapping's address
    ShmRing ring;
    unsigned index = 0;
    std::string segment;  // its path; re-looked-up every kRecheck
    // coarse_now() (shm_transport.cc) of the last look-up.
    std::chrono::nanoseconds checked = std::chrono::nanoseconds::min();
    // checked + kRecheck while the ring is valid, as last_ may return it.
    std::atomic<int64_t> fresh_until{0};
    // After a push timed out (a receiver that stopped reading, e.g. died),
    // pushes to a full ring fail at once until then.
    std::chrono::steady_clock::time_point stalled_until{};
    // Under mu: false once remapped away (the peer is gone).
    bool live() const { return map && ring.valid(); }
  };
  struct Segment;

  ShmTransport(std::unique_ptr<DatagramTransport> inner, std::string path, std::shared_ptr<Mapping> own,
               ShmDirectory* directory);
  Outbound* outbound_for(uint16_t port) noexcept;
  Outbound* look_up_locked(uint16_t port, std::chrono::nanoseconds now) noexcept;
  // The ring a datagram to `dst` goes into (null: it goes to the socket).
  Outbound* outbound_to(const Endpoint& dst) noexcept {
    return local_.contains(dst.ip) ? outbound_for(dst.port) : nullptr;
  }
  ShmRing::Meta meta_for(const Endpoint& dst, const IpAddress& src_ip, uint16_t flags) const noexcept;
  bool push_datagram(Outbound& o, const TxDatagram& d, uint16_t flags = 0) noexcept;
  void wake_if_waiting(Outbound& o) noexcept;  // after a push, under o.mu
  bool push_waiting(Outbound& o, const ShmRing::Meta& meta, const uint8_t* const* parts, const uint32_t* lens,
                    unsigned n, uint32_t align_at) noexcept;
  void ring_doorbell(uint16_t port) noexcept;
  size_t take_from_rings(std::span<RxDatagram> out) noexcept;
  bool board_polled() noexcept;  // recv_burst: whether the board moved since its last look
  // recv_burst's time: read on every kClockEvery-th receive, on the one after
  // two in a row found records (a stream's receives can take long), and after
  // a wait; else the last read. A ping-pong's receives, which find a record
  // or an ACK word between empty ones, read it once in kClockEvery.
  std::chrono::steady_clock::time_point poll_clock() noexcept;
  static constexpr unsigned kClockEvery = 8;
  bool rings_have_records() const noexcept;  // any thread: the shared words alone

  std::unique_ptr<DatagramTransport> inner_;
  std::string path_;
  std::shared_ptr<Mapping> own_;  // our inbound segment
  void* map_;
  Segment* segment_;
  ShmDirectory* directory_;
  LocalAddresses local_;
  // Outbound rings by destination port; the map's lock guards lookups and
  // insertions, each ring its own pushes.
  std::mutex out_mu_;
  std::unordered_map<uint16_t, std::unique_ptr<Outbound>> out_;
  std::atomic<Outbound*> last_{nullptr};  // outbound_for's latest ring (never freed before this)
  // Datagrams sent and received through the rings, and lost to a full ring.
  std::atomic<uint64_t> own_sent_{0}, own_received_{0}, own_full_drops_{0};
  std::atomic<uint64_t> jumbo_sent_{0};  // of the datagrams sent: jumbo packets
  std::atomic<uint64_t> bare_drops_{0};
  std::atomic<uint64_t> board_posts_{0};
  std::atomic<uint64_t>* sent_ = &own_sent_;
  std::atomic<uint64_t>* received_ = &own_received_;
  std::atomic<uint64_t>* full_drops_ = &own_full_drops_;
  // Receiver only.
  std::vector<ShmRing> in_;       // attached inbound rings, by sender index (invalid: not yet)
  std::vector<uint8_t> rx_copy_;  // records copied out, one slot each
  std::vector<unsigned> active_;  // sender indexes seen in the segment's bitmap
  std::vector<unsigned> held_;    // rings whose jumbo record the last receive returned in place (popped at the next)
  std::atomic<int64_t> jumbo_seen_ns_{0};                    // steady_clock time of the last jumbo record received
  std::atomic<bool> rings_ready_{false};                     // a ring had more than the last receive took
  std::atomic<bool> waiter_blocked_{false};                  // a thread is in wait()
  std::atomic<bool> inner_due_{false};                       // a wait ended since the socket was last asked
  std::atomic<uint64_t> board_seen_{0};                      // the board generation take_board_change last saw
  uint64_t mail_seen_ = 0;                                   // the mail generation wait() last saw (the waiter)
  uint64_t board_polled_ = 0;                                // and the one recv_burst last saw
  size_t rotate_ = 0;                                        // which active ring is read first (< active_.size())
  unsigned inner_skip_ = 0;                                  // receives since the inner transport was last asked
  unsigned clock_in_ = 0;                                    // receives until poll_clock reads
  unsigned found_in_a_row_ = 0;                              // receives that found records (poll_clock)
  std::chrono::steady_clock::time_point clock_{};            // poll_clock's last read
  std::chrono::steady_clock::time_point inner_asked_{};      // when it was last asked
  std::chrono::steady_clock::time_point rings_delivered_{};  // when the rings last had something
  // When the socket last had a datagram (steady_clock ticks): written by the
  // receive turn, read by it and by a napping thread (nap).
  std::atomic<int64_t> inner_delivered_{0};
  bool socket_active(std::chrono::steady_clock::time_point now) const noexcept;
};

}  // namespace uroce::transport
