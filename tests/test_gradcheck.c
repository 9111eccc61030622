/* test_gradcheck.c — every parameter tensor's analytic gradient (float32
 * engine, through the pipeline driver: schedule, boundaries, tied sync)
 * against central finite differences of an independent float64 reference
 * model written here from the GPT-2 equations.
 *
 * Tiny config: L=2, C=8, NH=2, V=13 padded to Vp=16, maxT=6, T=5 (< maxT),
 * B=2, M=2 micro-batches; parameters drawn N(0, 0.4) everywhere (LN weights
 * 1 + N(0, 0.4)) so that every path carries gradient.
 *
 * Tolerances: the finite differences use h = 1e-5 in float64: truncation
 * error O(h^2 * f''') ~ 1e-10 and rounding ~ 1e-16/h ~ 1e-11, so the FD
 * values are exact to ~1e-9. The engine works in float32 (unit roundoff
 * 6e-8) over a few hundred dependent operations, so its gradients carry
 * relative errors ~1e-6 of the tensor's gradient scale. We assert, per
 * tensor, max |g - g_fd| <= 1e-4 * max|g_fd| + 1e-7 and relative L2 error
 * <= 1e-4 (observed ~1e-6), and that the float32 loss equals the float64
 * loss to 1e-5 relative (same function). Rows V..Vp-1 of wte must have
 * exactly zero gradient. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpt2.h"
#include "trainer.h"

#define B_ 2
#define T_ 5
#define M_ 2

static const gpt2_config_t s_cfg = { .maxT = 6, .V = 13, .Vp = 16, .L = 2, .NH = 2, .C = 8 };

/* ---- float64 reference model ---- */

static void r_layernorm(double *out, const double *x, const double *w, const double *b, int N, int C)
{
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++)
            m += x[n * C + i];
        m /= C;
        for (int i = 0; i < C; i++)
            v += (x[n * C + i] - m) * (x[n * C + i] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int i = 0; i < C; i++)
            out[n * C + i] = (x[n * C + i] - m) * s * w[i] + b[i];
    }
}

/* out (N,OC) = x (N,K) W^T (OC,K) + b */
static void r_linear(double *out, const double *x, const double *W, const double *b, int N, int K, int OC)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = b ? b[o] : 0.0;
            for (int k = 0; k < K; k++)
                acc += x[n * K + k] * W[o * K + k];
            out[n * OC + o] = acc;
        }
}

/* mean cross-entropy of one micro-batch; P in llm.c layout, head NULL = tied */
static double r_loss(const double *P, const double *head, const int *inp, const int *tgt)
{
    const gpt2_config_t *c = &s_cfg;
    const int C = c->C, NH = c->NH, hs = C / NH, N = B_ * T_, L = c->L;
    size_t sz[GPT2_NTENSORS];
    gpt2_param_sizes(c, sz);
    const double *t[GPT2_NTENSORS];
    const double *p = P;
    for (int i = 0; i < GPT2_NTENSORS; i++) {
        t[i] = p;
        p += sz[i];
    }
    double x[N * C], ln[N * C], qkv[N * 3 * C], y[N * C], proj[N * C], fc[N * 4 * C];
    for (int b = 0; b < B_; b++)
        for (int tt = 0; tt < T_; tt++)
            for (int i = 0; i < C; i++)
                x[(b * T_ + tt) * C + i] = t[GPT2_WTE][inp[b * T_ + tt] * C + i] + t[GPT2_WPE][tt * C + i];
    for (int l = 0; l < L; l++) {
        r_layernorm(ln, x, t[GPT2_LN1W] + l * C, t[GPT2_LN1B] + l * C, N, C);
        r_linear(qkv, ln, t[GPT2_QKVW] + l * 3 * C * C, t[GPT2_QKVB] + l * 3 * C, N, C, 3 * C);
        for (int b = 0; b < B_; b++)
            for (int h = 0; h < NH; h++)
                for (int t1 = 0; t1 < T_; t1++) {
                    double s[T_], mx = -1e300, sum = 0;
                    const double *q = qkv + (b * T_ + t1) * 3 * C + h * hs;
                    for (int t2 = 0; t2 <= t1; t2++) {
                        const double *k = qkv + (b * T_ + t2) * 3 * C + C + h * hs;
                        double d = 0;
                        for (int i = 0; i < hs; i++)
                            d += q[i] * k[i];
                        s[t2] = d / sqrt((double)hs);
                        if (s[t2] > mx)
                            mx = s[t2];
                    }
                    for (int t2 = 0; t2 <= t1; t2++)
                        sum += (s[t2] = exp(s[t2] - mx));
                    for (int i = 0; i < hs; i++) {
                        double acc = 0;
                        for (int t2 = 0; t2 <= t1; t2++)
                            acc += s[t2] / sum * qkv[(b * T_ + t2) * 3 * C + 2 * C + h * hs + i];
                        y[(b * T_ + t1) * C + h * hs + i] = acc;
                    }
                }
        r_linear(proj, y, t[GPT2_ATTPROJW] + l * C * C, t[GPT2_ATTPROJB] + l * C, N, C, C);
        for (int i = 0; i < N * C; i++)
            x[i] += proj[i];
        r_layernorm(ln, x, t[GPT2_LN2W] + l * C, t[GPT2_LN2B] + l * C, N, C);
        r_linear(fc, ln, t[GPT2_FCW] + l * 4 * C * C, t[GPT2_FCB] + l * 4 * C, N, C, 4 * C);
        for (int i = 0; i < N * 4 * C; i++) {
            double u = fc[i];
            fc[i] = 0.5 * u * (1.0 + tanh(0.7978845608028654 /* sqrt(2/pi) */ * (u + 0.044715 * u * u * u)));
        }
        r_linear(proj, fc, t[GPT2_FCPROJW] + l * 4 * C * C, t[GPT2_FCPROJB] + l * C, N, 4 * C, C);
        for (int i = 0; i < N * C; i++)
            x[i] += proj[i];
    }
    r_layernorm(ln, x, t[GPT2_LNFW], t[GPT2_LNFB], N, C);
    const double *W = head ? head : t[GPT2_WTE];
    double loss = 0;
    for (int n = 0; n < N; n++) {
        double lg[64], mx = -1e300, sum = 0;
        for (int v = 0; v < c->V; v++) {
            double d = 0;
            for (int i = 0; i < C; i++)
                d += ln[n * C + i] * W[v * C + i];
            lg[v] = d;
            if (d > mx)
                mx = d;
        }
        for (int v = 0; v < c->V; v++)
            sum += exp(lg[v] - mx);
        loss += -(lg[tgt[n]] - mx - log(sum));
    }
    return loss / N;
}

