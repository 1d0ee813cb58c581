#include "engine/delivery.h"

#include "core/config.h"

namespace uroce::engine {

void Delivery::decide(transport::DatagramTransport& transport, host::DirectPlacement* placement, ibv_qp_type type,
                      const transport::Endpoint& dst) {
  transport_ = &transport;
  dst_ = dst;
  bool rc_or_uc = type == IBV_QPT_RC || type == IBV_QPT_UC;
  placement_ = rc_or_uc ? placement : nullptr;
  jumbo_allowed_ = type == IBV_QPT_RC && core::config().shm_jumbo;
  bare_ = rc_or_uc && core::config().pcap.empty() && core::config().fault.empty();
  acks_on_board_ = bare_ && type == IBV_QPT_RC;
  if (type == IBV_QPT_UD) {
    transport_ = nullptr;  // by address handle: nothing to decide
    path_ = DeliveryPath::kSocket;
    jumbo_limit_ = 0;
    return;
  }
  recheck();
}

void Delivery::recheck() {
  posts_left_ = kRecheckPosts;
  if (!transport_) return;
  path_ = transport_->through_memory(dst_) ? DeliveryPath::kSharedMemory : DeliveryPath::kSocket;
  jumbo_limit_ = jumbo_allowed_ ? transport_->jumbo_limit(dst_) : 0;
}

transport::JumboSend Delivery::send_jumbo(const transport::IpAddress& src_ip, const iovec* iov, unsigned iovcnt) {
  if (!transport_) return transport::JumboSend::kNotLocal;
  transport::JumboSend sent = transport_->send_jumbo(dst_, src_ip, iov, iovcnt);
  if (sent == transport::JumboSend::kNotLocal) recheck();
  return sent;
}

void Delivery::count_post() {
  if (--posts_left_ == 0) recheck();
}

}  // namespace uroce::engine
