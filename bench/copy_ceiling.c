/*
 * copy_ceiling — what two CPUs can move through shared memory in the shape of uroce's
 * same-host stream (jumbo packets, docs/architecture.md): the ceiling that bench/compare.sh
 * sets the same-host `ib_write_bw` 1 MiB figure against.
 *
 *   copy_ceiling [-t SECONDS] [-c CHUNK_KIB] [-w WINDOW_KIB] [-r RING_KIB] [-m MESSAGE_KIB]
 *
 * A producer thread copies MESSAGE_KIB (default 1024) messages from one buffer into a ring of
 * RING_KIB (default 4096) in chunks of CHUNK_KIB (default 256, a jumbo packet), never more
 * than WINDOW_KIB (default 2048) ahead of the consumer; a consumer thread copies each chunk
 * out of the ring into a destination buffer of one message. The ring is a shared memory
 * file (memfd, 4 KiB pages) as uroce's segments are; the buffers are ordinary heap memory.
 * The two threads are pinned to the first two CPUs the process may use (what the machine
 * can do, whatever the scheduler's placement; unpinned, a 1 s run read 3.5 GB/s once when
 * both threads began on one CPU). Each byte is copied twice, once by each thread, as the
 * same-host path copies it. Runs for SECONDS (default 1) and
 * prints one line (GB/s = 1e9 B/s of messages the consumer finished):
 *   copy_ceiling chunk_kib=256 window_kib=2048 ring_kib=4096 message_kib=1024 seconds=1.000
 *     GBps=24.3
 * On failure: "copy_ceiling error=WHAT" and exit status 1.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

struct Pipe {
  size_t chunk, window, ring_bytes, message;
  uint8_t *src, *ring, *dst;
  _Alignas(64) atomic_size_t head; /* bytes the producer has put in the ring */
  _Alignas(64) atomic_size_t tail; /* bytes the consumer has taken out */
  _Alignas(64) atomic_bool stop;
};

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* The first two CPUs the process may use (-1: fewer than two), read before any pinning. */
static int cpus[2] = {-1, -1};

static void find_cpus(void) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return;
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE && seen < 2; ++cpu)
    if (CPU_ISSET(cpu, &allowed)) cpus[seen++] = cpu;
}

/* Pins the calling thread to cpus[nth], when there are two. */
static void pin_nth(int nth) {
  if (cpus[nth] < 0) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus[nth], &one);
  (void)pthread_setaffinity_np(pthread_self(), sizeof one, &one);
}

static void* consume(void* arg) {
  struct Pipe* p = arg;
  pin_nth(1);
  size_t t = 0;
  for (;;) {
    size_t h;
    while ((h = atomic_load_explicit(&p->head, memory_order_acquire)) == t) {
      if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
      relax();
    }
    for (; t < h; t += p->chunk) {
      memcpy(p->dst + t % p->message, p->ring + t % p->ring_bytes, p->chunk);
      atomic_store_explicit(&p->tail, t + p->chunk, memory_order_release);
    }
  }
}

static size_t kib_arg(const char* s) { return (size_t)strtoul(s, NULL, 10) * 1024; }

static int fail(const char* what) {
  printf("copy_ceiling error=%s\n", what);
  return 1;
}

int main(int argc, char** argv) {
  struct Pipe p = {.chunk = 256 << 10, .window = 2048 << 10, .ring_bytes = 4096 << 10, .message = 1024 << 10};
  double seconds = 1.0;
  int opt;
  while ((opt = getopt(argc, argv, "t:c:w:r:m:")) != -1) {
    switch (opt) {
      case 't':
        seconds = atof(optarg);
        break;
      case 'c':
        p.chunk = kib_arg(optarg);
        break;
      case 'w':
        p.window = kib_arg(optarg);
        break;
      case 'r':
        p.ring_bytes = kib_arg(optarg);
        break;
      case 'm':
        p.message = kib_arg(optarg);
        break;
      default:
        fprintf(stderr,
                "usage: copy_ceiling [-t SECONDS] [-c CHUNK_KIB] [-w WINDOW_KIB] [-r RING_KIB] [-m MESSAGE_KIB]\n");
        return 2;
    }
  }
  if (p.chunk == 0 || p.message % p.chunk || p.ring_bytes % p.chunk || p.window < p.chunk || p.window > p.ring_bytes ||
      seconds <= 0 || seconds > 60)
    return fail("bad_arguments");
  int fd = memfd_create("copy_ceiling_ring", 0);
  if (fd < 0 || ftruncate(fd, (off_t)p.ring_bytes) != 0) return fail("memfd");
  p.ring = mmap(NULL, p.ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  p.src = aligned_alloc(4096, p.message);
  p.dst = aligned_alloc(4096, p.message);
  if (p.ring == MAP_FAILED || !p.src || !p.dst) return fail("out_of_memory");
  memset(p.src, 0xA5, p.message);
  memset(p.dst, 0, p.message);
  memset(p.ring, 0, p.ring_bytes);
  find_cpus();
  pin_nth(0);
  pthread_t consumer;
  if (pthread_create(&consumer, NULL, consume, &p) != 0) return fail("thread");

  uint64_t start = now_ns(), end = start + (uint64_t)(seconds * 1e9);
  size_t h = 0;
  for (;;) {
    if (h % p.message == 0 && now_ns() >= end) break; /* whole messages only */
    while (h + p.chunk - atomic_load_explicit(&p.tail, memory_order_acquire) > p.window) relax();
    memcpy(p.ring + h % p.ring_bytes, p.src + h % p.message, p.chunk);
    h += p.chunk;
    atomic_store_explicit(&p.head, h, memory_order_release);
  }
  while (atomic_load_explicit(&p.tail, memory_order_acquire) < h) relax();
  uint64_t stop = now_ns();
  atomic_store_explicit(&p.stop, true, memory_order_relaxed);
  pthread_join(consumer, NULL);
  bool same = memcmp(p.dst, p.src, p.message) == 0;
  free(p.src);
  free(p.dst);
  munmap(p.ring, p.ring_bytes);
  if (!same) return fail("copy_mismatch");
  double secs = (double)(stop - start) / 1e9;
  printf("copy_ceiling chunk_kib=%zu window_kib=%zu ring_kib=%zu message_kib=%zu seconds=%.3f GBps=%.2f\n",
         p.chunk >> 10, p.window >> 10, p.ring_bytes >> 10, p.message >> 10, secs, (double)h / secs / 1e9);
  return 0;
}
