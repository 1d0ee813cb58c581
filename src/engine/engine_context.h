// One engine instance per device context (design §3, §5): its datagram
// transport (the private UDP port, the share of the host's RoCE port, and
// shared memory to engines on this host), a progress thread that receives
// packets and runs timers, and the table that routes packets to QPs. Posting
// threads transmit directly.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/fast_mutex.h"
#include "core/context.h"
#include "engine/board_watch.h"
#include "engine/engine_qp.h"
#include "engine/gsi_inbox.h"
#include "engine/live_counters.h"
#include "engine/mailboxes.h"
#include "engine/qp_table.h"
#include "engine/tombstones.h"
#include "transport/datagram.h"
#include "wire/headers.h"

namespace uroce::host {
class HostRegistry;
class HostDirectory;
class DirectPlacement;
}  // namespace uroce::host

namespace uroce::core {
class CompChannel;
}  // namespace uroce::core

namespace uroce::engine {

class TxBatch;
class ProgressPolicy;

class EngineContext : public core::Context {
 public:
  // Opens the transport and starts the progress thread; nullptr + errno on failure.
  static EngineContext* open(core::Device* dev);
  // For tests: an engine over a given transport, without a progress thread.
  // `publish`: counters in a file for `uroce stats` (live_counters.h).
  static EngineContext* open_with(core::Device* dev, std::unique_ptr<transport::DatagramTransport> t, bool start_thread,
                                  bool publish = false);
  void close();  // stops the thread and deletes this

  transport::DatagramTransport& transport() { return *transport_; }
  // This engine's slot in the host registry (host/host_registry.h), or null when
  // it has none (tests, or no registry on this host): QP numbers are then
  // random and nothing is relayed.
  host::HostRegistry* host_registry() { return registry_.get(); }
  // Gives the engine its slot (open(), or tests before any QP exists).
  void attach_host_registry(std::unique_ptr<host::HostRegistry> r);
  // Same-host direct placement (host/direct_placement.h), or null when off.
  host::DirectPlacement* placement() { return placement_.get(); }
  // Starts it (open(), or tests with a registry attached and no MR yet); false + errno if it cannot.
  bool start_placement();

 private:
  std::unique_ptr<LiveCounters> live_;  // before `stats`, which lives in it

 public:
  // Port counters, readable at any time (relaxed atomics), also by `uroce
  // stats` from another process (live_counters.h).
  Stats& stats;
  LiveCounters& live() { return *live_; }

  // QP1's MADs for this process's connection manager, received in the
  // current burst (gsi.h; under the receive turn).
  GsiInbox gsi_inbox;

  // QP numbers and routing.
  uint32_t allocate_qp_num();
  // Where to send to `dest_qpn` at `dst`: when `dst` is this host's RoCE port
  // (a peer that knows only GID + QPN, e.g. UCX with dlid 0) and the QPN's
  // slot has a live owner, that engine's private port, so the packets take
  // the same-host path instead of the 4791 socket and a relay hop; else `dst`.
  transport::Endpoint direct_endpoint(transport::Endpoint dst, uint32_t dest_qpn);
  void register_qp(EngineQp* qp);
  void unregister_qp(EngineQp* qp);  // waits until the progress thread no longer uses it
  // ibv_destroy_qp: unregistered, then remembered by a tombstone (tombstones.h), which
  // reads the QP's counters before they are given back.
  void retire_qp(EngineQp* qp);
  // UD multicast (ibv_attach_mcast): packets for QPN 0xFFFFFF reach every
  // UD QP attached to their IPv4 group (QpTable::attach_mcast: the rules and
  // errors).
  static constexpr uint32_t kMulticastQpn = 0xFFFFFF;
  int attach_mcast(EngineQp* qp, uint32_t group) { return qps_.attach_mcast(qp, group); }
  int detach_mcast(EngineQp* qp, uint32_t group) { return qps_.detach_mcast(qp, group); }
  // Keeps answering duplicates for a destroyed connected QP (tombstones.h; retire_qp).
  void add_tombstone(const EngineQp& qp) { tombstones_.add(qp); }

