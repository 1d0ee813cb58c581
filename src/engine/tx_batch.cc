#include "engine/tx_batch.h"

#include <algorithm>
#include <cstring>

#include "core/mr_access.h"
#include "wire/headers.h"

namespace uroce::engine {

TxBatch::TxBatch() : buffers_(new uint8_t[size_t(kMaxPackets) * kSlotBytes]) {}

TxBatch& TxBatch::local() {
  thread_local TxBatch batch;
  return batch;
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
  if (count_ == kMaxPackets) flush();
  uint8_t* h = slot(count_);
  std::memset(h, 0, header_len);
  header_len_ = header_len;
  payload_len_ = 0;
  overflow_ = false;
  dst_ = dst;
  src_ip_ = src_ip;
  // (a packet dropped or abandoned before its end leaves no piece behind)
  first_piece_ = piece_count_ = done_pieces_;
  pieces_[piece_count_++] = iovec{h, header_len};
  slot_used_ = header_len;
  return h;
}

bool TxBatch::room_for_payload(uint32_t len) {
  if (len <= kMaxPayload - payload_len_) return true;
  overflow_ = true;
  return false;
}

void TxBatch::grow_slot_piece(uint32_t len) {
  uint8_t* at = slot(count_) + slot_used_;
  slot_used_ += len;
  iovec& last = pieces_[piece_count_ - 1];
  if (static_cast<uint8_t*>(last.iov_base) + last.iov_len == at)
    last.iov_len += len;
  else
    pieces_[piece_count_++] = iovec{at, len};
}

bool TxBatch::add_payload(const uint8_t* data, uint32_t len) {
  if (!room_for_payload(len)) return false;
  std::memcpy(slot(count_) + slot_used_, data, len);
  payload_len_ += len;
  grow_slot_piece(len);
  return true;
}

bool TxBatch::add_payload_from(const core::Mr& mr, const uint8_t* data, uint32_t len) {
  if (!room_for_payload(len)) return false;
  // A referenced piece leaves room for a slot piece after it, which every
  // later copy, the pad and the ICRC then extend: a packet never has more
  // than kMaxPacketPieces pieces.
  bool room = piece_count_ - first_piece_ + 2 <= transport::kMaxPacketPieces;
  if (references_ok_ && room && len >= kMinReference && !core::is_on_demand(mr)) {
    pieces_[piece_count_++] = iovec{const_cast<uint8_t*>(data), len};
    referenced_ = true;
  } else {
    if (!core::copy_from_mr(mr, slot(count_) + slot_used_, data, len)) return false;
    grow_slot_piece(len);
  }
  payload_len_ += len;
  return true;
}

void TxBatch::refresh_gso_limit() {
  max_segments_ = transport_ ? std::min(transport_->max_gso_segments(), unsigned(wire::kMaxGsoIpId) + 1) : 1;
}

unsigned TxBatch::place(uint32_t len, bool joinable) {
  if (run_count_ > 0) {
    Run& r = runs_[run_count_ - 1];
    if (joinable && r.open && r.count < max_segments_ && len <= r.segment && r.bytes + len <= transport::kMaxGsoBytes &&
        r.dst == dst_ && r.src_ip == src_ip_) {
      r.open = len == r.segment;  // a shorter packet ends the message
      r.bytes += len;
      return r.count++;
    }
    r.open = false;
  }
  runs_[run_count_++] = Run{dst_, src_ip_, count_, first_piece_, 0, 1, len, len, joinable && max_segments_ > 1};
  return 0;
}

void TxBatch::finish() {
  runs_[run_count_ - 1].pieces = piece_count_ - runs_[run_count_ - 1].first_piece;
  done_pieces_ = piece_count_;
  ++count_;
}

uint32_t TxBatch::end_packet(const wire::IpFlow& flow) {
  if (overflow_) return 0;  // dropped: the slot is reused by the next packet
  uint8_t* p = slot(count_);
  unsigned pad = wire::pad_for(payload_len_);
  std::memset(p + slot_used_, 0, pad + wire::kIcrcSize);  // the ICRC covers the pad
  grow_slot_piece(pad);
  uint32_t len = header_len_ + payload_len_ + pad;
  unsigned index = place(len + wire::kIcrcSize, true);
  std::span<const iovec> packet(&pieces_[first_piece_], piece_count_ - first_piece_);
  uint32_t crc;
  if (!flow.ipv6) {
    wire::Ipv4Flow f = flow.v4;
    f.ip_id = uint16_t(flow.v4.ip_id + index);  // the kernel counts on from the first
    crc = wire::icrc_ipv4(f, packet, len + wire::kIcrcSize);
  } else {
    crc = wire::icrc_ipv6(flow.v6, packet, len + wire::kIcrcSize);  // IPv6: no identification
  }
  std::memcpy(p + slot_used_, &crc, 4);  // little-endian on the wire (x86)
  grow_slot_piece(wire::kIcrcSize);
  finish();
  return len + wire::kIcrcSize;
}

void TxBatch::end_datagram() {
  if (overflow_) return;
  place(header_len_ + payload_len_, false);
  finish();
}

void TxBatch::flush() {
  if (count_ && transport_) {
    for (unsigned i = 0; i < run_count_; ++i) {
      const Run& r = runs_[i];
      datagrams_[i] = transport::TxDatagram{r.dst, r.src_ip, uint16_t(r.count > 1 ? r.segment : 0), uint16_t(r.pieces),
                                            &pieces_[r.first_piece]};
    }
    transport_->send_burst(std::span(datagrams_.data(), run_count_));
    refresh_gso_limit();  // GSO may have been refused
  }
  count_ = 0;
  run_count_ = 0;
  piece_count_ = done_pieces_ = 0;
  referenced_ = false;
}

}  // namespace uroce::engine
