/* test_tpcomm.c — the tensor-parallel all-reduce (pipeline/tpcomm.h) on
 * worker threads (pipeline/tpteam.h): codec none is the exact fp32 sum in
 * rank order on every rank; ash-fp8 and int stay within error bounds
 * derived from their formats; every codec gives the same bits on every rank
 * and in every run; sizes that do not divide by tp (down to 1 float) work;
 * a non-finite input fails on every rank with one code, without deadlock;
 * stochastic rounding draws fresh coins for every all-reduce and rank. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "errors.h"
#include "tpcomm.h"
#include "tpteam.h"

typedef struct s_job {
    tp_comm_t *comm;
    float *buf[TP_MAX]; /* per rank, n floats */
    size_t n;
    uint64_t id; /* the all-reduce's id (tpcomm.h) */
    int rc[TP_MAX];
    char err[TP_MAX][256];
} s_job_t;

static void s_rank(void *arg, int rank)
{
    s_job_t *j = arg;
    j->rc[rank] = tp_allreduce(j->comm, rank, j->buf[rank], j->n, j->id, j->err[rank], sizeof j->err[rank]);
}

static uint64_t s_rng = 0x9e3779b97f4a7c15ull;
static float s_gauss(void)
{
    double u[2];
    for (int k = 0; k < 2; k++) {
        s_rng ^= s_rng << 13;
        s_rng ^= s_rng >> 7;
        s_rng ^= s_rng << 17;
        u[k] = ((double)(s_rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

static tp_comm_t *s_comm(int tp, const char *rs, const char *ag, size_t max_n)
{
    codec_spec_t a, b;
    char err[256] = "";
    assert_int_equal(tp_codec_parse(rs, &a, err, sizeof err), 0);
    assert_int_equal(tp_codec_parse(ag, &b, err, sizeof err), 0);
    tp_comm_t *c = tp_comm_new(tp_shm_new(tp, err, sizeof err), &a, &b, max_n, err, sizeof err);
    if (!c)
        fail_msg("tp_comm_new: %s", err);
    return c;
}

/* fill every rank's buf (scaled Gaussians, one spike), run, return 0 */
static void s_fill(s_job_t *j, int tp, size_t n, float scale)
{
    j->n = n;
    for (int r = 0; r < tp; r++) {
        j->buf[r] = realloc(j->buf[r], (n ? n : 1) * sizeof(float));
        for (size_t i = 0; i < n; i++)
            j->buf[r][i] = scale * s_gauss();
        if (n > 10)
            j->buf[r][n / 3] = 40.0f * scale; /* an outlier */
    }
}

static void s_free(s_job_t *j)
{
    for (int r = 0; r < TP_MAX; r++) {
        free(j->buf[r]);
        j->buf[r] = NULL;
    }
}

static void s_run(tp_team_t *team, s_job_t *j)
{
    tp_team_run(team, s_rank, j);
    for (int r = 0; r < tp_team_size(team); r++)
        if (j->rc[r])
            fail_msg("rank %d: %s (%s)", r, j->err[r], tah_strerror(j->rc[r]));
}

/* every rank holds the same bits */
static void s_assert_same(const s_job_t *j, int tp)
{
    for (int r = 1; r < tp; r++)
        assert_memory_equal(j->buf[0], j->buf[r], j->n * sizeof(float));
}

static void test_none_exact(void **state)
{
    (void)state;
    const int tps[] = { 2, 3, 4, 8 };
    const size_t ns[] = { 1, 2, 7, 100, 4099, 65536 + 5 };
    for (size_t a = 0; a < sizeof tps / sizeof tps[0]; a++) {
        int tp = tps[a];
        tp_team_t *team = tp_team_new(tp, NULL, 0);
        assert_non_null(team);
        tp_comm_t *c = s_comm(tp, "none", "none", 65536 + 5);
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
            s_job_t j = { .comm = c };
            size_t n = ns[b];
            s_fill(&j, tp, n, 1.0f);
            float *want = malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) {
                float s = j.buf[0][i];
                for (int r = 1; r < tp; r++)
                    s += j.buf[r][i];
                want[i] = s;
            }
            s_run(team, &j);
            /* bit-exact: the plain fp32 sum in rank order */
            for (int r = 0; r < tp; r++)
                assert_memory_equal(j.buf[r], want, n * sizeof(float));
            free(want);
            s_free(&j);
        }
        tp_comm_destroy(&c);
        tp_team_destroy(&team);
    }
}

static double s_norm(const float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return sqrt(s);
}

/* ASH-FP8 bound. One compression of a block z (after the orthonormal
 * Hadamard, which preserves the L2 norm) rounds each code to E4M3: 3
 * mantissa bits, so a normal code is off by at most half an ulp, 2^-4 of its
 * magnitude; a subnormal code (|q| < 2^-6) by at most half the subnormal
 * spacing 2^-9, i.e. 2^-10 * s with s = max|z| / 448 <= ||z|| / 448. So
 * ||Q(z) - z|| <= (2^-4 + sqrt(n) * 2^-10 / 448) ||z|| =: eps, plus float32
 * rounding in the scale and the transform (2^-20 covers it). Blocks add in
 * squares, so the same eps bounds a whole chunk. Two-shot:
 *   out = Q2(S'), S' = sum_r Q1(x_r) (fp32 sum), S = sum_r x_r
 *   ||out - S|| <= eps ||S'|| + eps sum_r ||x_r||,  ||S'|| <= ||S|| + eps sum_r ||x_r||. */
static void test_ash_fp8_bound(void **state)
{
    (void)state;
    const int tps[] = { 2, 4 };
    const size_t ns[] = { 3000, 65536, 100003 };
    const int block = 256;
    const double eps = 1.0 / 16 + sqrt((double)block) / 1024.0 / 448.0 + 1.0 / (1 << 20);
    for (size_t a = 0; a < 2; a++) {
        int tp = tps[a];
        tp_team_t *team = tp_team_new(tp, NULL, 0);
        tp_comm_t *c = s_comm(tp, "ash-fp8", "ash-fp8", 100003);
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
            s_job_t j = { .comm = c };
            size_t n = ns[b];
            s_fill(&j, tp, n, 0.01f);
            float *want = malloc(n * sizeof(float));
            double sum_norms = 0.0;
            for (int r = 0; r < tp; r++)
                sum_norms += s_norm(j.buf[r], n);
            for (size_t i = 0; i < n; i++) {
                double s = 0.0;
                for (int r = 0; r < tp; r++)
                    s += j.buf[r][i];
                want[i] = (float)s;
            }
            s_run(team, &j);
            s_assert_same(&j, tp);
            double d = 0.0;
            for (size_t i = 0; i < n; i++)
                d += ((double)j.buf[0][i] - want[i]) * ((double)j.buf[0][i] - want[i]);
            double normS = s_norm(want, n), err = sqrt(d);
            double bound = eps * (normS + eps * sum_norms) + eps * sum_norms;
            if (!(err <= bound))
                fail_msg("ash-fp8 tp=%d n=%zu: error %.4g > bound %.4g (rel %.4g)", tp, n, err, bound, err / normS);
            /* and it did compress: a lossless path would be ~1e-7 */
            assert_true(err / normS > 1e-3);
            free(want);
            s_free(&j);
        }
        tp_comm_destroy(&c);
        tp_team_destroy(&team);
    }
}

/* INT-b, asymmetric, per group (intq.c): the grid [mn, mn + L*step] with
 * L = 2^b - 1 covers the group, mn rounded down and step rounded up to fp16
 * (2^-10 relative each), codes round to nearest: |error| <= step / 2 <=
 * (range + 2^-10 |mn|)(1 + 2^-10) / (2L) <= M (1 + 2^-8) / L with M the
 * group's max |x| (range <= 2M). Max-norm over the tensor, two shots
 * (INT4 reduce-scatter, INT8 all-gather):
 *   |out - S| <= e8 max|S'| + e4 sum_r max|x_r|, max|S'| <= max|S| + e4 sum_r max|x_r|
 * plus fp32 summation (tp * 2^-23 * sum_r max|x_r|). */
static void test_int_two_specs(void **state)
{
    (void)state;
    const int tp = 4;
    const size_t n = 50000;
    const double e4 = (1.0 + 1.0 / 256) / 15.0, e8 = (1.0 + 1.0 / 256) / 255.0;
    tp_team_t *team = tp_team_new(tp, NULL, 0);
    tp_comm_t *c = s_comm(tp, "int:bits=4", "int:bits=8", n);
    s_job_t j = { .comm = c };
    s_fill(&j, tp, n, 1.0f);
    float *want = malloc(n * sizeof(float));
    double sum_max = 0.0, max_s = 0.0;
    for (int r = 0; r < tp; r++) {
        double m = 0.0;
        for (size_t i = 0; i < n; i++)
            m = fmax(m, fabs(j.buf[r][i]));
        sum_max += m;
    }
    for (size_t i = 0; i < n; i++) {
        double s = 0.0;
        for (int r = 0; r < tp; r++)
            s += j.buf[r][i];
        want[i] = (float)s;
        max_s = fmax(max_s, fabs(s));
    }
    s_run(team, &j);
    s_assert_same(&j, tp);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)j.buf[0][i] - want[i]));
    double bound = e8 * (max_s + e4 * sum_max) + e4 * sum_max + tp * sum_max / 8388608.0;
    if (!(worst <= bound))
        fail_msg("int4/int8 tp=%d: max error %.4g > bound %.4g", tp, worst, bound);
    assert_true(worst > 1e-4); /* it quantized */
    /* the two specs really differ: int8 both ways is closer */
    tp_comm_t *c8 = s_comm(tp, "int:bits=8", "int:bits=8", n);
    s_job_t j8 = { .comm = c8 };
    s_rng = 12345;
    s_fill(&j8, tp, n, 1.0f);
    s_rng = 12345;
    s_fill(&j, tp, n, 1.0f);
    s_run(team, &j);
    s_run(team, &j8);
    double d4 = 0.0, d8 = 0.0;
    /* reference sum from a fresh fill */
    s_rng = 12345;
    s_job_t ref = { .comm = c };
    s_fill(&ref, tp, n, 1.0f);
    for (size_t i = 0; i < n; i++) {
        double s = 0.0;
        for (int r = 0; r < tp; r++)
            s += ref.buf[r][i];
        d4 += (j.buf[0][i] - s) * (j.buf[0][i] - s);
        d8 += (j8.buf[0][i] - s) * (j8.buf[0][i] - s);
    }
    assert_true(d8 < d4 / 4);
    assert_true(tp_comm_wire_bytes(c, n) < tp_comm_wire_bytes(c8, n));
    free(want);
    s_free(&j);
    s_free(&j8);
    s_free(&ref);
    tp_comm_destroy(&c);
    tp_comm_destroy(&c8);
    tp_team_destroy(&team);
}

