/*
 * Read a weir job's ipc sink endpoint from C, checking that records come in order.
 *
 *   cc -O2 -I ringbuf/include ringbuf/examples/c/subscriber.c \
 *      -L target/release -lweir_ring -Wl,-rpath,$PWD/target/release -o subscriber
 *   ./subscriber <endpoint path>
 *
 * Reads until the job ends the stream; a record numbered below the next one expected was
 * seen already (the job wrote it again after a restart) and is skipped. Prints one line:
 * received=... skipped=... bytes=...
 */
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "weir_ring.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <endpoint path>\n", argv[0]);
        return 2;
    }
    char err[512];
    weir_subscriber *s = NULL;
    for (int tries = 0; s == NULL; tries++) {
        s = weir_subscriber_connect(argv[1], err, sizeof err);
        if (s == NULL) {
            if (tries >= 3000) {
                fprintf(stderr, "subscriber: %s\n", err);
                return 1;
            }
            usleep(10000); /* the job may not have made the endpoint yet */
        }
    }
    uint8_t buf[1024];
    uint64_t next = 0, received = 0, skipped = 0, bytes = 0;
    for (;;) {
        size_t len = 0;
        uint64_t seq = 0;
        int rc = weir_subscriber_recv(s, buf, sizeof buf, &len, &seq, 1, err, sizeof err);
        if (rc == 2) {
            break; /* the stream ended */
        }
        if (rc == 3) {
            fprintf(stderr, "subscriber: a record of %zu bytes is over this example's buffer\n", len);
            weir_subscriber_free(s);
            return 1;
        }
        if (rc < 0) {
            fprintf(stderr, "subscriber: %s\n", err);
            weir_subscriber_free(s);
            return 1;
        }
        if (seq < next) {
            skipped++;
            continue;
        }
        if (seq != next) {
            fprintf(stderr, "subscriber: record %llu came when %llu was expected\n", (unsigned long long)seq,
                    (unsigned long long)next);
            weir_subscriber_free(s);
            return 1;
        }
        next++;
        received++;
        bytes += len;
    }
    printf("received=%llu skipped=%llu bytes=%llu\n", (unsigned long long)received, (unsigned long long)skipped,
           (unsigned long long)bytes);
    weir_subscriber_free(s);
    return 0;
}
