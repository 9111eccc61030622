/* test_runtime.c — the distributed runtime against tah-train: a coordinator
 * and 4 nodes on loopback train the same job as tah-train (fp32 codec), and
 * every step's loss, gradient norm and validation loss must match. Then a
 * second job (2 stages, GPipe, untied head) on the same nodes, which must
 * have gone back to idle, and a third whose tied-embedding exchange goes
 * through a lossy codec (tied_codec). Same bits are expected (same init, data order,
 * schedule, tied sync and norm order, 1 thread each); the tolerance 1e-5
 * only absorbs the 6-decimal printing of metrics.jsonl. The nodes announce
 * one speed (TAH_NODE_TEST_GFLOPS), so every job gets tah-train's even layer
 * split: with a lossy boundary codec (the third job's gradients) another
 * split computes other bits, and measured speeds vary with the machine's
 * load (the third job failed that way under load, 1 run in 3). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h> /* setenv */
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "rt_harness.h"

static void s_compare(const char *dist, const char *ref, int steps)
{
    static const char *const keys[] = { "loss", "grad_norm", "val_loss", "lr" };
    const char *why = rt_metrics_diff(dist, ref, keys, 4, steps, 1e-5);
    if (why)
        fail_msg("%s", why);
}

static char s_metrics[1200]; /* the last job's metrics.jsonl (s_run_job) */

static void s_run_job(rt_t *r, const char *name, const char *ini, char *const train_argv[], int steps)
{
    char out[4096], state[64], reason[512];
    const char *path = rt_write(r, name, ini);
    uint64_t job = rt_submit(r, path, out, sizeof out);
    if (!job)
        fail_msg("submit failed: %s", out);
    assert_true(rt_wait_job(r, job, 240, state, sizeof state, reason, sizeof reason));
    if (strcmp(state, "succeeded") != 0)
        fail_msg("job %s: %s: %s", name, state, reason);
    /* status gives the metrics path; wait prints it too */
    Tah__Envelope *e = rt_status(r, job);
    assert_non_null(e);
    char metrics[1200];
    snprintf(metrics, sizeof metrics, "%s", e->status_rep->jobs[0]->metrics_path);
    snprintf(s_metrics, sizeof s_metrics, "%s", metrics);
    assert_int_equal(e->status_rep->jobs[0]->step, steps);
    assert_true(e->status_rep->jobs[0]->n_links > 0);
    wire_envelope_free(&e);
    char coord[160], jobs[32];
    snprintf(coord, sizeof coord, "%s", r->ep);
    snprintf(jobs, sizeof jobs, "%llu", (unsigned long long)job);
    char *wait_argv[] = { TAH_COORD_EXE, "wait", "--coordinator", coord, jobs, NULL };
    assert_int_equal(rt_run(wait_argv, out, sizeof out), 0);
    assert_non_null(strstr(out, metrics));
    int rc = rt_run(train_argv, out, sizeof out);
    if (rc != 0)
        fail_msg("tah-train failed (%d): %s", rc, out);
    char ref[700];
    snprintf(ref, sizeof ref, "%s/%s.ref.jsonl", r->dir, name);
    s_compare(metrics, ref, steps);
}

