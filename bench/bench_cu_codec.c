/* bench_cu_codec.c — throughput of the GPU codec kernels against the
 * measured device-to-device copy (the memory roofline).
 *
 *   bench_cu_codec [--csv PATH] [--reps N]       (CSV default: $OUT/bench_cu_codec.csv,
 *                                                 else ./bench_cu_codec.csv)
 * 1. copy roofline: cudaMemcpyAsync D2D of 1 GiB, bytes read + written / time;
 * 2. per codec, encode and decode of an 8x1024x1600 fp32 tensor (synthetic
 *    activations): CUDA events around each call, warm-up, median of N
 *    repeats, rotating over 4 input and 4 output buffers (> 4x L2) so the
 *    L2 does not hold the data between calls;
 * 3. table: GB/s of fp32 input, bytes moved (each input read once, each
 *    output written once) / time, that as % of the copy rate.
 * The codec's status is read after the runs: a failed kernel is reported,
 * not timed silently. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "codec.h"
#include "cu_codec.h"
#include "synth.h" /* codec_synth_activations */

#define NBUF 4

#define CU(call)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            fprintf(stderr, "bench_cu_codec: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,             \
                    cudaGetErrorString(e_));                                                          \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

static int s_cmp(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float s_median(float *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, s_cmp);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

static double s_copy_bw(int reps)
{
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    CU(cudaMalloc(&a, bytes));
    CU(cudaMalloc(&b, bytes));
    CU(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float *t = malloc((size_t)reps * sizeof *t);
    for (int i = -3; i < reps; i++) {
        CU(cudaEventRecord(e0, 0));
        CU(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        if (i >= 0)
            CU(cudaEventElapsedTime(&t[i], e0, e1));
    }
    double ms = s_median(t, reps);
    free(t);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)bytes / (ms * 1e-3); /* read + write */
}

typedef struct s_row {
    char codec[64];
    const char *dir;
    double ms, gbs_in, gbs_moved, pct;
    uint64_t moved;
} s_row_t;

int main(int argc, char **argv)
{
    const char *csv = NULL;
    int reps = 30;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc)
            csv = argv[++i];
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cu_codec [--csv PATH] [--reps N]\n");
            return 2;
        }
    }
    if (reps < 3)
        reps = 3;
    char csv_buf[4096];
    if (!csv) {
        const char *out = getenv("OUT");
        snprintf(csv_buf, sizeof csv_buf, "%s/bench_cu_codec.csv", out && *out ? out : ".");
        csv = csv_buf;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "bench_cu_codec: no CUDA device\n");
        return 1;
    }
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("bench_cu_codec: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

    const double copy_bw = s_copy_bw(20);
    printf("device-to-device copy: %.1f GB/s (bytes read + written)\n", copy_bw / 1e9);

    const codec_shape_t shape = { 8, 1024, 1600 };
    const uint64_t n = (uint64_t)shape.b * shape.s * shape.c;
    const char *const specs[] = { "fp32", "fp16", "bf16", "fixpt", "fixpt:stochastic=1,seed=3", "int",
                                  "int:symmetric=1", "ash-fp8", "tah" };
    const int nspecs = (int)(sizeof specs / sizeof specs[0]);

    float *hx = malloc(n * sizeof *hx);
    codec_synth_activations(hx, shape, 1);
    for (uint64_t i = 0; i < n; i++)
        hx[i] *= 0.01f; /* fixpt's default scale keeps its fp16 steps in range */
    float *dx[NBUF], *dy[NBUF];
    uint8_t *dp[NBUF];
    for (int b = 0; b < NBUF; b++) {
        CU(cudaMalloc((void **)&dx[b], n * sizeof(float)));
        CU(cudaMalloc((void **)&dy[b], n * sizeof(float)));
        CU(cudaMalloc((void **)&dp[b], n * sizeof(float))); /* fp32's payload is the largest */
        CU(cudaMemcpy(dx[b], hx, n * sizeof(float), cudaMemcpyHostToDevice));
    }
    size_t scratch_bytes = 0;
    for (int k = 0; k < nspecs; k++) {
        codec_spec_t spec;
        codec_spec_parse(specs[k], &spec, NULL, 0);
        size_t s = cu_codec_scratch_bytes(&spec, shape);
        scratch_bytes = s > scratch_bytes ? s : scratch_bytes;
    }
    void *scratch = NULL;
    CU(cudaMalloc(&scratch, scratch_bytes));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float *t = malloc((size_t)reps * sizeof *t);
    s_row_t rows[32];
    int nrows = 0, failed = 0;
    char err[CODEC_ERRLEN];

    for (int k = 0; k < nspecs; k++) {
        codec_spec_t spec;
        codec_spec_parse(specs[k], &spec, NULL, 0);
        const uint64_t payload = (uint64_t)codec_frame_size(&spec, shape) - CODEC_HEADER_SIZE;
        for (int dir = 0; dir < 2; dir++) {
            if (dir == 1) { /* decode what the encoder wrote, in every buffer */
                for (int b = 0; b < NBUF; b++)
                    if (cu_codec_encode(&spec, shape, dx[b], dp[b], scratch, 0, err, sizeof err) != 0 ||
                        cu_codec_status(scratch, 0, err, sizeof err) != 0) {
                        fprintf(stderr, "bench_cu_codec: %s encode: %s\n", specs[k], err);
                        failed = 1;
                    }
            }
            int rc = 0;
            for (int i = -5; i < reps && rc == 0; i++) {
                const int b = (i + 5) % NBUF;
                CU(cudaEventRecord(e0, 0));
                if (dir == 0)
                    rc = cu_codec_encode(&spec, shape, dx[b], dp[b], scratch, 0, err, sizeof err);
                else
                    rc = cu_codec_decode(&spec, shape, dp[b], dy[b], scratch, 0, err, sizeof err);
                CU(cudaEventRecord(e1, 0));
                CU(cudaEventSynchronize(e1));
                if (i >= 0)
                    CU(cudaEventElapsedTime(&t[i], e0, e1));
            }
            if (rc == 0)
                rc = cu_codec_status(scratch, 0, err, sizeof err);
            if (rc != 0) {
                fprintf(stderr, "bench_cu_codec: %s %s: %s\n", specs[k], dir ? "decode" : "encode", err);
                failed = 1;
                continue;
            }
            s_row_t *r = &rows[nrows++];
            snprintf(r->codec, sizeof r->codec, "%s", specs[k]);
            r->dir = dir ? "decode" : "encode";
            r->ms = s_median(t, reps);
            r->moved = 4 * n + payload;
            r->gbs_in = 4.0 * (double)n / (r->ms * 1e-3) / 1e9;
            r->gbs_moved = (double)r->moved / (r->ms * 1e-3) / 1e9;
            r->pct = 100.0 * r->gbs_moved * 1e9 / copy_bw;
        }
    }

    FILE *f = fopen(csv, "w");
    if (f) {
        fprintf(f, "device,codec,direction,shape,ms,gbs_fp32,bytes_moved,gbs_moved,copy_gbs,pct_copy\n");
        for (int i = 0; i < nrows; i++)
            fprintf(f, "\"%s\",\"%s\",%s,8x1024x1600,%.5f,%.1f,%llu,%.1f,%.1f,%.1f\n", prop.name, rows[i].codec,
                    rows[i].dir, rows[i].ms, rows[i].gbs_in, (unsigned long long)rows[i].moved, rows[i].gbs_moved,
                    copy_bw / 1e9, rows[i].pct);
        fclose(f);
    } else {
        fprintf(stderr, "bench_cu_codec: cannot write %s\n", csv);
    }
    printf("\n%-28s %-7s %9s %11s %12s %11s %7s\n", "codec (8x1024x1600 fp32)", "dir", "ms", "GB/s fp32",
           "bytes moved", "GB/s moved", "% copy");
    for (int i = 0; i < nrows; i++)
        printf("%-28s %-7s %9.4f %11.1f %12llu %11.1f %6.1f%%\n", rows[i].codec, rows[i].dir, rows[i].ms,
               rows[i].gbs_in, (unsigned long long)rows[i].moved, rows[i].gbs_moved, rows[i].pct);
    printf("copy roofline %.1f GB/s; CSV: %s\n", copy_bw / 1e9, csv);

    for (int b = 0; b < NBUF; b++) {
        cudaFree(dx[b]);
        cudaFree(dy[b]);
        cudaFree(dp[b]);
    }
    cudaFree(scratch);
    free(hx);
    free(t);
    return failed;
}
