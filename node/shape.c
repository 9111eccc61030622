/* shape.c — token bucket + one-way delay per link (see shape.h). */
#include "shape.h"

#include <errno.h>
#include <stdlib.h>

#include "errors.h"

void shape_link_init(shape_link_t *l, double rate_mbps, double delay_ms)
{
    l->bits_per_s = rate_mbps > 0 ? rate_mbps * 1e6 : 0.0;
    l->delay_s = delay_ms > 0 ? delay_ms * 1e-3 : 0.0;
    l->free_at = 0.0;
    l->bytes = l->msgs = 0;
}

int shape_link_active(const shape_link_t *l)
{
    return l->bits_per_s > 0 || l->delay_s > 0;
}

double shape_link_release(shape_link_t *l, double now, size_t bytes)
{
    double depart = now;
    if (l->bits_per_s > 0) {
        double start = l->free_at > now ? l->free_at : now;
        depart = start + 8.0 * (double)bytes / l->bits_per_s;
        l->free_at = depart;
    }
    l->bytes += bytes;
    l->msgs++;
    return depart + l->delay_s;
}

shape_queue_t *shape_queue_new(size_t cap)
{
    shape_queue_t *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->v = calloc(cap ? cap : 1, sizeof *q->v);
    if (!q->v) {
        free(q);
        return NULL;
    }
    q->cap = cap ? cap : 1;
    return q;
}

void shape_queue_clear(shape_queue_t *q)
{
    while (q->n) {
        shape_item_t *it = shape_queue_head(q);
        zmq_msg_close(&it->hdr);
        zmq_msg_close(&it->payload);
        shape_queue_pop(q);
    }
    q->held_since = 0.0;
}

void shape_queue_destroy(shape_queue_t **self_p)
{
    if (!*self_p)
        return;
    shape_queue_clear(*self_p);
    free((*self_p)->v);
    free(*self_p);
    *self_p = NULL;
}

int shape_queue_full(const shape_queue_t *q)
{
    return q->n == q->cap;
}

int shape_queue_push(shape_queue_t *q, double release, zmq_msg_t *hdr, zmq_msg_t *payload)
{
    if (q->n == q->cap)
        return TAH_ESPACE;
    shape_item_t *it = &q->v[(q->head + q->n) % q->cap];
    it->release = release;
    zmq_msg_init(&it->hdr);
    zmq_msg_init(&it->payload);
    zmq_msg_move(&it->hdr, hdr);
    zmq_msg_move(&it->payload, payload);
    q->n++;
    return 0;
}

shape_item_t *shape_queue_head(shape_queue_t *q)
{
    return q->n ? &q->v[q->head] : NULL;
}

void shape_queue_pop(shape_queue_t *q)
{
    if (!q->n)
        return;
    q->head = (q->head + 1) % q->cap;
    q->n--;
}

/* The head's parts: [rid] [hdr] [payload]. A full queue refuses a message
 * at its first part (a ROUTER's at the routing id, ROUTER_MANDATORY), and
 * once that is taken ZeroMQ takes the rest of the message. */
static int s_send_head(shape_item_t *it, void *sock, const void *rid, size_t rid_len)
{
    if (rid_len > 0 && zmq_send(sock, rid, rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return errno == EAGAIN ? SHAPE_HELD : SHAPE_FAILED;
    if (zmq_msg_send(&it->hdr, sock, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        if (rid_len == 0 && errno == EAGAIN)
            return SHAPE_HELD;
        return SHAPE_FAILED;
    }
    return zmq_msg_send(&it->payload, sock, ZMQ_DONTWAIT) < 0 ? SHAPE_FAILED : SHAPE_SENT;
}

int shape_queue_send(shape_queue_t *q, void *sock, const void *rid, size_t rid_len, double now, double *next)
{
    *next = -1.0;
    shape_item_t *it;
    while ((it = shape_queue_head(q))) {
        if (it->release > now) {
            *next = it->release - now;
            return SHAPE_SENT;
        }
        int rc = s_send_head(it, sock, rid, rid_len);
        if (rc == SHAPE_HELD) {
            if (q->held_since == 0.0)
                q->held_since = now;
            return SHAPE_HELD;
        }
        int err = errno;
        zmq_msg_close(&it->hdr); /* sent parts are empty messages now */
        zmq_msg_close(&it->payload);
        shape_queue_pop(q);
        q->held_since = 0.0;
        if (rc == SHAPE_FAILED) {
            errno = err;
            return SHAPE_FAILED;
        }
    }
    return SHAPE_SENT;
}
