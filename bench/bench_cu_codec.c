/* bench_cu_codec.c — throughput of the GPU codec kernels against the
 * measured device-to-device copy (the memory roofline).
 *
 *   bench_cu_codec [--csv PATH] [--reps N] [--only SPEC]   (CSV default: $OUT/bench_cu_codec.csv,
 *                                                 else ./bench_cu_codec.csv; --only: that codec spec
 *                                                 of the list alone, e.g. for a profiler)
 * 1. copy roofline: cudaMemcpyAsync D2D of 1 GiB, bytes read + written / time;
 * 2. per codec, encode and decode of an 8x1024x1600 fp32 tensor (synthetic
 *    activations): CUDA events around each call, warm-up, median of N
 *    repeats, rotating over 4 input and 4 output buffers (> 4x L2) so the
 *    L2 does not hold the data between calls. Two timings of each call:
 *      queued: a 60 us spin kernel (cuda/cu_bench.cu, no memory traffic)
 *              runs before the start event, so the host has enqueued the
 *              whole call before the GPU reaches it: device time only
 *              (kernels, memsets if any, the gaps between them), as in
 *              a pipeline where the call waits behind other work;
 *      idle:   the GPU idles at the start event, so the host's enqueue
 *              time of the memset and launches is inside (the first
 *              version's numbers).
 *    fixed: queued time of the same call on a (1,1,256) tensor: what every
 *    call costs regardless of size (launches, memset, gaps, tiny kernels).
 *    b2b (round 7): 8 calls back to back in one queued region (rotating
 *    buffers), the region's time / 8: a call's cost when calls follow each
 *    other, as in a pipeline (the events' own cost and one launch latency
 *    are shared by the 8).
 * 3. table: GB/s of fp32 input, bytes moved (each input read once, each
 *    output written once) / queued time, that as % of the copy rate; the
 *    idle-GPU %, the b2b % and the fixed cost beside it. Rows "encode-bf16":
 *    the same tensor rounded to bf16 and encoded from bf16 (cu_codec_encode_x),
 *    2 bytes read per element; CSV gbs_input is GB/s of the input as stored.
 * 4. ceilings (round 7): trivial kernels with the codecs' byte mixes
 *    (cuda/cu_bench.cu: 4 bytes read and 1 written per element, 1 and 4,
 *    4 and 4, read only, write only; round 23: the decode mix and write only
 *    with streaming stores, and cudaMemsetAsync of the output), timed the
 *    same way, as % of copy: what a kernel with that traffic and nothing
 *    else reaches here.
 * The codec's status is read after the runs: a failed kernel is reported,
 * not timed silently. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "codec.h"
#include "cu_codec.h"
#include "half.h"  /* bf16_from_f32 */
#include "synth.h" /* codec_synth_activations */

int cu_bench_spin(cudaStream_t st, unsigned int us); /* cuda/cu_bench.cu */
int cu_bench_stream(int mode, const void *in, void *out, uint64_t n, int persist, cudaStream_t st);
/* cuda/cu_codec.cu, benchmark only: a TAH encode running only some stages
 * (1 absmax memset, 2 k_tah_entropy, 4 select, 8 quant + flags) */
int cu_codec_encode_stages(const codec_spec_t *spec, codec_shape_t shape, const float *d_x, uint8_t *d_payload,
                           void *d_scratch, cudaStream_t stream, unsigned int stages, char *err, size_t errlen);
static unsigned int s_stages = 15u; /* dir 2 of s_time: cu_codec_encode_stages with these */
#define SPIN_US 60
#define B2B 8          /* calls per back-to-back region */
#define B2B_SPIN_US 400 /* the host enqueues all 8 calls while the spin runs */

#define NBUF 4
static void *s_dxb[NBUF]; /* the bench tensor as bf16 (dir 3 of s_time) */

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

