/* test_tp.c — tensor-parallel stages (pipeline/blocks.h): training at
 * tp = 2 and 4 with codec none matches tp = 1 within a float32 tolerance;
 * tp = N runs are bit-reproducible (none and ash-fp8); ash-fp8 and
 * stochastic fixpt-8 on both shots keep the loss of a tiny model within 1 %
 * of uncompressed; a tp = 2
 * checkpoint loads at tp = 1 and continues like a tp = 1 run; with
 * stochastic fixpt all-reduces a resumed tp = 2 run equals the
 * uninterrupted one bit for bit; bad degrees and non-finite activations are
 * refused with a reason.
 *
 * Tolerances. Tensor parallelism changes only the association of float32
 * sums: the row-parallel products (attention and FC projections) become a
 * sum over tp partial products of C/tp (4C/tp) terms, and the QKV input
 * gradient a sum of three partial products (Q, K, V rows). Everything else
 * (layernorms, residuals, bias and layernorm gradients, the split matmul
 * shards) computes the same bits as tp = 1 (blocks.h). A reassociated sum
 * of k terms differs by at most about k * 2^-24 * sum |terms|; through two
 * layers and the softmax that stays around 1e-6 relative. Asserted:
 *   loss at every step          |dl| <= 1e-5 * |l|          (seen: equal to 8 digits)
 *   gradients after one step    ||dg|| <= 1e-5 * ||g||      per tensor (seen: 3e-7)
 *   parameters after K steps    ||dp|| <= 1e-4 * ||p - p0|| (seen: 8e-6), and
 *                               |dp| <= 1e-2 * lr per element (seen: 1.6e-3 lr)
 * The element bound is in units of lr because AdamW normalises: it moves a
 * parameter by lr * m / (sqrt(v) + eps), which amplifies a rounding-level
 * gradient difference wherever the exact gradient nearly cancels (the key
 * projection: softmax ignores what is constant over positions) and |g| is
 * then near eps = 1e-8; there a 1e-6 relative change of g moves the update
 * by up to ~lr * |dg| / eps. The L2 bound shows that it is a few elements. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "errors.h"
#include "gpt2.h"
#include "tpcomm.h"
#include "trainer.h"

#define B_ 2
#define T_ 7 /* B*T = 14 rows: does not divide by 4 */
#define M_ 2
#define LR 3e-3f

static const gpt2_config_t s_cfg = { .maxT = 8, .V = 40, .Vp = 48, .L = 2, .NH = 4, .C = 32 };

typedef struct run {
    int steps;
    double loss[64];
    float *grads1;       /* all stages' gradients after step 1's accumulate */
    size_t ngrads;
    gpt2_model_t *model; /* parameters at the end (llm.c layout) */
} run_t;

static int *s_tok;
static data_t s_data;

static int s_setup(void **state)
{
    (void)state;
    size_t ntok = 20000;
    s_tok = malloc(ntok * sizeof(int));
    /* a learnable stream: mostly a repeating pattern, some noise */
    uint64_t rs = 99;
    for (size_t i = 0; i < ntok; i++)
        s_tok[i] = gpt2_rand_u64(&rs) % 5 == 0 ? (int)(gpt2_rand_u64(&rs) % (uint64_t)s_cfg.V) : (int)(i % 11) * 3;
    s_data = (data_t){ .tok = s_tok, .n = ntok };
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    free(s_tok);
    return 0;
}

static trainer_t *s_trainer(int S, int tp, const char *rs, const char *ag, int steps, gpt2_model_t **init_out)
{
    char err[512] = "";
    gpt2_model_t *init = gpt2_model_new(&s_cfg, err, sizeof err);
    assert_non_null(init);
    gpt2_model_init_random(init, 7);
    trainer_opts_t o = { .cfg = s_cfg, .S = S, .M = M_, .B = B_, .T = T_, .sched = SCHED_1F1B, .tied = 1, .tp = tp };
    assert_int_equal(tp_codec_parse(rs, &o.tp_rs, err, sizeof err), 0);
    assert_int_equal(tp_codec_parse(ag, &o.tp_ag, err, sizeof err), 0);
    optim_defaults(&o.optim);
    o.optim.lr = LR;
    o.optim.weight_decay = 0.1f;
    o.optim.grad_clip = 1.0f;
    o.optim.total_steps = steps;
    trainer_t *tr = trainer_new(&o, init, err, sizeof err);
    if (!tr)
        fail_msg("trainer_new (tp %d): %s", tp, err);
    *init_out = init;
    return tr;
}

