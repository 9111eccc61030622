/* test_shape.c — the in-process link model (node/shape.h), the link
 * queues' non-blocking sends (real ZeroMQ sockets over inproc), and the
 * link spec grammar (coordinator/linkspec.h). Model times are exact
 * arithmetic on doubles, so the tolerances are 1e-12 s. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "errors.h"
#include "linkspec.h"
#include "shape.h"

static void test_rate_serialises(void **state)
{
    (void)state;
    shape_link_t l;
    shape_link_init(&l, 8.0, 0.0); /* 1 MB/s */
    assert_true(shape_link_active(&l));
    /* 1000 bytes at t=0 leave at 1 ms; a second one handed over at once queues behind it */
    assert_true(fabs(shape_link_release(&l, 0.0, 1000) - 1e-3) < 1e-12);
    assert_true(fabs(shape_link_release(&l, 0.0, 1000) - 2e-3) < 1e-12);
    /* after an idle gap the link starts from the hand-over time: no burst credit */
    assert_true(fabs(shape_link_release(&l, 1.0, 500) - 1.0005) < 1e-12);
    assert_int_equal(l.msgs, 3);
    assert_int_equal(l.bytes, 2500);
}

static void test_delay_adds_after_serialisation(void **state)
{
    (void)state;
    shape_link_t l;
    shape_link_init(&l, 8.0, 20.0);
    assert_true(fabs(shape_link_release(&l, 0.0, 1000) - 0.021) < 1e-12);
    assert_true(fabs(shape_link_release(&l, 0.0, 1000) - 0.022) < 1e-12); /* order kept */
    shape_link_init(&l, 0.0, 5.0);                                       /* delay only */
    assert_true(fabs(shape_link_release(&l, 2.0, 1u << 30) - 2.005) < 1e-12);
    shape_link_init(&l, 0.0, 0.0);
    assert_false(shape_link_active(&l));
    assert_true(shape_link_release(&l, 3.0, 10) == 3.0);
}

static void test_queue_fifo_and_capacity(void **state)
{
    (void)state;
    shape_queue_t *q = shape_queue_new(2);
    assert_non_null(q);
    zmq_msg_t h, p;
    for (int i = 0; i < 2; i++) {
        zmq_msg_init_size(&h, 4);
        memset(zmq_msg_data(&h), 'a' + i, 4);
        zmq_msg_init_size(&p, 100);
        assert_int_equal(shape_queue_push(q, i, &h, &p), 0);
        assert_int_equal(zmq_msg_size(&h), 0); /* moved */
        zmq_msg_close(&h);
        zmq_msg_close(&p);
    }
    assert_true(shape_queue_full(q));
    zmq_msg_init(&h);
    zmq_msg_init(&p);
    assert_int_equal(shape_queue_push(q, 9, &h, &p), TAH_ESPACE);
    shape_item_t *it = shape_queue_head(q);
    assert_true(it->release == 0 && ((char *)zmq_msg_data(&it->hdr))[0] == 'a');
    zmq_msg_close(&it->hdr);
    zmq_msg_close(&it->payload);
    shape_queue_pop(q);
    assert_int_equal(shape_queue_push(q, 2, &h, &p), 0); /* wraps around */
    it = shape_queue_head(q);
    assert_true(it->release == 1 && ((char *)zmq_msg_data(&it->hdr))[0] == 'b');
    shape_queue_destroy(&q); /* closes what is left */
    assert_null(q);
}

/* ---- shape_queue_send: real sockets; a full peer queue must not block ---- */

static double s_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void s_push(shape_queue_t *q, double release, int i)
{
    zmq_msg_t h, p;
    zmq_msg_init_size(&h, 2);
    memcpy(zmq_msg_data(&h), (char[]){ 'h', (char)('0' + i) }, 2);
    zmq_msg_init_size(&p, 3000); /* payload: i in every byte */
    memset(zmq_msg_data(&p), i, 3000);
    assert_int_equal(shape_queue_push(q, release, &h, &p), 0);
}

/* One message [hdr][payload] from sock, asserted whole; its number i, or -1
 * when none is waiting. */
