// bench_tp_nccl.cu — the tensor-parallel all-reduce on N GPUs of one
// process: NCCL's own all-reduce (bf16 and fp32) against the two-shot
// compressed all-reduce of docs/tp.md (TACO / Flash Communication) built
// from the GPU codec kernels (cuda/cu_codec.h) and NCCL point-to-point.
//
//   bench_tp_nccl [--gpus N] [--sizes 1,4,16,64,256] [--iters N] [--csv PATH]
//
// Sizes are MB (2^20 bytes) of bf16 input per GPU: n = MB * 2^19 elements.
// Exit 0 when every check passed, 1 on a failed check or a CUDA/NCCL error,
// 2 on a usage error, 77 when fewer than 2 (or --gpus) GPUs are visible.
//
// The all-reduces are cuda/cu_tpcomm.h's (the module the CUDA stage uses at
// tp > 1): one host thread drives all GPUs (ncclCommInitAll; NCCL calls of
// all ranks inside one ncclGroupStart/End), each GPU on its own non-blocking
// stream; NCCL_NVLS_ENABLE=0 is set before NCCL starts (NVLink multicast
// must stay off on the machines this runs on). One group per variant: codec
// none (NCCL's all-reduce, bf16 and fp32) and the two-shot compressed
// all-reduce (cu_tpcomm.h: the tensor zero-padded to N*k, k = ceil(n/N)
// rounded up to the codecs' block/group; every chunk encoded once with the
// reduce-scatter codec, all-to-all with grouped ncclSend/ncclRecv, the own
// chunk's N payloads decoded and summed in fp32 in rank order, the sum
// encoded once with the all-gather codec, ncclAllGather in place, every
// chunk decoded: exactly two compressions per element, every rank the same
// bits; only codec payloads travel, in slots padded to 256 bytes). The
// pairs: ash-fp8 / ash-fp8 and int:bits=4 / int:bits=8 (Flash
// Communication's INT4 reduce-scatter with an INT8 all-gather). The bf16
// input is encoded as bf16 (cu_codec_encode_x; converted to fp32 first only
// when it must be padded to whole chunks); the output is fp32.
//
// Timing (CUDA events on every stream, warm-up, mean of --iters): for each
// variant, the whole loop of iterations is timed twice:
//   e2e:    the GPUs start idle, so the host's enqueue time of every launch
//           is inside when the host is slower than the GPUs;
//   device: a spin kernel (cuda/cu_bench.cu) longer than the measured enqueue
//           time runs before the start events, so the host has queued the
//           whole loop before the GPUs reach it: device time only. The table
//           shows this; the CSV has both.
// The slowest rank's time counts. The compressed all-reduce is also timed
// with only its codec work (steps 0,1,3,4,6: what the GPU computes) and
// with only its communication (steps 2 and 5 on the same buffers).
//
// Correctness, checked before timing, per size and variant: the fp32
// reference sum (every rank's bf16 input regenerated on rank 0, summed in
// fp32 in rank order) against rank 0's output: relative L2 error; every
// rank's output bitwise against rank 0's (compressed variants); up to
// ORACLE_MB, rank 0's output bitwise against the same two-shot run with the
// CPU codecs on the host (s_cpu_oracle); no non-finite output; the codec
// status of every call (collected on the device, cu_tp_status). Bounds
// (exit 1 beyond):
//   NCCL fp32 < 1e-6: it only reorders fp32 sums of N terms (error ~N*2^-24);
//   ash-fp8 < 0.1, int4/int8 < 0.2: see s_bound().
// Once, at the first size up to ORACLE_MB, stochastic rounding (fixpt8-sr:
// fixpt:bits=8,stochastic=1 in both shots, not timed): two all-reduces of
// the same input, each against the CPU oracle under its own id, must
// differ from each other (fresh coins per call; s_stoch_check).
//
// "Where does compression pay": a MODEL, not a measurement: the link
// bandwidth NCCL achieves is measured (bus bandwidth of the bf16
// all-reduce); for emulated slower links (64, 25, 10 GB/s per direction)
// time = measured codec device time + wire bytes per rank / link for the
// compressed variants, against 2(N-1)/N * bytes / link for the ring bf16
// all-reduce. No link is rate-limited.
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_bf16.h> // __nv_bfloat16 (before nccl.h: ncclBfloat16)
#include <cuda_runtime.h>
#include <nccl.h> // ncclGetVersion

extern "C" { // C headers without their own extern "C"
#include "codec.h"  // codec_spec_parse, codec_frame_size, codec_encode, codec_decode (the CPU oracle)
#include "errors.h" // tah_strerror
#include "tpcomm.h" // tp_chunk_spec (the CPU oracle derives each frame's spec as the group does)
}
#include "cu_tpcomm.h" // cu_tp_new, cu_tp_allreduce, cu_tp_status, cu_tp_layout

extern "C" int cu_bench_spin(cudaStream_t st, unsigned int us); // cuda/cu_bench.cu

#define MAXG CU_TP_MAX
#define MAXSIZES 16
#define WARMUP 3
#define WATCHDOG_S 180
#define ORACLE_MB 4 // sizes up to this also run the two-shot with the CPU codecs, compared bitwise

// ---- errors, watchdog ----

static const char *volatile s_phase = "start";

static void s_on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "\nbench_tp_nccl: watchdog: no progress for " "180" " s; stuck in: ";
    ssize_t w = write(2, msg, sizeof msg - 1);
    const char *p = s_phase;
    size_t len = 0;
    while (p[len])
        len++;
    w = write(2, p, len);
    w = write(2, "\nHINT: an NCCL hang; rerun with NCCL_DEBUG=INFO\n", 49);
    (void)w;
    _exit(1);
}

// what the program does now (printed by the watchdog and by every error); re-arms it
static void s_set_phase(const char *what)
{
    s_phase = what;
    alarm(WATCHDOG_S);
}

static int s_cur_dev(void)
{
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess)
        d = -1;
    return d;
}

#define CU(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "bench_tp_nccl: %s:%d: %s: %s (%s), device %d, during: %s\n", __FILE__, __LINE__, \
                    #call, cudaGetErrorString(e_), cudaGetErrorName(e_), s_cur_dev(), s_phase);              \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

#define LAUNCHED() CU(cudaGetLastError())

