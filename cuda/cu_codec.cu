// cu_codec.cu — the public entry points of cu_codec.h: argument checks,
// the scratch layout (a 256-byte head holding the status word, then each
// codec's work area), dispatch to the per-codec kernels, and the status
// read-back.
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "cu_common.cuh"

int cu_fail(cudaError_t e, const char *what, const char *file, int line, char *err, size_t errlen)
{
    if (err && errlen)
        snprintf(err, errlen, "%s:%d: %s failed: %s (%s)", file, line, what, cudaGetErrorString(e),
                 cudaGetErrorName(e));
    return TAH_EDEVICE;
}

// A switch on unless the environment sets it to "0".
static bool s_env_on(const char *name)
{
    const char *e = getenv(name);
    return !(e && strcmp(e, "0") == 0);
}

bool cu_fuse(void)
{
    static int v = -1; // benign race: every thread computes the same value
    if (v < 0)
        v = s_env_on("TAH_CU_FUSE");
    return v != 0;
}

bool cu_tpt(void)
{
    static int v = -1; // benign race, as cu_fuse
    if (v < 0)
        v = s_env_on("TAH_CU_TPT");
    return v != 0;
}

bool cu_spec(void)
{
    static int v = -1; // benign race, as cu_fuse
    if (v < 0)
        v = s_env_on("TAH_CU_SPEC");
    return v != 0;
}

size_t cu_smem_optin(size_t reserve)
{
    int dev = 0, bytes = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return 0;
    return (size_t)bytes > reserve ? (size_t)bytes - reserve : 0;
}

cudaError_t cu_smem_allow(const void *kernel, size_t bytes)
{
    if (bytes <= 48 * 1024)
        return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

int cu_coop_blocks(const void *kernel, int threads, size_t smem)
{
    int dev = 0, coop = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
        (void)cudaGetLastError(); // not sticky: the caller falls back to the multi-kernel path
        return 0;
    }
    return coop ? per_sm * sms : 0;
}

