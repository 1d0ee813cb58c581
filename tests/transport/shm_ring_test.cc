// ShmRing: records come out whole and in order across the wrap, a full ring
// refuses, a second process streams through it, an earlier ring's records in
// the same memory are not taken, and a corrupted shared word or record length
// stops the side that sees it without a read or write outside the ring.
#include "transport/shm_ring.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace uroce::transport {
namespace {

constexpr size_t kBytes = ShmRing::kHeaderBytes + 16384;

std::vector<uint8_t> record_bytes(uint32_t seq, uint32_t len) {
  std::vector<uint8_t> v(len);
  for (uint32_t i = 0; i < len; ++i) v[i] = uint8_t(seq * 31 + i);
  return v;
}

bool push_one(ShmRing& r, uint32_t seq, uint32_t len) {
  std::vector<uint8_t> v = record_bytes(seq, len);
  const uint8_t* parts[2] = {v.data(), v.data() + len / 2};
  uint32_t lens[2] = {len / 2, len - len / 2};
  ShmRing::Meta m{seq, ~seq, uint16_t(seq), uint16_t(len), uint16_t(seq * 3), 0};
  return r.push(m, parts, lens, 2);
}

struct Mem {
  std::vector<uint64_t> words = std::vector<uint64_t>(kBytes / 8 + 1, 0);
  void* p() { return words.data(); }
};

TEST(ShmRing, RecordsComeOutWholeAndInOrderAcrossTheWrap) {
  Mem mem;
  ShmRing prod = ShmRing::create(mem.p(), kBytes);
  ShmRing cons = ShmRing::attach(mem.p(), kBytes);
  ASSERT_TRUE(prod.valid());
  ASSERT_TRUE(cons.valid());
  uint32_t next_in = 0, next_out = 0;
  for (int round = 0; round < 2000; ++round) {
    // A few records of varying sizes in, then most of them out.
    for (int k = 0; k < 3; ++k) {
      uint32_t len = (next_in * 977) % 3000;
      if (!push_one(prod, next_in, len)) break;
      ++next_in;
    }
    ShmRing::Record rec;
    while (next_out + (round % 3 == 0 ? 0 : 1) < next_in && cons.peek(&rec)) {
      uint32_t len = (next_out * 977) % 3000;
      ASSERT_EQ(rec.len, len) << next_out;
      ASSERT_EQ(rec.meta.src_ip, next_out);
      ASSERT_EQ(rec.meta.dst_ip, ~next_out);
      ASSERT_EQ(rec.meta.dst_port, uint16_t(len));
      ASSERT_EQ(rec.meta.ip_id, uint16_t(next_out * 3));
      ASSERT_EQ(std::vector<uint8_t>(rec.data, rec.data + rec.len), record_bytes(next_out, len)) << next_out;
      cons.pop();
      ++next_out;
    }
  }
  EXPECT_GT(next_out, 4000u);  // many times round the 16 KiB ring
  EXPECT_FALSE(prod.corrupt());
  EXPECT_FALSE(cons.corrupt());
}

// Records written in place (reserve, publish) between pushed ones, some
// reservations dropped unpublished, round the ring many times / Expect the
// published ones out whole and in order, the dropped ones never.
TEST(ShmRing, ReservedRecordsAppearOnlyWhenPublished) {
  Mem mem;
  ShmRing prod = ShmRing::create(mem.p(), kBytes);
  ShmRing cons = ShmRing::attach(mem.p(), kBytes);
  uint32_t next_in = 0, next_out = 0;
  ShmRing::Record rec;
  for (int round = 0; round < 3000; ++round) {
    uint32_t len = (next_in * 613) % 2000;
    ShmRing::Meta m{next_in, ~next_in, uint16_t(next_in), uint16_t(len), uint16_t(next_in * 3), 0};
    if (round % 5 == 0) {
      uint8_t* p = prod.reserve(m, 999);  // dropped: its room goes to the next record
      ASSERT_NE(p, nullptr);
      std::memset(p, 0xAB, 999);
      EXPECT_FALSE(cons.peek(&rec) && rec.len == 999);
    }
    uint8_t* p = prod.reserve(m, len);
    ASSERT_NE(p, nullptr) << round;
    std::vector<uint8_t> v = record_bytes(next_in, len);
    if (len) std::memcpy(p, v.data(), len);
    if (round % 2) {
      prod.publish();
    } else {  // the same through push, which reserves and publishes
      ASSERT_TRUE(push_one(prod, next_in, len));
    }
    ++next_in;
    while (cons.peek(&rec)) {
      uint32_t want = (next_out * 613) % 2000;
      ASSERT_EQ(rec.len, want) << next_out;
      ASSERT_EQ(rec.meta.src_ip, next_out);
      ASSERT_EQ(std::vector<uint8_t>(rec.data, rec.data + rec.len), record_bytes(next_out, want)) << next_out;
      cons.pop();
      ++next_out;
    }
  }
  EXPECT_EQ(next_out, next_in);
  EXPECT_GT(next_out * 1000u, 20u * kBytes);  // round the ring many times
  EXPECT_FALSE(cons.corrupt());
}

// A reservation larger than max_record, or on a full ring / Expect null.
TEST(ShmRing, ReserveRefusesWhatPushWould) {
  Mem mem;
  ShmRing prod = ShmRing::create(mem.p(), kBytes);
  EXPECT_EQ(prod.reserve(ShmRing::Meta{}, prod.max_record() + 1), nullptr);
  unsigned n = 0;
  while (prod.reserve(ShmRing::Meta{}, 1000)) {
    prod.publish();
    ++n;
  }
  EXPECT_GT(n, 10u);
  EXPECT_FALSE(prod.corrupt());
}

TEST(ShmRing, FullRingRefusesUntilTheConsumerFrees) {
  Mem mem;
  ShmRing prod = ShmRing::create(mem.p(), kBytes);
  ShmRing cons = ShmRing::attach(mem.p(), kBytes);
  uint32_t n = 0;
  while (push_one(prod, n, 1000)) ++n;
  EXPECT_GE(n, 14u);
  EXPECT_LE(n, 16u);
  EXPECT_FALSE(push_one(prod, n, 1000));
  EXPECT_FALSE(push_one(prod, 0, prod.max_record() + 1));  // never fits
  ShmRing::Record rec;
  ASSERT_TRUE(cons.peek(&rec));
  cons.pop();
  EXPECT_TRUE(push_one(prod, n, 1000));
}

TEST(ShmRing, AttachChecksTheLayout) {
  Mem mem;
  EXPECT_FALSE(ShmRing::attach(mem.p(), kBytes).valid());  // never created
  ASSERT_TRUE(ShmRing::create(mem.p(), kBytes).valid());
  EXPECT_FALSE(ShmRing::attach(mem.p(), kBytes + 4096).valid());  // another size
  EXPECT_TRUE(ShmRing::attach(mem.p(), kBytes).valid());
}

// A peer that scribbles over the shared words: a record whose length does
// not fit stops the consumer; nothing outside the ring is read (ASan would
// see it). The head is not the consumer's guide (the stamps are): one that
// claims a megabyte changes nothing it takes.
TEST(ShmRing, CorruptRecordStopsTheConsumer) {
  Mem mem;
  ShmRing prod = ShmRing::create(mem.p(), kBytes);
  ShmRing cons = ShmRing::attach(mem.p(), kBytes);
  ASSERT_TRUE(push_one(prod, 1, 100));
  uint32_t huge = 16000;  // the record's length word, after its 8-byte stamp
  std::memcpy(static_cast<uint8_t*>(mem.p()) + ShmRing::kHeaderBytes + 8, &huge, 4);
  ShmRing::Record rec;
  EXPECT_FALSE(cons.peek(&rec));
  EXPECT_TRUE(cons.corrupt());

  Mem mem2;
  ShmRing prod2 = ShmRing::create(mem2.p(), kBytes);
  ShmRing cons2 = ShmRing::attach(mem2.p(), kBytes);
  ASSERT_TRUE(push_one(prod2, 1, 100));
  auto* head = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(mem2.p()) + 64);
  *head += 1u << 20;  // claims a megabyte
  ASSERT_TRUE(cons2.peek(&rec));
  EXPECT_EQ(std::vector<uint8_t>(rec.data, rec.data + rec.len), record_bytes(1, 100));
  cons2.pop();
  EXPECT_FALSE(cons2.peek(&rec));
  EXPECT_FALSE(cons2.corrupt());
}

