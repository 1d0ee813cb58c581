// Floods the host's RoCE port (QP1 at UDP 4791) with what a hostile or broken
// network can send a CM: random datagrams, RoCE packets with a bad ICRC or cut
// short, UD SENDs to QP1 with the wrong Q_Key, a MAD of another class or a MAD
// cut short, malformed CM MADs (a bad base or class version; ClassPortInfo,
// LAP, APR or an unknown attribute), and well-formed CM MADs that name no
// connection (REQs and SIDR_REQs for services nobody serves,
// REP/RTU/REJ/DREQ/DREP/MRA with unknown communication IDs). Each
// kind is sent in turn, `rate` datagrams a second, for `seconds`; the process
// that owns the port must drop and count them while it goes on serving real
// connections (run_qp1_flood.sh). Prints how many of each it sent.
//
//   qp1_flood ADDRESS PORT SECONDS RATE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <thread>
#include <vector>

#include "rdmacm/cm_messages.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace {

using namespace uroce;

constexpr uint32_t kQp1 = 1;
constexpr size_t kBthDeth = wire::kBthSize + wire::kHdrSize[unsigned(wire::Hdr::kDeth)];
// rdma_cm's service IDs in the TCP port space: 0x0000000001060000 + port. The
// flood's ports are far from the ones the tests listen on.
constexpr uint64_t kPsTcpService = 0x0000000001060000ull;
constexpr uint16_t kFloodServicePort = 40000;

enum Kind {
  kRandom,
  kBadIcrc,
  kShort,
  kWrongQkey,
  kNotCm,
  kShortMad,
  kBadVersion,
  kUnknownAttr,
  kReq,
  kSidrReq,
  kStray,
  kKinds
};
const char* const kKindNames[kKinds] = {"random",      "bad_icrc",     "short", "wrong_qkey", "not_cm", "short_mad",
                                        "bad_version", "unknown_attr", "req",   "sidr_req",   "stray"};

struct Flood {
  int fd = -1;
  sockaddr_in to{};
  wire::Ipv4Flow flow;
  std::mt19937_64 rng{20261129};
  uint32_t psn = 0;
};

// A UD SEND_ONLY to QP1 carrying `mad`, with its ICRC (bad if `corrupt`).
std::vector<uint8_t> qp1_packet(Flood& f, std::span<const uint8_t> mad, uint32_t qkey, bool corrupt) {
  std::vector<uint8_t> p(kBthDeth + mad.size() + wire::kIcrcSize);
  uint8_t opcode = wire::make_opcode(wire::Service::kUd, wire::Operation::kSendOnly);
  wire::Bth(p.data()).fill(opcode, false, 0, wire::kDefaultPkey, kQp1, false, f.psn++ & 0xFFFFFF);
  wire::Deth(p.data() + wire::kBthSize).fill(qkey, kQp1);
  std::memcpy(p.data() + kBthDeth, mad.data(), mad.size());
  uint32_t icrc = wire::icrc_ipv4(f.flow, p.data(), p.size()) ^ (corrupt ? 1u : 0u);
  std::memcpy(p.data() + p.size() - wire::kIcrcSize, &icrc, wire::kIcrcSize);
  return p;
}

std::vector<uint8_t> random_bytes(Flood& f, size_t n) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = uint8_t(f.rng());
  return b;
}

rdmacm::Mad cm_mad(Flood& f, const rdmacm::CmMessage& m) { return rdmacm::encode_mad(f.rng(), m); }

// A well-formed CM MAD for no connection: one of REP, RTU, REJ, DREQ, DREP, MRA.
rdmacm::Mad stray_mad(Flood& f) {
  uint32_t a = uint32_t(f.rng()), b = uint32_t(f.rng());
  switch (f.rng() % 6) {
    case 0:
      return cm_mad(f, rdmacm::RepMessage{.local_comm_id = a, .remote_comm_id = b, .local_qpn = 0x123});
    case 1:
      return cm_mad(f, rdmacm::RtuMessage{.local_comm_id = a, .remote_comm_id = b});
    case 2:
      return cm_mad(f, rdmacm::RejMessage{.local_comm_id = a, .remote_comm_id = b, .reason = 28});
    case 3:
      return cm_mad(f, rdmacm::DreqMessage{.local_comm_id = a, .remote_comm_id = b, .remote_qpn = 0x456});
    case 4:
      return cm_mad(f, rdmacm::DrepMessage{.local_comm_id = a, .remote_comm_id = b});
    default: {
      // An MRA (the CM sends none and takes none): an RTU's comm IDs, attribute 0x0011.
      auto m = cm_mad(f, rdmacm::RtuMessage{.local_comm_id = a, .remote_comm_id = b});
      m[17] = 0x11;
      return m;
    }
  }
}

