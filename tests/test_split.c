/* test_split.c — split equivalence: training the same model for k steps
 * as S = 1, 2, 3 and L stages (GPipe and 1F1B, M = 3 micro-batches) gives
 * the same per-step losses and the same parameters, with tied embeddings
 * (both copies synced once per step) and untied (an independent LM head, no
 * sync: the copies of wte and head must then differ).
 *
 * Tolerance: zero — bit-identical. Each stage runs exactly the same float32
 * operations on the same operands whatever the split: layers see identical
 * inputs (fp32 boundaries are plain copies), the tied gradient is always
 * first-copy + last-copy (the one-stage model keeps both copies too), and
 * the global norm is summed per (tensor, layer) in a fixed order, so no
 * reassociation happens anywhere. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "errors.h"
#include "gpt2.h"
#include "trainer.h"

#define K_STEPS 3
#define B_ 2
#define T_ 8
#define M_ 3

static const gpt2_config_t s_cfg = { .maxT = 8, .V = 40, .Vp = 48, .L = 4, .NH = 2, .C = 16 };

typedef struct run {
    double loss[K_STEPS];
    gpt2_model_t *model; /* parameters after K_STEPS (llm.c layout) */
    float *head;         /* last stage's head copy (Vp*C) */
    float *wte_first;    /* first stage's wte */
} run_t;

static void s_run(int S, int tied, sched_kind_t sched, const char *fwd, const char *bwd, run_t *r)
{
    char err[256] = "";
    gpt2_model_t *init = gpt2_model_new(&s_cfg, err, sizeof err);
    assert_non_null(init);
    gpt2_model_init_random(init, 7);
    size_t ntok = 4000;
    int *tok = malloc(ntok * sizeof(int));
    uint64_t rs = 99;
    for (size_t i = 0; i < ntok; i++)
        tok[i] = (int)(gpt2_rand_u64(&rs) % (uint64_t)s_cfg.V);
    data_t d = { .tok = tok, .n = ntok };
    data_loader_t dl;
    assert_int_equal(data_loader_init(&dl, &d, B_, T_, err, sizeof err), 0);
    trainer_opts_t o = { .cfg = s_cfg, .S = S, .M = M_, .B = B_, .T = T_, .sched = sched,
                         .tied = tied, .fwd_codec = fwd, .bwd_codec = bwd };
    optim_defaults(&o.optim);
    o.optim.lr = 3e-3f;
    o.optim.weight_decay = 0.1f;
    o.optim.grad_clip = 0.5f; /* exercised: the first norms are above it */
    o.optim.schedule = OPTIM_COSINE;
    o.optim.warmup = 1;
    o.optim.total_steps = K_STEPS;
    trainer_t *tr = trainer_new(&o, init, err, sizeof err);
    if (!tr)
        fail_msg("trainer_new: %s", err);
    for (int s = 0; s < K_STEPS; s++) {
        trainer_stats_t st;
        if (trainer_step(tr, &dl, &st, err, sizeof err) != 0)
            fail_msg("step: %s", err);
        r->loss[s] = st.loss;
    }
    r->model = init;
    assert_int_equal(trainer_export(tr, r->model), 0);
    size_t nh = r->model->sizes[GPT2_WTE];
    r->head = malloc(nh * sizeof(float));
    r->wte_first = malloc(nh * sizeof(float));
    memcpy(r->head, tr->stages[S - 1]->p[STAGE_HEAD], nh * sizeof(float));
    memcpy(r->wte_first, tr->stages[0]->p[GPT2_WTE], nh * sizeof(float));
    trainer_destroy(&tr);
    free(tok);
}

static void s_free(run_t *r)
{
    gpt2_model_destroy(&r->model);
    free(r->head);
    free(r->wte_first);
}

