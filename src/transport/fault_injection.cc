#include "transport/fault_injection.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace uroce::transport {

namespace {

// A probability: a decimal number in [0, 1] (NaN is not one).
bool parse_probability(const std::string& text, double* out) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= 0 && v <= 1)) return false;
  *out = v;
  return true;
}

// A whole number in [0, max], decimal digits only (no sign, no fraction, no
// exponent: a seed is taken exactly, and nothing is converted out of range).
bool parse_whole(const std::string& text, uint64_t max, uint64_t* out) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return false;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v > max) return false;
  *out = v;
  return true;
}

}  // namespace

std::optional<FaultSpec> FaultSpec::parse(const std::string& text, std::string* error) {
  FaultSpec s;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) {
      *error = "expected key=value, got '" + item + "'";
      return std::nullopt;
    }
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    double* probability = key == "loss"      ? &s.loss
                          : key == "dup"     ? &s.dup
                          : key == "reorder" ? &s.reorder
                          : key == "corrupt" ? &s.corrupt
                                             : nullptr;
    uint64_t whole = 0;
    if (probability) {
      if (!parse_probability(value, probability)) {
        *error = key + " must be a probability between 0 and 1, got '" + value + "'";
        return std::nullopt;
      }
    } else if (uint32_t* number = key == "delay_us"     ? &s.delay_us
                                  : key == "rate_mbit"  ? &s.rate_mbit
                                  : key == "latency_us" ? &s.latency_us
                                  : key == "queue_kb"   ? &s.queue_kb
                                                        : nullptr) {
      if (!parse_whole(value, UINT32_MAX, &whole)) {
        *error = key + " must be a whole number up to 4294967295, got '" + value + "'";
        return std::nullopt;
      }
      *number = uint32_t(whole);
    } else if (key == "seed") {
      if (!parse_whole(value, UINT64_MAX, &whole)) {
        *error = "seed must be a whole number up to 18446744073709551615, got '" + value + "'";
        return std::nullopt;
      }
      s.seed = whole;
    } else {
      *error = "unknown key '" + key + "'";
      return std::nullopt;
    }
  }
  return s;
}

FaultyTransport::FaultyTransport(std::unique_ptr<DatagramTransport> inner, const FaultSpec& spec)
    : inner_(std::move(inner)), spec_(spec), rng_(mix64(spec.seed)) {}

// splitmix64's output function: a bijection that spreads every input bit.
uint64_t FaultyTransport::mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// splitmix64. The generator starts at the seed mixed, not at a multiple of
// the increment: seed s+1 would otherwise replay seed s's draws one step on,
// and nearby seeds (a sweep) would fall into step after a few datagrams.
double FaultyTransport::next_uniform() { return double(mix64(rng_ += 0x9E3779B97F4A7C15ull) >> 11) * 0x1.0p-53; }

FaultyTransport::Copy FaultyTransport::copy_of(const TxDatagram& d) const {
  Copy c{d.dst, d.src_ip, {}, {}, d.segment_size};
  for (unsigned i = 0; i < d.iovcnt; ++i) {
    auto* p = static_cast<const uint8_t*>(d.iov[i].iov_base);
    c.bytes.insert(c.bytes.end(), p, p + d.iov[i].iov_len);
  }
  return c;
}

void FaultyTransport::flip_bit(Copy& c) {
  if (c.bytes.empty()) return;
  size_t at = size_t(next_uniform() * double(c.bytes.size()));
  c.bytes[at] ^= uint8_t(1u << unsigned(next_uniform() * 8));
  counters_.corrupted.fetch_add(1, std::memory_order_relaxed);
}

TxDatagram FaultyTransport::datagram_of(Copy& c, iovec* iov) {
  *iov = iovec{c.bytes.data(), c.bytes.size()};
  TxDatagram d{};
  d.dst = c.dst;
  d.src_ip = c.src_ip;
  d.iovcnt = 1;
  d.iov = iov;
  d.segment_size = c.segment_size;
  return d;
}

void FaultyTransport::send_copies(std::vector<Copy>& copies) {
  if (copies.empty()) return;
  std::vector<TxDatagram> out(copies.size());
  std::vector<iovec> iov(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) out[i] = datagram_of(copies[i], &iov[i]);
  inner_->send_burst(out);
}

void FaultyTransport::release_due(Clock::time_point now) {
  std::vector<Copy> due;
  while (!held_.empty() && held_.front().due <= now) {
    due.push_back(std::move(held_.front()));
    held_.pop_front();
  }
  send_copies(due);
}

void FaultyTransport::hold_back(Copy& c, Clock::time_point now) {
  c.due = now + std::chrono::microseconds(spec_.delay_us);
  counters_.reordered.fetch_add(1, std::memory_order_relaxed);
}

