// IB CM messages in their MAD layouts (roce-facts §7.2, §7.3, §7.6): what
// uroce's connection manager sends to QP1 (design §6).
// Pure byte code: every message is one 256-byte MAD, encoded from and decoded
// into a plain struct; nothing here knows about ids, sockets or verbs.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <variant>

#include "rdmacm/sockaddr_util.h"

namespace uroce::rdmacm {

constexpr size_t kMadSize = 256;
constexpr size_t kMadHeaderSize = 24;
using Mad = std::array<uint8_t, kMadSize>;

constexpr uint8_t kMgmtClassCm = 0x07;
constexpr uint8_t kCmClassVersion = 2;
constexpr uint8_t kMethodSend = 0x03;

enum class CmAttr : uint16_t {
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,
  kSidrRep = 0x0018,
};

// Raw private-data sizes of the CM messages (roce-facts §7.7).
constexpr size_t kReqPrivateSize = 92;
constexpr size_t kRepPrivateSize = 196;
constexpr size_t kRejPrivateSize = 148;
constexpr size_t kRtuPrivateSize = 224;
constexpr size_t kDreqPrivateSize = 220;
constexpr size_t kDrepPrivateSize = 224;
constexpr size_t kSidrReqPrivateSize = 216;
constexpr size_t kSidrRepPrivateSize = 136;

// REJ reasons used by uroce (IBA table 112; ib_cm.h).
enum class RejReason : uint16_t {
  kNoQp = 1,
  kTimeout = 4,
  kInvalidServiceId = 8,
  kInvalidTransportType = 9,
  kStaleConnection = 10,
  kInvalidGid = 12,
  kConsumerDefined = 28,
  kVendorOptionNotSupported = 35,
};

// SIDR_REP status (IBA 12.11.2).
enum class SidrStatus : uint8_t { kSuccess = 0, kSidUnsupported = 1, kRejected = 2, kNoQp = 3 };

// Which message a REJ refuses (top 2 bits of byte 8).
enum class RejectedMessage : uint8_t { kReq = 0, kRep = 1, kOther = 2 };

// IBA transport service types in the REQ.
constexpr uint8_t kTransportRc = 0;
constexpr uint8_t kTransportUc = 1;
constexpr uint8_t kTransportXrc = 3;  // IBA 12.6.5: REQ Transport Service Type
// The REQ's transport service type for QPs of type `t` (an XRC initiator
// connects to an XRC target).
inline uint8_t transport_of(ibv_qp_type t) {
  return t == IBV_QPT_UC ? kTransportUc : t == IBV_QPT_XRC_SEND || t == IBV_QPT_XRC_RECV ? kTransportXrc : kTransportRc;
}

struct ReqMessage {
  uint32_t local_comm_id = 0;
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;  // 24 bits
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t remote_cm_response_timeout = 0;  // 5 bits
  uint8_t transport_type = kTransportRc;   // 2 bits
  bool flow_control = false;
  uint32_t starting_psn = 0;              // 24 bits
  uint8_t local_cm_response_timeout = 0;  // 5 bits
  uint8_t retry_count = 0;                // 3 bits
  uint16_t pkey = 0xFFFF;
  uint8_t path_mtu = IBV_MTU_1024;  // 4 bits, ibv_mtu values
  uint8_t rnr_retry_count = 0;      // 3 bits
  uint8_t max_cm_retries = 0;       // 4 bits
  bool srq = false;
  uint16_t primary_local_lid = 0;  // uroce: the active side's UDP port
  uint16_t primary_remote_lid = 0;
  ibv_gid primary_local_gid{};
  ibv_gid primary_remote_gid{};
  uint32_t primary_flow_label = 0;  // 20 bits
  uint8_t primary_packet_rate = 0;  // 6 bits
  uint8_t primary_traffic_class = 0;
  uint8_t primary_hop_limit = 0;
  uint8_t primary_sl = 0;  // 4 bits
  bool primary_subnet_local = false;
  uint8_t primary_local_ack_timeout = 0;  // 5 bits
  std::array<uint8_t, kReqPrivateSize> private_data{};
};

struct RepMessage {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;  // 24 bits
  uint32_t starting_psn = 0;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;   // 5 bits
  uint8_t failover_accepted = 0;  // 2 bits
  bool flow_control = false;
  uint8_t rnr_retry_count = 0;  // 3 bits
  bool srq = false;
  uint64_t local_ca_guid = 0;
  std::array<uint8_t, kRepPrivateSize> private_data{};
};

struct RejMessage {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  RejectedMessage message_rejected = RejectedMessage::kReq;
  uint8_t reject_info_length = 0;  // 7 bits
  uint16_t reason = 0;
  std::array<uint8_t, 72> additional_info{};
  std::array<uint8_t, kRejPrivateSize> private_data{};
};

struct RtuMessage {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kRtuPrivateSize> private_data{};
};

struct DreqMessage {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t remote_qpn = 0;  // 24 bits
  std::array<uint8_t, kDreqPrivateSize> private_data{};
};

struct DrepMessage {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kDrepPrivateSize> private_data{};
};

struct SidrReqMessage {
  uint32_t request_id = 0;
  uint16_t pkey = 0xFFFF;
  uint64_t service_id = 0;
  std::array<uint8_t, kSidrReqPrivateSize> private_data{};
};

struct SidrRepMessage {
  uint32_t request_id = 0;
  SidrStatus status = SidrStatus::kSuccess;
  uint8_t additional_info_length = 0;
  uint32_t qpn = 0;  // 24 bits
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  std::array<uint8_t, 72> additional_info{};
  std::array<uint8_t, kSidrRepPrivateSize> private_data{};
};

using CmMessage = std::variant<ReqMessage, RepMessage, RejMessage, RtuMessage, DreqMessage, DrepMessage, SidrReqMessage,
                               SidrRepMessage>;

// A decoded MAD: its TransactionID and the message.
struct DecodedMad {
  uint64_t transaction_id = 0;
  CmMessage message;
};

// Encodes one message as a MAD with the given TransactionID.
Mad encode_mad(uint64_t transaction_id, const CmMessage& message);

// Decodes a MAD; nullopt if it is not a well-formed CM MAD of a supported
// attribute (wrong size, version, class, method or attribute; MRA, LAP, APR,
// ClassPortInfo).
std::optional<DecodedMad> decode_mad(std::span<const uint8_t> bytes);

// The cma IP header at the start of REQ / SIDR_REQ private data (roce-facts
// §7.6): IP version 4 (both addresses IPv4) or 6 (no scope on the wire).
constexpr size_t kCmaHeaderSize = 36;
struct CmaIpHeader {
  uint16_t src_port = 0;
  transport::IpAddress src_ip;
  transport::IpAddress dst_ip;
};
void encode_cma_header(const CmaIpHeader& h, std::span<uint8_t, kCmaHeaderSize> out);
// nullopt unless version 0 and IP version 4 or 6.
std::optional<CmaIpHeader> decode_cma_header(std::span<const uint8_t, kCmaHeaderSize> in);

// Service ID of an rdma_cm port (roce-facts §7.5): (port_space << 16) | port.
constexpr uint64_t service_id(uint16_t port_space, uint16_t port) { return (uint64_t(port_space) << 16) | port; }
constexpr uint16_t service_id_port_space(uint64_t sid) { return uint16_t(sid >> 16); }
constexpr uint16_t service_id_port(uint64_t sid) { return uint16_t(sid); }

}  // namespace uroce::rdmacm
