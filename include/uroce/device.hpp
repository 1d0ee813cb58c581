// uroce C++ API: devices, device contexts and GIDs.
//
//   auto ctx = uroce::Context::open();            // first device (or open("uroce0"))
//   auto port = ctx->query_port(1);              // ibv_port_attr
//   auto gid = ctx->query_gid(1, 0);             // uroce::Gid
//
// Objects created from a Context (PDs, CQs, ...) hold a plain pointer to it: keep the
// Context alive longer than they are (declare it first; C++ destroys in reverse order).
#pragma once

#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "uroce/handle.hpp"
#include "uroce/result.hpp"

namespace uroce {

// A 16-byte GID (for RoCE an IPv6 or IPv4-mapped address). Trivially copyable.
struct Gid {
  std::array<std::uint8_t, 16> bytes{};

  static Gid from_ibv(const ibv_gid& gid) noexcept {
    Gid out;
    std::memcpy(out.bytes.data(), gid.raw, 16);
    return out;
  }
  ibv_gid to_ibv() const noexcept {
    ibv_gid out;
    std::memcpy(out.raw, bytes.data(), 16);
    return out;
  }
  bool is_zero() const noexcept {
    for (auto b : bytes)
      if (b != 0) return false;
    return true;
  }
  // IPv6 text form, e.g. "::ffff:127.0.0.1".
  std::string to_string() const {
    char text[INET6_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET6, bytes.data(), text, sizeof text);
    return text;
  }
  friend bool operator==(const Gid&, const Gid&) = default;
};

// A device of the list (non-owning; valid while its DeviceList lives).
class Device {
 public:
  explicit Device(ibv_device* raw) noexcept : raw_(raw) {}
  std::string_view name() const noexcept { return ::ibv_get_device_name(raw_); }
  std::uint64_t guid() const noexcept { return be64toh(::ibv_get_device_guid(raw_)); }
  ibv_device* raw() const noexcept { return raw_; }

 private:
  ibv_device* raw_;
};

// The devices of the host (ibv_get_device_list / ibv_free_device_list).
class DeviceList {
 public:
  static Result<DeviceList> get() {
    int count = 0;
    errno = 0;
    ibv_device** list = ::ibv_get_device_list(&count);
    if (list == nullptr) return Error::from_errno(last_errno(), "ibv_get_device_list");
    return DeviceList(list, count);
  }

  std::size_t size() const noexcept { return std::size_t(count_); }
  bool empty() const noexcept { return count_ == 0; }
  Device operator[](std::size_t i) const noexcept { return Device(list_.get()[i]); }
  // The device called `name`; ENODEV if there is none.
  Result<Device> find(std::string_view name) const {
    for (std::size_t i = 0; i < size(); ++i)
      if ((*this)[i].name() == name) return (*this)[i];
    return Error(ENODEV, "no RDMA device named '" + std::string(name) + "'");
  }

  class Iterator {
   public:
    explicit Iterator(ibv_device** at) noexcept : at_(at) {}
    Device operator*() const noexcept { return Device(*at_); }
    Iterator& operator++() noexcept {
      ++at_;
      return *this;
    }
    friend bool operator==(const Iterator&, const Iterator&) = default;

   private:
    ibv_device** at_;
  };
  Iterator begin() const noexcept { return Iterator(list_.get()); }
  Iterator end() const noexcept { return Iterator(list_.get() + count_); }

 private:
  struct Release {
    void operator()(ibv_device** list) const noexcept { ::ibv_free_device_list(list); }
  };
  DeviceList(ibv_device** list, int count) noexcept : list_(list), count_(count) {}

  detail::Handle<ibv_device*, Release> list_;
  int count_ = 0;
};

// An open device (ibv_open_device / ibv_close_device).
class Context {
 public:
  // Opens the device called `name`, or the first device when `name` is empty.
  static Result<Context> open(std::string_view name = {}) {
    auto list = DeviceList::get();
    if (!list) return std::move(list).error();
    if (list->empty()) return Error(ENODEV, "no RDMA device found");
    Device device = (*list)[0];
    if (!name.empty()) {
      auto found = list->find(name);
      if (!found) return std::move(found).error();
      device = *found;
    }
    return open(device);
  }
  static Result<Context> open(Device device) {
    errno = 0;
    ibv_context* raw = ::ibv_open_device(device.raw());
    if (raw == nullptr) return Error::from_errno(last_errno(), "ibv_open_device");
    return Context(raw, true);
  }
  // A Context that does not close `raw` (e.g. the device an rdma_cm id is bound to).
  static Context borrow(ibv_context* raw) noexcept { return Context(raw, false); }

  Context(Context&& other) noexcept
      : raw_(std::exchange(other.raw_, nullptr)), owned_(std::exchange(other.owned_, false)) {}
  Context& operator=(Context&& other) noexcept {
    if (this != &other) {
      close();
      raw_ = std::exchange(other.raw_, nullptr);
      owned_ = std::exchange(other.owned_, false);
    }
    return *this;
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() { close(); }

  ibv_context* raw() const noexcept { return raw_; }
  std::string_view name() const noexcept { return ::ibv_get_device_name(raw_->device); }

  Result<ibv_device_attr> query_device() const {
    ibv_device_attr attr{};
    if (auto s = status_from_rc(::ibv_query_device(raw_, &attr), "ibv_query_device"); !s) return std::move(s).error();
    return attr;
  }
  Result<ibv_port_attr> query_port(std::uint8_t port = 1) const {
    ibv_port_attr attr{};
    if (auto s = status_from_rc(::ibv_query_port(raw_, port, &attr), "ibv_query_port"); !s) return std::move(s).error();
    return attr;
  }
  Result<Gid> query_gid(std::uint8_t port = 1, int index = 0) const {
    ibv_gid gid{};
    if (auto s = status_from_rc(::ibv_query_gid(raw_, port, index, &gid), "ibv_query_gid"); !s)
      return std::move(s).error();
    return Gid::from_ibv(gid);
  }

 private:
  Context(ibv_context* raw, bool owned) noexcept : raw_(raw), owned_(owned) {}
  void close() noexcept {
    if (raw_ != nullptr && owned_) ::ibv_close_device(raw_);
    raw_ = nullptr;
  }

  ibv_context* raw_ = nullptr;
  bool owned_ = false;
};

// A protection domain (ibv_alloc_pd / ibv_dealloc_pd).
class ProtectionDomain {
 public:
  static Result<ProtectionDomain> alloc(const Context& context) {
    errno = 0;
    ibv_pd* raw = ::ibv_alloc_pd(context.raw());
    if (raw == nullptr) return Error::from_errno(last_errno(), "ibv_alloc_pd");
    return ProtectionDomain(raw);
  }

  ibv_pd* raw() const noexcept { return handle_.get(); }
  ibv_context* context() const noexcept { return handle_.get()->context; }

 private:
  struct Release {
    void operator()(ibv_pd* pd) const noexcept { ::ibv_dealloc_pd(pd); }
  };
  explicit ProtectionDomain(ibv_pd* raw) noexcept : handle_(raw) {}

  detail::Handle<ibv_pd, Release> handle_;
};

}  // namespace uroce