/* Median ms of `reps` calls of one codec direction (after 5 warm-ups),
 * rotating buffers; queued 1: a spin kernel ahead of the start event; 2: the
 * same with B2B calls in the region, ms per call; 0: no spin. *mn and *mx get
 * the fastest and slowest repeat. Returns the call's rc. */
static int s_time(const codec_spec_t *spec, codec_shape_t shape, int dir, int queued, float *const dx[],
                  uint8_t *const dp[], float *const dy[], void *scratch, cudaEvent_t e0, cudaEvent_t e1, float *t,
                  int reps, double *ms, double *mn, double *mx, char *err, size_t errlen)
{
    int rc = 0;
    for (int i = -5; i < reps && rc == 0; i++) {
        const int b = (i + 5) % NBUF;
        if (queued && cu_bench_spin(0, queued == 2 ? B2B_SPIN_US : SPIN_US) != 0) {
            snprintf(err, errlen, "spin kernel launch failed");
            return -1;
        }
        CU(cudaEventRecord(e0, 0));
        const int calls = queued == 2 ? B2B : 1;
        for (int c = 0; c < calls && rc == 0; c++) {
            const int bb = (b + c) % NBUF;
            if (dir == 0)
                rc = cu_codec_encode(spec, shape, dx[bb], dp[bb], scratch, 0, err, errlen);
            else if (dir == 2)
                rc = cu_codec_encode_stages(spec, shape, dx[bb], dp[bb], scratch, 0, s_stages, err, errlen);
            else if (dir == 3)
                rc = cu_codec_encode_x(spec, shape, CU_BF16, s_dxb[bb], dp[bb], scratch, 0, err, errlen);
            else
                rc = cu_codec_decode(spec, shape, dp[bb], dy[bb], scratch, 0, err, errlen);
        }
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        if (i >= 0) {
            CU(cudaEventElapsedTime(&t[i], e0, e1));
            t[i] /= (float)calls;
        }
    }
    if (rc == 0)
        rc = cu_codec_status(scratch, 0, err, errlen);
    if (rc == 0) {
        *ms = s_median(t, reps); /* sorts t */
        if (mn)
            *mn = t[0];
        if (mx)
            *mx = t[reps - 1];
    }
    return rc;
}

/* TAH encode split: each stage alone (the scratch holds what a full encode
 * of the same shape left: all input buffers hold the same tensor), and the
 * stages in sequence (memset+entropy, +select, +quant = full): queued ms,
 * median of reps; the alone times read x cold, in sequence the quant finds
 * part of x in L2. Also each stage alone on the (1,1,256) tensor (fixed). */
static int s_tah_split(codec_shape_t shape, float *const dx[], uint8_t *const dp[], float *const dy[], void *scratch,
                       cudaEvent_t e0, cudaEvent_t e1, float *t, int reps, char *line, size_t linelen)
{
    codec_spec_t spec;
    char err[CODEC_ERRLEN];
    if (codec_spec_parse("tah", &spec, err, sizeof err) != 0)
        return -1;
    static const unsigned int alone[4] = { 1u, 2u, 4u, 8u }, seq[3] = { 3u, 7u, 15u };
    double a[4], af[4], q[3];
    const codec_shape_t tiny = { 1, 1, 256 };
    for (int pass = 0; pass < 2; pass++) {
        const codec_shape_t sh = pass ? tiny : shape;
        for (int b = 0; b < NBUF; b++) /* scratch state of a full encode of this shape */
            if (cu_codec_encode(&spec, sh, dx[b], dp[b], scratch, 0, err, sizeof err) != 0 ||
                cu_codec_status(scratch, 0, err, sizeof err) != 0) {
                fprintf(stderr, "bench_cu_codec: tah split: %s\n", err);
                return -1;
            }
        for (int k = 0; k < 4; k++) {
            s_stages = alone[k];
            if (s_time(&spec, sh, 2, 1, dx, dp, dy, scratch, e0, e1, t, reps, pass ? &af[k] : &a[k], NULL, NULL,
                       err, sizeof err) != 0) {
                fprintf(stderr, "bench_cu_codec: tah split: %s\n", err);
                return -1;
            }
        }
    }
    for (int k = 0; k < 3; k++) {
        s_stages = seq[k];
        if (s_time(&spec, shape, 2, 1, dx, dp, dy, scratch, e0, e1, t, reps, &q[k], NULL, NULL, err, sizeof err) !=
            0) {
            fprintf(stderr, "bench_cu_codec: tah split: %s\n", err);
            return -1;
        }
    }
    s_stages = 15u;
    snprintf(line, linelen,
             "tah encode split (queued ms, median of %d): alone: memset %.4f entropy %.4f select %.4f quant %.4f "
             "(sum %.4f)\n"
             "  in sequence: memset+entropy %.4f, +select %.4f (+%.4f), +quant %.4f (+%.4f) = full\n"
             "  alone on (1,1,256), us: memset %.1f entropy %.1f select %.1f quant %.1f",
             reps, a[0], a[1], a[2], a[3], a[0] + a[1] + a[2] + a[3], q[0], q[1], q[1] - q[0], q[2], q[2] - q[1],
             1e3 * af[0], 1e3 * af[1], 1e3 * af[2], 1e3 * af[3]);
    return 0;
}

