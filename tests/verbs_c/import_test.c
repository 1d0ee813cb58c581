/* Sharing a context's objects through a duplicate of its command descriptor
 * (ibv_import_device, ibv_import_pd / _mr / _dm, rdma-core 31+), through the public API.
 *
 * One context with a PD, an MR and device memory: ibv_import_device(dup(cmd_fd)) gives a
 * context on which ibv_import_pd, ibv_import_mr and ibv_import_dm find them by handle (the
 * MR's keys and range are the same, bytes written to the DM through the original are read
 * through the imported one); unknown handles are EINVAL, a descriptor of another file is
 * refused; closing the imported context closes the duplicate and leaves the original
 * usable (a PD allocated, the device queried) until it is closed itself.
 *
 * Usage: import_test. Exit 0 when every check passes. */
#define _GNU_SOURCE /* dup, fcntl, pipe */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "verbs_pair.h"

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct ibv_device** list = ibv_get_device_list(NULL);
  struct ibv_context* ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
  if (!ctx) return 1;
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  static uint8_t buf[4096];
  struct ibv_mr* mr = pd ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) : NULL;
  struct ibv_alloc_dm_attr da = {.length = 4096};
  struct ibv_dm* dm = ibv_alloc_dm(ctx, &da);
  CHECK(ctx->cmd_fd >= 0, "cmd_fd %d", ctx->cmd_fd);
  if (!pd || !mr || !dm || ctx->cmd_fd < 0) return 1;

  int fd = dup(ctx->cmd_fd);
  struct ibv_context* imported = ibv_import_device(fd);
  CHECK(imported != NULL, "ibv_import_device: %s", strerror(errno));
  if (!imported) return 1;
  struct ibv_pd* ipd = ibv_import_pd(imported, pd->handle);
  CHECK(ipd && ipd->handle == pd->handle, "ibv_import_pd: %s", strerror(errno));
  struct ibv_mr* imr = ipd ? ibv_import_mr(ipd, mr->handle) : NULL;
  CHECK(imr && imr->lkey == mr->lkey && imr->rkey == mr->rkey && imr->length == mr->length, "ibv_import_mr: %s",
        strerror(errno));
  struct ibv_dm* idm = ibv_import_dm(imported, dm->handle);
  CHECK(idm != NULL, "ibv_import_dm: %s", strerror(errno));
  uint32_t word = 0x600dcafe, back = 0;
  CHECK(ibv_memcpy_to_dm(dm, 8, &word, 4) == 0, "memcpy_to_dm");
  if (idm) CHECK(ibv_memcpy_from_dm(&back, idm, 8, 4) == 0 && back == word, "DM read through the import: 0x%x", back);
  errno = 0;
  CHECK(!ibv_import_pd(imported, pd->handle + 1000) && errno == EINVAL, "unknown PD handle: errno %d", errno);
  errno = 0;
  CHECK(!ibv_import_mr(pd, mr->handle + 1000) && errno == EINVAL, "unknown MR handle: errno %d", errno);
  errno = 0;
  CHECK(!ibv_import_dm(imported, dm->handle + 1000) && errno == EINVAL, "unknown DM handle: errno %d", errno);
  int p[2];
  if (pipe(p) == 0) {
    CHECK(!ibv_import_device(p[0]), "a pipe imported as a device");
    close(p[0]);
    close(p[1]);
  }
  if (imr) ibv_unimport_mr(imr);
  if (ipd) ibv_unimport_pd(ipd);
  if (idm) ibv_unimport_dm(idm);
  CHECK(ibv_close_device(imported) == 0, "close the imported context");
  CHECK(fcntl(fd, F_GETFD) == -1 && errno == EBADF, "the imported descriptor is still open");

  struct ibv_device_attr attr;
  CHECK(ibv_query_device(ctx, &attr) == 0, "query the original after the import is closed");
  struct ibv_pd* pd2 = ibv_alloc_pd(ctx);
  CHECK(pd2 != NULL, "alloc_pd on the original: %s", strerror(errno));
  if (pd2) ibv_dealloc_pd(pd2);
  CHECK(ibv_dereg_mr(mr) == 0 && ibv_free_dm(dm) == 0 && ibv_dealloc_pd(pd) == 0, "destroy the originals");
  CHECK(ibv_close_device(ctx) == 0, "close the original");
  ibv_free_device_list(list);
  printf("import: %s\n", g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
