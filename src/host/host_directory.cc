#include "host/host_directory.h"

#include <unistd.h>

namespace uroce::host {

std::string HostDirectory::segment_dir() const {
  const std::string& p = registry_.path();
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? std::string(".") : p.substr(0, slash);
}

std::string HostDirectory::segment_prefix() const {
  const std::string& p = registry_.path();
  size_t slash = p.rfind('/');
  return (slash == std::string::npos ? p : p.substr(slash + 1)) + ".in.";
}

std::string HostDirectory::segment_of(uint32_t pid, unsigned slot, uint16_t port) const {
  return segment_dir() + "/" + segment_prefix() + std::to_string(pid) + "." + std::to_string(slot) + "." +
         std::to_string(port);
}

std::string HostDirectory::own_segment() const {
  return segment_of(uint32_t(getpid()), registry_.slot(), registry_.port_of(registry_.slot()));
}

bool HostDirectory::lookup(uint16_t port, std::string* segment, unsigned* ring) noexcept {
  if (port == 0) return false;
  for (unsigned s = kFirstHostSlot; s <= kLastHostSlot; ++s) {
    if (s == registry_.slot() || registry_.port_of(s) != port) continue;
    try {
      *segment = segment_of(registry_.pid_of(s), s, port);
    } catch (...) {
      return false;
    }
    *ring = registry_.slot();
    return true;
  }
  return false;
}

}  // namespace uroce::host
