#include "transport/capture.h"

#include <arpa/inet.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/envelope.h"

namespace uroce::transport {

namespace {

constexpr uint32_t kIpv4HeaderLen = 20, kIpv6HeaderLen = 40, kUdpHeaderLen = 8;

// pcap file header (classic format, microsecond timestamps, host byte order).
struct FileHeader {
  uint32_t magic = 0xa1b2c3d4;
  uint16_t major = 2, minor = 4;
  int32_t zone = 0;
  uint32_t sigfigs = 0;
  uint32_t snaplen = 65535;
  uint32_t linktype = PcapWriter::kLinkTypeRaw;
};

struct RecordHeader {
  uint32_t sec, usec, caplen, len;
};

void put16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}
void put32(uint8_t* p, uint32_t v) {
  put16(p, uint16_t(v >> 16));
  put16(p + 2, uint16_t(v));
}

// By the destination's family (a source may be left to the kernel).
uint32_t ip_header_len(const Endpoint& dst) { return dst.ip.is_v4() ? kIpv4HeaderLen : kIpv6HeaderLen; }

// IPv6 header (traffic class and flow label 0, hop limit 64, UDP) and UDP
// header for a datagram of `len` bytes, which follows at h + 48. IPv6 makes
// the UDP checksum mandatory, so it is computed (RFC 8200 §8.1).
void fill_headers6(uint8_t* h, const Endpoint& src, const Endpoint& dst, uint32_t len) {
  std::memset(h, 0, kIpv6HeaderLen + kUdpHeaderLen);
  h[0] = 0x60;
  put16(h + 4, uint16_t(kUdpHeaderLen + len));
  h[6] = IPPROTO_UDP;
  h[7] = 64;
  std::memcpy(h + 8, src.ip.bytes.data(), 16);
  std::memcpy(h + 24, dst.ip.bytes.data(), 16);
  uint8_t* u = h + kIpv6HeaderLen;
  put16(u, src.port);
  put16(u + 2, dst.port);
  put16(u + 4, uint16_t(kUdpHeaderLen + len));
  // Pseudo-header (addresses, UDP length, next header) + UDP header + payload.
  uint64_t sum = kUdpHeaderLen + len + IPPROTO_UDP;
  for (unsigned i = 8; i < kIpv6HeaderLen; i += 2) sum += uint32_t(h[i]) << 8 | h[i + 1];
  const uint8_t* p = u;
  uint32_t n = kUdpHeaderLen + len;
  for (; n >= 2; p += 2, n -= 2) sum += uint32_t(p[0]) << 8 | p[1];
  if (n) sum += uint32_t(p[0]) << 8;
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  uint16_t check = uint16_t(~sum);
  put16(u + 6, check ? check : 0xFFFF);
}

// IPv4 header (DF, TTL 64, UDP) and UDP header for a datagram of `len` bytes.
void fill_headers(uint8_t* h, Endpoint src, Endpoint dst, uint16_t ip_id, uint32_t len) {
  std::memset(h, 0, kIpv4HeaderLen + kUdpHeaderLen);
  h[0] = 0x45;
  put16(h + 2, uint16_t(kIpv4HeaderLen + kUdpHeaderLen + len));
  put16(h + 4, ip_id);
  put16(h + 6, 0x4000);  // DF, as uroce's sockets send (IP_PMTUDISC_DO)
  h[8] = 64;
  h[9] = IPPROTO_UDP;
  put32(h + 12, src.ip.v4());
  put32(h + 16, dst.ip.v4());
  uint32_t sum = 0;
  for (unsigned i = 0; i < kIpv4HeaderLen; i += 2) sum += uint32_t(h[i]) << 8 | h[i + 1];
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  put16(h + 10, uint16_t(~sum));
  uint8_t* u = h + kIpv4HeaderLen;
  put16(u, src.port);
  put16(u + 2, dst.port);
  put16(u + 4, uint16_t(kUdpHeaderLen + len));
}

}  // namespace

std::unique_ptr<PcapWriter> PcapWriter::open(const std::string& path, uint64_t limit_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wbe");
  if (!f) return nullptr;
  FileHeader h;
  if (std::fwrite(&h, sizeof h, 1, f) != 1) {
    int e = errno;
    std::fclose(f);
    errno = e;
    return nullptr;
  }
  std::fflush(f);
  return std::unique_ptr<PcapWriter>(new PcapWriter(f, path, limit_bytes));
}

PcapWriter::PcapWriter(std::FILE* file, std::string path, uint64_t limit_bytes)
    : file_(file), path_(std::move(path)), limit_(limit_bytes), file_bytes_(sizeof(FileHeader)) {
  pending_.reserve(kWakeWriterAt * 2);
  thread_ = std::thread([this] { run(); });
}

