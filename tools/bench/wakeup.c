/*
 * wakeup.c - what it costs on this machine for one process to wake another (issue 18).
 *
 *   wakeup ROUNDS [CPU_A CPU_B]
 *
 * Two processes pass one byte back and forth over two pipes, ROUNDS times after 1,000
 * rounds of warm-up; each round trip is timed (CLOCK_MONOTONIC) by the first process, and
 * half of it is one wake-up: a write that makes a sleeping reader runnable, and that reader
 * running. With CPU_A and CPU_B (both >= 0) the two processes are pinned to those CPUs:
 * two CPUs give the cost of a wake-up across CPUs, the same CPU twice the cost of a switch
 * on one. Prints one line:
 *
 *   WAKEUP rounds=N p50_us=X p90_us=X p99_us=X
 *
 * (one-way, µs with one decimal). Every message through an intermediary that sleeps between
 * reads pays at least one such wake-up more than a direct connection: the latency bench
 * prints it beside its rows (latency.py), the floor under any router's added latency.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WARM 1000

static void pin(int cpu) {
  cpu_set_t set;
  if (cpu < 0)
    return;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    perror("sched_setaffinity");
    exit(2);
  }
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void full_io(int rd, int fd, char *c) {
  ssize_t n = rd ? read(fd, c, 1) : write(fd, c, 1);
  if (n != 1) {
    perror(rd ? "read" : "write");
    exit(2);
  }
}

int main(int argc, char **argv) {
  long rounds = argc > 1 ? atol(argv[1]) : 0;
  int cpu_a = argc > 3 ? atoi(argv[2]) : -1, cpu_b = argc > 3 ? atoi(argv[3]) : -1;
  int there[2], back[2];
  char c = 'x';
  if (rounds <= 0 || rounds > 10000000) {
    fprintf(stderr, "usage: wakeup ROUNDS [CPU_A CPU_B]\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN); /* a partner gone: write fails with EPIPE, reported, exit 2 */
  if (pipe(there) || pipe(back)) {
    perror("pipe");
    return 2;
  }
  pid_t child = fork();
  if (child < 0) {
    perror("fork");
    return 2;
  }
  if (child == 0) { /* echo each byte back until the first process closes its end */
    close(there[1]);
    close(back[0]);
    pin(cpu_b);
    while (read(there[0], &c, 1) == 1)
      full_io(0, back[1], &c);
    _exit(0);
  }
  close(there[0]);
  close(back[1]);
  pin(cpu_a);
  double *half = malloc(sizeof(double) * rounds);
  if (!half) {
    perror("malloc");
    return 2;
  }
  for (long i = 0; i < WARM + rounds; i++) {
    double t0 = now_us();
    full_io(0, there[1], &c);
    full_io(1, back[0], &c);
    if (i >= WARM)
      half[i - WARM] = (now_us() - t0) / 2;
  }
  close(there[1]);
  waitpid(child, NULL, 0);
  qsort(half, rounds, sizeof(double), cmp);
  printf("WAKEUP rounds=%ld p50_us=%.1f p90_us=%.1f p99_us=%.1f\n", rounds, half[rounds / 2],
         half[rounds * 9 / 10], half[rounds * 99 / 100]);
  free(half);
  return 0;
}
