// FaultSpec and FaultyTransport (UROCE_FAULT): the spec parses into its
// fields or is refused with a message; under the decorator a capturing fake
// transport sees exactly the datagrams that survive — none at loss=1, all
// unchanged and in order with no faults, each twice at dup=1, a one-bit
// flipped copy at corrupt=1 (the caller's buffer untouched), a reordered one
// only after delay_us — and the same seed gives the same faults every run.
#include "transport/fault_injection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace uroce::transport {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kLoopback = 0x7F000001;

// One datagram as the inner transport saw it.
struct Seen {
  Endpoint dst;
  IpAddress src_ip;
  uint16_t segment_size = 0;
  std::vector<uint8_t> bytes;
  Clock::time_point at;
  friend bool operator==(const Seen& a, const Seen& b) {
    return a.dst == b.dst && a.src_ip == b.src_ip && a.segment_size == b.segment_size && a.bytes == b.bytes;
  }
};

// What the fake transport recorded; owned by the test, which keeps it after
// the FaultyTransport (and with it the fake) is gone.
struct Log {
  std::vector<Seen> sent;
  size_t send_calls = 0;
  std::vector<int> wait_timeouts;
  std::vector<int> recv_timeouts;
  std::vector<std::vector<uint8_t>> to_receive;  // scripted datagrams for recv_burst
  size_t wakes = 0;
};

// A DatagramTransport that copies every datagram handed to it and receives
// only what the test scripted.
class FakeTransport final : public DatagramTransport {
 public:
  explicit FakeTransport(Log* log) : log_(log) {}

  size_t send_burst(std::span<TxDatagram> burst) noexcept override {
    ++log_->send_calls;
    for (const TxDatagram& d : burst) {
      Seen s{d.dst, d.src_ip, d.segment_size, {}, Clock::now()};
      for (unsigned i = 0; i < d.iovcnt; ++i) {
        auto* p = static_cast<const uint8_t*>(d.iov[i].iov_base);
        s.bytes.insert(s.bytes.end(), p, p + d.iov[i].iov_len);
      }
      log_->sent.push_back(std::move(s));
    }
    return burst.size();
  }
  size_t recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept override {
    log_->recv_timeouts.push_back(timeout_ms);
    size_t n = 0;
    for (; n < out.size() && n < log_->to_receive.size(); ++n) {
      out[n] = RxDatagram{};
      out[n].data = log_->to_receive[n].data();
      out[n].len = uint32_t(log_->to_receive[n].size());
      out[n].src = Endpoint{kLoopback, 4791};
    }
    return n;
  }
  void wake() noexcept override { ++log_->wakes; }
  void wait(int timeout_ms) noexcept override { log_->wait_timeouts.push_back(timeout_ms); }
  uint16_t local_port() const noexcept override { return 5555; }
  uint16_t host_port() const noexcept override { return 4791; }
  unsigned max_gso_segments() const noexcept override { return 64; }
  bool gro() const noexcept override { return true; }
  bool more_ready() const noexcept override { return true; }

 private:
  Log* log_;
};

std::unique_ptr<FaultyTransport> faulty(Log* log, const FaultSpec& spec) {
  return std::make_unique<FaultyTransport>(std::make_unique<FakeTransport>(log), spec);
}

FaultSpec parsed(const std::string& text) {
  std::string error;
  auto spec = FaultSpec::parse(text, &error);
  EXPECT_TRUE(spec.has_value()) << text << ": " << error;
  return spec.value_or(FaultSpec{});
}

// `count` datagrams, each with its own payload (its number in the first four
// bytes, then a pattern), gathered from two pieces, to a few destinations.
struct Datagrams {
  explicit Datagrams(size_t count, size_t len = 48) : payload(count), iov(count * 2), d(count) {
    for (size_t i = 0; i < count; ++i) {
      payload[i].resize(len);
      std::memcpy(payload[i].data(), &i, 4);
      for (size_t b = 4; b < len; ++b) payload[i][b] = uint8_t(i * 31 + b);
      iov[2 * i] = iovec{payload[i].data(), 4};
      iov[2 * i + 1] = iovec{payload[i].data() + 4, len - 4};
      d[i].dst = Endpoint{kLoopback + uint32_t(i % 3), uint16_t(4791 + i % 5)};
      d[i].src_ip = IpAddress(0x0A000001);
      d[i].iovcnt = 2;
      d[i].iov = &iov[2 * i];
    }
  }
  // The datagram as the network should see it unharmed.
  Seen expected(size_t i) const { return Seen{d[i].dst, d[i].src_ip, 0, payload[i], {}}; }

