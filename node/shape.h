/* shape.h — in-process link emulation on a node's send path: a token
 * bucket (rate) and a one-way delay per outgoing link, applied by the I/O
 * thread (agent.c) so that compute and the other links go on meanwhile.
 *
 * Model (one directed link, messages in send order): a message of n bytes
 * handed over at time t starts serialising when the link is free,
 *     depart = max(t, free) + 8 n / rate,   free = depart,
 * and reaches the peer's socket one delay later:
 *     release = depart + delay.
 * This is a store-and-forward link of `rate` bits/s with no burst beyond
 * one message, and it keeps the order of the messages. rate 0 = unlimited,
 * delay 0 = none. Messages wait in a FIFO per link (shape_queue_t), holding
 * the two ZeroMQ parts [header][payload] without copying them.
 *
 * Every outgoing link has such a queue, shaped or not: shape_queue_send
 * hands its due messages to the socket without ever blocking, so that a
 * neighbour whose queue is full holds up only that link, not the I/O
 * thread (its heartbeats, its other links).
 *
 * Memory: shape_queue_new/destroy own the ring and close messages left in
 * it. Not thread-safe: one I/O thread owns all of it. */
#ifndef TAH_NODE_SHAPE_H
#define TAH_NODE_SHAPE_H

#include <stddef.h>
#include <zmq.h> /* zmq_msg_t */

typedef struct shape_link {
    double bits_per_s;  /* 0: unlimited */
    double delay_s;     /* one-way */
    double free_at;     /* when the last message finished serialising */
    unsigned long long bytes, msgs; /* sent so far */
} shape_link_t;

void shape_link_init(shape_link_t *l, double rate_mbps, double delay_ms);
/* 1 when the link holds messages back at all. */
int shape_link_active(const shape_link_t *l);
/* Release time of a message of `bytes` handed over at `now` (seconds). */
double shape_link_release(shape_link_t *l, double now, size_t bytes);

typedef struct shape_item {
    double release;
    zmq_msg_t hdr, payload;
} shape_item_t;

typedef struct shape_queue {
    shape_item_t *v;
    size_t cap, head, n;
    double held_since; /* when the socket first refused the head (0: it has not) */
} shape_queue_t;

shape_queue_t *shape_queue_new(size_t cap);
void shape_queue_destroy(shape_queue_t **self_p);
int shape_queue_full(const shape_queue_t *q);
/* Move hdr and payload into the queue (they are left empty). 0 or TAH_ESPACE. */
int shape_queue_push(shape_queue_t *q, double release, zmq_msg_t *hdr, zmq_msg_t *payload);
/* The oldest item, or NULL. */
shape_item_t *shape_queue_head(shape_queue_t *q);
/* Drop the head (after its parts were sent or closed). */
void shape_queue_pop(shape_queue_t *q);
/* Close every message held. */
void shape_queue_clear(shape_queue_t *q);

enum { SHAPE_SENT = 0, SHAPE_HELD = 1, SHAPE_FAILED = -1 };
/* Send the messages whose release time is <= now, oldest first, on sock
 * (a DEALER; or a ROUTER with ZMQ_ROUTER_MANDATORY, to the peer rid when
 * rid_len > 0), each with ZMQ_DONTWAIT. Returns
 *   SHAPE_SENT    no due message is left;
 *   SHAPE_HELD    the socket refused the head because its queue to the peer
 *                 is full (EAGAIN): nothing of the head was sent, it stays
 *                 first; q->held_since is when that began (kept across
 *                 calls until the head goes);
 *   SHAPE_FAILED  anything else (errno: e.g. EHOSTUNREACH, the peer is not
 *                 connected); the head is dropped (a part of it may have
 *                 gone out before the failure).
 * *next: seconds until the next message is due (-1: none waits). Times are
 * seconds > 0 (a monotonic clock). */
int shape_queue_send(shape_queue_t *q, void *sock, const void *rid, size_t rid_len, double now, double *next);

#endif
