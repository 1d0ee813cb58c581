// core::check_modify_mask against roce-facts.md §6.2 (legal transitions) and
// §6.3 (required/optional masks), written out independently here.
#include "core/qp_attr_rules.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <map>
#include <utility>
#include <vector>

namespace uroce::core {
namespace {

constexpr int STATE = IBV_QP_STATE, CUR = IBV_QP_CUR_STATE, SQD_NOTIFY = IBV_QP_EN_SQD_ASYNC_NOTIFY,
              ACCESS = IBV_QP_ACCESS_FLAGS, PKEY = IBV_QP_PKEY_INDEX, PORT = IBV_QP_PORT, QKEY = IBV_QP_QKEY,
              AV = IBV_QP_AV, MTU = IBV_QP_PATH_MTU, TMO = IBV_QP_TIMEOUT, RETRY = IBV_QP_RETRY_CNT,
              RNRR = IBV_QP_RNR_RETRY, RQPSN = IBV_QP_RQ_PSN, RD = IBV_QP_MAX_QP_RD_ATOMIC, ALT = IBV_QP_ALT_PATH,
              RNRT = IBV_QP_MIN_RNR_TIMER, SQPSN = IBV_QP_SQ_PSN, DRD = IBV_QP_MAX_DEST_RD_ATOMIC,
              MIG = IBV_QP_PATH_MIG_STATE, CAP = IBV_QP_CAP, DQPN = IBV_QP_DEST_QPN, RATE = IBV_QP_RATE_LIMIT;

// §6.1 mask bit values.
static_assert(STATE == 1 << 0 && CUR == 1 << 1 && SQD_NOTIFY == 1 << 2 && ACCESS == 1 << 3 && PKEY == 1 << 4 &&
                  PORT == 1 << 5 && QKEY == 1 << 6 && AV == 1 << 7 && MTU == 1 << 8 && TMO == 1 << 9 &&
                  RETRY == 1 << 10 && RNRR == 1 << 11 && RQPSN == 1 << 12 && RD == 1 << 13 && ALT == 1 << 14 &&
                  RNRT == 1 << 15 && SQPSN == 1 << 16 && DRD == 1 << 17 && MIG == 1 << 18 && CAP == 1 << 19 &&
                  DQPN == 1 << 20 && RATE == 1 << 25,
              "roce-facts §6.1");

// Every attribute bit a mask may carry.
const std::vector<int> kAllBits = {CUR,   SQD_NOTIFY, ACCESS, PKEY, PORT,  QKEY, AV,  MTU, TMO,  RETRY, RNRR,
                                   RQPSN, RD,         ALT,    RNRT, SQPSN, DRD,  MIG, CAP, DQPN, RATE};

const ibv_qp_state kStates[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
                                IBV_QPS_SQD,   IBV_QPS_SQE,  IBV_QPS_ERR};
const ibv_qp_type kTypes[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};

struct Masks {
  int req;
  int opt;
  bool opt_exact;  // the facts sheet gives the optional set completely
};

// Legal transitions of §6.2 and the masks of §6.3 (SQD→RTS, SQE→RTS and
// SQD→SQD are in the kernel table; their optional sets are checked only in
// part).
std::map<std::pair<ibv_qp_state, ibv_qp_state>, Masks> legal(ibv_qp_type t) {
  bool rc = t == IBV_QPT_RC, ud = t == IBV_QPT_UD;
  std::map<std::pair<ibv_qp_state, ibv_qp_state>, Masks> m;
  for (ibv_qp_state s : kStates) {
    m[{s, IBV_QPS_RESET}] = {0, 0, true};
    if (s != IBV_QPS_RESET) m[{s, IBV_QPS_ERR}] = {0, 0, true};
  }
  m[{IBV_QPS_RESET, IBV_QPS_INIT}] = {ud ? PKEY | PORT | QKEY : PKEY | PORT | ACCESS, 0, true};
  m[{IBV_QPS_INIT, IBV_QPS_INIT}] = {0, ud ? PKEY | PORT | QKEY : PKEY | PORT | ACCESS, true};
  m[{IBV_QPS_INIT, IBV_QPS_RTR}] = {ud   ? 0
                                    : rc ? AV | MTU | DQPN | RQPSN | DRD | RNRT
                                         : AV | MTU | DQPN | RQPSN,
                                    ud ? PKEY | QKEY : ALT | ACCESS | PKEY, true};
  m[{IBV_QPS_RTR, IBV_QPS_RTS}] = {rc ? SQPSN | TMO | RETRY | RNRR | RD : SQPSN,
                                   ud   ? CUR | QKEY
                                   : rc ? CUR | ALT | ACCESS | RNRT | MIG
                                        : CUR | ALT | ACCESS | MIG,
                                   true};
  m[{IBV_QPS_RTS, IBV_QPS_RTS}] = {0,
                                   ud   ? CUR | QKEY
                                   : rc ? CUR | ACCESS | ALT | MIG | RNRT
                                        : CUR | ACCESS | ALT | MIG,
                                   true};
  m[{IBV_QPS_RTS, IBV_QPS_SQD}] = {0, SQD_NOTIFY, true};
  m[{IBV_QPS_SQD, IBV_QPS_RTS}] = {0, ud ? CUR | QKEY : CUR | ALT | ACCESS | MIG, false};
  m[{IBV_QPS_SQD, IBV_QPS_SQD}] = {0, ud ? PKEY | QKEY : ALT | ACCESS | PKEY | MIG, false};
  m[{IBV_QPS_SQE, IBV_QPS_RTS}] = {0, ud ? CUR | QKEY : CUR | ACCESS, false};
  return m;
}

int check(ibv_qp_type t, ibv_qp_state cur, ibv_qp_state next, int mask) {
  return check_modify_mask(t, cur, next, mask);
}

std::string where(ibv_qp_type t, ibv_qp_state cur, ibv_qp_state next, int mask) {
  const char* tn = t == IBV_QPT_RC ? "RC" : t == IBV_QPT_UC ? "UC" : "UD";
  return std::string(tn) + " " + qp_state_name(cur) + "->" + qp_state_name(next) + " mask 0x" + [&] {
    char b[16];
    std::snprintf(b, sizeof b, "%x", unsigned(mask));
    return std::string(b);
  }();
}

// Expect every legal transition with exactly its required mask to pass.
TEST(QpAttrRules, LegalTransitionWithExactlyRequiredMaskPasses) {
  for (ibv_qp_type t : kTypes)
    for (auto& [tr, m] : legal(t))
      EXPECT_EQ(check(t, tr.first, tr.second, STATE | m.req), 0) << where(t, tr.first, tr.second, STATE | m.req);
}

// Expect each missing required bit to give EINVAL.
TEST(QpAttrRules, EachMissingRequiredBitIsEinval) {
  int checked = 0;
  for (ibv_qp_type t : kTypes)
    for (auto& [tr, m] : legal(t))
      for (int b : kAllBits) {
        if (!(m.req & b)) continue;
        int mask = (STATE | m.req) & ~b;
        EXPECT_EQ(check(t, tr.first, tr.second, mask), EINVAL) << where(t, tr.first, tr.second, mask);
        ++checked;
      }
  EXPECT_EQ(checked, 3 + 3 + 3 + 6 + 4 + 0 + 5 + 1 + 1);  // RESET→INIT ×3, INIT→RTR 6+4, RTR→RTS 5+1+1
}

// Expect each optional bit to be accepted on top of the required ones.
TEST(QpAttrRules, EachOptionalBitPasses) {
  for (ibv_qp_type t : kTypes)
    for (auto& [tr, m] : legal(t))
      for (int b : kAllBits) {
        if (!(m.opt & b)) continue;
        int mask = STATE | m.req | b;
        EXPECT_EQ(check(t, tr.first, tr.second, mask), 0) << where(t, tr.first, tr.second, mask);
      }
}

// Expect any bit outside required ∪ optional ∪ STATE to give EINVAL.
TEST(QpAttrRules, ExtraNonOptionalBitIsEinval) {
  for (ibv_qp_type t : kTypes)
    for (auto& [tr, m] : legal(t)) {
      if (!m.opt_exact) continue;
      for (int b : kAllBits) {
        if ((m.req | m.opt) & b) continue;
        int mask = STATE | m.req | b;
        EXPECT_EQ(check(t, tr.first, tr.second, mask), EINVAL) << where(t, tr.first, tr.second, mask);
      }
    }
}

// Expect every transition not in the §6.2 table to give EINVAL whatever the
// mask.
TEST(QpAttrRules, IllegalTransitionsAreEinval) {
  int all = 0;
  for (int b : kAllBits) all |= b;
  for (ibv_qp_type t : kTypes) {
    auto m = legal(t);
    for (ibv_qp_state cur : kStates)
      for (ibv_qp_state next : kStates) {
        if (m.count({cur, next})) continue;
        std::vector<int> masks = {STATE, STATE | all};
        for (auto& [tr, x] : m) masks.push_back(STATE | x.req);
        for (int mask : masks) EXPECT_EQ(check(t, cur, next, mask), EINVAL) << where(t, cur, next, mask);
      }
  }
}

// Named cases from the brief and §6.2.
TEST(QpAttrRules, NamedIllegalTransitions) {
  const int rtr_rc = STATE | AV | MTU | DQPN | RQPSN | DRD | RNRT;
  const int rts_rc = STATE | SQPSN | TMO | RETRY | RNRR | RD;
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_RTR, rtr_rc), EINVAL);
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTS, rts_rc), EINVAL);
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_INIT, STATE), EINVAL);
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTR, STATE), EINVAL);
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_ERR, IBV_QPS_RTS, rts_rc), EINVAL);
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_ERR, IBV_QPS_INIT, STATE | PKEY | PORT | ACCESS), EINVAL);
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_SQE, STATE),
            EINVAL);  // SQE is entered by the QP only
  EXPECT_EQ(check(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTS, STATE | SQPSN), EINVAL);
  // RESET→ERR is not in the kernel table.
  for (ibv_qp_type t : kTypes) EXPECT_EQ(check(t, IBV_QPS_RESET, IBV_QPS_ERR, STATE), EINVAL);
  // …while every other state may go to ERR and to RESET.
  for (ibv_qp_state s : kStates) {
    EXPECT_EQ(check(IBV_QPT_RC, s, IBV_QPS_RESET, STATE), 0) << qp_state_name(s);
    if (s != IBV_QPS_RESET) {
      EXPECT_EQ(check(IBV_QPT_RC, s, IBV_QPS_ERR, STATE), 0) << qp_state_name(s);
    }
  }
}

