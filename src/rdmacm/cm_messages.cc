#include "rdmacm/cm_messages.h"

#include <algorithm>
#include <cstring>

#include "wire/byte_order.h"

namespace uroce::rdmacm {

namespace {

using wire::load_be16;
using wire::load_be24;
using wire::load_be32;
using wire::load_be64;
using wire::store_be16;
using wire::store_be24;
using wire::store_be32;
using wire::store_be64;

// Bit-fields inside one byte are listed MSB first in the IBA tables; these
// place `width` bits whose most significant bit is bit `msb` (7 = MSB).
uint8_t put_bits(uint8_t v, int msb, int width) { return uint8_t((v & ((1u << width) - 1)) << (msb - width + 1)); }
uint8_t get_bits(uint8_t byte, int msb, int width) {
  return uint8_t((byte >> (msb - width + 1)) & ((1u << width) - 1));
}

template <size_t N>
void put_bytes(uint8_t* dst, const std::array<uint8_t, N>& src) {
  std::memcpy(dst, src.data(), N);
}
template <size_t N>
void get_bytes(std::array<uint8_t, N>* dst, const uint8_t* src) {
  std::memcpy(dst->data(), src, N);
}

CmAttr attr_of(const CmMessage& m) {
  struct Visitor {
    CmAttr operator()(const ReqMessage&) const { return CmAttr::kReq; }
    CmAttr operator()(const RepMessage&) const { return CmAttr::kRep; }
    CmAttr operator()(const RejMessage&) const { return CmAttr::kRej; }
    CmAttr operator()(const RtuMessage&) const { return CmAttr::kRtu; }
    CmAttr operator()(const DreqMessage&) const { return CmAttr::kDreq; }
    CmAttr operator()(const DrepMessage&) const { return CmAttr::kDrep; }
    CmAttr operator()(const SidrReqMessage&) const { return CmAttr::kSidrReq; }
    CmAttr operator()(const SidrRepMessage&) const { return CmAttr::kSidrRep; }
  };
  return std::visit(Visitor{}, m);
}

// ---- encoders: `d` is the CM data (MAD byte 24), 232 bytes, zeroed ----

void encode(const ReqMessage& m, uint8_t* d) {
  store_be32(d + 0, m.local_comm_id);
  store_be64(d + 8, m.service_id);
  store_be64(d + 16, m.local_ca_guid);
  store_be32(d + 28, m.local_qkey);
  store_be24(d + 32, m.local_qpn);
  d[35] = m.responder_resources;
  d[39] = m.initiator_depth;
  d[43] =
      put_bits(m.remote_cm_response_timeout, 7, 5) | put_bits(m.transport_type, 2, 2) | put_bits(m.flow_control, 0, 1);
  store_be24(d + 44, m.starting_psn);
  d[47] = put_bits(m.local_cm_response_timeout, 7, 5) | put_bits(m.retry_count, 2, 3);
  store_be16(d + 48, m.pkey);
  d[50] = put_bits(m.path_mtu, 7, 4) | put_bits(m.rnr_retry_count, 2, 3);
  d[51] = put_bits(m.max_cm_retries, 7, 4) | put_bits(m.srq, 3, 1);
  store_be16(d + 52, m.primary_local_lid);
  store_be16(d + 54, m.primary_remote_lid);
  std::memcpy(d + 56, m.primary_local_gid.raw, 16);
  std::memcpy(d + 72, m.primary_remote_gid.raw, 16);
  store_be32(d + 88, (m.primary_flow_label & 0xFFFFF) << 12 | (m.primary_packet_rate & 0x3F));
  d[92] = m.primary_traffic_class;
  d[93] = m.primary_hop_limit;
  d[94] = put_bits(m.primary_sl, 7, 4) | put_bits(m.primary_subnet_local, 3, 1);
  d[95] = put_bits(m.primary_local_ack_timeout, 7, 5);
  put_bytes(d + 140, m.private_data);
}

void encode(const RepMessage& m, uint8_t* d) {
  store_be32(d + 0, m.local_comm_id);
  store_be32(d + 4, m.remote_comm_id);
  store_be32(d + 8, m.local_qkey);
  store_be24(d + 12, m.local_qpn);
  store_be24(d + 20, m.starting_psn);
  d[24] = m.responder_resources;
  d[25] = m.initiator_depth;
  d[26] = put_bits(m.target_ack_delay, 7, 5) | put_bits(m.failover_accepted, 2, 2) | put_bits(m.flow_control, 0, 1);
  d[27] = put_bits(m.rnr_retry_count, 7, 3) | put_bits(m.srq, 4, 1);
  store_be64(d + 28, m.local_ca_guid);
  put_bytes(d + 36, m.private_data);
}

void encode(const RejMessage& m, uint8_t* d) {
  store_be32(d + 0, m.local_comm_id);
  store_be32(d + 4, m.remote_comm_id);
  d[8] = put_bits(uint8_t(m.message_rejected), 7, 2);
  d[9] = put_bits(m.reject_info_length, 7, 7);
  store_be16(d + 10, m.reason);
  put_bytes(d + 12, m.additional_info);
  put_bytes(d + 84, m.private_data);
}

void encode(const RtuMessage& m, uint8_t* d) {
  store_be32(d + 0, m.local_comm_id);
  store_be32(d + 4, m.remote_comm_id);
  put_bytes(d + 8, m.private_data);
}

void encode(const DreqMessage& m, uint8_t* d) {
  store_be32(d + 0, m.local_comm_id);
  store_be32(d + 4, m.remote_comm_id);
  store_be24(d + 8, m.remote_qpn);
  put_bytes(d + 12, m.private_data);
}

void encode(const DrepMessage& m, uint8_t* d) {
  store_be32(d + 0, m.local_comm_id);
  store_be32(d + 4, m.remote_comm_id);
  put_bytes(d + 8, m.private_data);
}

void encode(const SidrReqMessage& m, uint8_t* d) {
  store_be32(d + 0, m.request_id);
  store_be16(d + 4, m.pkey);
  store_be64(d + 8, m.service_id);
  put_bytes(d + 16, m.private_data);
}

void encode(const SidrRepMessage& m, uint8_t* d) {
  store_be32(d + 0, m.request_id);
  d[4] = uint8_t(m.status);
  d[5] = m.additional_info_length;
  store_be24(d + 8, m.qpn);
  store_be64(d + 12, m.service_id);
  store_be32(d + 20, m.qkey);
  put_bytes(d + 24, m.additional_info);
  put_bytes(d + 96, m.private_data);
}

// ---- decoders ----

ReqMessage decode_req(const uint8_t* d) {
  ReqMessage m;
  m.local_comm_id = load_be32(d + 0);
  m.service_id = load_be64(d + 8);
  m.local_ca_guid = load_be64(d + 16);
  m.local_qkey = load_be32(d + 28);
  m.local_qpn = load_be24(d + 32);
  m.responder_resources = d[35];
  m.initiator_depth = d[39];
  m.remote_cm_response_timeout = get_bits(d[43], 7, 5);
  m.transport_type = get_bits(d[43], 2, 2);
  m.flow_control = get_bits(d[43], 0, 1);
  m.starting_psn = load_be24(d + 44);
  m.local_cm_response_timeout = get_bits(d[47], 7, 5);
  m.retry_count = get_bits(d[47], 2, 3);
  m.pkey = load_be16(d + 48);
  m.path_mtu = get_bits(d[50], 7, 4);
  m.rnr_retry_count = get_bits(d[50], 2, 3);
  m.max_cm_retries = get_bits(d[51], 7, 4);
  m.srq = get_bits(d[51], 3, 1);
  m.primary_local_lid = load_be16(d + 52);
  m.primary_remote_lid = load_be16(d + 54);
  std::memcpy(m.primary_local_gid.raw, d + 56, 16);
  std::memcpy(m.primary_remote_gid.raw, d + 72, 16);
  uint32_t fl = load_be32(d + 88);
  m.primary_flow_label = fl >> 12;
  m.primary_packet_rate = fl & 0x3F;
  m.primary_traffic_class = d[92];
  m.primary_hop_limit = d[93];
  m.primary_sl = get_bits(d[94], 7, 4);
  m.primary_subnet_local = get_bits(d[94], 3, 1);
  m.primary_local_ack_timeout = get_bits(d[95], 7, 5);
  get_bytes(&m.private_data, d + 140);
  return m;
}

RepMessage decode_rep(const uint8_t* d) {
  RepMessage m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  m.local_qkey = load_be32(d + 8);
  m.local_qpn = load_be24(d + 12);
  m.starting_psn = load_be24(d + 20);
  m.responder_resources = d[24];
  m.initiator_depth = d[25];
  m.target_ack_delay = get_bits(d[26], 7, 5);
  m.failover_accepted = get_bits(d[26], 2, 2);
  m.flow_control = get_bits(d[26], 0, 1);
  m.rnr_retry_count = get_bits(d[27], 7, 3);
  m.srq = get_bits(d[27], 4, 1);
  m.local_ca_guid = load_be64(d + 28);
  get_bytes(&m.private_data, d + 36);
  return m;
}

RejMessage decode_rej(const uint8_t* d) {
  RejMessage m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  m.message_rejected = RejectedMessage(get_bits(d[8], 7, 2));
  m.reject_info_length = get_bits(d[9], 7, 7);
  m.reason = load_be16(d + 10);
  get_bytes(&m.additional_info, d + 12);
  get_bytes(&m.private_data, d + 84);
  return m;
}

RtuMessage decode_rtu(const uint8_t* d) {
  RtuMessage m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  get_bytes(&m.private_data, d + 8);
  return m;
}

DreqMessage decode_dreq(const uint8_t* d) {
  DreqMessage m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  m.remote_qpn = load_be24(d + 8);
  get_bytes(&m.private_data, d + 12);
  return m;
}

DrepMessage decode_drep(const uint8_t* d) {
  DrepMessage m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  get_bytes(&m.private_data, d + 8);
  return m;
}

SidrReqMessage decode_sidr_req(const uint8_t* d) {
  SidrReqMessage m;
  m.request_id = load_be32(d + 0);
  m.pkey = load_be16(d + 4);
  m.service_id = load_be64(d + 8);
  get_bytes(&m.private_data, d + 16);
  return m;
}

SidrRepMessage decode_sidr_rep(const uint8_t* d) {
  SidrRepMessage m;
  m.request_id = load_be32(d + 0);
  m.status = SidrStatus(d[4]);
  m.additional_info_length = d[5];
  m.qpn = load_be24(d + 8);
  m.service_id = load_be64(d + 12);
  m.qkey = load_be32(d + 20);
  get_bytes(&m.additional_info, d + 24);
  get_bytes(&m.private_data, d + 96);
  return m;
}

}  // namespace

Mad encode_mad(uint64_t transaction_id, const CmMessage& message) {
  Mad mad{};
  const CmAttr attr = attr_of(message);
  mad[0] = 1;  // BaseVersion
  mad[1] = kMgmtClassCm;
  mad[2] = kCmClassVersion;
  mad[3] = kMethodSend;
  store_be64(mad.data() + 8, transaction_id);
  store_be16(mad.data() + 16, uint16_t(attr));
  uint8_t* d = mad.data() + kMadHeaderSize;
  std::visit([d](const auto& m) { encode(m, d); }, message);
  return mad;
}

std::optional<DecodedMad> decode_mad(std::span<const uint8_t> bytes) {
  if (bytes.size() != kMadSize) return std::nullopt;
  const uint8_t* p = bytes.data();
  if (p[0] != 1 || p[1] != kMgmtClassCm || p[2] != kCmClassVersion) return std::nullopt;
  if (p[3] != kMethodSend) return std::nullopt;
  const auto attr = CmAttr(load_be16(p + 16));
  DecodedMad out;
  out.transaction_id = load_be64(p + 8);
  const uint8_t* d = p + kMadHeaderSize;
  switch (attr) {
    case CmAttr::kReq:
      out.message = decode_req(d);
      break;
    case CmAttr::kRep:
      out.message = decode_rep(d);
      break;
    case CmAttr::kRej:
      out.message = decode_rej(d);
      break;
    case CmAttr::kRtu:
      out.message = decode_rtu(d);
      break;
    case CmAttr::kDreq:
      out.message = decode_dreq(d);
      break;
    case CmAttr::kDrep:
      out.message = decode_drep(d);
      break;
    case CmAttr::kSidrReq:
      out.message = decode_sidr_req(d);
      break;
    case CmAttr::kSidrRep:
      out.message = decode_sidr_rep(d);
      break;
    default:
      return std::nullopt;  // MRA, LAP, APR, ClassPortInfo: uroce never sends them
  }
  return out;
}

void encode_cma_header(const CmaIpHeader& h, std::span<uint8_t, kCmaHeaderSize> out) {
  std::fill(out.begin(), out.end(), uint8_t{0});
  bool v4 = h.src_ip.is_v4() && h.dst_ip.is_v4();
  out[0] = 0;                           // cma version
  out[1] = uint8_t((v4 ? 4 : 6) << 4);  // IP version in the high nibble
  store_be16(out.data() + 2, h.src_port);
  if (v4) {  // IPv4: the last 4 bytes of each 16-byte field
    store_be32(out.data() + 16, h.src_ip.v4());
    store_be32(out.data() + 32, h.dst_ip.v4());
  } else {
    std::memcpy(out.data() + 4, h.src_ip.bytes.data(), 16);
    std::memcpy(out.data() + 20, h.dst_ip.bytes.data(), 16);
  }
}

std::optional<CmaIpHeader> decode_cma_header(std::span<const uint8_t, kCmaHeaderSize> in) {
  unsigned version = in[1] >> 4;
  if (in[0] != 0 || (version != 4 && version != 6)) return std::nullopt;
  CmaIpHeader h;
  h.src_port = load_be16(in.data() + 2);
  if (version == 4) {
    h.src_ip = load_be32(in.data() + 16);
    h.dst_ip = load_be32(in.data() + 32);
  } else {
    std::memcpy(h.src_ip.bytes.data(), in.data() + 4, 16);
    std::memcpy(h.dst_ip.bytes.data(), in.data() + 20, 16);
  }
  return h;
}

}  // namespace uroce::rdmacm