// A ring created again over memory that held one (a stamp names the position
// under the ring's key) / Expect none of the earlier records, then the new
// ones whole.
TEST(ShmRing, AnEarlierRingsRecordsAreNotTaken) {
  Mem mem;
  ShmRing old_prod = ShmRing::create(mem.p(), kBytes);
  for (uint32_t i = 0; i < 10; ++i) ASSERT_TRUE(push_one(old_prod, i, 500));
  ShmRing prod = ShmRing::create(mem.p(), kBytes);
  ShmRing cons = ShmRing::attach(mem.p(), kBytes);
  ShmRing::Record rec;
  EXPECT_FALSE(cons.peek(&rec));
  ASSERT_TRUE(push_one(prod, 77, 300));
  ASSERT_TRUE(cons.peek(&rec));
  EXPECT_EQ(rec.meta.src_ip, 77u);
  EXPECT_EQ(std::vector<uint8_t>(rec.data, rec.data + rec.len), record_bytes(77, 300));
  cons.pop();
  EXPECT_FALSE(cons.peek(&rec));
  EXPECT_FALSE(cons.corrupt());
}

// Records pushed with align_at put that byte on a cache line, across the
// wrap too, and come out unchanged; a pad word of a line or more (a peer's
// scribble) stops the consumer.
TEST(ShmRing, AlignedRecordsPutTheChosenByteOnALine) {
  Mem mem;
  ShmRing prod = ShmRing::create(mem.p(), kBytes);
  ShmRing cons = ShmRing::attach(mem.p(), kBytes);
  for (uint32_t seq = 0; seq < 40; ++seq) {
    std::vector<uint8_t> v = record_bytes(seq, 1000 + seq);
    const uint8_t* parts[1] = {v.data()};
    uint32_t lens[1] = {uint32_t(v.size())};
    ASSERT_TRUE(prod.push(ShmRing::Meta{}, parts, lens, 1, 28));
    ShmRing::Record rec;
    ASSERT_TRUE(cons.peek(&rec));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(rec.data + 28) % ShmRing::kLineBytes, 0u) << seq;
    ASSERT_EQ(rec.len, v.size());
    EXPECT_TRUE(std::equal(v.begin(), v.end(), rec.data));
    cons.pop();
  }

  Mem mem2;
  ShmRing prod2 = ShmRing::create(mem2.p(), kBytes);
  ShmRing cons2 = ShmRing::attach(mem2.p(), kBytes);
  ASSERT_TRUE(push_one(prod2, 1, 100));
  uint32_t pad = ShmRing::kLineBytes;  // the record's pad word, after its stamp and length
  std::memcpy(static_cast<uint8_t*>(mem2.p()) + ShmRing::kHeaderBytes + 12, &pad, 4);
  ShmRing::Record rec;
  EXPECT_FALSE(cons2.peek(&rec));
  EXPECT_TRUE(cons2.corrupt());
}