// Expect CUR_STATE to be accepted only when the current state is
// RTR/RTS/SQD/SQE (and only where the transition lists it as optional).
TEST(QpAttrRules, CurStateOnlyFromRtrRtsSqdSqe) {
  for (ibv_qp_type t : kTypes) {
    auto m = legal(t);
    // From RESET/INIT/ERR: rejected even where every other bit is right.
    EXPECT_EQ(check(t, IBV_QPS_RESET, IBV_QPS_INIT, STATE | CUR | m[{IBV_QPS_RESET, IBV_QPS_INIT}].req), EINVAL);
    EXPECT_EQ(check(t, IBV_QPS_INIT, IBV_QPS_INIT, STATE | CUR), EINVAL);
    EXPECT_EQ(check(t, IBV_QPS_INIT, IBV_QPS_RTR, STATE | CUR | m[{IBV_QPS_INIT, IBV_QPS_RTR}].req), EINVAL);
    EXPECT_EQ(check(t, IBV_QPS_ERR, IBV_QPS_RESET, STATE | CUR), EINVAL);
    EXPECT_EQ(check(t, IBV_QPS_INIT, IBV_QPS_INIT, CUR),
              EINVAL);  // without STATE too
    // From RTR/RTS/SQD/SQE: accepted on the transitions to RTS.
    EXPECT_EQ(check(t, IBV_QPS_RTR, IBV_QPS_RTS, STATE | CUR | m[{IBV_QPS_RTR, IBV_QPS_RTS}].req), 0);
    EXPECT_EQ(check(t, IBV_QPS_RTS, IBV_QPS_RTS, STATE | CUR), 0);
    EXPECT_EQ(check(t, IBV_QPS_RTS, IBV_QPS_RTS, CUR),
              0);  // STATE absent: stays in RTS
    EXPECT_EQ(check(t, IBV_QPS_SQD, IBV_QPS_RTS, STATE | CUR), 0);
    EXPECT_EQ(check(t, IBV_QPS_SQE, IBV_QPS_RTS, STATE | CUR), 0);
  }
}