  // XRC SRQ numbers: (UDP port << 8) | index (xrc_target.h). register returns
  // the number, or 0 when the context has kXrcSrqsPerContext already.
  uint32_t register_xrc_srq(core::Srq* srq) { return qps_.register_xrc_srq(srq, lid()); }
  // Waits until the progress thread no longer uses it.
  void unregister_xrc_srq(core::Srq* srq) { qps_.unregister_xrc_srq(srq); }
  // The XRC SRQ `srq_num` of this context, or null (progress thread, in a burst).
  core::Srq* find_xrc_srq(uint32_t srq_num) { return qps_.find_xrc_srq(srq_num, lid()); }
  // Runs relayed requests for other processes' target QPs (progress thread only).
  EngineQp& relay_proxy();
  // XRC target QPs whose creator's handle was destroyed while other handles
  // (ibv_open_qp) remain: kept registered and answering until no live process
  // holds a handle, then reclaimed by the progress thread (or at close).
  void keep_xrc_target(EngineQp* qp);
  // ibv_open_qp handles of this context (`open` false: destroyed), dropped
  // at close as the kernel closes a context's objects.
  void track_xrc_handle(EngineQp* handle, bool open);

  // Who holds the receive turn: the progress thread, or an application
  // thread polling a CQ (whose RC ACKs may wait for its next post, below).
  enum class Turn { kProgress, kApplication };
  // Receive path: one burst of datagrams (the thread holding the receive
  // turn, or tests); `now`, the turn's clock reading, dates the ACKs it
  // defers (responses read the clock each: completer_receive).
  // (`now` unset: the clock is read only if something needs it, a deferred
  // ACK or a congestion mark: ~30 ns a read, on a same-host one-way's path.)
  // `board_moved`: the same-host ACK board moved this turn (board_watch.h).
  void process_burst(std::span<transport::RxDatagram> burst, Turn turn = Turn::kProgress, Clock::time_point now = {},
                     bool board_moved = false);
  // The RC QPs whose same-host ACKs this context reads from its board.
  BoardWatch& board_watch() { return board_watch_; }
  // The RC QPs whose same-host mailboxes this context reads (mailboxes.h).
  Mailboxes& mailboxes() { return mailboxes_; }
  // Runs every QP's timers; true if some timer is still armed.
  bool run_timers(Clock::time_point now);

  // For a thread polling a CQ of this context and finding it empty: takes the
  // receive turn if no other thread has it, receives and processes what has
  // arrived. Returns false if the turn was taken (the caller may yield).
  // So a polling application receives its packets itself, with no hand-off
  // to the progress thread (docs/architecture.md, "Who receives").
  bool poll_receive();
  // Reliable QPs of this context with requests not yet acknowledged. They
  // share one window of unacknowledged packets (requester.cc): eight QPs
  // streaming at once must not queue eight windows at the receiver, whose
  // ACKs would then come later than the tail-loss probe.
  uint32_t senders() const { return senders_.load(std::memory_order_relaxed); }
  // Counts the QP in or out of senders() (caller holds qp.mu).
  void count_sender(EngineQp& qp, bool sending);
  // A QP posts a large WRITE now: how many QPs of this context (this one
  // included, up to kTrackedWriters) posted one within kRecentWriter. It
  // does not depend on how they were sent (requester.cc, streams_as_jumbo).
  unsigned note_large_write(uint32_t qpn, Clock::time_point now);
  static constexpr unsigned kTrackedWriters = 8;
  static constexpr Clock::duration kRecentWriter = std::chrono::milliseconds(1);
  // An application thread is in a verb (posting, polling): it is likely to
  // poll again soon (see poller_active). Any thread, relaxed.
  void note_poller(Clock::time_point now = Clock::now()) {
    poll_stamp_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  }
  // Whether an application thread is polling a CQ of this context now (it
  // called poll_receive within kPollerFresh): it then receives for itself.
  // Not while a CQ is armed with a channel: a thread waits for its event,
  // and the datagram that completes it must not wait through a nap (a thread
  // arms, polls once more and posts, which stamps, then blocks in
  // ibv_get_cq_event or poll(2): ibv_rc_pingpong -e, rping).
  // A thread that spins in ibv_get_cq_event (event_spin) is a poller.
  bool poller_active(Clock::time_point now) const {
    if (event_spinners_.load(std::memory_order_relaxed) != 0) return true;
    return armed_cqs.load(std::memory_order_relaxed) == 0 &&
           now.time_since_epoch().count() - poll_stamp_.load(std::memory_order_relaxed) < kPollerFresh.count();
  }
  // An application thread about to block for an event of `channel`
  // receives for itself until one is queued or for `spin`, whichever comes
  // first (verbs/cq_verbs.cc): an event that a datagram raises then costs no
  // wake-up of the progress thread and then of the application. The
  // progress thread naps meanwhile and is woken when the spin ends.
  void event_spin(const core::CompChannel& channel, Clock::duration spin);
  static constexpr Clock::duration kPollerFresh = std::chrono::microseconds(50);
  // The application is about to wait without polling (ibv_req_notify_cq):
  // the progress thread watches the sockets again at once.
  void poller_leaves() {
    poll_stamp_.store(0);
    if (napping_.load()) transport_->wake();
  }
  // Sends the ACKs that application turns left waiting (deferred_acks_);
  // with `older_than`, only if the oldest has waited that long. Caller holds
  // rx_mu_.
  void flush_deferred_acks(Clock::duration older_than = Clock::duration::zero());
  // The same from any thread not in a receive turn (close, exit): skipped if
  // another thread has the turn (it sends them), unless `wait_for_turn`
  // (a CM message must not overtake them: gsi.h).
  void send_deferred_acks_now(bool wait_for_turn = false);
  // A timer was armed (posting or receiving thread): wakes the progress
  // thread if it sleeps without a deadline.
  void timer_armed() {
    if (deep_sleep_.load() && deep_sleep_.exchange(false)) transport_->wake();
  }
  // Sends the next slice of every QP's pending READ responses; true while
  // some remain (progress thread, or tests).
  bool send_reads();
  // Waits (bounded) until the progress thread has processed every datagram
  // that had arrived when this was called. For a QP about to be moved to ERR
  // by its application (a disconnect): requests already received are
  // answered, and messages already delivered are acknowledged, first.
  void drain_received();
  size_t tombstone_count() { return tombstones_.count(); }
  bool tombstones_quiet(Clock::time_point now) { return tombstones_.quiet(now); }  // a close stops lingering

