// The per-core worker's system-call mix alone (radixvm percore, issue 20, local workload, one
// page per fault): P pinned processes, each with its own memfd (as a memfd per buddy heap gives
// each core its own file) and a PROT_NONE arena reservation; per iteration, for each of 4 pages:
// a store through a one-instruction probe faults (SIGSEGV on the alternate stack, SA_SIGINFO),
// the handler moves RIP to the probe's fixup and returns (rt_sigreturn), the "design" zeroes the
// frame through the pool's shared mapping (ZERO=1), installs it with
// mmap(MAP_SHARED|MAP_FIXED|MAP_POPULATE) of the memfd page, and retries the store; then one
// munmap of the 4 pages leaves a hole in the reservation. Frames rotate over WINDOW pages.
// Prints total iterations/s and CPU us per iteration (CLOCK_PROCESS_CPUTIME_ID, mean of P).
// cc -O2 -o sig percore-signal.c && ./sig P SECS [ZERO [WINDOW_PAGES [FIRST_CPU]]]
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#define PG 4096UL

// A store whose only memory access is its first instruction; the fixup returns -1.
__asm__(".text\n.p2align 4\nprobe_store:\n movb %sil, (%rdi)\n xorl %eax, %eax\n ret\n"
        ".p2align 4\nprobe_fixup:\n movq $-1, %rax\n ret\n");
extern long probe_store(char *p, long v) __asm__("probe_store");
extern void probe_fixup(void) __asm__("probe_fixup");

static void on_fault(int sig, siginfo_t *si, void *c) {
  ucontext_t *u = c;
  if (u->uc_mcontext.gregs[REG_RIP] == (long)probe_store) {
    u->uc_mcontext.gregs[REG_RIP] = (long)probe_fixup;
    return;
  }
  signal(sig, SIG_DFL);
}

static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

int main(int argc, char **argv) {
  int P = atoi(argv[1]);
  double secs = atof(argv[2]);
  int zero = argc > 3 ? atoi(argv[3]) : 1;
  long window = argc > 4 ? atol(argv[4]) : 1024;
  int first_cpu = argc > 5 ? atoi(argv[5]) : 0;
  double *res = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  volatile int *go = (int *)(res + 256);
  for (int p = 0; p < P; p++)
    if (!fork()) {
      cpu_set_t s; CPU_ZERO(&s); CPU_SET(first_cpu + p, &s); sched_setaffinity(0, sizeof s, &s);
      stack_t alt = {.ss_sp = malloc(64 << 10), .ss_size = 64 << 10};
      sigaltstack(&alt, 0);
      struct sigaction a = {0};
      a.sa_sigaction = on_fault; a.sa_flags = SA_SIGINFO | SA_ONSTACK; sigemptyset(&a.sa_mask);
      sigaction(SIGSEGV, &a, 0);
      long bytes = window * PG;
      int fd = memfd_create("frames", 0); ftruncate(fd, bytes);
      char *pool = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      for (long i = 0; i < window; i++) pool[i * PG] = 0;
      char *r = mmap((void *)(0x100000000000UL + ((unsigned long)p << 36)), 1UL << 36, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      __sync_fetch_and_add(go, 1);
      while (*go < P);
      double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
      long it = 0, off = 0, faults = 0;
      while (now(CLOCK_MONOTONIC) - t0 < secs) {
        for (int k = 0; k < 64; k++) {
          for (int i = 0; i < 4; i++) {
            char *va = r + i * PG;
            while (probe_store(va, 1) == -1) {
              faults++;
              long f = (off + i) % window;
              if (zero) memset(pool + f * PG, 0, PG);
              if (mmap(va, PG, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd,
                       f * PG) != va) _exit(2);
            }
          }
          munmap(r, 4 * PG);
          off = (off + 4) % window;
          it++;
        }
      }
      double c = now(CLOCK_PROCESS_CPUTIME_ID) - c0, t = now(CLOCK_MONOTONIC) - t0;
      res[2 * p] = it / t; res[2 * p + 1] = c / it * 1e6;
      if (faults != 4 * it) _exit(3);
      _exit(0);
    }
  int bad = 0;
  for (int p = 0; p < P; p++) { int st; wait(&st); bad |= !WIFEXITED(st) || WEXITSTATUS(st); }
  double tot = 0, cpu = 0;
  for (int p = 0; p < P; p++) { tot += res[2 * p]; cpu += res[2 * p + 1] / P; }
  printf("P=%d zero=%d window=%ld iters/s %.0f cpu_us/it %.2f%s\n", P, zero, window, tot, cpu,
         bad ? " (a process failed)" : "");
  return bad;
}
