// The same-host path's directory (transport/shm_transport.h) over the host
// registry: which live engine of the host has a given private port, and
// where its inbound segment is. Segment paths are derived from the registry
// file's: <registry>.in.<pid>.<slot>.<port>, so that a slot reused by a new
// process, or a port reused by another engine, names another segment.
#pragma once

#include <string>

#include "host/host_registry.h"
#include "transport/shm_transport.h"

namespace uroce::host {

class HostDirectory final : public transport::ShmDirectory {
 public:
  explicit HostDirectory(HostRegistry& registry) : registry_(registry) {}
  bool lookup(uint16_t port, std::string* segment, unsigned* ring) noexcept override;

  // This engine's own inbound segment.
  std::string own_segment() const;
  // Where segments live and how their names start (for removing stale ones).
  std::string segment_dir() const;
  std::string segment_prefix() const;

 private:
  std::string segment_of(uint32_t pid, unsigned slot, uint16_t port) const;
  HostRegistry& registry_;
};

}  // namespace uroce::host
