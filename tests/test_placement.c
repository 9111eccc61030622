/* test_placement.c — the coordinator's layer split (coordinator/placement.h):
 * equal speeds give exactly tah-train's split; layers follow the speeds'
 * ratio (2:1, 3:1) and noise within a few percent does not move them; a GPU
 * node among CPU nodes takes all but one layer of each of theirs; unknown
 * speeds count as the fastest; every stage keeps a layer; nodes announcing
 * the same GPUs count with the group's best speed divided among them, per
 * precision. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

#include "errors.h"
#include "placement.h"
#include "trainer.h" /* trainer_split */

static void s_layers(int L, int S, const double *speed, int *n)
{
    int l0[16], l1[16];
    assert_int_equal(placement_split(L, S, speed, l0, l1), 0);
    for (int k = 0; k < S; k++) {
        assert_int_equal(l0[k], k ? l1[k - 1] : 0); /* contiguous, all layers */
        assert_true(l1[k] > l0[k]);
        n[k] = l1[k] - l0[k];
    }
    assert_int_equal(l1[S - 1], L);
}

static void test_equal_is_trainer_split(void **state)
{
    (void)state;
    for (int L = 1; L <= 48; L++)
        for (int S = 1; S <= L && S <= 8; S++) {
            double speed[8];
            int l0[8], l1[8], t0, t1;
            for (int k = 0; k < S; k++)
                speed[k] = 123.0;
            assert_int_equal(placement_split(L, S, speed, l0, l1), 0);
            for (int k = 0; k < S; k++) {
                trainer_split(L, S, k, &t0, &t1);
                assert_int_equal(l0[k], t0);
                assert_int_equal(l1[k], t1);
            }
        }
}

static void test_ratios_and_noise(void **state)
{
    (void)state;
    int n[4];
    s_layers(12, 2, (const double[]){ 200.0, 100.0 }, n);
    assert_int_equal(n[0], 8);
    assert_int_equal(n[1], 4);
    s_layers(12, 2, (const double[]){ 100.0, 300.0 }, n);
    assert_int_equal(n[0], 3);
    assert_int_equal(n[1], 9);
    /* +-5 % noise: the equal split */
    s_layers(12, 4, (const double[]){ 100.0, 95.0, 104.0, 97.0 }, n);
    for (int k = 0; k < 4; k++)
        assert_int_equal(n[k], 3);
}

static void test_gpu_among_cpus(void **state)
{
    (void)state;
    int n[3];
    /* a GPU's bf16 product (~600 TFLOP/s) next to two CPUs' sgemm (~1 TFLOP/s) */
    s_layers(12, 3, (const double[]){ 900.0, 600000.0, 1100.0 }, n);
    assert_int_equal(n[0], 1);
    assert_int_equal(n[1], 10);
    assert_int_equal(n[2], 1);
    /* 2^-16 of the fastest and slower: still one layer */
    s_layers(48, 2, (const double[]){ 1e9, 1e-3 }, n);
    assert_int_equal(n[0], 47);
    assert_int_equal(n[1], 1);
}

static void test_unknown_and_bad(void **state)
{
    (void)state;
    int n[3], l0[3], l1[3];
    s_layers(12, 3, (const double[]){ 0.0, NAN, 100.0 }, n);
    for (int k = 0; k < 3; k++)
        assert_int_equal(n[k], 4);
    s_layers(12, 3, (const double[]){ 0.0, 0.0, 0.0 }, n);
    assert_int_equal(n[0], 4);
    assert_int_equal(placement_split(2, 3, (const double[]){ 1, 1, 1 }, l0, l1), TAH_EINVAL);
    assert_int_equal(placement_split(2, 0, (const double[]){ 1 }, l0, l1), TAH_EINVAL);
}

static void test_shared_gpus(void **state)
{
    (void)state;
    const double f32[4] = { 40000.0, 52000.0, 30000.0, 60000.0 };
    const double bf16[4] = { 500000.0, 700000.0, 450000.0, 0.0 };
    const char *dev[4] = { "aa", "aa", "aa", "" };
    double sp[4];
    placement_speeds(4, f32, bf16, dev, 0, sp);
    for (int k = 0; k < 3; k++) /* three nodes on GPU aa: its best fp32 speed, a third each */
        assert_true(fabs(sp[k] - 52000.0 / 3.0) < 1e-9);
    assert_true(sp[3] == 60000.0);
    placement_speeds(4, f32, bf16, dev, 1, sp);
    for (int k = 0; k < 3; k++)
        assert_true(fabs(sp[k] - 700000.0 / 3.0) < 1e-9);
    assert_true(sp[3] == 60000.0); /* no bf16 figure: its fp32 one */
    /* four nodes on one GPU whose concurrent measurements differed: one split */
    const double noisy[4] = { 61000.0, 33000.0, 47000.0, 52000.0 }, zero[4] = { 0 };
    const char *one[4] = { "0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef",
                           "0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef" };
    placement_speeds(4, noisy, zero, one, 1, sp);
    int n[4];
    s_layers(12, 4, sp, n);
    for (int k = 0; k < 4; k++)
        assert_int_equal(n[k], 3);
    /* different GPUs (or none announced) are not grouped */
    const char *two[4] = { "aa", "bb", NULL, "" };
    placement_speeds(4, f32, bf16, two, 0, sp);
    for (int k = 0; k < 4; k++)
        assert_true(sp[k] == f32[k]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal_is_trainer_split), cmocka_unit_test(test_ratios_and_noise),
        cmocka_unit_test(test_gpu_among_cpus),         cmocka_unit_test(test_unknown_and_bad),
        cmocka_unit_test(test_shared_gpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