/* the same bits in every run, for a lossy codec too (fixed chunks, fixed order) */
static void test_deterministic(void **state)
{
    (void)state;
    const int tp = 3;
    const size_t n = 7777;
    tp_team_t *team = tp_team_new(tp, NULL, 0);
    tp_comm_t *c = s_comm(tp, "ash-fp8:block=64", "int:bits=8,group=32", n);
    s_job_t j1 = { .comm = c }, j2 = { .comm = c };
    s_rng = 777;
    s_fill(&j1, tp, n, 2.0f);
    s_rng = 777;
    s_fill(&j2, tp, n, 2.0f);
    s_run(team, &j1);
    s_run(team, &j2);
    s_assert_same(&j1, tp);
    assert_memory_equal(j1.buf[0], j2.buf[0], n * sizeof(float));
    /* smaller all-reduces through the same group, down to one float */
    for (size_t m = 1; m < 40; m += 3) {
        s_fill(&j1, tp, m, 1.0f);
        s_run(team, &j1);
        s_assert_same(&j1, tp);
    }
    s_free(&j1);
    s_free(&j2);
    tp_comm_destroy(&c);
    tp_team_destroy(&team);
}

/* a NaN on one rank: every rank returns the encoder's code, only that rank
 * has a message, and the group keeps working afterwards */
