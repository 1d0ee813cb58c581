// CaptureTransport (UROCE_PCAP): what it writes to the pcap file for the
// datagrams that pass through it.
#include "transport/capture.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "transport/envelope.h"

namespace uroce::transport {
namespace {

constexpr uint32_t kLoopback = 0x7F000001;
constexpr size_t kFileHeader = 24, kRecordHeader = 16, kIpUdp = 20 + 8;

// Hands out `arrivals` once and accepts every send, noting its first byte in `*sent`.
class Inbox final : public DatagramTransport {
 public:
  Inbox(std::vector<std::vector<uint8_t>> arrivals, std::vector<uint8_t>* sent)
      : arrivals_(std::move(arrivals)), sent_(sent) {}
  size_t send_burst(std::span<TxDatagram> burst) noexcept override {
    for (const TxDatagram& d : burst) sent_->push_back(static_cast<const uint8_t*>(d.iov[0].iov_base)[0]);
    return burst.size();
  }
  size_t recv_burst(std::span<RxDatagram> out, int) noexcept override {
    size_t n = 0;
    for (; n < out.size() && next_ < arrivals_.size(); ++n, ++next_) {
      out[n] = RxDatagram{};
      out[n].data = arrivals_[next_].data();
      out[n].len = uint32_t(arrivals_[next_].size());
      out[n].src = Endpoint{kLoopback, 4791};
      out[n].dst_ip = IpAddress(kLoopback);
    }
    return n;
  }
  void wake() noexcept override {}
  uint16_t local_port() const noexcept override { return 4791; }

 private:
  std::vector<std::vector<uint8_t>> arrivals_;
  std::vector<uint8_t>* sent_;
  size_t next_ = 0;
};

// The first payload byte of every record in the pcap file at `path` (IPv4 records).
std::vector<uint8_t> first_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<uint8_t> firsts;
  for (size_t at = kFileHeader; at + kRecordHeader <= file.size();) {
    uint32_t caplen;
    std::memcpy(&caplen, &file[at + 8], sizeof caplen);
    if (caplen > kIpUdp && at + kRecordHeader + caplen <= file.size())
      firsts.push_back(file[at + kRecordHeader + kIpUdp]);
    at += kRecordHeader + caplen;
  }
  return firsts;
}

// A RoCE packet's first bytes (a SEND Only's BTH, opcode 0x04) and a host
// relay's (kind 0xFE): only the packet is recorded, in either direction, and
// both still pass through to the caller and to the inner transport.
TEST(CaptureTest, InternalDatagramsPassButAreNotRecorded) {
  std::string path = testing::TempDir() + "capture_test-" + std::to_string(getpid()) + ".pcap";
  std::vector<uint8_t> packet(40, 0), relay(40, 0);
  packet[0] = 0x04;
  relay[0] = uint8_t(Envelope::kHostRelay);
  std::vector<uint8_t> sent;
  {
    CaptureTransport capture(std::make_unique<Inbox>(std::vector{packet, relay}, &sent),
                             PcapWriter::open(path, 1 << 20));
    RxDatagram rx[4];
    ASSERT_EQ(capture.recv_burst(rx, 0), 2u);
    EXPECT_EQ(rx[1].data[0], uint8_t(Envelope::kHostRelay));
    iovec iov[2] = {{relay.data(), relay.size()}, {packet.data(), packet.size()}};
    TxDatagram tx[2];
    for (unsigned i = 0; i < 2; ++i) {
      tx[i].dst = Endpoint{kLoopback, 5000};
      tx[i].iov = &iov[i];
      tx[i].iovcnt = 1;
    }
    ASSERT_EQ(capture.send_burst(tx), 2u);
    EXPECT_EQ(sent, (std::vector<uint8_t>{uint8_t(Envelope::kHostRelay), 0x04}));
  }  // the writer writes what is pending and closes the file
  EXPECT_EQ(first_bytes(path), (std::vector<uint8_t>{0x04, 0x04}));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace uroce::transport
