#include "core/ah.h"

#include <cerrno>
#include <cstring>

#include "core/config.h"
#include "core/context.h"
#include "core/device.h"
#include "wire/byte_order.h"

namespace uroce::core {

using wire::load_be32;
using wire::store_be16;
using wire::store_be32;

namespace {

// Index of the local GID `gid`, or -1.
int gid_index_of(const Context& ctx, const ibv_gid& gid) {
  for (size_t i = 0; i < ctx.gid_count(); ++i)
    if (std::memcmp(ctx.addresses()[i].gid.raw, gid.raw, 16) == 0) return int(i);
  return -1;
}

}  // namespace

uint16_t roce_udp_port(uint16_t dlid) {
  constexpr uint16_t kFirstSourcePortHint = 0xC000;
  return dlid == 0 || dlid >= kFirstSourcePortHint ? config().udp_port : dlid;
}

bool gid_pair_valid(const Context& ctx, uint8_t sgid_index, const ibv_gid& dgid) {
  const HostAddress* src = ctx.gid_address(sgid_index);
  uint32_t ip;
  if (!src) return false;
  // IPv4: any IPv4-mapped GID (a multicast group's too); IPv6: a unicast one.
  return src->ipv6 ? !gid_to_ipv4(dgid, &ip) && gid_is_unicast_ip(dgid) : gid_to_ipv4(dgid, &ip);
}

int resolve_ah(const Context& ctx, const ibv_ah_attr& attr, Ah* out) {
  if (attr.port_num != 1) return EINVAL;
  if (!attr.is_global) return EINVAL;  // RoCE: the GRH carries the addresses
  if (!gid_pair_valid(ctx, attr.grh.sgid_index, attr.grh.dgid)) return EINVAL;
  out->dst_port = roce_udp_port(attr.dlid);
  out->attr = attr;
  return 0;
}

void build_ipv4_grh(uint32_t src_ip, uint32_t dst_ip, uint32_t udp_payload_len, uint8_t out[kGrhSize]) {
  std::memset(out, 0, kGrhSize);
  uint8_t* ip = out + 20;
  ip[0] = 0x45;
  store_be16(ip + 2, uint16_t(20 + 8 + udp_payload_len));
  store_be16(ip + 6, 0x4000);  // DF; uroce sends IP ID 0
  ip[8] = 64;                  // TTL (not visible through a UDP socket; the usual default)
  ip[9] = 17;                  // UDP
  store_be32(ip + 12, src_ip);
  store_be32(ip + 16, dst_ip);
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += uint32_t(ip[i]) << 8 | ip[i + 1];
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  store_be16(ip + 10, uint16_t(~sum));
}

void build_ipv6_grh(const uint8_t src[16], const uint8_t dst[16], uint32_t udp_payload_len, uint8_t out[kGrhSize]) {
  std::memset(out, 0, kGrhSize);
  out[0] = 0x60;  // version 6, traffic class and flow label 0
  store_be16(out + 4, uint16_t(8 + udp_payload_len));
  out[6] = 17;  // next header: UDP
  out[7] = 64;  // hop limit (not visible through a UDP socket; the usual default)
  std::memcpy(out + 8, src, 16);
  std::memcpy(out + 24, dst, 16);
}

int ah_attr_from_wc(const Context& ctx, uint8_t port, const ibv_wc& wc, const ibv_grh* grh, ibv_ah_attr* attr) {
  if (port != 1 || !attr) return EINVAL;
  std::memset(attr, 0, sizeof *attr);
  attr->dlid = wc.slid;
  attr->sl = wc.sl;
  attr->src_path_bits = wc.dlid_path_bits;
  attr->port_num = port;
  if (!(wc.wc_flags & IBV_WC_GRH) || !grh) return EINVAL;  // RoCE needs the GRH
  const auto* raw = reinterpret_cast<const uint8_t*>(grh);
  if ((raw[0] >> 4) == 6) {  // an IPv6 header (roce-facts §5.3)
    ibv_gid dst;
    std::memcpy(dst.raw, raw + 24, 16);
    int sgid = gid_index_of(ctx, dst);
    if (sgid < 0) return EINVAL;  // not addressed to one of our GIDs
    attr->is_global = 1;
    std::memcpy(attr->grh.dgid.raw, raw + 8, 16);
    attr->grh.sgid_index = uint8_t(sgid);
    attr->grh.hop_limit = 0xFF;
    attr->grh.traffic_class = uint8_t(load_be32(raw) >> 20);
    attr->grh.flow_label = load_be32(raw) & 0xFFFFF;
    return 0;
  }
  const uint8_t* ip = raw + 20;
  if ((ip[0] >> 4) != 4) return EINVAL;
  uint32_t src = load_be32(ip + 12), dst = load_be32(ip + 16);
  int sgid = gid_index_of(ctx, ipv4_to_gid(dst));
  if (sgid < 0) return EINVAL;  // not addressed to one of our GIDs
  attr->is_global = 1;
  attr->grh.dgid = ipv4_to_gid(src);
  attr->grh.sgid_index = uint8_t(sgid);
  attr->grh.hop_limit = 0xFF;
  attr->grh.traffic_class = ip[1];
  return 0;
}

}  // namespace uroce::core
