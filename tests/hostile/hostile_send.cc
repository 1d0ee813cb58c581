// hostile_send: sends crafted RoCEv2 datagrams at a uroce (or any RoCEv2) endpoint, for
// the `hostile` tests. Every packet carries a correct ICRC,
// computed for the addresses and ports it actually travels with (roce-facts §3.1), so
// the receiver's ICRC check lets it through and its trust decisions are what is tested.
//
//   hostile_send --to IP:PORT --from IP [options] ATTACK...
//
// The socket is unconnected with DF set, so the kernel sends IPv4 identification 0, which
// the ICRC covers (design §4). For each ATTACK, hostile_send prints
//
//   sent N ATTACK qpn 0xQ..0xQ' to IP:PORT from IP:PORT
//   expect COUNTER[+COUNTER...] N
//
// where the expect line names the receiver's UROCE_STATS counters of which at least N
// (summed) must have been counted if the receiver drops every one of these packets:
// `bad_path` for valid packets off the QP's path (--path off), `ghost` for responses
// (`dropped_state` if the QP has no requester: RTR, as ib_write_bw's server) and
// `out_of_sequence+duplicates` for requests on the path with PSNs out of the window,
// `no_qp` added when scanning QPNs, and `malformed` / `bad_icrc` / `no_qp` for the
// attacks that never reach a QP.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace {

using namespace uroce::wire;

constexpr uint32_t kHugeReadLen = 1u << 30;  // 1 GiB READ request
constexpr size_t kOversizedPayload = 16384;  // beyond uroce's 9216-byte receive slots
constexpr uint64_t kMaxDatagrams = 1000000;  // bound on one invocation
constexpr unsigned kPayloadLen = 64;

// What an attack's packets are, as far as the receiver's checks go.
enum class Kind {
  kRequest,   // reaches a QP's responder (or is dropped before it)
  kResponse,  // reaches a QP's completer (or is dropped before it)
  kFraming,   // never reaches a QP: malformed or bad ICRC
  kNoQp,      // addressed to QPN 0 or 1
};

struct Options {
  uint32_t dst_ip = 0;
  uint16_t dst_port = 0;
  uint32_t src_ip = 0;
  uint16_t src_port = 0;  // 0: any
  uint32_t qpn = 0;
  uint32_t qpn_count = 1;
  bool psn_random = false;
  uint32_t psn = 0;
  uint32_t psn_step = 0;
  uint32_t avoid_psn = 0, avoid_len = 0;  // --psn random never picks these
  uint32_t rkey = 0;
  uint64_t va = 0;
  uint32_t count = 1;
  uint32_t pace = 32;  // datagrams between 1 ms pauses
  uint64_t seed = 1;
  bool path_ok = false;  // --path on: the packets travel on the QP's own path
  std::vector<std::string> attacks;
};

// One packet under construction: BTH .. ICRC.
struct Packet {
  std::vector<uint8_t> bytes;
  const OpcodeInfo* info = nullptr;

  uint8_t* hdr(Hdr h) { return bytes.data() + info->offset[unsigned(h)]; }
};

Packet make_packet(uint8_t opcode, uint32_t dest_qp, uint32_t psn, size_t payload) {
  Packet p;
  p.info = &opcode_info(opcode);
  const unsigned pad = unsigned(-payload & 3);
  p.bytes.assign(p.info->header_len + payload + pad + kIcrcSize, 0);
  Bth(p.bytes.data()).fill(opcode, false, pad, kDefaultPkey, dest_qp, true, psn);
  for (size_t i = 0; i < payload; ++i) p.bytes[p.info->header_len + i] = uint8_t(0xA5 ^ i);
  return p;
}

class Attacker {
 public:
  explicit Attacker(const Options& o) : o_(o), rng_(o.seed) {}
  ~Attacker() {
    if (fd_ >= 0) close(fd_);
    if (frag_fd_ >= 0) close(frag_fd_);
  }