static void test_fp32_equals_tah_train(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_equal");
    rt_start_coord(&r, 10.0, 0);
    setenv("TAH_NODE_TEST_GFLOPS", "50", 1);
    rt_start_nodes(&r, 4);
    unsetenv("TAH_NODE_TEST_GFLOPS");
    char ini[2048], train[700], val[700], ref[700];
    snprintf(train, sizeof train, "%s/train.txt", r.dir);
    snprintf(val, sizeof val, "%s/val.txt", r.dir);

    /* 4 stages, 1F1B, validation, cosine LR with warm-up, weight decay,
     * periodic checkpoints */
    snprintf(ini, sizeof ini,
             "# the tah-train run below, as a job file\n[job]\nname = equal-4\nmodel = 4,2,64,32,256\n"
             "train_data = train.txt\nval_data = val.txt\nval_every = 5\nval_batches = 2\nbatch = 2\nseq = 16\n"
             "steps = 12\nlr = 3e-3\nwarmup = 3\nlr_schedule = cosine\nweight_decay = 0.1\nstages = 4\n"
             "micro_batches = 3\nschedule = 1f1b\nfwd_codec = fp32\nbwd_codec = fp32\nseed = 7\n"
             "checkpoint_every = 5\n");
    snprintf(ref, sizeof ref, "%s/a.ini.ref.jsonl", r.dir);
    char *a1[] = { TAH_TRAIN_EXE, "--model", "4,2,64,32,256", "--train-data", train, "--val-data", val,
                   "--val-every", "5", "--val-batches", "2", "--batch", "2", "--seq", "16", "--steps", "12",
                   "--lr", "3e-3", "--warmup", "3", "--lr-schedule", "cosine", "--weight-decay", "0.1",
                   "--stages", "4", "--micro-batches", "3", "--schedule", "1f1b", "--seed", "7", "--threads",
                   "1", "--metrics", ref, "--quiet", NULL };
    s_run_job(&r, "a.ini", ini, a1, 12);
    /* the validation passes' frames (steps 1, 5, 10, 12) are counted apart: every step's
     * training traffic is about the same (headers differ by a few varint bytes), and the
     * fp32 codec's frames are the fp32 frames (counted in them, they had halved "compression") */
    static double comp[32], fwd[32], valb[32];
    assert_int_equal(rt_metrics(s_metrics, "compression", comp, 32), 12);
    assert_int_equal(rt_metrics(s_metrics, "fwd_bytes", fwd, 32), 12);
    assert_int_equal(rt_metrics(s_metrics, "val_bytes", valb, 32), 12);
    for (int i = 0; i < 12; i++) {
        const int s = i + 1, eval = s == 1 || s % 5 == 0 || s == 12;
        if (fabs(comp[i] - 1.0) > 0.02 || fabs(fwd[i] - fwd[1]) > 0.01 * fwd[1])
            fail_msg("step %d: compression %.3f, fwd_bytes %.0f (step 2: %.0f)", s, comp[i], fwd[i], fwd[1]);
        /* 2 validation batches through 3 links, each an fp32 frame of a (2,16,64) tensor */
        if (eval ? !(valb[i] >= 3 * 2 * 2 * 16 * 64 * 4) : !isnan(valb[i]))
            fail_msg("step %d: val_bytes %.0f", s, valb[i]);
    }
    char ck[800];
    for (int k = 0; k < 4; k++) {
        snprintf(ck, sizeof ck, "%s/job1.stage%d.ckpt", r.dir, k);
        if (access(ck, R_OK) != 0)
            fail_msg("checkpoint %s missing", ck);
    }
    assert_true(rt_wait_nodes(&r, "idle", 4, 20));

    /* the same nodes again: 2 stages, GPipe, untied head */
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 8\n"
             "lr = 1e-3\nstages = 2\nmicro_batches = 2\nschedule = gpipe\nuntied = true\ngrad_clip = 0.5\n");
    snprintf(ref, sizeof ref, "%s/b.ini.ref.jsonl", r.dir);
    char *a2[] = { TAH_TRAIN_EXE, "--model", "4,2,64,32,256", "--train-data", train, "--batch", "2", "--seq",
                   "16", "--steps", "8", "--lr", "1e-3", "--stages", "2", "--micro-batches", "2", "--schedule",
                   "gpipe", "--untied", "--grad-clip", "0.5", "--threads", "1", "--metrics", ref, "--quiet",
                   NULL };
    s_run_job(&r, "b.ini", ini, a2, 8);
    assert_true(rt_wait_nodes(&r, "idle", 4, 20));

    /* 3 stages, tied, the tied exchange through 8-bit fixed point: both
     * ends sum the decoded frames, as tah-train --tied-codec does; that and
     * the gradients with stochastic rounding, whose seed each message derives
     * for its step, micro-batch and stage as tah-train does (link_spec) */
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 6\n"
             "lr = 3e-3\nstages = 3\nmicro_batches = 2\ntied_codec = fixpt:bits=8,stochastic=1,seed=4\n"
             "bwd_codec = fixpt:bits=8,stochastic=1,seed=9\n");
    snprintf(ref, sizeof ref, "%s/c.ini.ref.jsonl", r.dir);
    char *a3[] = { TAH_TRAIN_EXE, "--model", "4,2,64,32,256", "--train-data", train, "--batch", "2", "--seq",
                   "16", "--steps", "6", "--lr", "3e-3", "--stages", "3", "--micro-batches", "2",
                   "--tied-codec", "fixpt:bits=8,stochastic=1,seed=4", "--bwd-codec",
                   "fixpt:bits=8,stochastic=1,seed=9", "--threads", "1", "--metrics", ref, "--quiet", NULL };
    s_run_job(&r, "c.ini", ini, a3, 6);
    assert_true(rt_wait_nodes(&r, "idle", 4, 20));
    assert_int_equal(rt_stop(&r), 0);
}

/* A node that splits its stage over 2 tensor-parallel ranks (join --tp 2)
 * next to a plain one: its neighbour sees the same messages, and the job's
 * losses are tah-train's (tp = 1) within the tolerance (TP only reorders
 * float sums: test_tp.c). */
static void test_tp_node_in_a_pipeline(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_tpnode");
    rt_start_coord(&r, 10.0, 0);
    rt_start_nodes(&r, 1);
    rt_spawn_node(&r, "tp2", (const char *const[]){ "--tp", "2", NULL });
    assert_true(rt_wait_nodes(&r, "idle", 2, 30));
    char ini[1024], train[700], ref[700];
    snprintf(train, sizeof train, "%s/train.txt", r.dir);
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 8\n"
             "lr = 1e-3\nstages = 2\nmicro_batches = 2\nfwd_codec = fp32\nbwd_codec = fp32\n");
    snprintf(ref, sizeof ref, "%s/tp.ini.ref.jsonl", r.dir);
    char *argv[] = { TAH_TRAIN_EXE, "--model", "4,2,64,32,256", "--train-data", train, "--batch", "2", "--seq",
                     "16", "--steps", "8", "--lr", "1e-3", "--stages", "2", "--micro-batches", "2", "--threads", "1",
                     "--metrics", ref, "--quiet", NULL };
    s_run_job(&r, "tp.ini", ini, argv, 8);
    assert_true(rt_log_has(&r, "tp2.log", "tensor parallel tp=2"));
    assert_int_equal(rt_stop(&r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_equals_tah_train),
        cmocka_unit_test(test_tp_node_in_a_pipeline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
