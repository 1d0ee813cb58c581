// Packet capture (UROCE_PCAP=FILE): every datagram a transport sends and
// receives — through a socket or through the same-host path's shared memory,
// which no capture on an interface sees — written to a pcap file that
// Wireshark/tshark decode (decode UDP on uroce's ports as "infiniband").
// A capturing transport sends no jumbo packets (DatagramTransport::
// send_jumbo: it answers kNotLocal, so large messages go as MTU packets), and
// the jumbo packets a non-capturing peer sends it are not recorded. Nor are
// the internal datagrams the host's engines send each other beside RoCE
// packets (transport/envelope.h): they are no packets of any RoCE wire, and
// a packet relayed from the host's port shows in the capture of the engine
// that received it from the network.
//
// CaptureTransport decorates the transport stack below fault injection, so
// the file holds what actually left and arrived. Each record is a raw IP
// packet (link type 101, LINKTYPE_RAW: IPv4 or IPv6 by its version field)
// whose IP and UDP headers are synthesised from the datagram's addresses,
// with the fields the RoCEv2 ICRC covers as uroce's sender used them. IPv4:
// DF set, the identification of a GSO message's k-th segment is k (as the
// kernel numbers them; 0 for a datagram sent alone), and a received
// datagram's is its place in the GRO batch it arrived in (wire/icrc.h); so
// the ICRC of every captured RoCE packet verifies, except for a received
// segment whose GRO batch was not a whole GSO message. The UDP checksum is 0
// (none, allowed over IPv4). IPv6: traffic class and flow label 0, hop limit
// 64 (all masked by the ICRC), and the UDP checksum, which IPv6 requires.
//
// Off the critical path: records are appended to a memory buffer (one copy,
// under a mutex held for that copy) and a writer thread writes them out. The
// buffer holds at most kMaxPending bytes and the file at most `limit` bytes
// (UROCE_PCAP_LIMIT_MB); records beyond either are dropped and counted, and
// the count is logged when the device closes.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/datagram.h"

namespace uroce::transport {

class PcapWriter {
 public:
  static constexpr size_t kMaxPending = 32u << 20;
  static constexpr size_t kWakeWriterAt = 256u << 10;
  static constexpr uint32_t kLinkTypeRaw = 101;  // raw IPv4 or IPv6

  // Creates `path` (truncated) with the pcap file header; nullptr + errno.
  static std::unique_ptr<PcapWriter> open(const std::string& path, uint64_t limit_bytes);
  ~PcapWriter();  // writes what is pending, closes the file
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;

  // One UDP datagram `len` bytes long, gathered from `pieces` starting
  // `offset` bytes in, from `src` to `dst` with IP identification `ip_id`.
  // Thread-safe.
  void record(Endpoint src, Endpoint dst, uint16_t ip_id, const iovec* pieces, unsigned npieces, size_t offset,
              uint32_t len) noexcept;

  uint64_t written() const { return written_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  const std::string& path() const { return path_; }

 private:
  PcapWriter(std::FILE* file, std::string path, uint64_t limit_bytes);
  void run();

  std::FILE* file_;
  std::string path_;
  uint64_t limit_;
  uint64_t file_bytes_ = 0;  // writer thread only
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint8_t> pending_;  // guarded by mu_
  bool stop_ = false;             // guarded by mu_
  std::atomic<uint64_t> written_{0}, dropped_{0};
  std::thread thread_;
};

class CaptureTransport final : public DatagramTransport {
 public:
  CaptureTransport(std::unique_ptr<DatagramTransport> inner, std::unique_ptr<PcapWriter> writer)
      : inner_(std::move(inner)), writer_(std::move(writer)) {}

  size_t send_burst(std::span<TxDatagram> burst) noexcept override;
  size_t recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept override;
  void wake() noexcept override { inner_->wake(); }
  void wait(int timeout_ms) noexcept override { inner_->wait(timeout_ms); }
  uint16_t local_port() const noexcept override { return inner_->local_port(); }
  uint16_t host_port() const noexcept override { return inner_->host_port(); }
  unsigned max_gso_segments() const noexcept override { return inner_->max_gso_segments(); }
  bool gro() const noexcept override { return inner_->gro(); }
  bool more_ready() const noexcept override { return inner_->more_ready(); }

  DatagramTransport* decorated() noexcept override { return inner_.get(); }
  const PcapWriter& writer() const { return *writer_; }

 private:
  std::unique_ptr<DatagramTransport> inner_;
  std::unique_ptr<PcapWriter> writer_;
};

}  // namespace uroce::transport
