// How long a thread asleep on another CPU takes to run once woken, on this
// machine: the cost the switch's TAP poller pays once per echo (issue 29).
// One thread writes an eventfd at time t0 and the other, blocked in
// epoll_wait on it (as the poller is), notes when it runs (t1); t1 - t0 per
// wake-up, GAP_US apart so that the sleeper's CPU goes idle between them
// (a ping every 5 ms), for the sleeper pinned to another CPU than the
// waker and to the same one.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static int efd, ep;
static volatile uint64_t t_woken;
static int sleeper_cpu;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *sleeper(void *arg) {
    (void)arg;
    if (sleeper_cpu >= 0) pin(sleeper_cpu);
    struct epoll_event ev;
    for (;;) {
        if (epoll_wait(ep, &ev, 1, -1) == 1) {
            uint64_t t = now_ns();
            uint64_t v;
            if (read(efd, &v, 8) != 8) continue;
            t_woken = t;
        }
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    int gap_us = argc > 2 ? atoi(argv[2]) : 5000;
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *names[] = {"other_cpu", "same_cpu"};
    for (int c = 0; c < 2; c++) {
        if (c == 0 && ncpu < 2) continue;
        efd = eventfd(0, EFD_NONBLOCK);
        ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN};
        epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev);
        pin(0);
        sleeper_cpu = c == 0 ? 1 : 0;
        pthread_t th;
        pthread_create(&th, NULL, sleeper, NULL);
        usleep(20000);
        uint64_t *d = calloc(n, sizeof *d);
        for (int i = 0; i < n; i++) {
            usleep(gap_us);
            t_woken = 0;
            uint64_t one = 1, t0 = now_ns();
            if (write(efd, &one, 8) != 8) return 1;
            while (t_woken == 0) sched_yield();
            d[i] = t_woken - t0;
        }
        qsort(d, n, sizeof *d, cmp);
        printf("wakeup: %s n=%d gap_us=%d p50_us=%.1f p90_us=%.1f p99_us=%.1f\n", names[c], n, gap_us,
               d[n / 2] / 1e3, d[n * 9 / 10] / 1e3, d[n * 99 / 100] / 1e3);
        pthread_cancel(th);
        pthread_join(th, NULL);
        close(ep);
        close(efd);
        free(d);
    }
    return 0;
}