  static EngineContext* from(ibv_context* c) { return static_cast<EngineContext*>(core::Context::from(c)); }

  // core::Context::query_port plus the port's counters: qkey_viol_cntr is
  // the UD packets dropped for a wrong Q_Key (16 bits, saturating, as IBA's
  // PortInfo:QKeyViolations).
  int query_port(uint8_t port, ibv_port_attr* attr) const;

 private:
  EngineContext(core::Device* dev, std::unique_ptr<transport::DatagramTransport> t, bool publish);
  ~EngineContext();
  void progress_loop();
  void nap_for_poller();
  void sleep_on_sockets(const ProgressPolicy& policy);
  void end_drain(uint64_t target);  // drain requests up to `target` are answered
  void withdraw_qp(EngineQp* qp);   // unregister_qp and retire_qp, but the counters
  static std::unique_ptr<transport::DatagramTransport> with_capture(std::unique_ptr<transport::DatagramTransport> t);
  static std::unique_ptr<transport::DatagramTransport> with_same_host_path(
      std::unique_ptr<transport::DatagramTransport> t, host::HostRegistry& registry,
      std::unique_ptr<host::HostDirectory>* out);
  // One receive turn (caller holds rx_mu_), begun at `now` (unset: read if
  // the burst needs it, process_burst): a burst, then READ responses. True
  // if more is ready to receive or send at once.
  bool receive_turn(size_t* received, Turn turn, Clock::time_point now = {});
  size_t take_mail();  // the receive turn's look at the mailboxes
  static constexpr unsigned kMailTurns = 4;
  bool any_timer_armed();
  // A burst being dispatched: this thread's batch (every answer goes into
  // it), the turn's clock reading, and the bytes of the packets QPs took.
  struct RxBurst {
    TxBatch& tx;
    Clock::time_point now_at{};  // unset until now() first reads the clock
    bool board_moved = false;    // the same-host ACK board moved this turn (board_watch.h)
    uint64_t bytes = 0;
    Clock::time_point now() {
      if (now_at == Clock::time_point{}) now_at = Clock::now();
      return now_at;
    }
  };
  // One datagram of a burst; the QPs it leaves work for join touched_.
  void dispatch(transport::RxDatagram& d, RxBurst& burst);
  void receive_packet(transport::RxDatagram& d, RxBurst& burst);
  void deliver_to_qp(EngineQp& qp, const transport::RxDatagram& d, const wire::PacketView& pkt, RxBurst& burst);
  void note_responder_work(EngineQp& qp);
  void receive_cnp(const transport::RxDatagram& d, const wire::PacketView& pkt);
  bool ours_or_relayed(const transport::RxDatagram& d, TxBatch& tx);
  static void count(std::atomic<uint64_t>& counter) { counter.fetch_add(1, std::memory_order_relaxed); }
  // The end of a burst, or of its part before a CM message: ACKs, then the
  // receive completions of the QPs it touched.
  void settle_burst(RxBurst& burst, Turn turn);
  void defer_ack(EngineQp& qp, RxBurst& burst);
  static void release_touched(EngineQp& qp);
  bool jumbo_ok(const wire::PacketView& pkt) const;
  bool bare_ok(const wire::PacketView& pkt) const;
  void print_stats() const;