// Expect a mask without STATE to be a modify within the current state.
TEST(QpAttrRules, MaskWithoutStateStaysInCurrentState) {
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RESET, ACCESS),
            0);  // next ignored: RTS→RTS
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, RNRT | MIG), 0);
  EXPECT_EQ(check(IBV_QPT_UC, IBV_QPS_RTS, IBV_QPS_RTS, RNRT),
            EINVAL);  // UC: no MIN_RNR_TIMER
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_INIT, PORT), 0);
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_RESET, ACCESS), EINVAL);
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_RESET, 0), 0);
  EXPECT_EQ(check(IBV_QPT_RC, IBV_QPS_ERR, IBV_QPS_ERR, ACCESS), EINVAL);
}

// Expect the transition_rule accessor to agree with the table, and unknown
// QP types / states to be invalid.
TEST(QpAttrRules, TransitionRuleAccessor) {
  TransitionRule r = transition_rule(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR);
  EXPECT_TRUE(r.valid);
  EXPECT_EQ(r.required, AV | MTU | DQPN | RQPSN | DRD | RNRT);
  EXPECT_EQ(r.optional, ALT | ACCESS | PKEY);
  EXPECT_FALSE(transition_rule(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_ERR).valid);
  EXPECT_FALSE(transition_rule(IBV_QPT_RAW_PACKET, IBV_QPS_RESET, IBV_QPS_INIT).valid);
  EXPECT_FALSE(transition_rule(IBV_QPT_RC, ibv_qp_state(9), IBV_QPS_INIT).valid);
  EXPECT_EQ(check_modify_mask(IBV_QPT_RC, IBV_QPS_UNKNOWN, IBV_QPS_RESET, STATE), EINVAL);
  EXPECT_STREQ(qp_state_name(IBV_QPS_SQE), "SQE");
  EXPECT_STREQ(qp_state_name(ibv_qp_state(42)), "UNKNOWN");
}