  int open() {
    fd_ = open_socket(IP_PMTUDISC_DO, o_.src_port);
    if (fd_ < 0) return -1;
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
    src_port_ = ntohs(a.sin_port);
    // Oversized datagrams may exceed the link MTU: a second socket that fragments.
    frag_fd_ = open_socket(IP_PMTUDISC_DONT, 0);
    return frag_fd_ < 0 ? -1 : 0;
  }

  int run(const std::string& attack);
  uint64_t total() const { return total_; }

 private:
  int open_socket(int pmtu, uint16_t port) const {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    int buf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(o_.src_ip);
    a.sin_port = htons(port);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      std::fprintf(stderr, "hostile_send: bind %s:%u: %s\n", inet_ntoa(a.sin_addr), port, std::strerror(errno));
      close(fd);
      return -1;
    }
    return fd;
  }

  uint32_t next_psn(uint64_t i) {
    if (!o_.psn_random) return psn_add(o_.psn, uint32_t(i * o_.psn_step));
    for (;;) {
      uint32_t p = uint32_t(rng_()) & kPsnMask;
      if (uint32_t((p - o_.avoid_psn) & kPsnMask) >= o_.avoid_len) return p;
    }
  }

  // Builds packet number i of `attack` for `qpn`; nullopt for an unknown attack.
  std::optional<Packet> build(const std::string& attack, uint32_t qpn, uint64_t i, Kind* kind);
  std::optional<Packet> build_request(std::string_view a, uint32_t qpn, uint32_t psn);
  std::optional<Packet> build_response(std::string_view a, uint32_t qpn, uint32_t psn);
  std::optional<Packet> build_framing(std::string_view a, uint32_t qpn, uint32_t psn);

  // Writes the ICRC (correct unless `corrupt`) and sends; false on a send error.
  bool send(Packet& p, bool corrupt, bool fragment);
  void print_expectation(const std::string& attack, Kind kind, uint64_t n) const;

  const Options& o_;
  std::mt19937_64 rng_;
  int fd_ = -1, frag_fd_ = -1;
  uint16_t src_port_ = 0;
  uint64_t total_ = 0;
};

// Requests: SEND / WRITE with payload, a 1 GiB READ, unaligned atomics, a bad R_Key.
std::optional<Packet> Attacker::build_request(std::string_view a, uint32_t qpn, uint32_t psn) {
  const uint8_t rc = uint8_t(Service::kRc);
  if (a == "send") return make_packet(rc | uint8_t(Operation::kSendOnly), qpn, psn, kPayloadLen);
  if (a == "write" || a == "write_bad_rkey") {
    Packet p = make_packet(rc | uint8_t(Operation::kWriteOnly), qpn, psn, kPayloadLen);
    Reth(p.hdr(Hdr::kReth)).fill(o_.va, a == "write" ? o_.rkey : o_.rkey ^ 0x5A5A5A5Au, kPayloadLen);
    return p;
  }
  if (a == "read_huge") {
    Packet p = make_packet(rc | uint8_t(Operation::kReadRequest), qpn, psn, 0);
    Reth(p.hdr(Hdr::kReth)).fill(o_.va, o_.rkey, kHugeReadLen);
    return p;
  }
  if (a == "fetch_add_unaligned" || a == "cswap_unaligned") {
    auto op = a == "cswap_unaligned" ? Operation::kCompareSwap : Operation::kFetchAdd;
    Packet p = make_packet(rc | uint8_t(op), qpn, psn, 0);
    AtomicEth(p.hdr(Hdr::kAtomicEth)).fill(o_.va + 3, o_.rkey, 1, 0);  // IBA 9.4.5: 8-byte aligned
    return p;
  }
  return std::nullopt;
}

