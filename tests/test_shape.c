/* test_shape.c — the in-process link model (node/shape.h) and the link
 * spec grammar (coordinator/linkspec.h). Times are exact arithmetic on
 * doubles, so the tolerances are 1e-12 s. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
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
        cmocka_unit_test(test_linkspec_grammar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
