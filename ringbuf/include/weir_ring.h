/*
 * weir_ring.h: attach a C or C++ program to a weir job's ipc endpoints.
 *
 * Link with libweir_ring.so (built by `cargo build --release -p weir-ring`, in
 * target/release/). A job's `ipc` source or sink makes one endpoint per subtask at
 * /dev/shm/weir-<uid>/ipc/<job>/<endpoint>.<subtask> (or under the directory the job
 * names). A publisher feeds a source endpoint; a subscriber reads a sink endpoint.
 *
 * Records are numbered: the library puts a u64 sequence number in front of each payload.
 * Delivery (see weir_ring::ipc in the Rust docs): the job drops a record numbered below
 * the one it expects (a re-send) and fails on a gap. Keep what is not durable yet
 * (weir_publisher_durable_seq); after the job restarts, connect again and send from
 * weir_publisher_next_seq: every record then arrives exactly once. To end a stream
 * durably, weir_publisher_close_and_wait: if the job dies before the end is in its final
 * checkpoint it says so (-1), and you connect to the restarted job, send from its next_seq
 * and close again; weir_publisher_close alone cannot tell, and a restarted job would wait
 * for an end that never comes.
 *
 * Payloads: what a job file's `ipc` source reads, and what its `ipc` sink writes, are the
 * fixed little-endian layouts below (weir_event; a sink behind a window writes
 * weir_window_result, behind a join weir_joined_events). A program's own Rust job may use
 * any record type; then its payload is that type's encoding.
 *
 * Errors: functions that can fail take `err`/`err_len` (may be NULL/0) and write a
 * NUL-terminated message there. A handle is used by one thread at a time and freed by
 * exactly one of weir_publisher_close / weir_publisher_close_and_wait / weir_publisher_detach /
 * weir_subscriber_free.
 */
#ifndef WEIR_RING_H
#define WEIR_RING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct WeirPublisher weir_publisher;
typedef struct WeirSubscriber weir_subscriber;

/* The record of a job file's ipc source (and of a sink fed by sources or maps): 32 bytes,
 * each field a little-endian u64. weir::record::Event. */
typedef struct weir_event {
    uint64_t key;     /* the key (a user id, say) */
    uint64_t value;   /* a value to aggregate */
    uint64_t time_ns; /* event time, ns since the Unix epoch (or a synthetic clock) */
    uint64_t seq;     /* the source's sequence number */
} weir_event;

/* What a job file's window writes (weir::window::WindowResult): 72 bytes, little-endian.
 * Only the aggregates whose bit is set in `aggregates` were computed (the others are 0):
 * bit 0 count, 1 sum, 2 min, 3 max, 4 mean. */
typedef struct weir_window_result {
    uint64_t key;
    uint64_t start_ns;  /* window start, inclusive */
    uint64_t end_ns;    /* window end, exclusive */
    uint64_t count;
    uint64_t sum;       /* wrapping */
    uint64_t min;
    uint64_t max;
    double mean;
    uint32_t aggregates;
    uint32_t late;      /* 1: a late record fired the window again; this replaces the earlier result */
} weir_window_result;

/* What a job file's join writes (weir::record::JoinedEvents): 72 bytes. matched 0: a left
 * outer join's left event that met none (right is all zero). */
typedef struct weir_joined_events {
    weir_event left;
    weir_event right;
    uint64_t matched;
} weir_joined_events;

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(weir_event) == 32, "weir_event is 32 bytes");
_Static_assert(sizeof(weir_window_result) == 72, "weir_window_result is 72 bytes");
_Static_assert(sizeof(weir_joined_events) == 72, "weir_joined_events is 72 bytes");
#endif

/* Connect to the source endpoint at `path` and take the publisher role (refused while
 * another live process holds it; taken over from a dead one). NULL on failure. */
weir_publisher *weir_publisher_connect(const char *path, char *err, size_t err_len);
/* The same for endpoint `endpoint`, subtask `subtask`, of job `job` under this user's root. */
weir_publisher *weir_publisher_connect_to(const char *job, const char *endpoint, uint32_t subtask,
                                          char *err, size_t err_len);

/* Send `len` bytes if the job has room, without waiting.
 * 1: sent (its number in *seq_out if not NULL); 0: no credit (back pressure, nothing
 * written: retry, wait, or drop by your own policy); -1: error. */