#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 21300
#define S_NCCL_LAST() ncclGetLastError(NULL)
#else
#define S_NCCL_LAST() "(ncclGetLastError needs NCCL >= 2.13)"
#endif

#define NC(call)                                                                                             \
    do {                                                                                                     \
        ncclResult_t r_ = (call);                                                                            \
        if (r_ != ncclSuccess) {                                                                             \
            fprintf(stderr, "bench_tp_nccl: %s:%d: %s: %s (%d): %s, during: %s\n", __FILE__, __LINE__, #call,  \
                    ncclGetErrorString(r_), (int)r_, S_NCCL_LAST(), s_phase);                                \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- kernels ----
//
// All elementwise kernels: grid-stride loops, thread t of the grid handles
// elements t, t + gridDim*blockDim, ... (k_sum_ranks: float4 groups).

static unsigned int s_blocks(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned int)(b < 4096 ? (b ? b : 1) : 4096);
}

__device__ static uint64_t d_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull; // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Element i of rank r's input: the sum of four uniform 16-bit integers,
// centred (Irwin-Hall, bell-shaped, sigma = 1.155 after the 2^-15 scale,
// bounded by 4 sigma), rounded to bf16. Integer arithmetic and one exact
// float scaling: the same bits wherever it is computed (k_gen, k_ref).
__device__ static __nv_bfloat16 d_gen(uint64_t seed, int r, size_t i)
{
    uint64_t h = d_mix(seed ^ ((uint64_t)r << 48) ^ (uint64_t)i);
    int s = (int)(h & 0xffff) + (int)((h >> 16) & 0xffff) + (int)((h >> 32) & 0xffff) + (int)(h >> 48) - 131070;
    return __float2bfloat16_rn((float)s * 0x1p-15f);
}

__global__ static void k_gen(__nv_bfloat16 *x /* (n) */, size_t n, uint64_t seed, int r)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = d_gen(seed, r, i);
}

// the fp32 sum of every rank's input, in rank order
__global__ static void k_ref(float *ref /* (n) */, size_t n, uint64_t seed, int nranks)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float acc = __bfloat162float(d_gen(seed, 0, i));
        for (int r = 1; r < nranks; r++)
            acc += __bfloat162float(d_gen(seed, r, i));
        ref[i] = acc;
    }
}

__global__ static void k_bf16_to_f32(float *y /* (n) */, const __nv_bfloat16 *x /* (n) */, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}

__device__ static float d_f(float v)
{
    return v;
}
__device__ static float d_f(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

// sums[0] += sum (y - ref)^2, sums[1] += sum ref^2 (double); *nonfinite += count of non-finite y
template <typename T>
__global__ static void k_err(double *sums, unsigned long long *nonfinite, const T *y /* (n) */,
                             const float *ref /* (n) */, size_t n)
{
    double e = 0.0, s = 0.0;
    unsigned long long bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = d_f(y[i]);
        if (!isfinite(v)) {
            bad++;
            continue;
        }
        const double d = (double)v - (double)ref[i];
        e += d * d;
        s += (double)ref[i] * (double)ref[i];
    }
    for (int o = 16; o > 0; o >>= 1) {
        e += __shfl_down_sync(0xffffffffu, e, o);
        s += __shfl_down_sync(0xffffffffu, s, o);
        bad += __shfl_down_sync(0xffffffffu, bad, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&sums[0], e);
        atomicAdd(&sums[1], s);
        if (bad)
            atomicAdd(nonfinite, bad);
    }
}

// cnt[0] += elements whose bits differ; cnt[1] = min index of one
__global__ static void k_diff(unsigned long long *cnt, const float *a /* (n) */, const float *b /* (n) */, size_t n)
{
    unsigned long long c = 0, first = ~0ull;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (__float_as_uint(a[i]) != __float_as_uint(b[i])) {
            c++;
            if (i < first)
                first = i;
        }
    if (c) {
        atomicAdd(&cnt[0], c);
        atomicMin(&cnt[1], first);
    }
}

// ---- the benchmark's state ----

typedef struct s_pair {
    const char *name;  // "ash-fp8", "int4/int8"
    const char *rs_str, *ag_str;
    codec_spec_t rs, ag;
    cu_tp_t *tp;             // the two-shot group of this pair
    size_t k;                // chunk, this size
    size_t plen_rs, plen_ag; // payload bytes of one chunk, this size
    size_t wire;             // bytes one rank sends per all-reduce, this size
} s_pair_t;

typedef struct s_gpu {
    int dev;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    __nv_bfloat16 *xbf, *ybf; // (n) input, NCCL bf16 output
    float *xf, *yf;           // (n) fp32 input, NCCL fp32 output
    float *out, *cmp;         // (n) two-shot output, rank 0's copied here for the comparison
    double *d_sums;          // 2 doubles
    unsigned long long *d_cnt; // 2 counters
    float *ref;              // (n) rank 0 only
} s_gpu_t;

typedef struct s_bench {
    int N;
    size_t n; // this size
    uint64_t seed;
    uint64_t id; // the next all-reduce's id (cu_tp_allreduce): one per call
    s_gpu_t g[MAXG];
    cudaStream_t st[MAXG];
    cu_tp_t *plain; // codec none: NCCL's all-reduce
    char err[CODEC_ERRLEN];
} s_bench_t;

enum { V_NCCL_BF16, V_NCCL_FP32, V_TWOSHOT };
enum { M_CODEC = CU_TP_CODEC, M_COMM = CU_TP_COMM, M_ALL = CU_TP_ALL };

static void s_dev(const s_gpu_t *g)
{
    CU(cudaSetDevice(g->dev));
}

static void s_sync_all(s_bench_t *b)
{
    for (int r = 0; r < b->N; r++) {
        s_dev(&b->g[r]);
        CU(cudaStreamSynchronize(b->g[r].st));
    }
}

// a failed all-reduce call or codec status: stop with what and where
static void s_tp(int rc, const s_bench_t *b, const char *what, const char *variant)
{
    if (rc == 0)
        return;
    fprintf(stderr, "bench_tp_nccl: %s %s, n %zu: %s (%s), during: %s\n", variant, what, b->n, b->err,
            tah_strerror(rc), s_phase);
    exit(1);
}