static void s_steps(trainer_t *tr, data_loader_t *dl, int n, double *loss)
{
    char err[512] = "";
    for (int s = 0; s < n; s++) {
        trainer_stats_t st;
        if (trainer_step(tr, dl, &st, err, sizeof err) != 0)
            fail_msg("step: %s", err);
        loss[s] = st.loss;
    }
}

static void s_run(int S, int tp, const char *rs, const char *ag, int steps, run_t *r)
{
    char err[512] = "";
    gpt2_model_t *init = NULL;
    trainer_t *tr = s_trainer(S, tp, rs, ag, steps, &init);
    data_loader_t dl;
    assert_int_equal(data_loader_init(&dl, &s_data, B_, T_, err, sizeof err), 0);
    memset(r, 0, sizeof *r);
    r->steps = steps;
    /* step 1 by hand, to keep its gradients */
    double loss = 0.0;
    if (trainer_accumulate(tr, &dl, &loss, err, sizeof err) != 0)
        fail_msg("accumulate: %s", err);
    for (int k = 0; k < S; k++)
        r->ngrads += tr->stages[k]->nparams;
    r->grads1 = malloc(r->ngrads * sizeof(float));
    size_t off = 0;
    for (int k = 0; k < S; k++) {
        memcpy(r->grads1 + off, tr->stages[k]->grads, tr->stages[k]->nparams * sizeof(float));
        off += tr->stages[k]->nparams;
    }
    trainer_stats_t st;
    trainer_apply(tr, &st);
    r->loss[0] = loss;
    s_steps(tr, &dl, steps - 1, r->loss + 1);
    assert_int_equal(trainer_export(tr, init), 0);
    r->model = init;
    trainer_destroy(&tr);
}

static void s_free(run_t *r)
{
    free(r->grads1);
    gpt2_model_destroy(&r->model);
}

static double s_max_param_diff(const gpt2_model_t *a, const gpt2_model_t *b)
{
    double worst = 0.0;
    for (size_t i = 0; i < a->nparams; i++)
        worst = fmax(worst, fabs((double)a->params[i] - b->params[i]));
    return worst;
}

/* ||a - b|| / ||b - init||: the difference relative to how far training moved */
static double s_rel_move(const gpt2_model_t *a, const gpt2_model_t *b)
{
    gpt2_model_t *init = gpt2_model_new(&s_cfg, NULL, 0);
    gpt2_model_init_random(init, 7);
    double d = 0.0, m = 0.0;
    for (size_t i = 0; i < a->nparams; i++) {
        double x = (double)a->params[i] - b->params[i], y = (double)b->params[i] - init->params[i];
        d += x * x;
        m += y * y;
    }
    gpt2_model_destroy(&init);
    return sqrt(d / m);
}

/* per-tensor relative L2 difference of the step-1 gradients, worst tensor */
static double s_grad_diff(const trainer_t *layout, const run_t *a, const run_t *b)
{
    double worst = 0.0;
    size_t off = 0;
    for (int k = 0; k < layout->o.S; k++) {
        const stage_t *s = layout->stages[k];
        for (int i = 0; i < STAGE_NTENSORS; i++) {
            double d = 0.0, n = 0.0;
            for (size_t e = 0; e < s->sizes[i]; e++) {
                double x = a->grads1[off + e], y = b->grads1[off + e];
                d += (x - y) * (x - y);
                n += y * y;
            }
            if (n > 0)
                worst = fmax(worst, sqrt(d / n));
            off += s->sizes[i];
        }
    }
    return worst;
}

