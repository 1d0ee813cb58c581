#include "transport/shm_transport.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "transport/envelope.h"
#include "transport/shared_file.h"
#include "transport/step_probe.h"

namespace uroce::transport {

// The inbound segment: this header, then the board (kBoardCells words), the
// mailboxes (kMailboxes pages), then kRings rings of kRingBytes.
// `senders` bits are set (seq_cst) by a sender before its first push;
// `waiting` is set (seq_cst) by the receiver about to block and taken by the
// first sender that then pushes or posts to the board (which rings the
// doorbell). Both are only hints: a wrong bit costs a look at an empty ring
// or a spurious wake-up. `board_gen` counts the board's writes (seq_cst),
// `mail_gen` the mailboxes' records.
struct ShmTransport::Segment {
  uint64_t magic;
  uint32_t owner_pid;
  uint32_t reserved;
  alignas(64) std::atomic<uint64_t> senders[kRings / 64];
  alignas(64) std::atomic<uint32_t> waiting;
  alignas(64) std::atomic<uint64_t> board_gen;
  alignas(64) std::atomic<uint64_t> mail_gen;
};

namespace {

// The segment's layout and its records' meaning, version included: a process
// of another uroce build whose rings would not mean the same (records sent
// bare, without ICRC, since "urocSeg2"; with a board, since "urocSeg3"; with
// mailboxes, since "urocSeg4") does not attach, and its packets go through
// the socket.
constexpr uint64_t kSegmentMagic = 0x75726f63'53656734ULL;  // "urocSeg4"
constexpr size_t kSegmentHeader = 4096;
constexpr size_t kBoardBytes = size_t(ShmTransport::kBoardCells) * sizeof(uint64_t);
constexpr size_t kMailboxArea = size_t(kMailboxes) * kMailboxBytes;
constexpr size_t kSegmentBytes =
    kSegmentHeader + kBoardBytes + kMailboxArea + ShmTransport::kRings * ShmTransport::kRingBytes;
constexpr uint32_t kLoopback = 0x7F000001;
constexpr uint32_t kMaxRecord = 9216 + 64;  // a datagram of the largest MTU plus headers
constexpr auto kRingsActive = std::chrono::milliseconds(1);
// While shared memory delivers, the socket is asked: when it delivered too
// (within kRingsActive), every kInnerEvery-th receive and at least every
// kInnerMaxGap; when it did not, every kInnerQuietGap, a safety net only: a
// thread napping meanwhile watches the sockets (nap).
constexpr unsigned kInnerEvery = 8;
constexpr auto kInnerMaxGap = std::chrono::microseconds(200);
constexpr auto kInnerQuietGap = std::chrono::milliseconds(1);
constexpr int kFullRingWaitUs = 50;  // then the datagram is dropped (RC retransmits it)
constexpr auto kRecheck = std::chrono::milliseconds(100);
constexpr auto kStalled = std::chrono::microseconds(500);
constexpr unsigned kMaxParts = 16;  // pieces one record is gathered from
static_assert(kMaxParts >= kMaxPacketPieces);
constexpr uint32_t kJumboHeadroom = 128;  // a jumbo packet's headers, pad and ICRC

// The clock of the outbound rings' look-ups: CLOCK_MONOTONIC_COARSE costs a
// load or two where steady_clock::now() reads the TSC (~60 ns a read on the
// VMs measured, a read per datagram sent), and its tick (a few ms) is far
// below kRecheck.
std::chrono::nanoseconds coarse_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

std::atomic<uint64_t>* board_of(void* segment) {
  return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<uint8_t*>(segment) + kSegmentHeader);
}

// Allocates the pages of [offset, offset + len) of the segment file.
bool reserve_pages(int fd, size_t offset, size_t len) {
  int e = posix_fallocate(fd, off_t(offset), off_t(len));
  if (e != 0) errno = e;
  return e == 0;
}

}  // namespace

size_t ShmTransport::ring_offset(unsigned index) noexcept {
  return kSegmentHeader + kBoardBytes + kMailboxArea + size_t(index) * kRingBytes;
}

