#include "noncontig_transfer.h"

#include <arpa/inet.h>

#include <cstdio>
#include <cstring>

namespace noncontig {

namespace {

constexpr uint64_t kReplyId = ~uint64_t(0);
constexpr uint32_t kLastFlag = 0x80000000u;

uint32_t imm_of(uint32_t slot, bool last) { return htonl(slot | (last ? kLastFlag : 0)); }

// The destination slots (window of them) are zeroed, gaps included.
size_t scattered_bytes(const Shape& s) { return size_t(s.window) * s.n * stride_of(s.size); }

}  // namespace

size_t check_scattered(const uint8_t* region, const Point& p) {
  const Shape& s = p.shape;
  size_t bad = 0;
  size_t stride = stride_of(s.size);
  for (uint32_t w = 0; w < s.window; ++w) {
    for (uint32_t i = 0; i < s.n; ++i) {
      const uint8_t* b = region + scattered_offset(s, w, i);
      bad += check_buffer(b, p.seed, i, s.size);
      for (size_t k = s.size; k < stride; ++k) bad += b[k] != 0;
    }
  }
  return bad;
}

// ---- client -------------------------------------------------------------------------------

void Client::prepare(const Point& p) {
  const Shape& s = p.shape;
  if (p.family == Family::kRead) {
    std::memset(ep_.scattered(), 0, scattered_bytes(s));
    return;
  }
  for (uint32_t i = 0; i < s.n; ++i) fill_buffer(ep_.scattered() + scattered_offset(s, 0, i), p.seed, i, s.size);
}

bool Client::post_reply_recv() {
  ibv_recv_wr wr{};
  wr.wr_id = kReplyId;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(ep_.qp(), &wr, &bad)) {
    std::fprintf(stderr, "noncontig: ibv_post_recv (reply): %s\n", std::strerror(rc));
    return false;
  }
  return true;
}

bool Client::post_transfer(const Point& p, uint32_t slot, bool last) {
  const Shape& s = p.shape;
  const uint64_t src = reinterpret_cast<uintptr_t>(ep_.scattered());
  const uint64_t contig = reinterpret_cast<uintptr_t>(ep_.contig()) + contig_offset(s, slot);
  const uint32_t payload = s.n * s.size;
  uint32_t nwr = 1;
  ibv_send_wr& wr = wrs_[0];
  wr = ibv_send_wr{};
  wr.wr_id = slot;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = sges_.data();
  if (p.method == Method::kPack && p.family != Family::kRead)
    pack(ep_.contig() + contig_offset(s, slot), ep_.scattered(), s, 0);

  if (p.method == Method::kMulti) {
    nwr = s.n;
    for (uint32_t i = 0; i < s.n; ++i) {
      ibv_send_wr& w = wrs_[i];
      w = ibv_send_wr{};
      w.wr_id = slot;
      w.sg_list = &sges_[i];
      w.num_sge = 1;
      w.next = i + 1 < s.n ? &wrs_[i + 1] : nullptr;
      const bool tail = i + 1 == s.n;
      if (tail) w.send_flags = IBV_SEND_SIGNALED;
      switch (p.family) {
        case Family::kWrite:
          sges_[i] = {src + scattered_offset(s, 0, i), s.size, ep_.scattered_lkey()};
          w.opcode = tail ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
          w.imm_data = imm_of(slot, last);
          w.wr.rdma.remote_addr = peer_.scattered + scattered_offset(s, slot, i);
          w.wr.rdma.rkey = peer_.scattered_rkey;
          break;
        case Family::kSend:
          sges_[i] = {src + scattered_offset(s, 0, i), s.size, ep_.scattered_lkey()};
          w.opcode = IBV_WR_SEND_WITH_IMM;
          w.imm_data = imm_of(slot, last);
          break;
        case Family::kRead:
          sges_[i] = {src + scattered_offset(s, slot, i), s.size, ep_.scattered_lkey()};
          w.opcode = IBV_WR_RDMA_READ;
          w.wr.rdma.remote_addr = peer_.contig + size_t(i) * s.size;
          w.wr.rdma.rkey = peer_.contig_rkey;
          break;
      }
    }
  } else if (p.method == Method::kSgl) {
    wr.num_sge = int(s.n);
    // The gather list (WRITE, SEND) reads source slot 0; READ's scatter list fills `slot`.
    const uint32_t local_slot = p.family == Family::kRead ? slot : 0;
    for (uint32_t i = 0; i < s.n; ++i)
      sges_[i] = {src + scattered_offset(s, local_slot, i), s.size, ep_.scattered_lkey()};
  } else {
    wr.num_sge = 1;
    sges_[0] = {contig, payload, ep_.contig_lkey()};
  }

  if (p.method != Method::kMulti) {
    switch (p.family) {
      case Family::kWrite:
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = imm_of(slot, last);
        wr.wr.rdma.remote_addr = peer_.contig + contig_offset(s, slot);
        wr.wr.rdma.rkey = peer_.contig_rkey;
        break;
      case Family::kSend:
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.imm_data = imm_of(slot, last);
        break;
      case Family::kRead:
        wr.opcode = IBV_WR_RDMA_READ;
        wr.wr.rdma.remote_addr = peer_.contig;
        wr.wr.rdma.rkey = peer_.contig_rkey;
        break;
    }
  }
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(ep_.qp(), wrs_.data(), &bad)) {
    std::fprintf(stderr, "noncontig: ibv_post_send (%u WRs): %s\n", nwr, std::strerror(rc));
    return false;
  }
  return true;
}

