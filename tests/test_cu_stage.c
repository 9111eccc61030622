/* test_cu_stage.c — the CUDA stage (cuda/cu_stage.h) against the CPU stage
 * (pipeline/stage.c), label `gpu`. Plain C with a small local harness (no
 * cmocka: GPU machines may lack it); returns non-zero on any failure, 77
 * (ctest: skipped) when no CUDA device is present. Every comparison prints
 * one line (what, relative error, tolerance), so a failing run shows all
 * of them at once.
 *
 * Model L=3, NH=4, C=64 (head size 16), maxT=T=32, V=100, Vp=128, B=3,
 * random GPT-2 init (seed 7). For each precision (fp32, bf16), tied and
 * untied, and each split {one full stage} and {first, middle, last}:
 *   - each GPU stage gets exactly the CPU stage's inputs (tokens, the CPU
 *     boundary activation, the CPU's dout), 2 micro-batches in flight
 *     (forward 0, forward 1, backward 1, backward 0: slot bookkeeping and
 *     gradient accumulation), dloss = 1/(2*B*T);
 *   - compared: the loss of each micro-batch, the boundary activations,
 *     the input gradients, every parameter gradient (after the tied sync),
 *     the global-norm slots, and every parameter after 2 AdamW steps
 *     (lr 1e-4, weight decay 0.1, the second step after a fresh
 *     zero_grad + forward/backward), then store_params into a model.
 *     AdamW runs on the CPU's gradients (uploaded with STAGE_SYNC_GRADS
 *     after the gradient check): Adam turns rounding noise in a zero
 *     gradient (the k bias) into a full +-lr step, so only identical inputs
 *     make the optimizer comparable; round 2's forward then also checks
 *     the updated (and, in bf16, re-rounded) weights.
 * Error: ||gpu - cpu|| / ||cpu|| per tensor (and per micro-batch).
 * Tolerances: fp32 (CUBLAS_COMPUTE_32F, no TF32): summation order and FMA
 * contraction only (seen on an H200: <= 1e-6); asserted 2e-5 on
 * activations, loss and gradients. bf16: activations and matmul operands
 * rounded to 8 mantissa bits (2^-9 ~ 2e-3 relative each), over a few
 * layers (seen: <= 5e-3); asserted 2e-2 on activations and loss, 3e-2 on
 * gradients. Parameters and moments after AdamW on identical gradients:
 * 1e-5 (fp32 master weights in both modes).
 * Attention alone at T = 1100 (not a multiple of any tile), NH = 2, head
 * size 64, against a double-precision naive reference: fp32 1e-4 (forward
 * and dq/dk/dv), bf16 (reference on the same bf16-rounded inputs) 2e-2.
 * Plus: cuda:99 fails with a message, not a crash. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu_stage.h"
#include "errors.h"
#include "gpt2.h"
#include "optim.h"
#include "stage.h"

static int g_fail, g_checks;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        g_checks++;                                                           \
        if (!(cond)) {                                                        \
            g_fail++;                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);              \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
        }                                                                     \
    } while (0)

static double s_rel(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        if (!isfinite(a[i]))
            return INFINITY;
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (den == 0.0)
        return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

static void s_cmp(const char *ctx, const char *what, const float *gpu, const float *cpu, size_t n, double tol)
{
    double r = s_rel(gpu, cpu, n);
    printf("  %-34s %-22s rel %.3e  (tol %.0e)%s\n", ctx, what, r, tol, r <= tol ? "" : "  <-- FAIL");
    CHECK(r <= tol, "%s %s: relative error %.3e > %.0e", ctx, what, r, tol);
}

/* ---- the stage comparison ---- */

enum { M = 2 };

typedef struct {
    double act, grad, param;
} tols_t;

/* stage_encode_boundary: the device's frame of a boundary tensor is byte for
 * byte the CPU codec's frame of the same tensor read back as float32
 * (host), for every wire codec; a tensor that is not there is refused. */