  std::vector<std::vector<uint8_t>> payload;
  std::vector<iovec> iov;
  std::vector<TxDatagram> d;
};

// Sends `dg` in bursts of `burst` datagrams.
void send_all(FaultyTransport& t, Datagrams& dg, size_t burst = 16) {
  for (size_t i = 0; i < dg.d.size(); i += burst) {
    auto part = std::span(dg.d).subspan(i, std::min(burst, dg.d.size() - i));
    EXPECT_EQ(t.send_burst(part), part.size());
  }
}

size_t differing_bits(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t bits = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) bits += size_t(std::popcount(uint8_t(a[i] ^ b[i])));
  return bits;
}

// --- FaultSpec::parse ---

// Parse the full spec of the documentation / Expect each field set from it.
TEST(FaultSpecParse, FullSpecSetsEveryField) {
  std::string error;
  auto s = FaultSpec::parse("loss=0.05,dup=0.01,reorder=0.05,corrupt=0.02,delay_us=500,seed=7", &error);
  ASSERT_TRUE(s.has_value()) << error;
  EXPECT_DOUBLE_EQ(s->loss, 0.05);
  EXPECT_DOUBLE_EQ(s->dup, 0.01);
  EXPECT_DOUBLE_EQ(s->reorder, 0.05);
  EXPECT_DOUBLE_EQ(s->corrupt, 0.02);
  EXPECT_EQ(s->delay_us, 500u);
  EXPECT_EQ(s->seed, 7u);
  EXPECT_TRUE(s->any());
}

// Parse "" and ",," / Expect a spec (not an error) with the defaults: no
// faults, delay_us 200, seed 1.
TEST(FaultSpecParse, EmptySpecIsTheDefault) {
  for (const char* text : {"", ",", ",,"}) {
    std::string error;
    auto s = FaultSpec::parse(text, &error);
    ASSERT_TRUE(s.has_value()) << "'" << text << "': " << error;
    EXPECT_EQ(s->loss, 0);
    EXPECT_EQ(s->dup, 0);
    EXPECT_EQ(s->reorder, 0);
    EXPECT_EQ(s->corrupt, 0);
    EXPECT_EQ(s->delay_us, 200u);
    EXPECT_EQ(s->seed, 1u);
    EXPECT_FALSE(s->any());
  }
}

// Parse keys in another order, one of them alone, probabilities at 0 and 1 /
// Expect the keys given set, the others left at their defaults.
TEST(FaultSpecParse, KeysInAnyOrderOthersKeepTheirDefaults) {
  auto s = parsed("seed=3,loss=1");
  EXPECT_EQ(s.loss, 1);
  EXPECT_EQ(s.seed, 3u);
  EXPECT_EQ(s.dup, 0);
  EXPECT_EQ(s.delay_us, 200u);

  s = parsed("corrupt=0,reorder=1,dup=0");
  EXPECT_EQ(s.corrupt, 0);
  EXPECT_EQ(s.reorder, 1);
  EXPECT_EQ(s.loss, 0);
  EXPECT_EQ(s.seed, 1u);

  s = parsed("delay_us=0");
  EXPECT_EQ(s.delay_us, 0u);
  EXPECT_FALSE(s.any());
}

// Parse malformed specs / Expect nullopt and a message naming what is wrong.
TEST(FaultSpecParse, MalformedSpecIsRefusedWithAMessage) {
  struct Case {
    const char* text;
    const char* named;  // what the message must mention
  } cases[] = {
      {"bogus=1", "bogus"},                 // unknown key
      {"loss=0.1,jitter=5", "jitter"},      // unknown key after a good one
      {"Loss=0.1", "Loss"},                 // keys are case-sensitive
      {" loss=0.1", " loss"},               // no blanks around keys
      {"=0.5", "''"},                       // no key
      {"loss", "loss"},                     // missing '='
      {"loss=0.1,dup", "dup"},              // missing '=' after a good item
      {"loss=", "loss"},                    // missing value
      {"loss=abc", "abc"},                  // not a number
      {"seed=seven", "seven"},              // not a number
      {"loss=0.1x", "0.1x"},                // trailing garbage
      {"loss=0.1 ", "0.1 "},                // trailing blank
      {"delay_us=500us", "500us"},          // trailing unit
      {"loss=0.1=0.2", "0.1=0.2"},          // two '='
      {"loss=0.1;dup=0.1", "0.1;dup=0.1"},  // wrong separator
      {"loss=-0.1", "loss"},                // probability < 0
      {"dup=1.5", "dup"},                   // probability > 1
      {"reorder=2", "reorder"},             // probability > 1
      {"corrupt=-1", "corrupt"},            // probability < 0
      {"loss=inf", "loss"},                 // probability > 1
      {"delay_us=-1", "delay_us"},          // negative delay
      {"seed=-3", "seed"},                  // negative seed
  };
  for (const Case& c : cases) {
    std::string error;
    auto s = FaultSpec::parse(c.text, &error);
    EXPECT_FALSE(s.has_value()) << "'" << c.text << "' was accepted";
    EXPECT_FALSE(error.empty()) << "'" << c.text << "'";
    EXPECT_NE(error.find(c.named), std::string::npos) << "'" << c.text << "' gave \"" << error << "\"";
  }
}