static void s_check_split(int tied)
{
    run_t ref;
    s_run(1, tied, SCHED_1F1B, NULL, NULL, &ref);
    size_t nh = ref.model->sizes[GPT2_WTE];
    /* training moved the parameters (the comparison is not vacuous) */
    gpt2_model_t *init = gpt2_model_new(&s_cfg, NULL, 0);
    gpt2_model_init_random(init, 7);
    assert_true(memcmp(init->params, ref.model->params, init->nparams * sizeof(float)) != 0);
    gpt2_model_destroy(&init);
    if (tied)
        assert_memory_equal(ref.head, ref.wte_first, nh * sizeof(float));
    else
        assert_true(memcmp(ref.head, ref.wte_first, nh * sizeof(float)) != 0);

    int splits[] = { 1, 2, 3, s_cfg.L };
    for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++) {
        for (int sc = 0; sc < 2; sc++) {
            run_t r;
            s_run(splits[si], tied, sc ? SCHED_GPIPE : SCHED_1F1B, NULL, NULL, &r);
            for (int s = 0; s < K_STEPS; s++)
                if (r.loss[s] != ref.loss[s])
                    fail_msg("S=%d %s tied=%d: step %d loss %.9g != unsplit %.9g", splits[si],
                             sc ? "gpipe" : "1f1b", tied, s + 1, r.loss[s], ref.loss[s]);
            for (size_t i = 0; i < r.model->nparams; i++)
                if (r.model->params[i] != ref.model->params[i])
                    fail_msg("S=%d %s tied=%d: parameter %zu = %.9g, unsplit %.9g", splits[si],
                             sc ? "gpipe" : "1f1b", tied, i, r.model->params[i], ref.model->params[i]);
            assert_memory_equal(r.head, ref.head, nh * sizeof(float));
            if (tied) /* the two copies on different stages stay bit-identical */
                assert_memory_equal(r.head, r.wte_first, nh * sizeof(float));
            s_free(&r);
        }
    }
    printf("# split equivalence tied=%d: losses %.6f %.6f %.6f bit-identical for S=1,2,3,%d\n", tied,
           ref.loss[0], ref.loss[1], ref.loss[2], s_cfg.L);
    s_free(&ref);
}

static void test_split_tied(void **state)
{
    (void)state;
    s_check_split(1);
}

static void test_split_untied(void **state)
{
    (void)state;
    s_check_split(0);
}

/* The fp32 codec at every boundary is bit-exact: same as plain copies. */
static void test_fp32_codec_is_exact(void **state)
{
    (void)state;
    run_t a, b;
    s_run(3, 1, SCHED_1F1B, NULL, NULL, &a);
    s_run(3, 1, SCHED_1F1B, "fp32", "fp32", &b);
    for (int s = 0; s < K_STEPS; s++)
        assert_true(a.loss[s] == b.loss[s]);
    assert_memory_equal(a.model->params, b.model->params, a.model->nparams * sizeof(float));
    s_free(&a);
    s_free(&b);
}

/* The link version of the sync (each side adds the peer's copy in the
 * order first + last) gives the same bits as the in-process sync. */
static void test_tied_reduce_matches_sync(void **state)
{
    (void)state;
    enum { N = 1000 };
    float a[N], b[N], a2[N], b2[N];
    uint64_t rs = 8;
    for (int i = 0; i < N; i++) {
        a[i] = (float)gpt2_rand_normal(&rs);
        b[i] = (float)(1e-3 * gpt2_rand_normal(&rs));
    }
    memcpy(a2, a, sizeof a);
    memcpy(b2, b, sizeof b);
    stage_tied_reduce(a2, b, N, 1); /* on the first stage, peer = last's copy */
    stage_tied_reduce(b2, a, N, 0); /* on the last stage, peer = first's copy */
    assert_memory_equal(a2, b2, sizeof a2);
    for (int i = 0; i < N; i++)
        assert_true(a2[i] == a[i] + b[i]);
}

