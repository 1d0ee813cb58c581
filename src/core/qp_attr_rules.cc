#include "core/qp_attr_rules.h"

#include <cerrno>

namespace uroce::core {

namespace {

enum TypeIdx { kRc, kUc, kUd, kXrcIni, kXrcTgt, kTypes };

int type_index(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_RC:
      return kRc;
    case IBV_QPT_UC:
      return kUc;
    case IBV_QPT_UD:
      return kUd;
    case IBV_QPT_XRC_SEND:
      return kXrcIni;
    case IBV_QPT_XRC_RECV:
      return kXrcTgt;
    default:
      return -1;
  }
}

struct Entry {
  bool valid;
  int req[kTypes];
  int opt[kTypes];
};

constexpr int PKEY = IBV_QP_PKEY_INDEX, PORT = IBV_QP_PORT, QKEY = IBV_QP_QKEY, ACCESS = IBV_QP_ACCESS_FLAGS,
              AV = IBV_QP_AV, MTU = IBV_QP_PATH_MTU, DQPN = IBV_QP_DEST_QPN, RQPSN = IBV_QP_RQ_PSN,
              DRD = IBV_QP_MAX_DEST_RD_ATOMIC, RNRT = IBV_QP_MIN_RNR_TIMER, ALT = IBV_QP_ALT_PATH,
              SQPSN = IBV_QP_SQ_PSN, TMO = IBV_QP_TIMEOUT, RETRY = IBV_QP_RETRY_CNT, RNRR = IBV_QP_RNR_RETRY,
              RD = IBV_QP_MAX_QP_RD_ATOMIC, CUR = IBV_QP_CUR_STATE, MIG = IBV_QP_PATH_MIG_STATE,
              SQD_NOTIFY = IBV_QP_EN_SQD_ASYNC_NOTIFY;

constexpr Entry kValid = {true, {}, {}};
constexpr Entry kNone = {false, {}, {}};

// kTable[cur][next]; states RESET INIT RTR RTS SQD SQE ERR.
constexpr int kStates = 7;
constexpr Entry kTable[kStates][kStates] = {
    // from RESET
    {kValid,
     {true,
      {PKEY | PORT | ACCESS, PKEY | PORT | ACCESS, PKEY | PORT | QKEY, PKEY | PORT | ACCESS, PKEY | PORT | ACCESS},
      {}},
     kNone,
     kNone,
     kNone,
     kNone,
     kNone},
    // from INIT
    {kValid,
     {true,
      {},
      {PKEY | PORT | ACCESS, PKEY | PORT | ACCESS, PKEY | PORT | QKEY, PKEY | PORT | ACCESS, PKEY | PORT | ACCESS}},
     {true,
      {AV | MTU | DQPN | RQPSN | DRD | RNRT, AV | MTU | DQPN | RQPSN, 0, AV | MTU | DQPN | RQPSN,
       AV | MTU | DQPN | RQPSN | DRD | RNRT},
      {ALT | ACCESS | PKEY, ALT | ACCESS | PKEY, PKEY | QKEY, ALT | ACCESS | PKEY, ALT | ACCESS | PKEY}},
     kNone,
     kNone,
     kNone,
     kValid},
    // from RTR
    {kValid,
     kNone,
     kNone,
     {true,
      {SQPSN | TMO | RETRY | RNRR | RD, SQPSN, SQPSN, SQPSN | TMO | RETRY | RNRR | RD, SQPSN | TMO},
      {CUR | ALT | ACCESS | RNRT | MIG, CUR | ALT | ACCESS | MIG, CUR | QKEY, CUR | ALT | ACCESS | RNRT | MIG,
       CUR | ALT | ACCESS | RNRT | MIG}},
     kNone,
     kNone,
     kValid},
    // from RTS
    {kValid,
     kNone,
     kNone,
     {true,
      {},
      {CUR | ACCESS | ALT | MIG | RNRT, CUR | ACCESS | ALT | MIG, CUR | QKEY, CUR | ACCESS | ALT | MIG | RNRT,
       CUR | ACCESS | ALT | MIG | RNRT}},
     {true, {}, {SQD_NOTIFY, SQD_NOTIFY, SQD_NOTIFY, SQD_NOTIFY, SQD_NOTIFY}},
     kNone,
     kValid},
    // from SQD
    {kValid,
     kNone,
     kNone,
     {true,
      {},
      {CUR | ALT | ACCESS | MIG | RNRT, CUR | ALT | ACCESS | MIG, CUR | QKEY, CUR | ALT | ACCESS | MIG | RNRT,
       CUR | ALT | ACCESS | MIG | RNRT}},
     {true,
      {},
      {PORT | AV | TMO | RETRY | RNRR | RD | DRD | ALT | ACCESS | PKEY | RNRT | MIG, AV | ALT | ACCESS | PKEY | MIG,
       PKEY | QKEY, PORT | AV | TMO | RETRY | RNRR | RD | ALT | ACCESS | PKEY | MIG,
       PORT | AV | TMO | DRD | ALT | ACCESS | PKEY | RNRT | MIG}},
     kNone,
     kValid},
    // from SQE
    {kValid,
     kNone,
     kNone,
     {true, {}, {CUR | ACCESS, CUR | ACCESS, CUR | QKEY, CUR | ACCESS, CUR | ACCESS}},
     kNone,
     kNone,
     kValid},
    // from ERR
    {kValid, kNone, kNone, kNone, kNone, kNone, kValid},
};

}  // namespace

TransitionRule transition_rule(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next) {
  int t = type_index(type);
  if (t < 0 || cur < 0 || cur >= kStates || next < 0 || next >= kStates) return {};
  const Entry& e = kTable[cur][next];
  return {e.valid, e.req[t], e.opt[t]};
}

int without_ignored_attrs(ibv_qp_type type, int mask) {
  switch (type) {
    case IBV_QPT_XRC_SEND:
      return mask & ~(IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    case IBV_QPT_XRC_RECV:
      return mask & ~(IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY);
    default:
      return mask;
  }
}

int check_modify_mask(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next, int mask) {
  if (!(mask & IBV_QP_STATE)) next = cur;
  if ((mask & IBV_QP_CUR_STATE) && cur != IBV_QPS_RTR && cur != IBV_QPS_RTS && cur != IBV_QPS_SQD && cur != IBV_QPS_SQE)
    return EINVAL;
  TransitionRule r = transition_rule(type, cur, next);
  if (!r.valid) return EINVAL;
  if ((mask & r.required) != r.required) return EINVAL;
  if (mask & ~(r.required | r.optional | IBV_QP_STATE)) return EINVAL;
  return 0;
}

const char* qp_state_name(ibv_qp_state s) {
  static const char* const kNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return s >= 0 && s < kStates ? kNames[s] : "UNKNOWN";
}

}  // namespace uroce::core
