// The framing of a CM connection (design §6): the TCP stream is one 256-byte
// CM MAD after another, with no length field and no marker. A frame that is
// not a well-formed CM MAD therefore means that the rest of the stream cannot
// be trusted (there is nothing to resynchronise on), and the connection must
// close. Pure byte code, no sockets, so that it can be fuzzed
// (tests/fuzz/cm_framing_fuzz.cc) with the stream split at arbitrary points.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "rdmacm/cm_messages.h"

namespace uroce::rdmacm {

class MadFramer {
 public:
  enum class Status : uint8_t {
    kOk,         // every complete frame so far was a CM MAD
    kMalformed,  // a frame was not: nothing after it is consumed
  };

  // Consumes the next piece of the stream (any length, any split) and appends
  // every MAD it completes, decoded, to `out`. At the first malformed frame it
  // stops for good: the MADs before it are in `out`, and this and every later
  // call returns kMalformed without consuming anything.
  Status feed(std::span<const uint8_t> bytes, std::vector<DecodedMad>* out);

  Status status() const { return malformed_ ? Status::kMalformed : Status::kOk; }
  // Bytes of an incomplete MAD held back: always less than one MAD, which is
  // all the memory a connection's input ever takes beyond the socket's.
  size_t buffered() const { return filled_; }

 private:
  bool take(std::span<const uint8_t> frame, std::vector<DecodedMad>* out);

  Mad partial_{};
  size_t filled_ = 0;
  bool malformed_ = false;
};

}  // namespace uroce::rdmacm
