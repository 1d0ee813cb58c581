// The transport interface: moves bursts of datagrams, knows nothing of RDMA.
//
// A system call costs about a microsecond here, so every call moves a burst
// (sendmmsg/recvmmsg); there is no one-packet-per-call API. Where the kernel
// has them, UDP GSO and GRO make one datagram of the burst carry up to 64
// segments (segment = one RoCE packet, each a datagram of its own on the wire).
#pragma once

#include <sys/uio.h>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace uroce::transport {

// An IP address: IPv6, or IPv4 as an IPv4-mapped IPv6 address
// (::ffff:a.b.c.d, the form of a RoCEv2 GID), network byte order. `scope` is
// the interface index of a link-local IPv6 address (fe80::/10), which needs
// one to be reached; 0 otherwise. The default is IPv4 0.0.0.0 and an IPv4
// address (host byte order) converts implicitly, so IPv4 code reads as it did
// when addresses were 32-bit.
struct IpAddress {
  std::array<uint8_t, 16> bytes{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0, 0, 0};
  uint32_t scope = 0;

  constexpr IpAddress() = default;
  constexpr IpAddress(uint32_t ipv4) noexcept {  // NOLINT(google-explicit-constructor): see above
    bytes[12] = uint8_t(ipv4 >> 24);
    bytes[13] = uint8_t(ipv4 >> 16);
    bytes[14] = uint8_t(ipv4 >> 8);
    bytes[15] = uint8_t(ipv4);
  }
  // From 16 bytes in network order (a GID, sin6_addr); an IPv4-mapped one is
  // the IPv4 address. The scope is kept only for a link-local address.
  static constexpr IpAddress from_bytes(const uint8_t* b, uint32_t scope = 0) noexcept {
    IpAddress a;
    for (size_t i = 0; i < 16; ++i) a.bytes[i] = b[i];
    a.scope = a.link_local() ? scope : 0;
    return a;
  }
  constexpr bool is_v4() const noexcept {  // ::ffff:0:0/96 (two word compares: on every packet's path)
    constexpr uint64_t kMask = std::bit_cast<uint64_t>(std::array<uint8_t, 8>{0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0});
    constexpr uint64_t kMapped = std::bit_cast<uint64_t>(std::array<uint8_t, 8>{0, 0, 0xFF, 0xFF, 0, 0, 0, 0});
    auto w = words();
    return w[0] == 0 && (w[1] & kMask) == kMapped;
  }
  // The IPv4 address, host byte order (meaningful when is_v4()).
  constexpr uint32_t v4() const noexcept {
    return uint32_t(bytes[12]) << 24 | uint32_t(bytes[13]) << 16 | uint32_t(bytes[14]) << 8 | bytes[15];
  }
  constexpr bool link_local() const noexcept { return bytes[0] == 0xFE && (bytes[1] & 0xC0) == 0x80; }
  // 0.0.0.0 or ::, "any": a source the kernel chooses, a wildcard to bind.
  constexpr bool unspecified() const noexcept {
    auto w = words();
    return is_v4() ? v4() == 0 : (w[0] | w[1]) == 0;
  }
  // 127.0.0.0/8 or ::1.
  constexpr bool loopback() const noexcept {
    constexpr uint64_t kOne = std::bit_cast<uint64_t>(std::array<uint8_t, 8>{0, 0, 0, 0, 0, 0, 0, 1});
    auto w = words();
    return is_v4() ? bytes[12] == 127 : w[0] == 0 && w[1] == kOne;
  }
  // 224.0.0.0/4 or ff00::/8.
  constexpr bool multicast() const noexcept { return is_v4() ? (bytes[12] & 0xF0) == 0xE0 : bytes[0] == 0xFF; }
  friend constexpr bool operator==(const IpAddress& a, const IpAddress& b) noexcept {
    auto x = a.words(), y = b.words();
    return x[0] == y[0] && x[1] == y[1] && a.scope == b.scope;
  }

 private:
  constexpr std::array<uint64_t, 2> words() const noexcept { return std::bit_cast<std::array<uint64_t, 2>>(bytes); }
};

