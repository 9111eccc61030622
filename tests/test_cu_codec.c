/* test_cu_codec.c — the GPU codec kernels (cuda/cu_codec.h) against the CPU
 * codecs (codecs/codec.h), label `gpu`. Plain C with a small local harness
 * (no cmocka: GPU machines may lack it); returns non-zero on any failure,
 * 77 (ctest: skipped) when no CUDA device is present.
 *
 * For every spec x shape x input (random activations, zeros, one spike,
 * huge and tiny magnitudes, subnormals, signed zeros, constants; C not a
 * multiple of the tile, partial blocks/groups, aligned and unaligned
 * device pointers):
 *   1. GPU encode (payload poisoned first) + codec_frame_seal must equal
 *      the CPU frame BYTE FOR BYTE, or fail with the same error code. The
 *      kernels repeat the CPU's float operations in the CPU's order (see
 *      cu_codec.h), so no tolerance is granted; on a mismatch the test
 *      prints where and, for tah, whether the per-sample high-tile count
 *      and the error against x still hold (the fallback properties the
 *      issue allows: count exact, error within 1.01x the CPU codec's).
 *   2. the CPU decodes the GPU frame;
 *   3. GPU decode of the CPU frame (output poisoned first) equals the CPU
 *      decode bit for bit.
 * The same with bf16 input (cu_codec_encode_x, CU_BF16) for every spec
 * and input kind: the inputs rounded to bf16 on the host, the GPU frame
 * from the bf16 tensor equal byte for byte to the CPU frame of the widened
 * floats.
 * Plus: the hardware E4M3 conversion against codecs/fp8.c on every float
 * bit pattern but NaN; status codes for non-finite input and corrupt
 * payloads. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "codec.h"
#include "cu_codec.h"
#include "fp8.h"   /* fp8_e4m3_from_f32_n: the CPU reference */
#include "half.h"  /* half_from_f32(_down, _up): the CPU reference */
#include "synth.h" /* codec_synth_activations, codec_synth_u64, codec_synth_normal */

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

#define CU(call)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                                  \
        }                                                                                             \
    } while (0)

static const char *const k_specs[] = {
    "fp32", "fp16", "bf16",
    "fixpt", "fixpt:bits=3,group=7", "fixpt:bits=12,stochastic=1,seed=5", "fixpt:bits=16,group=1000,scale=1",
    "fixpt:group=300,stochastic=1,seed=77", "fixpt:bits=2,group=1", "fixpt:stochastic=1,seed=3",
    "fixpt:bits=6,group=40",
    "int", "int:symmetric=1", "int:bits=3,group=10,symmetric=1", "int:bits=8,group=512", "int:bits=5,group=33",
    "int:bits=2,group=1", "int:bits=6,group=256,symmetric=1",
    "ash-fp8", "ash-fp8:block=16", "ash-fp8:block=64,tau=2.5", "ash-fp8:block=1024", "ash-fp8:block=16384,tau=3",
    "tah", "tah:tile=8,alloc_tile=16,hi_frac=0.5", "tah:tile=32,alloc_tile=128,bits_hi=8,bits_lo=2,hi_frac=0.3",
    "tah:tile=256,alloc_tile=512,tau=0", "tah:tile=16,alloc_tile=16,hi_frac=0", "tah:hi_frac=1,tau=1.5",
    "tah:tile=128,alloc_tile=384,bits_hi=5,bits_lo=5", "tah:bits_hi=6,bits_lo=2,hi_frac=0.6",
    "tah:window=0", "tah:window=0,tile=8,alloc_tile=16,hi_frac=0.5", "tah:window=0,hi_frac=1,tau=1.5",
    "tah:window=0,tile=128,alloc_tile=384,bits_hi=5,bits_lo=5", "tah:window=0,bits_hi=6,bits_lo=2,hi_frac=0.6",
    "tah:window=5,tile=16,alloc_tile=32,hi_frac=0.35", "tah:window=1024,hi_frac=0.7",
};
#define N_SPECS (sizeof k_specs / sizeof k_specs[0])

static const codec_shape_t k_shapes[] = {
    { 2, 3, 72 }, { 3, 7, 130 }, { 1, 1, 1 }, { 2, 4, 1000 }, { 1, 2, 5000 }, { 4, 33, 1600 },
};
#define N_SHAPES (sizeof k_shapes / sizeof k_shapes[0])

enum { IN_SYNTH, IN_ZEROS, IN_SPIKE, IN_HUGE, IN_TINY, IN_SUBNORMAL, IN_SIGNED_ZEROS, IN_CONST, IN_SCALES, IN_BIGSPIKE,
       IN_BLOCKS, IN_MIXED, IN_NORMAL, IN_EDGE, N_INPUTS };
static const char *const k_input_names[] = { "synth", "zeros", "spike", "huge", "tiny", "subnormal", "signed-zeros",
                                             "const", "scales", "big-spike", "blocks", "mixed", "normal", "step-edge" };

/* fixpt.c's stochastic rounding (its header): the key of a seed, lowbias32 */
static uint64_t s_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint32_t s_fixpt_key(uint64_t seed) { return (uint32_t)(s_mix64(s_mix64(seed) + 0x9e3779b97f4a7c15ull) >> 32); }
static uint32_t s_lowbias32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

