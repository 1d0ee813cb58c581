// Prints one sample of each connected-mode CM message as "NAME HEX" (the
// 256-byte MAD), for tshark_cm_check.py: an independent decoder (Wireshark's)
// must read back every field uroce put in.
#include <cstdio>

#include "rdmacm/cm_messages.h"

namespace uroce::rdmacm {
namespace {

void print(const char* name, const Mad& mad) {
  std::printf("%s ", name);
  for (uint8_t b : mad) std::printf("%02x", b);
  std::printf("\n");
}

ibv_gid ipv4_gid(uint32_t ip) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xFF;
  for (int i = 0; i < 4; ++i) g.raw[12 + i] = uint8_t(ip >> (24 - 8 * i));
  return g;
}

void dump_samples() {
  ReqMessage req;
  req.local_comm_id = 0x11223344;
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
  req.primary_local_gid = ipv4_gid(0x7F000001);
  req.primary_remote_gid = ipv4_gid(0xC0000202);
  req.primary_hop_limit = 64;
  req.primary_local_ack_timeout = 14;
  encode_cma_header({40000, 0x7F000001, 0xC0000202},
                    std::span<uint8_t, kCmaHeaderSize>(req.private_data.data(), kCmaHeaderSize));
  print("req", encode_mad(0x1234, req));

  RepMessage rep;
  rep.local_comm_id = 0x55667788;
  rep.remote_comm_id = 0x11223344;
  rep.local_qpn = 0x000042;
  rep.starting_psn = 0x654321;
  rep.responder_resources = 1;
  rep.initiator_depth = 1;
  rep.rnr_retry_count = 7;
  rep.local_ca_guid = 0x02AABBCCDDEEFF00ull;
  print("rep", encode_mad(0x1234, rep));

  RejMessage rej;
  rej.local_comm_id = 0x55667788;
  rej.remote_comm_id = 0x11223344;
  rej.reason = uint16_t(RejReason::kConsumerDefined);
  print("rej", encode_mad(0x1234, rej));

  DreqMessage dreq;
  dreq.local_comm_id = 0x55667788;
  dreq.remote_comm_id = 0x11223344;
  dreq.remote_qpn = 0xABCDEF;
  print("dreq", encode_mad(0x99, dreq));
}

}  // namespace
}  // namespace uroce::rdmacm

int main() {
  uroce::rdmacm::dump_samples();
  return 0;
}