static const char *const k_wire_specs[] = { "tah", "fixpt:bits=8", "ash-fp8", "int:bits=4", "fp32" };
#define N_WIRE_SPECS (sizeof k_wire_specs / sizeof k_wire_specs[0])

static void s_check_wire(const char *ctx, stage_t *g, int what, int mb, const float *host)
{
    const stage_opts_t *o = &g->o;
    codec_shape_t shape = { (uint32_t)o->B, (uint32_t)o->T, (uint32_t)o->cfg.C };
    char err[512];
    for (size_t i = 0; i < N_WIRE_SPECS; i++) {
        codec_spec_t spec;
        if (codec_spec_parse(k_wire_specs[i], &spec, err, sizeof err) != 0) {
            CHECK(0, "spec %s: %s", k_wire_specs[i], err);
            continue;
        }
        int64_t fs = codec_frame_size(&spec, shape);
        CHECK(fs > 0, "frame size of %s", k_wire_specs[i]);
        if (fs <= 0)
            continue;
        uint8_t *dev = stage_host_alloc(g, (size_t)fs), *cpu = malloc((size_t)fs);
        CHECK(dev && cpu, "frame buffers");
        if (!dev || !cpu) {
            stage_host_free(g, dev);
            free(cpu);
            return;
        }
        size_t wd = 0, wc = 0;
        int rd = stage_encode_boundary(g, what, mb, &spec, dev, (size_t)fs, &wd, err, sizeof err);
        CHECK(rd == 0, "%s: device encode %s: %s", ctx, k_wire_specs[i], err);
        int rcc = codec_encode(&spec, shape, host, cpu, (size_t)fs, &wc, err, sizeof err);
        CHECK(rcc == 0, "%s: cpu encode %s: %s", ctx, k_wire_specs[i], err);
        if (rd == 0 && rcc == 0)
            CHECK(wd == wc && !memcmp(dev, cpu, wc), "%s: %s %s frame differs from the CPU codec's", ctx,
                  what == STAGE_WIRE_OUT ? "output" : "dinp", k_wire_specs[i]);
        /* too small a buffer and a micro-batch that is not there: refused */
        CHECK(stage_encode_boundary(g, what, mb, &spec, dev, (size_t)fs - 1, NULL, err, sizeof err) == TAH_ESPACE,
              "short frame buffer accepted");
        CHECK(stage_encode_boundary(g, what, mb + 7, &spec, dev, (size_t)fs, NULL, err, sizeof err) == TAH_EINVAL,
              "micro-batch %d encoded", mb + 7);
        stage_host_free(g, dev);
        free(cpu);
    }
}