static void test_equivalence(void **state)
{
    (void)state;
    const int K = 4;
    for (int S = 1; S <= 2; S++) {
        run_t ref;
        s_run(S, 1, "none", "none", K, &ref);
        gpt2_model_t *dummy = NULL;
        trainer_t *layout = s_trainer(S, 1, "none", "none", K, &dummy);
        const int tps[] = { 2, 4 };
        for (int a = 0; a < 2; a++) {
            run_t r;
            s_run(S, tps[a], "none", "none", K, &r);
            for (int s = 0; s < K; s++)
                if (!(fabs(r.loss[s] - ref.loss[s]) <= 1e-5 * fabs(ref.loss[s])))
                    fail_msg("S=%d tp=%d step %d: loss %.9g, tp=1 %.9g", S, tps[a], s + 1, r.loss[s], ref.loss[s]);
            double gd = s_grad_diff(layout, &r, &ref), pd = s_max_param_diff(r.model, ref.model);
            if (!(gd <= 1e-5))
                fail_msg("S=%d tp=%d: step-1 gradients differ by %.3g relative (worst tensor)", S, tps[a], gd);
            double rm = s_rel_move(r.model, ref.model);
            if (!(pd <= 1e-2 * LR) || !(rm <= 1e-4))
                fail_msg("S=%d tp=%d: parameters differ by %.3g lr (max), %.3g of the distance trained, after %d steps",
                         S, tps[a], pd / LR, rm, K);
            printf("# S=%d tp=%d vs tp=1: loss %.7f vs %.7f, gradients %.2e rel, parameters %.2e lr (max), "
                   "%.2e of the distance trained (L2)\n", S, tps[a], r.loss[K - 1], ref.loss[K - 1], gd, pd / LR, rm);
            s_free(&r);
        }
        /* the comparison is not vacuous: training moved the parameters */
        gpt2_model_t *init = gpt2_model_new(&s_cfg, NULL, 0);
        gpt2_model_init_random(init, 7);
        assert_true(s_max_param_diff(init, ref.model) > 100 * 1e-2 * LR);
        gpt2_model_destroy(&init);
        gpt2_model_destroy(&dummy);
        trainer_destroy(&layout);
        s_free(&ref);
    }
}

/* tp = N is bit-reproducible run to run, with a lossy codec too */
static void test_reproducible(void **state)
{
    (void)state;
    const char *codecs[] = { "none", "ash-fp8" };
    for (int c = 0; c < 2; c++) {
        run_t a, b;
        s_run(2, 4, codecs[c], codecs[c], 3, &a);
        s_run(2, 4, codecs[c], codecs[c], 3, &b);
        assert_memory_equal(a.loss, b.loss, 3 * sizeof(double));
        assert_memory_equal(a.model->params, b.model->params, a.model->nparams * sizeof(float));
        s_free(&a);
        s_free(&b);
    }
}

/* ASH-FP8, and stochastic fixpt-8, on both shots of every all-reduce: a
 * tiny model's loss stays within 1 % of the uncompressed run over 30 steps
 * (and is not bit-equal: the codec ran). */
static void test_compressed_training(void **state)
{
    (void)state;
    const int K = 30;
    const char *codecs[2] = { "ash-fp8", "fixpt:bits=8,stochastic=1,seed=5" };
    run_t ref, r;
    s_run(1, 2, "none", "none", K, &ref);
    assert_true(ref.loss[K - 1] < 0.8 * ref.loss[0]); /* it learned */
    for (int c = 0; c < 2; c++) {
        s_run(1, 2, codecs[c], codecs[c], K, &r);
        double worst = 0.0;
        for (int s = 0; s < K; s++)
            worst = fmax(worst, fabs(r.loss[s] - ref.loss[s]) / ref.loss[s]);
        printf("# tp=2 %s: loss %.4f -> %.4f (none %.4f -> %.4f), worst step %.3f %%\n", codecs[c], r.loss[0],
               r.loss[K - 1], ref.loss[0], ref.loss[K - 1], 100 * worst);
        assert_true(worst <= 0.01);
        assert_true(r.loss[K - 1] != ref.loss[K - 1]);
        s_free(&r);
    }
    s_free(&ref);
}

/* K1 steps of a fresh run (S stages, tp ranks, codec on both shots) from
 * the data's start, saved as a checkpoint at prefix; loss[0..K1) gets their
 * losses and *dl is left where they stopped. */