// The kernel's uverbs drops, before its checks, what an XRC QP has no use for
// (uverbs_cmd.c, modify_qp_mask): an initiator's responder attributes, a
// target's requester ones. perftest -c XRC passes them in every RTR and RTS.
TEST(QpAttrRules, XrcIgnoredAttributesAreDroppedBeforeTheCheck) {
  int ini_rtr = STATE | AV | MTU | DQPN | RQPSN | DRD | RNRT;
  EXPECT_EQ(check(IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR, ini_rtr), EINVAL);
  EXPECT_EQ(without_ignored_attrs(IBV_QPT_XRC_SEND, ini_rtr), STATE | AV | MTU | DQPN | RQPSN);
  EXPECT_EQ(check(IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR, without_ignored_attrs(IBV_QPT_XRC_SEND, ini_rtr)), 0);
  int tgt_rts = STATE | SQPSN | TMO | RETRY | RNRR | RD;
  EXPECT_EQ(check(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, tgt_rts), EINVAL);
  EXPECT_EQ(without_ignored_attrs(IBV_QPT_XRC_RECV, tgt_rts), STATE | SQPSN | TMO);
  EXPECT_EQ(check(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, without_ignored_attrs(IBV_QPT_XRC_RECV, tgt_rts)), 0);
  // What the other types are given is checked as given.
  for (ibv_qp_type t : kTypes) EXPECT_EQ(without_ignored_attrs(t, ini_rtr | tgt_rts), ini_rtr | tgt_rts);
}

}  // namespace
}  // namespace uroce::core