// An IP address and UDP port (host byte order).
struct Endpoint {
  IpAddress ip;
  uint16_t port = 0;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

// UDP GSO limits: segments per message (the kernel's UDP_MAX_SEGMENTS is 64
// on older kernels) and bytes per message (the largest IPv4 UDP payload; an
// IPv6 one may be 12 bytes longer, which uroce does not use).
inline constexpr unsigned kMaxGsoSegments = 64;
inline constexpr uint32_t kMaxGsoBytes = 65535 - 20 - 8;

// Buffers one packet (a GSO message's segment) is gathered from, at most:
// transports size their gather lists by it.
inline constexpr unsigned kMaxPacketPieces = 8;

// One datagram to send, gathered from `iovcnt` caller-owned buffers, which
// the transport reads before send_burst returns. With segment_size > 0 it is
// a GSO message: the kernel sends it as datagrams of segment_size bytes each
// (the last may be shorter), each gathered from at most kMaxPacketPieces
// buffers.
struct TxDatagram {
  Endpoint dst;
  IpAddress src_ip;  // unspecified: let the kernel choose
  uint16_t segment_size = 0;
  uint16_t iovcnt = 0;
  const iovec* iov = nullptr;
  // Built without its ICRC, for a peer on this host reached through shared
  // memory (engine::Delivery::icrc): only a same-host ring may carry it. A
  // transport that would put it on a socket instead (the peer's ring went
  // away since) drops it, and RC resends it, decided anew.
  bool bare = false;
};

// One received datagram; `data` points into the transport's receive buffers
// and stays valid until the next recv_burst call. gso_index: the datagram's
// place in the GRO batch it arrived in (0 when it came alone), which is the
// IP identification its sender gave it if the batch is a whole GSO message
// (wire/icrc.h).
struct RxDatagram {
  uint8_t* data = nullptr;
  uint32_t len = 0;
  Endpoint src;
  IpAddress dst_ip;
  uint16_t dst_port = 0;  // the UDP port it arrived at (0: the transport's local_port)
  bool truncated = false;
  // The IP header's ECN field said Congestion Experienced (RFC 3168): a queue
  // on the path marked it instead of dropping it (RoCEv2 annex A17.9).
  bool ce = false;
  uint8_t gso_index = 0;
  // A same-host jumbo packet (DatagramTransport::send_jumbo): it carries no
  // ICRC, may be longer than any MTU, and `data` points into memory shared
  // with the sender (which may still write to it: nothing read from it may
  // be trusted twice).
  bool jumbo = false;
  // A same-host packet sent bare (TxDatagram::bare): it carries no ICRC.
  bool bare = false;
};

// What became of a jumbo packet (DatagramTransport::send_jumbo).
enum class JumboSend : uint8_t {
  kNotLocal,  // the destination is not reached through shared memory: send MTU packets
  kSent,
  kDropped,  // the receiver's ring stayed full: lost as on a congested network
};

// Room for a bare datagram in a same-host ring, written in place
// (DatagramTransport::reserve_bare): `data` null when there is none.
struct BareSlot {
  uint8_t* data = nullptr;
  void* ring = nullptr;  // the transport's own: the ring, locked until commit_bare or abandon_bare
};

// Same-host mailboxes (engine/mailbox.h): a page per QP number's low 16 bits
// in a receiver's segment, which one sender QP writes and the receiver QP
// reads. A sender's view of one: its address, the segment it lies in (kept
// mapped by `keep` while the QP holds it) and the receiver's private port
// (for its doorbell).
inline constexpr size_t kMailboxBytes = 4096;
inline constexpr uint32_t kMailboxes = 1u << 16;
struct PeerMailbox {
  uint8_t* box = nullptr;
  void* segment = nullptr;
  uint16_t port = 0;
  std::shared_ptr<void> keep;
};

class DatagramTransport {
 public:
  virtual ~DatagramTransport() = default;

  // Sends as many of `burst` as the socket accepts now; returns how many were
  // handed to the network (datagrams the kernel refused count as sent and
  // lost, as on a real network). Thread-safe.
  virtual size_t send_burst(std::span<TxDatagram> burst) noexcept = 0;

  // Waits up to timeout_ms (-1: forever) for datagrams, returns how many were
  // stored in `out` (0 on timeout or wake()). Only one thread may receive.
  virtual size_t recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept = 0;

  // Makes a blocked recv_burst or wait return now. Thread-safe.
  virtual void wake() noexcept = 0;

  // Waits up to timeout_ms (-1: forever) until datagrams may be received or
  // wake() is called; returns at once when some are ready. Unlike a blocking
  // recv_burst it receives nothing, so the receiving may be left to another
  // thread (which takes the receiver's turn, see recv_burst). Thread-safe.
  virtual void wait(int timeout_ms) noexcept { (void)timeout_ms; }

  // Waits up to timeout_us for wake() alone: arriving datagrams do not end it
  // (for a receiver that leaves them to another thread polling this
  // transport). Decorators need not override it. Thread-safe.
  virtual void nap(int timeout_us) noexcept {
    if (DatagramTransport* inner = decorated()) inner->nap(timeout_us);
  }

  // Like nap, but also ends when a socket has datagrams to receive, and then
  // says so (true). For a transport whose poller asks its sockets only rarely
  // (ShmTransport): the napping thread is their watcher. Transports without
  // sockets nap and answer false. Thread-safe.
  virtual bool nap_or_readable(int timeout_us) noexcept {
    if (DatagramTransport* inner = decorated()) return inner->nap_or_readable(timeout_us);
    return false;
  }

