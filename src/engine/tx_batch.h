// A burst of outgoing packets under construction (one per thread).
//
// Packets are built in place: headers in the slot's own buffer, payload as
// pointers into registered memory (or copied into the slot's bounce buffer
// when it is scattered over more pieces than one datagram's iovecs hold),
// then pad and ICRC in the slot's trailer. flush() hands the burst to the
// transport in one call. Nothing here allocates after construction.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "transport/datagram.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace uroce::engine {

class TxBatch {
 public:
  static constexpr unsigned kMaxPackets = 64;
  static constexpr unsigned kMaxHeader = 64;
  static constexpr unsigned kMaxPayloadPieces = transport::kMaxTxIov - 2;
  static constexpr unsigned kBounceSize = 4096;

  TxBatch();

  // The calling thread's batch.
  static TxBatch& local();

  // Flushes pending packets first if they belong to another transport.
  void use(transport::DatagramTransport* t);

  // Starts a packet of `header_len` bytes (BTH + extended headers), returned
  // zeroed for the caller to fill. Flushes first when the batch is full.
  uint8_t* begin_packet(const transport::Endpoint& dst, uint32_t src_ip, unsigned header_len);
  // Appends payload; pieces beyond what the datagram can gather are copied.
  void add_payload(const uint8_t* data, uint32_t len);
  // Pads the payload to 4 bytes (PadCnt in the BTH must already say so) and
  // appends the ICRC computed for `flow`.
  void end_packet(const wire::Ipv4Flow& flow);
  // Ends the packet as it is: no pad, no ICRC (uroce-internal datagrams).
  void end_datagram();
  // Drops the packet begun last (nothing of it is sent).
  void abort_packet() {}

  void flush();
  unsigned pending() const { return count_; }

 private:
  struct Slot {
    uint8_t header[kMaxHeader];
    uint8_t trailer[8];
    unsigned header_len;
    unsigned pieces;
    uint32_t payload_len;
    bool bounced;
    const uint8_t* piece[kMaxPayloadPieces + 1];
    uint32_t piece_len[kMaxPayloadPieces + 1];
  };
  void bounce(Slot& s);

  transport::DatagramTransport* transport_ = nullptr;
  unsigned count_ = 0;
  std::array<Slot, kMaxPackets> slots_;
  std::array<transport::TxDatagram, kMaxPackets> datagrams_;
  std::unique_ptr<uint8_t[]> bounce_;  // kMaxPackets * kBounceSize
};

}  // namespace uroce::engine
