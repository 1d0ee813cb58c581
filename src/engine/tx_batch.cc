#include "engine/tx_batch.h"

#include <algorithm>
#include <cstring>

#include "core/mr_access.h"
#include "wire/headers.h"

namespace uroce::engine {

TxBatch::TxBatch() : arena_(new uint8_t[size_t(kMaxPackets) * kMaxPacketBytes]) {}

namespace {
// Constant-initialized and trivially destructible: readable after the
// thread's other thread_local objects are gone. t_batch points at the
// thread's batch once made, so that local() costs one TLS look-up.
thread_local bool t_batch_destroyed = false;
thread_local TxBatch* t_batch = nullptr;
struct ThreadBatch {
  TxBatch batch;
  ThreadBatch() { t_batch = &batch; }
  ~ThreadBatch() {
    t_batch = nullptr;
    t_batch_destroyed = true;
  }
};
}  // namespace

TxBatch& TxBatch::local() {
  if (TxBatch* b = t_batch) return *b;
  if (t_batch_destroyed) {
    static TxBatch* const after_exit = new TxBatch();  // never freed: exit handlers may outlive statics
    return *after_exit;
  }
  thread_local ThreadBatch b;
  return b.batch;
}

void TxBatch::use(transport::DatagramTransport* t) {
  if (t != transport_) {
    flush();
    transport_ = t;
  }
  refresh_gso_limit();
}

uint8_t* TxBatch::begin_packet(const transport::Endpoint& dst, const transport::IpAddress& src_ip,
                               unsigned header_len) {
  // (each packet takes at most kMaxPacketBytes of the arena)
  if (count_ == kMaxPackets) flush();
  uint8_t* h = start_packet(packet(), dst, src_ip, header_len, kMaxPayload);
  // (a packet dropped or abandoned before its end leaves no piece behind)
  first_piece_ = piece_count_ = done_pieces_;
  pieces_[piece_count_++] = iovec{h, header_len};
  return h;
}

uint8_t* TxBatch::begin_packet(const transport::Endpoint& dst, const transport::IpAddress& src_ip, unsigned header_len,
                               Icrc icrc, uint32_t payload_len) {
  if (icrc != Icrc::kOmit || count_ != 0 || !transport_ || payload_len > kMaxPayload)
    return begin_packet(dst, src_ip, header_len);
  uint32_t len = header_len + payload_len + wire::pad_for(payload_len) + wire::kIcrcSize;
  if (!transport_->reserve_bare(dst, src_ip, len, in_place_)) return begin_packet(dst, src_ip, header_len);
  return start_packet(in_place_.data, dst, src_ip, header_len, payload_len);
}

uint8_t* TxBatch::start_packet(uint8_t* h, const transport::Endpoint& dst, const transport::IpAddress& src_ip,
                               unsigned header_len, uint32_t payload_limit) {
  std::memset(h, 0, header_len);
  header_len_ = header_len;
  payload_len_ = 0;
  payload_limit_ = payload_limit;
  overflow_ = false;
  dst_ = dst;
  src_ip_ = src_ip;
  copy_ = wire::CopyIn{};
  packet_used_ = header_len;
  return h;
}

bool TxBatch::add_in_place(const core::Mr* mr, const uint8_t* data, uint32_t len) {
  if (!room_for_payload(len)) return false;
  uint8_t* to = in_place_.data + packet_used_;
  if (!mr)
    std::memcpy(to, data, len);
  else if (!core::copy_from_mr(*mr, to, data, len))
    return false;
  packet_used_ += len;
  payload_len_ += len;
  return true;
}

uint32_t TxBatch::end_in_place() {
  if (overflow_ || payload_len_ != payload_limit_) {  // (less than begun with: its length is wrong)
    transport_->abandon_bare(in_place_);
    return 0;
  }
  unsigned pad = wire::pad_for(payload_len_);
  std::memset(in_place_.data + packet_used_, 0, pad + wire::kIcrcSize);
  transport_->commit_bare(in_place_);
  return header_len_ + payload_len_ + pad + wire::kIcrcSize;
}

bool TxBatch::room_for_payload(uint32_t len) {
  if (len <= payload_limit_ - payload_len_) return true;
  overflow_ = true;
  return false;
}

void TxBatch::grow_arena_piece(uint32_t len) {
  uint8_t* at = packet() + packet_used_;
  packet_used_ += len;
  iovec& last = pieces_[piece_count_ - 1];
  if (static_cast<uint8_t*>(last.iov_base) + last.iov_len == at)
    last.iov_len += len;
  else
    pieces_[piece_count_++] = iovec{at, len};
}

bool TxBatch::add_payload(const uint8_t* data, uint32_t len) {
  if (in_place_.data) return add_in_place(nullptr, data, len);
  if (!room_for_payload(len)) return false;
  std::memcpy(packet() + packet_used_, data, len);
  payload_len_ += len;
  grow_arena_piece(len);
  return true;
}

bool TxBatch::may_reference(const transport::Endpoint& dst) {
  if (!memory_known_ || !(memory_dst_ == dst)) {
    memory_path_ = transport_ && transport_->through_memory(dst);
    memory_dst_ = dst;
    memory_known_ = true;
  }
  return memory_path_;
}

bool TxBatch::add_payload_from(const core::Mr& mr, const uint8_t* data, uint32_t len) {
  if (in_place_.data) return add_in_place(&mr, data, len);
  if (!room_for_payload(len)) return false;
  // A referenced piece leaves room for an arena piece after it, which every
  // later copy, the pad and the ICRC then extend: a packet never has more
  // than kMaxPacketPieces pieces.
  bool room = piece_count_ - first_piece_ + 2 <= transport::kMaxPacketPieces;
  bool may_refer = references_ok_ && room && len >= kMinReference && may_reference(dst_);
  bool may_defer = copy_.src == nullptr && len >= kMinDeferredCopy;
  // Read later in place only what can be read now (not on-demand memory, nor
  // a page made unreadable since registration): the rest is copied now, by
  // the copy that survives a fault (core/mr_access.h). Probed only where a
  // later read would follow.
  bool in_place = (may_refer || may_defer) && core::readable_in_place(mr, data, len);
  if (may_refer && in_place) {
    pieces_[piece_count_++] = iovec{const_cast<uint8_t*>(data), len};
    referenced_ = true;
  } else if (may_defer && in_place) {
    // Stored by the ICRC's pass (end_packet), which prefetches what follows
    // in the region.
    const uint8_t* region_end = mr.host + mr.length;
    size_t after = size_t(region_end - (data + len));
    copy_ = wire::CopyIn{packet_used_, data, len, std::min(after, wire::kCopyAhead)};
    grow_arena_piece(len);
  } else {
    if (!core::copy_from_mr(mr, packet() + packet_used_, data, len)) return false;
    grow_arena_piece(len);
  }
  payload_len_ += len;
  return true;
}

void TxBatch::refresh_gso_limit() {
  max_segments_ = transport_ ? std::min(transport_->max_gso_segments(), unsigned(wire::kMaxGsoIpId) + 1) : 1;
}

unsigned TxBatch::place(uint32_t len, bool joinable, bool bare) {
  if (run_count_ > 0) {
    Run& r = runs_[run_count_ - 1];
    if (joinable && r.open && r.count < max_segments_ && len <= r.segment && r.bytes + len <= transport::kMaxGsoBytes &&
        r.dst == dst_ && r.src_ip == src_ip_ && r.bare == bare) {
      r.open = len == r.segment;  // a shorter packet ends the message
      r.bytes += len;
      return r.count++;
    }
    r.open = false;
  }
  runs_[run_count_++] = Run{dst_, src_ip_, count_, first_piece_, 0, 1, len, len, joinable && max_segments_ > 1, bare};
  return 0;
}

void TxBatch::finish() {
  runs_[run_count_ - 1].pieces = piece_count_ - runs_[run_count_ - 1].first_piece;
  done_pieces_ = piece_count_;
  arena_used_ += packet_used_;
  ++count_;
}

void TxBatch::coalesce(Run& r) {
  iovec* p = &pieces_[r.first_piece];
  unsigned n = 0;
  for (unsigned i = 0; i < r.pieces; ++i) {
    if (n > 0 && static_cast<uint8_t*>(p[n - 1].iov_base) + p[n - 1].iov_len == p[i].iov_base)
      p[n - 1].iov_len += p[i].iov_len;
    else
      p[n++] = p[i];
  }
  r.pieces = n;
}

uint32_t TxBatch::end_packet(const wire::IpFlow& flow, Icrc icrc) {
  if (in_place_.data) return end_in_place();  // (bare: begun so by the caller)
  if (overflow_) return 0;                    // dropped: the next packet overwrites its bytes
  uint8_t* p = packet();
  unsigned pad = wire::pad_for(payload_len_);
  std::memset(p + packet_used_, 0, pad + wire::kIcrcSize);  // the ICRC covers the pad
  grow_arena_piece(pad);
  uint32_t len = header_len_ + payload_len_ + pad;
  unsigned index = place(len + wire::kIcrcSize, true, icrc == Icrc::kOmit);
  if (icrc == Icrc::kOmit) {
    if (copy_.src) store_deferred_copy();
    grow_arena_piece(wire::kIcrcSize);  // zero
    finish();
    return len + wire::kIcrcSize;
  }
  std::span<const iovec> pieces(&pieces_[first_piece_], piece_count_ - first_piece_);
  // The copying ICRC needs the packet in one buffer; through shared memory a
  // later piece may have been referenced instead: copy first, then gather.
  if (copy_.src && pieces.size() != 1) store_deferred_copy();
  uint32_t crc;
  if (!flow.ipv6) {
    wire::Ipv4Flow f = flow.v4;
    f.ip_id = uint16_t(flow.v4.ip_id + index);  // the kernel counts on from the first
    crc = copy_.src ? wire::icrc_ipv4_copying(f, p, len + wire::kIcrcSize, copy_)
                    : wire::icrc_ipv4(f, pieces, len + wire::kIcrcSize);
  } else {  // IPv6: no identification
    crc = copy_.src ? wire::icrc_ipv6_copying(flow.v6, p, len + wire::kIcrcSize, copy_)
                    : wire::icrc_ipv6(flow.v6, pieces, len + wire::kIcrcSize);
  }
  copy_ = wire::CopyIn{};
  std::memcpy(p + packet_used_, &crc, 4);  // little-endian on the wire (x86)
  grow_arena_piece(wire::kIcrcSize);
  finish();
  return len + wire::kIcrcSize;
}

void TxBatch::store_deferred_copy() {
  std::memcpy(packet() + copy_.at, copy_.src, copy_.len);
  copy_ = wire::CopyIn{};
}

void TxBatch::end_datagram() {
  if (overflow_) return;
  if (copy_.src) store_deferred_copy();
  place(header_len_ + payload_len_, false);
  finish();
}

void TxBatch::flush() {
  if (count_ && transport_) {
    for (unsigned i = 0; i < run_count_; ++i) {
      Run& r = runs_[i];
      coalesce(r);
      datagrams_[i] = transport::TxDatagram{
          r.dst, r.src_ip, uint16_t(r.count > 1 ? r.segment : 0), uint16_t(r.pieces), &pieces_[r.first_piece], r.bare};
    }
    transport_->send_burst(std::span(datagrams_.data(), run_count_));
    refresh_gso_limit();  // GSO may have been refused
  }
  count_ = 0;
  run_count_ = 0;
  piece_count_ = done_pieces_ = 0;
  arena_used_ = 0;
  referenced_ = false;
  memory_known_ = false;
}

}  // namespace uroce::engine
