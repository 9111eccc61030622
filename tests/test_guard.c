/* test_guard.c — node/guard.c, the hostile-input rules after link_check:
 *   replay      each (kind, step, mb) admitted once, consumed or not; the
 *               two-step window slides; a rejected message is not "seen"
 *   norm bound  L2 norm vs max_norm_ratio x the running estimate per kind;
 *               the estimate follows admitted frames only; 0 turns it off
 * and the job keys max_norm_ratio / max_bad_frames (coordinator/jobfile.c). */
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
#include "guard.h"
#include "jobfile.h"
#include "wire.h" /* TAH__DATA_KIND__* */

enum { N = 96 };

static int s_admit(guard_t *g, uint32_t kind, int step, int mb, const float *x, size_t n)
{
    char err[256] = "";
    int rc = guard_admit(g, kind, step, mb, x, n, err, sizeof err);
    if (rc)
        assert_true(err[0] != 0); /* every rejection says why */
    return rc;
}

/* x = scale * (a fixed pseudo-random vector of norm ~ sqrt(N/3)) */
static void s_fill(float *x, float scale, uint32_t seed)
{
    for (int i = 0; i < N; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = scale * ((float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f);
    }
}

static void test_replay(void **state)
{
    (void)state;
    guard_t *g = guard_new(3, 2, 0.0);
    assert_non_null(g);
    const uint32_t ACT = TAH__DATA_KIND__DATA_ACT, GRAD = TAH__DATA_KIND__DATA_GRAD,
                   EVAL = TAH__DATA_KIND__DATA_EVAL, NORM = TAH__DATA_KIND__DATA_NORM;
    assert_int_equal(s_admit(g, ACT, 1, 0, NULL, 0), 0);
    assert_int_equal(s_admit(g, ACT, 1, 0, NULL, 0), TAH_ERANGE); /* replay */
    assert_int_equal(s_admit(g, ACT, 1, 1, NULL, 0), 0);
    assert_int_equal(s_admit(g, GRAD, 1, 0, NULL, 0), 0);          /* other kind, own window */
    assert_int_equal(s_admit(g, EVAL, 1, 0, NULL, 0), 0);
    assert_int_equal(s_admit(g, EVAL, 1, 0, NULL, 0), TAH_ERANGE);
    assert_int_equal(s_admit(g, ACT, 2, 0, NULL, 0), 0);           /* the next step */
    assert_int_equal(s_admit(g, ACT, 1, 2, NULL, 0), 0);           /* step 1 still open */
    assert_int_equal(s_admit(g, ACT, 1, 1, NULL, 0), TAH_ERANGE);  /* and still remembered */
    assert_int_equal(s_admit(g, ACT, 3, 0, NULL, 0), 0);           /* step 3 takes step 1's slot */
    assert_int_equal(s_admit(g, ACT, 3, 0, NULL, 0), TAH_ERANGE);
    assert_int_equal(s_admit(g, ACT, 3, 1, NULL, 0), 0);           /* step 1's flags are gone */
    assert_int_equal(s_admit(g, ACT, 1, 2, NULL, 0), TAH_ERANGE);  /* a step older than the window */
    assert_int_equal(s_admit(g, ACT, 2, 0, NULL, 0), TAH_ERANGE);  /* step 2 is still in it */
    assert_int_equal(s_admit(g, NORM, 3, 0, NULL, 0), 0);
    assert_int_equal(s_admit(g, NORM, 3, 0, NULL, 0), TAH_ERANGE);
    /* out of range for the window (link_check rejects these first) */
    assert_int_equal(s_admit(g, ACT, 3, 3, NULL, 0), TAH_ERANGE);
    assert_int_equal(s_admit(g, ACT, 0, 0, NULL, 0), TAH_ERANGE);
    assert_int_equal(s_admit(g, ACT, 3, -1, NULL, 0), TAH_ERANGE);
    assert_int_equal(s_admit(g, 99, 3, 0, NULL, 0), TAH_ERANGE);
    /* ping carries no step: always admitted */
    assert_int_equal(s_admit(g, TAH__DATA_KIND__DATA_PING, 0, 0, NULL, 0), 0);
    assert_int_equal(s_admit(g, TAH__DATA_KIND__DATA_PING, 0, 0, NULL, 0), 0);
    guard_destroy(&g);
    assert_null(g);
    guard_destroy(&g); /* NULL is fine */
}

static void test_norm_bound(void **state)
{
    (void)state;
    const double ratio = 100.0;
    guard_t *g = guard_new(8, 0, ratio);
    const uint32_t ACT = TAH__DATA_KIND__DATA_ACT, GRAD = TAH__DATA_KIND__DATA_GRAD;
    float x[N], big[N], huge[N];
    s_fill(x, 1.0f, 1);
    double n1 = 0;
    for (int i = 0; i < N; i++)
        n1 += (double)x[i] * x[i];
    n1 = sqrt(n1);
    assert_int_equal(s_admit(g, ACT, 1, 0, x, N), 0);
    assert_true(fabs(guard_norm_estimate(g, ACT) - n1) <= 1e-9 * n1); /* the first frame sets it */
    s_fill(big, 50.0f, 2);     /* ~50x: inside the bound */
    assert_int_equal(s_admit(g, ACT, 1, 1, big, N), 0);
    double est = guard_norm_estimate(g, ACT);
    assert_true(est > n1 && est < 10 * n1); /* moved by GUARD_EMA_WEIGHT of the new norm */
    s_fill(huge, 1e6f, 3);
    char err[256];
    assert_int_equal(guard_admit(g, ACT, 1, 2, huge, N, err, sizeof err), TAH_ERANGE);
    assert_non_null(strstr(err, "max_norm_ratio 100"));
    assert_true(guard_norm_estimate(g, ACT) == est); /* rejected frames do not move the estimate */
    /* ...and are not remembered: the genuine frame for that micro-batch still gets in */
    assert_int_equal(s_admit(g, ACT, 1, 2, x, N), 0);
    /* per kind: GRAD has no estimate yet, so its first frame sets one */
    assert_int_equal(s_admit(g, GRAD, 1, 0, huge, N), 0);
    assert_int_equal(s_admit(g, GRAD, 1, 1, x, N), 0);
    /* the bound is exactly ratio x estimate */
    est = guard_norm_estimate(g, ACT);
    float at[N];
    for (int i = 0; i < N; i++)
        at[i] = 0.0f;
    at[0] = (float)(ratio * est * 0.999);
    assert_int_equal(s_admit(g, ACT, 1, 3, at, N), 0);
    est = guard_norm_estimate(g, ACT);
    at[0] = (float)(ratio * est * 1.001);
    assert_int_equal(s_admit(g, ACT, 1, 4, at, N), TAH_ERANGE);
    /* NORM_PARTIAL / NORM carry no tensor: no norm rule */
    assert_int_equal(s_admit(g, TAH__DATA_KIND__DATA_NORM, 1, 0, NULL, 0), 0);
    guard_destroy(&g);

    /* an all-zero history bounds nothing (the estimate is 0) */
    g = guard_new(4, 0, ratio);
    float z[N];
    memset(z, 0, sizeof z);
    assert_int_equal(s_admit(g, ACT, 1, 0, z, N), 0);
    assert_int_equal(s_admit(g, ACT, 1, 1, huge, N), 0);
    guard_destroy(&g);

    /* ratio 0: off */
    g = guard_new(4, 0, 0.0);
    assert_int_equal(s_admit(g, ACT, 1, 0, x, N), 0);
    assert_int_equal(s_admit(g, ACT, 1, 1, huge, N), 0);
    /* a non-finite tensor (codec_decode rejects these first) is never admitted */
    float inf[N];
    memcpy(inf, x, sizeof inf);
    inf[7] = INFINITY;
    assert_int_equal(s_admit(g, ACT, 1, 2, inf, N), TAH_ENONFINITE);
    inf[7] = NAN;
    assert_int_equal(s_admit(g, ACT, 1, 2, inf, N), TAH_ENONFINITE);
    guard_destroy(&g);

    /* a norm computed elsewhere (a GPU stage's decoder): the same rules, the same estimate */
    guard_t *a = guard_new(8, 0, ratio), *b = guard_new(8, 0, ratio);
    assert_int_equal(s_admit(a, ACT, 1, 0, x, N), 0);
    assert_int_equal(guard_admit_norm(b, ACT, 1, 0, n1, err, sizeof err), 0);
    assert_true(fabs(guard_norm_estimate(b, ACT) - guard_norm_estimate(a, ACT)) <= 1e-12 * n1);
    assert_int_equal(guard_admit_norm(b, ACT, 1, 1, 1.001 * ratio * guard_norm_estimate(b, ACT), err, sizeof err),
                     TAH_ERANGE);
    assert_int_equal(guard_admit_norm(b, ACT, 1, 1, INFINITY, err, sizeof err), TAH_ENONFINITE);
    assert_int_equal(guard_admit_norm(b, ACT, 1, 1, n1, err, sizeof err), 0);
    assert_int_equal(guard_admit_norm(b, ACT, 1, 1, n1, err, sizeof err), TAH_ERANGE); /* replayed */
    guard_destroy(&a);
    guard_destroy(&b);
}

static void test_job_keys(void **state)
{
    (void)state;
    job_spec_t *j = malloc(sizeof *j);
    assert_non_null(j);
    char err[512];
    const char *base = "[job]\nmodel = 4,2,64,32,256\ntrain_data = t.txt\nbatch = 2\nseq = 16\nsteps = 5\nlr = 1e-3\n";
    char text[1024];
    assert_int_equal(jobfile_parse(base, "a.ini", j, err, sizeof err), 0);
    assert_true(j->max_norm_ratio == JOB_DEFAULT_MAX_NORM_RATIO);
    assert_int_equal(j->max_bad_frames, JOB_DEFAULT_MAX_BAD_FRAMES);
    assert_true(j->stall_timeout == JOB_STALL_AUTO);
    snprintf(text, sizeof text, "%smax_norm_ratio = 50\nmax_bad_frames = 3\nstall_timeout = 2.5\n", base);
    assert_int_equal(jobfile_parse(text, "b.ini", j, err, sizeof err), 0);
    assert_true(j->max_norm_ratio == 50.0);
    assert_int_equal(j->max_bad_frames, 3);
    assert_true(j->stall_timeout == 2.5);
    snprintf(text, sizeof text, "%smax_norm_ratio = 0\nmax_bad_frames = 0\nstall_timeout = 0\n", base);
    assert_int_equal(jobfile_parse(text, "c.ini", j, err, sizeof err), 0);
    assert_true(j->max_norm_ratio == 0.0);
    assert_int_equal(j->max_bad_frames, 0);
    assert_true(j->stall_timeout == 0.0);
    snprintf(text, sizeof text, "%sstall_timeout = auto\n", base);
    assert_int_equal(jobfile_parse(text, "e.ini", j, err, sizeof err), 0);
    assert_true(j->stall_timeout == JOB_STALL_AUTO);
    static const char *bad[] = { "max_norm_ratio = 0.5\n", "max_norm_ratio = nan\n", "max_norm_ratio = x\n",
                                 "max_bad_frames = -1\n",  "max_bad_frames = 2.5\n",  "stall_timeout = 0.5\n",
                                 "stall_timeout = inf\n",  "stall_timeout = -1\n",    "stall_timeout = 1e8\n",
                                 "stall_timeout = Auto\n" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, "%s%s", base, bad[i]);
        assert_int_equal(jobfile_parse(text, "d.ini", j, err, sizeof err), TAH_EINVAL);
        assert_non_null(strstr(err, "d.ini:8:"));
    }
    free(j);
}