static void s_fill(float *x, codec_shape_t shape, int kind, uint64_t seed)
{
    const uint64_t n = (uint64_t)shape.b * shape.s * shape.c;
    switch (kind) {
    case IN_SYNTH:
        codec_synth_activations(x, shape, seed);
        for (uint64_t i = 0; i < n; i++)
            x[i] *= 0.01f; /* fixpt's default scale keeps its fp16 steps in range */
        break;
    case IN_ZEROS:
        memset(x, 0, n * sizeof *x);
        break;
    case IN_SPIKE:
        memset(x, 0, n * sizeof *x);
        x[codec_synth_u64(seed, 0) % n] = 3.5f;
        break;
    case IN_HUGE:
        for (uint64_t i = 0; i < n; i++)
            x[i] = (float)(1e30 * codec_synth_normal(seed, i));
        break;
    case IN_TINY:
        for (uint64_t i = 0; i < n; i++)
            x[i] = (float)(1e-30 * codec_synth_normal(seed, i));
        break;
    case IN_SUBNORMAL:
        for (uint64_t i = 0; i < n; i++)
            x[i] = (float)(1e-41 * codec_synth_normal(seed, i));
        break;
    case IN_SIGNED_ZEROS: /* non-negative values with zeros of both signs: which zero is a minimum */
        for (uint64_t i = 0; i < n; i++) {
            uint64_t r = codec_synth_u64(seed, i) % 4;
            x[i] = r == 0 ? 0.0f : (r == 1 ? -0.0f : (float)(0.01 * fabs(codec_synth_normal(seed + 1, i))));
        }
        break;
    case IN_CONST:
        for (uint64_t i = 0; i < n; i++)
            x[i] = -0.125f;
        break;
    case IN_SCALES: /* each run of 128 at its own scale 10^0 .. 10^-11: groups far below their
                       int exponent block's absmax (fp16-subnormal metadata) */
        for (uint64_t i = 0; i < n; i++)
            x[i] = (float)(pow(10.0, -(double)((i / 128 + seed) % 12)) * codec_synth_normal(seed, i));
        break;
    case IN_BIGSPIKE: /* ordinary values and one 1e30 (tah: one exponent group's; int: one block's) */
        for (uint64_t i = 0; i < n; i++)
            x[i] = (float)(0.02 * codec_synth_normal(seed, i));
        x[codec_synth_u64(seed, 0) % n] = 1e30f;
        break;
    case IN_BLOCKS: /* each run of 4096 at its own scale 10^0 .. 10^-36: int exponent blocks
                       (64 groups) far apart, each quantised at its own exponent */
        for (uint64_t i = 0; i < n; i++)
            x[i] = (float)(pow(10.0, -3.0 * (double)((i / 4096 + seed) % 13)) * codec_synth_normal(seed, i));
        break;
    case IN_MIXED: /* every element at its own scale 10^0 .. 10^-44 (some subnormal), and one
                      1e30: tiles whose small elements leave the normal floats at their group's
                      exponent but not at their own (tah's k_tah_spec quantises at the tile's) */
        for (uint64_t i = 0; i < n; i++)
            x[i] = (float)(pow(10.0, -(double)(codec_synth_u64(seed + 2, i) % 45)) * codec_synth_normal(seed, i));
        x[codec_synth_u64(seed, 1) % n] = 1e30f;
        break;
    case IN_EDGE: { /* fixpt:stochastic=1,seed=3 (scale 1024): every run of 128 has max |x| = 127 d
                       2^-10 with d = 1070 2^-10 2^-j an fp16 value, so the step is d exactly and
                       t = max |y| fl(1/d) rounds to 127 + 2^-17, where fixpt.c clamps t to 127.
                       +-max sits where the clamp decides the code: +max where the coin u < 2^-17
                       (unclamped: code 255), -max where u >= 1 - 2^-17 (unclamped: floor -128,
                       no round-up: code -1); u is fixpt.c's for seed 3. The rest below max. */
        const uint32_t k = s_fixpt_key(3);
        for (uint64_t i = 0; i < n; i++) {
            const double edge = 127.0 * 1070.0 / 1048576.0 * pow(2.0, -(double)((i / 128 + seed) % 5));
            const uint32_t U = s_lowbias32((uint32_t)i ^ k) >> 9;
            x[i] = i % 128 == 0 || U < 64u ? (float)edge
                   : U >= (1u << 23) - 64u ? (float)-edge
                                           : (float)(edge * (2.0 * (double)(codec_synth_u64(seed, i) >> 11) * 0x1p-53 - 1.0) * 0.999);
        }
        break;
    }
    default:
        for (uint64_t i = 0; i < n; i++)
            x[i] = (float)(0.02 * codec_synth_normal(seed, i));
        break;
    }
}

typedef struct s_dev {
    float *x, *out;
    uint8_t *payload;
    void *scratch;
    size_t cap_x, cap_payload, cap_scratch;
} s_dev_t;

static void s_reserve(s_dev_t *d, size_t nx, size_t npayload, size_t nscratch)
{
    /* +64: room for the deliberately unaligned runs */
    if (nx + 64 > d->cap_x) {
        cudaFree(d->x);
        cudaFree(d->out);
        d->cap_x = nx + 64;
        CU(cudaMalloc((void **)&d->x, d->cap_x * sizeof(float)));
        CU(cudaMalloc((void **)&d->out, d->cap_x * sizeof(float)));
    }
    if (npayload + 64 > d->cap_payload) {
        cudaFree(d->payload);
        d->cap_payload = npayload + 64;
        CU(cudaMalloc((void **)&d->payload, d->cap_payload));
    }
    if (nscratch > d->cap_scratch) {
        cudaFree(d->scratch);
        d->cap_scratch = nscratch;
        CU(cudaMalloc(&d->scratch, d->cap_scratch));
    }
}

/* tah: the index entries of a frame (all samples) */
static size_t s_tah_ix_entries(const codec_spec_t *spec, codec_shape_t shape)
{
    const uint64_t Q = (shape.c + spec->p.tah.tile - 1) / spec->p.tah.tile;
    return (size_t)shape.b * (size_t)((shape.s * Q + 127) / 128);
}

/* tah: the payload offset of the flags (past the two reserved words, the index and the
   exponent bytes with their padding) */
static size_t s_tah_flags_off(const codec_spec_t *spec, codec_shape_t shape)
{
    const uint64_t Q = (shape.c + spec->p.tah.tile - 1) / spec->p.tah.tile;
    const uint64_t k = spec->p.tah.alloc_tile / spec->p.tah.tile, nA = (Q + k - 1) / k;
    const uint64_t n_eg = (shape.s * nA + 31) / 32;
    return 8 + 4 * s_tah_ix_entries(spec, shape) + (size_t)((shape.b * n_eg + 7) & ~7ull);
}

/* tah: high allocation tiles of sample b, read from a frame's flags */
static uint64_t s_tah_hi_count(const uint8_t *frame, const codec_spec_t *spec, codec_shape_t shape, uint32_t b)
{
    const uint32_t G = spec->p.tah.tile, k = spec->p.tah.alloc_tile / G;
    uint32_t lg = 0;
    while ((1u << lg) < G)
        lg++;
    const uint32_t Q = (shape.c + G - 1) / G, fbits = 2 + lg;
    const uint8_t *flags = frame + CODEC_HEADER_SIZE + s_tah_flags_off(spec, shape);
    uint64_t cnt = 0;
    for (uint64_t s = 0; s < shape.s; s++)
        for (uint32_t q = 0; q < Q; q += k) {
            uint64_t bit = (((uint64_t)b * shape.s + s) * Q + q) * fbits;
            cnt += (flags[bit / 8] >> (bit % 8)) & 1u;
        }
    return cnt;
}

static double s_err2(const float *a, const float *x, uint64_t n)
{
    double e = 0;
    for (uint64_t i = 0; i < n; i++)
        e += ((double)a[i] - x[i]) * ((double)a[i] - x[i]);
    return sqrt(e);
}

/* x rounded to bf16 (nearest even; Inf stays Inf, NaN stays a NaN): its bits in xb, the
 * widened value back in x */
