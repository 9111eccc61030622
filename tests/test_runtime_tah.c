/* test_runtime_tah.c — compressed pipeline on 4 nodes: TAH-Quant forward
 * (default 4/3-bit) and 8-bit scaled fixed-point backward. Every step's loss
 * equals tah-train's with the same codecs (the runtime adds nothing). After 200 steps
 * the loss (mean of the last 10 steps, to average out batch noise) must be
 * within 2 % of tah-train's fp32 run of the same job, and the bytes on the
 * wire must show the compression (> 3x against fp32 frames: ~4 bits
 * forward and 8 bits backward per element plus per-tile scales). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "rt_harness.h"

static double s_tail_mean(const double *v, int n, int k)
{
    double s = 0.0;
    for (int i = n - k; i < n; i++)
        s += v[i];
    return s / k;
}

static void test_tah_within_2pct_of_fp32(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_tah");
    rt_start_coord(&r, 10.0, 0);
    rt_start_nodes(&r, 4);
    const int steps = 200;
    char ini[1024], out[4096], st[64], reason[512];
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 4\nseq = 32\nsteps = %d\nlr = 3e-3\n"
             "stages = 4\nmicro_batches = 2\nfwd_codec = tah\nbwd_codec = fixpt:bits=8\n",
             steps);
    uint64_t job = rt_submit(&r, rt_write(&r, "tah.ini", ini), out, sizeof out);
    if (!job)
        fail_msg("submit: %s", out);
    assert_true(rt_wait_job(&r, job, 500, st, sizeof st, reason, sizeof reason));
    if (strcmp(st, "succeeded") != 0)
        fail_msg("job: %s: %s", st, reason);
    Tah__Envelope *e = rt_status(&r, job);
    char metrics[1200];
    snprintf(metrics, sizeof metrics, "%s", e->status_rep->jobs[0]->metrics_path);
    wire_envelope_free(&e);

    char train[700], ref[700];
    snprintf(train, sizeof train, "%s/train.txt", r.dir);
    snprintf(ref, sizeof ref, "%s/fp32.jsonl", r.dir);
    char *targv[] = { TAH_TRAIN_EXE, "--model", "4,2,64,32,256", "--train-data", train, "--batch", "4", "--seq",
                      "32", "--steps", "200", "--lr", "3e-3", "--stages", "4", "--micro-batches", "2",
                      "--threads", "1", "--metrics", ref, "--quiet", NULL };
    assert_int_equal(rt_run(targv, out, sizeof out), 0);
    /* the same compressed job in one process: the runtime must not add
     * anything of its own (codecs are deterministic) */
    char tref[700];
    snprintf(tref, sizeof tref, "%s/tah.jsonl", r.dir);
    char *cargv[] = { TAH_TRAIN_EXE, "--model", "4,2,64,32,256", "--train-data", train, "--batch", "4", "--seq",
                      "32", "--steps", "200", "--lr", "3e-3", "--stages", "4", "--micro-batches", "2",
                      "--fwd-codec", "tah", "--bwd-codec", "fixpt:bits=8", "--threads", "1", "--metrics", tref,
                      "--quiet", NULL };
    assert_int_equal(rt_run(cargv, out, sizeof out), 0);
    static double a[256], b[256], c[256], wire[256], fp32[256];
    assert_int_equal(rt_metrics(tref, "loss", c, 256), steps);
    assert_int_equal(rt_metrics(metrics, "loss", a, 256), steps);
    assert_int_equal(rt_metrics(ref, "loss", b, 256), steps);
    for (int i = 0; i < steps; i++)
        if (fabs(a[i] - c[i]) > 1e-5 * (1 + fabs(c[i])))
            fail_msg("step %d: distributed loss %.6f, tah-train with the same codecs %.6f", i + 1, a[i], c[i]);
    double la = s_tail_mean(a, steps, 10), lb = s_tail_mean(b, steps, 10);
    print_message("loss after %d steps: tah/fixpt8 %.4f, fp32 %.4f (%.2f %%)\n", steps, la, lb,
                  100.0 * (la - lb) / lb);
    if (fabs(la - lb) > 0.02 * lb)
        fail_msg("compressed loss %.4f is not within 2 %% of fp32's %.4f", la, lb);
    assert_true(lb < a[0] - 1.0); /* and both actually trained */
    assert_int_equal(rt_metrics(metrics, "fwd_bytes", wire, 256), steps);
    double fb[256], bb[256];
    rt_metrics(metrics, "bwd_bytes", bb, 256);
    rt_metrics(metrics, "fp32_bytes", fp32, 256);
    memcpy(fb, wire, sizeof fb);
    double ratio = fp32[steps - 1] / (fb[steps - 1] + bb[steps - 1]);
    print_message("activation + gradient bytes per step: %.0f (fp32 frames: %.0f), %.2fx\n",
                  fb[steps - 1] + bb[steps - 1], fp32[steps - 1], ratio);
    assert_true(ratio > 3.0);
    assert_int_equal(rt_stop(&r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tah_within_2pct_of_fp32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
