/*
 * Publish ticks into a weir job's ipc source endpoint, paced, and report back pressure.
 *
 *   cc -O2 -I ringbuf/include ringbuf/examples/c/publisher.c \
 *      -L target/release -lweir_ring -Wl,-rpath,$PWD/target/release -o publisher
 *   ./publisher <endpoint path> <records> [records per second, 0 = as fast as it can]
 *
 * Each record is a job file's Event (key, value, time_ns, seq: four little-endian u64s),
 * record n carrying key n % 97, value n * 3, time_ns n * 1000. The publisher starts at
 * the endpoint's next number, so a restarted publisher goes on where the last stopped.
 * It prints one line: sent=... no_credit=... blocked_ns=... next_seq=... durable=...
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "weir_ring.h"

struct event {
    uint64_t key, value, time_ns, seq;
};

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <endpoint path> <records> [records per second]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    uint64_t count = strtoull(argv[2], NULL, 10);
    double rate = argc > 3 ? strtod(argv[3], NULL) : 0.0;
    char err[512];

    weir_publisher *p = NULL;
    for (int tries = 0; p == NULL; tries++) {
        p = weir_publisher_connect(path, err, sizeof err);
        if (p == NULL) {
            if (tries >= 3000) {
                fprintf(stderr, "publisher: %s\n", err);
                return 1;
            }
            usleep(10000); /* the job may not have made the endpoint yet */
        }
    }
    uint64_t first = weir_publisher_next_seq(p), no_credit = 0;
    uint64_t start = now_ns();
    for (uint64_t n = first; n < count; n++) {
        if (rate > 0.0 && n % 1000 == 0) {
            /* Sleep until this batch is due (no spinning between ticks). */
            uint64_t due = start + (uint64_t)((double)(n - first) * 1e9 / rate);
            uint64_t t = now_ns();
            if (due > t) {
                struct timespec d = {(time_t)((due - t) / 1000000000u), (long)((due - t) % 1000000000u)};
                nanosleep(&d, NULL);
            }
        }
        struct event e = {n % 97, n * 3, n * 1000, n};
        uint64_t seq = 0;
        int rc = weir_publisher_try_send(p, &e, sizeof e, &seq, err, sizeof err);
        if (rc == 0) {
            no_credit++; /* back pressure: the job is slower than us; wait for room */
            rc = weir_publisher_send(p, &e, sizeof e, &seq, err, sizeof err);
        }
        if (rc < 0) {
            fprintf(stderr, "publisher: record %llu: %s\n", (unsigned long long)n, err);
            weir_publisher_detach(p);
            return 1;
        }
        if (seq != n) {
            fprintf(stderr, "publisher: record %llu got number %llu\n", (unsigned long long)n, (unsigned long long)seq);
            weir_publisher_detach(p);
            return 1;
        }
    }
    printf("first=%llu sent=%llu no_credit=%llu blocked_ns=%llu next_seq=%llu durable=%llu elapsed_ns=%llu\n",
           (unsigned long long)first, (unsigned long long)(count > first ? count - first : 0),
           (unsigned long long)no_credit, (unsigned long long)weir_publisher_blocked_ns(p),
           (unsigned long long)weir_publisher_next_seq(p), (unsigned long long)weir_publisher_durable_seq(p),
           (unsigned long long)(now_ns() - start));
    weir_publisher_close(p);
    return 0;
}
