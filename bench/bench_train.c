/* bench_train.c — training throughput of the CPU stage (forward + backward +
 * AdamW step, one stage, one micro-batch) for the demo config and GPT-2 124M,
 * against an estimate of llm.c's train_gpt2.c on the same machine.
 *
 *   bench_train [--threads N] [--csv FILE] [--quick] [--full]
 *
 * llm.c cannot be fetched here, so its speed is estimated from its matmul
 * kernels: llmc_matmul.c re-creates them (the plain OpenMP loop and the
 * 8-row tiled loop, compiled -Ofast like llm.c) and we time the faster of
 * the two on each of the model's matmul shapes (qkv, attproj, fc, fcproj,
 * LM head), plus llm.c's backward loops (llmc_matmul_backward: axpy over
 * weight rows per token, then per output channel), timed on up to 256 rows
 * (their cost is linear in the rows). "llm.c bound" counts only that matmul
 * time, never llm.c's attention, layernorm or optimizer: an upper bound on
 * its speed. The
 * second estimate ("llm.c est") adds tah's own non-matmul time per step
 * (tah's step time minus its matmul FLOPs at the measured sgemm rate),
 * i.e. it credits llm.c with tah's attention, GELU, LayerNorm and AdamW
 * speed; speedup is against that. The table also shows cblas_sgemm's
 * GFLOP/s (and the two llm.c kernels') on the MLP up-projection shape
 * (N,C) x (C,4C), N = min(B*T, 1024). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layers.h"      /* layers_set_threads, matmul_forward */
#include "llmc_matmul.h" /* llmc_matmul_naive, llmc_matmul_tiled */
#include "trainer.h"

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef void (*mm_fn)(float *, const float *, const float *, const float *, int, int, int);

/* best-of-reps seconds per row of llm.c's matmul backward on (N,C) -> (N,OC) */
static double s_llmc_bwd_per_row(int N, int C, int OC, int reps)
{
    float *x = malloc((size_t)N * C * sizeof(float)), *w = malloc((size_t)OC * C * sizeof(float));
    float *d = malloc((size_t)N * OC * sizeof(float)), *dx = calloc((size_t)N * C, sizeof(float));
    float *dw = calloc((size_t)OC * C, sizeof(float)), *db = calloc((size_t)OC, sizeof(float));
    uint64_t rs = 2;
    for (size_t i = 0; i < (size_t)N * C; i++)
        x[i] = (float)gpt2_rand_normal(&rs);
    for (size_t i = 0; i < (size_t)OC * C; i++)
        w[i] = (float)gpt2_rand_normal(&rs);
    for (size_t i = 0; i < (size_t)N * OC; i++)
        d[i] = (float)gpt2_rand_normal(&rs);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = s_now();
        llmc_matmul_backward(dx, dw, db, d, x, w, N, C, OC);
        double dt = s_now() - t0;
        if (dt < best)
            best = dt;
    }
    free(x);
    free(w);
    free(d);
    free(dx);
    free(dw);
    free(db);
    return best / N;
}

/* best-of-reps GFLOP/s of out(N,OC) = inp(N,C) W^T + b */
static double s_gflops(mm_fn fn, int N, int C, int OC, int reps)
{
    float *x = malloc((size_t)N * C * sizeof(float)), *w = malloc((size_t)OC * C * sizeof(float));
    float *b = calloc((size_t)OC, sizeof(float)), *o = malloc((size_t)N * OC * sizeof(float));
    uint64_t rs = 1;
    for (size_t i = 0; i < (size_t)N * C; i++)
        x[i] = (float)gpt2_rand_normal(&rs);
    for (size_t i = 0; i < (size_t)OC * C; i++)
        w[i] = (float)gpt2_rand_normal(&rs);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = s_now();
        fn(o, x, w, b, N, C, OC);
        double dt = s_now() - t0;
        if (dt < best)
            best = dt;
    }
    free(x);
    free(w);
    free(b);
    free(o);
    return 2.0 * N * C * (double)OC / best / 1e9;
}

typedef struct bench_cfg {
    const char *name;
    gpt2_config_t cfg;
    int B, T, steps;
} bench_cfg_t;