/* Ceilings: cu_bench_stream's byte mixes on the bench's tensor, full grid and
 * resident grid, queued and b2b, as % of the copy rate (bytes read + written). */
static int s_ceilings(uint64_t n, float *const dx[], float *const dy[], uint8_t *const dp[], cudaEvent_t e0,
                      cudaEvent_t e1, float *t, int reps, double copy_bw)
{
    enum { NMODE = 8, MEMSET = 7 }; /* 0..6: cu_bench_stream's modes; 7: cudaMemsetAsync of the output */
    static const char *const names[NMODE] = { "read 4 B, write 1 B per element (8-bit encode)",
                                              "read 1 B, write 4 B per element (8-bit decode)",
                                              "read 4 B, write 4 B (fp32 copy)",
                                              "read 4 B (read only)",
                                              "write 4 B (write only)",
                                              "read 1 B, write 4 B, streaming stores (.cs)",
                                              "write 4 B, streaming stores (.cs)",
                                              "write 4 B by cudaMemsetAsync" };
    static const double rd[NMODE] = { 4, 1, 4, 4, 0, 1, 0, 0 }, wr[NMODE] = { 1, 4, 4, 0, 4, 4, 4, 4 };
    const uint64_t m = n & ~(uint64_t)511; /* whole warps of units */
    printf("\nceilings: trivial kernels with the codecs' byte mixes on %llu elements (%% of copy)\n",
           (unsigned long long)m);
    printf("%-48s %9s %9s %9s %9s\n", "traffic", "full q", "full b2b", "res q", "res b2b");
    for (int mode = 0; mode < NMODE; mode++) {
        double pct[4];
        for (int k = 0; k < (mode == MEMSET ? 2 : 4); k++) {
            const int persist = k >= 2, b2b = k & 1;
            for (int i = -3; i < reps; i++) {
                const int b = (i + 3) % NBUF;
                if (cu_bench_spin(0, b2b ? B2B_SPIN_US : SPIN_US) != 0)
                    return -1;
                CU(cudaEventRecord(e0, 0));
                for (int c = 0; c < (b2b ? B2B : 1); c++) {
                    const int bb = (b + c) % NBUF;
                    const void *in = mode == 1 || mode == 5 ? (const void *)dp[bb] : (const void *)dx[bb];
                    void *out = mode == 0 ? (void *)dp[bb] : (void *)dy[bb];
                    if (mode == MEMSET)
                        CU(cudaMemsetAsync(out, 0, 4 * m, 0));
                    else if (cu_bench_stream(mode, in, out, m, persist, 0) != 0)
                        return -1;
                }
                CU(cudaEventRecord(e1, 0));
                CU(cudaEventSynchronize(e1));
                if (i >= 0) {
                    CU(cudaEventElapsedTime(&t[i], e0, e1));
                    t[i] /= b2b ? (float)B2B : 1.0f;
                }
            }
            const double ms = s_median(t, reps);
            pct[k] = 100.0 * ((rd[mode] + wr[mode]) * (double)m / (ms * 1e-3)) / copy_bw;
        }
        if (mode == MEMSET)
            printf("%-48s %8.1f%% %8.1f%% %9s %9s\n", names[mode], pct[0], pct[1], "-", "-");
        else
            printf("%-48s %8.1f%% %8.1f%% %8.1f%% %8.1f%%\n", names[mode], pct[0], pct[1], pct[2], pct[3]);
    }
    printf("full: one 16-element unit per thread; res: 8 CTAs of 256 per SM, grid-stride; q: one call per queued\n"
           "region; b2b: %d calls per region\n", B2B);
    return 0;
}