// Parse "loss=nan" / Expect it refused like any other probability outside
// [0, 1].
// (The range check once read `v < 0 || v > 1`, false for NaN: loss=nan was
// accepted and silently injected nothing.)
TEST(FaultSpecParse, NanProbabilityIsRefused) {
  for (const char* text : {"loss=nan", "dup=nan", "reorder=NAN", "corrupt=nan"}) {
    std::string error;
    auto s = FaultSpec::parse(text, &error);
    EXPECT_FALSE(s.has_value()) << "'" << text << "' was accepted";
  }
}

// Parse a delay or seed out of their integer type's range / Expect nullopt.
// (They were once converted from a double after checking only v >= 0:
// undefined behaviour, and delay_us=4294967296 became 0, no delay.)
TEST(FaultSpecParse, OutOfRangeDelayOrSeedIsRefused) {
  for (const char* text : {"delay_us=1e10", "delay_us=4294967296", "delay_us=inf", "seed=1e30", "seed=inf"}) {
    std::string error;
    auto s = FaultSpec::parse(text, &error);
    EXPECT_FALSE(s.has_value()) << "'" << text << "' was accepted";
  }
}

// Parse seed=2^53+1 and seed=2^64-1 / Expect those seeds exactly.
// (Seeds were once read as doubles: above 2^53 two seeds could be one run.)
TEST(FaultSpecParse, LargeSeedIsExact) {
  EXPECT_EQ(parsed("seed=9007199254740993").seed, 9007199254740993ull);
  EXPECT_EQ(parsed("seed=18446744073709551615").seed, UINT64_MAX);
}

// any() of the default spec, of each probability alone, of delay and seed
// alone / Expect true only when some probability is above 0.
// Parse a slow link / Expect its rate and queue; the queue defaults to 1 MiB.
TEST(FaultSpecParse, SlowLinkRateAndQueue) {
  std::string error;
  auto s = FaultSpec::parse("rate_mbit=400,latency_us=5000,queue_kb=256", &error);
  ASSERT_TRUE(s.has_value()) << error;
  EXPECT_EQ(s->rate_mbit, 400u);
  EXPECT_EQ(s->latency_us, 5000u);
  EXPECT_EQ(s->queue_kb, 256u);
  EXPECT_EQ(FaultSpec{}.queue_kb, 1024u);
  EXPECT_FALSE(FaultSpec::parse("rate_mbit=1.5", &error).has_value());
  EXPECT_NE(error.find("rate_mbit"), std::string::npos) << error;
}

TEST(FaultSpec, AnyMeansSomeProbabilityAboveZero) {
  EXPECT_FALSE(FaultSpec{}.any());
  FaultSpec s;
  s.delay_us = 1000;
  s.seed = 99;
  EXPECT_FALSE(s.any());
  for (double FaultSpec::*p : {&FaultSpec::loss, &FaultSpec::dup, &FaultSpec::reorder, &FaultSpec::corrupt}) {
    FaultSpec one;
    one.*p = 0.001;
    EXPECT_TRUE(one.any());
  }
  FaultSpec slow;
  slow.rate_mbit = 100;
  EXPECT_TRUE(slow.any());
  FaultSpec far;
  far.latency_us = 100;
  EXPECT_TRUE(far.any());
}

// --- FaultyTransport ---