namespace {
size_t mailbox_offset(uint32_t cell) { return kSegmentHeader + kBoardBytes + size_t(cell) * kMailboxBytes; }
}  // namespace

// A mapping of a segment, unmapped when its last user lets go.
struct ShmTransport::Mapping {
  void* addr = nullptr;
  size_t bytes = 0;
  Mapping(void* a, size_t b) : addr(a), bytes(b) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { munmap(addr, bytes); }
};

namespace {

// The inbound segments of this process's own transports: a sender in the same
// process uses the receiver's mapping rather than a second one, so that both
// sides' atomics are at one address (which is what a thread sanitizer can
// see) and no address space is spent twice.
std::mutex g_own_mu;
std::unordered_map<std::string, std::weak_ptr<ShmTransport::Mapping>>& own_segments() {
  static auto* m = new std::unordered_map<std::string, std::weak_ptr<ShmTransport::Mapping>>;
  return *m;
}

std::shared_ptr<ShmTransport::Mapping> own_segment(const std::string& path) {
  std::lock_guard lock(g_own_mu);
  auto it = own_segments().find(path);
  return it == own_segments().end() ? nullptr : it->second.lock();
}

}  // namespace

std::unique_ptr<ShmTransport> ShmTransport::open(std::unique_ptr<DatagramTransport> inner, std::string segment,
                                                 ShmDirectory* directory,
                                                 std::unique_ptr<DatagramTransport>* inner_back) {
  // A sparse file: only the pages written here (header and board, ring
  // headers) are allocated now, each sender allocates its ring's
  // (reserve_pages).
  std::array<ByteRange, kRings + 1> written;
  written[0] = {0, kSegmentHeader + kBoardBytes};
  for (unsigned i = 0; i < kRings; ++i) written[i + 1] = {ring_offset(i), ShmRing::kHeaderBytes};
  void* map = create_shared_file(segment, kSegmentBytes, true, written);
  if (!map) {
    *inner_back = std::move(inner);
    return nullptr;
  }
  auto* seg = static_cast<Segment*>(map);  // a new file: zero, as the words start
  seg->owner_pid = uint32_t(getpid());
  for (unsigned i = 0; i < kRings; ++i) (void)ShmRing::create(static_cast<uint8_t*>(map) + ring_offset(i), kRingBytes);
  __atomic_store_n(&seg->magic, kSegmentMagic, __ATOMIC_RELEASE);  // last: the rings are laid out
  try {
    auto mapping = std::make_shared<Mapping>(map, kSegmentBytes);
    {
      std::lock_guard lock(g_own_mu);
      own_segments()[segment] = mapping;
    }
    return std::unique_ptr<ShmTransport>(
        new ShmTransport(std::move(inner), std::move(segment), std::move(mapping), directory));
  } catch (...) {
    ::unlink(segment.c_str());
    munmap(map, kSegmentBytes);
    *inner_back = std::move(inner);
    errno = ENOMEM;
    return nullptr;
  }
}

ShmTransport::ShmTransport(std::unique_ptr<DatagramTransport> inner, std::string path, std::shared_ptr<Mapping> own,
                           ShmDirectory* directory)
    : inner_(std::move(inner)),
      path_(std::move(path)),
      own_(std::move(own)),
      map_(own_->addr),
      segment_(static_cast<Segment*>(map_)),
      directory_(directory),
      local_(LocalAddresses::snapshot()),
      in_(kRings),
      rx_copy_(size_t(64) * kMaxRecord) {
  held_.reserve(kRings);  // at most one record per ring: no allocation while receiving
}

ShmTransport::~ShmTransport() {
  ::unlink(path_.c_str());
  std::lock_guard lock(g_own_mu);
  own_segments().erase(path_);  // senders of this process that hold it keep it mapped
}

