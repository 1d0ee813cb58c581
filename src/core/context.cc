#include "core/context.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/config.h"
#include "core/limits.h"
#include "core/srq.h"

namespace uroce::core {

ibv_mtu mtu_enum_for_bytes(unsigned bytes) {
  if (bytes >= 4096) return IBV_MTU_4096;
  if (bytes >= 2048) return IBV_MTU_2048;
  if (bytes >= 1024) return IBV_MTU_1024;
  if (bytes >= 512) return IBV_MTU_512;
  return IBV_MTU_256;
}

unsigned mtu_bytes(ibv_mtu mtu) { return 128u << unsigned(mtu); }

uint32_t resource_limit(Resource r) {
  switch (r) {
    case Resource::kQp:
      return kMaxQp;
    case Resource::kCq:
      return kMaxCq;
    case Resource::kPd:
      return kMaxPd;
    case Resource::kAh:
      return kMaxAh;
    case Resource::kSrq:
      return kMaxSrq;
    case Resource::kCount:
      break;
  }
  return 0;
}

int Context::reserve(Resource r) {
  std::atomic<uint32_t>& used = used_[size_t(r)];
  const uint32_t limit = resource_limit(r);
  uint32_t n = used.load(std::memory_order_relaxed);
  do {
    if (n >= limit) return ENOMEM;
  } while (!used.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
  return 0;
}

void Context::release(Resource r) { used_[size_t(r)].fetch_sub(1, std::memory_order_relaxed); }

Context::Context(Device* dev) : device(dev), addrs_(host_addresses()) {
  ibv_context& c = vctx.context;
  c.device = &dev->ibdev;
  // The command file of a kernel device; here an empty memfd, whose inode
  // names this context (ibv_import_device finds it from a dup of the fd).
  c.cmd_fd = memfd_create("uroce-cmd", MFD_CLOEXEC);
  c.num_comp_vectors = 1;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  vctx.sz = sizeof(verbs_context);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) == 0) {
    c.async_fd = fds[0];
    async_write_fd_ = fds[1];
    fcntl(async_write_fd_, F_SETFL, O_NONBLOCK);
  } else {
    c.async_fd = -1;
  }

  // Active MTU as rxe: largest IB MTU <= interface MTU - 80 (headers); the
  // interface is that of GID 0.
  unsigned if_mtu = addrs_.empty() ? 1500 : addrs_.front().if_mtu;
  active_mtu_ = mtu_enum_for_bytes(if_mtu > 80 ? if_mtu - 80 : 256);
  if (config().mtu_override) active_mtu_ = mtu_enum_for_bytes(config().mtu_override);

  // The port is up as soon as the context exists (IBV_DEVICE_PORT_ACTIVE_EVENT).
  ibv_async_event ev{};
  ev.element.port_num = 1;
  ev.event_type = IBV_EVENT_PORT_ACTIVE;
  raise_async_event(ev);
}

void Context::raise_async_event(const ibv_async_event& event) const {
  if (async_write_fd_ < 0) return;
  // One write of a small struct to a pipe is atomic (PIPE_BUF).
  [[maybe_unused]] ssize_t n = write(async_write_fd_, &event, sizeof event);
}

Context::~Context() {
  if (vctx.context.cmd_fd >= 0) close(vctx.context.cmd_fd);
  if (vctx.context.async_fd >= 0) close(vctx.context.async_fd);
  if (async_write_fd_ >= 0) close(async_write_fd_);
}

uint32_t max_mcast_groups() {
  static const uint32_t groups = [] {
    unsigned n = 20;  // the kernel's default
    if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/igmp_max_memberships", "re")) {
      if (std::fscanf(f, "%u", &n) != 1) n = 20;
      std::fclose(f);
    }
    return uint32_t(n);
  }();
  return groups;
}

bool Context::take_dm_bytes(uint64_t bytes) {
  uint64_t used = dm_bytes_.load();
  do {
    if (bytes > kMaxDmSize - used) return false;
  } while (!dm_bytes_.compare_exchange_weak(used, used + bytes));
  return true;
}

bool Context::is_host_address(uint32_t ip) const {
  if ((ip >> 24) == 127) return true;
  for (const HostAddress& a : addrs_)
    if (!a.ipv6 && a.ip == ip) return true;
  return false;
}

bool Context::is_host_address(const ibv_gid& gid) const {
  uint32_t ip;
  if (gid_to_ipv4(gid, &ip)) return is_host_address(ip);
  static const ibv_gid kLoopback6{{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}};
  if (std::memcmp(gid.raw, kLoopback6.raw, 16) == 0) return true;
  for (const HostAddress& a : addrs_)
    if (std::memcmp(a.gid.raw, gid.raw, 16) == 0) return true;
  return false;
}