// Send 100 datagrams in bursts of 7 with no faults / Expect each at the
// inner transport, unchanged (bytes, destination, source) and in order, each
// burst handed on whole (15 calls); only `sent` counted.
TEST(FaultyTransport, NoFaultsPassesEverythingUnchangedInOrder) {
  Log log;
  auto t = faulty(&log, FaultSpec{});
  Datagrams dg(100);
  send_all(*t, dg, 7);
  EXPECT_EQ(log.send_calls, 15u);
  ASSERT_EQ(log.sent.size(), 100u);
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(log.sent[i], dg.expected(i)) << "datagram " << i;
  const auto& c = t->counters();
  EXPECT_EQ(c.sent.load(), 100u);
  EXPECT_EQ(c.lost.load(), 0u);
  EXPECT_EQ(c.duplicated.load(), 0u);
  EXPECT_EQ(c.reordered.load(), 0u);
  EXPECT_EQ(c.corrupted.load(), 0u);
}

// Send 200 datagrams at loss=1 / Expect none at the inner transport, each
// counted sent and lost, and send_burst still answers the whole burst.
TEST(FaultyTransport, LossOneDropsEverything) {
  Log log;
  auto t = faulty(&log, parsed("loss=1"));
  Datagrams dg(200);
  send_all(*t, dg);
  EXPECT_TRUE(log.sent.empty());
  EXPECT_EQ(t->counters().sent.load(), 200u);
  EXPECT_EQ(t->counters().lost.load(), 200u);
  EXPECT_EQ(t->counters().duplicated.load(), 0u);
}

// Send the same 1000 datagrams through two transports with one spec and
// seed, then through one with another seed / Expect the same datagrams
// (which were lost, duplicated, corrupted, held) and counters from the first
// two, a different sequence from the third.
TEST(FaultyTransport, SameSeedSameFaultsOtherSeedOtherFaults) {
  // delay_us=0: a held datagram is released by the send_burst that held it,
  // so the sequence does not depend on timing.
  const std::string spec = "loss=0.1,dup=0.1,reorder=0.1,corrupt=0.1,delay_us=0,seed=";
  struct Run {
    std::vector<Seen> seen;
    std::array<uint64_t, 5> counts;  // sent, lost, duplicated, reordered, corrupted
  };
  auto run = [&](uint64_t seed) {
    Log log;
    auto t = faulty(&log, parsed(spec + std::to_string(seed)));
    Datagrams dg(1000);
    send_all(*t, dg);
    const auto& c = t->counters();
    return Run{log.sent, {c.sent.load(), c.lost.load(), c.duplicated.load(), c.reordered.load(), c.corrupted.load()}};
  };
  Run first = run(7), second = run(7), third = run(1234567);
  const auto &a = first.seen, &b = second.seen, &other = third.seen;
  const auto &ca = first.counts, &cb = second.counts;
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "datagram " << i << " of the inner transport";
  EXPECT_EQ(ca, cb);
  // Every kind of fault happened, so the comparison covered them all.
  for (size_t k = 1; k < 5; ++k) EXPECT_GT(ca[k], 0u) << "counter " << k;

  bool same = other.size() == a.size();
  for (size_t i = 0; same && i < a.size(); ++i) same = other[i] == a[i];
  EXPECT_FALSE(same) << "seed 1234567 gave the faults of seed 7";
}

// Send the same 1000 datagrams, one per burst, with seed 1 and with seed 3
// (loss=dup=reorder=corrupt=0.02) / Expect different faults: which datagrams
// are lost, duplicated, held or corrupted should not repeat across seeds.
// (The generator once started at seed * its increment, so seed s+k replayed
// seed s's draws k steps on; as a datagram takes 1, 4 or 6 draws, nearby
// seeds fell into step: seeds 1..100 gave about 26 distinct sequences.)
TEST(FaultyTransport, NearbySeedsGiveDifferentFaults) {
  auto fates = [](uint64_t seed) {
    Log log;
    auto t =
        faulty(&log, parsed("loss=0.02,dup=0.02,reorder=0.02,corrupt=0.02,delay_us=0,seed=" + std::to_string(seed)));
    Datagrams dg(1000, 16);
    std::vector<std::array<uint64_t, 4>> out;  // lost, duplicated, reordered, corrupted: this datagram's
    std::array<uint64_t, 4> before{};
    for (TxDatagram& d : dg.d) {
      t->send_burst(std::span(&d, 1));
      const auto& c = t->counters();
      std::array<uint64_t, 4> now{c.lost.load(), c.duplicated.load(), c.reordered.load(), c.corrupted.load()};
      out.push_back({now[0] - before[0], now[1] - before[1], now[2] - before[2], now[3] - before[3]});
      before = now;
    }
    return out;
  };
  auto a = fates(1), b = fates(3);
  size_t same = 0, faulted = 0;
  for (size_t i = 100; i < a.size(); ++i) {
    bool any = a[i] != std::array<uint64_t, 4>{};
    faulted += any;
    same += any && a[i] == b[i];
  }
  ASSERT_GT(faulted, 20u);
  EXPECT_LT(same, faulted / 2) << same << " of the " << faulted
                               << " datagrams 100..999 faulted with seed 1 were faulted the same way with seed 3";
}