/* The stall watchdog's limit: off, explicit, auto before and after a
 * placement's first step report, and 20 times the slowest step above each */
static void test_stall_limit(void **state)
{
    (void)state;
    assert_true(jobfile_stall_limit(0, 1, 100) == 0);
    assert_true(jobfile_stall_limit(5, 0, 0) == 5);
    assert_true(jobfile_stall_limit(5, 1, 0.2) == 5);
    assert_true(jobfile_stall_limit(5, 1, 1.0) == 20);
    assert_true(jobfile_stall_limit(JOB_STALL_AUTO, 0, 0) == JOB_STALL_AUTO_FIRST);
    assert_true(jobfile_stall_limit(JOB_STALL_AUTO, 1, 0) == JOB_STALL_AUTO_NEXT);
    assert_true(jobfile_stall_limit(JOB_STALL_AUTO, 1, 2.0) == JOB_STALL_AUTO_NEXT);
    assert_true(jobfile_stall_limit(JOB_STALL_AUTO, 1, 10.0) == 200);
    assert_true(jobfile_stall_limit(JOB_STALL_AUTO, 0, 20.0) == 400);
    assert_true(JOB_STALL_AUTO_NEXT < JOB_STALL_AUTO_FIRST);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay),
        cmocka_unit_test(test_norm_bound),
        cmocka_unit_test(test_job_keys),
        cmocka_unit_test(test_stall_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
