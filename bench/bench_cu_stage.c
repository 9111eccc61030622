/* bench_cu_stage.c — training throughput of the CUDA stage (cuda/cu_stage.h):
 * GPT-2 124M (L=12, NH=12, C=768, maxT=1024, V=50257, Vp=50304) as one
 * stage, random init and random tokens, M micro-batches of B sequences of
 * T tokens per step (default 2 x 16 x 1024 = 32768 tokens, the B=32 step
 * of the issue), per precision: timed full steps (zero_grad, M forwards, M
 * backwards, tied sync, grad norm, AdamW), median ms/step and tokens/s,
 * plus the median host-timed split forward / backward / norm+AdamW (every
 * stage call ends with a stream synchronize, so host clocks time the GPU
 * work). Prints a table, writes CSV. With TAH_CU_PROFILE=1 in the
 * environment, also the per-phase device time per step (CUDA events
 * between the stage's kernel groups, cu_stage_profile).
 *
 * With --check-cpu, the loss of the first micro-batch (before any update)
 * is also computed by the CPU backend (pipeline/stage.c, OpenBLAS) on the
 * same weights and tokens and must agree: 1e-5 relative in fp32, 1e-2 in
 * bf16 (bf16 activations and weight copies: ~3 significant digits per
 * operand, errors averaging out over the 16k-token mean).
 *
 * With --tp N the stage is tensor parallel over GPUs K..K+N-1 (cu_stage.h;
 * one host thread drives them, the all-reduces over NCCL), --tp-codec SPEC
 * compresses its all-reduces (none, ash-fp8, int:bits=4, ...; the
 * all-gather shot takes --tp-codec-ag SPEC, default the same): the
 * end-to-end tokens/s of `scripts/gpu-check --tp 2`.
 *
 *   bench_cu_stage [--device K] [--precision fp32|bf16|both] [--batch B]
 *                  [--micro M] [--seq T] [--steps N] [--layers L] [--csv FILE]
 *                  [--check-cpu] [--tp N] [--tp-codec SPEC] [--tp-codec-ag SPEC]
 * Exit status: 0, 1 on a device error, 2 usage, 77 without a CUDA device
 * (or fewer than N at --tp N). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cu_stage.h"
#include "errors.h"
#include "gpt2.h"
#include "optim.h"
#include "stage.h"
#include "tpcomm.h" /* tp_codec_parse, tp_codec_format, TP_MAX */

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int s_cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double s_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, s_cmpd);
    return n ? v[n / 2] : 0.0;
}

typedef struct {
    double step_ms, fwd_ms, bwd_ms, opt_ms, tok_s, loss0, loss_last;
    float loss_mb0; /* micro-batch 0 of the first step, before any update */
} result_t;

/* The benchmark's tokens and targets: M micro-batches of B x T. */
static void s_tokens(const gpt2_config_t *cfg, size_t n, int *tok, int *tgt)
{
    uint64_t rs = 4242;
    for (size_t i = 0; i < n; i++) {
        tok[i] = (int)(gpt2_rand_u64(&rs) % (uint64_t)cfg->V);
        tgt[i] = (int)(gpt2_rand_u64(&rs) % (uint64_t)cfg->V);
    }
}

/* The CPU backend's loss on micro-batch 0 of the same weights and tokens. */
static int s_cpu_loss(const gpt2_model_t *model, int B, int T, float *loss)
{
    char err[512] = "";
    const gpt2_config_t *cfg = &model->cfg;
    stage_opts_t o = { .cfg = *cfg, .layer0 = 0, .layer1 = cfg->L, .first = 1, .last = 1, .B = B, .T = T,
                       .nslots = 1, .tied = 1 };
    stage_t *s = stage_new(&o, err, sizeof err);
    if (!s) {
        fprintf(stderr, "bench_cu_stage: cpu stage: %s\n", err);
        return 1;
    }
    const size_t BT = (size_t)B * T;
    int *tok = malloc(BT * sizeof(int)), *tgt = malloc(BT * sizeof(int));
    int rc = !tok || !tgt || stage_load_params(s, model) != 0;
    if (!rc) {
        s_tokens(cfg, BT, tok, tgt);
        rc = stage_forward(s, 0, tok, NULL, tgt, NULL, loss) != 0;
    }
    free(tok);
    free(tgt);
    stage_destroy(&s);
    return rc;
}

