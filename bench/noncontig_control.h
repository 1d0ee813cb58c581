// noncontig: the TCP control connection between the client and the server (hello with the
// QP and MR descriptors, one message per measured point). Both ends are the same binary, so
// messages are fixed-size structs sent as bytes.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

namespace noncontig {

struct Hello {
  ibv_gid gid;
  uint32_t lid;
  uint32_t qpn;
  uint32_t psn;
  uint32_t mtu;        // the port's active MTU (enum ibv_mtu)
  uint64_t scattered;  // address and rkey of the scattered region
  uint32_t scattered_rkey;
  uint32_t contig_rkey;
  uint64_t contig;        // address and rkey of the contiguous region
  uint32_t max_sge;       // N this side takes in a send and in a recv SGL
  uint32_t max_read_sge;  // N this side takes in a READ's SGL
};

// One point, client -> server. kQuit ends the session.
struct PointMsg {
  uint32_t family;  // Family, or kQuit
  uint32_t method;  // Method
  uint32_t n;
  uint32_t size;
  uint32_t window;
  uint32_t pad;
  uint64_t seed;  // payload pattern of this point
};
inline constexpr uint32_t kQuit = 0xFFFFFFFF;

// server -> client: after the setup of a point ("ready"), and after its last batch (WRITE and
// SEND families: the receiver's byte-by-byte check of every destination buffer).
struct ReplyMsg {
  uint32_t ok;  // 1: ready / every byte as sent
  uint32_t pad;
  uint64_t bad_bytes;  // bytes that differ from the pattern
};

// Each returns a file descriptor, or -1 after printing a one-line error.
[[nodiscard]] int control_listen(uint16_t port, int timeout_ms);  // accepts one client
[[nodiscard]] int control_connect(const char* host, uint16_t port, int timeout_ms);
// Whole messages, with a timeout; false (after printing an error) on failure or EOF.
[[nodiscard]] bool control_send(int fd, const void* p, size_t len);
[[nodiscard]] bool control_recv(int fd, void* p, size_t len, int timeout_ms);

}  // namespace noncontig
