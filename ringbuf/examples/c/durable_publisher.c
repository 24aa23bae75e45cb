/*
 * Publish records 0..N into a weir job's ipc source endpoint and end the stream durably,
 * across restarts of the job: the contract of weir_publisher_close_and_wait.
 *
 *   cc -O2 -I ringbuf/include ringbuf/examples/c/durable_publisher.c \
 *      -L target/release -lweir_ring -Wl,-rpath,$PWD/target/release -o durable_publisher
 *   ./durable_publisher <endpoint path> <records>
 *
 * Each record is a weir_event (the layout a job file's ipc source reads): record n carries
 * key n % 97, value n * 0x9e3779b97f4a7c15, time_ns n * 1000, seq n. The publisher keeps
 * nothing itself: every record follows from its number, so after the job restarts it sends
 * again from the number the new endpoint asks for. It prints a line per step ("sent",
 * "closing", "job gone", "durable") and exits 0 once the job holds everything in a
 * completed checkpoint.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "weir_ring.h"

static void pause_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Connect, retrying while no job serves the endpoint (yet, or again). */
static weir_publisher *connect_again(const char *path) {
    char err[512];
    for (int tries = 0; tries < 120000; tries++) {
        weir_publisher *p = weir_publisher_connect(path, err, sizeof err);
        if (p) {
            return p;
        }
        pause_ms(1);
    }
    fprintf(stderr, "cannot connect to %s: %s\n", path, err);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <endpoint path> <records>\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    uint64_t count = strtoull(argv[2], NULL, 10);
    char err[512];
    for (int runs = 0; runs < 100; runs++) {
        weir_publisher *p = connect_again(path);
        if (weir_publisher_max_payload(p) < sizeof(weir_event)) {
            fprintf(stderr, "the endpoint takes payloads of %zu bytes, an event is %zu\n",
                    weir_publisher_max_payload(p), sizeof(weir_event));
            return 1;
        }
        uint64_t start = weir_publisher_next_seq(p);
        int gone = 0;
        for (uint64_t n = start; n < count; n++) {
            weir_event e = {n % 97, n * 0x9e3779b97f4a7c15ull, n * 1000, n};
            if (weir_publisher_send(p, &e, sizeof e, NULL, err, sizeof err) != 1) {
                printf("job gone while sending at %llu: %s\n", (unsigned long long)n, err);
                weir_publisher_detach(p);
                gone = 1;
                break;
            }
        }
        if (gone) {
            continue;
        }
        printf("sent %llu..%llu, closing\n", (unsigned long long)start, (unsigned long long)count);
        fflush(stdout);
        int done = weir_publisher_close_and_wait(p, 120000, err, sizeof err);
        if (done == 1) {
            printf("durable after %d restarts\n", runs);
            return 0;
        }
        if (done == 0) {
            printf("not durable within 120 s\n");
            return 1;
        }
        printf("job gone before the end was durable: %s\n", err);
        fflush(stdout);
    }
    return 1;
}
