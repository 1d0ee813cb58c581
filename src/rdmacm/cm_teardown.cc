// Ending connections: rdma_disconnect (DREQ/DREP), time-wait, a peer that
// goes away (a process of this host that dies: check_peers), the messages a
// destroyed id still owes its peer, and the CM timers.
#include <cerrno>
#include <cstdlib>

#include "core/log.h"
#include "rdmacm/cm_service.h"

namespace uroce::rdmacm {

int CmService::disconnect(CmId* id) {
  switch (id->state) {
    case CmState::kEstablished: {
      qp_to_error(id);
      DreqMessage dreq;
      dreq.local_comm_id = id->conn.local_comm_id;
      dreq.remote_comm_id = id->conn.remote_comm_id;
      dreq.remote_qpn = id->conn.remote_qpn;
      if (send_mad(id, dreq, next_tid_++) != 0) {
        // The peer is already gone: nobody will answer.
        report_disconnected(id, 0);
        enter_timewait(id);
        return 0;
      }
      id->state = CmState::kDreqSent;
      arm_timer(id, TimerKind::kDreq, kDreqTimeoutMs);
      return 0;
    }
    case CmState::kDreqRcvd: {
      qp_to_error(id);
      DrepMessage drep;
      drep.local_comm_id = id->conn.local_comm_id;
      drep.remote_comm_id = id->conn.remote_comm_id;
      (void)send_mad(id, drep, id->conn.dreq_tid);
      enter_timewait(id);
      return 0;
    }
    case CmState::kReqSent:
    case CmState::kRepRcvd:
    case CmState::kReqRcvd:
    case CmState::kRepSent:
    case CmState::kDreqSent:
    case CmState::kTimewait:
    case CmState::kClosed:
      // As the kernel: the QP stops, no message is due.
      qp_to_error(id);
      return 0;
    default:
      return EINVAL;  // never connected
  }
}

void CmService::on_dreq(CmId* id, uint64_t tid, const DreqMessage& dreq) {
  (void)dreq;
  id->conn.dreq_tid = tid;
  switch (id->state) {
    case CmState::kEstablished:
    case CmState::kRepSent:  // the RTU was lost on the way: the connection was up
      cancel_timer(id);
      id->state = CmState::kDreqRcvd;
      report_disconnected(id, 0);
      return;
    case CmState::kDreqSent: {
      // Both sides disconnected at once: each answers the other's DREQ.
      cancel_timer(id);
      DrepMessage drep;
      drep.local_comm_id = id->conn.local_comm_id;
      drep.remote_comm_id = id->conn.remote_comm_id;
      (void)send_mad(id, drep, tid);
      report_disconnected(id, 0);
      enter_timewait(id);
      return;
    }
    default:
      return;
  }
}

void CmService::on_drep(CmId* id) {
  if (id->state != CmState::kDreqSent) return;
  cancel_timer(id);
  report_disconnected(id, 0);
  enter_timewait(id);
}

void CmService::report_disconnected(CmId* id, int status) {
  if (id->conn.disconnect_reported) return;
  id->conn.disconnect_reported = true;
  queue_event(id, RDMA_CM_EVENT_DISCONNECTED, status);
}

void CmService::enter_timewait(CmId* id) {
  id->state = CmState::kTimewait;
  arm_timer(id, TimerKind::kTimewait, kTimewaitMs);
}

void CmService::peer_gone(CmId* id, int err) {
  switch (id->state) {
    case CmState::kReqSent:
    case CmState::kRepRcvd:
    case CmState::kReqRcvd:
    case CmState::kRepSent:
    case CmState::kSidrReqSent:
      cancel_timer(id);
      qp_to_error(id);
      id->state = CmState::kClosed;
      queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -err);
      return;
    case CmState::kEstablished:
      // Like a DREQ that can never be answered: DISCONNECTED now, DREP skipped.
      id->state = CmState::kDreqRcvd;
      report_disconnected(id, 0);
      return;
    case CmState::kDreqSent:
      cancel_timer(id);
      report_disconnected(id, 0);
      enter_timewait(id);
      return;
    default:
      return;
  }
}

void CmService::abandon(CmId* id) {
  const Connection& c = id->conn;
  switch (id->state) {
    case CmState::kListen:
      close_port_socket(id);  // the port is free again at once
      break;
    case CmState::kReqSent:
    case CmState::kReqRcvd:
    case CmState::kRepSent:
    case CmState::kRepRcvd: {
      // What the IB CM sends when an id dies mid-handshake.
      RejMessage rej;
      rej.local_comm_id = c.local_comm_id;
      rej.remote_comm_id = c.remote_comm_id;
      rej.message_rejected = id->state == CmState::kReqSent ? RejectedMessage::kOther : RejectedMessage::kReq;
      rej.reason = uint16_t(id->state == CmState::kReqSent ? RejReason::kTimeout : RejReason::kConsumerDefined);
      (void)send_mad(id, rej, c.transaction_id);
      break;
    }
    case CmState::kEstablished: {
      DreqMessage dreq;
      dreq.local_comm_id = c.local_comm_id;
      dreq.remote_comm_id = c.remote_comm_id;
      dreq.remote_qpn = c.remote_qpn;
      (void)send_mad(id, dreq, next_tid_++);
      break;
    }
    case CmState::kDreqRcvd: {
      DrepMessage drep;
      drep.local_comm_id = c.local_comm_id;
      drep.remote_comm_id = c.remote_comm_id;
      (void)send_mad(id, drep, c.dreq_tid);
      break;
    }
    default:
      break;
  }
}

void CmService::on_timer(CmId* id, TimerKind kind) {
  switch (kind) {
    case TimerKind::kRequestRetry:
      if (id->state == CmState::kReqSent || id->state == CmState::kSidrReqSent) request_over_gsi(id);
      return;
    case TimerKind::kRep:
    case TimerKind::kSidr:
      if (id->state == CmState::kReqSent || id->state == CmState::kRepSent || id->state == CmState::kRepRcvd ||
          id->state == CmState::kSidrReqSent) {
        LOG_INFO("rdma_cm: id %llu: no answer from the peer's CM in state %s", (unsigned long long)id->serial,
                 state_name(id->state));
        abandon(id);  // REJ (timeout) to the peer, if it is still there
        qp_to_error(id);
        id->state = CmState::kClosed;
        queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
      }
      return;
    case TimerKind::kDreq:
      if (id->state == CmState::kDreqSent) {
        report_disconnected(id, -ETIMEDOUT);
        enter_timewait(id);
      }
      return;
    case TimerKind::kTimewait:
      if (id->state == CmState::kTimewait) {
        id->state = CmState::kClosed;
        queue_event(id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
      }
      return;
    case TimerKind::kResend:
      on_resend(id);
      return;
    case TimerKind::kNeighbour:
      poll_neighbour(id);
      return;
    case TimerKind::kNone:
      return;
  }
}

}  // namespace uroce::rdmacm
