/* An MPI program that checks its data, for running Open MPI over uroce
 * (tests/middleware/CMakeLists.txt). Every rank:
 *
 *   1. ping-pong: ranks 2k and 2k+1 exchange messages of 1 B .. 4 MiB (each
 *      filled with a pattern of its size, round and sender) and check every byte;
 *   2. allreduce: the sum over ranks of a vector that depends on the rank, checked
 *      against the closed form;
 *   3. one-sided: each rank MPI_Puts a block into its right neighbour's window and
 *      MPI_Gets a block from its left neighbour's (fence epochs), checked;
 *   4. prints "mpi_check: rank R of N: OK" and exits 0; on any mismatch it prints
 *      what differed and calls MPI_Abort (exit status 1).
 *
 * Usage: mpi_check [--rounds N]   (default 20 ping-pong rounds per size)
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;

static void fail(const char* what, long index, long got, long want) {
  fprintf(stderr, "mpi_check: rank %d: %s: at %ld got %ld, expected %ld\n", rank, what, index, got, want);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static unsigned char pattern(size_t i, size_t size, int round, int sender) {
  return (unsigned char)(i * 31 + size * 7 + (size_t)round * 13 + (size_t)sender * 101);
}

static void fill(unsigned char* buf, size_t size, int round, int sender) {
  for (size_t i = 0; i < size; ++i) buf[i] = pattern(i, size, round, sender);
}

static void check(const unsigned char* buf, size_t size, int round, int sender) {
  for (size_t i = 0; i < size; ++i)
    if (buf[i] != pattern(i, size, round, sender))
      fail("ping-pong data", (long)i, buf[i], pattern(i, size, round, sender));
}

static void ping_pong(int rounds) {
  const size_t max = (size_t)4 << 20;
  int peer = rank ^ 1;
  if (peer >= nranks) return; /* an odd rank count leaves the last rank out */
  unsigned char* out = malloc(max);
  unsigned char* in = malloc(max);
  if (!out || !in) fail("malloc", 0, 0, 0);
  for (size_t size = 1; size <= max; size *= 4) {
    double start = MPI_Wtime();
    for (int r = 0; r < rounds; ++r) {
      /* Tags within the range MPI guarantees (MPI_TAG_UB >= 32767): a long run (the
       * peer-death test's) must not end in MPI_ERR_TAG before its rank is killed. */
      const int tag = r % 32768;
      MPI_Status st;
      memset(in, 0, size);
      if (rank % 2 == 0) {
        fill(out, size, r, rank);
        MPI_Send(out, (int)size, MPI_BYTE, peer, tag, MPI_COMM_WORLD);
        MPI_Recv(in, (int)size, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &st);
      } else {
        MPI_Recv(in, (int)size, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &st);
        fill(out, size, r, rank);
        MPI_Send(out, (int)size, MPI_BYTE, peer, tag, MPI_COMM_WORLD);
      }
      int count;
      MPI_Get_count(&st, MPI_BYTE, &count);
      if ((size_t)count != size) fail("ping-pong length", r, count, (long)size);
      check(in, size, r, peer);
    }
    if (rank == 0)
      printf("mpi_check: ping-pong %8zu B: %.2f us per round trip\n", size, (MPI_Wtime() - start) * 1e6 / rounds);
  }
  free(out);
  free(in);
}

static void allreduce(void) {
  enum { kCount = 100000 };
  int64_t* v = malloc(kCount * sizeof *v);
  int64_t* sum = malloc(kCount * sizeof *sum);
  if (!v || !sum) fail("malloc", 0, 0, 0);
  for (int i = 0; i < kCount; ++i) v[i] = (int64_t)i * (rank + 1);
  MPI_Allreduce(v, sum, kCount, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  /* sum over r = 0..n-1 of i * (r + 1) = i * n (n + 1) / 2 */
  for (int i = 0; i < kCount; ++i) {
    int64_t want = (int64_t)i * nranks * (nranks + 1) / 2;
    if (sum[i] != want) fail("allreduce", i, (long)sum[i], (long)want);
  }
  free(v);
  free(sum);
}

static void one_sided(void) {
  enum { kBlock = 65536 }; /* int32 elements */
  int32_t* base;
  MPI_Win win;
  /* window: [0, kBlock) receives the left neighbour's put; [kBlock, 2 kBlock) is
   * this rank's own data, read by the right neighbour's get */
  MPI_Win_allocate(2 * kBlock * sizeof(int32_t), sizeof(int32_t), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  for (int i = 0; i < kBlock; ++i) {
    base[i] = -1;
    base[kBlock + i] = rank * 1000003 + i;
  }
  int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
  int32_t* put = malloc(kBlock * sizeof *put);
  int32_t* got = malloc(kBlock * sizeof *got);
  if (!put || !got) fail("malloc", 0, 0, 0);
  for (int i = 0; i < kBlock; ++i) {
    put[i] = rank * 7 + i * 3;
    got[i] = -1;
  }
  MPI_Win_fence(0, win);
  MPI_Put(put, kBlock, MPI_INT32_T, right, 0, kBlock, MPI_INT32_T, win);
  MPI_Get(got, kBlock, MPI_INT32_T, left, kBlock, kBlock, MPI_INT32_T, win);
  MPI_Win_fence(0, win);
  for (int i = 0; i < kBlock; ++i) {
    if (base[i] != left * 7 + i * 3) fail("MPI_Put into this rank's window", i, base[i], left * 7 + i * 3);
    if (got[i] != left * 1000003 + i) fail("MPI_Get from the left neighbour", i, got[i], left * 1000003 + i);
  }
  MPI_Win_free(&win);
  free(put);
  free(got);
}

int main(int argc, char** argv) {
  int rounds = 20;
  setvbuf(stdout, NULL, _IOLBF, 0); /* lines as they happen, also through mpirun into a file */
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = atoi(argv[++i]);
    } else {
      if (rank == 0) fprintf(stderr, "usage: mpi_check [--rounds N]\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  printf("mpi_check: rank %d of %d: running\n", rank, nranks);
  ping_pong(rounds);
  allreduce();
  one_sided();
  MPI_Barrier(MPI_COMM_WORLD);
  printf("mpi_check: rank %d of %d: OK\n", rank, nranks);
  MPI_Finalize();
  return 0;
}