// A stray CM MAD that is malformed: a base version or class version other
// than the CM's, or an attribute the CM does not take.
rdmacm::Mad bad_version_mad(Flood& f) {
  auto m = stray_mad(f);
  m[f.rng() % 2 ? 0 : 2] ^= uint8_t(1 + f.rng() % 255);
  return m;
}
rdmacm::Mad unknown_attr_mad(Flood& f) {
  static constexpr uint16_t kAttrs[] = {0x0001, 0x0019, 0x001A, 0x0020, 0xFF10};  // ClassPortInfo, LAP, APR, ...
  auto m = stray_mad(f);
  uint16_t attr = kAttrs[f.rng() % std::size(kAttrs)];
  m[16] = uint8_t(attr >> 8);
  m[17] = uint8_t(attr);
  return m;
}

std::vector<uint8_t> datagram(Flood& f, Kind k) {
  uint64_t service = kPsTcpService + kFloodServicePort + f.rng() % 1000;
  switch (k) {
    case kRandom:
      return random_bytes(f, f.rng() % 1500);
    case kBadIcrc:
      return qp1_packet(f, stray_mad(f), wire::kGsiQkey, true);
    case kShort: {
      auto p = qp1_packet(f, stray_mad(f), wire::kGsiQkey, false);
      p.resize(f.rng() % p.size());
      return p;
    }
    case kWrongQkey:
      return qp1_packet(f, stray_mad(f), uint32_t(f.rng()) | 1, false);
    case kNotCm: {
      auto mad = random_bytes(f, 256);
      mad[1] = 0x81;  // a management class that is not the CM's
      return qp1_packet(f, mad, wire::kGsiQkey, false);
    }
    case kShortMad: {  // a valid packet (its ICRC right) with less than a MAD
      auto mad = stray_mad(f);
      return qp1_packet(f, std::span<const uint8_t>(mad.data(), f.rng() % mad.size()), wire::kGsiQkey, false);
    }
    case kBadVersion:
      return qp1_packet(f, bad_version_mad(f), wire::kGsiQkey, false);
    case kUnknownAttr:
      return qp1_packet(f, unknown_attr_mad(f), wire::kGsiQkey, false);
    case kReq:
      return qp1_packet(f, cm_mad(f, rdmacm::ReqMessage{.local_comm_id = uint32_t(f.rng()), .service_id = service}),
                        wire::kGsiQkey, false);
    case kSidrReq:
      return qp1_packet(f, cm_mad(f, rdmacm::SidrReqMessage{.request_id = uint32_t(f.rng()), .service_id = service}),
                        wire::kGsiQkey, false);
    default:
      return qp1_packet(f, stray_mad(f), wire::kGsiQkey, false);
  }
}

bool open_socket(Flood& f, const char* address, int port) {
  f.fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (f.fd < 0) return false;
  f.to.sin_family = AF_INET;
  f.to.sin_port = htons(uint16_t(port));
  if (inet_pton(AF_INET, address, &f.to.sin_addr) != 1) return false;
  if (connect(f.fd, reinterpret_cast<sockaddr*>(&f.to), sizeof f.to) != 0) return false;
  sockaddr_in me{};
  socklen_t len = sizeof me;
  if (getsockname(f.fd, reinterpret_cast<sockaddr*>(&me), &len) != 0) return false;
  f.flow.src_ip = ntohl(me.sin_addr.s_addr);
  f.flow.dst_ip = ntohl(f.to.sin_addr.s_addr);
  f.flow.src_port = ntohs(me.sin_port);
  f.flow.dst_port = uint16_t(port);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: qp1_flood ADDRESS PORT SECONDS RATE\n");
    return 2;
  }
  Flood f;
  if (!open_socket(f, argv[1], std::atoi(argv[2]))) {
    std::perror("qp1_flood: socket");
    return 1;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(std::atoi(argv[3]));
  const auto gap = std::chrono::nanoseconds(1'000'000'000 / std::max(1, std::atoi(argv[4])));
  std::array<long, kKinds> sent{};
  auto next = std::chrono::steady_clock::now();
  for (unsigned i = 0; std::chrono::steady_clock::now() < end; ++i) {
    Kind k = Kind(i % kKinds);
    auto d = datagram(f, k);
    // ECONNREFUSED: no process had the port for a moment; go on.
    if (send(f.fd, d.data(), d.size(), 0) >= 0) ++sent[k];
    next += gap;
    std::this_thread::sleep_until(next);
  }
  std::printf("qp1_flood: sent");
  for (int k = 0; k < kKinds; ++k) std::printf(" %s %ld%s", kKindNames[k], sent[k], k + 1 < kKinds ? "," : "\n");
  return 0;
}
