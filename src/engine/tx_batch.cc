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
  runs_[run_count_++] = Run{dst_, src_ip_, count_, 1, len, len, joinable && max_segments_ > 1};
  return 0;
}

void TxBatch::finish(uint32_t len) {
  iovs_[count_] = iovec{slot(count_), len};
  ++count_;
}

uint32_t TxBatch::end_packet(const wire::IpFlow& flow) {
  if (overflow_) return 0;  // dropped: the slot is reused by the next packet
  uint8_t* p = slot(count_);
  uint32_t len = header_len_ + payload_len_;
  unsigned pad = wire::pad_for(payload_len_);
  std::memset(p + len, 0, pad);  // the ICRC covers the pad
  len += pad;
  unsigned index = place(len + wire::kIcrcSize, true);
  uint32_t crc;
  if (!flow.ipv6) {
    wire::Ipv4Flow f = flow.v4;
    f.ip_id = uint16_t(flow.v4.ip_id + index);  // the kernel counts on from the first
    crc = wire::icrc_ipv4(f, p, len + wire::kIcrcSize);
  } else {
    crc = wire::icrc_ipv6(flow.v6, p, len + wire::kIcrcSize);  // IPv6: no identification
  }
  std::memcpy(p + len, &crc, 4);  // little-endian on the wire (x86)
  finish(len + wire::kIcrcSize);
  return len + wire::kIcrcSize;
}

void TxBatch::end_datagram() {
  if (overflow_) return;
  place(header_len_ + payload_len_, false);
  finish(header_len_ + payload_len_);
}

void TxBatch::flush() {
  if (count_ && transport_) {
    for (unsigned i = 0; i < run_count_; ++i) {
      const Run& r = runs_[i];
      datagrams_[i] = transport::TxDatagram{r.dst, r.src_ip, uint16_t(r.count > 1 ? r.segment : 0), uint16_t(r.count),
                                            &iovs_[r.first]};
    }
    transport_->send_burst(std::span(datagrams_.data(), run_count_));
    refresh_gso_limit();  // GSO may have been refused
  }
  count_ = 0;
  run_count_ = 0;
}

}  // namespace uroce::engine
