// noncontig: the data path of one point, as the client (the side that WRITEs, SENDs or READs)
// and as the server (the receiver of WRITEs and SENDs, the target of READs) run it.
//
// Layouts. The client's source (WRITE, SEND) is N buffers of S bytes in slot 0 of its
// scattered region; the destination that counts is always N separate buffers (a scattered
// slot) — on the server for WRITE and SEND, on the client for READ. A batch is `window`
// transfers posted back to back, each to its own destination slot; for WRITE and SEND the
// server answers a batch with one zero-byte SEND once every transfer of it is in place.
//
//   family  method  client                                    server
//   write   sgl     1 WRITE_WITH_IMM, N-entry gather list      unpack the landing slot
//   write   pack    pack, 1 WRITE_WITH_IMM                     unpack the landing slot
//   write   multi   N WRITEs to the N buffers (last with IMM)  nothing
//   read    sgl     1 READ, N-entry scatter list               (source: 1 contiguous buffer)
//   read    pack    1 READ into a bounce slot, unpack          "
//   read    multi   N READs, one into each buffer              "
//   send    sgl     1 SEND_WITH_IMM, N-entry gather list       RECV with an N-entry scatter list
//   send    pack    pack, 1 SEND_WITH_IMM                      RECV into a landing slot, unpack
//   send    multi   N SEND_WITH_IMMs                           N RECVs, one per buffer
//
// One WRITE has one remote address, so a gathered WRITE lands contiguous and the server
// unpacks it like a packed one (sgl and pack differ by the sender's pack only). multi posts
// its N WRs as one chained list (one ibv_post_send), only the last one signaled.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <vector>

#include "noncontig_control.h"
#include "noncontig_endpoint.h"
#include "noncontig_layout.h"

namespace noncontig {

inline constexpr int kWaitMs = 10000;  // bound on every wait for a completion

struct Point {
  Family family;
  Method method;
  Shape shape;
  uint64_t seed;
};

class Client {
 public:
  Client(Endpoint& ep, const Hello& peer) : ep_(ep), peer_(peer) {}
  // Before a point: the pattern into the source (WRITE, SEND), zeros into the destination
  // slots (READ).
  void prepare(const Point& p);
  // One batch; `last` tells the server that no batch follows. False after an error.
  [[nodiscard]] bool batch(const Point& p, bool last);
  // READ: bytes of the destination slots that differ from the pattern (gaps must stay 0).
  size_t check(const Point& p) const;

 private:
  [[nodiscard]] bool post_transfer(const Point& p, uint32_t slot, bool last);
  [[nodiscard]] bool post_reply_recv();

  Endpoint& ep_;
  Hello peer_;
  std::array<ibv_send_wr, kMaxN> wrs_{};
  std::array<ibv_sge, kMaxN> sges_{};
};

class Server {
 public:
  explicit Server(Endpoint& ep) : ep_(ep), wrs_(kMaxBatchWrs), sges_(kMaxBatchWrs) {}
  // Before a point: the pattern into the READ source, zeros into the destination slots,
  // the RECVs of the first batch. False after an error.
  [[nodiscard]] bool prepare(const Point& p);
  // WRITE and SEND: receives batches until the one marked last. False after an error.
  [[nodiscard]] bool serve(const Point& p);
  // Bytes of the destination slots that differ from the pattern (gaps must stay 0).
  size_t check(const Point& p) const;

 private:
  [[nodiscard]] bool post_recvs(const Point& p);
  [[nodiscard]] bool reply();

  Endpoint& ep_;
  std::vector<ibv_recv_wr> wrs_;
  std::vector<ibv_sge> sges_;
};

// Bytes of `window` scattered slots that differ from the pattern, gaps included.
size_t check_scattered(const uint8_t* region, const Point& p);

}  // namespace noncontig
