// Same-host mailboxes (docs/architecture.md, "Mailboxes"): the short SENDs
// of an RC QP pair whose peers are processes of one host, as records in a
// page of the receiver's segment (transport::PeerMailbox) instead of RoCE
// packets in the ring between the two engines.
//
// A record is the one packet of a message — its PSN, length, immediate and
// payload — and nothing else of the generic path changes: the requester
// takes its PSN, times it and resends it as a packet after a local ACK
// timeout, as any packet; the responder takes it only at its expected PSN,
// drops it when a packet with that PSN got there first, leaves it while
// earlier PSNs have not come, and acknowledges it with a board word. What a
// record saves is the rest: the packet's headers built and parsed, the ring's
// record copied out, the burst's dispatch and look-up, the responder's state
// machine for the common case.
//
// The page: a line the receiver writes (`open`: the tag it takes records
// under, 0 when closed; `generation`, counted up at each open), a line the
// receiver writes (`consumed`: records taken under the tag), then
// kMailboxSlots slots of 256 bytes, record `seq` in slot seq % kMailboxSlots.
// The sender writes a slot's fields and then its stamp (release), a value
// derived from the tag and the record's number, so that zero memory, a
// record of an earlier tag or lap and, but with odds of 2^-63, anything else
// is never taken for one. It reuses a slot only once `consumed` passed it.
//
// The sender touches the page only through guarded accesses
// (core/guarded_access.h): the receiver gives it back to the file system
// when its QP is destroyed (punched), and a sender that read it open just
// before writes a page the file system must find again, which raises
// SIGBUS on a full /dev/shm. A fault sends the message as a packet and
// closes the mailbox on the sender's side until its next RTR.
//
// Trust: as a ring's record, a slot is written by another process of the
// same user. The receiver reads its fields once; a length beyond the slot is
// dropped; the payload is copied out under the receive WQE's key check, so a
// sender that rewrites it meanwhile garbles only its own message.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "transport/datagram.h"

namespace uroce::engine {

inline constexpr uint32_t kMailboxSlots = 8;
inline constexpr uint32_t kMailboxSlotBytes = 256;
inline constexpr uint32_t kMailboxSlotHeader = 24;
inline constexpr uint32_t kMailboxPayload = kMailboxSlotBytes - kMailboxSlotHeader;

enum class MailOp : uint8_t { kSend = 1, kSendWithImm = 2 };
inline constexpr uint8_t kMailSolicited = 1;  // MailboxSlot::flags

// A record's fields but its stamp and payload, written in one piece.
struct MailHead {
  uint32_t psn;
  uint32_t length;
  uint32_t imm;  // network order, as ibv_send_wr's
  uint8_t op;    // MailOp
  uint8_t flags;
  uint16_t reserved;
};

struct MailboxSlot {
  std::atomic<uint64_t> stamp;
  MailHead head;
  uint8_t payload[kMailboxPayload];
};
static_assert(sizeof(MailboxSlot) == kMailboxSlotBytes);
static_assert(sizeof(MailHead) == 16 && offsetof(MailboxSlot, head) == 8);
static_assert(offsetof(MailboxSlot, payload) == kMailboxSlotHeader);

struct Mailbox {
  alignas(64) std::atomic<uint64_t> open;
  std::atomic<uint32_t> generation;
  alignas(64) std::atomic<uint32_t> consumed;
  alignas(64) MailboxSlot slots[kMailboxSlots];
};
static_assert(sizeof(Mailbox) <= transport::kMailboxBytes);

// The mailbox of a receiver QP: its number's low 16 bits, unique in its engine.
constexpr uint32_t mailbox_cell(uint32_t receiver_qpn) { return receiver_qpn & 0xFFFF; }

// Never 0: the generation is counted up past 0.
constexpr uint64_t mailbox_tag(uint16_t generation, uint32_t sender_qpn, uint32_t receiver_qpn) {
  return uint64_t(generation) << 48 | uint64_t(sender_qpn & 0xFFFFFF) << 24 | (receiver_qpn & 0xFFFFFF);
}

// Whether `tag` is one a receiver opened for this sender/receiver pair.
constexpr bool mailbox_tag_of_pair(uint64_t tag, uint32_t sender_qpn, uint32_t receiver_qpn) {
  return tag != 0 && (tag & 0xFFFF'FFFF'FFFF) == mailbox_tag(0, sender_qpn, receiver_qpn);
}

// The stamp of record `seq` under `tag` (splitmix64 of both): never 0.
constexpr uint64_t mailbox_stamp(uint64_t tag, uint32_t seq) {
  uint64_t z = tag + uint64_t(seq + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return (z ^ (z >> 31)) | 1;
}

// A record as the receiver read it, once, out of its slot.
struct MailRecord {
  uint32_t psn = 0;
  uint32_t length = 0;
  uint32_t imm = 0;
  MailOp op = MailOp::kSend;
  bool solicited = false;
  const uint8_t* payload = nullptr;  // in the slot
};

// The sender's side, in its QP (under the QP's lock): the peer's mailbox,
// set when the QP's path leads to a process of this host (EngineQp::modify),
// the tag last seen open, the next record's number and the receiver's count
// of records taken as last read.
struct MailboxSender {
  transport::PeerMailbox peer;
  uint64_t tag = 0;
  uint32_t seq = 0;
  uint32_t consumed = 0;
};

// The receiver's side, in its QP: the mailbox it opened (null: none), its
// tag and the next record's number. Written under the QP's lock; read
// without it by the receive turn (Mailboxes::take), to skip empty ones.
struct MailboxReceiver {
  std::atomic<Mailbox*> box{nullptr};
  std::atomic<uint64_t> tag{0};
  std::atomic<uint32_t> seq{0};
  bool listed = false;  // in its engine's Mailboxes
};

}  // namespace uroce::engine
