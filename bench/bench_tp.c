/* bench_tp.c — tensor parallelism on the CPU: the two-shot all-reduce per
 * codec and size, and training throughput of the demo model at tp = 1 / 2
 * with and without compression.
 *
 *   bench_tp [--threads N] [--tp N] [--steps N] [--csv FILE] [--quick]
 *
 * Part 1 times tp_allreduce (pipeline/tpcomm.h) on a team of --tp worker
 * threads (default 2) for fp32 tensors of 64 KB .. 16 MB: median of the
 * repetitions, the algorithm bandwidth (tensor bytes / time), the bytes one
 * rank sends, and the relative L2 error against the exact sum.
 * Part 2 trains the demo model (scripts/demo-train: L=4, NH=4, C=128,
 * T=128, V=256, B=16, 2 micro-batches, 2 stages) on random tokens in
 * process (the tah-train trainer) and reports tokens/s, median over --steps
 * steps after one warm-up step.
 * Rows go to stdout as a table and to --csv (bench/results/bench_tp.csv,
 * relative to the working directory) as part,codec,tp,size_bytes,ms,GB_s,
 * wire_bytes,rel_err,tokens_s. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "errors.h"
#include "layers.h"  /* layers_set_threads, layers_max_threads */
#include "tpcomm.h"  /* tp_allreduce */
#include "tpteam.h"  /* tp_team_* */
#include "trainer.h" /* trainer_* */

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

typedef struct s_codec {
    const char *name, *rs, *ag;
} s_codec_t;

static const s_codec_t s_codecs[] = {
    { "none", "none", "none" },
    { "bf16", "bf16", "bf16" },
    { "ash-fp8", "ash-fp8", "ash-fp8" },
    { "int8", "int:bits=8", "int:bits=8" },
    { "int4/int8", "int:bits=4", "int:bits=8" },
};
#define S_NCODECS (sizeof s_codecs / sizeof s_codecs[0])

typedef struct s_ar {
    tp_comm_t *comm;
    float **work; /* per rank, n floats */
    size_t n;
    uint64_t id; /* the all-reduce's (tpcomm.h): one per call */
    int rc[TP_MAX];
} s_ar_t;

static void s_ar_rank(void *arg, int rank)
{
    s_ar_t *a = arg;
    a->rc[rank] = tp_allreduce(a->comm, rank, a->work[rank], a->n, a->id, NULL, 0);
}

