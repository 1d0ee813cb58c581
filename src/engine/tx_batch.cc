#include "engine/tx_batch.h"

#include <cstring>

#include "core/mr_access.h"

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
}

uint8_t* TxBatch::begin_packet(const transport::Endpoint& dst, uint32_t src_ip, unsigned header_len) {
  if (count_ == kMaxPackets) flush();
  uint8_t* h = slot(count_);
  std::memset(h, 0, header_len);
  header_len_ = header_len;
  payload_len_ = 0;
  overflow_ = false;
  transport::TxDatagram& d = datagrams_[count_];
  d.dst = dst;
  d.src_ip = src_ip;
  return h;
}

bool TxBatch::add_payload(const uint8_t* data, uint32_t len) {
  if (len > kMaxPayload - payload_len_) {
    overflow_ = true;
    return false;
  }
  std::memcpy(slot(count_) + header_len_ + payload_len_, data, len);
  payload_len_ += len;
  return true;
}

bool TxBatch::add_payload_from(const core::Mr& mr, const uint8_t* data, uint32_t len) {
  if (len > kMaxPayload - payload_len_) {
    overflow_ = true;
    return false;
  }
  if (!core::copy_from_mr(mr, slot(count_) + header_len_ + payload_len_, data, len)) return false;
  payload_len_ += len;
  return true;
}

void TxBatch::finish(uint32_t len) {
  if (overflow_) return;  // dropped: the slot is reused by the next packet
  transport::TxDatagram& d = datagrams_[count_];
  d.iov[0] = iovec{slot(count_), len};
  d.iovcnt = 1;
  ++count_;
}

void TxBatch::end_packet(const wire::Ipv4Flow& flow) {
  uint8_t* p = slot(count_);
  uint32_t len = header_len_ + payload_len_;
  unsigned pad = (4 - (payload_len_ & 3)) & 3;
  std::memset(p + len, 0, pad);  // the ICRC covers the pad
  len += pad;
  uint32_t crc = wire::icrc_ipv4(flow, p, len + wire::kIcrcSize);
  std::memcpy(p + len, &crc, 4);  // little-endian on the wire (x86)
  finish(len + wire::kIcrcSize);
}

void TxBatch::end_datagram() { finish(header_len_ + payload_len_); }

void TxBatch::flush() {
  if (count_ && transport_) transport_->send_burst(std::span(datagrams_.data(), count_));
  count_ = 0;
}

}  // namespace uroce::engine