int main(int argc, char **argv)
{
    int threads = 0, quick = 0, full = 0;
    const char *csv = "bench_train.csv";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--full"))
            full = 1;
        else {
            fprintf(stderr, "usage: bench_train [--threads N] [--csv FILE] [--quick] [--full]\n");
            return 2;
        }
    }
    layers_set_threads(threads > 0 ? threads : layers_max_threads());
    threads = layers_max_threads();

    bench_cfg_t cfgs[] = {
        { "demo L4 C128 T128 V256", { .maxT = 128, .V = 256, .Vp = 256, .L = 4, .NH = 4, .C = 128 }, 16, 128, 10 },
        { "gpt2-124M T256", { .maxT = 1024, .V = 50257, .Vp = 50304, .L = 12, .NH = 12, .C = 768 }, 4, 256, 3 },
        { "gpt2-124M T1024", { .maxT = 1024, .V = 50257, .Vp = 50304, .L = 12, .NH = 12, .C = 768 }, 4, 1024, 2 },
    };
    int ncfg = quick ? 1 : full ? 3 : 2;

    FILE *f = fopen(csv, "w");
    if (!f) {
        fprintf(stderr, "bench_train: cannot write %s\n", csv);
        return 1;
    }
    fprintf(f, "config,threads,B,T,params,ms_per_step,tokens_per_s,sgemm_gflops,llmc_naive_gflops,"
               "llmc_tiled_gflops,llmc_matmul_only_tokens_per_s,llmc_est_tokens_per_s,speedup_vs_llmc_est\n");
    printf("%-24s %3s %4s %5s %10s %9s %8s | %8s %8s %8s | %11s %9s %7s\n", "config", "thr", "B", "T",
           "params", "ms/step", "tok/s", "sgemm", "llmc", "llmc-8", "llm.c bound", "llm.c est", "speedup");
    printf("%-24s %3s %4s %5s %10s %9s %8s | %8s %8s %8s | %11s %9s %7s\n", "", "", "", "", "", "", "",
           "GFLOP/s", "naive", "tiled", "matmul-only", "tok/s", "");
    for (int c = 0; c < ncfg; c++) {
        bench_cfg_t *bc = &cfgs[c];
        char err[256] = "";
        gpt2_model_t *m = gpt2_model_new(&bc->cfg, err, sizeof err);
        if (!m) {
            fprintf(stderr, "bench_train: %s\n", err);
            return 1;
        }
        gpt2_model_init_random(m, 1);
        size_t ntok = (size_t)bc->B * bc->T * (bc->steps + 2) + 1;
        data_t d = { .tok = malloc(ntok * sizeof(int)), .n = ntok };
        uint64_t rs = 3;
        for (size_t i = 0; i < ntok; i++)
            d.tok[i] = (int)(gpt2_rand_u64(&rs) % (uint64_t)bc->cfg.V);
        data_loader_t dl;
        data_loader_init(&dl, &d, bc->B, bc->T, err, sizeof err);
        trainer_opts_t o = { .cfg = bc->cfg, .S = 1, .M = 1, .B = bc->B, .T = bc->T,
                             .sched = SCHED_1F1B, .tied = 1 };
        optim_defaults(&o.optim);
        trainer_t *t = trainer_new(&o, m, err, sizeof err);
        if (!t) {
            fprintf(stderr, "bench_train: %s: %s\n", bc->name, err);
            return 1;
        }
        trainer_stats_t st;
        trainer_step(t, &dl, &st, err, sizeof err); /* warm-up */
        double ms[16];
        for (int s = 0; s < bc->steps; s++) {
            double t0 = s_now();
            if (trainer_step(t, &dl, &st, err, sizeof err) != 0) {
                fprintf(stderr, "bench_train: %s\n", err);
                return 1;
            }
            ms[s] = (s_now() - t0) * 1e3;
        }
        qsort(ms, (size_t)bc->steps, sizeof ms[0], s_cmp);
        double med = ms[bc->steps / 2];
        double tps = (double)bc->B * bc->T / (med / 1e3);
        trainer_destroy(&t);
        free(d.tok);

        /* forward matmul seconds per token, per kernel, over the model's shapes */
        int N = bc->B * bc->T < 1024 ? bc->B * bc->T : 1024, C = bc->cfg.C, L = bc->cfg.L;
        struct { int K, OC, times; } shp[5] = {
            { C, 3 * C, L }, { C, C, L }, { C, 4 * C, L }, { 4 * C, C, L }, { C, bc->cfg.Vp, 1 },
        };
        int reps = C >= 512 ? 2 : 5;
        double sec_blas = 0, sec_llmc = 0, sec_llmc_bwd = 0, g_blas = 0, g_naive = 0, g_tiled = 0;
        int Nb = N < 256 ? N : 256;
        for (int k = 0; k < 5; k++) {
            double fl = 2.0 * N * shp[k].K * (double)shp[k].OC;
            double gb = s_gflops(matmul_forward, N, shp[k].K, shp[k].OC, reps);
            double gn = s_gflops(llmc_matmul_naive, N, shp[k].K, shp[k].OC, reps);
            double gt = s_gflops(llmc_matmul_tiled, N, shp[k].K, shp[k].OC, reps);
            if (k == 2) { /* report the MLP up-projection shape */
                g_blas = gb;
                g_naive = gn;
                g_tiled = gt;
            }
            sec_blas += shp[k].times * fl / (gb * 1e9) / N;
            sec_llmc += shp[k].times * fl / ((gn > gt ? gn : gt) * 1e9) / N;
            sec_llmc_bwd += shp[k].times * s_llmc_bwd_per_row(Nb, shp[k].K, shp[k].OC, reps);
        }
        /* per token: llm.c forward matmuls + its backward loops; tah: 3x forward at sgemm speed */
        double llmc_tok = sec_llmc + sec_llmc_bwd;
        double bound = 1.0 / llmc_tok;
        double tokens = (double)bc->B * bc->T;
        double other_s = med / 1e3 - 3.0 * sec_blas * tokens;
        if (other_s < 0)
            other_s = 0;
        double est = tokens / (llmc_tok * tokens + other_s);
        printf("%-24s %3d %4d %5d %10zu %9.1f %8.0f | %8.1f %8.1f %8.1f | %11.0f %9.0f %6.1fx\n", bc->name,
               threads, bc->B, bc->T, m->nparams, med, tps, g_blas, g_naive, g_tiled, bound, est, tps / est);
        fprintf(f, "%s,%d,%d,%d,%zu,%.2f,%.1f,%.2f,%.2f,%.2f,%.1f,%.1f,%.2f\n", bc->name, threads, bc->B,
                bc->T, m->nparams, med, tps, g_blas, g_naive, g_tiled, bound, est, tps / est);
        fflush(stdout);
        gpt2_model_destroy(&m);
    }
    fclose(f);
    printf("wrote %s\n", csv);
    return 0;
}