static void s_run_split(const gpt2_model_t *model, int S, int tied, int precision, const tols_t *tol)
{
    const gpt2_config_t *cfg = &model->cfg;
    const int B = 3, T = cfg->maxT, C = cfg->C, L = cfg->L;
    const size_t BT = (size_t)B * T, BTC = BT * C;
    char ctx[96], err[512];
    stage_t *cpu[4] = { 0 }, *gpu[4] = { 0 };
    float *act[4][M], *dact[4][M], *gout = malloc(BTC * sizeof(float));
    int *tok = malloc(M * BT * sizeof(int)), *tgt = malloc(M * BT * sizeof(int));
    uint64_t rs = 99;
    for (size_t i = 0; i < M * BT; i++) {
        tok[i] = (int)(gpt2_rand_u64(&rs) % (uint64_t)cfg->V);
        tgt[i] = (int)(gpt2_rand_u64(&rs) % (uint64_t)cfg->V);
    }
    for (int k = 0; k < 4; k++)
        for (int m = 0; m < M; m++) {
            act[k][m] = calloc(BTC, sizeof(float));
            dact[k][m] = calloc(BTC, sizeof(float));
        }
    snprintf(ctx, sizeof ctx, "%s %s S=%d", precision == STAGE_BF16 ? "bf16" : "fp32", tied ? "tied" : "untied", S);
    printf("%s\n", ctx);
    for (int k = 0; k < S; k++) {
        stage_opts_t o = { .cfg = *cfg, .B = B, .T = T, .nslots = M, .tied = tied };
        o.layer0 = k * L / S;
        o.layer1 = (k + 1) * L / S;
        o.first = k == 0;
        o.last = k == S - 1;
        cpu[k] = stage_new(&o, err, sizeof err);
        CHECK(cpu[k] != NULL, "cpu stage_new: %s", err);
        o.backend = STAGE_CUDA;
        o.device = 0;
        o.precision = precision;
        gpu[k] = stage_new(&o, err, sizeof err);
        CHECK(gpu[k] != NULL, "cuda stage_new: %s", err);
        if (!cpu[k] || !gpu[k])
            goto out;
        CHECK(stage_load_params(cpu[k], model) == 0, "cpu load");
        CHECK(!stage_encodes_on_device(cpu[k]) && stage_encodes_on_device(gpu[k]), "encodes_on_device");
        int rc = stage_load_params(gpu[k], model);
        CHECK(rc == 0, "cuda load: %s", *stage_error(gpu[k]) ? stage_error(gpu[k]) : tah_strerror(rc));
        if (k == 0) {
            char d[256];
            stage_describe(gpu[k], d, sizeof d);
            printf("  stage: %s\n", d);
        }
    }
    const float dloss = 1.0f / (float)(M * BT);
    optim_opts_t oo;
    optim_defaults(&oo);
    oo.weight_decay = 0.1f;
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < S; k++) {
            stage_zero_grad(cpu[k]);
            stage_zero_grad(gpu[k]);
        }
        /* forward: micro-batches 0 then 1 through every stage */
        for (int m = 0; m < M; m++) {
            for (int k = 0; k < S; k++) {
                const int *tk = tok + m * BT, *tg = tgt + m * BT;
                const float *in = k ? act[k - 1][m] : NULL;
                float lc = 0.0f, lg = 0.0f;
                int rc = stage_forward(cpu[k], m, tk, in, tg, k < S - 1 ? act[k][m] : NULL, &lc);
                CHECK(rc == 0, "cpu forward");
                memset(gout, 0xff, BTC * sizeof(float)); /* NaN: unwritten output fails */
                rc = stage_forward(gpu[k], m, tk, in, tg, k < S - 1 ? gout : NULL, &lg);
                CHECK(rc == 0, "cuda forward stage %d mb %d: %s", k, m, *stage_error(gpu[k]) ? stage_error(gpu[k]) : tah_strerror(rc));
                if (rc)
                    goto out;
                char w[64];
                if (k < S - 1) {
                    snprintf(w, sizeof w, "r%d s%d mb%d out", round, k, m);
                    s_cmp(ctx, w, gout, act[k][m], BTC, tol->act);
                    if (round == 0)
                        s_check_wire(ctx, gpu[k], STAGE_WIRE_OUT, m, gout);
                } else {
                    snprintf(w, sizeof w, "r%d mb%d loss %.5f", round, m, lc);
                    s_cmp(ctx, w, &lg, &lc, 1, tol->act);
                }
            }
        }
        CHECK(stage_inflight(gpu[0]) == M, "inflight %d", stage_inflight(gpu[0]));
        /* backward: 1 then 0 */
        for (int m = M - 1; m >= 0; m--) {
            for (int k = S - 1; k >= 0; k--) {
                const float *dout = k < S - 1 ? dact[k + 1][m] : NULL;
                int rc = stage_backward(cpu[k], m, dout, dloss, k ? dact[k][m] : NULL);
                CHECK(rc == 0, "cpu backward");
                memset(gout, 0xff, BTC * sizeof(float));
                rc = stage_backward(gpu[k], m, dout, dloss, k ? gout : NULL);
                CHECK(rc == 0, "cuda backward stage %d mb %d: %s", k, m, *stage_error(gpu[k]) ? stage_error(gpu[k]) : tah_strerror(rc));
                if (rc)
                    goto out;
                if (k) {
                    char w[64];
                    snprintf(w, sizeof w, "r%d s%d mb%d dinp", round, k, m);
                    s_cmp(ctx, w, gout, dact[k][m], BTC, tol->grad);
                    if (round == 0)
                        s_check_wire(ctx, gpu[k], STAGE_WIRE_DINP, m, gout);
                }
            }
        }
        CHECK(stage_inflight(gpu[0]) == 0, "inflight after backward %d", stage_inflight(gpu[0]));
        if (tied) {
            stage_tied_sync(cpu[0], cpu[S - 1]);
            stage_tied_sync(gpu[0], gpu[S - 1]);
        }
        /* gradients: through the host mirrors (the tied copy explicitly) */
        size_t nn = stage_norm_nslots(cfg);
        double *nc = calloc(nn, sizeof(double)), *ng = calloc(nn, sizeof(double));
        for (int k = 0; k < S; k++) {
            stage_grad_sumsq(cpu[k], nc);
            stage_grad_sumsq(gpu[k], ng);
        }
        for (size_t i = 0; i < nn; i++) {
            float a = (float)sqrt(ng[i]), b = (float)sqrt(nc[i]);
            char w[64];
            snprintf(w, sizeof w, "r%d norm slot %zu", round, i);
            if (nc[i] != 0.0 || ng[i] != 0.0)
                s_cmp(ctx, w, &a, &b, 1, tol->grad);
        }
        free(nc);
        free(ng);
        for (int k = 0; k < S; k++) {
            int rc = stage_sync_to_host(gpu[k], STAGE_SYNC_GRADS);
            CHECK(rc == 0, "sync grads: %s", stage_error(gpu[k]));
            for (int i = 0; i < STAGE_NTENSORS; i++) {
                if (!cpu[k]->sizes[i])
                    continue;
                char w[64];
                snprintf(w, sizeof w, "r%d s%d grad %s", round, k, stage_tensor_name(i));
                s_cmp(ctx, w, gpu[k]->g[i], cpu[k]->g[i], cpu[k]->sizes[i], tol->grad);
            }
            /* AdamW gets the CPU's gradients: Adam maps tiny gradients to
             * +-lr (the k-bias gradient is zero up to rounding noise), so
             * only identical inputs make the optimizer itself checkable */
            memcpy(gpu[k]->grads, cpu[k]->grads, cpu[k]->nparams * sizeof(float));
            rc = stage_sync_to_device(gpu[k], STAGE_SYNC_GRADS);
            CHECK(rc == 0, "sync grads to device: %s", stage_error(gpu[k]));
        }
        for (int k = 0; k < S; k++) {
            stage_step(cpu[k], &oo, 1e-4f, 1.0f);
            stage_step(gpu[k], &oo, 1e-4f, 1.0f);
            CHECK(!*stage_error(gpu[k]), "step: %s", stage_error(gpu[k]));
        }
    }
    for (int k = 0; k < S; k++) {
        int rc = stage_sync_to_host(gpu[k], STAGE_SYNC_PARAMS | STAGE_SYNC_MOMENTS);
        CHECK(rc == 0, "sync to host: %s", stage_error(gpu[k]));
        for (int i = 0; i < STAGE_NTENSORS; i++) {
            if (!cpu[k]->sizes[i])
                continue;
            char w[64];
            snprintf(w, sizeof w, "s%d param %s", k, stage_tensor_name(i));
            s_cmp(ctx, w, gpu[k]->p[i], cpu[k]->p[i], cpu[k]->sizes[i], tol->param);
        }
        s_cmp(ctx, "moments m+v", gpu[k]->moments, cpu[k]->moments, 2 * cpu[k]->nparams, tol->param);
        CHECK(gpu[k]->t == 2, "AdamW steps %lld", gpu[k]->t);
    }
    /* store into a model: the same as the CPU's */
    gpt2_model_t *mc = gpt2_model_new(cfg, err, sizeof err), *mg = gpt2_model_new(cfg, err, sizeof err);
    if (mc && mg) {
        for (int k = 0; k < S; k++) {
            CHECK(stage_store_params(cpu[k], mc) == 0, "store cpu");
            CHECK(stage_store_params(gpu[k], mg) == 0, "store gpu");
        }
        s_cmp(ctx, "stored model", mg->params, mc->params, mc->nparams, tol->param);
    }
    gpt2_model_destroy(&mc);
    gpt2_model_destroy(&mg);