typedef struct {
    int tp;
    codec_spec_t rs, ag;
} tpopts_t;

static int s_bench(const gpt2_model_t *model, int device, int prec, int B, int M, int T, int steps,
                   const tpopts_t *tpo, result_t *r)
{
    char err[512] = "";
    const gpt2_config_t *cfg = &model->cfg;
    stage_opts_t o = { .cfg = *cfg, .layer0 = 0, .layer1 = cfg->L, .first = 1, .last = 1, .B = B, .T = T,
                       .nslots = M, .tied = 1, .backend = STAGE_CUDA, .device = device, .precision = prec,
                       .tp = tpo->tp, .tp_rs = tpo->rs, .tp_ag = tpo->ag };
    stage_t *s = stage_new(&o, err, sizeof err);
    if (!s) {
        fprintf(stderr, "bench_cu_stage: %s\n", err);
        return 1;
    }
    char d[256];
    stage_describe(s, d, sizeof d);
    printf("stage: %s\n", d);
    int rc = stage_load_params(s, model);
    const size_t BT = (size_t)B * T;
    int *tok = malloc((size_t)M * BT * sizeof(int)), *tgt = malloc((size_t)M * BT * sizeof(int));
    double *ts = calloc((size_t)steps, sizeof(double)), *tf = calloc((size_t)steps, sizeof(double));
    double *tb = calloc((size_t)steps, sizeof(double)), *to = calloc((size_t)steps, sizeof(double));
    s_tokens(cfg, (size_t)M * BT, tok, tgt);
    optim_opts_t oo;
    optim_defaults(&oo);
    oo.weight_decay = 0.1f;
    size_t nn = stage_norm_nslots(cfg);
    double *slots = calloc(nn, sizeof(double));
    const int warm = 2;
    for (int it = 0; it < warm + steps && rc == 0; it++) {
        double t0 = s_now(), loss_sum = 0.0;
        stage_zero_grad(s);
        for (int m = 0; m < M && rc == 0; m++) {
            float loss = 0.0f;
            rc = stage_forward(s, m, tok + m * BT, NULL, tgt + m * BT, NULL, &loss);
            loss_sum += loss;
            if (it == 0 && m == 0)
                r->loss_mb0 = loss;
        }
        double t1 = s_now();
        for (int m = M - 1; m >= 0 && rc == 0; m--)
            rc = stage_backward(s, m, NULL, 1.0f / (float)(M * BT), NULL);
        double t2 = s_now();
        stage_tied_sync(s, s);
        memset(slots, 0, nn * sizeof(double));
        stage_grad_sumsq(s, slots);
        float scale = optim_clip_scale(stage_norm_total(slots, nn), 1.0f);
        stage_step(s, &oo, 3e-4f, scale);
        if (*stage_error(s))
            rc = TAH_EDEVICE;
        double t3 = s_now();
        if (it == warm - 1)
            cu_stage_profile(s, NULL, NULL, 0, 1); /* count the timed steps only */
        if (it == 0)
            r->loss0 = loss_sum / M;
        r->loss_last = loss_sum / M;
        if (it >= warm) {
            ts[it - warm] = 1e3 * (t3 - t0);
            tf[it - warm] = 1e3 * (t1 - t0);
            tb[it - warm] = 1e3 * (t2 - t1);
            to[it - warm] = 1e3 * (t3 - t2);
        }
        printf("  step %d: %.1f ms (fwd %.1f, bwd %.1f, norm+adamw %.1f), loss %.4f\n", it, 1e3 * (t3 - t0),
               1e3 * (t1 - t0), 1e3 * (t2 - t1), 1e3 * (t3 - t2), loss_sum / M);
        fflush(stdout);
    }
    if (rc) {
        fprintf(stderr, "bench_cu_stage: %s failed: %s\n", prec ? "bf16" : "fp32",
                *stage_error(s) ? stage_error(s) : tah_strerror(rc));
    } else {
        r->step_ms = s_median(ts, steps);
        r->fwd_ms = s_median(tf, steps);
        r->bwd_ms = s_median(tb, steps);
        r->opt_ms = s_median(to, steps);
        r->tok_s = (double)M * BT / (r->step_ms * 1e-3);
        double pms[32];
        const char *pname[32];
        int np = cu_stage_profile(s, pms, pname, 32, 0);
        double tot = 0.0;
        for (int i = 0; i < np; i++)
            tot += pms[i];
        if (np > 0) {
            printf("  device time per step by phase (CUDA events, mean of %d steps; fwd+bwd only):\n", steps);
            for (int i = 0; i < np; i++)
                if (pms[i] > 0.0)
                    printf("    %-12s %8.2f ms %5.1f %%\n", pname[i], pms[i] / steps, 100.0 * pms[i] / tot);
            printf("    %-12s %8.2f ms\n", "total", tot / steps);
        }
    }
    free(tok);
    free(tgt);
    free(ts);
    free(tf);
    free(tb);
    free(to);
    free(slots);
    stage_destroy(&s);
    return rc ? 1 : 0;
}

