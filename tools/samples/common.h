/* Shared plumbing of uroce's sample programs (tools/samples): argument helpers, the TCP
 * out-of-band exchange, RC queue pair setup and connection, bounded completion polling
 * and error reporting. Public libibverbs API only, so the samples also run on real RDMA
 * hardware. Every wait is bounded by the program's --timeout; every failure ends the
 * program with a one-line error on stderr and exit status 1 (die). */
#ifndef UROCE_SAMPLES_COMMON_H
#define UROCE_SAMPLES_COMMON_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

/* ---- errors and arguments ---- */

/* The program name used in messages (set by sample_init) and the bound on every wait in
 * seconds (--timeout, default 10; set by opt_timeout). */
extern const char* g_prog;
extern int g_timeout_s;

/* Prints "PROG: MESSAGE" on stderr and exits with status 1. */
_Noreturn void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/* Records the program name and usage text; prints the usage and exits 0 on -h/--help. */
void sample_init(int argc, char** argv, const char* usage);

/* Option parsing: if argv[*i] is NAME, consumes it and its value (dies when missing). */
int opt_str(int argc, char** argv, int* i, const char* name, const char** out);
int opt_long(int argc, char** argv, int* i, const char* name, long min, long max, long* out);
/* --timeout SECONDS (1..3600): sets g_timeout_s. */
int opt_timeout(int argc, char** argv, int* i);
/* Dies with the usage hint for an unknown option. */
_Noreturn void bad_arg(const char* arg);

/* Arms a watchdog: after --timeout seconds the program dies with "timed out waiting for
 * WHAT". For calls that block without a timeout of their own (rdma_cm's synchronous
 * calls). watchdog_arm(NULL) disarms it. */
void watchdog_arm(const char* what);

/* ---- TCP out-of-band exchange ---- */

/* Server: listens on PORT (all addresses) and accepts one connection. */
int tcp_accept_one(int port);
/* Server with several clients: listen once, then accept_next for each. */
int tcp_listen(int port);
int tcp_accept_next(int listen_fd);
/* Client: connects to HOST:PORT. */
int tcp_connect(const char* host, int port);
/* Sends LEN bytes / receives exactly LEN bytes; a closed or silent peer is fatal. */
void tcp_send(int fd, const void* buf, size_t len);
void tcp_recv(int fd, void* buf, size_t len, const char* what);
/* Both sides send one byte and wait for the other's: a barrier. */
void tcp_sync(int fd);

/* ---- RC queue pairs ---- */

/* What two RC peers exchange: QP number, first PSN, GID, and one buffer. Sent as-is
 * in big-endian byte order (rc_info_send / rc_info_recv). */
struct rc_info {
  uint32_t qpn;
  uint32_t psn;
  union ibv_gid gid;
  uint64_t addr;
  uint32_t rkey;
  uint32_t len;
};

struct rc_dev {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  enum ibv_mtu mtu;
  union ibv_gid gid; /* GID index 0 */
};

/* Opens the first device, port 1: PD, one CQ of CQ_DEPTH entries, GID 0, active MTU. */
void rc_dev_open(struct rc_dev* d, int cq_depth);
/* Registers LEN bytes at BUF with ACCESS (IBV_ACCESS_LOCAL_WRITE always added). */
struct ibv_mr* rc_reg(struct rc_dev* d, void* buf, size_t len, int access);
/* Creates an RC QP on the device's CQ in state INIT with remote ACCESS flags, and fills
 * SELF with its QPN, a random PSN and the GID (addr/rkey/len left for the caller). */
struct ibv_qp* rc_qp_create(struct rc_dev* d, int depth, int access, struct rc_info* self);
/* INIT -> RTR -> RTS towards PEER (GID index 0, is_global address vector). */
void rc_qp_connect(struct rc_dev* d, struct ibv_qp* qp, const struct rc_info* self, const struct rc_info* peer);
void rc_info_send(int fd, const struct rc_info* info);
void rc_info_recv(int fd, struct rc_info* info);

/* Posting one work request with a single SGE (MR may be NULL for LEN 0). */
void post_recv(struct ibv_qp* qp, struct ibv_mr* mr, void* buf, uint32_t len, uint64_t wr_id);
void post_send(struct ibv_qp* qp, struct ibv_mr* mr, void* buf, uint32_t len, uint64_t wr_id);
/* OPCODE: IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM (IMM in host order) or IBV_WR_RDMA_READ. */
void post_rdma(struct ibv_qp* qp, enum ibv_wr_opcode opcode, struct ibv_mr* mr, void* buf, uint32_t len, uint64_t raddr,
               uint32_t rkey, uint32_t imm, uint64_t wr_id);
/* OPCODE: IBV_WR_ATOMIC_FETCH_AND_ADD (ADD) or IBV_WR_ATOMIC_CMP_AND_SWP (COMPARE, SWAP). */
void post_atomic(struct ibv_qp* qp, enum ibv_wr_opcode opcode, struct ibv_mr* mr, uint64_t* result, uint64_t raddr,
                 uint32_t rkey, uint64_t compare_add, uint64_t swap, uint64_t wr_id);

/* Waits (at most --timeout) for one completion on CQ; a failed completion is fatal. */
struct ibv_wc poll_one(struct ibv_cq* cq, const char* what);

/* A buffer's description as sent in a message (big-endian on the wire). */
struct buf_desc {
  uint64_t addr;
  uint32_t rkey;
  uint32_t len;
};
void desc_pack(struct buf_desc* wire, const void* addr, uint32_t rkey, uint32_t len);
struct buf_desc desc_unpack(const struct buf_desc* wire);

/* Fills LEN bytes with TEXT (a NUL-terminated header) followed by a pattern derived from
 * SEED; check_pattern says whether BUF holds exactly that. */
void fill_pattern(char* buf, size_t len, const char* text, unsigned seed);
int check_pattern(const char* buf, size_t len, const char* text, unsigned seed);

/* FNV-1a 64 over LEN bytes, continuing from H (start with FNV_INIT). */
#define FNV_INIT 0xcbf29ce484222325ULL
uint64_t fnv1a64(uint64_t h, const void* buf, size_t len);

#endif