/* the step objective: mean over the M micro-batches the loader yields */
static double r_objective(const double *P, const double *head, const int *tok)
{
    double total = 0;
    for (int m = 0; m < M_; m++) {
        int inp[B_ * T_], tgt[B_ * T_];
        for (int i = 0; i < B_ * T_; i++) {
            inp[i] = tok[m * B_ * T_ + i];
            tgt[i] = tok[m * B_ * T_ + i + 1];
        }
        total += r_loss(P, head, inp, tgt);
    }
    return total / M_;
}

/* ---- the check ---- */

static void s_gradcheck(int S, int tied, sched_kind_t sched)
{
    char err[256] = "";
    gpt2_model_t *model = gpt2_model_new(&s_cfg, err, sizeof err);
    assert_non_null(model);
    uint64_t rs = 42 + (uint64_t)S * 7 + (uint64_t)tied;
    for (size_t i = 0; i < model->nparams; i++)
        model->params[i] = (float)(0.4 * gpt2_rand_normal(&rs));
    for (int i = 0; i < GPT2_NTENSORS; i++)
        if (i == GPT2_LN1W || i == GPT2_LN2W || i == GPT2_LNFW)
            for (size_t k = 0; k < model->sizes[i]; k++)
                model->t[i][k] += 1.0f;
    for (size_t k = (size_t)s_cfg.V * s_cfg.C; k < model->sizes[GPT2_WTE]; k++)
        model->t[GPT2_WTE][k] = 0.0f; /* padding rows are zero in llm.c files */

    int ntok = M_ * B_ * T_ + 1;
    int tok[M_ * B_ * T_ + 1];
    for (int i = 0; i < ntok; i++)
        tok[i] = (int)(gpt2_rand_u64(&rs) % (uint64_t)s_cfg.V);
    data_t d = { .tok = tok, .n = (size_t)ntok, .is_text = 0 };
    data_loader_t dl;
    assert_int_equal(data_loader_init(&dl, &d, B_, T_, err, sizeof err), 0);

    trainer_opts_t o = { .cfg = s_cfg, .S = S, .M = M_, .B = B_, .T = T_, .sched = sched, .tied = tied };
    optim_defaults(&o.optim);
    trainer_t *tr = trainer_new(&o, model, err, sizeof err);
    assert_non_null(tr);
    double loss32 = 0;
    assert_int_equal(trainer_accumulate(tr, &dl, &loss32, err, sizeof err), 0);

    /* gather the engine's gradients into llm.c layout (+ head) */
    size_t n = model->nparams, nh = model->sizes[GPT2_WTE];
    double *P = malloc(n * sizeof(double)), *G = calloc(n, sizeof(double));
    double *H = malloc(nh * sizeof(double)), *GH = calloc(nh, sizeof(double));
    for (size_t i = 0; i < n; i++)
        P[i] = model->params[i];
    for (size_t i = 0; i < nh; i++)
        H[i] = model->t[GPT2_WTE][i];
    size_t off[GPT2_NTENSORS];
    off[0] = 0;
    for (int i = 1; i < GPT2_NTENSORS; i++)
        off[i] = off[i - 1] + model->sizes[i - 1];
    for (int k = 0; k < S; k++) {
        stage_t *st = tr->stages[k];
        for (int i = 0; i < GPT2_NTENSORS; i++) {
            if (!st->sizes[i])
                continue;
            size_t base = off[i] + (gpt2_tensor_per_layer(i) ? gpt2_tensor_layer_size(&s_cfg, i) * (size_t)st->o.layer0 : 0);
            for (size_t j = 0; j < st->sizes[i]; j++)
                G[base + j] = st->g[i][j];
        }
        if (st->sizes[STAGE_HEAD])
            for (size_t j = 0; j < nh; j++)
                GH[j] = st->g[STAGE_HEAD][j];
    }
    if (tied) /* the sync made both copies wte's full gradient */
        for (size_t j = 0; j < nh; j++)
            assert_true(GH[j] == G[off[GPT2_WTE] + j]);

    const double *head = tied ? NULL : H;
    double loss64 = r_objective(P, head, tok);
    assert_true(fabs(loss32 - loss64) <= 1e-5 * fabs(loss64));

    const double h = 1e-5;
    int ntens = GPT2_NTENSORS + (tied ? 0 : 1);
    double worst = 0;
    for (int i = 0; i < ntens; i++) {
        int is_head = i == GPT2_NTENSORS;
        double *x = is_head ? H : P + off[i];
        const double *g = is_head ? GH : G + off[i];
        size_t cnt = is_head ? nh : model->sizes[i];
        double maxfd = 0, maxdiff = 0, num = 0, den = 0;
        for (size_t j = 0; j < cnt; j++) {
            double save = x[j];
            x[j] = save + h;
            double lp = r_objective(P, head, tok);
            x[j] = save - h;
            double lm = r_objective(P, head, tok);
            x[j] = save;
            double fd = (lp - lm) / (2 * h);
            double diff = fabs(g[j] - fd);
            if (fabs(fd) > maxfd)
                maxfd = fabs(fd);
            if (diff > maxdiff)
                maxdiff = diff;
            num += diff * diff;
            den += fd * fd;
            if ((i == GPT2_WTE || is_head) && j >= (size_t)s_cfg.V * s_cfg.C)
                assert_true(g[j] == 0.0); /* padding rows */
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (rel > worst)
            worst = rel;
        if (!(maxdiff <= 1e-4 * maxfd + 1e-7 && rel <= 1e-4))
            fail_msg("S=%d tied=%d tensor %s: max |g-fd| %.3e (max |fd| %.3e), rel L2 %.3e",
                     S, tied, is_head ? "head" : gpt2_tensor_name(i), maxdiff, maxfd, rel);
        assert_true(maxfd > 0.0); /* every tensor carries gradient */
    }
    printf("# gradcheck S=%d tied=%d %s: loss f32 %.9f f64 %.9f, worst tensor rel L2 error %.2e\n", S,
           tied, sched_name(sched), loss32, loss64, worst);
    free(P);
    free(G);
    free(H);
    free(GH);
    trainer_destroy(&tr);
    gpt2_model_destroy(&model);
}

static void test_gradcheck_single_stage(void **state)
{
    (void)state;
    s_gradcheck(1, 1, SCHED_1F1B);
}

static void test_gradcheck_two_stages_tied(void **state)
{
    (void)state;
    s_gradcheck(2, 1, SCHED_1F1B);
}

static void test_gradcheck_two_stages_gpipe(void **state)
{
    (void)state;
    s_gradcheck(2, 1, SCHED_GPIPE);
}

static void test_gradcheck_untied_head(void **state)
{
    (void)state;
    s_gradcheck(2, 0, SCHED_1F1B);
    s_gradcheck(1, 0, SCHED_1F1B);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck_single_stage),
        cmocka_unit_test(test_gradcheck_two_stages_tied),
        cmocka_unit_test(test_gradcheck_two_stages_gpipe),
        cmocka_unit_test(test_gradcheck_untied_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