void FaultyTransport::hold(Copy&& c) { held_.push_back(std::move(c)); }

size_t FaultyTransport::bytes_waiting_for_link(Clock::time_point now) const {
  if (spec_.rate_mbit == 0 || link_free_ <= now) return 0;
  auto busy_ns = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(link_free_ - now).count());
  return size_t(busy_ns * spec_.rate_mbit / 8000);  // the inverse of enter_link's carry
}

void FaultyTransport::enter_link(Copy&& c, Clock::time_point now) {
  // The queue holds what the link has not carried yet; what it has carried is
  // on the wire for latency_us, as on a long path, and takes no queue space.
  if (bytes_waiting_for_link(now) + c.bytes.size() > size_t(spec_.queue_kb) * 1024) {
    counters_.overflowed.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // bytes * 8 / (rate_mbit * 10^6) seconds, in nanoseconds
  auto carry = std::chrono::nanoseconds(spec_.rate_mbit ? uint64_t(c.bytes.size()) * 8000 / spec_.rate_mbit : 0);
  link_free_ = std::max(link_free_, now) + carry;
  c.due = std::max(c.due, link_free_ + std::chrono::microseconds(spec_.latency_us));
  hold(std::move(c));
}

FaultyTransport::Outgoing::Outgoing(size_t burst) {
  out.reserve(2 * burst);
  copies.reserve(2 * burst);
  copy_iov.reserve(2 * burst);
}

void FaultyTransport::Outgoing::send_copy(Copy&& c) {
  copies.push_back(std::move(c));
  out.push_back(datagram_of(copies.back(), &copy_iov.emplace_back()));
}

FaultyTransport::Fate FaultyTransport::draw_fate() {
  if (next_uniform() < spec_.loss) return {true, false, false, false};
  bool corrupt = next_uniform() < spec_.corrupt;
  bool dup = next_uniform() < spec_.dup;
  bool reorder = next_uniform() < spec_.reorder;
  return {false, corrupt, dup, reorder};
}

void FaultyTransport::inject_slow_link(const TxDatagram& d, Fate f, Clock::time_point now) {
  Copy c = copy_of(d);
  if (f.corrupt) flip_bit(c);
  if (f.reorder) hold_back(c, now);
  enter_link(std::move(c), now);
  if (f.dup) {
    counters_.duplicated.fetch_add(1, std::memory_order_relaxed);
    enter_link(copy_of(d), now);
  }
}

void FaultyTransport::inject_direct(TxDatagram& d, Fate f, Clock::time_point now, Outgoing& o) {
  if (f.corrupt || f.reorder) {
    Copy c = copy_of(d);
    if (f.corrupt) flip_bit(c);
    if (f.reorder) {
      hold_back(c, now);
      hold(std::move(c));
    } else {
      o.send_copy(std::move(c));
    }
  } else {
    o.out.push_back(d);
  }
  if (f.dup) {
    o.send_copy(copy_of(d));
    counters_.duplicated.fetch_add(1, std::memory_order_relaxed);
  }
}

size_t FaultyTransport::send_burst(std::span<TxDatagram> burst) noexcept {
  try {
    std::lock_guard lock(mu_);
    auto now = Clock::now();
    Outgoing o(burst.size());
    for (TxDatagram& d : burst) {
      counters_.sent.fetch_add(1, std::memory_order_relaxed);
      Fate f = draw_fate();
      if (f.lost) {
        counters_.lost.fetch_add(1, std::memory_order_relaxed);
      } else if (spec_.slow_link()) {
        inject_slow_link(d, f, now);
      } else {
        inject_direct(d, f, now, o);
      }
    }
    if (!o.out.empty()) inner_->send_burst(o.out);
    release_due(now);
  } catch (...) {
    // Out of memory while copying: the burst counts as lost, as on a network.
  }
  return burst.size();
}

int FaultyTransport::timeout_for_held(int timeout_ms) const {
  // Wake up in time for the next held datagram.
  return held_.empty() ? timeout_ms : std::min(timeout_ms < 0 ? 1 : timeout_ms, 1);
}

void FaultyTransport::wait(int timeout_ms) noexcept {
  {
    std::lock_guard lock(mu_);
    timeout_ms = timeout_for_held(timeout_ms);
  }
  inner_->wait(timeout_ms);
}

size_t FaultyTransport::recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept {
  {
    std::lock_guard lock(mu_);
    try {
      release_due(Clock::now());
    } catch (...) {
    }
    timeout_ms = timeout_for_held(timeout_ms);
  }
  return inner_->recv_burst(out, timeout_ms);
}

}  // namespace uroce::transport