  // Same-host bulk: sends `iov` as one jumbo packet — a RoCE packet whose
  // payload may span several path-MTU packets' worth (the receiver's
  // responder takes it as that many PSNs), with room for, but no, ICRC —
  // when `dst` is reached through shared memory; it is copied out of `iov`
  // before this returns. Transports without a shared-memory path (and
  // decorators, whose layer would not see it) answer kNotLocal. Thread-safe.
  virtual JumboSend send_jumbo(const Endpoint& dst, const IpAddress& src_ip, const iovec* iov,
                               unsigned iovcnt) noexcept {
    (void)dst, (void)src_ip, (void)iov, (void)iovcnt;
    return JumboSend::kNotLocal;
  }
  // The largest payload a jumbo packet to `dst` may carry now (0: send_jumbo
  // would answer kNotLocal).
  virtual uint32_t jumbo_limit(const Endpoint& dst) noexcept {
    (void)dst;
    return 0;
  }

  // Same-host, one packet: room for a bare datagram (TxDatagram::bare) of
  // `len` bytes to `dst` in the peer's ring, for the caller to write in place
  // and then send with commit_bare (or drop with abandon_bare), with no copy
  // and no send_burst. The ring stays locked in between: the caller sends
  // nothing else meanwhile. False when there is no such room (no ring to
  // `dst`, a full one; decorators, whose layer would not see it): send it
  // with send_burst. Thread-safe. `slot` (empty: commit_bare and abandon_bare
  // empty it) is written only when it returns true: filled in place, not
  // returned, as a 16-byte return copied through the stack made the post
  // wait for the ring's stores (docs/measurements.md, 2026-12-01).
  virtual bool reserve_bare(const Endpoint& dst, const IpAddress& src_ip, uint32_t len, BareSlot& slot) noexcept {
    (void)dst, (void)src_ip, (void)len, (void)slot;
    return false;
  }
  virtual void commit_bare(BareSlot& slot) noexcept { slot = {}; }
  virtual void abandon_bare(BareSlot& slot) noexcept { slot = {}; }

  // Same-host: stores `word` in cell `cell` of the board of the transport
  // at `dst` (ShmTransport: a word its receiver reads, not a datagram); false
  // when there is no such board (no ring to `dst`; decorators, whose layer
  // would not see it): send a packet instead. Thread-safe.
  virtual bool post_board(const Endpoint& dst, uint32_t cell, uint64_t word) noexcept {
    (void)dst, (void)cell, (void)word;
    return false;
  }

  // Same-host mailboxes (ShmTransport): the page of mailbox `cell` of this
  // transport's own segment, its memory allocated (null: none, or no
  // memory); the page of mailbox `cell` of the transport at `dst` (false:
  // none); and, after a record was written into a peer's mailbox, the wake-up
  // of a receiver about to block. Decorators answer none: their layer would
  // not see what goes through a mailbox. Thread-safe.
  virtual uint8_t* own_mailbox(uint32_t cell) noexcept {
    (void)cell;
    return nullptr;
  }
  virtual bool peer_mailbox(const Endpoint& dst, uint32_t cell, PeerMailbox* out) noexcept {
    (void)dst, (void)cell, (void)out;
    return false;
  }
  virtual void notify_mailbox(const PeerMailbox& m) noexcept { (void)m; }
  // How many records senders have written into this transport's mailboxes
  // (a count that only grows; the receiver asks whether it moved).
  virtual uint64_t mail_generation() const noexcept { return 0; }
  // Gives the memory of own mailbox `cell` back (its QP is destroyed): the
  // segment's pages are the QPs' that live, not those that ever did.
  virtual void release_mailbox(uint32_t cell) noexcept { (void)cell; }

  // Whether a datagram to `dst` is handed over through shared memory (the
  // same-host path: no system call) rather than a socket. Decorators answer
  // for the layer below them. Thread-safe.
  virtual bool through_memory(const Endpoint& dst) noexcept {
    DatagramTransport* inner = decorated();
    return inner && inner->through_memory(dst);
  }

  virtual uint16_t local_port() const noexcept = 0;
  // The port shared by every transport of the host (RoCEv2's 4791, joined
  // with SO_REUSEPORT), whose datagrams it also receives; 0 when none.
  virtual uint16_t host_port() const noexcept { return 0; }

  // Segments a GSO message may have (1: no GSO; send_burst then takes only
  // datagrams with segment_size 0).
  virtual unsigned max_gso_segments() const noexcept { return 1; }
  // Whether received GSO messages arrive whole (UDP_GRO) and are split here.
  virtual bool gro() const noexcept { return false; }
  // Whether the last recv_burst may have left datagrams that had already
  // arrived: its result filled `out`, or the socket had more. False means
  // everything received before that call has been returned.
  virtual bool more_ready() const noexcept { return false; }
  // The transport this one decorates (fault injection, capture, the
  // same-host path over UDP), or null.
  virtual DatagramTransport* decorated() noexcept { return nullptr; }
};

// The layer of type T in the stack that starts at `t`, or null.
template <class T>
T* find_layer(DatagramTransport* t) noexcept {
  for (; t; t = t->decorated())
    if (auto* found = dynamic_cast<T*>(t)) return found;
  return nullptr;
}

}  // namespace uroce::transport