static void s_round_bf16(float *x, uint16_t *xb, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        if ((u & 0x7f800000u) == 0x7f800000u)
            xb[i] = (uint16_t)((u >> 16) | ((u & 0x7fffffu) ? 0x40u : 0u));
        else
            xb[i] = bf16_from_f32(x[i]);
        x[i] = bf16_to_f32(xb[i]);
    }
}

/* One spec x shape x input, input type xt. Offsets shift the device pointers (0: aligned;
 * xoff counts elements of xt). */
static void s_case_x(s_dev_t *d, const char *spec_str, codec_shape_t shape, int kind, uint64_t seed, size_t xoff,
                     size_t poff, cu_dtype_t xt)
{
    char err[CODEC_ERRLEN], gerr[CODEC_ERRLEN];
    codec_spec_t spec;
    if (codec_spec_parse(spec_str, &spec, err, sizeof err) != 0) {
        CHECK(0, "spec %s: %s", spec_str, err);
        return;
    }
    const uint64_t n = (uint64_t)shape.b * shape.s * shape.c;
    const int64_t fsize = codec_frame_size(&spec, shape);
    const size_t plen = (size_t)fsize - CODEC_HEADER_SIZE;
    const size_t scratch = cu_codec_scratch_bytes_x(&spec, shape, xt);
    CHECK(scratch > 0, "scratch bytes for %s", spec_str);
    s_reserve(d, n, plen, scratch);
    float *x = malloc(n * sizeof *x), *y_cpu = malloc(n * sizeof *y_cpu), *y = malloc(n * sizeof *y);
    uint8_t *f_cpu = malloc((size_t)fsize), *f_gpu = malloc((size_t)fsize);
    uint16_t *xb = malloc(n * sizeof *xb);
    if (!x || !y_cpu || !y || !f_cpu || !f_gpu || !xb) {
        fprintf(stderr, "FATAL: out of host memory\n");
        exit(2);
    }
    s_fill(x, shape, kind, seed);
    if (xt == CU_BF16)
        s_round_bf16(x, xb, n);
    char what[256];
    snprintf(what, sizeof what, "%s (%u,%u,%u) %s seed %llu off %zu/%zu%s", spec_str, shape.b, shape.s, shape.c,
             k_input_names[kind], (unsigned long long)seed, xoff, poff, xt == CU_BF16 ? " bf16 input" : "");

    int rc_cpu = codec_encode(&spec, shape, x, f_cpu, (size_t)fsize, NULL, err, sizeof err);
    float *dx = d->x + xoff;
    uint8_t *dp = d->payload + poff;
    float *dout = d->out + xoff;
    const void *dxin = dx;
    if (xt == CU_BF16) {
        uint16_t *dxb = (uint16_t *)d->x + xoff;
        CU(cudaMemcpy(dxb, xb, n * sizeof *xb, cudaMemcpyHostToDevice));
        dxin = dxb;
    } else {
        CU(cudaMemcpy(dx, x, n * sizeof *x, cudaMemcpyHostToDevice));
    }
    CU(cudaMemset(dp, 0xcd, plen)); /* poison: every byte must be written */
    int rc_gpu = cu_codec_encode_x(&spec, shape, xt, dxin, dp, d->scratch, 0, gerr, sizeof gerr);
    if (rc_gpu == 0)
        rc_gpu = cu_codec_status(d->scratch, 0, gerr, sizeof gerr);
    CHECK(rc_gpu == rc_cpu, "%s: GPU encode %d (%s), CPU encode %d (%s)", what, rc_gpu, rc_gpu ? gerr : "ok",
          rc_cpu, rc_cpu ? err : "ok");
    if (rc_cpu != 0 || rc_gpu != 0)
        goto out;

    CU(cudaMemcpy(f_gpu + CODEC_HEADER_SIZE, dp, plen, cudaMemcpyDeviceToHost));
    CHECK(codec_frame_seal(&spec, shape, f_gpu, (size_t)fsize, err, sizeof err) == 0, "%s: seal: %s", what, err);
    size_t ndiff = 0, first = 0;
    for (size_t i = 0; i < (size_t)fsize; i++)
        if (f_gpu[i] != f_cpu[i] && ndiff++ == 0)
            first = i;
    CHECK(ndiff == 0, "%s: GPU frame differs from the CPU frame in %zu of %lld bytes, first at %zu (cpu %02x gpu %02x)",
          what, ndiff, (long long)fsize, first, f_cpu[first], f_gpu[first]);

    /* CPU decodes both frames */
    int rc = codec_decode(f_cpu, (size_t)fsize, y_cpu, n, NULL, err, sizeof err);
    CHECK(rc == 0, "%s: CPU decode of CPU frame: %s", what, err);
    rc = codec_decode(f_gpu, (size_t)fsize, y, n, NULL, err, sizeof err);
    CHECK(rc == 0, "%s: CPU decode of GPU frame: %s", what, err);
    if (ndiff != 0 && spec.id == CODEC_TAH && rc == 0) { /* what still holds when the bytes do not */
        double n_alloc = (double)shape.s * (double)((((shape.c + spec.p.tah.tile - 1) / spec.p.tah.tile) +
                                                     spec.p.tah.alloc_tile / spec.p.tah.tile - 1) /
                                                    (spec.p.tah.alloc_tile / spec.p.tah.tile));
        uint64_t want = (uint64_t)floor((double)spec.p.tah.hi_frac * n_alloc + 0.5);
        for (uint32_t b = 0; b < shape.b; b++)
            CHECK(s_tah_hi_count(f_gpu, &spec, shape, b) == want, "%s: sample %u high tiles", what, b);
        double eg = s_err2(y, x, n), ec = s_err2(y_cpu, x, n);
        CHECK(eg <= 1.01 * ec + 1e-30, "%s: GPU frame error %g, CPU frame error %g", what, eg, ec);
    }

    /* GPU decodes the CPU frame */
    CU(cudaMemcpy(dp, f_cpu + CODEC_HEADER_SIZE, plen, cudaMemcpyHostToDevice));
    CU(cudaMemset(dout, 0xff, n * sizeof *dout)); /* poison: NaN */
    rc = cu_codec_decode(&spec, shape, dp, dout, d->scratch, 0, gerr, sizeof gerr);
    if (rc == 0)
        rc = cu_codec_status(d->scratch, 0, gerr, sizeof gerr);
    CHECK(rc == 0, "%s: GPU decode of CPU frame: %d %s", what, rc, gerr);
    if (rc == 0) {
        CU(cudaMemcpy(y, dout, n * sizeof *y, cudaMemcpyDeviceToHost));
        uint64_t nd = 0, fi = 0;
        for (uint64_t i = 0; i < n; i++)
            if (memcmp(&y[i], &y_cpu[i], sizeof(float)) != 0 && nd++ == 0)
                fi = i;
        CHECK(nd == 0, "%s: GPU decode differs from CPU decode in %llu of %llu floats, first [%llu] cpu %.9g gpu %.9g",
              what, (unsigned long long)nd, (unsigned long long)n, (unsigned long long)fi, (double)y_cpu[fi],
              (double)y[fi]);
    }
out:
    free(x);
    free(xb);
    free(y_cpu);
    free(y);
    free(f_cpu);
    free(f_gpu);
}