// The ring into the receiver at `port` (null: not a local transport).
// Looked up again every kRecheck, so that a port a new process took over is
// not fed into its dead predecessor's segment. The ring found last is
// returned without the map's lock until then (its pushes take its own):
// most datagrams go to the peer the one before went to.
ShmTransport::Outbound* ShmTransport::outbound_for(uint16_t port) noexcept {
  auto now = coarse_now();
  Outbound* last = last_.load(std::memory_order_acquire);
  if (last && last->key == port && now.count() < last->fresh_until.load(std::memory_order_relaxed)) return last;
  std::lock_guard lock(out_mu_);
  Outbound* o = look_up_locked(port, now);
  if (o) {
    o->fresh_until.store((o->checked + kRecheck).count(), std::memory_order_relaxed);
    last_.store(o, std::memory_order_release);
  }
  return o;
}

ShmTransport::Outbound* ShmTransport::look_up_locked(uint16_t port, std::chrono::nanoseconds now) noexcept {
  try {
    std::unique_ptr<Outbound>& slot = out_[port];
    if (!slot) {
      slot = std::make_unique<Outbound>();
      slot->key = port;
    }
    Outbound& o = *slot;
    if (now < o.checked + kRecheck) return o.ring.valid() ? &o : nullptr;
    o.checked = now;
    std::string name;
    unsigned index = 0;
    bool found = directory_->lookup(port, &name, &index) && index < kRings;
    if (found && name == o.segment && o.ring.valid()) return &o;
    std::lock_guard ring_lock(o.mu);
    o.mapping.reset();
    o.map = nullptr;
    o.ring = ShmRing();
    o.segment = found ? name : std::string();
    if (!found) return nullptr;
    int fd = ::open(name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        size_t(st.st_size) != kSegmentBytes) {
      if (fd >= 0) ::close(fd);
      return nullptr;
    }
    // Our ring's pages are allocated first (a full /dev/shm: this peer is
    // reached over UDP). Then the receiver's own mapping if it is in this
    // process, else our ring (and the header before it, for the flags).
    std::shared_ptr<Mapping> mapping;
    if (reserve_pages(fd, ring_offset(index), kRingBytes)) {
      mapping = own_segment(name);
      void* m = mapping ? MAP_FAILED
                        : mmap(nullptr, ring_offset(index) + kRingBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) mapping = std::make_shared<Mapping>(m, ring_offset(index) + kRingBytes);
    }
    ::close(fd);
    if (!mapping) return nullptr;
    auto* seg = static_cast<Segment*>(mapping->addr);
    ShmRing ring = __atomic_load_n(&seg->magic, __ATOMIC_ACQUIRE) == kSegmentMagic
                       ? ShmRing::attach(static_cast<uint8_t*>(mapping->addr) + ring_offset(index), kRingBytes)
                       : ShmRing();
    if (!ring.valid()) return nullptr;
    o.map = mapping->addr;
    o.mapping = std::move(mapping);
    o.ring = ring;
    o.index = index;
    seg->senders[index / 64].fetch_or(uint64_t(1) << (index % 64), std::memory_order_seq_cst);
    return &o;
  } catch (...) {
    return nullptr;
  }
}

// A record's addressing (its k-th GSO segment: ip_id k, set by the caller).
ShmRing::Meta ShmTransport::meta_for(const Endpoint& dst, const IpAddress& src, uint16_t flags) const noexcept {
  uint32_t dst_ip = dst.ip.v4();
  uint32_t src_ip = !src.unspecified() ? src.v4() : ((dst_ip >> 24) == 127 ? dst_ip : kLoopback);
  return ShmRing::Meta{src_ip, dst_ip, inner_->local_port(), dst.port, 0, flags};
}

