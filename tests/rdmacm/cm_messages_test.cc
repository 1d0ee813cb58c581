// Golden-byte tests of the CM MAD layouts (roce-facts §7.2, §7.3, §7.5, §7.6).
#include "rdmacm/cm_messages.h"

#include <gtest/gtest.h>

#include <cstring>

namespace uroce::rdmacm {
namespace {

constexpr size_t kData = kMadHeaderSize;  // CM data starts at MAD byte 24

template <class T>
T roundtrip(const T& m, uint64_t tid = 0x1122334455667788ull) {
  Mad mad = encode_mad(tid, m);
  auto d = decode_mad(mad);
  if (!d || !std::holds_alternative<T>(d->message)) {
    ADD_FAILURE() << "the encoded MAD does not decode to the same message type";
    return T{};
  }
  EXPECT_EQ(d->transaction_id, tid);
  return std::get<T>(d->message);
}

ibv_gid gid_of(uint8_t last) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xFF;
  g.raw[15] = last;
  return g;
}

TEST(CmMad, CommonHeader) {
  Mad mad = encode_mad(0xA1B2C3D4E5F60718ull, RtuMessage{});
  EXPECT_EQ(mad[0], 1);     // BaseVersion
  EXPECT_EQ(mad[1], 0x07);  // MgmtClass CM
  EXPECT_EQ(mad[2], 2);     // ClassVersion
  EXPECT_EQ(mad[3], 0x03);  // Send
  EXPECT_EQ(mad[4] | mad[5] | mad[6] | mad[7], 0);
  const uint8_t tid[8] = {0xA1, 0xB2, 0xC3, 0xD4, 0xE5, 0xF6, 0x07, 0x18};
  EXPECT_EQ(std::memcmp(mad.data() + 8, tid, 8), 0);
  EXPECT_EQ(mad[16], 0x00);
  EXPECT_EQ(mad[17], 0x14);  // RTU
  EXPECT_EQ(mad[18] | mad[19] | mad[20] | mad[21] | mad[22] | mad[23], 0);
}

TEST(CmMad, ReqLayout) {
  ReqMessage r;
  r.local_comm_id = 0x01020304;
  r.service_id = service_id(0x0106, 7471);
  r.local_ca_guid = 0x0211223344556677ull;
  r.local_qpn = 0xABCDEF;
  r.responder_resources = 4;
  r.initiator_depth = 3;
  r.remote_cm_response_timeout = 20;
  r.transport_type = kTransportUc;
  r.flow_control = true;
  r.starting_psn = 0x123456;
  r.local_cm_response_timeout = 20;
  r.retry_count = 7;
  r.path_mtu = IBV_MTU_4096;
  r.rnr_retry_count = 6;
  r.max_cm_retries = 15;
  r.srq = true;
  r.primary_local_lid = 4791;
  r.primary_remote_lid = 0xC001;
  r.primary_local_gid = gid_of(1);
  r.primary_remote_gid = gid_of(2);
  r.primary_flow_label = 0xABCDE;
  r.primary_packet_rate = 0x2A;
  r.primary_traffic_class = 0x20;
  r.primary_hop_limit = 64;
  r.primary_sl = 5;
  r.primary_subnet_local = true;
  r.primary_local_ack_timeout = 14;
  for (size_t i = 0; i < r.private_data.size(); ++i) r.private_data[i] = uint8_t(i);
  Mad mad = encode_mad(1, r);
  const uint8_t* d = mad.data() + kData;
  EXPECT_EQ(mad[17], 0x10);
  // Example of roce-facts §7.5: TCP port 7471 -> 0x0000000001061D2F.
  const uint8_t sid[8] = {0, 0, 0, 0, 0x01, 0x06, 0x1D, 0x2F};
  EXPECT_EQ(std::memcmp(d + 8, sid, 8), 0);
  EXPECT_EQ(d[0], 0x01);
  EXPECT_EQ(d[3], 0x04);
  EXPECT_EQ(d[32], 0xAB);
  EXPECT_EQ(d[34], 0xEF);
  EXPECT_EQ(d[35], 4);                         // responder resources
  EXPECT_EQ(d[39], 3);                         // initiator depth
  EXPECT_EQ(d[43], (20 << 3) | (1 << 1) | 1);  // timeout, UC, flow control
  EXPECT_EQ(d[44], 0x12);
  EXPECT_EQ(d[46], 0x56);
  EXPECT_EQ(d[47], (20 << 3) | 7);
  EXPECT_EQ(d[48], 0xFF);  // P_Key
  EXPECT_EQ(d[49], 0xFF);
  EXPECT_EQ(d[50], (IBV_MTU_4096 << 4) | 6);
  EXPECT_EQ(d[51], (15 << 4) | (1 << 3));
  EXPECT_EQ(d[52], 4791 >> 8);
  EXPECT_EQ(d[53], 4791 & 0xFF);
  EXPECT_EQ(d[54], 0xC0);
  EXPECT_EQ(d[66], 0xFF);  // local GID ::ffff:0.0.0.1
  EXPECT_EQ(d[71], 1);
  EXPECT_EQ(d[87], 2);
  EXPECT_EQ(d[88], 0xAB);  // flow label 20 bits, reserved 6, rate 6
  EXPECT_EQ(d[89], 0xCD);
  EXPECT_EQ(d[90], 0xE0);
  EXPECT_EQ(d[91], 0x2A);
  EXPECT_EQ(d[92], 0x20);
  EXPECT_EQ(d[93], 64);
  EXPECT_EQ(d[94], (5 << 4) | (1 << 3));
  EXPECT_EQ(d[95], 14 << 3);
  for (int i = 96; i < 140; ++i) EXPECT_EQ(d[i], 0) << "alternate path byte " << i;
  EXPECT_EQ(d[140], 0);
  EXPECT_EQ(d[231], 91);

  ReqMessage back = roundtrip(r);
  EXPECT_EQ(back.local_comm_id, r.local_comm_id);
  EXPECT_EQ(back.service_id, r.service_id);
  EXPECT_EQ(back.local_ca_guid, r.local_ca_guid);
  EXPECT_EQ(back.local_qpn, r.local_qpn);
  EXPECT_EQ(back.transport_type, kTransportUc);
  EXPECT_TRUE(back.flow_control);
  EXPECT_EQ(back.starting_psn, r.starting_psn);
  EXPECT_EQ(back.retry_count, 7);
  EXPECT_EQ(back.path_mtu, IBV_MTU_4096);
  EXPECT_EQ(back.rnr_retry_count, 6);
  EXPECT_EQ(back.max_cm_retries, 15);
  EXPECT_TRUE(back.srq);
  EXPECT_EQ(back.primary_local_lid, 4791);
  EXPECT_EQ(back.primary_remote_lid, 0xC001);
  EXPECT_EQ(std::memcmp(back.primary_remote_gid.raw, r.primary_remote_gid.raw, 16), 0);
  EXPECT_EQ(back.primary_flow_label, 0xABCDEu);
  EXPECT_EQ(back.primary_packet_rate, 0x2A);
  EXPECT_EQ(back.primary_sl, 5);
  EXPECT_TRUE(back.primary_subnet_local);
  EXPECT_EQ(back.primary_local_ack_timeout, 14);
  EXPECT_EQ(back.private_data, r.private_data);
}

TEST(CmMad, RepLayout) {
  RepMessage r;
  r.local_comm_id = 0x11111111;
  r.remote_comm_id = 0x22222222;
  r.local_qpn = 0x000102;
  r.starting_psn = 0xFEDCBA;
  r.responder_resources = 2;
  r.initiator_depth = 1;
  r.target_ack_delay = 15;
  r.failover_accepted = 1;
  r.flow_control = true;
  r.rnr_retry_count = 7;
  r.srq = true;
  r.local_ca_guid = 0x0200000000000001ull;
  r.private_data[0] = 0xAA;
  r.private_data[195] = 0xBB;
  Mad mad = encode_mad(9, r);
  const uint8_t* d = mad.data() + kData;
  EXPECT_EQ(mad[17], 0x13);
  EXPECT_EQ(d[4], 0x22);
  EXPECT_EQ(d[14], 0x02);  // QPN in the top 24 bits of word 12
  EXPECT_EQ(d[15], 0);
  EXPECT_EQ(d[20], 0xFE);
  EXPECT_EQ(d[24], 2);
  EXPECT_EQ(d[25], 1);
  EXPECT_EQ(d[26], (15 << 3) | (1 << 1) | 1);
  EXPECT_EQ(d[27], (7 << 5) | (1 << 4));
  EXPECT_EQ(d[28], 0x02);
  EXPECT_EQ(d[35], 0x01);
  EXPECT_EQ(d[36], 0xAA);
  EXPECT_EQ(d[231], 0xBB);
  RepMessage back = roundtrip(r);
  EXPECT_EQ(back.remote_comm_id, r.remote_comm_id);
  EXPECT_EQ(back.local_qpn, r.local_qpn);
  EXPECT_EQ(back.starting_psn, r.starting_psn);
  EXPECT_EQ(back.target_ack_delay, 15);
  EXPECT_EQ(back.failover_accepted, 1);
  EXPECT_EQ(back.rnr_retry_count, 7);
  EXPECT_TRUE(back.srq);
  EXPECT_EQ(back.private_data, r.private_data);
}

TEST(CmMad, RejRtuDreqDrepLayouts) {
  RejMessage rej;
  rej.local_comm_id = 5;
  rej.remote_comm_id = 6;
  rej.message_rejected = RejectedMessage::kRep;
  rej.reject_info_length = 3;
  rej.reason = uint16_t(RejReason::kConsumerDefined);
  rej.private_data[147] = 0x77;
  Mad mad = encode_mad(1, rej);
  const uint8_t* d = mad.data() + kData;
  EXPECT_EQ(mad[17], 0x12);
  EXPECT_EQ(d[8], 1 << 6);
  EXPECT_EQ(d[9], 3 << 1);
  EXPECT_EQ(d[11], 28);
  EXPECT_EQ(d[231], 0x77);  // private data at 84, 148 bytes
  RejMessage rb = roundtrip(rej);
  EXPECT_EQ(rb.reason, 28);
  EXPECT_EQ(rb.message_rejected, RejectedMessage::kRep);
  EXPECT_EQ(rb.reject_info_length, 3);

  DreqMessage dreq;
  dreq.local_comm_id = 7;
  dreq.remote_comm_id = 8;
  dreq.remote_qpn = 0x123456;
  mad = encode_mad(1, dreq);
  EXPECT_EQ(mad[17], 0x15);
  EXPECT_EQ(mad[kData + 8], 0x12);
  EXPECT_EQ(mad[kData + 10], 0x56);
  EXPECT_EQ(roundtrip(dreq).remote_qpn, 0x123456u);

  DrepMessage drep;
  drep.remote_comm_id = 9;
  EXPECT_EQ(encode_mad(1, drep)[17], 0x16);
  EXPECT_EQ(roundtrip(drep).remote_comm_id, 9u);

  RtuMessage rtu;
  rtu.private_data[223] = 1;
  EXPECT_EQ(roundtrip(rtu).private_data[223], 1);
}

TEST(CmMad, SidrLayouts) {
  SidrReqMessage q;
  q.request_id = 0xCAFEBABE;
  q.service_id = service_id(0x0111, 5000);
  q.private_data[215] = 0x42;
  Mad mad = encode_mad(3, q);
  EXPECT_EQ(mad[17], 0x17);
  EXPECT_EQ(mad[kData + 4], 0xFF);  // P_Key
  EXPECT_EQ(mad[kData + 12], 0x01);
  EXPECT_EQ(mad[kData + 13], 0x11);
  EXPECT_EQ(mad[kData + 231], 0x42);
  EXPECT_EQ(roundtrip(q).service_id, q.service_id);

  SidrRepMessage p;
  p.request_id = 0xCAFEBABE;
  p.status = SidrStatus::kNoQp;
  p.qpn = 0xABCDEF;
  p.service_id = q.service_id;
  p.qkey = 0x01234567;
  p.private_data[135] = 0x24;
  mad = encode_mad(3, p);
  const uint8_t* d = mad.data() + kData;
  EXPECT_EQ(mad[17], 0x18);
  EXPECT_EQ(d[4], 3);
  EXPECT_EQ(d[8], 0xAB);
  EXPECT_EQ(d[20], 0x01);
  EXPECT_EQ(d[23], 0x67);
  EXPECT_EQ(d[231], 0x24);
  SidrRepMessage back = roundtrip(p);
  EXPECT_EQ(back.status, SidrStatus::kNoQp);
  EXPECT_EQ(back.qpn, 0xABCDEFu);
  EXPECT_EQ(back.qkey, 0x01234567u);
}

TEST(CmMad, DecodeRejectsMalformed) {
  Mad good = encode_mad(1, RtuMessage{});
  EXPECT_TRUE(decode_mad(good).has_value());
  EXPECT_FALSE(decode_mad(std::span<const uint8_t>(good.data(), 255)).has_value());
  Mad m = good;
  m[0] = 2;  // base version
  EXPECT_FALSE(decode_mad(m).has_value());
  m = good;
  m[1] = 0x04;  // another management class
  EXPECT_FALSE(decode_mad(m).has_value());
  m = good;
  m[2] = 1;  // class version
  EXPECT_FALSE(decode_mad(m).has_value());
  m = good;
  m[3] = 0x81;  // RTU as a GetResp
  EXPECT_FALSE(decode_mad(m).has_value());
  m = good;
  m[17] = 0x11;  // MRA: uroce never sends it
  EXPECT_FALSE(decode_mad(m).has_value());
  m = good;
  m[3] = 0x81;
  m[17] = 0x01;  // a ClassPortInfo GetResp: the CM asks no one for it
  EXPECT_FALSE(decode_mad(m).has_value());
  m = good;
  m[16] = 0x12;  // unknown attribute
  EXPECT_FALSE(decode_mad(m).has_value());
}

TEST(CmaHeader, Ipv4Layout) {
  uint8_t b[kCmaHeaderSize];
  encode_cma_header({7471, 0x7F000001, 0xC0000202}, std::span<uint8_t, kCmaHeaderSize>(b));
  EXPECT_EQ(b[0], 0x00);
  EXPECT_EQ(b[1], 0x40);
  EXPECT_EQ(b[2], 0x1D);
  EXPECT_EQ(b[3], 0x2F);
  for (int i = 4; i < 16; ++i) EXPECT_EQ(b[i], 0);
  EXPECT_EQ(b[16], 127);
  EXPECT_EQ(b[19], 1);
  for (int i = 20; i < 32; ++i) EXPECT_EQ(b[i], 0);
  EXPECT_EQ(b[32], 192);
  EXPECT_EQ(b[35], 2);
  auto h = decode_cma_header(std::span<const uint8_t, kCmaHeaderSize>(b));
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->src_port, 7471);
  EXPECT_EQ(h->src_ip, 0x7F000001u);
  EXPECT_EQ(h->dst_ip, 0xC0000202u);
  b[1] = 0x50;  // neither IPv4 nor IPv6
  EXPECT_FALSE(decode_cma_header(std::span<const uint8_t, kCmaHeaderSize>(b)).has_value());
}

