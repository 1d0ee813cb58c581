// The verbs devices the connection manager works with. As librdmacm does, the
// CM opens every device once per process (through the public verbs API) and
// shares that context and one protection domain among all rdma_cm ids; they
// stay open for the life of the process, since the application's own verbs
// objects (created on id->verbs) may outlive every id.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <vector>

#include "core/result.h"
#include "rdmacm/sockaddr_util.h"

namespace uroce::rdmacm {

struct CmDevice {
  ibv_context* verbs = nullptr;
  ibv_pd* pd = nullptr;      // the id->pd of ids on this device
  ibv_xrcd* xrcd = nullptr;  // the XRC domain of XRC ids on this device (opened on first use)
  uint64_t guid_be = 0;      // node GUID, network order
  uint16_t lid = 0;          // port 1 LID: the device's UDP port (design §3)
  ibv_mtu active_mtu = IBV_MTU_1024;
  ibv_mtu max_mtu = IBV_MTU_4096;
  uint8_t max_initiator_depth = 0;      // max_qp_init_rd_atom
  uint8_t max_responder_resources = 0;  // max_qp_rd_atom
  int max_qp_wr = 0;
  std::vector<ibv_gid> gids;  // each GID index's address (IPv4-mapped or IPv6; zero: an empty slot)
};

// Where an IP address lives: a device and its GID index.
struct DevicePort {
  CmDevice* device = nullptr;
  uint8_t gid_index = 0;
};

// Opens every device not opened yet; the list in device-list order. Callers
// hold the CmService mutex.
[[nodiscard]] core::Result<std::vector<CmDevice*>> cm_devices();

// The device whose GID table holds `ip`: ENODEV if none, EADDRNOTAVAIL for an
// address that is not this host's.
[[nodiscard]] core::Result<DevicePort> device_for_ip(const transport::IpAddress& ip);

CmDevice* device_for_context(ibv_context* verbs);

}  // namespace uroce::rdmacm