static void s_case(s_dev_t *d, const char *spec_str, codec_shape_t shape, int kind, uint64_t seed, size_t xoff,
                   size_t poff)
{
    s_case_x(d, spec_str, shape, kind, seed, xoff, poff, CU_F32);
}

/* Hardware E4M3 (cvt.rn.satfinite) against codecs/fp8.c on every float but NaN. */
/* h[i] = the float of bit pattern base + i, NaNs as 0 (no codec's input: ash-fp8 and the
 * fp16 fields see a NaN only from non-finite input, whose payload is unspecified) */
static void s_floats_from(float *h, uint64_t base, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)(base + i);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            u = 0;
        memcpy(&h[i], &u, sizeof u);
    }
}

static void s_test_e4m3_exhaustive(s_dev_t *d)
{
    const size_t chunk = (size_t)1 << 24;
    float *h = malloc(chunk * sizeof *h);
    uint8_t *q_cpu = malloc(chunk), *q_gpu = malloc(chunk);
    uint8_t *dq = NULL;
    CU(cudaMalloc((void **)&dq, chunk));
    s_reserve(d, chunk, 0, 0);
    uint64_t mismatches = 0;
    for (uint64_t base = 0; base < ((uint64_t)1 << 32); base += chunk) {
        s_floats_from(h, base, chunk);
        CU(cudaMemcpy(d->x, h, chunk * sizeof *h, cudaMemcpyHostToDevice));
        CHECK(cu_fp8_e4m3_from_f32_n(d->x, dq, chunk, 0) == 0, "e4m3 launch");
        CU(cudaMemcpy(q_gpu, dq, chunk, cudaMemcpyDeviceToHost));
        fp8_e4m3_from_f32_n(q_cpu, h, chunk);
        for (size_t i = 0; i < chunk; i++)
            if (q_cpu[i] != q_gpu[i]) {
                if (mismatches < 5)
                    fprintf(stderr, "e4m3: %a (0x%08x): cpu 0x%02x gpu 0x%02x\n", (double)h[i],
                            (unsigned)(base + i), q_cpu[i], q_gpu[i]);
                mismatches++;
            }
    }
    CHECK(mismatches == 0, "hardware E4M3 differs from codecs/fp8.c on %llu floats", (unsigned long long)mismatches);
    cudaFree(dq);
    free(h);
    free(q_cpu);
    free(q_gpu);
}

/* The kernels' fp16 roundings (to nearest even, down, up: the hardware's) against
 * codecs/half.c on every float but NaN; the CPU side in S_HALF_THREADS threads. */
#define S_HALF_THREADS 16

typedef struct s_half_job {
    const float *h;
    const uint16_t *q[3]; /* GPU results: down, nearest, up */
    size_t i0, i1;
    uint64_t mism[3];
    size_t first[3]; /* index of the first mismatch per direction */
} s_half_job_t;

static void *s_half_cmp(void *arg)
{
    s_half_job_t *j = arg;
    for (size_t i = j->i0; i < j->i1; i++) {
        const uint16_t c[3] = { half_from_f32_down(j->h[i]), half_from_f32(j->h[i]), half_from_f32_up(j->h[i]) };
        for (int k = 0; k < 3; k++)
            if (c[k] != j->q[k][i] && j->mism[k]++ == 0)
                j->first[k] = i;
    }
    return NULL;
}

static void s_test_half_exhaustive(s_dev_t *d)
{
    const size_t chunk = (size_t)1 << 24;
    float *h = malloc(chunk * sizeof *h);
    uint16_t *q = malloc(3 * chunk * sizeof *q);
    uint16_t *dq = NULL;
    CU(cudaMalloc((void **)&dq, 3 * chunk * sizeof *dq));
    s_reserve(d, chunk, 0, 0);
    uint64_t mismatches[3] = { 0, 0, 0 };
    for (uint64_t base = 0; base < ((uint64_t)1 << 32); base += chunk) {
        s_floats_from(h, base, chunk);
        CU(cudaMemcpy(d->x, h, chunk * sizeof *h, cudaMemcpyHostToDevice));
        for (int k = 0; k < 3; k++)
            CHECK(cu_half_from_f32_n(d->x, dq + (size_t)k * chunk, chunk, k - 1, 0) == 0, "half launch");
        CU(cudaMemcpy(q, dq, 3 * chunk * sizeof *dq, cudaMemcpyDeviceToHost));
        s_half_job_t jobs[S_HALF_THREADS];
        pthread_t th[S_HALF_THREADS];
        int started[S_HALF_THREADS];
        for (int t = 0; t < S_HALF_THREADS; t++) {
            jobs[t] = (s_half_job_t){ .h = h, .q = { q, q + chunk, q + 2 * chunk }, .i0 = chunk * t / S_HALF_THREADS,
                                      .i1 = chunk * (t + 1) / S_HALF_THREADS };
            started[t] = pthread_create(&th[t], NULL, s_half_cmp, &jobs[t]) == 0;
            if (!started[t])
                s_half_cmp(&jobs[t]); /* no thread: in this one */
        }
        for (int t = 0; t < S_HALF_THREADS; t++) {
            if (started[t])
                pthread_join(th[t], NULL);
            for (int k = 0; k < 3; k++) {
                if (jobs[t].mism[k] && mismatches[k] < 5) {
                    const size_t i = jobs[t].first[k];
                    fprintf(stderr, "half dir %d: %a (0x%08x): cpu differs from gpu 0x%04x\n", k - 1, (double)h[i],
                            (unsigned)(base + i), q[(size_t)k * chunk + i]);
                }
                mismatches[k] += jobs[t].mism[k];
            }
        }
    }
    for (int k = 0; k < 3; k++)
        CHECK(mismatches[k] == 0, "fp16 rounding %d differs from codecs/half.c on %llu floats", k - 1,
              (unsigned long long)mismatches[k]);
    cudaFree(dq);
    free(h);
    free(q);
}

/* A TAH frame of `spec` on `shape` (synthetic activations, seed) with index entries ents[0..n)
 * (all of them when ents is NULL) made wrong one at a time: the CPU and the GPU decoder must
 * both reject each. */