  // Declared before the transport, which uses them until it is destroyed.
  std::unique_ptr<host::HostRegistry> registry_;
  std::unique_ptr<host::HostDirectory> shm_directory_;
  std::unique_ptr<host::DirectPlacement> placement_;  // uses registry_; the MR table's observer
  std::unique_ptr<transport::DatagramTransport> transport_;
  QpTable qps_;              // its lock also guards reading_ and deferred_acks_ (qp_table.h)
  BoardWatch board_watch_;   // its watched list: as reading_'s
  Mailboxes mailboxes_;      // its list: as reading_'s
  unsigned mail_turns_ = 0;  // turns in a row that took mail and skipped the rings (receive_turn; rx_mu_)
  void deliver_multicast(transport::RxDatagram& d, const wire::PacketView& pkt, RxBurst& burst);
  Tombstones tombstones_;
  // Kept XRC targets and opened handles (guarded by xrc_mu_).
  std::mutex xrc_mu_;
  std::vector<EngineQp*> xrc_kept_;
  std::vector<EngineQp*> xrc_opened_;
  std::atomic<bool> have_kept_xrc_{false};  // the progress thread keeps ticking to reclaim them
  void reclaim_xrc_targets(bool all);
  void close_xrc_handles();
  void linger();
  std::vector<EngineQp*> reading_;  // QPs with READ responses to send; progress thread, under qps_.mu()
  // reading_.size() and deferred_acks_.size() as of their last change, so
  // that a receive turn with nothing to send skips qps_.mu() (an empty poll
  // took it twice). Every entry is added under rx_mu_, which the turn holds,
  // so a zero it reads is current; only unregister_qp removes entries
  // without rx_mu_, and a count it leaves stale costs one lock.
  std::atomic<size_t> reading_count_{0};
  std::atomic<size_t> deferred_ack_count_{0};
  std::mutex drain_mu_;
  std::condition_variable drain_cv_;
  uint64_t drain_requested_ = 0;  // guarded by drain_mu_
  uint64_t drain_done_ = 0;       // guarded by drain_mu_
  Clock::time_point next_prune_{};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // The receive turn: one thread at a time receives from the transport and
  // runs the receive path (the progress thread or a CQ poller). Guards the
  // transport's receiving side, rx_, touched_ and reading_'s growth.
  base::FastMutex rx_mu_;
  std::vector<transport::RxDatagram> rx_;
  // Set (seq_cst) by the progress thread before it sleeps with no deadline,
  // after which it re-checks the timers; whoever arms a timer then wakes it.
  std::atomic<bool> deep_sleep_{false};
  std::vector<EngineQp*> touched_;  // under rx_mu_
  // RC QPs whose ACK an application turn left for the application's next
  // post on the QP to carry (requester_run sends it first), or for the next
  // turn: see process_burst. Under rx_mu_ and qps_.mu() (shared); each QP's
  // in_ack_list says it is here.
  std::vector<EngineQp*> deferred_acks_;
  Clock::time_point acks_deferred_at_{};  // when the oldest entry was added
  // Clock::now() of the last poll_receive, in ticks (any thread, relaxed).
  std::atomic<Clock::rep> poll_stamp_{0};
  // Empty polls counted to stamp every kStampEvery-th (poll_receive); a
  // count, not a guard: threads polling at once may each miss the others'.
  std::atomic<unsigned> polls_{0};
  static constexpr unsigned kStampEvery = 8;
  std::atomic<uint32_t> senders_{0};
  struct LargeWriter {
    uint32_t qpn = 0;
    Clock::time_point at{};
  };
  std::mutex large_writers_mu_;  // guards large_writers_
  std::array<LargeWriter, kTrackedWriters> large_writers_{};
  // Set (seq_cst) by the progress thread before it naps in poller mode, after
  // which it looks at poll_stamp_ again: poller_leaves then wakes it.
  std::atomic<bool> napping_{false};
  std::atomic<int> event_spinners_{0};  // threads in event_spin
  std::unique_ptr<EngineQp> relay_proxy_;
};

}  // namespace uroce::engine