static void s_fill_rand(float *x, size_t n, uint64_t *rs, double scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * gpt2_rand_normal(rs));
}

/* tied_link (tah-node's exchange, docs/runtime.md): the first stage's
 * touched gradient rows added to the last stage's head gradient
 * (stage_tied_rows_*) give the head the bits stage_tied_sync gives it; the
 * norm, counted on the last stage in wte's slot and not on the first, is
 * the classic one bit for bit; AdamW then gives the last stage the classic
 * head and leaves the first stage's wte alone, whose rows the last stage's
 * weight rows refresh. */
static void test_tied_link_matches_sync(void **state)
{
    (void)state;
    char err[256];
    stage_t *st[2][2]; /* [link][first, last] */
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 2; k++) {
            stage_opts_t o = { .cfg = s_cfg, .layer0 = k ? 2 : 0, .layer1 = k ? 4 : 2, .first = !k, .last = k,
                               .B = 1, .T = 4, .nslots = 1, .tied = 1, .tied_link = l };
            st[l][k] = stage_new(&o, err, sizeof err);
            assert_non_null(st[l][k]);
        }
    const int Vp = s_cfg.Vp, C = s_cfg.C;
    const int rows[] = { 0, 5, 6, 47 };
    const size_t R = 4, n = (size_t)Vp * C;
    for (int k = 0; k < 2; k++) {
        uint64_t rs = 11 + (uint64_t)k;
        s_fill_rand(st[0][k]->params, st[0][k]->nparams, &rs, 0.1);
        s_fill_rand(st[0][k]->grads, st[0][k]->nparams, &rs, 0.01);
        memcpy(st[1][k]->params, st[0][k]->params, st[0][k]->nparams * sizeof(float));
        memcpy(st[1][k]->grads, st[0][k]->grads, st[0][k]->nparams * sizeof(float));
    }
    /* the first stage's wte gradient is zero outside its tokens' rows */
    for (int l = 0; l < 2; l++) {
        float *g = st[l][0]->g[GPT2_WTE];
        for (int v = 0, i = 0; v < Vp; v++) {
            if (i < (int)R && rows[i] == v)
                i++;
            else
                memset(g + (size_t)v * C, 0, (size_t)C * sizeof(float));
        }
    }
    memcpy(st[0][1]->p[STAGE_HEAD], st[0][0]->p[GPT2_WTE], n * sizeof(float)); /* tied: the same matrix */
    memcpy(st[1][1]->p[STAGE_HEAD], st[0][0]->p[GPT2_WTE], n * sizeof(float));
    float buf[4 * 16];
    assert_int_equal(C, 16);
    stage_tied_sync(st[0][0], st[0][1]);
    assert_int_equal(stage_tied_rows_get(st[1][0], 1, rows, R, buf), 0);
    assert_int_equal(stage_tied_rows_put(st[1][1], 1, rows, R, buf), 0);
    assert_memory_equal(st[1][1]->g[STAGE_HEAD], st[0][1]->g[STAGE_HEAD], n * sizeof(float));
    const size_t ns = stage_norm_nslots(&s_cfg);
    double *sa = calloc(ns, sizeof(double)), *sb = calloc(ns, sizeof(double));
    assert_true(sa && sb);
    for (int k = 0; k < 2; k++) {
        stage_grad_sumsq(st[0][k], sa);
        stage_grad_sumsq(st[1][k], sb);
    }
    assert_memory_equal(sa, sb, ns * sizeof(double));
    assert_true(stage_norm_total(sa, ns) == stage_norm_total(sb, ns));
    float *wte0 = malloc(n * sizeof(float));
    assert_non_null(wte0);
    memcpy(wte0, st[1][0]->p[GPT2_WTE], n * sizeof(float));
    optim_opts_t oo;
    optim_defaults(&oo);
    oo.weight_decay = 0.1f;
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 2; k++)
            stage_step(st[l][k], &oo, 1e-2f, 1.0f);
    assert_memory_equal(st[1][1]->params, st[0][1]->params, st[0][1]->nparams * sizeof(float));
    assert_memory_equal(st[1][0]->p[GPT2_WTE], wte0, n * sizeof(float)); /* a cache: not updated */
    assert_memory_not_equal(st[0][0]->p[GPT2_WTE], wte0, n * sizeof(float));
    /* the last stage's weight rows into the first stage's cache */
    assert_int_equal(stage_tied_rows_get(st[1][1], 0, rows, R, buf), 0);
    assert_int_equal(stage_tied_rows_put(st[1][0], 0, rows, R, buf), 0);
    for (int v = 0, i = 0; v < Vp; v++) {
        const float *want = (i < (int)R && rows[i] == v) ? st[0][0]->p[GPT2_WTE] : wte0;
        assert_memory_equal(st[1][0]->p[GPT2_WTE] + (size_t)v * C, want + (size_t)v * C, (size_t)C * sizeof(float));
        if (i < (int)R && rows[i] == v)
            i++;
    }
    /* refused: a row outside the vocabulary, a stage without the tied matrix */
    const int bad[] = { Vp };
    assert_int_equal(stage_tied_rows_get(st[1][1], 0, bad, 1, buf), TAH_EINVAL);
    stage_opts_t mid = { .cfg = s_cfg, .layer0 = 1, .layer1 = 3, .B = 1, .T = 4, .nslots = 1, .tied = 1 };
    stage_t *m = stage_new(&mid, err, sizeof err);
    assert_non_null(m);
    assert_int_equal(stage_tied_rows_get(m, 0, rows, R, buf), TAH_EINVAL);
    stage_destroy(&m);
    free(wte0);
    free(sa);
    free(sb);
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 2; k++)
            stage_destroy(&st[l][k]);
}

