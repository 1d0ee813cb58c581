// ring_floor — a benchmark (bench/compare.sh runs it): the one-way latency two processes
// of this host can reach through uroce's same-host ring (transport/shm_ring.h) when they
// do nothing else, the floors compare.sh sets the same-host `ib_send_lat` 64 B figure and
// libfabric's shm provider against. Beside the transport's tests because it reaches into
// the transport (bench/ uses the public ABI only).
//
//   ring_floor [-m line|message|acked] [-n ITERATIONS] [-s SIZE] [-p]
//
// Two processes (a fork) share two ShmRings, one each way, and play ping-pong:
// - line: no ring; one cache line each way (an atomic store the other side spins on):
//   the cost of one transfer between the two CPUs;
// - message: one record per message each way, SIZE bytes of payload behind a 12-byte
//   header and 4 bytes of ICRC room (a RoCE SEND's length), copied out of the ring on
//   receipt as uroce does: a message-passing design's floor (libfabric's shm provider
//   sends no acknowledgement);
// - acked: the same, and the receiver pushes a 20-byte ACK record before its reply, which
//   the sender takes first: the shape of an RC SEND through uroce's rings (an ACK per
//   message, sent at the end of the receive that found the request).
// Not pinned unless -p (the client on the first CPU the process may use, the server on the
// second), as compare.sh's same-host half runs. The client times batches of 1,000 round
// trips; the figure is the median batch's round trip / 2. Prints one line:
//   ring_floor mode=acked size=64 iterations=200000 typical_us=0.21
// Every reply's payload is checked; on failure "ring_floor error=WHAT" and exit status 1.
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "transport/shm_ring.h"
#include "wire/opcode.h"

namespace {

using uroce::transport::ShmRing;
namespace wire = uroce::wire;

constexpr size_t kRingBytes = ShmRing::kHeaderBytes + (1u << 20);
// A SEND ONLY's headers, and an ACK's whole packet (BTH + AETH + ICRC), from the opcode table.
constexpr uint32_t kHeader =
    wire::opcode_info(wire::make_opcode(wire::Service::kRc, wire::Operation::kSendOnly)).header_len;
constexpr uint32_t kIcrc = wire::kIcrcSize;
constexpr uint32_t kAckBytes =
    wire::opcode_info(wire::make_opcode(wire::Service::kRc, wire::Operation::kAcknowledge)).header_len + kIcrc;
static_assert(kHeader == 12 && kAckBytes == 20);
constexpr unsigned kBatch = 1000;

enum class Mode { kLine, kMessage, kAcked };
constexpr const char* kModeNames[] = {"line", "message", "acked"};

struct Options {
  Mode mode = Mode::kAcked;
  unsigned iterations = 200000;
  uint32_t size = 64;
  bool pin = false;
};

// The shared region: two rings, then one line each way for the line mode.
struct Shared {
  uint8_t* base = nullptr;
  uint8_t* ring(unsigned i) const { return base + i * kRingBytes; }
  std::atomic<uint64_t>* line(unsigned i) const {
    return reinterpret_cast<std::atomic<uint64_t>*>(base + 2 * kRingBytes + i * 64);
  }
  static size_t bytes() { return 2 * kRingBytes + 128; }
};

[[noreturn]] void fail(const char* what) {
  std::printf("ring_floor error=%s\n", what);
  std::fflush(stdout);
  std::_Exit(1);
}

void pin_to(int nth) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != nth) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(0, sizeof one, &one);
    return;
  }
}

void push(ShmRing& r, const uint8_t* bytes, uint32_t len) {
  const uint8_t* parts[1] = {bytes};
  uint32_t lens[1] = {len};
  while (!r.push(ShmRing::Meta{}, parts, lens, 1)) {
    if (r.corrupt()) fail("ring");
  }
}

// Waits for the next record and copies it out (the engine's receive does), then frees it.
uint32_t take(ShmRing& r, uint8_t* out) {
  ShmRing::Record rec;
  while (!r.peek(&rec)) {
    if (r.corrupt()) fail("ring");
  }
  std::memcpy(out, rec.data, rec.len);
  r.pop();
  return rec.len;
}

