#include "engine/gsi.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "engine/engine_context.h"
#include "engine/host_delivery.h"
#include "engine/ip_flow.h"
#include "engine/tx_batch.h"
#include "host/host_registry.h"
#include "wire/byte_order.h"

namespace uroce::engine {

namespace {

std::atomic<GsiSink> g_sink{nullptr};

// What routing needs of a CM MAD (roce-facts.md §7.2, §7.3): the common
// header's class and attribute, and where each message names the receiver.
constexpr uint8_t kMgmtClassCm = 0x07, kBaseVersion = 1, kCmClassVersion = 2;
constexpr size_t kBaseVersionAt = 0, kMgmtClassAt = 1, kClassVersionAt = 2, kAttributeAt = 16, kBody = 24;
enum : uint16_t { kReq = 0x0010, kRej = 0x0012, kSidrReq = 0x0017, kSidrRep = 0x0018 };
constexpr size_t kServiceIdAt = kBody + 8;     // REQ and SIDR_REQ
constexpr size_t kReqLocalCommIdAt = kBody;    // REQ; SIDR_REQ's request ID is there too
constexpr size_t kRemoteCommIdAt = kBody + 4;  // MRA, REJ, REP, RTU, DREQ, DREP
constexpr size_t kSidrRepRequestIdAt = kBody;  // SIDR_REP
constexpr uint16_t kRejInvalidServiceId = 8;   // IBA table 112
constexpr uint8_t kSidrSidUnsupported = 1;     // IBA 12.11.2

// The communication ID a MAD names as its receiver's, for those routed by it.
std::optional<uint32_t> receiver_comm_id(const uint8_t* mad) {
  uint16_t attr = wire::load_be16(mad + kAttributeAt);
  if (attr == kSidrRep) return wire::load_be32(mad + kSidrRepRequestIdAt);
  if (attr >= 0x0011 && attr <= 0x0016) return wire::load_be32(mad + kRemoteCommIdAt);  // MRA .. DREP
  return std::nullopt;
}

// The MAD the host's CM answers a REQ / SIDR_REQ for a service nobody
// serves with: the request's header as a Send of REJ (reason 8, naming the
// REQ's communication ID) or SIDR_REP (status 1, with its request ID and
// service ID).
std::array<uint8_t, kMadBytes> unserved_answer(const uint8_t* request) {
  std::array<uint8_t, kMadBytes> a{};
  std::memcpy(a.data(), request, kBody);  // versions, class, method Send, TransactionID
  std::memset(a.data() + 4, 0, 4);        // status, class specific
  std::memset(a.data() + 18, 0, 6);       // reserved, attribute modifier
  uint32_t id = wire::load_be32(request + kReqLocalCommIdAt);
  if (wire::load_be16(request + kAttributeAt) == kReq) {
    wire::store_be16(a.data() + kAttributeAt, kRej);
    wire::store_be32(a.data() + kRemoteCommIdAt, id);  // body byte 8 (0): the REQ is what is rejected
    wire::store_be16(a.data() + kBody + 10, kRejInvalidServiceId);
  } else {
    wire::store_be16(a.data() + kAttributeAt, kSidrRep);
    wire::store_be32(a.data() + kSidrRepRequestIdAt, id);
    a[kBody + 4] = kSidrSidUnsupported;
    std::memcpy(a.data() + kBody + 12, request + kServiceIdAt, 8);
  }
  return a;
}

// A UDP socket of `ip`'s family; with `port`, the address to bind or send to.
int socket_for(const transport::IpAddress& ip, uint16_t port, sockaddr_storage* sa, socklen_t* len) {
  std::memset(sa, 0, sizeof *sa);
  if (ip.is_v4()) {
    auto* s = reinterpret_cast<sockaddr_in*>(sa);
    s->sin_family = AF_INET;
    s->sin_port = htons(port);
    s->sin_addr.s_addr = htonl(ip.v4());
    *len = sizeof *s;
  } else {
    auto* s = reinterpret_cast<sockaddr_in6*>(sa);
    s->sin6_family = AF_INET6;
    s->sin6_port = htons(port);
    std::memcpy(&s->sin6_addr, ip.bytes.data(), 16);
    s->sin6_scope_id = ip.scope;
    *len = sizeof *s;
  }
  return socket(sa->ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
}

// Passes a REQ / SIDR_REQ to the socket its listener holds at the address it
// was sent to and its rdma_cm port. A socket that can bind there shows that
// nobody listens: false.
bool forward_to_listener(const GsiMad& m) {
  uint16_t port = uint16_t(wire::load_be64(m.mad.data() + kServiceIdAt));
  sockaddr_storage sa;
  socklen_t len;
  int fd = socket_for(m.dst_ip, port, &sa, &len);
  if (fd < 0) return false;
  bool listened = bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 && errno == EADDRINUSE;
  if (listened) {
    std::array<uint8_t, kGsiEnvelopeBytes> env;
    encode_gsi_envelope(m, env);
    listened = sendto(fd, env.data(), env.size(), 0, reinterpret_cast<sockaddr*>(&sa), len) == ssize_t(env.size());
  }
  close(fd);
  return listened;
}

// A UD SEND_ONLY of one MAD to QP1 with the GSI Q_Key (roce-facts §7.1).
bool is_gsi_datagram(const wire::PacketView& pkt) {
  return pkt.bth().opcode() == wire::make_opcode(wire::Service::kUd, wire::Operation::kSendOnly) &&
         pkt.deth().qkey() == wire::kGsiQkey && pkt.payload_len == kMadBytes;
}

// A MAD of the CM class, in the versions the CM speaks (IBA 13.4.3).
bool is_cm_mad(const uint8_t* mad) {
  return mad[kBaseVersionAt] == kBaseVersion && mad[kMgmtClassAt] == kMgmtClassCm &&
         mad[kClassVersionAt] == kCmClassVersion;
}

int send_mad_packet(EngineContext& ctx, const transport::Endpoint& dst, const transport::IpAddress& src_ip,
                    std::span<const uint8_t, kMadBytes> mad);

constexpr uint8_t kEnvelopeMagic[8] = {'u', 'r', 'o', 'c', 'e', 'G', 'S', '1'};

}  // namespace

void set_gsi_sink(GsiSink sink) { g_sink.store(sink, std::memory_order_release); }

void gsi_receive(EngineContext& ctx, const transport::RxDatagram& d, const wire::PacketView& pkt) {
  if (!is_gsi_datagram(pkt) || !is_cm_mad(pkt.payload())) {
    ctx.stats.rx_gsi_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  GsiMad m;
  m.src = d.src;
  m.dst_ip = d.dst_ip;
  m.src_qpn = pkt.deth().src_qp();
  std::memcpy(m.mad.data(), pkt.payload(), kMadBytes);
  ctx.stats.rx_gsi.fetch_add(1, std::memory_order_relaxed);
  uint16_t attr = wire::load_be16(m.mad.data() + kAttributeAt);
  if (attr == kReq || attr == kSidrReq) {
    if (!forward_to_listener(m)) {
      auto answer = unserved_answer(m.mad.data());
      (void)send_mad_packet(ctx, gsi_reply_endpoint(m.src), m.dst_ip, answer);
    }
    return;
  }
  std::optional<uint32_t> comm_id = receiver_comm_id(m.mad.data());
  host::HostRegistry* registry = ctx.host_registry();
  unsigned slot = comm_id ? comm_id_slot(*comm_id) : 0;
  if (registry && slot != registry->slot() && slot >= host::kFirstHostSlot && slot <= host::kLastHostSlot) {
    relay_to_slot(ctx, d, slot, TxBatch::local());
    return;
  }
  if (!comm_id || !ctx.gsi_inbox.push(m)) ctx.stats.rx_gsi_dropped.fetch_add(1, std::memory_order_relaxed);
}

bool GsiInbox::push(const GsiMad& m) {
  if (count_ == mads_.size() || !g_sink.load(std::memory_order_acquire)) return false;
  mads_[count_++] = m;
  return true;
}

void GsiInbox::deliver() {
  GsiSink sink = g_sink.load(std::memory_order_acquire);
  for (size_t i = 0; i < count_; ++i) sink(mads_[i]);
  count_ = 0;
}

namespace {
// One MAD as a UD SEND_ONLY from QP1 to QP1 (roce-facts §7.1).
int send_mad_packet(EngineContext& ctx, const transport::Endpoint& dst, const transport::IpAddress& src_ip,
                    std::span<const uint8_t, kMadBytes> mad) {
  if (dst.ip.is_v4() != src_ip.is_v4()) return EINVAL;
  TxBatch& tx = TxBatch::local();
  tx.use(&ctx.transport());
  constexpr uint8_t kOpcode = wire::make_opcode(wire::Service::kUd, wire::Operation::kSendOnly);
  const wire::OpcodeInfo& info = wire::opcode_info(kOpcode);
  uint8_t* h = tx.begin_packet(dst, src_ip, info.header_len);
  wire::Bth(h).fill(kOpcode, false, 0, wire::kDefaultPkey, kGsiQpn, false, 0);
  wire::Deth(h + info.offset[unsigned(wire::Hdr::kDeth)]).fill(wire::kGsiQkey, kGsiQpn);
  tx.add_payload(mad.data(), kMadBytes);
  uint32_t sent = tx.end_packet(ip_flow(src_ip, dst.ip, ctx.lid(), dst.port));
  if (!tx.in_burst()) tx.flush();
  if (!sent) return ENOBUFS;
  ctx.stats.tx_gsi.fetch_add(1, std::memory_order_relaxed);
  return 0;
}
}  // namespace

int gsi_send(EngineContext& ctx, const transport::Endpoint& dst, const transport::IpAddress& src_ip,
             std::span<const uint8_t, kMadBytes> mad) {
  ctx.send_deferred_acks_now(true);  // what the engine owes its peers leaves first
  return send_mad_packet(ctx, dst, src_ip, mad);
}

int gsi_send(ibv_context* verbs, const transport::Endpoint& dst, const transport::IpAddress& src_ip,
             std::span<const uint8_t, kMadBytes> mad) {
  EngineContext* ctx = verbs ? EngineContext::from(verbs) : nullptr;
  return ctx ? gsi_send(*ctx, dst, src_ip, mad) : EINVAL;
}

unsigned gsi_slot(ibv_context* verbs) {
  EngineContext* ctx = verbs ? EngineContext::from(verbs) : nullptr;
  host::HostRegistry* registry = ctx ? ctx->host_registry() : nullptr;
  return registry ? registry->slot() : 0;
}

bool gsi_engine_alive(ibv_context* verbs, unsigned slot, uint16_t port) {
  EngineContext* ctx = verbs ? EngineContext::from(verbs) : nullptr;
  host::HostRegistry* registry = ctx ? ctx->host_registry() : nullptr;
  if (!registry || slot < host::kFirstHostSlot || slot > host::kLastHostSlot) return true;
  if (slot == registry->slot()) return true;  // this engine's own: the peer is in this process
  if (registry->port_of(slot) == port) return true;
  // The cached liveness may be a previous owner's (a slot claimed again within
  // kRecheckMs): ask the kernel before calling the peer gone.
  registry->invalidate(slot);
  return registry->port_of(slot) == port;
}

void encode_gsi_envelope(const GsiMad& m, std::span<uint8_t, kGsiEnvelopeBytes> out) {
  uint8_t* p = out.data();
  std::memcpy(p, kEnvelopeMagic, 8);
  std::memcpy(p + 8, m.src.ip.bytes.data(), 16);
  wire::store_be32(p + 24, m.src.ip.scope);
  std::memcpy(p + 28, m.dst_ip.bytes.data(), 16);
  wire::store_be32(p + 44, m.dst_ip.scope);
  wire::store_be16(p + 48, m.src.port);
  wire::store_be32(p + 50, m.src_qpn);
  std::memcpy(p + 54, m.mad.data(), kMadBytes);
}

std::optional<GsiMad> decode_gsi_envelope(std::span<const uint8_t> in) {
  if (in.size() != kGsiEnvelopeBytes || std::memcmp(in.data(), kEnvelopeMagic, 8) != 0) return std::nullopt;
  const uint8_t* p = in.data();
  GsiMad m;
  m.src.ip = transport::IpAddress::from_bytes(p + 8, wire::load_be32(p + 24));
  m.dst_ip = transport::IpAddress::from_bytes(p + 28, wire::load_be32(p + 44));
  m.src.port = wire::load_be16(p + 48);
  m.src_qpn = wire::load_be32(p + 50);
  std::memcpy(m.mad.data(), p + 54, kMadBytes);
  return m;
}

}  // namespace uroce::engine
