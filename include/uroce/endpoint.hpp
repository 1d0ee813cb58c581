// uroce C++ API: QpEndpoint, what a peer needs to reach a queue pair.
#pragma once

#include <endian.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include "uroce/device.hpp"

namespace uroce {

// {gid, qpn, psn, lid, qkey}: what the classic verbs programs exchange out of band before
// connecting (qkey matters for UD only). to_bytes()/from_bytes() give a fixed 32-byte
// big-endian encoding.
struct QpEndpoint {
  Gid gid;
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;  // the first PSN this side sends with
  std::uint32_t qkey = 0;
  std::uint16_t lid = 0;

  static constexpr std::size_t kWireSize = 32;

  std::array<std::byte, kWireSize> to_bytes() const noexcept {
    std::array<std::byte, kWireSize> out{};
    std::memcpy(out.data(), gid.bytes.data(), 16);
    std::uint32_t q = htobe32(qpn), p = htobe32(psn), k = htobe32(qkey);
    std::uint16_t l = htobe16(lid);
    std::memcpy(out.data() + 16, &q, 4);
    std::memcpy(out.data() + 20, &p, 4);
    std::memcpy(out.data() + 24, &k, 4);
    std::memcpy(out.data() + 28, &l, 2);
    return out;
  }
  static QpEndpoint from_bytes(std::span<const std::byte, kWireSize> in) noexcept {
    QpEndpoint e;
    std::uint32_t q, p, k;
    std::uint16_t l;
    std::memcpy(e.gid.bytes.data(), in.data(), 16);
    std::memcpy(&q, in.data() + 16, 4);
    std::memcpy(&p, in.data() + 20, 4);
    std::memcpy(&k, in.data() + 24, 4);
    std::memcpy(&l, in.data() + 28, 2);
    e.qpn = be32toh(q);
    e.psn = be32toh(p);
    e.qkey = be32toh(k);
    e.lid = be16toh(l);
    return e;
  }
  friend bool operator==(const QpEndpoint&, const QpEndpoint&) = default;
};
static_assert(std::is_trivially_copyable_v<QpEndpoint>);

}  // namespace uroce