// Responses: ACK, every NAK code, RNR NAK, READ responses, atomic ACK.
std::optional<Packet> Attacker::build_response(std::string_view a, uint32_t qpn, uint32_t psn) {
  const uint8_t rc = uint8_t(Service::kRc);
  std::optional<uint8_t> synd;
  if (a == "ack") synd = kAckNoCredit;
  if (a == "rnr_nak") synd = syndrome(AckType::kRnrNak, 14);
  static constexpr std::pair<std::string_view, NakCode> kNaks[] = {{"nak_seq", NakCode::kPsnSeqError},
                                                                   {"nak_inv", NakCode::kInvalidRequest},
                                                                   {"nak_access", NakCode::kRemoteAccess},
                                                                   {"nak_op", NakCode::kRemoteOp},
                                                                   {"nak_rd", NakCode::kInvalidRd}};
  for (auto& [name, code] : kNaks)
    if (a == name) synd = syndrome(AckType::kNak, uint8_t(code));
  const uint32_t msn = uint32_t(rng_()) & kPsnMask;
  if (synd) {
    Packet p = make_packet(rc | uint8_t(Operation::kAcknowledge), qpn, psn, 0);
    Aeth(p.hdr(Hdr::kAeth)).fill(*synd, msn);
    return p;
  }
  if (a == "read_resp" || a == "read_resp_first") {
    auto op = a == "read_resp" ? Operation::kReadResponseOnly : Operation::kReadResponseFirst;
    Packet p = make_packet(rc | uint8_t(op), qpn, psn, kPayloadLen);
    Aeth(p.hdr(Hdr::kAeth)).fill(kAckNoCredit, msn);
    return p;
  }
  if (a == "atomic_ack") {
    Packet p = make_packet(rc | uint8_t(Operation::kAtomicAcknowledge), qpn, psn, 0);
    Aeth(p.hdr(Hdr::kAeth)).fill(kAckNoCredit, msn);
    AtomicAckEth(p.hdr(Hdr::kAtomicAckEth)).fill(0xDEADBEEFull);
    return p;
  }
  return std::nullopt;
}

// Framing: truncated (headers cut short), oversized, bad version, garbage.
std::optional<Packet> Attacker::build_framing(std::string_view a, uint32_t qpn, uint32_t psn) {
  const uint8_t rc = uint8_t(Service::kRc);
  if (a == "truncated") {  // a WRITE_ONLY cut inside its RETH (IBA 9.6.1: header length)
    Packet p = make_packet(rc | uint8_t(Operation::kWriteOnly), qpn, psn, 0);
    p.bytes.resize(kBthSize + 6 + kIcrcSize);
    return p;
  }
  if (a == "runt") {  // shorter than a BTH and an ICRC
    Packet p = make_packet(rc | uint8_t(Operation::kSendOnly), qpn, psn, 0);
    p.bytes.resize(1 + rng_() % (kBthSize + kIcrcSize - 1));
    return p;
  }
  if (a == "oversized") return make_packet(rc | uint8_t(Operation::kSendOnly), qpn, psn, kOversizedPayload);
  if (a == "bad_version") {  // TVer 1 (IBA 9.2.7: packets with TVer != 0 are dropped)
    Packet p = make_packet(rc | uint8_t(Operation::kSendOnly), qpn, psn, kPayloadLen);
    p.bytes[1] |= 1;
    return p;
  }
  if (a == "bad_icrc") return make_packet(rc | uint8_t(Operation::kSendOnly), qpn, psn, kPayloadLen);
  if (a == "garbage") {  // random bytes, random ICRC: malformed or bad ICRC
    Packet p;
    p.bytes.resize(1 + rng_() % 256);
    for (auto& b : p.bytes) b = uint8_t(rng_());
    return p;
  }
  return std::nullopt;
}

std::optional<Packet> Attacker::build(const std::string& attack, uint32_t qpn, uint64_t i, Kind* kind) {
  const uint32_t psn = next_psn(i);
  if (attack == "qp0" || attack == "qp1") {
    *kind = Kind::kNoQp;
    return make_packet(uint8_t(Service::kRc) | uint8_t(Operation::kSendOnly), attack == "qp1" ? 1 : 0, psn,
                       kPayloadLen);
  }
  if (auto p = build_request(attack, qpn, psn)) {
    *kind = Kind::kRequest;
    return p;
  }
  if (auto p = build_response(attack, qpn, psn)) {
    *kind = Kind::kResponse;
    return p;
  }
  *kind = Kind::kFraming;
  return build_framing(attack, qpn, psn);
}