/* A stage holds at most nslots micro-batches; unknown ones are refused. */
static void test_stage_slots(void **state)
{
    (void)state;
    char err[256];
    stage_opts_t o = { .cfg = s_cfg, .layer0 = 1, .layer1 = 3, .first = 0, .last = 0, .B = 1, .T = 4,
                       .nslots = 2, .tied = 1 };
    stage_t *st = stage_new(&o, err, sizeof err);
    assert_non_null(st);
    float in[4 * 16] = { 0 }, out[4 * 16];
    assert_int_equal(stage_forward(st, 0, NULL, in, NULL, out, NULL), 0);
    assert_int_equal(stage_forward(st, 0, NULL, in, NULL, out, NULL), TAH_EINVAL); /* already in flight */
    assert_int_equal(stage_forward(st, 1, NULL, in, NULL, out, NULL), 0);
    assert_int_equal(stage_forward(st, 2, NULL, in, NULL, out, NULL), TAH_EINVAL); /* no free slot */
    assert_int_equal(stage_inflight(st), 2);
    assert_int_equal(stage_backward(st, 5, out, 0.0f, in), TAH_EINVAL);
    assert_int_equal(stage_backward(st, 0, out, 0.0f, in), 0);
    assert_int_equal(stage_inflight(st), 1);
    stage_discard(st, 1);
    assert_int_equal(stage_inflight(st), 0);
    stage_destroy(&st);
    assert_null(st);
    /* bad options */
    o.layer1 = 9;
    assert_null(stage_new(&o, err, sizeof err));
    assert_non_null(strstr(err, "layer range"));
    o.layer1 = 3;
    o.T = 9; /* > maxT */
    assert_null(stage_new(&o, err, sizeof err));
    assert_non_null(strstr(err, "sequence length"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_tied),
        cmocka_unit_test(test_split_untied),
        cmocka_unit_test(test_fp32_codec_is_exact),
        cmocka_unit_test(test_tied_reduce_matches_sync),
        cmocka_unit_test(test_tied_link_matches_sync),
        cmocka_unit_test(test_stage_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