static int s_take(void *sock)
{
    char buf[4096];
    int more = 0;
    size_t ml = sizeof more;
    int n = zmq_recv(sock, buf, sizeof buf, ZMQ_DONTWAIT);
    if (n < 0)
        return -1;
    assert_int_equal(n, 2);
    assert_int_equal(buf[0], 'h');
    int i = buf[1] - '0';
    zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
    assert_int_equal(more, 1);
    assert_int_equal(zmq_recv(sock, buf, sizeof buf, 0), 3000);
    for (int k = 0; k < 3000; k++)
        assert_int_equal(buf[k], i);
    zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
    assert_int_equal(more, 0);
    return i;
}

/* Alternates shape_queue_send(now) with the receiver taking what arrived
 * until messages from..upto-1 have arrived, in that order. */
static void s_drain(shape_queue_t *q, void *tx, const char *rid, void *rx, double now, int from, int upto)
{
    double next;
    for (int round = 0; round < 5000 && from < upto; round++) {
        assert_int_not_equal(shape_queue_send(q, tx, rid, rid ? strlen(rid) : 0, now, &next), SHAPE_FAILED);
        int i;
        while ((i = s_take(rx)) >= 0)
            assert_int_equal(i, from++);
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    assert_int_equal(from, upto);
}

/* A socket whose queues hold one message each way (so a peer that does not
 * read fills them at once), and whose blocking sends would wait 2 s. */
static void *s_socket(void *ctx, int type)
{
    void *s = zmq_socket(ctx, type);
    int one = 1, to = 2000, zero = 0;
    zmq_setsockopt(s, ZMQ_SNDHWM, &one, sizeof one);
    zmq_setsockopt(s, ZMQ_RCVHWM, &one, sizeof one);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &to, sizeof to);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    return s;
}

static void test_send_holds_instead_of_blocking(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    void *rx = s_socket(ctx, ZMQ_PULL), *tx = s_socket(ctx, ZMQ_DEALER);
    assert_int_equal(zmq_bind(rx, "inproc://shape-send"), 0);
    assert_int_equal(zmq_connect(tx, "inproc://shape-send"), 0);
    shape_queue_t *q = shape_queue_new(16);
    assert_non_null(q);
    for (int i = 0; i < 8; i++)
        s_push(q, 1.0, i);
    s_push(q, 50.0, 8); /* a shaped link's message, not due before t = 50 */
    double next, t0 = s_clock();
    int rc = shape_queue_send(q, tx, NULL, 0, 5.0, &next);
    double took = s_clock() - t0;
    /* the receiver reads nothing: the socket takes what its queues hold, then refuses */
    assert_int_equal(rc, SHAPE_HELD);
    assert_true(took < 0.5);
    assert_true(q->n > 1 && q->n < 9);
    assert_true(q->held_since == 5.0);
    size_t left = q->n;
    t0 = s_clock();
    assert_int_equal(shape_queue_send(q, tx, NULL, 0, 6.0, &next), SHAPE_HELD);
    assert_true(s_clock() - t0 < 0.5);
    assert_int_equal(q->n, left);
    assert_true(q->held_since == 5.0); /* since the head was first refused */
    /* the receiver reads: everything due arrives whole and in order; the shaped one waits */
    s_drain(q, tx, NULL, rx, 7.0, 0, 8);
    assert_int_equal(q->n, 1);
    assert_true(q->held_since == 0.0);
    assert_int_equal(shape_queue_send(q, tx, NULL, 0, 7.0, &next), SHAPE_SENT);
    assert_true(fabs(next - 43.0) < 1e-12);
    assert_int_equal(q->n, 1);
    s_drain(q, tx, NULL, rx, 50.0, 8, 9);
    assert_int_equal(q->n, 0);
    assert_int_equal(shape_queue_send(q, tx, NULL, 0, 51.0, &next), SHAPE_SENT);
    assert_true(next == -1.0);
    shape_queue_destroy(&q);
    zmq_close(tx);
    zmq_close(rx);
    zmq_ctx_term(ctx);
}

/* The agent's upstream and tied sends: a ROUTER with ROUTER_MANDATORY to one
 * peer. A full peer queue holds the message whole (no routing id sent on
 * its own); a peer that is not connected fails the send at once. */