out:
    for (int k = 0; k < 4; k++) {
        stage_destroy(&cpu[k]);
        stage_destroy(&gpu[k]);
        for (int m = 0; m < M; m++) {
            free(act[k][m]);
            free(dact[k][m]);
        }
    }
    free(gout);
    free(tok);
    free(tgt);
}

/* ---- attention alone vs a double reference ---- */

static float s_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static void s_attn_ref(double *out, double *dqkv, const float *qkv, const float *dout, int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    double *p = malloc((size_t)T * sizeof(double)), *dp = malloc((size_t)T * sizeof(double));
    memset(dqkv, 0, (size_t)B * T * C3 * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)b * T + i) * C3 + h * hs;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j <= i; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * C3 + C + h * hs;
                    double s = 0.0;
                    for (int d = 0; d < hs; d++)
                        s += (double)q[d] * k[d];
                    p[j] = s * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j <= i; j++) {
                    p[j] = exp(p[j] - mx);
                    sum += p[j];
                }
                double *o = out + ((size_t)b * T + i) * C + h * hs;
                for (int d = 0; d < hs; d++)
                    o[d] = 0.0;
                for (int j = 0; j <= i; j++) {
                    p[j] /= sum;
                    const float *v = qkv + ((size_t)b * T + j) * C3 + 2 * C + h * hs;
                    for (int d = 0; d < hs; d++)
                        o[d] += p[j] * v[d];
                }
                /* backward of row i */
                const float *dO = dout + ((size_t)b * T + i) * C + h * hs;
                double rsum = 0.0;
                for (int j = 0; j <= i; j++) {
                    const float *v = qkv + ((size_t)b * T + j) * C3 + 2 * C + h * hs;
                    double s = 0.0;
                    for (int d = 0; d < hs; d++)
                        s += (double)dO[d] * v[d];
                    dp[j] = s;
                    rsum += p[j] * s;
                }
                double *dq = dqkv + ((size_t)b * T + i) * C3 + h * hs;
                for (int j = 0; j <= i; j++) {
                    double ds = p[j] * (dp[j] - rsum) * scale;
                    const float *k = qkv + ((size_t)b * T + j) * C3 + C + h * hs;
                    double *dk = dqkv + ((size_t)b * T + j) * C3 + C + h * hs;
                    double *dv = dk + C;
                    for (int d = 0; d < hs; d++) {
                        dq[d] += ds * k[d];
                        dk[d] += ds * q[d];
                        dv[d] += p[j] * dO[d];
                    }
                }
            }
    free(p);
    free(dp);
}