bool Attacker::send(Packet& p, bool corrupt, bool fragment) {
  if (p.info && p.bytes.size() >= kBthSize + kIcrcSize) {
    Ipv4Flow flow{o_.src_ip, o_.dst_ip, src_port_, o_.dst_port};
    uint32_t crc = icrc_ipv4(flow, p.bytes.data(), p.bytes.size());
    if (corrupt) crc ^= 0x80000001u;
    std::memcpy(p.bytes.data() + p.bytes.size() - kIcrcSize, &crc, kIcrcSize);
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(o_.dst_ip);
  to.sin_port = htons(o_.dst_port);
  for (int tries = 0; tries < 1000; ++tries) {
    ssize_t n = sendto(fragment ? frag_fd_ : fd_, p.bytes.data(), p.bytes.size(), 0, reinterpret_cast<sockaddr*>(&to),
                       sizeof to);
    if (n == ssize_t(p.bytes.size())) return true;
    if (n < 0 && errno != ENOBUFS && errno != EAGAIN && errno != EINTR) break;
    usleep(100);
  }
  std::fprintf(stderr, "hostile_send: sendto: %s\n", std::strerror(errno));
  return false;
}

void Attacker::print_expectation(const std::string& attack, Kind kind, uint64_t n) const {
  std::string counters;
  switch (kind) {
    case Kind::kNoQp:
      counters = "no_qp";
      break;
    case Kind::kFraming:
      counters = attack == "bad_icrc" ? "bad_icrc" : attack == "garbage" ? "malformed+bad_icrc" : "malformed";
      break;
    case Kind::kRequest:
    case Kind::kResponse:
      counters = !o_.path_ok               ? "bad_path"
                 : kind == Kind::kResponse ? "ghost+dropped_state"
                                           : "out_of_sequence+duplicates";
      if (o_.qpn_count > 1) counters += "+no_qp";
      break;
  }
  std::printf("expect %s %llu\n", counters.c_str(), (unsigned long long)n);
}

int Attacker::run(const std::string& attack) {
  Kind kind = Kind::kFraming;
  uint64_t n = 0;
  const uint64_t per_qp = o_.count;
  for (uint32_t q = 0; q < o_.qpn_count; ++q) {
    const uint32_t qpn = (o_.qpn + q) & kPsnMask;
    for (uint64_t i = 0; i < per_qp; ++i) {
      std::optional<Packet> p = build(attack, qpn, q * per_qp + i, &kind);
      if (!p) {
        std::fprintf(stderr, "hostile_send: unknown attack '%s'\n", attack.c_str());
        return 2;
      }
      if (!send(*p, attack == "bad_icrc", attack == "oversized")) return 1;
      ++n;
      if (++total_ % o_.pace == 0) usleep(1000);
    }
  }
  in_addr s{htonl(o_.src_ip)}, d{htonl(o_.dst_ip)};
  std::string src = inet_ntoa(s);
  std::printf("sent %llu %s qpn 0x%06x..0x%06x to %s:%u from %s:%u\n", (unsigned long long)n, attack.c_str(), o_.qpn,
              (o_.qpn + o_.qpn_count - 1) & kPsnMask, inet_ntoa(d), o_.dst_port, src.c_str(), src_port_);
  print_expectation(attack, kind, n);
  return 0;
}

void usage() {
  std::fputs(
      "usage: hostile_send --to IP:PORT --from IP [options] ATTACK...\n"
      "  --sport PORT        source UDP port (default: any)\n"
      "  --qpn Q             destination QPN (default 0); --qpn-count N scans Q..Q+N-1\n"
      "  --psn P | random    PSN of the first packet (default 0); --psn-step S adds S per packet\n"
      "  --avoid P:LEN       --psn random never picks P..P+LEN-1 (the live window)\n"
      "  --rkey K --va V     R_Key and address for write/read/atomic requests\n"
      "  --count N           packets per attack and QPN (default 1)\n"
      "  --pace N            pause 1 ms after every N datagrams (default 32)\n"
      "  --path on|off       whether --from/--to are the QP's own path (for the expect lines)\n"
      "  --seed S            random PSNs, MSNs and garbage (default 1)\n"
      "attacks: send write write_bad_rkey read_huge fetch_add_unaligned cswap_unaligned\n"
      "         ack nak_seq nak_inv nak_access nak_op nak_rd rnr_nak read_resp read_resp_first\n"
      "         atomic_ack truncated runt oversized bad_version bad_icrc garbage qp0 qp1\n",
      stderr);
}

bool parse_u64(const char* s, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 0);
  if (errno || end == s || *end) return false;
  *out = v;
  return true;
}