// Pushes every segment of `d` (one record each); false if the ring stayed
// full (the rest is dropped).
bool ShmTransport::push_datagram(Outbound& o, const TxDatagram& d, uint16_t flags) noexcept {
  uint32_t total = 0;
  for (unsigned i = 0; i < d.iovcnt; ++i) total += uint32_t(d.iov[i].iov_len);
  uint32_t seg = d.segment_size ? d.segment_size : total;
  ShmRing::Meta meta = meta_for(d.dst, d.src_ip, flags);
  unsigned iov = 0;
  size_t iov_off = 0;
  // A jumbo packet's payload (after its headers, the first part) starts a
  // cache line in the ring: copying it in then stores whole lines.
  uint32_t align_at = (flags & kJumboRecord) && d.iovcnt > 0 ? uint32_t(d.iov[0].iov_len) : ShmRing::kNoAlign;
  std::lock_guard lock(o.mu);
  if (!o.live()) return false;  // remapped meanwhile
  for (uint32_t done = 0, k = 0; done < total || (total == 0 && k == 0); ++k) {
    uint32_t len = std::min(seg, total - done);
    const uint8_t* parts[kMaxParts];
    uint32_t lens[kMaxParts];
    unsigned n = 0;
    for (uint32_t left = len; left > 0 && iov < d.iovcnt && n < kMaxParts;) {
      uint32_t take = uint32_t(std::min<size_t>(left, d.iov[iov].iov_len - iov_off));
      parts[n] = static_cast<const uint8_t*>(d.iov[iov].iov_base) + iov_off;
      lens[n++] = take;
      left -= take;
      iov_off += take;
      if (iov_off == d.iov[iov].iov_len) ++iov, iov_off = 0;
    }
    meta.ip_id = uint16_t(k);
    if (!o.ring.push(meta, parts, lens, n, align_at) && !push_waiting(o, meta, parts, lens, n, align_at)) return false;
    sent_->fetch_add(1, std::memory_order_relaxed);
    done += len;
    if (total == 0) break;
  }
  wake_if_waiting(o);
  return true;
}

void ShmTransport::wake_if_waiting(Outbound& o) noexcept {
  // The receiver may be about to block: the pushed heads before its flag.
  auto* receiver = static_cast<Segment*>(o.map);
  // (ShmRing::publish stores the head seq_cst: with this seq_cst load, either
  // the receiver sees the record or this sees its flag.)
  if (receiver->waiting.load(std::memory_order_seq_cst) && receiver->waiting.exchange(0)) ring_doorbell(o.key);
}

bool ShmTransport::reserve_bare(const Endpoint& dst, const IpAddress& src_ip, uint32_t len, BareSlot& slot) noexcept {
  Outbound* o = outbound_to(dst);
  if (!o) return false;
  o->mu.lock();
  uint8_t* data = o->live() ? o->ring.reserve(meta_for(dst, src_ip, kBareRecord), len) : nullptr;
  if (!data) {  // (a full ring: send_burst waits for room, as for any datagram)
    o->mu.unlock();
    return false;
  }
  slot.data = data;
  slot.ring = o;
  return true;
}

void ShmTransport::commit_bare(BareSlot& slot) noexcept {
  auto* o = static_cast<Outbound*>(slot.ring);
  o->ring.publish();
  step_probe::stamp(step_probe::Step::kPublished);
  sent_->fetch_add(1, std::memory_order_relaxed);
  wake_if_waiting(*o);
  o->mu.unlock();
  slot = {};
}

bool ShmTransport::post_board(const Endpoint& dst, uint32_t cell, uint64_t word) noexcept {
  Outbound* o = outbound_to(dst);
  if (!o || cell >= kBoardCells) return false;
  std::lock_guard lock(o->mu);
  if (!o->live()) return false;  // remapped meanwhile
  board_of(o->map)[cell].store(word, std::memory_order_release);
  // seq_cst, as a ring's head: with wake_if_waiting's load, either the
  // receiver about to block sees the generation move or this sees its flag.
  static_cast<Segment*>(o->map)->board_gen.fetch_add(1, std::memory_order_seq_cst);
  step_probe::stamp(step_probe::Step::kPublished);
  board_posts_.fetch_add(1, std::memory_order_relaxed);
  wake_if_waiting(*o);
  return true;
}

uint8_t* ShmTransport::own_mailbox(uint32_t cell) noexcept {
  if (cell >= kMailboxes) return nullptr;
  int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return nullptr;
  bool ok = reserve_pages(fd, mailbox_offset(cell), kMailboxBytes);
  ::close(fd);
  return ok ? static_cast<uint8_t*>(map_) + mailbox_offset(cell) : nullptr;
}