static const char *s_dir_name(int dir) { return dir == 0 ? "encode" : dir == 1 ? "decode" : "encode-bf16"; }

typedef struct s_row {
    char codec[64];
    const char *dir;
    double ms, gbs_in, gbs_input, gbs_moved, pct;
    double ms_idle, pct_idle, us_fixed, ms_min, ms_max, ms_b2b, pct_b2b;
    uint64_t moved;
} s_row_t;

int main(int argc, char **argv)
{
    const char *csv = NULL, *only = NULL;
    int reps = 30;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc)
            csv = argv[++i];
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: bench_cu_codec [--csv PATH] [--reps N] [--only SPEC]\n");
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

    /* what an empty timed region and the status memset cost, queued */
    char base_note[160];
    {
        cudaEvent_t b0, b1;
        void *w = NULL;
        CU(cudaEventCreate(&b0));
        CU(cudaEventCreate(&b1));
        CU(cudaMalloc(&w, 256));
        float te[20], tm[20];
        for (int i = -3; i < 20; i++) {
            for (int which = 0; which < 2; which++) {
                if (cu_bench_spin(0, SPIN_US) != 0) {
                    fprintf(stderr, "bench_cu_codec: spin kernel launch failed\n");
                    return 1;
                }
                CU(cudaEventRecord(b0, 0));
                if (which)
                    CU(cudaMemsetAsync(w, 0, 8, 0));
                CU(cudaEventRecord(b1, 0));
                CU(cudaEventSynchronize(b1));
                if (i >= 0)
                    CU(cudaEventElapsedTime(which ? &tm[i] : &te[i], b0, b1));
            }
        }
        snprintf(base_note, sizeof base_note, "queued empty region %.1f us, 8-byte memset %.1f us",
                 1e3 * s_median(te, 20), 1e3 * s_median(tm, 20));
        printf("%s\n", base_note);
        cudaFree(w);
        cudaEventDestroy(b0);
        cudaEventDestroy(b1);
    }

    const codec_shape_t shape = { 8, 1024, 1600 };
    const uint64_t n = (uint64_t)shape.b * shape.s * shape.c;
    const char *const specs[] = { "fp32", "fp16", "bf16", "fixpt", "fixpt:stochastic=1,seed=3", "int",
                                  "int:symmetric=1", "ash-fp8", "tah", "tah:window=0" };
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
    {
        uint16_t *hb = malloc(n * sizeof *hb);
        if (!hb) {
            fprintf(stderr, "bench_cu_codec: out of host memory\n");
            return 1;
        }
        for (uint64_t i = 0; i < n; i++)
            hb[i] = bf16_from_f32(hx[i]); /* finite input */
        for (int b = 0; b < NBUF; b++) {
            CU(cudaMalloc(&s_dxb[b], n * sizeof *hb));
            CU(cudaMemcpy(s_dxb[b], hb, n * sizeof *hb, cudaMemcpyHostToDevice));
        }
        free(hb);
    }
    size_t scratch_bytes = 0;
    for (int k = 0; k < nspecs; k++) {
        codec_spec_t spec;
        codec_spec_parse(specs[k], &spec, NULL, 0);
        size_t s = cu_codec_scratch_bytes_x(&spec, shape, CU_BF16); /* >= the fp32 encode's */
        scratch_bytes = s > scratch_bytes ? s : scratch_bytes;
    }
    void *scratch = NULL;
    CU(cudaMalloc(&scratch, scratch_bytes));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float *t = malloc((size_t)reps * sizeof *t);
    s_row_t rows[40];
    int nrows = 0, failed = 0;
    char err[CODEC_ERRLEN];

    for (int k = 0; k < nspecs; k++) {
        if (only && strcmp(only, specs[k]) != 0)
            continue;
        codec_spec_t spec;
        codec_spec_parse(specs[k], &spec, NULL, 0);
        const uint64_t payload = (uint64_t)codec_frame_size(&spec, shape) - CODEC_HEADER_SIZE;
        static const int dirs[] = { 0, 1, 3 }; /* encode, decode, encode from bf16 */
        for (int di = 0; di < 3; di++) {
            const int dir = dirs[di];
            const uint64_t in_bytes = dir == 3 ? 2 * n : 4 * n;
            if (dir == 1) { /* decode what the encoder wrote, in every buffer */
                for (int b = 0; b < NBUF; b++)
                    if (cu_codec_encode(&spec, shape, dx[b], dp[b], scratch, 0, err, sizeof err) != 0 ||
                        cu_codec_status(scratch, 0, err, sizeof err) != 0) {
                        fprintf(stderr, "bench_cu_codec: %s encode: %s\n", specs[k], err);
                        failed = 1;
                    }
            }
            double ms = 0, ms_idle = 0, ms_fixed = 0, mn = 0, mx = 0, ms_b2b = 0;
            int rc = s_time(&spec, shape, dir, 1, dx, dp, dy, scratch, e0, e1, t, reps, &ms, &mn, &mx, err,
                            sizeof err);
            if (rc == 0)
                rc = s_time(&spec, shape, dir, 0, dx, dp, dy, scratch, e0, e1, t, reps, &ms_idle, NULL, NULL, err,
                            sizeof err);
            if (rc == 0)
                rc = s_time(&spec, shape, dir, 2, dx, dp, dy, scratch, e0, e1, t, reps, &ms_b2b, NULL, NULL, err,
                            sizeof err);
            if (rc == 0) { /* fixed cost: the same call on a (1,1,256) tensor (payloads from a tiny encode) */
                const codec_shape_t tiny = { 1, 1, 256 };
                if (dir == 1)
                    for (int b = 0; b < NBUF && rc == 0; b++)
                        rc = cu_codec_encode(&spec, tiny, dx[b], dp[b], scratch, 0, err, sizeof err);
                if (rc == 0)
                    rc = s_time(&spec, tiny, dir, 1, dx, dp, dy, scratch, e0, e1, t, reps, &ms_fixed, NULL, NULL,
                                err, sizeof err);
            }
            if (rc != 0) {
                fprintf(stderr, "bench_cu_codec: %s %s: %s\n", specs[k], s_dir_name(dir), err);
                failed = 1;
                continue;
            }
            s_row_t *r = &rows[nrows++];
            snprintf(r->codec, sizeof r->codec, "%s", specs[k]);
            r->dir = s_dir_name(dir);
            r->ms = ms;
            r->ms_min = mn;
            r->ms_max = mx;
            r->ms_idle = ms_idle;
            r->us_fixed = 1e3 * ms_fixed;
            r->moved = in_bytes + payload;
            r->gbs_in = 4.0 * (double)n / (r->ms * 1e-3) / 1e9;
            r->gbs_input = (double)in_bytes / (r->ms * 1e-3) / 1e9;
            r->gbs_moved = (double)r->moved / (r->ms * 1e-3) / 1e9;
            r->pct = 100.0 * r->gbs_moved * 1e9 / copy_bw;
            r->pct_idle = 100.0 * ((double)r->moved / (ms_idle * 1e-3)) / copy_bw;
            r->ms_b2b = ms_b2b;
            r->pct_b2b = 100.0 * ((double)r->moved / (ms_b2b * 1e-3)) / copy_bw;
        }
    }

    FILE *f = fopen(csv, "w");
    if (f) {
        fprintf(f, "device,codec,direction,shape,ms,gbs_fp32,bytes_moved,gbs_moved,copy_gbs,pct_copy,"
                   "ms_min,ms_max,ms_idle,pct_copy_idle,us_fixed,ms_b2b,pct_copy_b2b,gbs_input\n");
        for (int i = 0; i < nrows; i++)
            fprintf(f,
                    "\"%s\",\"%s\",%s,8x1024x1600,%.5f,%.1f,%llu,%.1f,%.1f,%.1f,%.5f,%.5f,%.5f,%.1f,%.2f,%.5f,%.1f,%.1f\n",
                    prop.name, rows[i].codec, rows[i].dir, rows[i].ms, rows[i].gbs_in,
                    (unsigned long long)rows[i].moved, rows[i].gbs_moved, copy_bw / 1e9, rows[i].pct,
                    rows[i].ms_min, rows[i].ms_max, rows[i].ms_idle, rows[i].pct_idle, rows[i].us_fixed,
                    rows[i].ms_b2b, rows[i].pct_b2b, rows[i].gbs_input);
        fclose(f);
    } else {
        fprintf(stderr, "bench_cu_codec: cannot write %s\n", csv);
    }
    printf("\n%-28s %-11s %8s %8s %12s %10s %8s %7s %8s %7s %9s\n", "codec (8x1024x1600)", "dir", "ms",
           "min-max%", "bytes moved", "GB/s moved", "GB/s in", "% copy", "idle %", "b2b %", "fixed us");
    for (int i = 0; i < nrows; i++)
        printf("%-28s %-11s %8.4f %8.1f %12llu %10.1f %8.1f %6.1f%% %7.1f%% %6.1f%% %9.1f\n", rows[i].codec,
               rows[i].dir, rows[i].ms, 100.0 * (rows[i].ms_max - rows[i].ms_min) / rows[i].ms,
               (unsigned long long)rows[i].moved, rows[i].gbs_moved, rows[i].gbs_input, rows[i].pct, rows[i].pct_idle,
               rows[i].pct_b2b, rows[i].us_fixed);
    printf("ms/%% copy: queued device time (spin kernel ahead of the start event), median of %d; idle %%: GPU idle\n"
           "at the start event (host enqueue inside); b2b %%: %d calls back to back per queued region; fixed us:\n"
           "queued time of a (1,1,256) call; min-max%%: spread of the queued repeats; GB/s in: of the input as stored\n"
           "(fp32; encode-bf16: bf16); copy roofline %.1f GB/s (%s);\n"
           "CSV: %s\n",
           reps, B2B, copy_bw / 1e9, base_note, csv);
    if (!only && s_ceilings(n, dx, dy, dp, e0, e1, t, reps, copy_bw) != 0)
        failed = 1;

    char split[768];
    if (only && strcmp(only, "tah") != 0)
        split[0] = '\0';
    else if (s_tah_split(shape, dx, dp, dy, scratch, e0, e1, t, reps, split, sizeof split) == 0)
        printf("%s\n", split);
    else
        failed = 1;

    for (int b = 0; b < NBUF; b++) {
        cudaFree(s_dxb[b]);
        cudaFree(dx[b]);
        cudaFree(dy[b]);
        cudaFree(dp[b]);
    }
    cudaFree(scratch);
    free(hx);
    free(t);
    return failed;
}