bool parse_ip(const char* s, uint32_t* out) {
  in_addr a{};
  if (inet_pton(AF_INET, s, &a) != 1) return false;
  *out = ntohl(a.s_addr);
  return true;
}

bool parse_ip_port(const std::string& s, uint32_t* ip, uint16_t* port) {
  auto colon = s.rfind(':');
  uint64_t p = 0;
  if (colon == std::string::npos || !parse_ip(s.substr(0, colon).c_str(), ip) ||
      !parse_u64(s.c_str() + colon + 1, &p) || p == 0 || p > 0xFFFF)
    return false;
  *port = uint16_t(p);
  return true;
}

// Parses one option and its value; false on a bad one.
bool parse_option(const std::string& opt, const char* val, Options* o) {
  uint64_t v = 0;
  if (opt == "--to") return parse_ip_port(val, &o->dst_ip, &o->dst_port);
  if (opt == "--from") return parse_ip(val, &o->src_ip);
  if (opt == "--path") {
    o->path_ok = std::string_view(val) == "on";
    return o->path_ok || std::string_view(val) == "off";
  }
  if (opt == "--psn" && std::string_view(val) == "random") return o->psn_random = true;
  if (opt == "--avoid") {
    std::string s(val);
    auto colon = s.find(':');
    uint64_t p = 0, l = 0;
    if (colon == std::string::npos || !parse_u64(s.substr(0, colon).c_str(), &p) ||
        !parse_u64(s.c_str() + colon + 1, &l) || l >= (1u << 23))
      return false;
    o->avoid_psn = uint32_t(p) & kPsnMask;
    o->avoid_len = uint32_t(l);
    return true;
  }
  if (!parse_u64(val, &v)) return false;
  if (opt == "--sport")
    o->src_port = uint16_t(v);
  else if (opt == "--qpn")
    o->qpn = uint32_t(v) & kPsnMask;
  else if (opt == "--qpn-count")
    o->qpn_count = uint32_t(v);
  else if (opt == "--psn")
    o->psn = uint32_t(v) & kPsnMask;
  else if (opt == "--psn-step")
    o->psn_step = uint32_t(v);
  else if (opt == "--rkey")
    o->rkey = uint32_t(v);
  else if (opt == "--va")
    o->va = v;
  else if (opt == "--count")
    o->count = uint32_t(v);
  else if (opt == "--pace")
    o->pace = uint32_t(v);
  else if (opt == "--seed")
    o->seed = v;
  else
    return false;
  return true;
}

bool parse_args(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      o->attacks.push_back(a);
      continue;
    }
    if (i + 1 >= argc || !parse_option(a, argv[i + 1], o)) {
      std::fprintf(stderr, "hostile_send: bad option %s %s\n", a.c_str(), i + 1 < argc ? argv[i + 1] : "");
      return false;
    }
    ++i;
  }
  const uint64_t datagrams = uint64_t(o->count) * o->qpn_count * o->attacks.size();
  return o->dst_port && o->src_ip && !o->attacks.empty() && o->count && o->qpn_count && o->pace &&
         datagrams <= kMaxDatagrams;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse_args(argc, argv, &o)) {
    usage();
    return 2;
  }
  Attacker attacker(o);
  if (attacker.open() != 0) return 1;
  for (const std::string& a : o.attacks)
    if (int rc = attacker.run(a)) return rc;
  std::printf("total %llu datagrams\n", (unsigned long long)attacker.total());
  return 0;
}
