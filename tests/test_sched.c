/* test_sched.c — GPipe and 1F1B action lists: every micro-batch is forwarded
 * once and backwarded once, F(m) before B(m), forwards and backwards each in
 * micro-batch order, in-flight count bounded (1F1B: exactly min(S-k, M) at
 * peak on stage k; GPipe: M), and all stages executed together under the
 * cross-stage dependencies finish without deadlock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "errors.h"
#include "schedule.h"

#define MAXS 8
#define MAXM 12

static void s_check_stage(sched_kind_t kind, int S, int M, int k, const sched_action_t *a)
{
    int fdone[MAXM] = { 0 }, bdone[MAXM] = { 0 };
    int nextf = 0, nextb = 0, inflight = 0, peak = 0;
    for (int i = 0; i < 2 * M; i++) {
        int m = a[i].mb;
        assert_true(m >= 0 && m < M);
        if (a[i].op == SCHED_F) {
            assert_int_equal(m, nextf++);
            assert_false(fdone[m]);
            fdone[m] = 1;
            inflight++;
        } else {
            assert_int_equal(a[i].op, SCHED_B);
            assert_int_equal(m, nextb++);
            assert_true(fdone[m]); /* every F before its B */
            assert_false(bdone[m]);
            bdone[m] = 1;
            inflight--;
        }
        if (inflight > peak)
            peak = inflight;
    }
    assert_int_equal(nextf, M);
    assert_int_equal(nextb, M);
    assert_true(peak <= sched_max_inflight(kind, S, M, k));
    if (kind == SCHED_1F1B) {
        int want = S - k < M ? S - k : M;
        assert_int_equal(peak, want);
    } else {
        assert_int_equal(peak, M);
    }
}

/* Run all stages' lists together under the dependencies; must finish. */
static void s_check_joint(sched_kind_t kind, int S, int M, sched_action_t a[MAXS][2 * MAXM])
{
    int pos[MAXS] = { 0 };
    char fd[MAXS][MAXM], bd[MAXS][MAXM];
    memset(fd, 0, sizeof fd);
    memset(bd, 0, sizeof bd);
    int left = 2 * S * M;
    while (left) {
        int progress = 0;
        for (int k = 0; k < S; k++) {
            while (pos[k] < 2 * M) {
                sched_action_t x = a[k][pos[k]];
                int ready = x.op == SCHED_F ? (k == 0 || fd[k - 1][x.mb])
                                            : (k == S - 1 ? fd[k][x.mb] : bd[k + 1][x.mb]);
                if (!ready)
                    break;
                (x.op == SCHED_F ? fd : bd)[k][x.mb] = 1;
                pos[k]++;
                left--;
                progress = 1;
            }
        }
        if (!progress)
            fail_msg("%s S=%d M=%d deadlocks", sched_name(kind), S, M);
    }
}

static void test_schedules_valid(void **state)
{
    (void)state;
    sched_kind_t kinds[2] = { SCHED_GPIPE, SCHED_1F1B };
    for (int ki = 0; ki < 2; ki++)
        for (int S = 1; S <= MAXS; S++)
            for (int M = 1; M <= MAXM; M++) {
                sched_action_t a[MAXS][2 * MAXM];
                for (int k = 0; k < S; k++) {
                    assert_int_equal(sched_build(kinds[ki], S, M, k, a[k]), 0);
                    s_check_stage(kinds[ki], S, M, k, a[k]);
                }
                s_check_joint(kinds[ki], S, M, a);
            }
}

static void test_1f1b_shape(void **state)
{
    (void)state;
    /* S=4, M=6, stage 1: warm-up F0 F1, then F2 B0 F3 B1 F4 B2 F5 B3, then B4 B5 */
    sched_action_t a[12];
    assert_int_equal(sched_build(SCHED_1F1B, 4, 6, 1, a), 0);
    const char *want = "F0F1F2B0F3B1F4B2F5B3B4B5";
    char got[64] = "";
    for (int i = 0; i < 12; i++) {
        char t[8];
        snprintf(t, sizeof t, "%c%d", a[i].op == SCHED_F ? 'F' : 'B', a[i].mb);
        strcat(got, t);
    }
    assert_string_equal(got, want);
    /* last stage alternates from the start */
    assert_int_equal(sched_build(SCHED_1F1B, 4, 6, 3, a), 0);
    assert_int_equal(a[0].op, SCHED_F);
    assert_int_equal(a[1].op, SCHED_B);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    sched_action_t a[4];
    assert_int_equal(sched_build(SCHED_1F1B, 0, 2, 0, a), TAH_EINVAL);
    assert_int_equal(sched_build(SCHED_1F1B, 2, 0, 0, a), TAH_EINVAL);
    assert_int_equal(sched_build(SCHED_1F1B, 2, 2, 2, a), TAH_EINVAL);
    assert_int_equal(sched_build(SCHED_GPIPE, 2, 2, -1, a), TAH_EINVAL);
    assert_int_equal(sched_build((sched_kind_t)7, 2, 2, 0, a), TAH_EINVAL);
    sched_kind_t k;
    assert_int_equal(sched_parse("1f1b", &k), 0);
    assert_int_equal(k, SCHED_1F1B);
    assert_int_equal(sched_parse("gpipe", &k), 0);
    assert_int_equal(k, SCHED_GPIPE);
    assert_int_equal(sched_parse("zb", &k), TAH_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedules_valid),
        cmocka_unit_test(test_1f1b_shape),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
