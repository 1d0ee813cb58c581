// Fuzz target: the CM MAD decoder (src/rdmacm/cm_messages.*), which reads
// whatever a peer's CM connection carries (design §6).
//
// The input is taken as one MAD (cut or zero-padded to 256 bytes; the decoder
// itself is also given the raw input, which it must refuse unless it is
// exactly one MAD). Every MAD either decodes or is refused; what decodes must
// re-encode to a MAD that decodes again and re-encodes to the same bytes
// (decoding keeps every field the encoder writes), and the cma IP header of a
// REQ or SIDR_REQ must decode from its private data. ASan and UBSan watch
// every read.
#include <cstdlib>
#include <cstring>
#include <variant>

#include "rdmacm/cm_messages.h"

using namespace uroce::rdmacm;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void check_cma_header(const CmMessage& m) {
  const uint8_t* pd = nullptr;
  if (auto* req = std::get_if<ReqMessage>(&m)) pd = req->private_data.data();
  if (auto* sidr = std::get_if<SidrReqMessage>(&m)) pd = sidr->private_data.data();
  if (!pd) return;
  auto h = decode_cma_header(std::span<const uint8_t, kCmaHeaderSize>(pd, kCmaHeaderSize));
  if (!h) return;
  // Re-encoding a decoded header and decoding it again gives it back.
  uint8_t again[kCmaHeaderSize];
  encode_cma_header(*h, std::span<uint8_t, kCmaHeaderSize>(again));
  auto h2 = decode_cma_header(std::span<const uint8_t, kCmaHeaderSize>(again));
  check(h2 && h2->src_port == h->src_port && h2->src_ip == h->src_ip && h2->dst_ip == h->dst_ip);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto raw = decode_mad(std::span<const uint8_t>(data, size));
  check(!raw || size == kMadSize);

  Mad mad{};
  std::memcpy(mad.data(), data, size < kMadSize ? size : kMadSize);
  auto decoded = decode_mad(mad);
  if (!decoded) return 0;
  const Mad once = encode_mad(decoded->transaction_id, decoded->message);
  auto again = decode_mad(once);
  check(again && again->transaction_id == decoded->transaction_id &&
        again->message.index() == decoded->message.index());
  check(encode_mad(again->transaction_id, again->message) == once);
  check_cma_header(decoded->message);
  return 0;
}
