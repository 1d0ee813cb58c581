// Writes the seed corpora of the CM fuzz targets from cm_messages' encoders:
//
//   cm_seed_gen DIR     -> DIR/cm_mad/NAME (one MAD per file)
//
// One well-formed sample of every message uroce's CM sends, with realistic
// fields (those of a connection between 127.0.0.1 and 192.0.2.2).
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "rdmacm/cm_messages.h"

using namespace uroce::rdmacm;

namespace {

ibv_gid ipv4_gid(uint32_t ip) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xFF;
  for (int i = 0; i < 4; ++i) g.raw[12 + i] = uint8_t(ip >> (24 - 8 * i));
  return g;
}

constexpr uint32_t kActiveIp = 0x7F000001, kPassiveIp = 0xC0000202;
constexpr uint32_t kActiveId = 0x11223344, kPassiveId = 0x55667788;

ReqMessage sample_req() {
  ReqMessage req;
  req.local_comm_id = kActiveId;
  req.service_id = service_id(0x0106, 7471);  // RDMA_PS_TCP, port 7471
  req.local_ca_guid = 0x0211223344556677ull;
  req.local_qpn = 0xABCDEF;
  req.responder_resources = 1;
  req.initiator_depth = 1;
  req.remote_cm_response_timeout = 20;
  req.starting_psn = 0x123456;
  req.local_cm_response_timeout = 20;
  req.retry_count = 7;
  req.path_mtu = IBV_MTU_4096;
  req.rnr_retry_count = 7;
  req.max_cm_retries = 15;
  req.primary_local_lid = 4791;
  req.primary_remote_lid = 30000;
  req.primary_local_gid = ipv4_gid(kActiveIp);
  req.primary_remote_gid = ipv4_gid(kPassiveIp);
  req.primary_hop_limit = 64;
  req.primary_local_ack_timeout = 14;
  encode_cma_header({40000, kActiveIp, kPassiveIp},
                    std::span<uint8_t, kCmaHeaderSize>(req.private_data.data(), kCmaHeaderSize));
  return req;
}

RepMessage sample_rep() {
  RepMessage rep;
  rep.local_comm_id = kPassiveId;
  rep.remote_comm_id = kActiveId;
  rep.local_qpn = 0x000042;
  rep.starting_psn = 0x654321;
  rep.responder_resources = 1;
  rep.initiator_depth = 1;
  rep.target_ack_delay = 15;
  rep.rnr_retry_count = 7;
  rep.local_ca_guid = 0x02AABBCCDDEEFF00ull;
  return rep;
}

SidrReqMessage sample_sidr_req() {
  SidrReqMessage m;
  m.request_id = kActiveId;
  m.service_id = service_id(0x0111, 7174);  // RDMA_PS_UDP
  encode_cma_header({40001, kActiveIp, kPassiveIp},
                    std::span<uint8_t, kCmaHeaderSize>(m.private_data.data(), kCmaHeaderSize));
  return m;
}

std::vector<std::pair<std::string, Mad>> samples() {
  RejMessage rej;
  rej.local_comm_id = kPassiveId;
  rej.remote_comm_id = kActiveId;
  rej.reason = uint16_t(RejReason::kConsumerDefined);
  RtuMessage rtu;
  rtu.local_comm_id = kActiveId;
  rtu.remote_comm_id = kPassiveId;
  DreqMessage dreq;
  dreq.local_comm_id = kActiveId;
  dreq.remote_comm_id = kPassiveId;
  dreq.remote_qpn = 0x000042;
  DrepMessage drep;
  drep.local_comm_id = kPassiveId;
  drep.remote_comm_id = kActiveId;
  SidrRepMessage sidr_rep;
  sidr_rep.request_id = kActiveId;
  sidr_rep.qpn = 0x000043;
  sidr_rep.service_id = service_id(0x0111, 7174);
  sidr_rep.qkey = 0x01234567;
  return {
      {"req", encode_mad(0x1234, sample_req())},
      {"rep", encode_mad(0x1234, sample_rep())},
      {"rej", encode_mad(0x1234, rej)},
      {"rtu", encode_mad(0x1234, rtu)},
      {"dreq", encode_mad(0x99, dreq)},
      {"drep", encode_mad(0x99, drep)},
      {"sidr_req", encode_mad(0x77, sample_sidr_req())},
      {"sidr_rep", encode_mad(0x77, sidr_rep)},
  };
}

bool write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cm_seed_gen CORPUS_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  if (mkdir((dir + "/cm_mad").c_str(), 0755) != 0 && errno != EEXIST) {
    std::perror("cm_mad");
    return 1;
  }
  bool ok = true;
  for (const auto& [name, mad] : samples()) ok &= write_file(dir + "/cm_mad/" + name, {mad.begin(), mad.end()});
  if (!ok) std::perror("writing the corpus");
  return ok ? 0 : 1;
}