// Send 20000 datagrams at loss=0.1, dup=corrupt=reorder=0.05 / Expect each
// counter near its rate (seeded, so the same every run) and the inner
// transport to see sent - lost + duplicated datagrams.
TEST(FaultyTransport, RatesFollowTheSpec) {
  Log log;
  auto t = faulty(&log, parsed("loss=0.1,dup=0.05,corrupt=0.05,reorder=0.05,delay_us=0,seed=5"));
  Datagrams dg(20000, 16);
  send_all(*t, dg, 32);
  const auto& c = t->counters();
  ASSERT_EQ(c.sent.load(), 20000u);
  double lost = double(c.lost.load()) / 20000;
  EXPECT_GE(lost, 0.08);
  EXPECT_LE(lost, 0.12);
  double kept = double(c.sent.load() - c.lost.load());
  for (uint64_t n : {c.duplicated.load(), c.corrupted.load(), c.reordered.load()}) {
    EXPECT_GE(double(n) / kept, 0.04);
    EXPECT_LE(double(n) / kept, 0.06);
  }
  EXPECT_EQ(log.sent.size(), c.sent.load() - c.lost.load() + c.duplicated.load());
}

// Send 200 datagrams at corrupt=1 / Expect each at the inner transport with
// exactly one bit flipped, the caller's buffers unmodified, 200 corrupted.
TEST(FaultyTransport, CorruptionFlipsABitInACopyOnly) {
  Log log;
  auto t = faulty(&log, parsed("corrupt=1,seed=3"));
  Datagrams dg(200, 64);
  const auto originals = dg.payload;
  send_all(*t, dg);
  EXPECT_EQ(dg.payload, originals) << "the caller's buffers were modified";
  ASSERT_EQ(log.sent.size(), 200u);
  std::vector<bool> seen(200, false);
  for (const Seen& s : log.sent) {
    // The flipped bit may be in the number itself: find the original by
    // the fewest differing bits.
    size_t best = 0, best_bits = SIZE_MAX;
    for (size_t i = 0; i < 200; ++i) {
      size_t bits = differing_bits(s.bytes, originals[i]);
      if (bits < best_bits) best = i, best_bits = bits;
    }
    EXPECT_EQ(best_bits, 1u) << "datagram " << best;
    EXPECT_EQ(s.bytes.size(), originals[best].size());
    EXPECT_EQ(s.dst, dg.d[best].dst);
    EXPECT_EQ(s.src_ip, dg.d[best].src_ip);
    seen[best] = true;
  }
  for (size_t i = 0; i < 200; ++i) EXPECT_TRUE(seen[i]) << "datagram " << i << " missing";
  EXPECT_EQ(t->counters().corrupted.load(), 200u);
  EXPECT_EQ(t->counters().lost.load(), 0u);
}

// Send one burst of 40 datagrams at corrupt=0.5 / Expect 40 at the inner
// transport in the burst's order: the i-th is datagram i, whole or with one
// bit flipped (a corrupted datagram keeps its place), and the flipped ones
// are as many as `corrupted` counts, some but not all.
TEST(FaultyTransport, CorruptedDatagramKeepsItsPlaceInTheBurst) {
  Log log;
  auto t = faulty(&log, parsed("corrupt=0.5,seed=5"));
  Datagrams dg(40);
  ASSERT_EQ(t->send_burst(std::span(dg.d)), 40u);
  ASSERT_EQ(log.sent.size(), 40u);
  size_t flipped = 0;
  for (size_t i = 0; i < 40; ++i) {
    const Seen want = dg.expected(i);
    ASSERT_EQ(log.sent[i].bytes.size(), want.bytes.size()) << "datagram " << i;
    size_t bits = differing_bits(log.sent[i].bytes, want.bytes);
    EXPECT_LE(bits, 1u) << "datagram " << i << " is not in its place";
    EXPECT_EQ(log.sent[i].dst, want.dst);
    flipped += bits;
  }
  EXPECT_EQ(flipped, t->counters().corrupted.load());
  EXPECT_GT(flipped, 0u);
  EXPECT_LT(flipped, 40u);
}

