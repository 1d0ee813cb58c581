#include "rdmacm/mad_framer.h"

#include <algorithm>
#include <cstring>

namespace uroce::rdmacm {

MadFramer::Status MadFramer::feed(std::span<const uint8_t> bytes, std::vector<DecodedMad>* out) {
  while (!malformed_ && !bytes.empty()) {
    if (filled_ == 0 && bytes.size() >= kMadSize) {
      // A whole MAD in place: decoded without a copy.
      malformed_ = !take(bytes.first(kMadSize), out);
      bytes = bytes.subspan(kMadSize);
      continue;
    }
    const size_t n = std::min(kMadSize - filled_, bytes.size());
    std::memcpy(partial_.data() + filled_, bytes.data(), n);
    filled_ += n;
    bytes = bytes.subspan(n);
    if (filled_ < kMadSize) break;
    filled_ = 0;
    malformed_ = !take(partial_, out);
  }
  return status();
}

bool MadFramer::take(std::span<const uint8_t> frame, std::vector<DecodedMad>* out) {
  auto mad = decode_mad(frame);
  if (!mad) return false;
  out->push_back(std::move(*mad));
  return true;
}

}  // namespace uroce::rdmacm