uint64_t ShmTransport::mail_generation() const noexcept { return segment_->mail_gen.load(std::memory_order_acquire); }

// A sender that still maps the page reads zero there from now on: closed.
void ShmTransport::release_mailbox(uint32_t cell) noexcept {
  if (cell >= kMailboxes) return;
  int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(mailbox_offset(cell)), off_t(kMailboxBytes));
  ::close(fd);
}

bool ShmTransport::peer_mailbox(const Endpoint& dst, uint32_t cell, PeerMailbox* out) noexcept {
  Outbound* o = cell < kMailboxes ? outbound_to(dst) : nullptr;
  if (!o) return false;
  std::lock_guard lock(o->mu);
  if (!o->live()) return false;
  out->box = static_cast<uint8_t*>(o->map) + mailbox_offset(cell);
  out->segment = o->map;
  out->port = o->key;
  out->keep = o->mapping;
  return true;
}

// seq_cst, as a ring's head: with wait()'s load, either the receiver sees
// the generation move or this thread sees its waiting word.
void ShmTransport::notify_mailbox(const PeerMailbox& m) noexcept {
  auto* receiver = static_cast<Segment*>(m.segment);
  receiver->mail_gen.fetch_add(1, std::memory_order_seq_cst);
  if (receiver->waiting.load(std::memory_order_seq_cst) && receiver->waiting.exchange(0)) ring_doorbell(m.port);
}

bool ShmTransport::board_polled() noexcept {
  uint64_t gen = segment_->board_gen.load(std::memory_order_relaxed);
  if (gen == board_polled_) return false;
  board_polled_ = gen;
  return true;
}

bool ShmTransport::take_board_change() noexcept {
  uint64_t gen = segment_->board_gen.load(std::memory_order_acquire);
  if (gen == board_seen_.load(std::memory_order_relaxed)) return false;
  board_seen_.store(gen, std::memory_order_relaxed);
  return true;
}

uint64_t ShmTransport::board_word(uint32_t cell) const noexcept {
  return cell < kBoardCells ? board_of(map_)[cell].load(std::memory_order_acquire) : 0;
}

void ShmTransport::clear_board(uint32_t cell) noexcept {
  if (cell < kBoardCells) board_of(map_)[cell].store(0, std::memory_order_relaxed);
}

void ShmTransport::abandon_bare(BareSlot& slot) noexcept {
  static_cast<Outbound*>(slot.ring)->mu.unlock();
  slot = {};
}