// Send 50 datagrams one per burst, then a burst of 3, at dup=1 / Expect each
// twice at the inner transport, unchanged, each copy right behind its
// original (in a burst too: a duplicate moves nothing else), and
// duplicated = 53.
TEST(FaultyTransport, DupOneDeliversEachTwice) {
  Log log;
  auto t = faulty(&log, parsed("dup=1"));
  Datagrams dg(53);
  for (size_t i = 0; i < 50; ++i) ASSERT_EQ(t->send_burst(std::span(&dg.d[i], 1)), 1u);
  ASSERT_EQ(log.sent.size(), 100u);
  for (size_t i = 0; i < 50; ++i) {
    EXPECT_EQ(log.sent[2 * i], dg.expected(i)) << "datagram " << i;
    EXPECT_EQ(log.sent[2 * i + 1], dg.expected(i)) << "copy of datagram " << i;
  }
  ASSERT_EQ(t->send_burst(std::span(dg.d).subspan(50, 3)), 3u);
  ASSERT_EQ(log.sent.size(), 106u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(log.sent[100 + 2 * k], dg.expected(50 + k));
    EXPECT_EQ(log.sent[101 + 2 * k], dg.expected(50 + k));
  }
  EXPECT_EQ(t->counters().duplicated.load(), 53u);
  EXPECT_EQ(t->counters().sent.load(), 53u);
}

// Send one datagram at reorder=1, delay_us=1000, then scribble on the
// caller's buffer, and call recv_burst until it shows up (at most 1 s) /
// Expect nothing at the inner transport right away, then the datagram as it
// was sent, not before 1 ms after send_burst; reordered = 1.
TEST(FaultyTransport, ReorderedDatagramIsHeldForTheDelay) {
  Log log;
  auto t = faulty(&log, parsed("reorder=1,delay_us=1000"));
  Datagrams dg(1);
  const Seen want = dg.expected(0);
  auto start = Clock::now();
  ASSERT_EQ(t->send_burst(std::span(dg.d)), 1u);
  EXPECT_TRUE(log.sent.empty()) << "not held";
  std::memset(dg.payload[0].data(), 0xEE, dg.payload[0].size());  // the held copy is the transport's own
  EXPECT_EQ(t->counters().reordered.load(), 1u);
  std::vector<RxDatagram> rx(8);
  auto deadline = start + std::chrono::seconds(1);
  while (log.sent.empty() && Clock::now() < deadline) EXPECT_EQ(t->recv_burst(rx, 1), 0u);
  ASSERT_EQ(log.sent.size(), 1u) << "never released";
  EXPECT_EQ(log.sent[0], want);
  EXPECT_GE(log.sent[0].at - start, std::chrono::microseconds(1000));
}

// Find a seed that holds the first of two datagrams (reorder=0.5,
// delay_us=1000) and passes the second, wait 1.1 ms, send a third / Expect
// the second at the inner transport first, the first released by the later
// send_burst (after the third when that one passes), not before its delay.
TEST(FaultyTransport, HeldDatagramIsOvertakenAndReleasedByALaterSend) {
  Datagrams dg(3);
  for (uint64_t seed = 1; seed <= 64; ++seed) {
    Log log;
    FaultSpec spec;
    spec.reorder = 0.5;
    spec.delay_us = 1000;
    spec.seed = seed;
    auto t = faulty(&log, spec);
    auto start = Clock::now();
    t->send_burst(std::span(&dg.d[0], 1));
    t->send_burst(std::span(&dg.d[1], 1));
    if (t->counters().reordered.load() != 1 || log.sent.size() != 1 || !(log.sent[0] == dg.expected(1))) continue;
    // Seed found: datagram 0 is held, 1 went through. The third send, more
    // than delay_us after the first returned, releases 0 (after datagram 2 if
    // that one passes: the burst goes first).
    std::this_thread::sleep_until(Clock::now() + std::chrono::microseconds(1100));
    t->send_burst(std::span(&dg.d[2], 1));
    bool third_held = t->counters().reordered.load() == 2;
    ASSERT_EQ(log.sent.size(), third_held ? 2u : 3u) << "seed " << seed;
    EXPECT_EQ(log.sent.back(), dg.expected(0)) << "seed " << seed;
    EXPECT_GE(log.sent.back().at - start, std::chrono::microseconds(1000));
    if (!third_held) {
      EXPECT_EQ(log.sent[1], dg.expected(2));
    }
    return;
  }
  FAIL() << "no seed in 1..64 held the first datagram and passed the second";
}