static void test_nonfinite(void **state)
{
    (void)state;
    const int tp = 4;
    const size_t n = 1000;
    tp_team_t *team = tp_team_new(tp, NULL, 0);
    tp_comm_t *c = s_comm(tp, "ash-fp8", "ash-fp8", n);
    for (int bad = 0; bad < tp; bad++) {
        s_job_t j = { .comm = c };
        s_fill(&j, tp, n, 1.0f);
        j.buf[bad][123] = NAN;
        tp_team_run(team, s_rank, &j);
        for (int r = 0; r < tp; r++) {
            assert_int_equal(j.rc[r], TAH_ENONFINITE);
            if (r == bad)
                assert_non_null(strstr(j.err[r], "encoding chunk"));
            else
                assert_string_equal(j.err[r], "");
        }
        s_fill(&j, tp, n, 1.0f);
        s_run(team, &j);
        s_free(&j);
    }
    /* codec none has no encoder to refuse: the NaN is summed */
    tp_comm_t *cn = s_comm(tp, "none", "none", n);
    s_job_t j = { .comm = cn };
    s_fill(&j, tp, n, 1.0f);
    j.buf[2][5] = NAN;
    s_run(team, &j);
    assert_true(isnan(j.buf[0][5]) && isnan(j.buf[3][5]));
    /* more floats than the group was built for: refused on every rank */
    s_fill(&j, tp, n + 1, 1.0f);
    tp_team_run(team, s_rank, &j);
    for (int r = 0; r < tp; r++)
        assert_int_equal(j.rc[r], TAH_EINVAL);
    s_free(&j);
    tp_comm_destroy(&cn);
    tp_comm_destroy(&c);
    tp_team_destroy(&team);
}