// One all-reduce of every rank's input: NCCL's (bf16 xbf -> ybf, fp32 xf
// -> yf) or a pair's two-shot (xbf -> out, fp32). mask: codec work,
// communication or both (two-shot). check: read the codec status
// (synchronises; the check run only).
static void s_run(s_bench_t *b, int variant, const s_pair_t *p, int mask, int check)
{
    void *in[MAXG], *out[MAXG];
    int type = CU_TP_BF16, otype = CU_TP_BF16;
    cu_tp_t *tp = b->plain;
    for (int r = 0; r < b->N; r++) {
        s_gpu_t *g = &b->g[r];
        in[r] = variant == V_NCCL_FP32 ? (void *)g->xf : (void *)g->xbf;
        out[r] = variant == V_NCCL_BF16 ? (void *)g->ybf : variant == V_NCCL_FP32 ? (void *)g->yf : (void *)g->out;
    }
    if (variant == V_NCCL_FP32)
        type = otype = CU_TP_F32;
    if (variant == V_TWOSHOT) {
        otype = CU_TP_F32;
        tp = p->tp;
    }
    const char *name = variant == V_TWOSHOT ? p->name : variant == V_NCCL_FP32 ? "nccl-fp32" : "nccl-bf16";
    s_tp(cu_tp_allreduce(tp, in, type, out, otype, b->n, b->id++, b->st, mask, b->err, sizeof b->err), b, "all-reduce",
         name);
    if (check)
        s_tp(cu_tp_status(tp, b->st, b->err, sizeof b->err), b, "codec status", name);
}

typedef struct s_timing {
    double ms;      // device time per all-reduce (queued behind a spin), slowest rank
    double ms_e2e;  // GPUs idle at the start: includes host enqueue when that is slower
    double enq_ms;  // host enqueue time per all-reduce
} s_timing_t;

static void s_time(s_bench_t *b, int variant, const s_pair_t *p, int mask, int iters, s_timing_t *t)
{
    for (int w = 0; w < WARMUP; w++)
        s_run(b, variant, p, mask, 0);
    s_sync_all(b);
    double enq_total_ms = 0.0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            double us = 1.25 * enq_total_ms * 1e3 + 200.0;
            if (us > 2e6)
                us = 2e6;
            for (int r = 0; r < b->N; r++) {
                s_dev(&b->g[r]);
                if (cu_bench_spin(b->g[r].st, (unsigned int)us) != 0) {
                    fprintf(stderr, "bench_tp_nccl: spin kernel launch failed on rank %d (%s)\n", r, s_phase);
                    exit(1);
                }
            }
        }
        const double h0 = s_now();
        for (int r = 0; r < b->N; r++) {
            s_dev(&b->g[r]);
            CU(cudaEventRecord(b->g[r].e0, b->g[r].st));
        }
        for (int it = 0; it < iters; it++)
            s_run(b, variant, p, mask, 0);
        for (int r = 0; r < b->N; r++) {
            s_dev(&b->g[r]);
            CU(cudaEventRecord(b->g[r].e1, b->g[r].st));
        }
        const double h1 = s_now();
        s_sync_all(b);
        float worst = 0.0f;
        for (int r = 0; r < b->N; r++) {
            float ms = 0.0f;
            s_dev(&b->g[r]);
            CU(cudaEventElapsedTime(&ms, b->g[r].e0, b->g[r].e1));
            if (ms > worst)
                worst = ms;
        }
        if (pass == 0) {
            enq_total_ms = (h1 - h0) * 1e3;
            t->enq_ms = enq_total_ms / iters;
            t->ms_e2e = worst / iters;
        } else {
            t->ms = worst / iters;
        }
    }
    if (variant == V_TWOSHOT && (mask & M_CODEC)) // every codec call of the timed runs must have succeeded
        s_tp(cu_tp_status(p->tp, b->st, b->err, sizeof b->err), b, "codec status after the timed runs", p->name);
}

// ---- checks ----

// relative L2 error of rank r's y (n floats or bf16) against rank 0's ref; *nonfinite
static double s_rel_err(s_bench_t *b, const void *y, int is_bf16, unsigned long long *nonfinite)
{
    s_gpu_t *g = &b->g[0];
    s_dev(g);
    CU(cudaMemsetAsync(g->d_sums, 0, 2 * sizeof(double), g->st));
    CU(cudaMemsetAsync(g->d_cnt, 0, sizeof(unsigned long long), g->st));
    if (is_bf16)
        k_err<<<s_blocks(b->n), 256, 0, g->st>>>(g->d_sums, g->d_cnt, (const __nv_bfloat16 *)y, g->ref, b->n);
    else
        k_err<<<s_blocks(b->n), 256, 0, g->st>>>(g->d_sums, g->d_cnt, (const float *)y, g->ref, b->n);
    LAUNCHED();
    double sums[2];
    CU(cudaMemcpyAsync(sums, g->d_sums, sizeof sums, cudaMemcpyDeviceToHost, g->st));
    CU(cudaMemcpyAsync(nonfinite, g->d_cnt, sizeof *nonfinite, cudaMemcpyDeviceToHost, g->st));
    CU(cudaStreamSynchronize(g->st));
    return sums[1] > 0.0 ? sqrt(sums[0] / sums[1]) : sqrt(sums[0]);
}