// Hold a datagram (reorder=1, delay_us=60 s) and call wait and recv_burst
// with long or infinite timeouts / Expect the inner transport asked to wait
// at most 1 ms while one is held, the caller's timeout when none is.
TEST(FaultyTransport, HeldDatagramShortensWaits) {
  Log log;
  auto t = faulty(&log, parsed("reorder=1,delay_us=60000000"));
  std::vector<RxDatagram> rx(4);
  t->wait(50);
  t->recv_burst(rx, 50);
  Datagrams dg(1);
  t->send_burst(std::span(dg.d));
  t->wait(50);
  t->wait(-1);
  t->wait(0);
  t->recv_burst(rx, -1);
  t->recv_burst(rx, 0);
  EXPECT_EQ(log.wait_timeouts, (std::vector<int>{50, 1, 1, 0}));
  EXPECT_EQ(log.recv_timeouts, (std::vector<int>{50, 1, 0}));
  EXPECT_TRUE(log.sent.empty()) << "released before its delay";
}

// Script two datagrams at the inner transport, call recv_burst / Expect them
// returned unchanged: faults apply to sending only.
TEST(FaultyTransport, ReceivedDatagramsPassUntouched) {
  Log log;
  log.to_receive = {{1, 2, 3}, {4, 5, 6, 7}};
  auto t = faulty(&log, parsed("loss=1,corrupt=1,dup=1,reorder=1"));
  std::vector<RxDatagram> rx(8);
  ASSERT_EQ(t->recv_burst(rx, 0), 2u);
  EXPECT_EQ(std::vector<uint8_t>(rx[0].data, rx[0].data + rx[0].len), log.to_receive[0]);
  EXPECT_EQ(std::vector<uint8_t>(rx[1].data, rx[1].data + rx[1].len), log.to_receive[1]);
  EXPECT_EQ(t->counters().sent.load(), 0u);
}

// Ask the decorator what the inner transport knows / Expect its answers
// (ports, GRO, more_ready, wake), the inner as decorated(), but no GSO and
// no jumbo path: faults apply to single packets.
TEST(FaultyTransport, AnswersForTheInnerTransportButOffersNoGsoOrJumbo) {
  Log log;
  auto t = faulty(&log, parsed("loss=0.5"));
  EXPECT_EQ(t->local_port(), 5555);
  EXPECT_EQ(t->host_port(), 4791);
  EXPECT_TRUE(t->gro());
  EXPECT_TRUE(t->more_ready());
  EXPECT_NE(dynamic_cast<FakeTransport*>(t->decorated()), nullptr);
  EXPECT_EQ(find_layer<FakeTransport>(t.get()), t->decorated());
  EXPECT_EQ(t->max_gso_segments(), 1u);
  uint8_t b[8] = {};
  iovec v{b, sizeof b};
  EXPECT_EQ(t->send_jumbo(Endpoint{kLoopback, 4791}, IpAddress{}, &v, 1), JumboSend::kNotLocal);
  EXPECT_EQ(t->jumbo_limit(Endpoint{kLoopback, 4791}), 0u);
  t->wake();
  EXPECT_EQ(log.wakes, 1u);
  EXPECT_DOUBLE_EQ(t->spec().loss, 0.5);
}

// Send 10 datagrams of 1,000 bytes at once through an 8 Mbit/s link (1 ms a
// datagram) with a 6 KiB queue / Expect the first 6 queued and the rest
// dropped as overflowed; the 6 released in order, the k-th not before
// (k + 1) ms after the send.
TEST(FaultyTransport, SlowLinkPacesInOrderAndDropsWhenItsQueueIsFull) {
  Log log;
  auto t = faulty(&log, parsed("rate_mbit=8,queue_kb=6"));
  Datagrams dg(10, 1000);
  auto start = Clock::now();
  ASSERT_EQ(t->send_burst(std::span(dg.d)), 10u);
  EXPECT_EQ(t->counters().overflowed.load(), 4u);
  std::vector<RxDatagram> rx(8);
  auto deadline = start + std::chrono::seconds(2);
  while (log.sent.size() < 6 && Clock::now() < deadline) EXPECT_EQ(t->recv_burst(rx, 1), 0u);
  ASSERT_EQ(log.sent.size(), 6u);
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_EQ(log.sent[k], dg.expected(k)) << "datagram " << k;
    EXPECT_GE(log.sent[k].at - start, std::chrono::milliseconds(k + 1)) << "datagram " << k;
  }
}

