#include "engine/tx_batch.h"

#include <cstring>

namespace uroce::engine {

TxBatch::TxBatch() : bounce_(new uint8_t[size_t(kMaxPackets) * kBounceSize]) {}

TxBatch& TxBatch::local() {
  thread_local TxBatch batch;
  return batch;
}

void TxBatch::use(transport::DatagramTransport* t) {
  if (t != transport_) {
    flush();
    transport_ = t;
  }
}

uint8_t* TxBatch::begin_packet(const transport::Endpoint& dst, uint32_t src_ip, unsigned header_len) {
  if (count_ == kMaxPackets) flush();
  Slot& s = slots_[count_];
  std::memset(s.header, 0, header_len);
  s.header_len = header_len;
  s.pieces = 0;
  s.payload_len = 0;
  s.bounced = false;
  transport::TxDatagram& d = datagrams_[count_];
  d.dst = dst;
  d.src_ip = src_ip;
  return s.header;
}

void TxBatch::bounce(Slot& s) {
  uint8_t* buf = bounce_.get() + size_t(count_) * kBounceSize;
  uint32_t off = 0;
  for (unsigned i = 0; i < s.pieces; ++i) {
    std::memcpy(buf + off, s.piece[i], s.piece_len[i]);
    off += s.piece_len[i];
  }
  s.piece[0] = buf;
  s.piece_len[0] = off;
  s.pieces = 1;
  s.bounced = true;
}

void TxBatch::add_payload(const uint8_t* data, uint32_t len) {
  if (len == 0) return;
  Slot& s = slots_[count_];
  if (s.bounced) {
    std::memcpy(const_cast<uint8_t*>(s.piece[0]) + s.piece_len[0], data, len);
    s.piece_len[0] += len;
  } else {
    s.piece[s.pieces] = data;
    s.piece_len[s.pieces] = len;
    ++s.pieces;
    if (s.pieces > kMaxPayloadPieces) bounce(s);
  }
  s.payload_len += len;
}

void TxBatch::end_packet(const wire::Ipv4Flow& flow) {
  Slot& s = slots_[count_];
  transport::TxDatagram& d = datagrams_[count_];
  unsigned pad = (4 - (s.payload_len & 3)) & 3;
  std::memset(s.trailer, 0, 4);
  unsigned n = 0;
  d.iov[n++] = iovec{s.header, s.header_len};
  for (unsigned i = 0; i < s.pieces; ++i) d.iov[n++] = iovec{const_cast<uint8_t*>(s.piece[i]), s.piece_len[i]};
  // The trailer holds the pad bytes then the ICRC; the CRC covers the pad.
  d.iov[n] = iovec{s.trailer, pad};
  size_t total = s.header_len + s.payload_len + pad + wire::kIcrcSize;
  uint32_t crc = wire::icrc_ipv4(flow, std::span<const iovec>(d.iov, n + 1), total);
  std::memcpy(s.trailer + pad, &crc, 4);  // little-endian on the wire (x86)
  d.iov[n].iov_len = pad + wire::kIcrcSize;
  d.iovcnt = uint8_t(n + 1);
  ++count_;
}

void TxBatch::end_datagram() {
  Slot& s = slots_[count_];
  transport::TxDatagram& d = datagrams_[count_];
  unsigned n = 0;
  d.iov[n++] = iovec{s.header, s.header_len};
  for (unsigned i = 0; i < s.pieces; ++i) d.iov[n++] = iovec{const_cast<uint8_t*>(s.piece[i]), s.piece_len[i]};
  d.iovcnt = uint8_t(n);
  ++count_;
}

void TxBatch::flush() {
  if (count_ && transport_) transport_->send_burst(std::span(datagrams_.data(), count_));
  count_ = 0;
}

}  // namespace uroce::engine