static void test_send_router_peer(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    void *tx = s_socket(ctx, ZMQ_ROUTER), *rx = s_socket(ctx, ZMQ_DEALER);
    int one = 1;
    zmq_setsockopt(tx, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(rx, ZMQ_ROUTING_ID, "peer", 4);
    assert_int_equal(zmq_bind(tx, "inproc://shape-router"), 0);
    assert_int_equal(zmq_connect(rx, "inproc://shape-router"), 0);
    assert_int_equal(zmq_send(rx, "hello", 5, 0), 5); /* the router learns the peer */
    char buf[16];
    assert_int_equal(zmq_recv(tx, buf, sizeof buf, 0), 4);
    assert_int_equal(zmq_recv(tx, buf, sizeof buf, 0), 5);
    shape_queue_t *q = shape_queue_new(16);
    assert_non_null(q);
    for (int i = 0; i < 8; i++)
        s_push(q, 1.0, i);
    double next, t0 = s_clock();
    assert_int_equal(shape_queue_send(q, tx, "peer", 4, 2.0, &next), SHAPE_HELD);
    assert_true(s_clock() - t0 < 0.5);
    assert_true(q->n > 1 && q->n < 8);
    s_drain(q, tx, "peer", rx, 3.0, 0, 8);
    assert_int_equal(q->n, 0);
    /* no such peer: the head is dropped and the error says why */
    s_push(q, 1.0, 0);
    s_push(q, 1.0, 1);
    assert_int_equal(shape_queue_send(q, tx, "nobody", 6, 4.0, &next), SHAPE_FAILED);
    assert_int_equal(errno, EHOSTUNREACH);
    assert_int_equal(q->n, 1);
    shape_queue_destroy(&q);
    zmq_close(tx);
    zmq_close(rx);
    zmq_ctx_term(ctx);
}

static void test_linkspec_grammar(void **state)
{
    (void)state;
    linkspec_t ls;
    char err[256], buf[256];
    assert_int_equal(linkspec_parse("50", 1e5, &ls, err, sizeof err), 0);
    assert_true(linkspec_value(&ls, 0, 1) == 50 && linkspec_value(&ls, 2, 1) == 50);
    assert_int_equal(linkspec_parse("50/20", 1e5, &ls, err, sizeof err), 0);
    assert_true(linkspec_value(&ls, 1, 2) == 50 && linkspec_value(&ls, 2, 1) == 20);
    assert_true(linkspec_value(&ls, 0, 3) == 50 && linkspec_value(&ls, 3, 0) == 20); /* tied link */
    linkspec_format(&ls, buf, sizeof buf);
    assert_string_equal(buf, "50/20");
    assert_int_equal(linkspec_parse("0>1:50,1>0:20.5,2>3:7", 1e5, &ls, err, sizeof err), 0);
    assert_true(ls.matrix && ls.n == 3);
    assert_true(linkspec_value(&ls, 1, 0) == 20.5 && linkspec_value(&ls, 1, 2) == 0);
    assert_int_equal(linkspec_max_stage(&ls), 3);
    linkspec_format(&ls, buf, sizeof buf);
    assert_string_equal(buf, "0>1:50,1>0:20.5,2>3:7");
    assert_int_equal(linkspec_parse("none", 1e5, &ls, err, sizeof err), 0);
    assert_false(linkspec_any(&ls));
    assert_int_equal(linkspec_parse("0", 1e5, &ls, err, sizeof err), 0);
    assert_false(linkspec_any(&ls));
    const char *badv[] = { "", "fast", "-1", "1e6", "nan", "inf", "50/", "/20", "50/20/10", "0>1", "0>1:", "0>0:5",
                           "0>1:5,0>1:6", "0>1:5,", "a>1:5", "0>1:5;1>0:5", "50 " };
    for (size_t i = 0; i < sizeof badv / sizeof badv[0]; i++) {
        err[0] = 0;
        assert_int_equal(linkspec_parse(badv[i], 1e5, &ls, err, sizeof err), TAH_EINVAL);
        assert_true(err[0] != 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rate_serialises),
        cmocka_unit_test(test_delay_adds_after_serialisation),
        cmocka_unit_test(test_queue_fifo_and_capacity),
        cmocka_unit_test(test_send_holds_instead_of_blocking),
        cmocka_unit_test(test_send_router_peer),
        cmocka_unit_test(test_linkspec_grammar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