static void s_save_after(int S, int tp, const char *codec, int K1, int K, const char *prefix, data_loader_t *dl,
                         double *loss)
{
    char err[512] = "";
    gpt2_model_t *init = NULL;
    assert_int_equal(data_loader_init(dl, &s_data, B_, T_, err, sizeof err), 0);
    trainer_t *a = s_trainer(S, tp, codec, codec, K, &init);
    s_steps(a, dl, K1, loss);
    ckpt_meta_t meta = { .step = a->step, .data_pos = dl->pos, .seed = 7 };
    if (trainer_save_ckpt(a, prefix, &meta, err, sizeof err) != 0)
        fail_msg("save: %s", err);
    trainer_destroy(&a);
    gpt2_model_destroy(&init);
}

/* A fresh run at tp loads the checkpoint at prefix (K1 steps taken) and runs
 * steps K1..K-1 from its data position (loss[K1..K)); *init gets its final
 * parameters. */
static void s_resume(int S, int tp, const char *codec, int K1, int K, const char *prefix, const data_loader_t *dl,
                     double *loss, gpt2_model_t **init)
{
    char err[512] = "";
    trainer_t *b = s_trainer(S, tp, codec, codec, K, init);
    ckpt_meta_t got;
    if (trainer_load_ckpt(b, prefix, &got, err, sizeof err) != 0)
        fail_msg("load at tp=%d: %s", tp, err);
    assert_int_equal(got.step, K1);
    data_loader_t dl2 = *dl;
    dl2.pos = got.data_pos;
    s_steps(b, &dl2, K - K1, loss + K1);
    assert_int_equal(trainer_export(b, *init), 0);
    trainer_destroy(&b);
}

/* a tp = 2 checkpoint is a plain stage checkpoint: tp = 1 loads it and
 * continues like a tp = 1 run (within the equivalence tolerance), tp = 2
 * continues bit-identically to the uninterrupted tp = 2 run */
