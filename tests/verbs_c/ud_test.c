/* UD queue pairs and address handles through the public verbs API (roce-facts.md §2.5,
 * §5.3), one process, two contexts (two LIDs = UDP ports):
 *
 *   - A sends SEND_WITH_IMM to B through an address handle; B's receive buffer starts
 *     with the 40-byte GRH area: 20 zero bytes, then the IPv4 header (version 4, IHL 5,
 *     protocol UDP, total length = IP + UDP + BTH + DETH + ImmDt + payload + ICRC, valid
 *     header checksum, source = A's GID, destination = B's GID); byte_len = 40 + payload;
 *     the completion has IBV_WC_GRH, IBV_WC_WITH_IMM, src_qp = A's QPN, slid = A's LID.
 *   - B answers through ibv_create_ah_from_wc; A receives the reply.
 *   - A WR Q_Key with bit 31 set sends the QP's own Q_Key; a wrong Q_Key is dropped and
 *     counted in the receiver's qkey_viol_cntr (ibv_query_port).
 *   - A UD QP on an SRQ whose buffer is an ODP MR receives (ud_odp_caps SRQ_RECV).
 *   - Bad input: AH without GRH, with a GID index past the table, a GID of the other IP
 *     version, or for port 2 -> EINVAL; a UD message over the MTU, RDMA WRITE on UD, no
 *     AH -> EINVAL at post.
 *   - With an IPv6 GID (ud_test GID_INDEX, e.g. ::1's): the same over UDP/IPv6, with the
 *     40-byte IPv6 header in the GRH area and wc.sl 0x9 (mlx5's RoCE packet type: UDP,
 *     L3 IPv6) instead of 0xA (IPv4).
 *
 * Usage: ud_test [GID_INDEX] (default 0). Exit 0 when every check passes. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_pair.h"

#define QKEY 0x11110000u
#define GRH 40
#define PAYLOAD 300
#define IMM 0x01020304u

struct ud_side {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_qp* qp;
  struct ibv_mr* mr;
  uint8_t buf[4096];
  uint16_t lid;
  union ibv_gid gid;
  int mtu;
};

static int g_gid_index; /* of the GID both sides use */

static int is_ipv6(const union ibv_gid* g) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  return memcmp(g->raw, mapped, 12) != 0;
}

static int ud_open(struct ud_side* s) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) return -1;
  s->ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  struct ibv_port_attr pa;
  if (!s->ctx || ibv_query_port(s->ctx, 1, &pa) || ibv_query_gid(s->ctx, 1, g_gid_index, &s->gid)) return -1;
  s->lid = pa.lid;
  s->mtu = 128 << pa.active_mtu;
  s->pd = ibv_alloc_pd(s->ctx);
  s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
  s->mr = ibv_reg_mr(s->pd, s->buf, sizeof s->buf, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_qp_init_attr ia = {.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_UD};
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  s->qp = s->mr ? ibv_create_qp(s->pd, &ia) : NULL;
  if (!s->qp) return -1;
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
  if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return -1;
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE)) return -1;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0x123;
  return ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) ? -1 : 0;
}

static void ud_close(struct ud_side* s) {
  ibv_destroy_qp(s->qp);
  ibv_dereg_mr(s->mr);
  ibv_destroy_cq(s->cq);
  ibv_dealloc_pd(s->pd);
  ibv_close_device(s->ctx);
}

static void post_recv(struct ud_side* s, uint32_t len) {
  struct ibv_sge sge = {(uintptr_t)s->buf, len, s->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = 9, .sg_list = &sge, .num_sge = 1}, *bad;
  CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0, "post_recv");
}