// roce-facts §7.6: IP version 6 in the high nibble of byte 1, the addresses
// whole in bytes 4-19 and 20-35 (no scope on the wire).
TEST(CmaHeader, Ipv6Layout) {
  transport::IpAddress src, dst;
  const uint8_t s6[16] = {0xFD, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  const uint8_t d6[16] = {0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 0, 0, 2};
  std::memcpy(src.bytes.data(), s6, 16);
  std::memcpy(dst.bytes.data(), d6, 16);
  dst.scope = 7;
  uint8_t b[kCmaHeaderSize];
  encode_cma_header({18832, src, dst}, std::span<uint8_t, kCmaHeaderSize>(b));
  EXPECT_EQ(b[0], 0x00);
  EXPECT_EQ(b[1], 0x60);
  EXPECT_EQ(b[2] << 8 | b[3], 18832);
  EXPECT_EQ(std::memcmp(b + 4, s6, 16), 0);
  EXPECT_EQ(std::memcmp(b + 20, d6, 16), 0);
  auto h = decode_cma_header(std::span<const uint8_t, kCmaHeaderSize>(b));
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->src_port, 18832);
  EXPECT_EQ(h->src_ip, src);
  EXPECT_FALSE(h->dst_ip.is_v4());
  EXPECT_EQ(h->dst_ip.bytes, dst.bytes);
  EXPECT_EQ(h->dst_ip.scope, 0u);  // the interface is the receiver's to know
}

}  // namespace
}  // namespace uroce::rdmacm
