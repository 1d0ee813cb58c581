// uroce C++ API: registered memory and the two views of it.
//
// - MemoryRegion owns a registration (ibv_reg_mr / ibv_dereg_mr) of a buffer the caller
//   owns (keep the buffer alive longer than the region).
// - LocalSlice is a view of registered memory on this side: address, length and LocalKey;
//   work requests take their scatter/gather lists as LocalSlices only.
// - RegisteredBuffer is both: page-aligned zeroed memory the API allocates, and its
//   registration, with the same slice()/remote() views.
// - RemoteBuffer describes the peer's registered memory: {addr, rkey, length}. It is what
//   one sends to a peer (to_bytes()/from_bytes(), network byte order) and what RDMA WRITE,
//   READ and atomics target. A RemoteBuffer is not a LocalSlice and does not convert to
//   one, nor back.
#pragma once

#include <endian.h>
#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>

#include "uroce/device.hpp"
#include "uroce/handle.hpp"
#include "uroce/result.hpp"

namespace uroce {

// Access rights of a memory region or of a QP's remote access (IBV_ACCESS_*).
enum class Access : int {
  kNone = 0,
  kLocalWrite = IBV_ACCESS_LOCAL_WRITE,
  kRemoteWrite = IBV_ACCESS_REMOTE_WRITE,
  kRemoteRead = IBV_ACCESS_REMOTE_READ,
  kRemoteAtomic = IBV_ACCESS_REMOTE_ATOMIC,
  // Everything a buffer of the classic verbs programs needs.
  kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
};
constexpr Access operator|(Access a, Access b) noexcept { return Access(int(a) | int(b)); }
constexpr Access operator&(Access a, Access b) noexcept { return Access(int(a) & int(b)); }
constexpr bool has(Access set, Access flag) noexcept { return (int(set) & int(flag)) == int(flag); }

// The key of a local memory region (lkey). Distinct from RemoteKey.
struct LocalKey {
  std::uint32_t value = 0;
  friend bool operator==(LocalKey, LocalKey) = default;
};
// The key the peer uses to reach a memory region (rkey).
struct RemoteKey {
  std::uint32_t value = 0;
  friend bool operator==(RemoteKey, RemoteKey) = default;
};

namespace detail {
inline void check_range(std::uint64_t offset, std::uint64_t length, std::uint64_t size, const char* what) {
  if (offset > size || length > size - offset)
    die(std::string(what) + ": offset " + std::to_string(offset) + " + length " + std::to_string(length) +
        " is outside the " + std::to_string(size) + " bytes");
}
}  // namespace detail

class MemoryRegion;

// A view of local registered memory: one scatter/gather element.
class LocalSlice {
 public:
  // Escape hatch: a slice from raw values (e.g. an MR registered outside this API).
  static LocalSlice from_raw(void* addr, std::uint32_t length, LocalKey key) noexcept {
    return LocalSlice(static_cast<std::byte*>(addr), length, key);
  }

  std::byte* data() const noexcept { return data_; }
  std::uint32_t size() const noexcept { return length_; }
  LocalKey key() const noexcept { return key_; }
  std::span<std::byte> bytes() const noexcept { return {data_, length_}; }
  // A part of this slice. Precondition (checked, aborts): inside the slice.
  LocalSlice slice(std::uint32_t offset, std::uint32_t length) const {
    detail::check_range(offset, length, length_, "LocalSlice::slice");
    return LocalSlice(data_ + offset, length, key_);
  }
  LocalSlice first(std::uint32_t length) const { return slice(0, length); }
  ibv_sge sge() const noexcept { return ibv_sge{reinterpret_cast<std::uintptr_t>(data_), length_, key_.value}; }

 private:
  friend class MemoryRegion;
  LocalSlice(std::byte* data, std::uint32_t length, LocalKey key) noexcept : data_(data), length_(length), key_(key) {}

  std::byte* data_;
  std::uint32_t length_;
  LocalKey key_;
};

// The peer's registered memory: {addr, rkey, length}. Trivially copyable; to_bytes() /
// from_bytes() give a fixed 16-byte big-endian encoding to send to a peer.
struct RemoteBuffer {
  std::uint64_t addr = 0;
  std::uint32_t rkey = 0;
  std::uint32_t length = 0;

  static constexpr std::size_t kWireSize = 16;

  RemoteKey key() const noexcept { return RemoteKey{rkey}; }
  bool contains(std::uint64_t offset, std::uint64_t len) const noexcept {
    return offset <= length && len <= length - offset;
  }
  // A part of the buffer. Precondition (checked, aborts): contains(offset, len); check
  // contains() first when the descriptor came from an untrusted peer.
  RemoteBuffer slice(std::uint32_t offset, std::uint32_t len) const {
    detail::check_range(offset, len, length, "RemoteBuffer::slice");
    return RemoteBuffer{addr + offset, rkey, len};
  }

