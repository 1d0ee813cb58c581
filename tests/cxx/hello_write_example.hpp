// The example of docs/cxx-api.md (keep the two in sync): connect an RC pair through an
// out-of-band TCP exchange and RDMA WRITE a greeting with immediate data. The server (host
// "") returns the text it received.
#pragma once

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "uroce/uroce.hpp"

namespace example {
using namespace uroce;
using namespace std::chrono_literals;

inline Result<TcpSocket> oob_connect(const std::string& host, std::uint16_t port) {
  if (!host.empty()) return TcpSocket::connect(host, port, 5s);  // retries until the server listens
  UROCE_TRY_ASSIGN(TcpListener listener, TcpListener::listen("0.0.0.0", port));
  return listener.accept(30s);
}

inline Result<std::string> hello_write(const std::string& host, std::uint16_t port) {
  std::vector<char> buffer(4096);
  UROCE_TRY_ASSIGN(Context ctx, Context::open());  // the first device
  UROCE_TRY_ASSIGN(ProtectionDomain pd, ProtectionDomain::alloc(ctx));
  UROCE_TRY_ASSIGN(CompletionQueue cq, CompletionQueue::create(ctx, 16));
  UROCE_TRY_ASSIGN(QueuePair qp, QueuePair::create(pd, QpType::kRc, cq, cq));
  UROCE_TRY_ASSIGN(MemoryRegion mr, MemoryRegion::reg(pd, std::span(buffer), Access::kAll));

  // Swap QpEndpoints {gid, qpn, psn, lid} and RemoteBuffers {addr, rkey, length}, connect.
  UROCE_TRY_ASSIGN(TcpSocket peer, oob_connect(host, port));
  UROCE_TRY_ASSIGN(QpEndpoint mine, qp.local_endpoint());
  UROCE_TRY_ASSIGN(QpEndpoint theirs, peer.exchange(mine, 5s));
  UROCE_TRY_ASSIGN(RemoteBuffer their_buffer, peer.exchange(mr.remote(), 5s));
  UROCE_TRY(qp.connect(theirs));  // INIT -> RTR -> RTS

  if (host.empty()) {  // server: a receive for the WRITE's immediate, then "ready"
    UROCE_TRY(qp.post_recv(RecvRequest({}, WrId{1})));
    UROCE_TRY(peer.send(std::uint8_t{1}, 5s));
    UROCE_TRY_ASSIGN(Completion c, cq.wait_ok(5s));
    return std::string(buffer.data(), c.byte_len);
  }
  UROCE_TRY(peer.receive<std::uint8_t>(5s));
  std::string text = "hello over RDMA WRITE";
  std::memcpy(buffer.data(), text.data(), text.size());
  auto write = SendRequest::write(mr.slice(0, text.size()), their_buffer).with_imm(7).id(WrId{2});
  UROCE_TRY(qp.post_send(write));
  UROCE_TRY(cq.wait_ok(5s));  // a failed completion becomes an Error with its ibv_wc_status
  return std::string();
}

}  // namespace example