static uint64_t s_rng = 88172645463325252ull;
static float s_uniform(void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (float)((double)(s_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int s_bench_allreduce(FILE *csv, int tp, int quick)
{
    const size_t sizes[] = { 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20 };
    const int nsizes = quick ? 3 : 5;
    const size_t nmax = sizes[nsizes - 1] / sizeof(float);
    tp_team_t *team = tp_team_new(tp, NULL, 0);
    float *src[TP_MAX], *work[TP_MAX];
    float *want = malloc(nmax * sizeof(float));
    for (int r = 0; r < tp; r++) {
        src[r] = malloc(nmax * sizeof(float));
        work[r] = malloc(nmax * sizeof(float));
        for (size_t i = 0; i < nmax; i++)
            src[r][i] = s_uniform() * (1.0f + (float)r);
    }
    for (size_t i = 0; i < nmax; i++) {
        double s = 0.0;
        for (int r = 0; r < tp; r++)
            s += src[r][i];
        want[i] = (float)s;
    }
    printf("all-reduce, tp=%d worker threads (two-shot: reduce-scatter + all-gather)\n", tp);
    printf("%-10s %10s %10s %10s %12s %10s\n", "codec", "size", "ms", "GB/s", "sent/rank", "rel err");
    for (size_t c = 0; c < S_NCODECS; c++) {
        codec_spec_t rs, ag;
        char err[256] = "";
        tp_codec_parse(s_codecs[c].rs, &rs, err, sizeof err);
        tp_codec_parse(s_codecs[c].ag, &ag, err, sizeof err);
        tp_comm_t *comm = tp_comm_new(tp_shm_new(tp, err, sizeof err), &rs, &ag, nmax, err, sizeof err);
        if (!comm || !team) {
            fprintf(stderr, "bench_tp: %s\n", err);
            return 1;
        }
        for (int k = 0; k < nsizes; k++) {
            size_t n = sizes[k] / sizeof(float);
            int reps = (int)(quick ? 3 : 5 + (64 << 20) / sizes[k] / 4);
            double *t = malloc((size_t)reps * sizeof(double));
            s_ar_t a = { comm, work, n, 0, { 0 } };
            for (int rep = -1; rep < reps; rep++, a.id++) {
                for (int r = 0; r < tp; r++)
                    memcpy(work[r], src[r], n * sizeof(float));
                double t0 = s_now();
                tp_team_run(team, s_ar_rank, &a);
                if (rep >= 0)
                    t[rep] = s_now() - t0;
                if (a.rc[0]) {
                    fprintf(stderr, "bench_tp: all-reduce failed: %s\n", tah_strerror(a.rc[0]));
                    return 1;
                }
            }
            qsort(t, (size_t)reps, sizeof(double), s_cmp);
            double med = t[reps / 2], d = 0.0, nn = 0.0;
            for (size_t i = 0; i < n; i++) {
                double e = (double)work[0][i] - (double)want[i];
                d += e * e;
                nn += (double)want[i] * want[i];
            }
            /* the exact sum of the first n elements: want is the full-size sum, prefix-equal */
            double rel = sqrt(d / nn), gbs = (double)sizes[k] / med / 1e9;
            size_t wire = tp_comm_wire_bytes(comm, n);
            char sz[32];
            snprintf(sz, sizeof sz, "%zu KB", sizes[k] >> 10);
            printf("%-10s %10s %10.3f %10.2f %12zu %10.2e\n", s_codecs[c].name, sz, med * 1e3, gbs, wire, rel);
            fprintf(csv, "allreduce,%s,%d,%zu,%.4f,%.3f,%zu,%.3e,\n", s_codecs[c].name, tp, sizes[k], med * 1e3, gbs,
                    wire, rel);
            free(t);
        }
        tp_comm_destroy(&comm);
    }
    for (int r = 0; r < tp; r++) {
        free(src[r]);
        free(work[r]);
    }
    free(want);
    tp_team_destroy(&team);
    return 0;
}

static int s_bench_train(FILE *csv, int steps)
{
    const gpt2_config_t cfg = { .maxT = 128, .V = 256, .Vp = 256, .L = 4, .NH = 4, .C = 128 };
    const int B = 16, T = 128, M = 2, S = 2;
    struct {
        const char *name, *rs, *ag;
        int tp;
    } runs[] = {
        { "none", "none", "none", 1 },
        { "none", "none", "none", 2 },
        { "ash-fp8", "ash-fp8", "ash-fp8", 2 },
        { "int4/int8", "int:bits=4", "int:bits=8", 2 },
    };
    char err[512] = "";
    gpt2_model_t *init = gpt2_model_new(&cfg, err, sizeof err);
    if (!init)
        return 1;
    gpt2_model_init_random(init, 1337);
    size_t ntok = (size_t)(steps + 2) * M * B * T + 1;
    int *tok = malloc(ntok * sizeof(int));
    for (size_t i = 0; i < ntok; i++)
        tok[i] = (int)((s_uniform() + 1.0f) * 127.0f);
    data_t d = { .tok = tok, .n = ntok };
    printf("\ntraining, demo model (L=4 NH=4 C=128 T=128 V=256, B=16, M=2, S=2), %d threads\n", layers_max_threads());
    printf("%-10s %4s %12s %10s %10s\n", "codec", "tp", "tokens/s", "ms/step", "loss");
    int rc = 0;
    for (size_t k = 0; k < sizeof runs / sizeof runs[0] && !rc; k++) {
        trainer_opts_t o = { .cfg = cfg, .S = S, .M = M, .B = B, .T = T, .sched = SCHED_1F1B, .tied = 1,
                             .tp = runs[k].tp };
        tp_codec_parse(runs[k].rs, &o.tp_rs, err, sizeof err);
        tp_codec_parse(runs[k].ag, &o.tp_ag, err, sizeof err);
        optim_defaults(&o.optim);
        o.optim.lr = 1e-3f;
        o.optim.total_steps = steps + 1;
        trainer_t *tr = trainer_new(&o, init, err, sizeof err);
        data_loader_t dl;
        if (!tr || data_loader_init(&dl, &d, B, T, err, sizeof err) != 0) {
            fprintf(stderr, "bench_tp: %s\n", err);
            rc = 1;
            break;
        }
        double *t = malloc((size_t)steps * sizeof(double)), loss = 0.0;
        for (int s = -1; s < steps; s++) {
            trainer_stats_t st;
            double t0 = s_now();
            if (trainer_step(tr, &dl, &st, err, sizeof err) != 0) {
                fprintf(stderr, "bench_tp: %s\n", err);
                rc = 1;
                break;
            }
            if (s >= 0)
                t[s] = s_now() - t0;
            loss = st.loss;
        }
        if (!rc) {
            qsort(t, (size_t)steps, sizeof(double), s_cmp);
            double med = t[steps / 2], tps = (double)M * B * T / med;
            printf("%-10s %4d %12.0f %10.1f %10.4f\n", runs[k].name, runs[k].tp, tps, med * 1e3, loss);
            fprintf(csv, "train,%s,%d,,%.4f,,,,%.1f\n", runs[k].name, runs[k].tp, med * 1e3, tps);
        }
        free(t);
        trainer_destroy(&tr);
    }
    free(tok);
    gpt2_model_destroy(&init);
    return rc;
}

int main(int argc, char **argv)
{
    const char *csv_path = "bench/results/bench_tp.csv";
    int threads = 0, tp = 2, steps = 10, quick = 0;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--threads") && i + 1 < argc && (threads = (int)strtol(argv[++i], &end, 10)) >= 1 && !*end)
            continue;
        if (!strcmp(argv[i], "--tp") && i + 1 < argc && (tp = (int)strtol(argv[++i], &end, 10)) >= 2 && tp <= TP_MAX &&
            !*end)
            continue;
        if (!strcmp(argv[i], "--steps") && i + 1 < argc && (steps = (int)strtol(argv[++i], &end, 10)) >= 1 && !*end)
            continue;
        if (!strcmp(argv[i], "--csv") && i + 1 < argc) {
            csv_path = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
            continue;
        }
        fprintf(stderr, "usage: bench_tp [--threads N] [--tp 2..%d] [--steps N] [--csv FILE] [--quick]\n", TP_MAX);
        return 2;
    }
    layers_set_threads(threads > 0 ? threads : layers_max_threads());
    if (quick)
        steps = steps < 3 ? steps : 3;
    FILE *csv = fopen(csv_path, "w");
    if (!csv) {
        fprintf(stderr, "bench_tp: cannot write %s (run from the repository root, or give --csv)\n", csv_path);
        return 1;
    }
    fprintf(csv, "part,codec,tp,size_bytes,ms,GB_s,wire_bytes,rel_err,tokens_s\n");
    int rc = s_bench_allreduce(csv, tp, quick);
    if (!rc)
        rc = s_bench_train(csv, steps);
    if (fclose(csv) != 0)
        rc = 1;
    if (!rc)
        printf("wrote %s\n", csv_path);
    return rc;
}