void serve(const Shared& s, const Options& o) {
  if (o.pin) pin_to(1);
  if (o.mode == Mode::kLine) {
    for (uint64_t i = 1; i <= o.iterations; ++i) {
      while (s.line(0)->load(std::memory_order_acquire) != i) {
      }
      s.line(1)->store(i, std::memory_order_release);
    }
    return;
  }
  ShmRing in = ShmRing::attach(s.ring(0), kRingBytes);
  ShmRing out = ShmRing::attach(s.ring(1), kRingBytes);
  std::vector<uint8_t> buf(kHeader + o.size + kIcrc), ack(kAckBytes, 0xAC);
  for (unsigned i = 0; i < o.iterations; ++i) {
    take(in, buf.data());
    if (o.mode == Mode::kAcked) push(out, ack.data(), kAckBytes);
    push(out, buf.data(), uint32_t(buf.size()));  // the reply: the request's bytes back
  }
}

// One round trip: the request carries its number, the reply must bring it back.
void round_trip(ShmRing& out, ShmRing& in, std::vector<uint8_t>& msg, std::vector<uint8_t>& got, uint64_t i,
                bool acked) {
  std::memcpy(msg.data() + kHeader, &i, sizeof i);
  push(out, msg.data(), uint32_t(msg.size()));
  if (acked && take(in, got.data()) != kAckBytes) fail("ack");
  if (take(in, got.data()) != msg.size() || std::memcmp(got.data(), msg.data(), msg.size()) != 0) fail("reply");
}

double client(const Shared& s, const Options& o) {
  if (o.pin) pin_to(0);
  ShmRing out = ShmRing::attach(s.ring(0), kRingBytes);
  ShmRing in = ShmRing::attach(s.ring(1), kRingBytes);
  std::vector<uint8_t> msg(kHeader + o.size + kIcrc, 0x5A), got(msg.size() + kAckBytes);
  std::vector<double> halves;
  uint64_t i = 0;
  while (i < o.iterations) {
    auto t0 = std::chrono::steady_clock::now();
    unsigned n = std::min<unsigned>(kBatch, o.iterations - unsigned(i));
    for (unsigned k = 0; k < n; ++k, ++i) {
      if (o.mode == Mode::kLine) {
        s.line(0)->store(i + 1, std::memory_order_release);
        while (s.line(1)->load(std::memory_order_acquire) != i + 1) {
        }
      } else {
        round_trip(out, in, msg, got, i, o.mode == Mode::kAcked);
      }
    }
    auto dt = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    halves.push_back(dt / n / 2);
  }
  std::nth_element(halves.begin(), halves.begin() + halves.size() / 2, halves.end());
  return halves[halves.size() / 2];
}

Mode parse_mode(const std::string& name) {
  for (unsigned m = 0; m < std::size(kModeNames); ++m)
    if (name == kModeNames[m]) return Mode(m);
  fail("mode");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-p") {
      o.pin = true;
    } else if (i + 1 < argc && (a == "-m" || a == "-n" || a == "-s")) {
      const char* v = argv[++i];
      if (a == "-m") o.mode = parse_mode(v);
      if (a == "-n") o.iterations = unsigned(std::strtoul(v, nullptr, 10));
      if (a == "-s") o.size = uint32_t(std::strtoul(v, nullptr, 10));
    } else {
      fail("usage: ring_floor [-m line|message|acked] [-n ITERATIONS] [-s SIZE] [-p]");
    }
  }
  if (o.iterations == 0 || o.size < 8 || o.size > 4096) fail("iterations or size");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  void* mem = mmap(nullptr, Shared::bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) fail("mmap");
  Shared s{static_cast<uint8_t*>(mem)};
  if (!ShmRing::create(s.ring(0), kRingBytes).valid() || !ShmRing::create(s.ring(1), kRingBytes).valid()) fail("ring");
  std::fflush(stdout);
  pid_t child = fork();
  if (child < 0) fail("fork");
  if (child == 0) {
    serve(s, o);
    std::_Exit(0);
  }
  double typical = client(s, o);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) fail("server");
  std::printf("ring_floor mode=%s size=%u iterations=%u typical_us=%.3f\n", kModeNames[unsigned(o.mode)], o.size,
              o.iterations, typical);
  return 0;
}
