// Fuzz target: the framing of a CM connection (src/rdmacm/mad_framer.*): a
// TCP byte stream, arriving in pieces of any size, cut into 256-byte MADs.
//
// The input is the stream, followed (at its end, as FuzzedDataProvider takes
// integers from the back) by the sizes of the pieces it arrives in. Fed piece
// by piece, the framer must produce exactly what a reference gives for the
// whole stream (cut every 256 bytes, decode each MAD, stop at the first that
// does not decode): the same MADs and the same verdict. It must never hold a
// whole MAD back, and after a malformed MAD it must take nothing more.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdlib>
#include <vector>

#include "rdmacm/mad_framer.h"

using namespace uroce::rdmacm;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

struct Framed {
  std::vector<Mad> mads;  // re-encoded, to compare
  bool malformed = false;
};

Framed reference(const std::vector<uint8_t>& stream) {
  Framed f;
  for (size_t off = 0; off + kMadSize <= stream.size(); off += kMadSize) {
    auto m = decode_mad(std::span<const uint8_t>(stream.data() + off, kMadSize));
    if (!m) {
      f.malformed = true;
      break;
    }
    f.mads.push_back(encode_mad(m->transaction_id, m->message));
  }
  return f;
}

Framed in_pieces(const std::vector<uint8_t>& stream, const std::vector<size_t>& pieces) {
  MadFramer framer;
  std::vector<DecodedMad> out;
  std::span<const uint8_t> rest(stream);
  for (size_t i = 0; i <= pieces.size(); ++i) {
    const size_t n = i < pieces.size() && pieces[i] < rest.size() ? pieces[i] : rest.size();
    const size_t before = out.size();
    const auto status = framer.feed(rest.first(n), &out);
    rest = rest.subspan(n);
    check(framer.buffered() < kMadSize);
    check(status == framer.status());
    // A piece completes at most what it can hold.
    check(out.size() - before <= (n + kMadSize - 1) / kMadSize);
    if (status == MadFramer::Status::kMalformed) {
      // Nothing more is taken, whatever comes.
      const size_t frozen = out.size();
      check(framer.feed(rest, &out) == MadFramer::Status::kMalformed && out.size() == frozen);
      break;
    }
  }
  Framed f;
  f.malformed = framer.status() == MadFramer::Status::kMalformed;
  for (const DecodedMad& m : out) f.mads.push_back(encode_mad(m.transaction_id, m.message));
  if (!f.malformed) check(framer.buffered() == stream.size() % kMadSize);
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  std::vector<size_t> pieces(fdp.ConsumeIntegralInRange<size_t>(0, 32));
  for (size_t& p : pieces) p = fdp.ConsumeIntegralInRange<size_t>(0, 3 * kMadSize);
  const std::vector<uint8_t> stream = fdp.ConsumeRemainingBytes<uint8_t>();

  const Framed expected = reference(stream);
  const Framed got = in_pieces(stream, pieces);
  check(got.malformed == expected.malformed);
  check(got.mads == expected.mads);
  return 0;
}