static void test_ckpt_across_tp(void **state)
{
    (void)state;
    char dir[] = "/tmp/tah_tp_XXXXXX", prefix[64];
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/run", dir);
    const int K1 = 2, K = 5, S = 2;
    run_t ref1, ref2;
    s_run(S, 1, "none", "none", K, &ref1);
    s_run(S, 2, "none", "none", K, &ref2);
    data_loader_t dl;
    double loss[8];
    s_save_after(S, 2, "none", K1, K, prefix, &dl, loss);

    for (int tp = 1; tp <= 2; tp++) {
        gpt2_model_t *init = NULL;
        s_resume(S, tp, "none", K1, K, prefix, &dl, loss, &init);
        const run_t *ref = tp == 1 ? &ref1 : &ref2;
        for (int s = K1; s < K; s++) {
            if (tp == 2)
                assert_true(loss[s] == ref->loss[s]);
            else if (!(fabs(loss[s] - ref->loss[s]) <= 1e-5 * ref->loss[s]))
                fail_msg("resumed at tp=1, step %d: loss %.9g, tp=1 run %.9g", s + 1, loss[s], ref->loss[s]);
        }
        double pd = s_max_param_diff(init, ref->model);
        if (tp == 2)
            assert_true(pd == 0.0);
        else if (!(pd <= 1e-2 * LR) || !(s_rel_move(init, ref->model) <= 1e-4))
            fail_msg("resumed at tp=1: parameters differ from the tp=1 run by %.3g lr", pd / LR);
        gpt2_model_destroy(&init);
    }
    s_free(&ref1);
    s_free(&ref2);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Stochastic fixpt on both shots: every all-reduce has its own id
 * (stage_tp_call_id: the steps taken, the call's index since then), so a
 * run resumed from a checkpoint draws the same coins as the uninterrupted
 * one and continues bit-identically; ids are distinct within a step and
 * across steps. */
static void test_stochastic_resume(void **state)
{
    (void)state;
    stage_t st = { 0 };
    uint64_t a = stage_tp_call_id(&st, 1), b = stage_tp_call_id(&st, 1), c = stage_tp_call_id(&st, 0);
    st.t = 3;
    uint64_t d = stage_tp_call_id(&st, 1);
    assert_true(a == 0 && b == 1 && c == 0 && d == (uint64_t)3 << 32);

    const char *sr = "fixpt:bits=8,stochastic=1,seed=11";
    char dir[] = "/tmp/tah_tp_XXXXXX", prefix[64];
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/run", dir);
    const int K1 = 2, K = 4, S = 2;
    run_t ref;
    s_run(S, 2, sr, sr, K, &ref);
    data_loader_t dl;
    double loss[8];
    s_save_after(S, 2, sr, K1, K, prefix, &dl, loss);
    gpt2_model_t *init = NULL;
    s_resume(S, 2, sr, K1, K, prefix, &dl, loss, &init);
    assert_memory_equal(loss, ref.loss, K * sizeof(double));
    assert_memory_equal(init->params, ref.model->params, init->nparams * sizeof(float));
    gpt2_model_destroy(&init);
    s_free(&ref);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_bad_options(void **state)
{
    (void)state;
    char err[512] = "";
    stage_opts_t o = { .cfg = s_cfg, .layer0 = 0, .layer1 = 2, .first = 1, .last = 1, .B = 1, .T = 4, .nslots = 1,
                       .tied = 1, .tp = 3 };
    assert_null(stage_new(&o, err, sizeof err));
    assert_non_null(strstr(err, "tp=3 must be 1..8 and divide the number of heads NH=4"));
    o.tp = 9;
    assert_null(stage_new(&o, err, sizeof err));
    assert_non_null(strstr(err, "tp=9"));
    o.tp = 2;
    o.tp_rs.id = CODEC_TAH;
    assert_null(stage_new(&o, err, sizeof err));
    assert_non_null(strstr(err, "tah is not supported"));
    o.tp_rs.id = 0;
    stage_t *s = stage_new(&o, err, sizeof err);
    assert_non_null(s);
    char d[512];
    stage_describe(s, d, sizeof d);
    assert_non_null(strstr(d, "tensor parallel tp=2"));
    stage_destroy(&s);
}

/* a NaN activation with ash-fp8: refused with the codec's reason, the slot
 * freed, the stage usable afterwards */
static void test_nonfinite(void **state)
{
    (void)state;
    char err[512] = "";
    stage_opts_t o = { .cfg = s_cfg, .layer0 = 1, .layer1 = 2, .first = 0, .last = 0, .B = 1, .T = 4, .nslots = 1,
                       .tied = 1, .tp = 2 };
    assert_int_equal(tp_codec_parse("ash-fp8", &o.tp_rs, err, sizeof err), 0);
    o.tp_ag = o.tp_rs;
    o.cfg.L = 3;
    stage_t *s = stage_new(&o, err, sizeof err);
    assert_non_null(s);
    gpt2_model_t *m = gpt2_model_new(&o.cfg, err, sizeof err);
    gpt2_model_init_random(m, 3);
    assert_int_equal(stage_load_params(s, m), 0);
    float in[4 * 32], out[4 * 32];
    for (int i = 0; i < 4 * 32; i++)
        in[i] = 0.01f * (float)(i % 17);
    in[40] = NAN;
    assert_int_equal(stage_forward(s, 0, NULL, in, NULL, out, NULL), TAH_ENONFINITE);
    assert_non_null(strstr(stage_error(s), "tensor-parallel all-reduce"));
    assert_int_equal(stage_inflight(s), 0);
    in[40] = 0.0f;
    assert_int_equal(stage_forward(s, 0, NULL, in, NULL, out, NULL), 0);
    assert_string_equal(stage_error(s), "");
    assert_int_equal(stage_backward(s, 0, out, 0.0f, in), 0);
    for (int i = 0; i < 4 * 32; i++)
        assert_true(isfinite(in[i]));
    gpt2_model_destroy(&m);
    stage_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equivalence),     cmocka_unit_test(test_reproducible),
        cmocka_unit_test(test_compressed_training), cmocka_unit_test(test_ckpt_across_tp),
        cmocka_unit_test(test_stochastic_resume), cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_nonfinite),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
