// The string helpers of libibverbs.
#include <infiniband/verbs.h>

#include "verbs/export.h"

UROCE_API const char* ibv_wc_status_str(enum ibv_wc_status status) {
  static const char* const kNames[] = {
      "success",
      "local length error",
      "local QP operation error",
      "local EE context operation error",
      "local protection error",
      "Work Request Flushed Error",
      "memory management operation error",
      "bad response error",
      "local access error",
      "remote invalid request error",
      "remote access error",
      "remote operation error",
      "transport retry counter exceeded",
      "RNR retry counter exceeded",
      "local RDD violation error",
      "remote invalid RD request",
      "aborted error",
      "invalid EE context number",
      "invalid EE context state",
      "fatal error",
      "response timeout error",
      "general error",
      "TM error",
      "TM rendezvous pending",
  };
  if (status < 0 || size_t(status) >= sizeof kNames / sizeof kNames[0]) return "unknown";
  return kNames[status];
}

UROCE_API const char* ibv_node_type_str(enum ibv_node_type node_type) {
  static const char* const kNames[] = {"InfiniBand channel adapter",
                                       "InfiniBand switch",
                                       "InfiniBand router",
                                       "iWARP NIC",
                                       "usNIC",
                                       "usNIC UDP",
                                       "unspecified"};
  if (node_type == IBV_NODE_UNKNOWN) return "unknown";
  int i = int(node_type) - 1;
  if (i < 0 || size_t(i) >= sizeof kNames / sizeof kNames[0]) return "unknown";
  return kNames[i];
}

UROCE_API const char* ibv_port_state_str(enum ibv_port_state port_state) {
  static const char* const kNames[] = {"PORT_NOP",   "PORT_DOWN",   "PORT_INIT",
                                       "PORT_ARMED", "PORT_ACTIVE", "PORT_ACTIVE_DEFER"};
  if (port_state < 0 || size_t(port_state) >= sizeof kNames / sizeof kNames[0]) return "unknown";
  return kNames[port_state];
}

UROCE_API const char* ibv_event_type_str(enum ibv_event_type event) {
  static const char* const kNames[] = {"CQ error",
                                       "local work queue catastrophic error",
                                       "invalid request local work queue error",
                                       "local access violation work queue error",
                                       "communication established",
                                       "send queue drained",
                                       "path migrated",
                                       "path migration request error",
                                       "local catastrophic error",
                                       "port active",
                                       "port error",
                                       "LID change",
                                       "P_Key change",
                                       "SM change",
                                       "SRQ catastrophic error",
                                       "SRQ limit reached",
                                       "last WQE reached",
                                       "client reregistration",
                                       "GID table change",
                                       "WQ fatal"};
  if (event < 0 || size_t(event) >= sizeof kNames / sizeof kNames[0]) return "unknown";
  return kNames[event];
}