TEST(ShmRing, CorruptTailStopsTheProducer) {
  Mem mem;
  ShmRing prod = ShmRing::create(mem.p(), kBytes);
  auto* tail = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(mem.p()) + 128);
  *tail = 4096;  // consumed more than was produced
  EXPECT_FALSE(push_one(prod, 1, 100));
  EXPECT_TRUE(prod.corrupt());
}

// The producer reads the tail only when the tail it read last leaves too
// little room: a tail corrupted later is seen when the ring seems full, and
// nothing is written over records the consumer may still read meanwhile.
TEST(ShmRing, CorruptTailIsSeenWhenTheProducerNeedsRoom) {
  Mem mem;
  ShmRing prod = ShmRing::create(mem.p(), kBytes);
  ShmRing cons = ShmRing::attach(mem.p(), kBytes);
  ASSERT_TRUE(push_one(prod, 0, 1000));
  ShmRing::Record rec;
  ASSERT_TRUE(cons.peek(&rec));
  cons.pop();
  auto* tail = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(mem.p()) + 128);
  *tail = 1;  // not 8-aligned
  uint32_t n = 1;
  while (push_one(prod, n, 1000)) ++n;
  EXPECT_LE(n, 17u);  // at most the room the consumer had made
  EXPECT_TRUE(prod.corrupt());
}

TEST(ShmRing, EmptyIsSeenByTheConsumer) {
  Mem mem;
  ShmRing prod = ShmRing::create(mem.p(), kBytes);
  ShmRing cons = ShmRing::attach(mem.p(), kBytes);
  EXPECT_TRUE(cons.empty_seq_cst());
  ASSERT_TRUE(push_one(prod, 1, 10));
  EXPECT_FALSE(cons.empty_seq_cst());
}

// A child process produces 200,000 records into shared memory; the parent
// consumes and checks every one (bounded: 20 s).
TEST(ShmRing, SecondProcessStreamsThrough) {
  size_t bytes = ShmRing::kHeaderBytes + (1 << 20);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  ShmRing cons = ShmRing::create(mem, bytes);
  constexpr uint32_t kRecords = 200000;
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ShmRing prod = ShmRing::attach(mem, bytes);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (uint32_t i = 0; i < kRecords && std::chrono::steady_clock::now() < deadline;)
      if (push_one(prod, i, 64 + i % 1500)) ++i;
    _exit(prod.corrupt() ? 1 : 0);
  }
  uint32_t got = 0;
  bool same = true;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  ShmRing::Record rec;
  while (got < kRecords && std::chrono::steady_clock::now() < deadline) {
    if (!cons.peek(&rec)) continue;
    same = same && rec.len == 64 + got % 1500 && std::memcmp(rec.data, record_bytes(got, rec.len).data(), rec.len) == 0;
    cons.pop();
    ++got;
  }
  int status = 0;
  waitpid(child, &status, 0);
  munmap(mem, bytes);
  EXPECT_EQ(got, kRecords);
  EXPECT_TRUE(same);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace uroce::transport