// The ring is full: wakes the receiver and retries for a short while; then
// the datagram is lost, as on a congested network (RC retransmits it). Never
// longer: the sending thread may hold its own engine's receive turn, and the
// receiver may be waiting for room in a ring this thread would drain.
bool ShmTransport::push_waiting(Outbound& o, const ShmRing::Meta& meta, const uint8_t* const* parts,
                                const uint32_t* lens, unsigned n, uint32_t align_at) noexcept {
  auto now = std::chrono::steady_clock::now();
  if (now < o.stalled_until || o.ring.corrupt()) {
    full_drops_->fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  ring_doorbell(o.key);  // the receiver may be asleep with a full ring
  auto deadline = now + std::chrono::microseconds(kFullRingWaitUs);
  do {
    if (o.ring.push(meta, parts, lens, n, align_at)) return true;
  } while (!o.ring.corrupt() && std::chrono::steady_clock::now() < deadline);
  o.stalled_until = std::chrono::steady_clock::now() + kStalled;
  full_drops_->fetch_add(1, std::memory_order_relaxed);
  return false;
}

void ShmTransport::ring_doorbell(uint16_t port) noexcept {
  static const uint8_t kBell = uint8_t(Envelope::kDoorbell);  // one byte: wake up, nothing to parse
  iovec v{const_cast<uint8_t*>(&kBell), 1};
  TxDatagram bell{Endpoint{kEnvelopeLoopback, port}, kEnvelopeLoopback, 0, 1, &v};
  inner_->send_burst(std::span(&bell, 1));
}

size_t ShmTransport::send_burst(std::span<TxDatagram> burst) noexcept {
  size_t i = 0;
  while (i < burst.size()) {
    TxDatagram& d = burst[i];
    Outbound* o = outbound_to(d.dst);
    if (!o && d.bare) {  // no ICRC: not for a socket
      bare_drops_.fetch_add(1, std::memory_order_relaxed);
      ++i;
      continue;
    }
    if (!o) {  // a run of datagrams for the socket
      size_t j = i + 1;
      while (j < burst.size() && !burst[j].bare && !outbound_to(burst[j].dst)) ++j;
      auto run = burst.subspan(i, j - i);
      while (!run.empty()) run = run.subspan(std::max<size_t>(inner_->send_burst(run), 1));
      i = j;
      continue;
    }
    (void)push_datagram(*o, d, d.bare ? kBareRecord : 0);
    ++i;
  }
  return burst.size();
}

bool ShmTransport::through_memory(const Endpoint& dst) noexcept { return outbound_to(dst) != nullptr; }

uint32_t ShmTransport::jumbo_limit(const Endpoint& dst) noexcept {
  Outbound* o = outbound_to(dst);
  return o ? std::min<uint32_t>(kJumboBytes, o->ring.max_record() - kJumboHeadroom) : 0;
}

JumboSend ShmTransport::send_jumbo(const Endpoint& dst, const IpAddress& src_ip, const iovec* iov,
                                   unsigned iovcnt) noexcept {
  if (iovcnt > kMaxParts) return JumboSend::kNotLocal;
  Outbound* o = outbound_to(dst);
  size_t total = 0;
  for (unsigned i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  if (!o || total > o->ring.max_record()) return JumboSend::kNotLocal;
  TxDatagram d{dst, src_ip, 0, uint16_t(iovcnt), iov};
  if (!push_datagram(*o, d, kJumboRecord)) return JumboSend::kDropped;
  jumbo_sent_.fetch_add(1, std::memory_order_relaxed);
  return JumboSend::kSent;
}

size_t ShmTransport::take_from_rings(std::span<RxDatagram> out) noexcept {
  // Jumbo records handed out in place by the last receive: done with now.
  for (unsigned index : held_) in_[index].pop();
  held_.clear();
  // Senders that announced themselves since the last look.
  for (unsigned w = 0; w < kRings / 64; ++w) {
    uint64_t bits = segment_->senders[w].load(std::memory_order_acquire);
    for (; bits; bits &= bits - 1) {
      unsigned index = w * 64 + unsigned(__builtin_ctzll(bits));
      if (in_[index].valid()) continue;
      in_[index] = ShmRing::attach(static_cast<uint8_t*>(map_) + ring_offset(index), kRingBytes);
      if (in_[index].valid()) active_.push_back(index);
    }
  }
  size_t n = 0;
  size_t cap = std::min(out.size(), rx_copy_.size() / kMaxRecord);
  bool more = false;
  for (size_t a = 0; a < active_.size() && n < cap; ++a) {
    // (rotate_ < active_.size(): no division in a loop an idle poller spins in)
    size_t at = rotate_ + a < active_.size() ? rotate_ + a : rotate_ + a - active_.size();
    ShmRing& ring = in_[active_[at]];
    ShmRing::Record rec;
    while (n < cap && ring.peek(&rec)) {
      step_probe::stamp(step_probe::Step::kTaken);
      RxDatagram& d = out[n];
      if (rec.meta.flags & kJumboRecord) {
        // In place, held until the next receive; nothing after it from this
        // ring in this burst (a ring lends one record at a time).
        d = RxDatagram{};
        d.data = const_cast<uint8_t*>(rec.data);
        d.len = rec.len;
        d.jumbo = true;
        d.src = Endpoint{rec.meta.src_ip, rec.meta.src_port};
        d.dst_ip = rec.meta.dst_ip;
        d.dst_port = rec.meta.dst_port;
        held_.push_back(active_[at]);
        jumbo_seen_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
        ++n;
        more = true;
        break;
      }
      uint8_t* copy = rx_copy_.data() + n * kMaxRecord;
      d.len = std::min(rec.len, kMaxRecord);
      std::memcpy(copy, rec.data, d.len);  // ours from here on: the peer cannot change what we check
      d.data = copy;
      d.truncated = rec.len > kMaxRecord;
      d.ce = false;
      d.jumbo = false;
      d.bare = rec.meta.flags & kBareRecord;
      d.src = Endpoint{rec.meta.src_ip, rec.meta.src_port};
      d.dst_ip = rec.meta.dst_ip;
      d.dst_port = rec.meta.dst_port;
      d.gso_index = uint8_t(std::min<uint16_t>(rec.meta.ip_id, 255));
      ring.pop();
      ++n;
    }
    if (n == cap && !ring.empty_seq_cst()) more = true;
  }
  rings_ready_.store(more, std::memory_order_relaxed);
  if (++rotate_ >= active_.size()) rotate_ = 0;
  // One thread at a time receives (the receive turn): a plain add, not a
  // locked one on the way from a record to its completion.
  if (n) received_->store(received_->load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  return n;
}

size_t ShmTransport::recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept {
  for (int attempt = 0;; ++attempt) {
    // Read before the rings are looked at, not after: a record found waits
    // for no clock read (~25-60 ns) before the engine sees it. A poller's
    // receives read it every kClockEvery-th time only (poll_clock): the read
    // would be most of an empty receive's cost, and the gaps below are
    // microseconds long.
    auto now = poll_clock();
    size_t n = take_from_rings(out);
    found_in_a_row_ = n > 0 ? found_in_a_row_ + 1 : 0;
    // While the rings deliver (within the last kRingsActive), the socket is
    // not asked on every receive, also when the rings are empty: a poller
    // then looks at its rings every ~0.1 us instead of once per system call.
    // If the socket delivers as well (peers on this host and on others), it
    // is asked every kInnerEvery-th time (and at least every kInnerMaxGap:
    // under load one receive can take milliseconds); if it does not, when a
    // napping thread saw it readable (nap) and at least every kInnerQuietGap,
    // so that a same-host ping-pong's poller is not inside recvmmsg (1-3 us)
    // when a record arrives (measured: asked every 10 us, a fifth of the
    // poller's time went to the system calls).
    // Otherwise it is asked whenever the rings had nothing, and always after
    // a wait (which ends early when the socket has something: skipping it
    // then would only make the next wait end at once again).
    // A word on the board counts as a delivery: a pure sender's ACKs come
    // only there, and it would otherwise ask the socket on every empty poll
    // (a system call each, ~0.5-1 us, between its posts).
    if (n > 0 || board_polled()) rings_delivered_ = now;
    bool rings_active = now - rings_delivered_ < kRingsActive;
    bool socket_active = this->socket_active(now);
    // (Looked at before it is taken: an exchange is a locked instruction, a
    // full barrier on every receive, most of which find it false.)
    bool waited = inner_due_.load(std::memory_order_relaxed) && inner_due_.exchange(false, std::memory_order_relaxed);
    bool overdue = now - inner_asked_ >= (socket_active ? kInnerMaxGap : kInnerQuietGap);
    bool turn = socket_active && ++inner_skip_ >= kInnerEvery;
    if (n < out.size() && (waited || overdue || (n == 0 && !rings_active) || turn)) {
      inner_skip_ = 0;
      inner_asked_ = now;
      size_t base = n;
      size_t got = inner_->recv_burst(out.subspan(base), 0);
      bool doorbell = false;
      for (size_t i = 0; i < got; ++i) {  // doorbells are not datagrams for the engine
        const RxDatagram d = out[base + i];
        if (envelope_of(d) == Envelope::kDoorbell && d.len == 1 && d.src.ip == kEnvelopeLoopback) {
          doorbell = true;
          continue;
        }
        out[n++] = d;
      }
      if (n > base) inner_delivered_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
      // A doorbell rung for a thread now blocked in wait() (which took the
      // segment's waiting word) and swallowed here, by the thread with the
      // receive turn, would leave that thread asleep while records pile up:
      // no sender rings again until it waits anew. Pass the wake-up on.
      if (doorbell && waiter_blocked_.load(std::memory_order_seq_cst)) inner_->wake();
    }
    if (n > 0 || timeout_ms == 0 || attempt > 0) return n;
    wait(timeout_ms);
    clock_in_ = 0;  // the clock is read anew after the wait
  }
}

std::chrono::steady_clock::time_point ShmTransport::poll_clock() noexcept {
  if (clock_in_ == 0 || found_in_a_row_ >= 2) {
    clock_ = std::chrono::steady_clock::now();
    clock_in_ = kClockEvery;
    found_in_a_row_ = 0;
  }
  --clock_in_;
  return clock_;
}

// Any thread: only the segment's shared words are read here (the receiving
// side's state belongs to the thread with the receive turn).
bool ShmTransport::rings_have_records() const noexcept {
  for (unsigned w = 0; w < kRings / 64; ++w) {
    uint64_t bits = segment_->senders[w].load(std::memory_order_seq_cst);
    for (; bits; bits &= bits - 1) {
      unsigned index = w * 64 + unsigned(__builtin_ctzll(bits));
      if (ShmRing::has_records(static_cast<uint8_t*>(map_) + ring_offset(index))) return true;
    }
  }
  return false;
}

void ShmTransport::wait(int timeout_ms) noexcept {
  // Shortly after a jumbo record, a stream is likely: look at the rings
  // (memory only, no system call) before blocking, so that the sender finds
  // us awake instead of paying for a doorbell and a wake-up per record.
  using Clock = std::chrono::steady_clock;
  Clock::time_point until{Clock::duration(jumbo_seen_ns_.load(std::memory_order_relaxed))};
  until += kJumboLinger;
  while (Clock::now() < until) {
    if (rings_ready_.load(std::memory_order_relaxed) || rings_have_records()) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  waiter_blocked_.store(true, std::memory_order_seq_cst);
  segment_->waiting.store(1, std::memory_order_seq_cst);
  uint64_t mail = segment_->mail_gen.load(std::memory_order_seq_cst);
  bool ready = rings_ready_.load(std::memory_order_relaxed) || rings_have_records() ||
               segment_->board_gen.load(std::memory_order_seq_cst) != board_seen_.load(std::memory_order_relaxed) ||
               mail != mail_seen_;
  mail_seen_ = mail;  // the receive turn that follows looks at the mailboxes
  if (!ready) inner_->wait(timeout_ms);
  segment_->waiting.store(0, std::memory_order_relaxed);
  waiter_blocked_.store(false, std::memory_order_relaxed);
  inner_due_.store(true, std::memory_order_relaxed);
}

// Whether the socket delivered within kRingsActive (any thread).
bool ShmTransport::socket_active(std::chrono::steady_clock::time_point now) const noexcept {
  std::chrono::steady_clock::duration since_epoch(inner_delivered_.load(std::memory_order_relaxed));
  return now.time_since_epoch() - since_epoch < kRingsActive;
}

// Naps as the inner transport does (datagrams do not end it), but while the
// socket is quiet and the poller therefore rarely asks it, watches it too: a
// datagram arriving makes the poller's next receive ask (inner_due_), within
// microseconds instead of kInnerQuietGap. Once told, or while the socket
// delivers (the poller then asks every kInnerEvery-th time), it naps on the
// wake-up alone, so arrivals wake this thread at most once per nap.
void ShmTransport::nap(int timeout_us) noexcept {
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  bool watch = !socket_active(start) && !inner_due_.load(std::memory_order_relaxed);
  if (!watch) return inner_->nap(timeout_us);
  if (!inner_->nap_or_readable(timeout_us)) return;  // the nap's end, or a wake-up
  inner_due_.store(true, std::memory_order_relaxed);
  auto left = std::chrono::microseconds(timeout_us) - (Clock::now() - start);
  if (left > Clock::duration::zero())
    inner_->nap(int(std::chrono::duration_cast<std::chrono::microseconds>(left).count()));
}

}  // namespace uroce::transport