// elements of rank r's out that differ bitwise from rank 0's (copied into r's cmp); *first, values
static unsigned long long s_diff_rank(s_bench_t *b, int r, unsigned long long *first, float *v0, float *vr)
{
    s_gpu_t *g = &b->g[r];
    s_dev(g);
    CU(cudaMemcpyPeerAsync(g->cmp, g->dev, b->g[0].out, b->g[0].dev, b->n * sizeof(float), g->st));
    unsigned long long init[2] = { 0ull, ~0ull }, cnt[2];
    CU(cudaMemcpyAsync(g->d_cnt, init, sizeof init, cudaMemcpyHostToDevice, g->st));
    k_diff<<<s_blocks(b->n), 256, 0, g->st>>>(g->d_cnt, g->out, g->cmp, b->n);
    LAUNCHED();
    CU(cudaMemcpyAsync(cnt, g->d_cnt, sizeof cnt, cudaMemcpyDeviceToHost, g->st));
    CU(cudaStreamSynchronize(g->st));
    *first = cnt[1];
    if (cnt[0]) {
        CU(cudaMemcpy(v0, g->cmp + cnt[1], sizeof *v0, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(vr, g->out + cnt[1], sizeof *vr, cudaMemcpyDeviceToHost));
    }
    return cnt[0];
}

// The CPU oracle: the same two-shot on the host with the CPU codecs
// (libtahcodec, which the GPU codecs match bit for bit: tests/test_cu_codec.c)
// on every rank's actual bf16 input, fp32 sums in rank order like
// k_sum_ranks, every frame encoded with the spec the group derives for
// all-reduce `id` (tp_chunk_spec). Returns the elements of rank 0's GPU
// output that differ from it bitwise (*first: the first one, with both
// values), or -1 if the host ran out of memory or a CPU codec call failed
// (message printed).
static long long s_cpu_oracle(s_bench_t *b, const s_pair_t *p, uint64_t id, unsigned long long *first, float *vcpu,
                              float *vgpu)
{
    const int N = b->N;
    const size_t n = b->n, k = p->k, npad = k * (size_t)N;
    const codec_shape_t sh = { 1, 1, (uint32_t)k };
    const int64_t f1 = codec_frame_size(&p->rs, sh), f2 = codec_frame_size(&p->ag, sh);
    const size_t fmax = (size_t)(f1 > f2 ? f1 : f2);
    long long mism = -1;
    uint16_t *hb = (uint16_t *)malloc(n * sizeof *hb);
    float *x = (float *)calloc((size_t)N * npad, sizeof *x); // (N, npad), zero padding
    float *tmp = (float *)malloc(k * sizeof *tmp), *acc = (float *)malloc(k * sizeof *acc);
    float *cpu = (float *)malloc(npad * sizeof *cpu), *gpu = (float *)malloc(n * sizeof *gpu);
    uint8_t *frame = (uint8_t *)malloc(fmax);
    if (!hb || !x || !tmp || !acc || !cpu || !gpu || !frame) {
        printf("  %s: CPU oracle: out of host memory\n", p->name);
        goto out;
    }
    for (int r = 0; r < N; r++) {
        s_dev(&b->g[r]);
        CU(cudaMemcpy(hb, b->g[r].xbf, n * sizeof *hb, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) {
            const uint32_t u = (uint32_t)hb[i] << 16; // bf16 -> fp32 is exact
            memcpy(&x[(size_t)r * npad + i], &u, sizeof u);
        }
    }
    s_dev(&b->g[0]);
    CU(cudaMemcpy(gpu, b->g[0].out, n * sizeof *gpu, cudaMemcpyDeviceToHost));
    for (int j = 0; j < N; j++) {
        codec_spec_t spec;
        for (int r = 0; r < N; r++) {
            tp_chunk_spec(&p->rs, id, 0, r, j, &spec);
            int rc = codec_encode(&spec, sh, x + (size_t)r * npad + (size_t)j * k, frame, fmax, NULL, b->err,
                                  sizeof b->err);
            if (rc == 0)
                rc = codec_decode(frame, (size_t)f1, tmp, k, NULL, b->err, sizeof b->err);
            if (rc != 0) {
                printf("  %s: CPU oracle: chunk %d of rank %d: %s\n", p->name, j, r, b->err);
                goto out;
            }
            for (size_t i = 0; i < k; i++)
                acc[i] = r ? acc[i] + tmp[i] : tmp[i];
        }
        tp_chunk_spec(&p->ag, id, 1, j, j, &spec);
        int rc = codec_encode(&spec, sh, acc, frame, fmax, NULL, b->err, sizeof b->err);
        if (rc == 0)
            rc = codec_decode(frame, (size_t)f2, cpu + (size_t)j * k, k, NULL, b->err, sizeof b->err);
        if (rc != 0) {
            printf("  %s: CPU oracle: all-gather chunk %d: %s\n", p->name, j, b->err);
            goto out;
        }
    }
    mism = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a, c;
        memcpy(&a, &cpu[i], sizeof a);
        memcpy(&c, &gpu[i], sizeof c);
        if (a != c && mism++ == 0) {
            *first = i;
            *vcpu = cpu[i];
            *vgpu = gpu[i];
        }
    }
out:
    free(hb);
    free(x);
    free(tmp);
    free(acc);
    free(cpu);
    free(gpu);
    free(frame);
    return mism;
}

// Error bounds of the two-shot variants (relative L2 against the fp32 sum).
// Expected, from this data through the CPU codecs (bit-exact with the GPU's)
// at N = 2, 4, 8: ash-fp8 3.69e-2, int4/int8 9.35e-2 (N hardly matters: the
// inputs are independent, so the errors grow like the sum's norm).
// ash-fp8: E4M3 keeps 3 mantissa bits, a rounding error up to 2^-4 (RMS
// ~2^-3/sqrt(12) ~ 0.036 relative, the Hadamard spreads each block into
// near-Gaussian codes) per compression; the two shots compound to ~0.04-0.05
// (docs/tp.md measured 3.7e-2 on the CPU, tp=2); the worst case of the
// analytic bound there is ~2^-4 (1 + sqrt(N) eps) + sqrt(N) 2^-4 ~ 0.15 at
// N=2, so 0.1 is 2x the expected error and catches a broken path.
// int4 (group 128, asymmetric): step = range/15, RMS error step/sqrt(12);
// a group of 128 of this bell-shaped data spans ~5-7 sigma: ~0.10-0.13
// relative per input; the independent errors of N inputs add like the sum
// itself, so ~0.1 relative after the reduce-scatter, plus ~0.007 from the
// int8 all-gather (255 levels); 0.2 is ~1.7x that.
static double s_bound(const s_pair_t *p)
{
    return p->rs.id == CODEC_ASH_FP8 ? 0.1 : 0.2;
}

// ---- command line ----

static void s_usage(FILE *f)
{
    fprintf(f, "usage: bench_tp_nccl [--gpus N] [--sizes 1,4,16,64,256] [--iters N] [--csv PATH]\n"
               "  --gpus N     GPUs to use, 2..%d (default: all visible, at most %d)\n"
               "  --sizes L    comma-separated MB of bf16 input per GPU, 1..4096 each (default 1,4,16,64,256)\n"
               "  --iters N    timed iterations per variant after %d warm-ups, 1..100000 (default 20)\n"
               "  --csv PATH   CSV output (default $OUT/bench_tp_nccl.csv, else ./bench_tp_nccl.csv)\n",
            MAXG, MAXG, WARMUP);
}

static int s_parse_int(const char *s, long lo, long hi, long *v)
{
    char *end = NULL;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi)
        return -1;
    *v = x;
    return 0;
}