/* mean squared difference of a and b */
static double s_msd(const float *a, const float *b, size_t n)
{
    double d = 0.0;
    for (size_t i = 0; i < n; i++)
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return d / (double)n;
}

/* Stochastic fixpt (reduce-scatter; raw all-gather, so the rounding is all
 * in the first shot). Its error variance per element, v = f(1-f) step^2,
 * depends on x alone; independent coins add variances.
 * Ranks: every rank holds the same x; with a coin of its own per rank the
 * sum's error variance is tp * v, with shared coins the errors are equal
 * and it is tp^2 * v. Calls: the mean of K all-reduces of the same inputs
 * under K ids is K times closer to the exact sum than one of them, with
 * shared coins no closer. The same id gives the same bits. */
static void test_stochastic_fresh_coins(void **state)
{
    (void)state;
    const int tp = 4, K = 16;
    const size_t n = 65536;
    const char *spec = "fixpt:bits=8,stochastic=1,seed=5";
    tp_team_t *team = tp_team_new(tp, NULL, 0);
    tp_comm_t *c = s_comm(tp, spec, "none", n);
    s_job_t j = { .comm = c };
    s_rng = 4242;
    s_fill(&j, tp, n, 1.0f);
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    float *mean = calloc(n, sizeof(float));
    uint8_t *frame = malloc(1 << 20);
    assert_true(x && y && want && mean && frame);

    /* v: one encode-decode of x (any seed: v does not depend on it) */
    memcpy(x, j.buf[0], n * sizeof(float));
    codec_spec_t cs;
    char err[256] = "";
    size_t len = 0;
    assert_int_equal(codec_spec_parse(spec, &cs, err, sizeof err), 0);
    codec_shape_t sh = { 1, 1, (uint32_t)n };
    assert_int_equal(codec_encode(&cs, sh, x, frame, 1 << 20, &len, err, sizeof err), 0);
    assert_int_equal(codec_decode(frame, len, y, n, NULL, err, sizeof err), 0);
    const double v = s_msd(y, x, n);
    assert_true(v > 0.0);

    for (int r = 1; r < tp; r++)
        memcpy(j.buf[r], x, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        want[i] = ((x[i] + x[i]) + x[i]) + x[i];
    j.id = 7;
    s_run(team, &j);
    const double ratio = s_msd(j.buf[0], want, n) / v;
    if (!(ratio > 0.75 * tp && ratio < 1.25 * tp))
        fail_msg("equal inputs on %d ranks: error variance %.3f v, independent coins give %d v, shared ones %d v",
                 tp, ratio, tp, tp * tp);

    /* calls: K ids, the same inputs (s_fill's, different per rank) */
    double one = 0.0;
    float *first = malloc(n * sizeof(float));
    assert_non_null(first);
    for (int k = 0; k < K; k++) {
        s_rng = 99;
        s_fill(&j, tp, n, 1.0f);
        if (k == 0)
            for (size_t i = 0; i < n; i++)
                want[i] = ((j.buf[0][i] + j.buf[1][i]) + j.buf[2][i]) + j.buf[3][i];
        j.id = 1000 + (uint64_t)k;
        s_run(team, &j);
        s_assert_same(&j, tp);
        if (k == 0) {
            one = s_msd(j.buf[0], want, n);
            memcpy(first, j.buf[0], n * sizeof(float));
        }
        for (size_t i = 0; i < n; i++)
            mean[i] += j.buf[0][i] / (float)K;
    }
    const double avg = s_msd(mean, want, n) / one;
    if (!(avg < 2.0 / K))
        fail_msg("the mean of %d all-reduces has %.3f of one's error variance: independent coins give %.3f, shared "
                 "ones 1", K, avg, 1.0 / K);
    /* the same id again: the same bits */
    s_rng = 99;
    s_fill(&j, tp, n, 1.0f);
    j.id = 1000;
    s_run(team, &j);
    assert_memory_equal(j.buf[0], first, n * sizeof(float));

    free(x);
    free(y);
    free(want);
    free(mean);
    free(frame);
    free(first);
    s_free(&j);
    tp_comm_destroy(&c);
    tp_team_destroy(&team);
}

static void test_specs(void **state)
{
    (void)state;
    codec_spec_t s;
    char err[256] = "", buf[128];
    assert_int_equal(tp_codec_parse("none", &s, err, sizeof err), 0);
    assert_int_equal(s.id, 0);
    assert_int_equal(tp_codec_format(&s, buf, sizeof buf), 0);
    assert_string_equal(buf, "none");
    assert_int_equal(tp_codec_parse("int:bits=4", &s, err, sizeof err), 0);
    assert_int_equal(s.id, CODEC_INT);
    assert_int_equal(s.p.intq.bits, 4);
    assert_int_equal(tp_codec_parse("ash-fp8:block=128", &s, err, sizeof err), 0);
    assert_int_equal(s.p.ash.block, 128);
    assert_int_not_equal(tp_codec_parse("tah", &s, err, sizeof err), 0);
    assert_non_null(strstr(err, "not the tensor-parallel all-reduce"));
    assert_int_not_equal(tp_codec_parse("zip", &s, err, sizeof err), 0);
    assert_int_not_equal(tp_codec_parse("int:bits=7", &s, err, sizeof err), 0);
    assert_null(tp_shm_new(0, err, sizeof err));
    assert_null(tp_shm_new(TP_MAX + 1, err, sizeof err));
    assert_non_null(strstr(err, "1..8"));
    /* ash-fp8 moves about a quarter of the bytes of none */
    tp_comm_t *a = s_comm(4, "ash-fp8", "ash-fp8", 1 << 20), *b = s_comm(4, "none", "none", 1 << 20);
    size_t wa = tp_comm_wire_bytes(a, 1 << 20), wb = tp_comm_wire_bytes(b, 1 << 20);
    assert_int_equal(wb, 2 * 3 * (1 << 18) * sizeof(float));
    assert_true(wa * 10 < wb * 3 && wa * 10 > wb * 2);
    tp_comm_destroy(&a);
    tp_comm_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_none_exact),  cmocka_unit_test(test_ash_fp8_bound),
        cmocka_unit_test(test_int_two_specs), cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_nonfinite),   cmocka_unit_test(test_stochastic_fresh_coins),
        cmocka_unit_test(test_specs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