bool Client::batch(const Point& p, bool last) {
  const Shape& s = p.shape;
  const bool replied = p.family != Family::kRead;
  if (replied && !post_reply_recv()) return false;
  for (uint32_t w = 0; w < s.window; ++w)
    if (!post_transfer(p, w, last)) return false;
  uint32_t sends = 0;
  bool reply = !replied;
  while (sends < s.window || !reply) {
    ibv_wc wc;
    if (!ep_.poll(wc, kWaitMs)) return false;
    if (wc.opcode == IBV_WC_RECV) {
      reply = true;
      continue;
    }
    ++sends;
    if (p.family == Family::kRead && p.method == Method::kPack) {
      uint32_t slot = uint32_t(wc.wr_id);
      unpack(ep_.scattered(), ep_.contig() + contig_offset(s, slot), s, slot);
    }
  }
  return true;
}

size_t Client::check(const Point& p) const { return check_scattered(ep_.scattered(), p); }

// ---- server -------------------------------------------------------------------------------

bool Server::prepare(const Point& p) {
  const Shape& s = p.shape;
  if (p.family == Family::kRead) {
    for (uint32_t i = 0; i < s.n; ++i) fill_buffer(ep_.contig() + size_t(i) * s.size, p.seed, i, s.size);
    return true;
  }
  std::memset(ep_.scattered(), 0, scattered_bytes(s));
  return post_recvs(p);
}

bool Server::post_recvs(const Point& p) {
  const Shape& s = p.shape;
  const uint64_t dst = reinterpret_cast<uintptr_t>(ep_.scattered());
  const uint64_t landing = reinterpret_cast<uintptr_t>(ep_.contig());
  const bool per_buffer = p.family == Family::kSend && p.method == Method::kMulti;
  const uint32_t count = per_buffer ? s.window * s.n : s.window;
  uint32_t nsge = 0;
  for (uint32_t k = 0; k < count; ++k) {
    ibv_recv_wr& wr = wrs_[k];
    wr = ibv_recv_wr{};
    wr.wr_id = k;
    wr.next = k + 1 < count ? &wrs_[k + 1] : nullptr;
    wr.sg_list = &sges_[nsge];
    if (p.family == Family::kWrite) continue;  // the IMM's RECV carries no bytes
    if (per_buffer) {
      sges_[nsge++] = {dst + scattered_offset(s, k / s.n, k % s.n), s.size, ep_.scattered_lkey()};
      wr.num_sge = 1;
    } else if (p.method == Method::kSgl) {
      for (uint32_t i = 0; i < s.n; ++i)
        sges_[nsge++] = {dst + scattered_offset(s, k, i), s.size, ep_.scattered_lkey()};
      wr.num_sge = int(s.n);
    } else {
      sges_[nsge++] = {landing + contig_offset(s, k), s.n * s.size, ep_.contig_lkey()};
      wr.num_sge = 1;
    }
  }
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(ep_.qp(), wrs_.data(), &bad)) {
    std::fprintf(stderr, "noncontig: ibv_post_recv (%u WRs): %s\n", count, std::strerror(rc));
    return false;
  }
  return true;
}

bool Server::reply() {
  ibv_send_wr wr{};
  wr.wr_id = kReplyId;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(ep_.qp(), &wr, &bad)) {
    std::fprintf(stderr, "noncontig: ibv_post_send (reply): %s\n", std::strerror(rc));
    return false;
  }
  return true;
}

bool Server::serve(const Point& p) {
  const Shape& s = p.shape;
  const bool unpacks = p.method == Method::kPack || (p.family == Family::kWrite && p.method == Method::kSgl);
  const bool per_buffer = p.family == Family::kSend && p.method == Method::kMulti;
  for (;;) {
    uint32_t done = 0;
    bool last = false;
    while (done < s.window) {
      ibv_wc wc;
      if (!ep_.poll(wc, kWaitMs)) return false;
      if (wc.opcode == IBV_WC_SEND) continue;  // a reply went out
      if (!(wc.wc_flags & IBV_WC_WITH_IMM)) {
        std::fprintf(stderr, "noncontig: a receive completion without immediate data\n");
        return false;
      }
      uint32_t imm = ntohl(wc.imm_data);
      last = (imm & kLastFlag) != 0;
      uint32_t slot = imm & ~kLastFlag;
      if (slot >= s.window) {
        std::fprintf(stderr, "noncontig: immediate data names slot %u of %u\n", slot, s.window);
        return false;
      }
      if (per_buffer && wc.wr_id % s.n != s.n - 1) continue;  // not the transfer's last SEND
      if (unpacks) unpack(ep_.scattered(), ep_.contig() + contig_offset(s, slot), s, slot);
      ++done;
    }
    if (!last && !post_recvs(p)) return false;
    if (!reply()) return false;
    if (last) return true;
  }
}

size_t Server::check(const Point& p) const { return check_scattered(ep_.scattered(), p); }

}  // namespace noncontig