static int s_parse_sizes(const char *s, long *sizes, int *nsizes)
{
    char buf[256];
    if (strlen(s) >= sizeof buf)
        return -1;
    strcpy(buf, s);
    int c = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (c == MAXSIZES || s_parse_int(tok, 1, 4096, &sizes[c]) != 0)
            return -1;
        c++;
    }
    if (c == 0)
        return -1;
    *nsizes = c;
    return 0;
}

// ---- results ----

typedef struct s_row {
    long mb;
    const char *variant;
    s_timing_t t;
    s_timing_t codec, comm; // two-shot only
    double wire;            // bytes sent per rank
    double rel;             // relative L2 error against the fp32 sum
    long long mism;         // elements differing from rank 0's (two-shot; -1: not checked)
    int ok;
} s_row_t;

// the pair's chunk, payloads and wire bytes for this size (cu_tp_layout)
static void s_pair_sizes(s_pair_t *p, size_t n)
{
    cu_tp_layout(p->tp, n, &p->k, &p->plen_rs, &p->plen_ag, &p->wire);
    if (!p->plen_rs || !p->plen_ag) {
        fprintf(stderr, "bench_tp_nccl: %s cannot encode a chunk of %zu floats\n", p->name, p->k);
        exit(1);
    }
}

// Stochastic rounding on the two-shot (fixpt:stochastic=1 in both shots):
// every all-reduce, rank and chunk draws fresh coins (tp_chunk_spec). Two
// all-reduces of the same input under two ids: each rank 0's output bitwise
// equal to the CPU codecs' two-shot under the same id, every rank the same
// bits, relative L2 error below 0.02 (8-bit groups of 128 of this data: a
// step of ~amax/127, a stochastic rounding error of at most step/2 RMS, ~5e-3
// relative per shot), and at least 5 % of the elements different between
// the two calls (one shared seed would give none different). Returns 0 or 1.
static int s_stoch_check(s_bench_t *b, s_pair_t *p)
{
    s_pair_sizes(p, b->n);
    const size_t n = b->n;
    float *y[2] = { (float *)malloc(n * sizeof(float)), (float *)malloc(n * sizeof(float)) };
    int ok = y[0] && y[1];
    if (!ok)
        printf("  FAIL %s: out of host memory\n", p->name);
    for (int call = 0; call < 2 && ok; call++) {
        const uint64_t id = b->id;
        s_run(b, V_TWOSHOT, p, M_ALL, 1);
        s_sync_all(b);
        unsigned long long nonfinite = 0, first = 0;
        const double rel = s_rel_err(b, b->g[0].out, 0, &nonfinite);
        float v0 = 0.0f, v1 = 0.0f;
        unsigned long long ranks = 0;
        for (int r = 1; r < b->N; r++)
            ranks += s_diff_rank(b, r, &first, &v0, &v1);
        const long long m = s_cpu_oracle(b, p, id, &first, &v0, &v1);
        s_dev(&b->g[0]);
        CU(cudaMemcpy(y[call], b->g[0].out, n * sizeof(float), cudaMemcpyDeviceToHost));
        printf("  %s, id %llu: relative L2 error %.3e, %llu non-finite, %llu elements differ between ranks, %lld from "
               "the CPU codecs' two-shot\n",
               p->name, (unsigned long long)id, rel, nonfinite, ranks, m);
        if (!(rel < 0.02) || nonfinite || ranks || m != 0) {
            printf("  FAIL %s: see the line above (bounds: error < 2e-2, every count 0)\n", p->name);
            ok = 0;
        }
    }
    if (ok) {
        size_t diff = 0;
        for (size_t i = 0; i < n; i++)
            diff += memcmp(&y[0][i], &y[1][i], sizeof(float)) != 0;
        printf("  %s: the two calls differ in %zu of %zu elements (%.1f %%; fresh coins: at least 5 %%)\n", p->name,
               diff, n, 100.0 * (double)diff / (double)n);
        if ((double)diff < 0.05 * (double)n) {
            printf("  FAIL %s: the all-reduces rounded alike: every call must draw its own coins\n", p->name);
            ok = 0;
        }
    }
    free(y[0]);
    free(y[1]);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    // NVLink multicast (NVLS) must stay off on these machines: before any NCCL call
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    signal(SIGALRM, s_on_alarm);
    setvbuf(stdout, NULL, _IOLBF, 0);

    long want_gpus = 0, iters = 20, sizes[MAXSIZES] = { 1, 4, 16, 64, 256 };
    int nsizes = 5;
    const char *csv = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--gpus") && has) {
            if (s_parse_int(argv[++i], 2, MAXG, &want_gpus) != 0) {
                fprintf(stderr, "bench_tp_nccl: --gpus %s: must be an integer 2..%d\n", argv[i], MAXG);
                s_usage(stderr);
                return 2;
            }
        } else if (!strcmp(a, "--sizes") && has) {
            if (s_parse_sizes(argv[++i], sizes, &nsizes) != 0) {
                fprintf(stderr, "bench_tp_nccl: --sizes %s: want up to %d comma-separated integers 1..4096 (MB)\n",
                        argv[i], MAXSIZES);
                s_usage(stderr);
                return 2;
            }
        } else if (!strcmp(a, "--iters") && has) {
            if (s_parse_int(argv[++i], 1, 100000, &iters) != 0) {
                fprintf(stderr, "bench_tp_nccl: --iters %s: must be an integer 1..100000\n", argv[i]);
                s_usage(stderr);
                return 2;
            }
        } else if (!strcmp(a, "--csv") && has) {
            csv = argv[++i];
        } else {
            fprintf(stderr, "bench_tp_nccl: unknown or incomplete option '%s'\n", a);
            s_usage(stderr);
            return 2;
        }
    }
    char csv_buf[4096];
    if (!csv) {
        const char *o = getenv("OUT");
        snprintf(csv_buf, sizeof csv_buf, "%s/bench_tp_nccl.csv", o && *o ? o : ".");
        csv = csv_buf;
    }

    // ---- devices ----
    s_set_phase("device discovery");
    int visible = 0;
    cudaError_t ce = cudaGetDeviceCount(&visible);
    if (ce != cudaSuccess)
        visible = 0;
    const int need = want_gpus ? (int)want_gpus : 2;
    if (visible < need) {
        fprintf(stderr, "bench_tp_nccl: %d CUDA device(s) visible%s%s, need %d; HINT: run on a machine with 2+ "
                        "GPUs (CUDA_VISIBLE_DEVICES?)\n",
                visible, ce != cudaSuccess ? ": " : "", ce != cudaSuccess ? cudaGetErrorString(ce) : "", need);
        return 77;
    }
    const int N = want_gpus ? (int)want_gpus : (visible < MAXG ? visible : MAXG);
    if (!want_gpus && visible > MAXG)
        printf("bench_tp_nccl: %d GPUs visible, using the first %d\n", visible, MAXG);

    static s_bench_t B;
    s_bench_t *b = &B;
    b->N = N;
    b->seed = 0x7a4c0ffee1234567ull;
    int ncclv = 0;
    NC(ncclGetVersion(&ncclv));
    printf("bench_tp_nccl: %d GPUs, NCCL %d (header %d), NCCL_NVLS_ENABLE=%s, iters %ld (+%d warm-up)\n", N, ncclv,
           NCCL_VERSION_CODE, getenv("NCCL_NVLS_ENABLE"), iters, WARMUP);
    int devs[MAXG];
    char devname[256] = "?";
    for (int r = 0; r < N; r++) {
        struct cudaDeviceProp prop;
        devs[r] = r;
        b->g[r].dev = r;
        CU(cudaGetDeviceProperties(&prop, r));
        if (r == 0)
            snprintf(devname, sizeof devname, "%s", prop.name);
        printf("  rank %d: device %d %s, %d SMs, %.1f GiB, PCI %04x:%02x:%02x, peer access:", r, r, prop.name,
               prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30), prop.pciDomainID, prop.pciBusID,
               prop.pciDeviceID);
        for (int j = 0; j < N; j++) {
            int can = 0;
            if (j != r)
                CU(cudaDeviceCanAccessPeer(&can, r, j));
            printf(" %s", j == r ? "-" : can ? "y" : "n");
        }
        printf("\n");
    }

    // ---- codec pairs ----
    s_pair_t pairs[2] = { { "ash-fp8", "ash-fp8", "ash-fp8", {}, {}, NULL, 0, 0, 0, 0 },
                          { "int4/int8", "int:bits=4", "int:bits=8", {}, {}, NULL, 0, 0, 0, 0 } };
    // checked, not timed: s_stoch_check
    s_pair_t sr = { "fixpt8-sr", "fixpt:bits=8,stochastic=1,seed=7", "fixpt:bits=8,stochastic=1,seed=7", {}, {},
                    NULL, 0, 0, 0, 0 };
    s_pair_t *all[3] = { &pairs[0], &pairs[1], &sr };
    for (int q = 0; q < 3; q++) {
        char err[CODEC_ERRLEN];
        if (codec_spec_parse(all[q]->rs_str, &all[q]->rs, err, sizeof err) != 0 ||
            codec_spec_parse(all[q]->ag_str, &all[q]->ag, err, sizeof err) != 0) {
            fprintf(stderr, "bench_tp_nccl: codec spec of %s: %s\n", all[q]->name, err);
            return 1;
        }
    }

    // ---- buffers, once, for the largest size ----
    long maxmb = 0;
    for (int s = 0; s < nsizes; s++)
        maxmb = sizes[s] > maxmb ? sizes[s] : maxmb;
    const size_t nmax = (size_t)maxmb << 19;
    printf("  bench buffers per GPU for %ld MB: %.2f GB (n %zu); each two-shot group adds ~3 fp32 copies\n", maxmb,
           (double)(nmax * (2 + 2 + 4 + 4 + 4 + 4 + 4)) / 1e9, nmax);
    s_set_phase("allocation");
    for (int r = 0; r < N; r++) {
        s_gpu_t *g = &b->g[r];
        s_dev(g);
        CU(cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking));
        b->st[r] = g->st;
        CU(cudaEventCreate(&g->e0));
        CU(cudaEventCreate(&g->e1));
        CU(cudaMalloc((void **)&g->xbf, nmax * 2));
        CU(cudaMalloc((void **)&g->ybf, nmax * 2));
        CU(cudaMalloc((void **)&g->xf, nmax * 4));
        CU(cudaMalloc((void **)&g->yf, nmax * 4));
        CU(cudaMalloc((void **)&g->out, nmax * 4));
        CU(cudaMalloc((void **)&g->cmp, nmax * 4));
        CU(cudaMalloc((void **)&g->d_sums, 2 * sizeof(double)));
        CU(cudaMalloc((void **)&g->d_cnt, 2 * sizeof(unsigned long long)));
        if (r == 0)
            CU(cudaMalloc((void **)&g->ref, nmax * 4));
        CU(cudaDeviceSynchronize());
    }

    s_set_phase("cu_tp_new (ncclCommInitAll)");
    {
        const codec_spec_t none = { };
        b->plain = cu_tp_new(N, devs, &none, &none, nmax, b->err, sizeof b->err);
        for (int q = 0; q < 3 && b->plain; q++)
            if (!(all[q]->tp = cu_tp_new(N, devs, &all[q]->rs, &all[q]->ag, nmax, b->err, sizeof b->err)))
                break;
        if (!b->plain || !pairs[0].tp || !pairs[1].tp || !sr.tp) {
            fprintf(stderr, "bench_tp_nccl: %s\n", b->err);
            return 1;
        }
    }
    printf("  NCCL communicators of %d ranks ready (NCCL all-reduce; ash-fp8, int4/int8 and fixpt8-sr two-shot "
           "groups)\n", N);

    static s_row_t rows[MAXSIZES * 4];
    int nrows = 0, status = 0, stoch_checked = 0;
    for (int s = 0; s < nsizes; s++) {
        const long mb = sizes[s];
        b->n = (size_t)mb << 19;
        for (int q = 0; q < 2; q++)
            s_pair_sizes(&pairs[q], b->n);
        printf("== %ld MB per GPU: %zu bf16 elements, chunk %zu (payload %zu B ash-fp8, %zu + %zu B int4/int8)\n",
               mb, b->n, pairs[0].k, pairs[0].plen_rs, pairs[1].plen_rs, pairs[1].plen_ag);

        // inputs and the reference
        s_set_phase("inputs and reference");
        for (int r = 0; r < N; r++) {
            s_gpu_t *g = &b->g[r];
            s_dev(g);
            k_gen<<<s_blocks(b->n), 256, 0, g->st>>>(g->xbf, b->n, b->seed, r);
            LAUNCHED();
            k_bf16_to_f32<<<s_blocks(b->n), 256, 0, g->st>>>(g->xf, g->xbf, b->n);
            LAUNCHED();
            if (r == 0) {
                k_ref<<<s_blocks(b->n), 256, 0, g->st>>>(g->ref, b->n, b->seed, N);
                LAUNCHED();
            }
        }
        s_sync_all(b);

        if (mb <= ORACLE_MB && !stoch_checked) { // the first size the CPU oracle covers
            stoch_checked = 1;
            s_set_phase("stochastic rounding check");
            status |= s_stoch_check(b, &sr);
        }
        const double S = (double)b->n * 2.0; // bf16 bytes per rank
        const double ring = 2.0 * (N - 1) / N;
        for (int v = 0; v < 4; v++) {
            s_row_t *row = &rows[nrows++];
            memset(row, 0, sizeof *row);
            row->mb = mb;
            row->mism = -1;
            row->ok = 1;
            const int variant = v < 2 ? v : V_TWOSHOT;
            const s_pair_t *p = v < 2 ? NULL : &pairs[v - 2];
            row->variant = v == 0 ? "nccl-bf16" : v == 1 ? "nccl-fp32" : p->name;
            static char phase[160]; // s_phase points here: outlives the loop
            snprintf(phase, sizeof phase, "%ld MB %s: check run", mb, row->variant);
            s_set_phase(phase);
            const uint64_t check_id = b->id;
            s_run(b, variant, p, M_ALL, 1);
            s_sync_all(b);
            unsigned long long nonfinite = 0;
            const void *y = v == 0 ? (const void *)b->g[0].ybf : v == 1 ? (const void *)b->g[0].yf : b->g[0].out;
            row->rel = s_rel_err(b, y, v == 0, &nonfinite);
            double bound = v == 0 ? INFINITY : v == 1 ? 1e-6 : s_bound(p);
            if (nonfinite || !(row->rel < bound)) {
                row->ok = 0;
                printf("  FAIL %s: relative L2 error %.3e (bound %.1e), %llu non-finite outputs on rank 0\n",
                       row->variant, row->rel, bound, nonfinite);
            }
            if (v >= 2) {
                row->mism = 0;
                for (int r = 1; r < N; r++) {
                    unsigned long long first = 0;
                    float v0 = 0.0f, vr = 0.0f;
                    const unsigned long long m = s_diff_rank(b, r, &first, &v0, &vr);
                    row->mism += (long long)m;
                    if (m) {
                        row->ok = 0;
                        printf("  FAIL %s: rank %d differs from rank 0 in %llu of %zu elements; first at %llu: "
                               "%.9g vs %.9g\n",
                               row->variant, r, m, b->n, first, (double)vr, (double)v0);
                    }
                }
                if (mb <= ORACLE_MB) {
                    snprintf(phase, sizeof phase, "%ld MB %s: CPU oracle", mb, row->variant);
                    s_set_phase(phase);
                    unsigned long long first = 0;
                    float vc = 0.0f, vg = 0.0f;
                    const long long m = s_cpu_oracle(b, p, check_id, &first, &vc, &vg);
                    if (m == 0) {
                        printf("  %s: rank 0 bitwise equal to the CPU codecs' two-shot (%zu elements)\n",
                               row->variant, b->n);
                    } else {
                        row->ok = 0;
                        if (m > 0)
                            printf("  FAIL %s: rank 0 differs from the CPU codecs' two-shot in %lld of %zu elements; "
                                   "first at %llu: GPU %.9g, CPU %.9g; HINT: run scripts/gpu-check (test_cu_codec)\n",
                                   row->variant, m, b->n, first, (double)vg, (double)vc);
                        else
                            printf("  FAIL %s: CPU oracle did not run\n", row->variant);
                    }
                }
                row->wire = (double)p->wire;
            } else {
                row->wire = ring * S * (v == 1 ? 2.0 : 1.0);
            }
            if (!row->ok)
                status = 1;

            snprintf(phase, sizeof phase, "%ld MB %s: timing", mb, row->variant);
            s_set_phase(phase);
            s_time(b, variant, p, M_ALL, (int)iters, &row->t);
            if (v >= 2) {
                snprintf(phase, sizeof phase, "%ld MB %s: timing codec kernels alone", mb, row->variant);
                s_set_phase(phase);
                s_time(b, variant, p, M_CODEC, (int)iters, &row->codec);
                snprintf(phase, sizeof phase, "%ld MB %s: timing communication alone", mb, row->variant);
                s_set_phase(phase);
                s_time(b, variant, p, M_COMM, (int)iters, &row->comm);
            }
            printf("  %-10s %8.4f ms device (%8.4f e2e, host enqueue %7.4f)", row->variant, row->t.ms,
                   row->t.ms_e2e, row->t.enq_ms);
            if (v >= 2)
                printf(" codec %8.4f comm %8.4f", row->codec.ms, row->comm.ms);
            printf("  rel err %.3e%s%s\n", row->rel, v >= 2 ? (row->mism == 0 ? ", ranks bitwise equal" : "") : "",
                   row->ok ? "" : "  <-- FAIL");
        }
    }
    s_set_phase("report");

    // ---- CSV ----
    FILE *f = fopen(csv, "w");
    if (!f) {
        fprintf(stderr, "bench_tp_nccl: cannot write %s: %s\n", csv, strerror(errno));
        status = 1;
    } else {
        fprintf(f, "kind,gpus,size_mb,variant,link_gbs,ms,ms_e2e,host_enqueue_ms,codec_ms,comm_ms,wire_bytes_per_rank,"
                   "algbw_gbs,rel_l2,rank_mismatches,ok\n");
        for (int i = 0; i < nrows; i++) {
            const s_row_t *w = &rows[i];
            const double S = (double)w->mb * 1048576.0;
            fprintf(f, "measured,%d,%ld,%s,,%.5f,%.5f,%.5f,%.5f,%.5f,%.0f,%.2f,%.4e,%lld,%d\n", N, w->mb, w->variant,
                    w->t.ms, w->t.ms_e2e, w->t.enq_ms, w->codec.ms, w->comm.ms, w->wire, S / (w->t.ms * 1e6),
                    w->rel, w->mism, w->ok);
        }
    }

    // ---- where does compression pay: a model from measured codec times ----
    const double ring = 2.0 * (N - 1) / N;
    double link = 0.0, link_cmp = 0.0;
    long link_mb = 0;
    for (int i = 0; i < nrows; i++) // NCCL bf16 bus bandwidth at the largest size
        if (!strcmp(rows[i].variant, "nccl-bf16") && rows[i].mb >= link_mb) {
            link_mb = rows[i].mb;
            link = ring * (double)rows[i].mb * 1048576.0 / (rows[i].t.ms * 1e6);
        }
    for (int i = 0; i < nrows; i++)
        if (!strcmp(rows[i].variant, "ash-fp8") && rows[i].mb == link_mb)
            link_cmp = rows[i].wire / (rows[i].comm.ms * 1e6);
    printf("\n== where does compression pay (a MODEL from measured codec times, not a measurement)\n");
    printf("link NCCL achieves: %.1f GB/s per direction per rank (bus bandwidth 2(N-1)/N*S/t of the bf16 all-reduce "
           "at %ld MB);\n  the ash-fp8 two-shot's payloads move at %.1f GB/s (wire bytes per rank / comm-alone time)\n",
           link, link_mb, link_cmp);
    printf("model: bf16 = 2(N-1)/N * S / link (ring, no codec); compressed = measured codec ms + wire bytes per rank "
           "/ link;\n  links slower than measured are emulated by this formula only (nothing is rate-limited); "
           "latency and overlap ignored\n");
    printf("%8s %10s %10s %22s %22s\n", "size MB", "link GB/s", "bf16 ms", "ash-fp8 ms (speedup)",
           "int4/int8 ms (speedup)");
    const double links[4] = { link, 64.0, 25.0, 10.0 };
    for (int i = 0; i + 3 < nrows; i += 4) {
        const s_row_t *w = &rows[i];
        const double S = (double)w->mb * 1048576.0;
        for (int l = 0; l < 4; l++) {
            const double L = links[l] * 1e9;
            if (!(L > 0.0))
                continue;
            const double tb = ring * S / L * 1e3;
            const double ta = rows[i + 2].codec.ms + rows[i + 2].wire / L * 1e3;
            const double ti = rows[i + 3].codec.ms + rows[i + 3].wire / L * 1e3;
            printf("%8ld %10.1f %10.4f %13.4f (%5.2fx) %13.4f (%5.2fx)%s\n", w->mb, links[l], tb, ta, tb / ta, ti,
                   tb / ti, l == 0 ? "  <- measured link" : "");
            if (!f)
                continue;
            const char *name[3] = { "nccl-bf16", rows[i + 2].variant, rows[i + 3].variant };
            const double tt[3] = { tb, ta, ti };
            const double codec[3] = { 0.0, rows[i + 2].codec.ms, rows[i + 3].codec.ms };
            const double wire[3] = { ring * S, rows[i + 2].wire, rows[i + 3].wire };
            for (int q = 0; q < 3; q++)
                fprintf(f, "model,%d,%ld,%s,%.1f,%.5f,,,%.5f,%.5f,%.0f,%.2f,,,\n", N, w->mb, name[q], links[l], tt[q],
                        codec[q], tt[q] - codec[q], wire[q], S / (tt[q] * 1e6));
        }
    }
    if (f && fclose(f) != 0) {
        fprintf(stderr, "bench_tp_nccl: writing %s: %s\n", csv, strerror(errno));
        status = 1;
    }

    // ---- the table, last ----
    printf("\nTP all-reduce over NCCL, %d x %s, device ms per all-reduce (mean of %ld, slowest rank); "
           "GB/s = bf16 bytes per rank / time;\n  wire = bytes each rank sends (NCCL: ring 2(N-1)/N*S; two-shot: "
           "codec payloads); two-shot: total (codec alone / comm alone)\n",
           N, devname, iters);
    printf("%7s | %-17s | %-17s | %-34s | %-34s | %s\n", "size MB", "NCCL bf16 ms GB/s", "NCCL fp32 ms GB/s",
           "ash-fp8 two-shot ms (codec/comm)", "int4/int8 two-shot ms (codec/comm)",
           "wire MB/rank bf16 fp32 ash int; rel err ash int");
    for (int i = 0; i + 3 < nrows; i += 4) {
        const s_row_t *w = rows + i;
        const double S = (double)w->mb * 1048576.0;
        char c[4][64];
        for (int v = 0; v < 4; v++) {
            if (v < 2)
                snprintf(c[v], sizeof c[v], "%7.4f %6.1f", w[v].t.ms, S / (w[v].t.ms * 1e6));
            else
                snprintf(c[v], sizeof c[v], "%7.4f (%6.4f/%6.4f) %6.1f", w[v].t.ms, w[v].codec.ms, w[v].comm.ms,
                         S / (w[v].t.ms * 1e6));
        }
        printf("%7ld | %-17s | %-17s | %-34s | %-34s | %.2f %.2f %.2f %.2f; %.1e %.1e%s\n", w->mb, c[0], c[1], c[2],
               c[3], w[0].wire / 1048576.0, w[1].wire / 1048576.0, w[2].wire / 1048576.0, w[3].wire / 1048576.0,
               w[2].rel, w[3].rel, (w[0].ok && w[1].ok && w[2].ok && w[3].ok) ? "" : "  <-- FAIL");
    }
    printf("bench_tp_nccl: %s (CSV: %s)\n", status ? "FAIL" : "PASS", csv);

    s_set_phase("teardown");
    for (int r = 0; r < N; r++) {
        s_dev(&b->g[r]);
        CU(cudaStreamSynchronize(b->g[r].st));
    }
    cu_tp_destroy(&b->plain);
    cu_tp_destroy(&pairs[0].tp);
    cu_tp_destroy(&pairs[1].tp);
    cu_tp_destroy(&sr.tp);
    for (int r = 0; r < N; r++) {
        s_gpu_t *g = &b->g[r];
        s_dev(g);
        cudaFree(g->xbf);
        cudaFree(g->ybf);
        cudaFree(g->xf);
        cudaFree(g->yf);
        cudaFree(g->out);
        cudaFree(g->cmp);
        cudaFree(g->d_sums);
        cudaFree(g->d_cnt);
        cudaFree(g->ref);
        cudaEventDestroy(g->e0);
        cudaEventDestroy(g->e1);
        cudaStreamDestroy(g->st);
    }
    alarm(0);
    return status;
}