static void s_tah_index_entries(s_dev_t *d, const char *specstr, codec_shape_t shape, uint64_t seed,
                                const size_t *ents, size_t n)
{
    char err[256];
    const uint64_t in = (uint64_t)shape.b * shape.s * shape.c;
    float *ix = malloc(in * sizeof *ix), *iy = malloc(in * sizeof *iy);
    codec_synth_activations(ix, shape, seed);
    codec_spec_t spec;
    codec_spec_parse(specstr, &spec, err, sizeof err);
    int64_t fsize = codec_frame_size(&spec, shape);
    uint8_t *f = malloc((size_t)fsize);
    codec_encode(&spec, shape, ix, f, (size_t)fsize, NULL, err, sizeof err);
    const size_t nent = s_tah_ix_entries(&spec, shape);
    s_reserve(d, in, (size_t)fsize, cu_codec_scratch_bytes(&spec, shape));
    for (size_t k = 0; k < (ents ? n : nent); k++) {
        const size_t e = ents ? ents[k] : k;
        CHECK(e < nent, "%s: index entry %zu of %zu", specstr, e, nent);
        if (e >= nent)
            continue;
        uint8_t *w = f + CODEC_HEADER_SIZE + 8 + 4 * e;
        w[0] ^= 1u;
        codec_frame_seal(&spec, shape, f, (size_t)fsize, err, sizeof err);
        int rc_cpu = codec_decode(f, (size_t)fsize, iy, in, NULL, err, sizeof err);
        CU(cudaMemcpy(d->payload, f + CODEC_HEADER_SIZE, (size_t)fsize - CODEC_HEADER_SIZE, cudaMemcpyHostToDevice));
        int rc = cu_codec_decode(&spec, shape, d->payload, d->out, d->scratch, 0, err, sizeof err);
        if (rc == 0)
            rc = cu_codec_status(d->scratch, 0, err, sizeof err);
        CHECK(rc_cpu == TAH_ECORRUPT && rc == TAH_ECORRUPT, "%s (%llu,%llu,%llu): index entry %zu of %zu off: CPU %d, "
              "GPU %d", specstr, (unsigned long long)shape.b, (unsigned long long)shape.s,
              (unsigned long long)shape.c, e, nent, rc_cpu, rc);
        w[0] ^= 1u;
    }
    free(f);
    free(ix);
    free(iy);
}

/* Status codes: non-finite input, corrupt payloads. */
static void s_test_status(s_dev_t *d)
{
    char err[CODEC_ERRLEN];
    const codec_shape_t shape = { 2, 4, 256 };
    const uint64_t n = 2 * 4 * 256;
    float *x = malloc(n * sizeof *x);
    codec_synth_activations(x, shape, 5);
    for (uint64_t i = 0; i < n; i++)
        x[i] *= 0.01f;
    for (size_t k = 0; k < N_SPECS; k++) {
        codec_spec_t spec;
        codec_spec_parse(k_specs[k], &spec, err, sizeof err);
        s_reserve(d, n, (size_t)codec_frame_size(&spec, shape), cu_codec_scratch_bytes(&spec, shape));
        float saved = x[777];
        x[777] = NAN;
        CU(cudaMemcpy(d->x, x, n * sizeof *x, cudaMemcpyHostToDevice));
        int rc = cu_codec_encode(&spec, shape, d->x, d->payload, d->scratch, 0, err, sizeof err);
        if (rc == 0)
            rc = cu_codec_status(d->scratch, 0, err, sizeof err);
        CHECK(rc == TAH_ENONFINITE, "%s: NaN input gives %d, want TAH_ENONFINITE", k_specs[k], rc);
        x[777] = saved;
    }
    /* The status word is tagged per call, not zeroed by a memset: garbage in
     * the scratch head and an earlier call's unread error must not show in a
     * later clean call's status; an error after a clean call must. */
    {
        static const char *const tagged[] = { "fp16", "fixpt", "int", "ash-fp8", "tah" };
        float *xn = malloc(n * sizeof *xn);
        memcpy(xn, x, n * sizeof *xn);
        xn[123] = NAN;
        for (size_t k = 0; k < sizeof tagged / sizeof tagged[0]; k++) {
            codec_spec_t spec;
            codec_spec_parse(tagged[k], &spec, err, sizeof err);
            s_reserve(d, n, (size_t)codec_frame_size(&spec, shape), cu_codec_scratch_bytes(&spec, shape));
            CU(cudaMemset(d->scratch, 0xff, 256)); /* garbage head: status, tag, absmax */
            CU(cudaMemcpy(d->x, x, n * sizeof *x, cudaMemcpyHostToDevice));
            int rc = cu_codec_encode(&spec, shape, d->x, d->payload, d->scratch, 0, err, sizeof err);
            if (rc == 0)
                rc = cu_codec_status(d->scratch, 0, err, sizeof err);
            CHECK(rc == 0, "%s: clean input after a garbage head gives %d (%s)", tagged[k], rc, err);
            CU(cudaMemcpy(d->x, xn, n * sizeof *x, cudaMemcpyHostToDevice));
            rc = cu_codec_encode(&spec, shape, d->x, d->payload, d->scratch, 0, err, sizeof err);
            CHECK(rc == 0, "%s: NaN encode call: %d", tagged[k], rc);
            CU(cudaMemcpy(d->x, x, n * sizeof *x, cudaMemcpyHostToDevice));
            rc = cu_codec_encode(&spec, shape, d->x, d->payload, d->scratch, 0, err, sizeof err);
            if (rc == 0)
                rc = cu_codec_status(d->scratch, 0, err, sizeof err);
            CHECK(rc == 0, "%s: clean input after an unread NaN call gives %d (%s)", tagged[k], rc, err);
            rc = cu_codec_decode(&spec, shape, d->payload, d->out, d->scratch, 0, err, sizeof err);
            if (rc == 0)
                rc = cu_codec_status(d->scratch, 0, err, sizeof err);
            CHECK(rc == 0, "%s: decode of a clean frame gives %d (%s)", tagged[k], rc, err);
            CU(cudaMemcpy(d->x, xn, n * sizeof *x, cudaMemcpyHostToDevice));
            rc = cu_codec_encode(&spec, shape, d->x, d->payload, d->scratch, 0, err, sizeof err);
            if (rc == 0)
                rc = cu_codec_status(d->scratch, 0, err, sizeof err);
            CHECK(rc == TAH_ENONFINITE, "%s: NaN input after clean calls gives %d, want TAH_ENONFINITE",
                  tagged[k], rc);
        }
        free(xn);
    }
    /* corrupt payloads the CPU decoder rejects: the GPU decoder must too */
    struct {
        const char *spec;
        size_t off; /* payload byte to overwrite */
        uint8_t val;
    } bad[] = {
        { "ash-fp8", 8 + 5, 0x7f },        /* NaN code */
        { "ash-fp8", 3, 0xff },            /* alpha NaN */
        { "fixpt", 1, 0x7c },              /* step Inf */
        { "int:symmetric=1", 5, 0xfc },    /* step negative Inf */
        { "tah", 24, 0x00 },               /* a high tile turned low: count wrong (flags at 24) */
        { "tah", 0, 0x00 },                /* a reserved word not 0 (written below) */
        { "tah", 24 + 3, 0x00 },           /* tile 3: a pivot without rotation (written below) */
        { "int", 0, 120 },                 /* block exponent above 114 */
        { "int:symmetric=1", 0, 0x80 },    /* block exponent -128 */
        { "int", 2, 0x01 },                /* a byte after the exponents (16 groups: 1 block) */
        { "tah", 12, 0x01 },               /* sample 1's index entry 0 not 0 */
        { "tah", 17, 0x81 },               /* sample 1's exponent -127 (exponents at 16) */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        codec_spec_t spec;
        codec_spec_parse(bad[k].spec, &spec, err, sizeof err);
        int64_t fsize = codec_frame_size(&spec, shape);
        uint8_t *f = malloc((size_t)fsize);
        float *y = malloc(n * sizeof *y);
        codec_encode(&spec, shape, x, f, (size_t)fsize, NULL, err, sizeof err);
        uint8_t *p = f + CODEC_HEADER_SIZE;
        if (k == 5) { /* the first reserved word 2^20 */
            p[0] = 0x00; p[1] = 0x10; p[2] = 0x00; p[3] = 0x00;
        } else if (k == 6) { /* tile 64: flag byte t is tile t's (high, rotated, pivot 6 bits) */
            p[bad[k].off] = (uint8_t)((p[bad[k].off] & 1u) | (5u << 2));
        } else if (k == 4) {
            p[bad[k].off] ^= 0x01; /* flip tile 0's high bit */
        } else {
            p[bad[k].off] = bad[k].val;
        }
        codec_frame_seal(&spec, shape, f, (size_t)fsize, err, sizeof err);
        int rc_cpu = codec_decode(f, (size_t)fsize, y, n, NULL, err, sizeof err);
        s_reserve(d, n, (size_t)fsize, cu_codec_scratch_bytes(&spec, shape));
        CU(cudaMemcpy(d->payload, p, (size_t)fsize - CODEC_HEADER_SIZE, cudaMemcpyHostToDevice));
        int rc = cu_codec_decode(&spec, shape, d->payload, d->out, d->scratch, 0, err, sizeof err);
        if (rc == 0)
            rc = cu_codec_status(d->scratch, 0, err, sizeof err);
        CHECK(rc_cpu == TAH_ECORRUPT && rc == TAH_ECORRUPT, "corrupt %s #%zu: CPU %d, GPU %d (want %d)", bad[k].spec,
              k, rc_cpu, rc, TAH_ECORRUPT);
        free(f);
        free(y);
    }
    /* TAH index entries (frame version 3) off by one: samples of 256 tiles (2 entries each),
       the lane-pair decoder (tile 64) and k_tah_dcount + k_tah_dchunk (tile 32 in allocation
       tiles of 64, 7-bit flags, 4 entries): every entry */
    s_tah_index_entries(d, "tah", (codec_shape_t){ 2, 64, 256 }, 6, NULL, 0);
    s_tah_index_entries(d, "tah:tile=32,alloc_tile=64", (codec_shape_t){ 2, 64, 256 }, 6, NULL, 0);
    /* ... and on the bench tensor (800 CTAs of the lane-pair decoder, more than fit at once):
       entries in the first, middle and last samples (200 a sample), at CTA and warp boundaries */
    static const size_t ents[] = { 1, 2, 3, 57, 100, 151, 199, 200, 1401, 1598, 1599 };
    s_tah_index_entries(d, "tah", (codec_shape_t){ 8, 1024, 1600 }, 7, ents, sizeof ents / sizeof ents[0]);
    /* documented limit: TAH tiles above 256 elements stay on the CPU codec */
    codec_spec_t big;
    codec_spec_parse("tah:tile=512,alloc_tile=512", &big, err, sizeof err);
    s_reserve(d, n, (size_t)codec_frame_size(&big, shape), cu_codec_scratch_bytes(&big, shape));
    CHECK(cu_codec_encode(&big, shape, d->x, d->payload, d->scratch, 0, err, sizeof err) == TAH_EPARAM,
          "tah tile=512 on the GPU: want TAH_EPARAM");
    free(x);
}