int weir_publisher_try_send(weir_publisher *p, const void *data, size_t len, uint64_t *seq_out,
                            char *err, size_t err_len);
/* Zero copy: if there is room for `len` bytes, call write(ctx, buf, len) with the record's
 * bytes in shared memory, then send it. Same results as weir_publisher_try_send. `write`
 * must not keep `buf` nor call any function on this handle. */
int weir_publisher_try_send_with(weir_publisher *p, size_t len,
                                 void (*write)(void *ctx, uint8_t *buf, size_t len), void *ctx,
                                 uint64_t *seq_out, char *err, size_t err_len);
/* Send, waiting (spin, then sleep on the ring) while the job has no room. 1 or -1. */
int weir_publisher_send(weir_publisher *p, const void *data, size_t len, uint64_t *seq_out,
                        char *err, size_t err_len);

/* The number the next record gets: where the job wants the stream to go on. */
uint64_t weir_publisher_next_seq(const weir_publisher *p);
/* Records below this number are in a completed checkpoint of the job: forget them. */
uint64_t weir_publisher_durable_seq(const weir_publisher *p);
/* Nanoseconds this endpoint's publishers have waited for credit, in total. */
uint64_t weir_publisher_blocked_ns(const weir_publisher *p);
/* The largest payload a record may carry, bytes (a longer one is refused, never cut). */
size_t weir_publisher_max_payload(const weir_publisher *p);
/* 1 if the job serving the endpoint is alive, else 0 (a system call: not per record). */
int weir_publisher_job_alive(const weir_publisher *p);

/* Make records visible every `records` records (default 1: each at once): fewer shared
 * stores per record. With more than 1, call weir_publisher_flush when you pause. */
void weir_publisher_set_batch(weir_publisher *p, uint64_t records);
/* Make every record sent so far visible to the job. */
void weir_publisher_flush(weir_publisher *p);

/* End the stream (the job's source finishes after reading it); frees the handle. */
void weir_publisher_close(weir_publisher *p);
/* End the stream, then wait up to timeout_ms until the job holds every record in a
 * completed checkpoint (its final one). 1: durable; 0: not yet after timeout_ms; -1: the
 * job went first (connect again once it restarts, send from weir_publisher_next_seq, close
 * again) or the endpoint broke, the reason in err. Frees the handle in every case. Only for
 * jobs that take checkpoints. */
int weir_publisher_close_and_wait(weir_publisher *p, uint64_t timeout_ms, char *err, size_t err_len);
/* Leave without ending the stream (another publisher may go on); frees the handle. */
void weir_publisher_detach(weir_publisher *p);

/* Connect to the sink endpoint at `path` and take the subscriber role. NULL on failure. */
weir_subscriber *weir_subscriber_connect(const char *path, char *err, size_t err_len);
/* The same for endpoint `endpoint`, subtask `subtask`, of job `job` under this user's root. */
weir_subscriber *weir_subscriber_connect_to(const char *job, const char *endpoint, uint32_t subtask,
                                            char *err, size_t err_len);
/* The number the job gives the next record it writes. */
uint64_t weir_subscriber_next_seq(const weir_subscriber *s);
/* Records below this number are in a completed checkpoint: the job will not write them
 * again after a restart (later ones may come again: drop those below the next you expect). */
uint64_t weir_subscriber_durable_seq(const weir_subscriber *s);
/* The largest payload a record may carry: a buffer this large takes any record. */
size_t weir_subscriber_max_payload(const weir_subscriber *s);
/* 1 if the job serving the endpoint is alive, else 0 (a system call: not per record). */
int weir_subscriber_job_alive(const weir_subscriber *s);
/* Take the next record, copying it into `buf` (`cap` bytes).
 * 1: a record (*len_out its length, *seq_out its number); 3: the next record is longer
 * than cap (*len_out says how long; nothing copied, it stays: call again with a larger
 * buffer); 0: nothing yet (only with wait == 0); 2: the stream ended; -1: error. */
int weir_subscriber_recv(weir_subscriber *s, void *buf, size_t cap, size_t *len_out, uint64_t *seq_out,
                         int wait, char *err, size_t err_len);
/* Leave (another subscriber may go on where this one stopped); frees the handle. */
void weir_subscriber_free(weir_subscriber *s);

#ifdef __cplusplus
}
#endif

#endif /* WEIR_RING_H */