// Send 5 datagrams through a link with 2 ms of latency and no rate limit /
// Expect none before 2 ms, then all 5 unchanged and in order.
TEST(FaultyTransport, LatencyDelaysEveryDatagramInOrder) {
  Log log;
  auto t = faulty(&log, parsed("latency_us=2000"));
  Datagrams dg(5);
  auto start = Clock::now();
  send_all(*t, dg, 2);
  EXPECT_TRUE(log.sent.empty());
  std::vector<RxDatagram> rx(8);
  auto deadline = start + std::chrono::seconds(2);
  while (log.sent.size() < 5 && Clock::now() < deadline) EXPECT_EQ(t->recv_burst(rx, 1), 0u);
  ASSERT_EQ(log.sent.size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(log.sent[k], dg.expected(k)) << "datagram " << k;
    EXPECT_GE(log.sent[k].at - start, std::chrono::microseconds(2000)) << "datagram " << k;
  }
  EXPECT_EQ(t->counters().overflowed.load(), 0u);
}

// Send 6 datagrams of 1,000 bytes through an 8 Mbit/s link with 2 s of
// latency and a 6 KiB queue, wait until the link has carried them (6 ms), send
// 6 more / Expect none dropped: what is on the path takes no queue space, as
// the bandwidth-delay product of a long link is not a switch's queue.
TEST(FaultyTransport, DatagramsOnTheLongPathTakeNoQueueSpace) {
  Log log;
  auto t = faulty(&log, parsed("rate_mbit=8,latency_us=2000000,queue_kb=6"));
  Datagrams first(6, 1000), second(6, 1000);
  ASSERT_EQ(t->send_burst(std::span(first.d)), 6u);
  std::this_thread::sleep_for(std::chrono::milliseconds(7));
  ASSERT_EQ(t->send_burst(std::span(second.d)), 6u);
  EXPECT_TRUE(log.sent.empty());  // all 12 still on the path
  EXPECT_EQ(t->counters().overflowed.load(), 0u);
}

// Send 10 datagrams of 1,000 bytes at once through a link with latency and no
// rate limit, queue 1 KiB / Expect none dropped: nothing waits for such a link.
TEST(FaultyTransport, LatencyAloneQueuesNothing) {
  Log log;
  auto t = faulty(&log, parsed("latency_us=20000,queue_kb=1"));
  Datagrams dg(10, 1000);
  ASSERT_EQ(t->send_burst(std::span(dg.d)), 10u);
  EXPECT_EQ(t->counters().overflowed.load(), 0u);
}

// Latency alone / Expect GSO offered (the inner's 64) and a GSO message of 3
// segments delivered whole, late, with its segment size; with any per-packet
// fault (loss, rate) / Expect no GSO.
TEST(FaultyTransport, LatencyAloneKeepsGsoMessagesWhole) {
  Log log;
  auto t = faulty(&log, parsed("latency_us=1000"));
  EXPECT_EQ(t->max_gso_segments(), 64u);
  std::vector<uint8_t> bytes(3000, 7);
  iovec v{bytes.data(), bytes.size()};
  TxDatagram d{};
  d.dst = Endpoint{kLoopback, 4791};
  d.iov = &v;
  d.iovcnt = 1;
  d.segment_size = 1000;
  auto start = Clock::now();
  ASSERT_EQ(t->send_burst(std::span(&d, 1)), 1u);
  std::vector<RxDatagram> rx(8);
  while (log.sent.empty() && Clock::now() < start + std::chrono::seconds(2)) t->recv_burst(rx, 1);
  ASSERT_EQ(log.sent.size(), 1u);
  EXPECT_EQ(log.sent[0].segment_size, 1000u);
  EXPECT_EQ(log.sent[0].bytes, bytes);
  EXPECT_GE(log.sent[0].at - start, std::chrono::microseconds(1000));
  EXPECT_EQ(faulty(&log, parsed("latency_us=1000,loss=0.01"))->max_gso_segments(), 1u);
  EXPECT_EQ(faulty(&log, parsed("latency_us=1000,rate_mbit=100"))->max_gso_segments(), 1u);
}

}  // namespace
}  // namespace uroce::transport