// This call's status tag (see cu_head): a per-process random start plus a
// counter, so no two calls of the process share one and a word left in the
// scratch by another process matches with probability ~2^-61.
static unsigned long long s_seed(void)
{
    const char *fixed = getenv("TAH_CU_TAG_SEED"); // a fixed first tag (bisecting run-to-run differences)
    if (fixed && *fixed)
        return strtoull(fixed, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long z = (unsigned long long)ts.tv_sec * 1000000007ull + (unsigned long long)ts.tv_nsec;
    z ^= (unsigned long long)getpid() << 40;
    z ^= (unsigned long long)(uintptr_t)&ts;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; // splitmix64 finaliser
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static cu_hp s_head(void *d_scratch)
{
    static const unsigned long long seed = s_seed();
    static std::atomic<unsigned long long> count{ 0 };
    cu_hp h;
    h.p = (cu_head *)d_scratch;
    h.tag = (seed + count.fetch_add(1, std::memory_order_relaxed)) & CU_TAG_MASK;
    return h;
}

static int s_fail(int code, char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

extern "C" size_t cu_codec_scratch_bytes(const codec_spec_t *spec, codec_shape_t shape)
{
    if (!spec || codec_frame_size(spec, shape) < 0)
        return 0;
    const uint64_t n = codec_shape_elems(shape);
    size_t work = 0;
    if (spec->id == CODEC_ASH_FP8)
        work = cu_ash_scratch(spec, n);
    else if (spec->id == CODEC_TAH)
        work = cu_tah_scratch(spec, shape);
    else if (spec->id == CODEC_INT)
        work = cu_group_scratch(spec, n);
    return CU_SCRATCH_HEAD + work;
}

// tah's bf16 input: the widened floats past the codec's own scratch (256-aligned)
static size_t s_widen_off(const codec_spec_t *spec, codec_shape_t shape)
{
    return (cu_codec_scratch_bytes(spec, shape) + 255u) & ~(size_t)255u;
}

extern "C" size_t cu_codec_scratch_bytes_x(const codec_spec_t *spec, codec_shape_t shape, cu_dtype_t xt)
{
    const size_t base = cu_codec_scratch_bytes(spec, shape);
    if (base == 0 || xt != CU_BF16 || spec->id != CODEC_TAH)
        return base;
    return s_widen_off(spec, shape) + codec_shape_elems(shape) * sizeof(float);
}

// bf16 -> fp32, exact (TAH-Quant's kernels stage fp32 rows; the other encoders read bf16 themselves)
__global__ static void k_widen_bf16(float *__restrict__ y, const cu_bf16 *__restrict__ x, uint64_t n, bool vec)
{
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c * 8 < n; c += stride) {
        float v[8];
        d_load8(x, c * 8, n, vec, v);
        d_store8(y, c * 8, n - c * 8 < 8 ? (uint32_t)(n - c * 8) : 8u, vec, v);
    }
}

// Common checks; *n gets B*S*C.
static int s_check(const codec_spec_t *spec, codec_shape_t shape, const void *a, const void *b,
                   const void *scratch, uint64_t *n, char *err, size_t errlen)
{
    if (!spec || !a || !b || !scratch)
        return s_fail(TAH_EINVAL, err, errlen, "cuda codec: NULL argument");
    if (((uintptr_t)scratch & 255u) != 0)
        return s_fail(TAH_EINVAL, err, errlen, "cuda codec: scratch %p is not 256-byte aligned", scratch);
    const int64_t size = codec_frame_size(spec, shape);
    if (size < 0) {
        codec_spec_validate(spec, err, errlen);
        return s_fail((int)size, err, errlen, "cuda codec: invalid spec or shape (%u,%u,%u): %s", shape.b, shape.s,
                      shape.c, tah_strerror((int)size));
    }
    *n = codec_shape_elems(shape);
    return 0;
}

static int s_encode(const codec_spec_t *spec, codec_shape_t shape, cu_dtype_t xt, const void *d_x,
                    uint8_t *d_payload, void *d_scratch, cudaStream_t stream, unsigned int stages, char *err,
                    size_t errlen);

extern "C" int cu_codec_encode(const codec_spec_t *spec, codec_shape_t shape, const float *d_x, uint8_t *d_payload,
                               void *d_scratch, cudaStream_t stream, char *err, size_t errlen)
{
    return s_encode(spec, shape, CU_F32, d_x, d_payload, d_scratch, stream, CU_TAH_ALL, err, errlen);
}

extern "C" int cu_codec_encode_x(const codec_spec_t *spec, codec_shape_t shape, cu_dtype_t xt, const void *d_x,
                                 uint8_t *d_payload, void *d_scratch, cudaStream_t stream, char *err, size_t errlen)
{
    if (xt != CU_F32 && xt != CU_BF16)
        return s_fail(TAH_EINVAL, err, errlen, "cuda codec: unknown input type %d (CU_F32 or CU_BF16)", (int)xt);
    return s_encode(spec, shape, xt, d_x, d_payload, d_scratch, stream, CU_TAH_ALL, err, errlen);
}

// Benchmark only (bench/bench_cu_codec.c declares it; not in cu_codec.h): a TAH encode that
// runs only the stages in `stages` (CU_TAH_MEMSET 1: the absmax memset, CU_TAH_ENTROPY 2,
// CU_TAH_SELECT 4, CU_TAH_QUANT 8: quant + flags), so the bench can split the encode's time.
// A stage run alone reads what an earlier full encode of the same shape left in the scratch
// (entropies, prefixes, absmax); its payload is meaningless. Other codecs: a plain encode.
extern "C" int cu_codec_encode_stages(const codec_spec_t *spec, codec_shape_t shape, const float *d_x,
                                      uint8_t *d_payload, void *d_scratch, cudaStream_t stream, unsigned int stages,
                                      char *err, size_t errlen)
{
    return s_encode(spec, shape, CU_F32, d_x, d_payload, d_scratch, stream, stages & CU_TAH_ALL, err, errlen);
}

static int s_encode(const codec_spec_t *spec, codec_shape_t shape, cu_dtype_t xt, const void *d_x,
                    uint8_t *d_payload, void *d_scratch, cudaStream_t stream, unsigned int stages, char *err,
                    size_t errlen)
{
    uint64_t n = 0;
    int rc = s_check(spec, shape, d_x, d_payload, d_scratch, &n, err, errlen);
    if (rc != 0)
        return rc;
    const cu_hp head = s_head(d_scratch); // no status memset: the kernels tag the status word
    void *work = (uint8_t *)d_scratch + CU_SCRATCH_HEAD;
    // int and tah zero the absmax themselves where their kernels use it (round 6: the
    // one-launch encoders need no memset)
    switch (spec->id) {
    case CODEC_FP32:
    case CODEC_FP16:
    case CODEC_BF16: return cu_raw_encode(spec, n, xt, d_x, d_payload, head, stream, err, errlen);
    case CODEC_FIXPT:
    case CODEC_INT: return cu_group_encode(spec, n, xt, d_x, d_payload, head, work, stream, err, errlen);
    case CODEC_ASH_FP8: return cu_ash_encode(spec, n, xt, d_x, d_payload, head, work, stream, err, errlen);
    case CODEC_TAH: {
        const float *xf = (const float *)d_x;
        if (xt == CU_BF16 && stages == CU_TAH_ALL) { // read as bf16 where k_tah_spec applies
            rc = cu_tah_encode_bf16(spec, shape, (const cu_bf16 *)d_x, d_payload, head, work, stream, err, errlen);
            if (rc <= 0)
                return rc;
        }
        if (xt == CU_BF16) { // else widened into the scratch's tail (cu_codec_scratch_bytes_x)
            float *w = (float *)((uint8_t *)d_scratch + s_widen_off(spec, shape));
            const bool vec = ((uintptr_t)d_x & 15u) == 0;
            k_widen_bf16<<<cu_grid((n + 7) / 8, 256), 256, 0, stream>>>(w, (const cu_bf16 *)d_x, n, vec);
            CU_CHECK_LAUNCH("k_widen_bf16");
            xf = w;
        }
        return cu_tah_encode(spec, shape, xf, d_payload, head, work, stream, stages, err, errlen);
    }
    }
    return s_fail(TAH_ECODEC, err, errlen, "cuda codec: unknown codec id %d", (int)spec->id);
}

extern "C" int cu_codec_decode(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *d_payload, float *d_out,
                               void *d_scratch, cudaStream_t stream, char *err, size_t errlen)
{
    uint64_t n = 0;
    int rc = s_check(spec, shape, d_payload, d_out, d_scratch, &n, err, errlen);
    if (rc != 0)
        return rc;
    const cu_hp head = s_head(d_scratch);
    void *work = (uint8_t *)d_scratch + CU_SCRATCH_HEAD;
    switch (spec->id) {
    case CODEC_FP32:
    case CODEC_FP16:
    case CODEC_BF16: return cu_raw_decode(spec, n, d_payload, d_out, head, stream, err, errlen);
    case CODEC_FIXPT:
    case CODEC_INT: return cu_group_decode(spec, n, d_payload, d_out, head, stream, err, errlen);
    case CODEC_ASH_FP8: return cu_ash_decode(spec, n, d_payload, d_out, head, work, stream, err, errlen);
    case CODEC_TAH: return cu_tah_decode(spec, shape, d_payload, d_out, head, work, stream, err, errlen);
    }
    return s_fail(TAH_ECODEC, err, errlen, "cuda codec: unknown codec id %d", (int)spec->id);
}

extern "C" int cu_codec_status(const void *d_scratch, cudaStream_t stream, char *err, size_t errlen)
{
    if (!d_scratch)
        return s_fail(TAH_EINVAL, err, errlen, "cuda codec: NULL scratch");
    cu_head h;
    CUDA_CHECK(cudaMemcpyAsync(&h, d_scratch, sizeof h, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // the condition bits of the last call on this scratch; a word another call tagged reads as none
    const unsigned int st = (h.status >> CU_ST_BITS) == h.tag ? (unsigned int)(h.status & ((1u << CU_ST_BITS) - 1u)) : 0u;
    if (st & CU_ST_CORRUPT)
        return s_fail(TAH_ECORRUPT, err, errlen, "cuda decode: payload metadata that no encoder writes "
                                                 "(bad scale, code, flags or tile count)");
    if (st & CU_ST_NONFINITE)
        return s_fail(TAH_ENONFINITE, err, errlen, "cuda codec: non-finite value in the input (encode) or "
                                                   "the decoded output (decode)");
    if (st & CU_ST_RANGE)
        return s_fail(TAH_ERANGE, err, errlen, "cuda encode: value out of the codec's range (fixpt: lower "
                                               "scale; fp16: |x| > 65504; bf16: rounds to infinity; "
                                               "ash-fp8: tau*block overflows; tah: a tile's fp16 field "
                                               "overflows)");
    return 0;
}
