// noncontig: one side's verbs objects (device, PD, CQ, one RC QP, the two registered regions)
// through the public verbs C ABI only, so the program also runs on RDMA hardware.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

#include "noncontig_control.h"

namespace noncontig {

struct EndpointOptions {
  const char* device = nullptr;  // first device when null
  int gid_index = 0;
  uint8_t port = 1;
  // An empty CQ is polled for spin_us, then waited for through the completion channel
  // (negative: spin only). Spinning alone starves the peer on a busy 2-core machine.
  int spin_us = 1000;
};

class Endpoint {
 public:
  Endpoint() = default;
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  ~Endpoint();

  // Opens the device, registers the regions, creates the QP (to INIT). Prints a one-line
  // error and returns false on failure.
  [[nodiscard]] bool open(const EndpointOptions& o);
  // This side's descriptors for the peer.
  Hello hello() const;
  // INIT -> RTR -> RTS towards the peer.
  [[nodiscard]] bool connect(const Hello& peer);

  // The largest N the device takes in a send SGL, a recv SGL and a READ's SGL (<= kMaxN).
  uint32_t max_send_sge() const { return max_send_sge_; }
  uint32_t max_recv_sge() const { return max_recv_sge_; }
  uint32_t max_read_sge() const { return max_read_sge_; }

  ibv_qp* qp() const { return qp_; }
  uint8_t* scattered() const { return scattered_; }
  uint8_t* contig() const { return contig_; }
  uint32_t scattered_lkey() const { return scattered_mr_->lkey; }
  uint32_t contig_lkey() const { return contig_mr_->lkey; }

  // Waits for one completion (polling the CQ for spin_us, then blocking on the completion
  // channel) for at most timeout_ms. A completion with an error status prints it and
  // returns false, as does the timeout.
  [[nodiscard]] bool poll(ibv_wc& wc, int timeout_ms);

 private:
  EndpointOptions opt_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  [[nodiscard]] int poll_some();
  [[nodiscard]] bool block(int timeout_ms);

  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  unsigned unacked_events_ = 0;
  ibv_qp* qp_ = nullptr;
  ibv_mr* scattered_mr_ = nullptr;
  ibv_mr* contig_mr_ = nullptr;
  uint8_t* scattered_ = nullptr;
  uint8_t* contig_ = nullptr;
  ibv_gid gid_{};
  uint32_t lid_ = 0;
  uint32_t psn_ = 0;
  ibv_mtu mtu_ = IBV_MTU_1024;
  uint32_t max_send_sge_ = 1;
  uint32_t max_recv_sge_ = 1;
  uint32_t max_read_sge_ = 1;
  uint32_t max_rd_atomic_ = 1;
  // Completions polled ahead of the caller's one.
  ibv_wc pending_[16]{};
  int pending_count_ = 0;
  int pending_next_ = 0;
};

}  // namespace noncontig