static int post_send(struct ud_side* s, struct ibv_ah* ah, uint32_t qpn, uint32_t qkey, uint32_t len,
                     enum ibv_wr_opcode op) {
  struct ibv_sge sge = {(uintptr_t)s->buf + 2048, len, s->mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 5;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(IMM);
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = qpn;
  wr.wr.ud.remote_qkey = qkey;
  return ibv_post_send(s->qp, &wr, &bad);
}

static struct ibv_ah* ah_to(struct ud_side* from, struct ud_side* to) {
  struct ibv_ah_attr a = {.dlid = to->lid, .is_global = 1, .port_num = 1};
  a.grh.dgid = to->gid;
  a.grh.sgid_index = (uint8_t)g_gid_index;
  a.grh.hop_limit = 64;
  return ibv_create_ah(from->pd, &a);
}

static uint16_t be16(const uint8_t* p) { return (uint16_t)(p[0] << 8 | p[1]); }

/* The GRH area over IPv6: the IPv6 header of the datagram. */
static void check_grh6(const uint8_t* g, const union ibv_gid* src, const union ibv_gid* dst, uint32_t roce_len) {
  CHECK(g[0] >> 4 == 6, "IPv6 version %u", g[0] >> 4);
  CHECK(be16(g + 4) == 8 + roce_len, "IPv6 payload length %u, expected %u", be16(g + 4), 8 + roce_len);
  CHECK(g[6] == 17, "IPv6 next header %u", g[6]);
  CHECK(!memcmp(g + 8, src->raw, 16), "IPv6 source is not the sender's GID");
  CHECK(!memcmp(g + 24, dst->raw, 16), "IPv6 destination is not the receiver's GID");
}

/* The GRH area: 20 zero bytes, then the IPv4 header of the datagram. */
static void check_grh(const uint8_t* g, const union ibv_gid* src, const union ibv_gid* dst, uint32_t roce_len) {
  if (is_ipv6(src)) {
    check_grh6(g, src, dst, roce_len);
    return;
  }
  for (int i = 0; i < 20; i++) CHECK(g[i] == 0, "GRH byte %d is 0x%02x, not 0", i, g[i]);
  const uint8_t* ip = g + 20;
  CHECK(ip[0] == 0x45, "IPv4 version/IHL 0x%02x", ip[0]);
  CHECK(be16(ip + 2) == 20 + 8 + roce_len, "IPv4 total length %u, expected %u", be16(ip + 2), 20 + 8 + roce_len);
  CHECK(ip[9] == 17, "IPv4 protocol %u", ip[9]);
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += be16(ip + i);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  CHECK(sum == 0xFFFF, "IPv4 header checksum does not verify (0x%04x)", sum);
  CHECK(!memcmp(ip + 12, src->raw + 12, 4), "IPv4 source is not the sender's GID");
  CHECK(!memcmp(ip + 16, dst->raw + 12, 4), "IPv4 destination is not the receiver's GID");
}

static int wait_wc(struct ibv_cq* cq, struct ibv_wc* wc, int ms) { return vp_poll(cq, wc, ms); }

/* A UD QP of B on an SRQ whose buffer is an ODP MR (ud_odp_caps: SUPPORT_RECV and
 * SUPPORT_SRQ): A's SEND lands in the SRQ's WQE, GRH and data intact. */
static void srq_odp(struct ud_side* a, struct ud_side* b) {
  static uint8_t rbuf[GRH + 256];
  struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
  struct ibv_srq* srq = ibv_create_srq(b->pd, &sa);
  struct ibv_mr* mr = srq ? ibv_reg_mr(b->pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) : NULL;
  struct ibv_qp_init_attr ia = {.send_cq = b->cq, .recv_cq = b->cq, .srq = srq, .qp_type = IBV_QPT_UD};
  ia.cap.max_send_wr = 1;
  ia.cap.max_send_sge = 1;
  struct ibv_qp* qp = mr ? ibv_create_qp(b->pd, &ia) : NULL;
  struct ibv_qp_attr qa = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
  int rc = !qp || ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  qa.qp_state = IBV_QPS_RTR;
  rc = rc || ibv_modify_qp(qp, &qa, IBV_QP_STATE);
  CHECK(!rc, "UD QP on an SRQ with an ODP MR: setup failed (%s)", strerror(errno));
  struct ibv_ah* ah = rc ? NULL : ah_to(a, b);
  if (ah) {
    struct ibv_sge sge = {(uintptr_t)rbuf, sizeof rbuf, mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = 77, .sg_list = &sge, .num_sge = 1}, *bad;
    CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0, "ibv_post_srq_recv");
    for (int i = 0; i < 200; i++) a->buf[2048 + i] = (uint8_t)(i * 7 + 1);
    CHECK(post_send(a, ah, qp->qp_num, QKEY, 200, IBV_WR_SEND) == 0, "post_send to the SRQ's QP");
    struct ibv_wc wc;
    CHECK(wait_wc(a->cq, &wc, 5000) == 1 && wc.status == IBV_WC_SUCCESS, "A's send to the SRQ's QP");
    int got = wait_wc(b->cq, &wc, 5000) == 1;
    CHECK(got && wc.status == IBV_WC_SUCCESS && wc.wr_id == 77 && wc.qp_num == qp->qp_num && wc.byte_len == GRH + 200 &&
              !memcmp(rbuf + GRH, a->buf + 2048, 200),
          "the SRQ's receive: status %d wr_id %llu qp_num 0x%x byte_len %u", got ? (int)wc.status : -1,
          (unsigned long long)wc.wr_id, wc.qp_num, wc.byte_len);
    printf("ud: a UD QP on an SRQ with an ODP MR received %u bytes\n", wc.byte_len);
    ibv_destroy_ah(ah);
  }
  if (qp) ibv_destroy_qp(qp);
  if (mr) ibv_dereg_mr(mr);
  if (srq) ibv_destroy_srq(srq);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 2 || (argc == 2 && sscanf(argv[1], "%d", &g_gid_index) != 1)) {
    printf("usage: ud_test [GID_INDEX]\n");
    return 2;
  }
  struct ud_side a, b;
  if (ud_open(&a) || ud_open(&b)) {
    printf("setup failed: %s\n", strerror(errno));
    return 1;
  }
  struct ibv_ah* ab = ah_to(&a, &b);
  CHECK(ab != NULL, "ibv_create_ah: %s", strerror(errno));
  if (!ab) return 1;

  /* A -> B with immediate: GRH, byte_len, src_qp, slid, flags. */
  for (int i = 0; i < PAYLOAD; i++) a.buf[2048 + i] = (uint8_t)(i * 3 + 1);
  memset(b.buf, 0xAA, sizeof b.buf);
  post_recv(&b, GRH + PAYLOAD);
  CHECK(post_send(&a, ab, b.qp->qp_num, QKEY, PAYLOAD, IBV_WR_SEND_WITH_IMM) == 0, "post_send");
  struct ibv_wc wc;
  CHECK(wait_wc(a.cq, &wc, 5000) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND,
        "A's send completion");
  CHECK(wait_wc(b.cq, &wc, 5000) == 1, "B received nothing");
  CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV, "B: status %s opcode %d", ibv_wc_status_str(wc.status),
        wc.opcode);
  CHECK(wc.byte_len == GRH + PAYLOAD, "byte_len %u, expected %u", wc.byte_len, GRH + PAYLOAD);
  CHECK((wc.wc_flags & IBV_WC_GRH) && (wc.wc_flags & IBV_WC_WITH_IMM), "wc_flags 0x%x", wc.wc_flags);
  CHECK(ntohl(wc.imm_data) == IMM, "imm 0x%x", ntohl(wc.imm_data));
  CHECK(wc.src_qp == a.qp->qp_num, "src_qp 0x%x, A is 0x%x", wc.src_qp, a.qp->qp_num);
  CHECK(wc.slid == a.lid, "slid %u, A's LID is %u", wc.slid, a.lid);
  CHECK(wc.sl == (is_ipv6(&a.gid) ? 0x9 : 0xA), "sl 0x%x: not the RoCE v2 packet type of %s", wc.sl,
        is_ipv6(&a.gid) ? "IPv6" : "IPv4");
  /* BTH 12 + DETH 8 + ImmDt 4 + payload + pad + ICRC 4. */
  check_grh(b.buf, &a.gid, &b.gid, 12 + 8 + 4 + PAYLOAD + ((4 - PAYLOAD % 4) % 4) + 4);
  CHECK(!memcmp(b.buf + GRH, a.buf + 2048, PAYLOAD), "payload differs");
  printf("ud: A -> B (GID index %d): GRH (%s header), byte_len %u, src_qp, slid, sl and immediate checked\n",
         g_gid_index, is_ipv6(&a.gid) ? "IPv6" : "IPv4", wc.byte_len);

  /* B answers through an AH made from the completion and the GRH. */
  struct ibv_ah* ba = ibv_create_ah_from_wc(b.pd, &wc, (struct ibv_grh*)b.buf, 1);
  CHECK(ba != NULL, "ibv_create_ah_from_wc: %s", strerror(errno));
  if (ba) {
    post_recv(&a, GRH + 64);
    /* Bit 31 set: the QP's own Q_Key (QKEY) goes on the wire, which A accepts. */
    CHECK(post_send(&b, ba, wc.src_qp, 0x80000000u, 64, IBV_WR_SEND) == 0, "reply post_send");
    struct ibv_wc r;
    CHECK(wait_wc(b.cq, &r, 5000) == 1 && r.status == IBV_WC_SUCCESS, "B's reply send");
    CHECK(wait_wc(a.cq, &r, 5000) == 1 && r.status == IBV_WC_SUCCESS && r.byte_len == GRH + 64 &&
              r.src_qp == b.qp->qp_num,
          "A did not receive the reply");
    printf("ud: B -> A through ibv_create_ah_from_wc, remote Q_Key 0x80000000 -> QP's Q_Key\n");
    /* A wrong Q_Key is dropped: no completion at A, and A's port counts the violation
     * (qkey_viol_cntr, as IBV_DEVICE_BAD_QKEY_CNTR says). */
    struct ibv_port_attr pa0, pa1;
    CHECK(ibv_query_port(a.ctx, 1, &pa0) == 0, "ibv_query_port");
    CHECK(post_send(&b, ba, a.qp->qp_num, QKEY + 1, 64, IBV_WR_SEND) == 0, "post_send (bad qkey)");
    CHECK(wait_wc(b.cq, &r, 5000) == 1, "B's send with a wrong Q_Key did not complete");
    CHECK(wait_wc(a.cq, &r, 200) == 0, "a message with a wrong Q_Key was delivered");
    CHECK(ibv_query_port(a.ctx, 1, &pa1) == 0 && pa1.qkey_viol_cntr == pa0.qkey_viol_cntr + 1,
          "qkey_viol_cntr %u -> %u, expected one more", pa0.qkey_viol_cntr, pa1.qkey_viol_cntr);
    printf("ud: wrong Q_Key dropped, qkey_viol_cntr %u -> %u\n", pa0.qkey_viol_cntr, pa1.qkey_viol_cntr);
    ibv_destroy_ah(ba);
  }

  /* Bad input. */
  struct ibv_ah_attr bad = {.dlid = b.lid, .is_global = 0, .port_num = 1};
  errno = 0;
  CHECK(ibv_create_ah(a.pd, &bad) == NULL && errno == EINVAL, "AH without GRH: errno %d", errno);
  bad.is_global = 1;
  bad.grh.dgid = b.gid;
  bad.grh.sgid_index = 200;
  errno = 0;
  CHECK(ibv_create_ah(a.pd, &bad) == NULL && errno == EINVAL, "AH with GID index 200: errno %d", errno);
  bad.grh.sgid_index = (uint8_t)g_gid_index;
  if (is_ipv6(&a.gid)) {
    memset(&bad.grh.dgid, 0, sizeof bad.grh.dgid);
    bad.grh.dgid.raw[10] = bad.grh.dgid.raw[11] = 0xFF;
    bad.grh.dgid.raw[12] = 127;
    bad.grh.dgid.raw[15] = 1;
  } else {
    memset(&bad.grh.dgid, 0xFE, sizeof bad.grh.dgid);
  }
  errno = 0;
  CHECK(ibv_create_ah(a.pd, &bad) == NULL && errno == EINVAL, "AH to a GID of the other IP version: errno %d", errno);
  bad.grh.dgid = b.gid;
  bad.port_num = 2; /* IBV_DEVICE_UD_AV_PORT_ENFORCE: port 1 is the only one */
  errno = 0;
  CHECK(ibv_create_ah(a.pd, &bad) == NULL && errno == EINVAL, "AH for port 2: errno %d", errno);
  CHECK(post_send(&a, ab, b.qp->qp_num, QKEY, (uint32_t)a.mtu + 1, IBV_WR_SEND) == EINVAL, "UD send over the MTU");
  CHECK(post_send(&a, ab, b.qp->qp_num, QKEY, 8, IBV_WR_RDMA_WRITE) == EINVAL, "RDMA WRITE on UD");
  CHECK(post_send(&a, NULL, b.qp->qp_num, QKEY, 8, IBV_WR_SEND) == EINVAL, "UD send without an AH");
  printf("ud: bad AH attributes and bad UD work requests rejected with EINVAL\n");

  srq_odp(&a, &b);
  ibv_destroy_ah(ab);
  ud_close(&a);
  ud_close(&b);
  printf("ud_test: %s\n", g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