PcapWriter::~PcapWriter() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
  std::fclose(file_);
}

void PcapWriter::record(Endpoint src, Endpoint dst, uint16_t ip_id, const iovec* pieces, unsigned npieces,
                        size_t offset, uint32_t len) noexcept {
  uint32_t ip_len = ip_header_len(dst);
  uint32_t wire_len = ip_len + kUdpHeaderLen + len;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  RecordHeader rh{uint32_t(now.tv_sec), uint32_t(now.tv_nsec / 1000), wire_len, wire_len};
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    size_t at = pending_.size();
    if (at + sizeof rh + wire_len > kMaxPending) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    pending_.resize(at + sizeof rh + wire_len);
    uint8_t* p = pending_.data() + at;
    std::memcpy(p, &rh, sizeof rh);
    p += sizeof rh;
    uint8_t* headers = p;
    uint32_t payload_len = len;
    if (ip_len == kIpv4HeaderLen) fill_headers(p, src, dst, ip_id, len);
    p += ip_len + kUdpHeaderLen;
    // The datagram's bytes [offset, offset + len) of the gathered pieces.
    for (unsigned i = 0; i < npieces && len > 0; ++i) {
      size_t n = pieces[i].iov_len;
      if (offset >= n) {
        offset -= n;
        continue;
      }
      size_t take = std::min<size_t>(n - offset, len);
      std::memcpy(p, static_cast<const uint8_t*>(pieces[i].iov_base) + offset, take);
      p += take;
      len -= uint32_t(take);
      offset = 0;
    }
    if (ip_len == kIpv6HeaderLen) fill_headers6(headers, src, dst, payload_len);  // the checksum covers the payload
    wake = pending_.size() >= kWakeWriterAt && at < kWakeWriterAt;
  }
  if (wake) cv_.notify_one();
}

void PcapWriter::run() {
  std::vector<uint8_t> out;
  out.reserve(kWakeWriterAt * 2);
  std::unique_lock lock(mu_);
  for (;;) {
    // Pending records wait at most 100 ms; with none pending, no wake-ups.
    if (pending_.empty() && !stop_)
      cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
    else if (!stop_ && pending_.size() < kWakeWriterAt)
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_ || pending_.size() >= kWakeWriterAt; });
    out.swap(pending_);
    bool stopping = stop_;
    lock.unlock();
    // Whole records only, while the file stays within its limit.
    size_t at = 0;
    while (at + sizeof(RecordHeader) <= out.size()) {
      RecordHeader rh;
      std::memcpy(&rh, out.data() + at, sizeof rh);
      size_t n = sizeof rh + rh.caplen;
      if (file_bytes_ + n > limit_) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
      } else if (std::fwrite(out.data() + at, n, 1, file_) == 1) {
        file_bytes_ += n;
        written_.fetch_add(1, std::memory_order_relaxed);
      } else {
        dropped_.fetch_add(1, std::memory_order_relaxed);
      }
      at += n;
    }
    std::fflush(file_);
    out.clear();
    lock.lock();
    if (stopping && pending_.empty()) return;
  }
}

size_t CaptureTransport::send_burst(std::span<TxDatagram> burst) noexcept {
  size_t sent = inner_->send_burst(burst);
  Endpoint src{0, inner_->local_port()};
  for (size_t i = 0; i < sent; ++i) {
    const TxDatagram& d = burst[i];
    if (is_envelope(d)) continue;  // no RoCE packet (capture.h)
    size_t total = 0;
    for (unsigned k = 0; k < d.iovcnt; ++k) total += d.iov[k].iov_len;
    src.ip = d.src_ip;
    // A GSO message leaves as datagrams of segment_size bytes, numbered 0, 1, ...
    size_t step = d.segment_size ? d.segment_size : std::max<size_t>(total, 1);
    uint16_t id = 0;
    for (size_t off = 0; off < total; off += step, ++id)
      writer_->record(src, d.dst, id, d.iov, d.iovcnt, off, uint32_t(std::min(step, total - off)));
  }
  return sent;
}

size_t CaptureTransport::recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept {
  size_t n = inner_->recv_burst(out, timeout_ms);
  for (size_t i = 0; i < n; ++i) {
    const RxDatagram& d = out[i];
    // A same-host jumbo packet (from a peer that does not capture) is no
    // datagram of any wire: no ICRC, longer than an MTU. Not recorded.
    if (d.jumbo || envelope_of(d) != Envelope::kNone) continue;
    iovec piece{d.data, d.len};
    Endpoint dst{d.dst_ip, d.dst_port ? d.dst_port : inner_->local_port()};
    writer_->record(d.src, dst, d.gso_index, &piece, 1, 0, d.len);
  }
  return n;
}

}  // namespace uroce::transport
