#include "transport/shm_ring.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

namespace uroce::transport {

struct ShmRing::Header {
  uint64_t magic;
  uint64_t capacity;
  alignas(64) std::atomic<uint64_t> head;  // producer
  alignas(64) std::atomic<uint64_t> tail;  // consumer
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shared between processes: the atomics must be lock-free");

struct ShmRing::RecordHeader {
  uint32_t len;  // the record's bytes; kWrap: skip to the start of the data area
  uint32_t pad;  // bytes between this header and the record's (< kLineBytes)
  Meta meta;
};

namespace {
constexpr uint64_t kMagic = 0x75726f63'6552696eULL;  // "urocReIn"
constexpr uint32_t kWrap = 0xFFFFFFFF;

constexpr uint64_t align_up(uint64_t n) { return (n + ShmRing::kAlign - 1) & ~uint64_t(ShmRing::kAlign - 1); }
}  // namespace

ShmRing ShmRing::create(void* mem, size_t bytes) {
  static_assert(sizeof(Header) <= kHeaderBytes);
  static_assert(sizeof(RecordHeader) % kAlign == 0);
  if (!mem || bytes < kHeaderBytes + 4096) return ShmRing();
  // Not constructed over (a placement new would also write `magic` plainly,
  // which a peer may be reading): the memory is zero or this ring's own.
  auto* h = static_cast<Header*>(mem);
  __atomic_store_n(&h->magic, uint64_t(0), __ATOMIC_RELAXED);
  uint32_t cap = uint32_t(std::min<size_t>(bytes - kHeaderBytes, 1u << 30) & ~size_t(kAlign - 1));
  h->capacity = cap;
  h->head.store(0, std::memory_order_relaxed);
  h->tail.store(0, std::memory_order_relaxed);
  __atomic_store_n(&h->magic, kMagic, __ATOMIC_RELEASE);  // last: the ring is laid out
  return ShmRing(h, static_cast<uint8_t*>(mem) + kHeaderBytes, cap);
}

ShmRing ShmRing::attach(void* mem, size_t bytes) {
  if (!mem || bytes < kHeaderBytes + 4096) return ShmRing();
  auto* h = static_cast<Header*>(mem);
  uint32_t cap = uint32_t(std::min<size_t>(bytes - kHeaderBytes, 1u << 30) & ~size_t(kAlign - 1));
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kMagic || h->capacity != cap) return ShmRing();
  ShmRing r(h, static_cast<uint8_t*>(mem) + kHeaderBytes, cap);
  r.head_ = h->head.load(std::memory_order_acquire);
  r.tail_ = h->tail.load(std::memory_order_acquire);
  if (r.head_ % kAlign || r.tail_ % kAlign || r.head_ - r.tail_ > cap) r.corrupt_ = true;
  r.head_off_ = uint32_t(r.head_ % cap);
  r.tail_off_ = uint32_t(r.tail_ % cap);
  return r;
}

bool ShmRing::push(const Meta& meta, const uint8_t* const* parts, const uint32_t* part_lens, unsigned nparts,
                   uint32_t align_at) {
  uint64_t len = 0;
  for (unsigned i = 0; i < nparts; ++i) len += part_lens[i];
  uint8_t* p = len <= max_record() ? reserve(meta, uint32_t(len), align_at) : nullptr;
  if (!p) return false;
  for (unsigned i = 0; i < nparts; ++i) {
    if (part_lens[i] == 0) continue;  // an empty part may have no address
    std::memcpy(p, parts[i], part_lens[i]);
    p += part_lens[i];
  }
  publish();
  return true;
}

uint8_t* ShmRing::reserve(const Meta& meta, uint32_t len, uint32_t align_at) {
  if (!hdr_ || corrupt_ || len > max_record()) return nullptr;
  // Where the record would start, and the pad that puts its byte `align_at`
  // on a cache line (a copy into the ring then stores whole lines).
  auto pad_at = [&](const uint8_t* where) -> uint32_t {
    if (align_at == kNoAlign) return 0;
    uint64_t addr = reinterpret_cast<uintptr_t>(where) + sizeof(RecordHeader) + align_at;
    return uint32_t((kLineBytes - addr % kLineBytes) % kLineBytes);
  };
  uint32_t pad = pad_at(head_at());
  uint64_t need = sizeof(RecordHeader) + align_up(pad + len);
  uint64_t to_end = capacity_ - head_off_;
  uint64_t wrap = to_end < need ? to_end : 0;  // a record never straddles the end
  if (wrap) {
    pad = pad_at(data_);  // the record starts the data again
    need = sizeof(RecordHeader) + align_up(pad + len);
  }
  if (!room_for(wrap + need)) return nullptr;
  if (wrap) {
    // to_end >= 8 always (positions are 8-aligned): room for the marker's len.
    // Not visible before publish(); a reservation dropped leaves the next
    // record after the marker, which is then published with it.
    uint32_t marker = kWrap;
    std::memcpy(head_at(), &marker, sizeof marker);
    advance(head_, head_off_, wrap);
  }
  RecordHeader rh{len, pad, meta};
  uint8_t* p = head_at();
  std::memcpy(p, &rh, sizeof rh);
  reserved_ = need;
  return p + sizeof rh + pad;
}

// The consumer's tail is read only when the one last read leaves too little
// room (or was never read): its line then stays with the consumer, which
// writes it after every record, instead of crossing to this core at every
// push (a cache miss in each same-host message's path).
bool ShmRing::room_for(uint64_t need) {
  if (tail_read_ && capacity_ - (head_ - tail_seen_) >= need) return true;
  uint64_t tail = hdr_->tail.load(std::memory_order_acquire);
  if (tail % kAlign || tail > head_ || head_ - tail > capacity_ || tail < tail_seen_) {
    corrupt_ = true;
    return false;
  }
  tail_seen_ = tail;
  tail_read_ = true;
  return capacity_ - (head_ - tail) >= need;
}

void ShmRing::publish() {
  advance(head_, head_off_, std::exchange(reserved_, 0));
  // seq_cst (not only release): a consumer about to block announces it, then
  // looks at the head; a producer stores the head, then looks for that
  // announcement (ShmTransport) — one of the two sees the other.
  hdr_->head.store(head_, std::memory_order_seq_cst);
}

bool ShmRing::peek(Record* r) {
  if (!hdr_ || corrupt_) return false;
  for (;;) {
    uint64_t head = hdr_->head.load(std::memory_order_acquire);
    if (head == tail_) return false;
    if (head % kAlign || head < tail_ || head - tail_ > capacity_) {
      corrupt_ = true;
      return false;
    }
    uint64_t to_end = capacity_ - tail_off_;
    uint32_t len;
    std::memcpy(&len, tail_at(), sizeof len);
    if (len == kWrap || to_end < sizeof(RecordHeader)) {  // skip to the start
      if (head - tail_ < to_end) {
        corrupt_ = true;
        return false;
      }
      advance(tail_, tail_off_, to_end);
      hdr_->tail.store(tail_, std::memory_order_release);
      continue;
    }
    RecordHeader rh;
    std::memcpy(&rh, tail_at(), sizeof rh);  // a local copy: checked, then used
    uint64_t need = sizeof(RecordHeader) + align_up(uint64_t(rh.pad) + rh.len);
    if (rh.len > max_record() || rh.pad >= kLineBytes || need > to_end || need > head - tail_) {
      corrupt_ = true;
      return false;
    }
    r->data = tail_at() + sizeof(RecordHeader) + rh.pad;
    r->len = rh.len;
    r->meta = rh.meta;
    peeked_ = uint32_t(need);
    return true;
  }
}

void ShmRing::pop() {
  if (!peeked_) return;
  advance(tail_, tail_off_, std::exchange(peeked_, 0));
  hdr_->tail.store(tail_, std::memory_order_release);
}

bool ShmRing::has_records(const void* mem) {
  const auto* h = static_cast<const Header*>(mem);
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kMagic) return false;
  return h->head.load(std::memory_order_seq_cst) != h->tail.load(std::memory_order_seq_cst);
}

bool ShmRing::empty_seq_cst() const { return !hdr_ || corrupt_ || hdr_->head.load(std::memory_order_seq_cst) == tail_; }

}  // namespace uroce::transport