  std::array<std::byte, kWireSize> to_bytes() const noexcept {
    std::array<std::byte, kWireSize> out;
    std::uint64_t a = htobe64(addr);
    std::uint32_t k = htobe32(rkey), l = htobe32(length);
    std::memcpy(out.data(), &a, 8);
    std::memcpy(out.data() + 8, &k, 4);
    std::memcpy(out.data() + 12, &l, 4);
    return out;
  }
  static RemoteBuffer from_bytes(std::span<const std::byte, kWireSize> in) noexcept {
    std::uint64_t a;
    std::uint32_t k, l;
    std::memcpy(&a, in.data(), 8);
    std::memcpy(&k, in.data() + 8, 4);
    std::memcpy(&l, in.data() + 12, 4);
    return RemoteBuffer{be64toh(a), be32toh(k), be32toh(l)};
  }
  friend bool operator==(const RemoteBuffer&, const RemoteBuffer&) = default;
};
static_assert(std::is_trivially_copyable_v<RemoteBuffer> && sizeof(RemoteBuffer) == 16);

// A registered memory region.
class MemoryRegion {
 public:
  static Result<MemoryRegion> reg(const ProtectionDomain& pd, std::span<std::byte> buffer,
                                  Access access = Access::kLocalWrite) {
    errno = 0;
    ibv_mr* raw = ::ibv_reg_mr(pd.raw(), buffer.data(), buffer.size(), int(access));
    if (raw == nullptr) return Error::from_errno(last_errno(), "ibv_reg_mr");
    return MemoryRegion(raw);
  }
  // Any contiguous range of trivially copyable objects (std::vector<T>, std::array, ...).
  template <class T>
  requires(std::is_trivially_copyable_v<T> &&
           !std::is_const_v<T>) static Result<MemoryRegion> reg(const ProtectionDomain& pd, std::span<T> buffer,
                                                                Access access = Access::kLocalWrite) {
    return reg(pd, std::as_writable_bytes(buffer), access);
  }

  ibv_mr* raw() const noexcept { return handle_.get(); }
  std::byte* data() const noexcept { return static_cast<std::byte*>(raw()->addr); }
  std::size_t size() const noexcept { return raw()->length; }
  LocalKey lkey() const noexcept { return LocalKey{raw()->lkey}; }
  RemoteKey rkey() const noexcept { return RemoteKey{raw()->rkey}; }

  // The whole region, or a part (precondition, checked: inside the region and < 4 GiB).
  LocalSlice slice() const { return slice(0, size()); }
  LocalSlice slice(std::size_t offset, std::size_t length) const {
    detail::check_range(offset, length, size(), "MemoryRegion::slice");
    if (length > UINT32_MAX) detail::die("MemoryRegion::slice: a slice is at most 4 GiB - 1");
    return LocalSlice(data() + offset, std::uint32_t(length), lkey());
  }
  // The descriptor a peer needs to reach [offset, offset + length) of this region.
  RemoteBuffer remote() const { return remote(0, size()); }
  RemoteBuffer remote(std::size_t offset, std::size_t length) const {
    detail::check_range(offset, length, size(), "MemoryRegion::remote");
    if (length > UINT32_MAX) detail::die("MemoryRegion::remote: a buffer is at most 4 GiB - 1");
    return RemoteBuffer{reinterpret_cast<std::uintptr_t>(data()) + offset, raw()->rkey, std::uint32_t(length)};
  }

 private:
  struct Release {
    void operator()(ibv_mr* mr) const noexcept { ::ibv_dereg_mr(mr); }
  };
  explicit MemoryRegion(ibv_mr* raw) noexcept : handle_(raw) {}

  detail::Handle<ibv_mr, Release> handle_;
};

// Page-aligned, zero-filled memory and its registration in one owner.
class RegisteredBuffer {
 public:
  static Result<RegisteredBuffer> allocate(const ProtectionDomain& pd, std::size_t size, Access access = Access::kAll) {
    if (size == 0) return Error(EINVAL, "RegisteredBuffer::allocate: size 0");
    Memory memory(static_cast<std::byte*>(::operator new[](size, std::align_val_t(kAlignment), std::nothrow)));
    if (!memory) return Error(ENOMEM, "RegisteredBuffer::allocate: " + std::to_string(size) + " bytes");
    std::memset(memory.get(), 0, size);
    auto mr = MemoryRegion::reg(pd, std::span<std::byte>(memory.get(), size), access);
    if (!mr) return std::move(mr).error();
    return RegisteredBuffer(std::move(memory), std::move(*mr));
  }

  std::byte* data() const noexcept { return memory_.get(); }
  std::size_t size() const noexcept { return mr_.size(); }
  std::span<std::byte> bytes() const noexcept { return {data(), size()}; }
  const MemoryRegion& region() const noexcept { return mr_; }
  LocalSlice slice() const { return mr_.slice(); }
  LocalSlice slice(std::size_t offset, std::size_t length) const { return mr_.slice(offset, length); }
  RemoteBuffer remote() const { return mr_.remote(); }
  RemoteBuffer remote(std::size_t offset, std::size_t length) const { return mr_.remote(offset, length); }

 private:
  static constexpr std::size_t kAlignment = 4096;
  struct Free {
    void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t(kAlignment)); }
  };
  using Memory = std::unique_ptr<std::byte[], Free>;
  RegisteredBuffer(Memory memory, MemoryRegion mr) noexcept : memory_(std::move(memory)), mr_(std::move(mr)) {}

  Memory memory_;  // declared first: destroyed after the registration
  MemoryRegion mr_;
};

}  // namespace uroce