/* Valid frames whose metadata decode beyond FLT_MAX: int clamps to +-FLT_MAX (no
 * error), fixpt with a tiny scale gives TAH_ENONFINITE. The GPU decoders take a
 * per-element clamp / check path only where a group's extreme codes overflow
 * (round 7); both outcomes must match the CPU's, bit for bit. TAH: a tile whose
 * c * step overflows while min + c * step would not (a decoder that fused the two
 * roundings into one fma would return finite values there). */
static void s_test_wide(s_dev_t *d)
{
    char err[CODEC_ERRLEN];
    const codec_shape_t shape = { 2, 4, 256 };
    const uint64_t n = 2 * 4 * 256;
    float *x = malloc(n * sizeof *x), *y_cpu = malloc(n * sizeof *y_cpu), *y = malloc(n * sizeof *y);
    codec_synth_activations(x, shape, 9);
    for (uint64_t i = 0; i < n; i++)
        x[i] *= 0.01f;
    static const struct {
        const char *spec;
        size_t meta;     /* payload offset of group 3's metadata */
        int e;           /* non-zero: int: payload bytes 0..3 set to e (block 0's i8 and its zero
                            bytes); tah: the tile's exponent byte */
        uint16_t m0, m1; /* metadata words written there (int asym, tah: min, step) */
        int code0;       /* the CPU decode gives TAH_ENONFINITE (fixpt: group 3's first code set to 0,
                            -127 steps) */
        int clamps;      /* the CPU decode succeeds with values clamped to +-FLT_MAX */
    } cases[] = {
        { "int", 4 + 4 * 3, 114, 0xfbffu, 0x7bffu, 0, 1 },    /* min -65504, step 65504, e 114 */
        { "int:symmetric=1", 4 + 2 * 3, 114, 0x7bffu, 0, 0, 1 }, /* step 65504, e 114 */
        { "int", 4 + 4 * 3, 114, 0x0000u, 0x7bffu, 0, 1 },    /* min 0: only codes >= 1 overflow */
        { "fixpt:scale=1e-36", 2 * 3, 0, 0x7bffu, 0, 1, 0 }, /* k = step / scale = Inf */
        { "fixpt:scale=1e-33", 2 * 3, 0, 0x7bffu, 0, 1, 0 }, /* k finite, 127 k overflows */
        { "fixpt:scale=1e-33", 2 * 3, 0, 0x7bffu, 0, 0, 0 }, /* 127 k overflows, every code 127: 0 */
        /* tah, the first high unrotated tile (meta: below): min -65504 2^111, step 10784 2^111:
           c * step overflows for the codes >= 13 a 4-bit tile's largest element gets, while
           min + 15 step does not, so only the two roundings give Inf there */
        { "tah", 0, 111, 0xfbffu, 0x7144u, 1, 0 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        codec_spec_t spec;
        if (codec_spec_parse(cases[k].spec, &spec, err, sizeof err) != 0) {
            CHECK(0, "spec %s: %s", cases[k].spec, err);
            continue;
        }
        const int64_t fsize = codec_frame_size(&spec, shape);
        uint8_t *f = malloc((size_t)fsize);
        CHECK(codec_encode(&spec, shape, x, f, (size_t)fsize, NULL, err, sizeof err) == 0, "%s: encode: %s",
              cases[k].spec, err);
        uint8_t *p = f + CODEC_HEADER_SIZE;
        size_t meta = cases[k].meta;
        size_t eb = 0; /* where e goes */
        if (spec.id == CODEC_TAH) { /* 2 x 16 tiles of 64: the index at 8 (1 entry a sample), one exponent
                                       a sample at 16 (and 6 bytes of padding), a flag byte a tile at 24,
                                       meta at 56 */
            size_t t = 0;
            while (t < 31 && (p[24 + t] & 3u) != 1u)
                t++;
            meta = 56 + 4 * t;
            eb = 16 + t / 16;
        }
        if (cases[k].e && spec.id == CODEC_TAH) {
            p[eb] = (uint8_t)cases[k].e;
        } else if (cases[k].e) {
            p[0] = (uint8_t)cases[k].e; p[1] = 0; p[2] = 0; p[3] = 0;
        }
        p[meta] = (uint8_t)cases[k].m0;
        p[meta + 1] = (uint8_t)(cases[k].m0 >> 8);
        if ((spec.id == CODEC_INT && !spec.p.intq.symmetric) || spec.id == CODEC_TAH) {
            p[meta + 2] = (uint8_t)cases[k].m1;
            p[meta + 3] = (uint8_t)(cases[k].m1 >> 8);
        }
        if (cases[k].code0 && spec.id == CODEC_FIXPT) /* 8 bits, group 128: codes start at 2 * 16 groups */
            p[2 * 16 + 3 * 128] = 0;
        codec_frame_seal(&spec, shape, f, (size_t)fsize, err, sizeof err);
        const int rc_cpu = codec_decode(f, (size_t)fsize, y_cpu, n, NULL, err, sizeof err);
        s_reserve(d, n, (size_t)fsize, cu_codec_scratch_bytes(&spec, shape));
        CU(cudaMemcpy(d->payload, p, (size_t)fsize - CODEC_HEADER_SIZE, cudaMemcpyHostToDevice));
        CU(cudaMemset(d->out, 0xff, n * sizeof(float)));
        int rc = cu_codec_decode(&spec, shape, d->payload, d->out, d->scratch, 0, err, sizeof err);
        if (rc == 0)
            rc = cu_codec_status(d->scratch, 0, err, sizeof err);
        CHECK(rc_cpu == (cases[k].code0 ? TAH_ENONFINITE : 0), "%s #%zu: CPU decode %d, want %d", cases[k].spec, k,
              rc_cpu, cases[k].code0 ? TAH_ENONFINITE : 0);
        CHECK(rc == rc_cpu, "%s #%zu: GPU decode %d, CPU decode %d", cases[k].spec, k, rc, rc_cpu);
        if (rc == 0 && rc_cpu == 0) {
            CU(cudaMemcpy(y, d->out, n * sizeof *y, cudaMemcpyDeviceToHost));
            uint64_t nd = 0, nmax = 0;
            for (uint64_t i = 0; i < n; i++) {
                nd += memcmp(&y[i], &y_cpu[i], sizeof(float)) != 0;
                nmax += fabsf(y_cpu[i]) == 3.40282347e38f;
            }
            CHECK(nd == 0, "%s #%zu: GPU decode differs from CPU decode in %llu floats", cases[k].spec, k,
                  (unsigned long long)nd);
            CHECK(nmax > 0 || !cases[k].clamps, "%s #%zu: no value clamped to FLT_MAX (the case tests nothing)",
                  cases[k].spec, k);
        }
        free(f);
    }
    free(x);
    free(y_cpu);
    free(y);
}

int main(int argc, char **argv)
{
    /* --quick: skip the exhaustive E4M3 comparison (2^32 floats, ~30 s of host time) in
     * development runs; scripts/gpu-check and ctest run the whole test */
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "test_cu_codec: no CUDA device: skipped\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("test_cu_codec: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    s_dev_t d = { 0 };

    for (size_t k = 0; k < N_SPECS; k++) {
        int before = g_fail;
        for (size_t sh = 0; sh < N_SHAPES; sh++)
            for (int in = 0; in < N_INPUTS; in++)
                s_case(&d, k_specs[k], k_shapes[sh], in, 1000 * sh + (uint64_t)in + 1, 0, 0);
        /* unaligned device pointers: the scalar paths */
        s_case(&d, k_specs[k], (codec_shape_t){ 2, 3, 100 }, IN_SYNTH, 99, 1, 1);
        s_case(&d, k_specs[k], (codec_shape_t){ 3, 5, 640 }, IN_NORMAL, 98, 3, 2);
        /* fresh random tensors */
        for (uint64_t seed = 0; seed < 3; seed++)
            s_case(&d, k_specs[k], (codec_shape_t){ 2, 64, 1600 }, IN_SYNTH, 500 + seed, 0, 0);
        printf("  %-58s %s\n", k_specs[k], g_fail == before ? "ok" : "FAILED");
    }
    /* bf16 input: every spec, every input kind on two shapes, an unaligned pointer (the
     * scalar loads), and the default specs on a large shape (the fast kernels' bf16 forms) */
    {
        int before = g_fail;
        for (size_t k = 0; k < N_SPECS; k++) {
            for (int in = 0; in < N_INPUTS; in++) {
                s_case_x(&d, k_specs[k], (codec_shape_t){ 3, 7, 130 }, in, 800 + (uint64_t)in, 0, 0, CU_BF16);
                s_case_x(&d, k_specs[k], (codec_shape_t){ 4, 33, 1600 }, in, 820 + (uint64_t)in, 0, 0, CU_BF16);
            }
            s_case_x(&d, k_specs[k], (codec_shape_t){ 2, 3, 100 }, IN_SYNTH, 840, 1, 1, CU_BF16);
        }
        static const char *const big[] = { "fp32", "bf16", "fixpt", "fixpt:stochastic=1,seed=3", "int",
                                           "int:symmetric=1", "ash-fp8", "tah" };
        for (size_t k = 0; k < sizeof big / sizeof big[0]; k++)
            s_case_x(&d, big[k], (codec_shape_t){ 4, 1024, 1600 }, IN_SYNTH, 850 + (uint64_t)k, 0, 0, CU_BF16);
        printf("  %-58s %s\n", "bf16 input, every spec (frames of the widened floats)",
               g_fail == before ? "ok" : "FAILED");
    }
    /* tah shapes where each thread of the shared-memory select/scan kernels owns
     * several allocation tiles (n_alloc 8192 and 2500: chunk boundaries, ties of
     * constant input across chunks), and one too large for shared memory
     * (n_alloc 64000: the global-memory kernels) */
    {
        int before = g_fail;
        const codec_shape_t mid[] = { { 2, 512, 1000 }, { 3, 100, 1600 } };
        for (int m = 0; m < 2; m++) {
            s_case(&d, "tah", mid[m], IN_SYNTH, 600 + (uint64_t)m, 0, 0);
            s_case(&d, "tah", mid[m], IN_CONST, 610 + (uint64_t)m, 0, 0);
            s_case(&d, "tah:hi_frac=0.5,tile=32,alloc_tile=96", mid[m], IN_SIGNED_ZEROS, 620 + (uint64_t)m, 0, 0);
        }
        s_case(&d, "tah:tile=8,alloc_tile=8,hi_frac=0.37", (codec_shape_t){ 2, 512, 1000 }, IN_SYNTH, 630, 0, 0);
        s_case(&d, "tah:tile=8,alloc_tile=8,hi_frac=0.37", (codec_shape_t){ 2, 512, 1000 }, IN_CONST, 631, 0, 0);
        printf("  %-58s %s\n", "tah large n_alloc (select/scan chunking, global path)",
               g_fail == before ? "ok" : "FAILED");
    }
    /* the default specs on shapes where every warp of the persistent grids (round 7)
     * takes several iterations, one with partial groups, blocks and tiles at the end */
    {
        int before = g_fail;
        static const char *const dflt[] = { "fixpt", "fixpt:stochastic=1,seed=3", "int", "int:symmetric=1",
                                            "ash-fp8", "tah" };
        for (size_t k = 0; k < sizeof dflt / sizeof dflt[0]; k++) {
            s_case(&d, dflt[k], (codec_shape_t){ 4, 1024, 1600 }, IN_SYNTH, 700 + (uint64_t)k, 0, 0);
            s_case(&d, dflt[k], (codec_shape_t){ 5, 999, 1000 }, IN_NORMAL, 710 + (uint64_t)k, 0, 0);
        }
        /* ash-fp8's whole-block encoder where blocks' sums of squares leave [2^-64, FLT_MAX]
         * (zero, tiny, huge, mixed scales: ash.c's scaled trees): its warps hand such blocks
         * to the segment encoder */
        static const int rare[] = { IN_ZEROS, IN_TINY, IN_HUGE, IN_BLOCKS, IN_MIXED, IN_BIGSPIKE };
        for (size_t k = 0; k < sizeof rare / sizeof rare[0]; k++) {
            s_case(&d, "ash-fp8", (codec_shape_t){ 4, 1024, 1600 }, rare[k], 730 + (uint64_t)k, 0, 0);
            s_case_x(&d, "ash-fp8", (codec_shape_t){ 4, 1024, 1600 }, rare[k], 740 + (uint64_t)k, 0, 0, CU_BF16);
        }
        /* stochastic rounding where fixpt.c's clamp of t decides ~100 codes (IN_EDGE) */
        s_case(&d, "fixpt:stochastic=1,seed=3", (codec_shape_t){ 4, 1024, 1600 }, IN_EDGE, 0, 0, 0);
        /* the lane-pair decoder's grid larger than the GPU holds at once (the bench tensor) */
        s_case(&d, "tah", (codec_shape_t){ 8, 1024, 1600 }, IN_SYNTH, 723, 0, 0);
        s_case(&d, "tah", (codec_shape_t){ 16, 512, 1600 }, IN_NORMAL, 724, 0, 0);
        /* samples of more than 2^16 tiles: the lane-pair decoder (the encode takes the kernels of
         * the generic path: k_tah_spec counts a sample's tiles in 16 bits) */
        s_case(&d, "tah", (codec_shape_t){ 2, 2700, 1600 }, IN_SYNTH, 722, 0, 0);
        /* TAH's one-launch decoder counts each sample's earlier flag bytes itself: a
         * payload whose flags are not 16-byte aligned, several chunks per sample */
        s_case(&d, "tah", (codec_shape_t){ 3, 40, 1000 }, IN_NORMAL, 720, 3, 5);
        s_case(&d, "tah", (codec_shape_t){ 2, 333, 1600 }, IN_SYNTH, 721, 0, 9);
        /* k_tah_spec + k_tah_emit (every tile at its own exponent, lowered to its group's in the
         * emit or quantised again there) on tensors of wide range, many CTAs per sample */
        for (int in = IN_HUGE; in < N_INPUTS; in++)
            s_case(&d, "tah", (codec_shape_t){ 3, 700, 1600 }, in, 730 + (uint64_t)in, 0, 0);
        /* ... and with no high tile or every tile high (the emit's `all` case) */
        static const int ends[] = { IN_SYNTH, IN_MIXED };
        for (int m = 0; m < 2; m++) {
            s_case(&d, "tah:hi_frac=0", (codec_shape_t){ 2, 300, 1600 }, ends[m], 750 + (uint64_t)m, 0, 0);
            s_case(&d, "tah:hi_frac=1", (codec_shape_t){ 2, 300, 1600 }, ends[m], 760 + (uint64_t)m, 0, 0);
        }
        printf("  %-58s %s\n", "default specs, large shapes (grid-stride loops)", g_fail == before ? "ok" : "FAILED");
    }
    s_test_status(&d);
    printf("  status codes (NaN input, corrupt payloads)               %s\n", g_fail ? "see above" : "ok");
    s_test_wide(&d);
    printf("  frames that decode beyond FLT_MAX (clamp, non-finite)    %s\n", g_fail ? "see above" : "ok");
    if (!quick) {
        s_test_e4m3_exhaustive(&d);
        printf("  e4m3 hardware conversion vs codecs/fp8.c (2^32 floats)   done\n");
        s_test_half_exhaustive(&d);
        printf("  fp16 roundings (nearest, down, up) vs codecs/half.c (3 x 2^32 floats)   done\n");
    }

    cudaFree(d.x);
    cudaFree(d.out);
    cudaFree(d.payload);
    cudaFree(d.scratch);
    printf("test_cu_codec: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