static int s_usage(void)
{
    fprintf(stderr, "usage: bench_cu_stage [--device K] [--precision fp32|bf16|both] [--batch B] [--micro M] "
                    "[--seq T] [--steps N] [--layers L] [--csv FILE] [--check-cpu] [--tp N] [--tp-codec SPEC] "
                    "[--tp-codec-ag SPEC]\n");
    return 2;
}

int main(int argc, char **argv)
{
    int device = 0, B = 16, M = 2, T = 1024, steps = 5, L = 12, which = 3; /* 1 fp32, 2 bf16 */
    int check_cpu = 0;
    const char *csv = "bench_cu_stage.csv", *tp_codec = "none", *tp_codec_ag = NULL;
    tpopts_t tpo = { .tp = 1 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check-cpu")) {
            check_cpu = 1;
            continue;
        }
        if (!v)
            return s_usage();
        if (!strcmp(a, "--device"))
            device = atoi(v);
        else if (!strcmp(a, "--precision"))
            which = !strcmp(v, "fp32") ? 1 : !strcmp(v, "bf16") ? 2 : 3;
        else if (!strcmp(a, "--batch"))
            B = atoi(v);
        else if (!strcmp(a, "--micro"))
            M = atoi(v);
        else if (!strcmp(a, "--seq"))
            T = atoi(v);
        else if (!strcmp(a, "--steps"))
            steps = atoi(v);
        else if (!strcmp(a, "--layers"))
            L = atoi(v);
        else if (!strcmp(a, "--csv"))
            csv = v;
        else if (!strcmp(a, "--tp")) {
            char *end = NULL;
            long t = strtol(v, &end, 10);
            if (*end || end == v || t < 1 || t > TP_MAX) {
                fprintf(stderr, "bench_cu_stage: --tp %s: want 1..%d\n", v, TP_MAX);
                return s_usage();
            }
            tpo.tp = (int)t;
        } else if (!strcmp(a, "--tp-codec"))
            tp_codec = v;
        else if (!strcmp(a, "--tp-codec-ag"))
            tp_codec_ag = v;
        else {
            fprintf(stderr, "bench_cu_stage: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (B < 1 || M < 1 || T < 1 || T > 1024 || steps < 1 || L < 1) {
        fprintf(stderr, "bench_cu_stage: bad sizes\n");
        return 2;
    }
    {
        char cerr[256];
        if (tp_codec_parse(tp_codec, &tpo.rs, cerr, sizeof cerr) != 0 ||
            tp_codec_parse(tp_codec_ag ? tp_codec_ag : tp_codec, &tpo.ag, cerr, sizeof cerr) != 0) {
            fprintf(stderr, "bench_cu_stage: tp codec: %s\n", cerr);
            return s_usage();
        }
        if (12 % tpo.tp != 0) {
            fprintf(stderr, "bench_cu_stage: --tp %d must divide GPT-2's 12 heads\n", tpo.tp);
            return 2;
        }
    }
    if (cu_stage_device_count() < device + tpo.tp) {
        printf("bench_cu_stage: %d CUDA device(s), cuda:%d at tp=%d needs %d; skipped\n", cu_stage_device_count(),
               device, tpo.tp, device + tpo.tp);
        return 77;
    }
    char tpname[300];
    {
        char rs[128], ag[128];
        tp_codec_format(&tpo.rs, rs, sizeof rs);
        tp_codec_format(&tpo.ag, ag, sizeof ag);
        if (!strcmp(rs, ag))
            snprintf(tpname, sizeof tpname, "%s", rs);
        else
            snprintf(tpname, sizeof tpname, "%s/%s", rs, ag);
    }
    cu_stage_register();
    char err[512];
    gpt2_config_t cfg = { .maxT = 1024, .V = 50257, .Vp = 50304, .L = L, .NH = 12, .C = 768 };
    gpt2_model_t *model = gpt2_model_new(&cfg, err, sizeof err);
    if (!model) {
        fprintf(stderr, "bench_cu_stage: %s\n", err);
        return 1;
    }
    gpt2_model_init_random(model, 1);
    result_t res[2];
    int ok[2] = { 0, 0 }, status = 0;
    memset(res, 0, sizeof res);
    for (int p = 0; p < 2; p++) {
        if (!(which & (1 << p)))
            continue;
        printf("== %s, GPT-2 L=%d, %d x %d x %d tokens per step, tp=%d (all-reduce %s)\n", p ? "bf16" : "fp32", L, M,
               B, T, tpo.tp, tpo.tp > 1 ? tpname : "-");
        ok[p] = s_bench(model, device, p ? STAGE_BF16 : STAGE_FP32, B, M, T, steps, &tpo, &res[p]) == 0;
        if (!ok[p])
            status = 1;
    }
    if (check_cpu && (ok[0] || ok[1])) {
        float cpu = 0.0f;
        double t0 = s_now();
        if (s_cpu_loss(model, B, T, &cpu) != 0) {
            status = 1;
        } else {
            printf("\nloss of micro-batch 0 (%d x %d tokens, same weights), cpu backend %.6f (%.1f s):\n", B, T,
                   (double)cpu, s_now() - t0);
            for (int p = 0; p < 2; p++) {
                if (!ok[p])
                    continue;
                double rel = fabs((double)res[p].loss_mb0 - cpu) / fabs((double)cpu), tol = p ? 1e-2 : 1e-5;
                printf("  cuda %s %.6f: relative difference %.2e (tolerance %.0e) %s\n", p ? "bf16" : "fp32",
                       (double)res[p].loss_mb0, rel, tol, rel <= tol ? "PASS" : "FAIL");
                if (!(rel <= tol))
                    status = 1;
            }
        }
    }
    FILE *f = fopen(csv, "w");
    if (f)
        fprintf(f, "precision,layers,micro,batch,seq,ms_step,tokens_s,fwd_ms,bwd_ms,opt_ms,loss_first,loss_last,tp,"
                   "steps,tp_codec\n");
    else
        fprintf(stderr, "bench_cu_stage: cannot write %s\n", csv);
    printf("\nGPT-2 (L=%d) one stage, %d x %d x %d tokens/step, tp=%d%s%s, median of %d steps\n", L, M, B, T, tpo.tp,
           tpo.tp > 1 ? ", all-reduce " : "", tpo.tp > 1 ? tpname : "", steps);
    printf("%-9s %10s %12s %9s %9s %11s %10s\n", "precision", "ms/step", "tokens/s", "fwd ms", "bwd ms",
           "norm+adamw", "loss");
    for (int p = 0; p < 2; p++) {
        if (!ok[p])
            continue;
        printf("%-9s %10.1f %12.0f %9.1f %9.1f %11.1f %10.4f\n", p ? "bf16" : "fp32", res[p].step_ms, res[p].tok_s,
               res[p].fwd_ms, res[p].bwd_ms, res[p].opt_ms, res[p].loss_last);
        if (f)
            fprintf(f, "%s,%d,%d,%d,%d,%.3f,%.0f,%.3f,%.3f,%.3f,%.5f,%.5f,%d,%d,\"%s\"\n", p ? "bf16" : "fp32", L, M,
                    B, T, res[p].step_ms, res[p].tok_s, res[p].fwd_ms, res[p].bwd_ms, res[p].opt_ms, res[p].loss0,
                    res[p].loss_last, tpo.tp, steps + 2, tpo.tp > 1 ? tpname : "-");
    }
    if (f)
        fclose(f);
    gpt2_model_destroy(&model);
    return status;
}