bool Context::gid_ip(unsigned index, uint32_t* ip) const {
  if (index >= addrs_.size() || addrs_[index].ipv6) return false;
  *ip = addrs_[index].ip;
  return true;
}

void Context::query_device(ibv_device_attr* a) const {
  std::memset(a, 0, sizeof *a);
  std::snprintf(a->fw_ver, sizeof a->fw_ver, "uroce 0.1");
  a->node_guid = __builtin_bswap64(device->guid);
  a->sys_image_guid = a->node_guid;
  a->max_mr_size = kMaxMrSize;
  a->page_size_cap = 0xFFFFF000;
  a->vendor_id = kVendorId;
  a->vendor_part_id = kVendorPartId;
  a->hw_ver = kHwVersion;
  a->max_qp = int(kMaxQp);
  a->max_qp_wr = int(kMaxQpWr);
  // What uroce does (docs/architecture.md, "Decisions"): RNR NAKs, the port
  // event, ibv_modify_srq resizing, type 1 and 2B windows, XRC, address
  // handles for port 1 only (ibv_create_ah: EINVAL), a Q_Key violation counter
  // (ibv_query_port's qkey_viol_cntr). Not: CHANGE_PHY_PORT (one port),
  // AUTO_PATH_MIG (alternate paths are stored, never used), BAD_PKEY_CNTR (no
  // P_Key is checked), MEM_MGT_EXTENSIONS (no fast registration),
  // CURR_QP_STATE_MOD (IBV_QP_CUR_STATE must equal the state), checksum offloads.
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID |
                        IBV_DEVICE_UD_AV_PORT_ENFORCE | IBV_DEVICE_BAD_QKEY_CNTR | IBV_DEVICE_MEM_WINDOW |
                        IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_XRC;
  a->max_sge = int(kMaxSge);
  a->max_sge_rd = int(kMaxSge);
  a->max_cq = int(kMaxCq);
  a->max_cqe = int(kMaxCqe);
  a->max_mr = int(kMaxMr);
  a->max_pd = int(kMaxPd);
  a->max_qp_rd_atom = int(kMaxRdAtomic);
  a->max_ee_rd_atom = 0;
  a->max_res_rd_atom = int(kMaxRdAtomic * kMaxQp);  // no device-wide pool: every QP may have its own
  a->max_qp_init_rd_atom = int(kMaxRdAtomic);
  a->atomic_cap = IBV_ATOMIC_HCA;  // atomic among every QP of the process (std::atomic_ref)
  a->max_ah = int(kMaxAh);
  a->max_mcast_grp = int(max_mcast_groups());
  a->max_mcast_qp_attach = int(kMaxMcastQpAttach);
  a->max_total_mcast_qp_attach = a->max_mcast_grp * a->max_mcast_qp_attach;
  a->max_mw = int(kMaxMw);
  a->max_srq = int(kMaxSrq);
  a->max_srq_wr = int(kMaxSrqWr);
  a->max_srq_sge = int(kMaxSrqSge);
  a->max_pkeys = 1;
  a->local_ca_ack_delay = kLocalCaAckDelay;
  a->phys_port_cnt = 1;
}

int Context::query_port(uint8_t port, ibv_port_attr* a) const {
  if (port != 1) return EINVAL;
  std::memset(a, 0, sizeof *a);
  a->state = IBV_PORT_ACTIVE;
  a->max_mtu = kMaxMtu;
  a->active_mtu = active_mtu_;
  a->gid_tbl_len = int(gid_table_len());
  a->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
  a->max_msg_sz = kMaxMsgSize;
  a->pkey_tbl_len = 1;
  a->lid = lid_;
  a->sm_lid = 0;
  a->lmc = 0;
  a->max_vl_num = 1;
  a->active_width = 2;   // 4x
  a->active_speed = 32;  // EDR-ish; informational only
  a->phys_state = 5;     // LinkUp
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
  a->flags = 0;
  return 0;
}

int Context::query_gid(uint8_t port, int index, ibv_gid* gid) const {
  if (port != 1 || index < 0 || size_t(index) >= gid_table_len()) return EINVAL;
  if (size_t(index) >= addrs_.size()) return ENODATA;
  *gid = addrs_[size_t(index)].gid;
  return 0;
}

int Context::query_pkey(uint8_t port, int index, uint16_t* pkey) const {
  if (port != 1 || index != 0) return EINVAL;
  *pkey = 0xFFFF;  // returned in network order; 0xFFFF is symmetric
  return 0;
}

}  // namespace uroce::core
