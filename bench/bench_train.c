/* bench_train.c — training throughput of the CPU stage (forward + backward +
 * AdamW step, one stage, one micro-batch) for the demo config and GPT-2 124M,
 * against an estimate of llm.c's train_gpt2.c on the same machine.
 *
 *   bench_train [--threads N] [--csv FILE] [--quick] [--full]
 *
 * llm.c cannot be fetched here, so its speed is estimated from its matmul
 * kernels: llmc_matmul.c re-creates them (the plain OpenMP loop and the
 * 8-row tiled loop, compiled -Ofast like llm.c) and we time them on the
 * model's MLP shape. est. llm.c tokens/s = 1 / (matmul FLOPs per token of a
 * training step / kernel GFLOP/s) counts only the matmuls (6 x params per
 * token: forward 2, backward 4), never llm.c's attention, layernorm or
 * optimizer time, so it is an upper bound on llm.c's speed. The table also
 * shows cblas_sgemm's GFLOP/s on the same shape (what tah uses). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h> /* execv */

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
    if (!getenv("OPENBLAS_NUM_THREADS") && setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0)
        execv("/proc/self/exe", argv); /* see train_main.c: no OpenBLAS thread pool */
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
               "llmc_tiled_gflops,est_llmc_tokens_per_s,speedup_vs_llmc_est\n");
    printf("%-24s %3s %4s %5s %10s %10s %10s | %8s %8s %8s | %12s %7s\n", "config", "thr", "B", "T",
           "params", "ms/step", "tok/s", "sgemm", "llmc", "llmc-8", "est llm.c", "speedup");
    printf("%-24s %3s %4s %5s %10s %10s %10s | %8s %8s %8s | %12s %7s\n", "", "", "", "", "", "", "",
           "GFLOP/s", "naive", "tiled", "tok/s (max)", "");
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

        /* kernels on the MLP up-projection shape of this model */
        int N = bc->B * bc->T < 1024 ? bc->B * bc->T : 1024, C = bc->cfg.C, OC = 4 * C;
        int reps = C >= 512 ? 2 : 5;
        double g_blas = s_gflops(matmul_forward, N, C, OC, reps);
        double g_naive = s_gflops(llmc_matmul_naive, N, C, OC, reps);
        double g_tiled = s_gflops(llmc_matmul_tiled, N, C, OC, reps);
        /* matmul FLOPs per token of a training step: 6 per weight (fwd 2, bwd 4) */
        double wparams = (double)bc->cfg.L * 12.0 * C * C + (double)C * bc->cfg.Vp;
        double flops_tok = 6.0 * wparams;
        double g_llmc = g_tiled > g_naive ? g_tiled : g_naive;
        double est = g_llmc * 1e9 / flops_tok;
        printf("%-24s %3d %4d %5d %10zu %10.1f %10.0f | %8.1f %8.1f %8.1f | %12.0f %6.1fx\n", bc->name,
               threads, bc->B, bc->T, m->nparams, med, tps, g_blas, g_naive, g_tiled, est, tps / est);
        fprintf(f, "%s,%d,%d,%d,%zu,%.2f,%.1f,%.2f,%.2f,%.2f,%.1f,%.2f\n", bc->name, threads, bc->B,
                bc->T, m->nparams, med, tps, g_blas, g_naive, g_tiled, est, tps / est);
        fflush(stdout);
        gpt2_model_destroy(&m);
    }
    fclose(f);
    printf("wrote %s\n", csv);
    return 0;
}
