// MrTable: registration, keys (slot reuse draws another variant, so stale keys
// fail), limits, bounds at both ends and against overflow, access flags, PD
// checks, and the registration range check.
#include "core/mr.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <vector>

#include "core/pd.h"

namespace uroce::core {
namespace {

constexpr unsigned LW = IBV_ACCESS_LOCAL_WRITE, RW = IBV_ACCESS_REMOTE_WRITE, RR = IBV_ACCESS_REMOTE_READ,
                   RA = IBV_ACCESS_REMOTE_ATOMIC;

class MrTableTest : public ::testing::Test {
 protected:
  MrTable table;
  Pd pd, other_pd;
  std::vector<uint8_t> buf = std::vector<uint8_t>(4096, 0);

  Mr* add(unsigned access, uint64_t iova = 0x10000, uint64_t len = 4096) {
    auto r = table.add(&pd, buf.data(), len, iova, access);
    EXPECT_TRUE(r.ok()) << r.err();
    return r.ok() ? *r : nullptr;
  }
};

// Expect a registered MR to report its keys/address/length and be findable by
// key.
TEST_F(MrTableTest, AddAndRemove) {
  Mr* mr = add(LW | RR | RW);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(mr->ibmr.lkey, mr->ibmr.rkey);
  EXPECT_NE(mr->ibmr.lkey, 0u);
  EXPECT_EQ(mr->ibmr.addr, buf.data());
  EXPECT_EQ(mr->ibmr.length, 4096u);
  EXPECT_EQ(mr->ibmr.pd, &pd.ibpd);
  EXPECT_EQ(pd.users.load(), 1);
  uint32_t key = mr->ibmr.rkey;
  EXPECT_EQ(table.check(key, &pd, 0x10000, 4096, RR, true), KeyCheck::kOk);
  EXPECT_EQ(table.remove(mr), 0);
  EXPECT_EQ(pd.users.load(), 0);
  EXPECT_EQ(table.check(key, &pd, 0x10000, 1, 0, true), KeyCheck::kBadKey);
}

// Expect two live MRs to get distinct keys; key 0 is never valid.
TEST_F(MrTableTest, DistinctKeysAndKeyZero) {
  Mr* a = add(LW);
  Mr* b = add(LW);
  EXPECT_NE(a->ibmr.lkey, b->ibmr.lkey);
  EXPECT_EQ(table.check(0, &pd, 0x10000, 1, 0, true), KeyCheck::kBadKey);
  EXPECT_EQ(table.check(0xFFFFFFFF, &pd, 0x10000, 1, 0, true), KeyCheck::kBadKey);
  EXPECT_EQ(table.remove(a), 0);
  EXPECT_EQ(table.remove(b), 0);
}

// Expect a key of a deregistered MR to fail even after its slot is reused.
TEST_F(MrTableTest, StaleKeyAfterSlotReuseFails) {
  Mr* a = add(LW | RR);
  uint32_t stale = a->ibmr.rkey;
  ASSERT_EQ(table.remove(a), 0);
  Mr* b = add(LW | RR);
  EXPECT_EQ(b->ibmr.rkey >> 8, stale >> 8) << "slot is expected to be reused";
  EXPECT_NE(b->ibmr.rkey, stale);
  EXPECT_EQ(table.check(stale, &pd, 0x10000, 1, RR, true), KeyCheck::kBadKey);
  EXPECT_EQ(table.check(b->ibmr.rkey, &pd, 0x10000, 1, RR, true), KeyCheck::kOk);
  EXPECT_EQ(table.remove(b), 0);
}

// Expect removing an MR twice (or one not in the table) to fail with EINVAL.
TEST_F(MrTableTest, RemoveUnknownIsEinval) {
  Mr* a = add(LW);
  Mr fake;
  fake.pd = &pd;
  fake.ibmr.lkey = a->ibmr.lkey;
  EXPECT_EQ(table.remove(&fake), EINVAL);
  EXPECT_EQ(table.remove(a), 0);
}

// Remote (iova) bounds: [iova, iova+len) exactly; one byte off either end
// fails.
TEST_F(MrTableTest, RemoteBoundsOffByOne) {
  Mr* mr = add(LW | RR, 0x10000, 4096);
  uint32_t k = mr->ibmr.rkey;
  EXPECT_EQ(table.check(k, &pd, 0x10000, 4096, RR, true), KeyCheck::kOk);
  EXPECT_EQ(table.check(k, &pd, 0x10000, 1, RR, true), KeyCheck::kOk);
  EXPECT_EQ(table.check(k, &pd, 0x10000 + 4095, 1, RR, true), KeyCheck::kOk);
  EXPECT_EQ(table.check(k, &pd, 0x10000 + 4096, 0, RR, true),
            KeyCheck::kOk);  // empty range at the end
  EXPECT_EQ(table.check(k, &pd, 0x10000 - 1, 1, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.check(k, &pd, 0x10000 - 1, 4096, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.check(k, &pd, 0x10000 + 4096, 1, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.check(k, &pd, 0x10000 + 1, 4096, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.check(k, &pd, 0x10000, 4097, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.remove(mr), 0);
}

// Expect va + len overflowing 64 bits to be out of bounds, not wrapped into
// range.
TEST_F(MrTableTest, BoundsOverflow) {
  Mr* mr = add(LW | RR, 0xFFFFFFFFFFFFF000ull, 4096);
  uint32_t k = mr->ibmr.rkey;
  EXPECT_EQ(table.check(k, &pd, 0xFFFFFFFFFFFFF000ull, 4096, RR, true), KeyCheck::kOk);
  EXPECT_EQ(table.check(k, &pd, 0xFFFFFFFFFFFFFFFFull, 1, RR, true), KeyCheck::kOk);
  EXPECT_EQ(table.check(k, &pd, 0xFFFFFFFFFFFFFFFFull, 2, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.check(k, &pd, 0xFFFFFFFFFFFFF001ull, UINT64_MAX, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.check(k, &pd, 0xFFFFFFFFFFFFF000ull, UINT64_MAX, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.check(k, &pd, 0, 1, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.remove(mr), 0);

  Mr* low = add(LW | RR, 0x1000, 4096);
  EXPECT_EQ(table.check(low->ibmr.rkey, &pd, 0x2000, UINT64_MAX - 0x1000, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.check(low->ibmr.rkey, &pd, 0x1800, UINT64_MAX, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.remove(low), 0);
}

// Local (lkey) semantics: va is the process address, not the iova.
TEST_F(MrTableTest, LocalBoundsUseHostAddress) {
  Mr* mr = add(LW, 0x10000, 4096);
  auto host = reinterpret_cast<uint64_t>(buf.data());
  uint32_t k = mr->ibmr.lkey;
  EXPECT_EQ(table.check(k, &pd, host, 4096, LW, false), KeyCheck::kOk);
  EXPECT_EQ(table.check(k, &pd, host + 4095, 1, LW, false), KeyCheck::kOk);
  EXPECT_EQ(table.check(k, &pd, host - 1, 1, LW, false), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.check(k, &pd, host + 4096, 1, LW, false), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.check(k, &pd, 0x10000, 1, LW, false),
            KeyCheck::kOutOfBounds);  // iova is not local
  EXPECT_EQ(table.remove(mr), 0);
}

// Expect with_range to call back with the host pointer for the iova, only on
// success.
TEST_F(MrTableTest, WithRangeMapsIovaToHost) {
  Mr* mr = add(LW | RW, 0x10000, 4096);
  uint8_t* seen = nullptr;
  EXPECT_EQ(
      table.with_range(mr->ibmr.rkey, &pd, 0x10000 + 100, 8, RW, true, 0, [&](const Mr&, uint8_t* p) { seen = p; }),
      KeyCheck::kOk);
  EXPECT_EQ(seen, buf.data() + 100);
  seen = nullptr;
  EXPECT_EQ(
      table.with_range(mr->ibmr.rkey, &pd, 0x10000 + 4090, 8, RW, true, 0, [&](const Mr&, uint8_t* p) { seen = p; }),
      KeyCheck::kOutOfBounds);
  EXPECT_EQ(seen, nullptr);
  EXPECT_EQ(table.remove(mr), 0);
}

// Registration rules: remote write/atomic need local write (EINVAL); unknown
// bits EINVAL.
TEST_F(MrTableTest, RegistrationAccessRules) {
  EXPECT_EQ(validate_mr_access(RW), EINVAL);
  EXPECT_EQ(validate_mr_access(RA), EINVAL);
  EXPECT_EQ(validate_mr_access(RR | RW), EINVAL);
  EXPECT_EQ(validate_mr_access(RR), 0);
  EXPECT_EQ(validate_mr_access(0), 0);
  EXPECT_EQ(validate_mr_access(LW | RW | RR | RA), 0);
  EXPECT_EQ(validate_mr_access(1u << 30), EINVAL);
  auto r = table.add(&pd, buf.data(), buf.size(), 0x10000, RW);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.err(), EINVAL);
  EXPECT_EQ(pd.users.load(), 0);
  auto z = table.add(&pd, nullptr, 16, 0, LW);  // NULL address with a length
  EXPECT_FALSE(z.ok());
  EXPECT_EQ(z.err(), EINVAL);
}

// Expect a missing access flag to give kNoPermission (after key and bounds
// pass).
TEST_F(MrTableTest, MissingAccessFlagIsNoPermission) {
  Mr* mr = add(LW | RW);
  uint32_t k = mr->ibmr.rkey;
  EXPECT_EQ(table.check(k, &pd, 0x10000, 16, RR, true), KeyCheck::kNoPermission);
  EXPECT_EQ(table.check(k, &pd, 0x10000, 16, RA, true), KeyCheck::kNoPermission);
  EXPECT_EQ(table.check(k, &pd, 0x10000, 16, RW, true), KeyCheck::kOk);
  EXPECT_EQ(table.check(k, &pd, 0x10000, 16, RW | RR, true), KeyCheck::kNoPermission);
  EXPECT_EQ(table.remove(mr), 0);
  Mr* ro = add(RR);
  EXPECT_EQ(table.check(ro->ibmr.rkey, &pd, 0x10000, 16, RW, true), KeyCheck::kNoPermission);
  EXPECT_EQ(table.check(ro->ibmr.lkey, &pd, reinterpret_cast<uint64_t>(buf.data()), 16, LW, false),
            KeyCheck::kNoPermission);
  EXPECT_EQ(table.check(ro->ibmr.lkey, &pd, reinterpret_cast<uint64_t>(buf.data()), 16, 0, false), KeyCheck::kOk);
  EXPECT_EQ(table.remove(ro), 0);
}

// Expect an MR of another PD to be rejected; a null PD skips the PD check.
TEST_F(MrTableTest, PdMismatch) {
  Mr* mr = add(LW | RR);
  EXPECT_EQ(table.check(mr->ibmr.rkey, &other_pd, 0x10000, 16, RR, true), KeyCheck::kPdMismatch);
  EXPECT_EQ(table.check(mr->ibmr.rkey, nullptr, 0x10000, 16, RR, true), KeyCheck::kOk);
  EXPECT_EQ(table.remove(mr), 0);
}

// Expect a zero-length MR to be registrable and to contain only empty ranges.
TEST_F(MrTableTest, ZeroLengthMr) {
  auto r = table.add(&pd, buf.data(), 0, 0x5000, LW | RR);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(table.check((*r)->ibmr.rkey, &pd, 0x5000, 0, RR, true), KeyCheck::kOk);
  EXPECT_EQ(table.check((*r)->ibmr.rkey, &pd, 0x5000, 1, RR, true), KeyCheck::kOutOfBounds);
  EXPECT_EQ(table.remove(*r), 0);
}

// Expect every re-registration that reuses a slot to get another variant
// (the low 8 bits), for MRs and windows, and never key 0.
TEST_F(MrTableTest, KeyVariantChangesOnSlotReuse) {
  Mr* mr = add(LW);
  uint32_t prev = mr->ibmr.lkey;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(table.remove(mr), 0);
    mr = add(LW);
    ASSERT_NE(mr, nullptr);
    ASSERT_EQ(mr->ibmr.lkey >> 8, prev >> 8) << "slot is expected to be reused";
    ASSERT_NE(mr->ibmr.lkey & 0xFF, prev & 0xFF) << "same variant on reuse, round " << i;
    ASSERT_NE(mr->ibmr.lkey, 0u);
    prev = mr->ibmr.lkey;
  }
  ASSERT_EQ(table.remove(mr), 0);
  // A window reusing the slot avoids the variant the slot had last.
  auto w = table.add_window(&pd, IBV_MW_TYPE_2);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->ibmw.rkey >> 8, prev >> 8);
  EXPECT_NE((*w)->ibmw.rkey & 0xFF, prev & 0xFF);
  EXPECT_EQ(table.remove(*w), 0);
}

// Expect the variants of a slot to use many of the 255 values (random, not a
// counter starting at 1): 1000 reuses hit more than 200 distinct values.
TEST_F(MrTableTest, KeyVariantsSpreadOverTheByte) {
  std::vector<bool> seen(256, false);
  int distinct = 0;
  for (int i = 0; i < 1000; ++i) {
    Mr* mr = add(LW);
    ASSERT_NE(mr, nullptr);
    uint32_t v = mr->ibmr.lkey & 0xFF;
    if (!seen[v]) ++distinct;
    seen[v] = true;
    ASSERT_EQ(table.remove(mr), 0);
  }
  EXPECT_GT(distinct, 200);
}

// Expect max_mr MRs and max_mw windows, then ENOMEM; after a removal the
// table accepts one again.
TEST(MrTableLimits, MrsAndWindowsStopAtTheirLimits) {
  MrTable table(2, 1);
  Pd pd;
  std::vector<uint8_t> buf(64);
  auto a = table.add(&pd, buf.data(), buf.size(), 0, LW);
  auto b = table.add(&pd, buf.data(), buf.size(), 0, LW);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = table.add(&pd, buf.data(), buf.size(), 0, LW);
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.err(), ENOMEM);
  auto w = table.add_window(&pd, IBV_MW_TYPE_1);
  ASSERT_TRUE(w.ok());
  auto w2 = table.add_window(&pd, IBV_MW_TYPE_2);
  EXPECT_FALSE(w2.ok());
  EXPECT_EQ(w2.err(), ENOMEM);
  EXPECT_EQ(pd.users.load(), 3);
  ASSERT_EQ(table.remove(*a), 0);
  auto d = table.add(&pd, buf.data(), buf.size(), 0, LW);
  EXPECT_TRUE(d.ok());
  ASSERT_EQ(table.remove(*w), 0);
  auto w3 = table.add_window(&pd, IBV_MW_TYPE_2);
  EXPECT_TRUE(w3.ok());
  EXPECT_EQ(table.remove(*b), 0);
  EXPECT_EQ(table.remove(*d), 0);
  EXPECT_EQ(table.remove(*w3), 0);
  EXPECT_EQ(pd.users.load(), 0);
}

// Registration checks the range as the kernel's pinning: wrap -> EINVAL (ODP
// too), unmapped or PROT_NONE -> EFAULT, read-only with write access ->
// EFAULT; ODP skips the mapping check.
TEST(MrRange, AsTheKernelPins) {
  const size_t pg = size_t(sysconf(_SC_PAGESIZE));
  auto* p = static_cast<uint8_t*>(mmap(nullptr, 3 * pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(mprotect(p + 2 * pg, pg, PROT_NONE), 0);
  EXPECT_EQ(validate_mr_range(p, 2 * pg, 0), 0);
  EXPECT_EQ(validate_mr_range(p, 2 * pg, RR), 0);
  EXPECT_EQ(validate_mr_range(p, 2 * pg, LW), EFAULT);
  EXPECT_EQ(validate_mr_range(p, 2 * pg, LW | RW), EFAULT);
  EXPECT_EQ(validate_mr_range(p, 2 * pg, IBV_ACCESS_MW_BIND), EFAULT);
  EXPECT_EQ(validate_mr_range(p, 3 * pg, 0), EFAULT);  // the PROT_NONE page
  EXPECT_EQ(validate_mr_range(p, 3 * pg, IBV_ACCESS_ON_DEMAND | LW), 0);
  ASSERT_EQ(munmap(p + 2 * pg, pg), 0);
  EXPECT_EQ(validate_mr_range(p + 2 * pg, 16, 0), EFAULT);  // unmapped
  EXPECT_EQ(validate_mr_range(p + 2 * pg, 16, IBV_ACCESS_ON_DEMAND), 0);
  auto* top = reinterpret_cast<void*>(UINTPTR_MAX - pg + 1);
  EXPECT_EQ(validate_mr_range(top, 2 * pg, 0), EINVAL);
  EXPECT_EQ(validate_mr_range(top, 2 * pg, IBV_ACCESS_ON_DEMAND), EINVAL);
  EXPECT_EQ(validate_mr_range(reinterpret_cast<void*>(UINTPTR_MAX - 100), 50, 0), EINVAL);  // last page
  EXPECT_EQ(validate_mr_range(p, 0, LW), 0);                                                // empty range
  // Through the table: nothing is registered, the PD is not used.
  MrTable table;
  Pd pd;
  auto r = table.add(&pd, p, pg, 0, LW);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.err(), EFAULT);
  EXPECT_EQ(pd.users.load(), 0);
  munmap(p, 2 * pg);
}

}  // namespace
}  // namespace uroce::core