static void s_attention_long(int bf16)
{
    const int B = 1, T = 1100, NH = 2, C = 128;
    const size_t BTC = (size_t)B * T * C;
    float *qkv = malloc(3 * BTC * sizeof(float)), *dout = malloc(BTC * sizeof(float));
    float *out = malloc(BTC * sizeof(float)), *dqkv = malloc(3 * BTC * sizeof(float));
    float *lse = malloc((size_t)B * NH * T * sizeof(float));
    double *ro = malloc(BTC * sizeof(double)), *rd = malloc(3 * BTC * sizeof(double));
    float *rof = malloc(BTC * sizeof(float)), *rdf = malloc(3 * BTC * sizeof(float));
    uint64_t rs = 12345;
    for (size_t i = 0; i < 3 * BTC; i++) {
        qkv[i] = (float)gpt2_rand_normal(&rs);
        if (bf16)
            qkv[i] = s_bf16_round(qkv[i]);
    }
    for (size_t i = 0; i < BTC; i++) {
        dout[i] = (float)gpt2_rand_normal(&rs);
        if (bf16)
            dout[i] = s_bf16_round(dout[i]);
    }
    char err[512] = "";
    int rc = cu_stage_attention_host(0, bf16, qkv, dout, out, lse, dqkv, B, T, C, NH, err, sizeof err);
    CHECK(rc == 0, "attention: %s", err);
    if (rc == 0) {
        s_attn_ref(ro, rd, qkv, dout, B, T, C, NH);
        for (size_t i = 0; i < BTC; i++)
            rof[i] = (float)ro[i];
        for (size_t i = 0; i < 3 * BTC; i++)
            rdf[i] = (float)rd[i];
        double tol = bf16 ? 2e-2 : 1e-4;
        const char *ctx = bf16 ? "attention T=1100 hs=64 bf16" : "attention T=1100 hs=64 fp32";
        printf("%s\n", ctx);
        s_cmp(ctx, "out", out, rof, BTC, tol);
        /* dq, dk, dv separately: columns of each row */
        float *a = malloc(BTC * sizeof(float)), *b = malloc(BTC * sizeof(float));
        const char *names[3] = { "dq", "dk", "dv" };
        for (int part = 0; part < 3; part++) {
            for (int r = 0; r < B * T; r++)
                for (int c = 0; c < C; c++) {
                    a[(size_t)r * C + c] = dqkv[(size_t)r * 3 * C + part * C + c];
                    b[(size_t)r * C + c] = rdf[(size_t)r * 3 * C + part * C + c];
                }
            s_cmp(ctx, names[part], a, b, BTC, tol);
        }
        free(a);
        free(b);
    }
    free(qkv);
    free(dout);
    free(out);
    free(dqkv);
    free(lse);
    free(ro);
    free(rd);
    free(rof);
    free(rdf);
}

int main(void)
{
    int ndev = cu_stage_device_count();
    if (ndev < 1) {
        printf("test_cu_stage: no CUDA device; skipped\n");
        return 77;
    }
    cu_stage_register();
    char err[512] = "";

    /* a device that does not exist: a message, no crash */
    gpt2_config_t cfg = { .maxT = 32, .V = 100, .Vp = 128, .L = 3, .NH = 4, .C = 64 };
    stage_opts_t bad = { .cfg = cfg, .layer0 = 0, .layer1 = 3, .first = 1, .last = 1, .B = 1, .T = 4,
                         .nslots = 1, .tied = 1, .backend = STAGE_CUDA, .device = 99 };
    stage_t *s = stage_new(&bad, err, sizeof err);
    CHECK(s == NULL && strstr(err, "cuda:99"), "cuda:99 should fail with a message, got '%s'", err);
    printf("cuda:99 -> %s\n", err);
    stage_destroy(&s);

    gpt2_model_t *model = gpt2_model_new(&cfg, err, sizeof err);
    if (!model) {
        fprintf(stderr, "model: %s\n", err);
        return 1;
    }
    gpt2_model_init_random(model, 7);
    const tols_t t32 = { 2e-5, 2e-5, 1e-5 }, t16 = { 2e-2, 3e-2, 1e-5 };
    for (int prec = 0; prec < 2; prec++)
        for (int tied = 1; tied >= 0; tied--) {
            s_run_split(model, 1, tied, prec ? STAGE_BF16 : STAGE_FP32, prec ? &t16 : &t32);
            s_run_split(model, 3, tied, prec ? STAGE_BF16 : STAGE_FP32, prec ? &t16 : &t32);
        }
    gpt2_model_destroy(&model);

    s_attention_long(0);
    s_attention_long(1);

    printf("test_cu_stage: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
