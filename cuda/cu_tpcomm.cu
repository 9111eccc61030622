// cu_tpcomm.cu — the tensor-parallel all-reduce over NCCL (cu_tpcomm.h):
// group set-up, NCCL's all-reduce for codec none, the two-shot compressed
// all-reduce from the GPU codecs and NCCL point-to-point, the broadcast,
// and the codec status collected without synchronisation.
//
// Kernels (grid-stride loops; thread t of the grid handles elements t,
// t + gridDim*blockDim, ...):
//   k_bf16_to_f32 / k_f32_to_bf16   one element per step (bf16 input is widened only when
//                                    it must be padded to whole chunks)
//   k_sum_ranks                      one float4 of the chunk per step, the
//                                    N decoded chunks added in rank order
//   k_sticky                         one thread: sticky |= the codec status
//                                    word's condition bits (per phase), then
//                                    the word = 0
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h> // __nv_bfloat16 (before nccl.h: ncclBfloat16)
#include <cuda_runtime.h>
#include <nccl.h>

#include "cu_common.cuh" // cu_head (the status word at the start of codec scratch), CU_ST_*, codec.h
#include "cu_tpcomm.h"
extern "C" {
#include "tpcomm.h" // tp_codec_unit, tp_chunk_spec
}

#define S_SLOT 256 /* payload slot alignment in bytes (16-byte vector paths; < 256 B lost per slot) */

#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 21300
#define S_NCCL_LAST() ncclGetLastError(NULL)
#else
#define S_NCCL_LAST() "(ncclGetLastError needs NCCL >= 2.13)"
#endif

struct s_rank {
    int dev;
    ncclComm_t comm;
    float *xf;               // (npmax) fp32 input, zero padding
    float *out;              // (npmax) decoded output before the type conversion
    float *dec, *acc;        // (N, kmax) decoded chunks of this rank, (kmax) their sum
    uint8_t *rs_send, *rs_recv, *ag; // (N, cap) payload slots
    void *scratch;           // codec scratch (cu_codec.h), status word first
    unsigned int *sticky;    // codec condition bits since the last cu_tp_status, CU_ST_BITS per phase
};

struct cu_tp {
    int n, compressed;
    codec_spec_t rs, ag;
    size_t max_n, unit, kmax, npmax;
    s_rank r[CU_TP_MAX];
};

static int s_err(int code, char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

#define S_CU(call, rank)                                                                                   \
    do {                                                                                                   \
        cudaError_t e_ = (call);                                                                           \
        if (e_ != cudaSuccess)                                                                             \
            return s_err(TAH_EDEVICE, err, errlen, "tp all-reduce, rank %d (cuda:%d): %s:%d: %s failed: %s", \
                         (rank), t->r[(rank)].dev, __FILE__, __LINE__, #call, cudaGetErrorString(e_));    \
    } while (0)

#define S_NC(call)                                                                                          \
    do {                                                                                                    \
        ncclResult_t r_ = (call);                                                                           \
        if (r_ != ncclSuccess)                                                                              \
            return s_err(TAH_EDEVICE, err, errlen, "tp all-reduce: %s:%d: %s failed: %s (%d): %s", __FILE__, \
                         __LINE__, #call, ncclGetErrorString(r_), (int)r_, S_NCCL_LAST());                  \
    } while (0)

// the NCCL calls of all ranks between ncclGroupStart and ncclGroupEnd; a
// failed call inside still ends the group (NCCL requires it)
#define S_NC_IN_GROUP(call)                                                                                 \
    do {                                                                                                    \
        ncclResult_t r_ = (call);                                                                           \
        if (r_ != ncclSuccess) {                                                                            \
            (void)ncclGroupEnd();                                                                           \
            return s_err(TAH_EDEVICE, err, errlen, "tp all-reduce: %s:%d: %s failed: %s (%d): %s", __FILE__, \
                         __LINE__, #call, ncclGetErrorString(r_), (int)r_, S_NCCL_LAST());                  \
        }                                                                                                   \
    } while (0)

// ---- kernels ----

static unsigned int s_blocks(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned int)(b < 4096 ? (b ? b : 1) : 4096);
}

__global__ static void k_bf16_to_f32(float *y /* (n) */, const __nv_bfloat16 *x /* (n) */, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}

__global__ static void k_f32_to_bf16(__nv_bfloat16 *y /* (n) */, const float *x /* (n) */, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

// acc[i] = ((dec[0][i] + dec[1][i]) + dec[2][i]) ...: rank order, fp32.
// k4 = k/4 float4 groups; dec holds nranks chunks of k floats, k % 4 == 0.
__global__ static void k_sum_ranks(float4 *acc /* (k/4) */, const float4 *dec /* (nranks, k/4) */, size_t k4,
                                   int nranks)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < k4; i += (size_t)gridDim.x * blockDim.x) {
        float4 a = dec[i];
        for (int j = 1; j < nranks; j++) {
            const float4 b = dec[(size_t)j * k4 + i];
            a.x += b.x;
            a.y += b.y;
            a.z += b.z;
            a.w += b.w;
        }
        acc[i] = a;
    }
}

// The phases of a two-shot whose codec conditions are told apart
enum { S_PH_INPUT, S_PH_SUM, S_PH_OUTPUT, S_NPH };

// After the codec calls of one phase: a call that saw a condition stored
// (its tag << CU_ST_BITS) | bits in the status word (cu_common.cuh), and a
// later call's condition replaces the word; the word was zero when the
// phase began (zeroed at creation and here), so its bits are the last
// flagging call's of this phase. They go to the phase's bits of sticky.
__global__ static void k_sticky(unsigned int *sticky, cu_head *head, int phase)
{
    const unsigned int bits = (unsigned int)(head->status & ((1ull << CU_ST_BITS) - 1ull));
    head->status = 0;
    if (bits)
        *sticky |= bits << (CU_ST_BITS * phase);
}

// ---- layout ----

static size_t s_lcm(size_t a, size_t b)
{
    size_t x = a, y = b;
    while (y) {
        size_t r = x % y;
        x = y;
        y = r;
    }
    return a / x * b;
}

static size_t s_chunk(const cu_tp_t *t, size_t n)
{
    size_t k = (n + (size_t)t->n - 1) / (size_t)t->n;
    return (k + t->unit - 1) / t->unit * t->unit;
}

// payload bytes of one chunk of k, or 0 if the codec cannot encode it
static size_t s_plen(const codec_spec_t *spec, size_t k)
{
    const codec_shape_t sh = { 1, 1, (uint32_t)k };
    const int64_t f = k <= UINT32_MAX ? codec_frame_size(spec, sh) : -1;
    return f > (int64_t)CODEC_HEADER_SIZE ? (size_t)f - CODEC_HEADER_SIZE : 0;
}

static size_t s_cap(size_t plen)
{
    return (plen + S_SLOT - 1) / S_SLOT * S_SLOT;
}

extern "C" void cu_tp_layout(const cu_tp_t *t, size_t n, size_t *chunk, size_t *plen_rs, size_t *plen_ag,
                             size_t *wire)
{
    size_t k = n, p1 = 0, p2 = 0, w = 0;
    if (t->compressed) {
        k = s_chunk(t, n);
        p1 = s_plen(&t->rs, k);
        p2 = s_plen(&t->ag, k);
        w = (size_t)(t->n - 1) * (s_cap(p1) + s_cap(p2));
    } else {
        w = (size_t)(2.0 * (t->n - 1) / t->n * (double)n * 4.0);
    }
    if (chunk)
        *chunk = k;
    if (plen_rs)
        *plen_rs = p1;
    if (plen_ag)
        *plen_ag = p2;
    if (wire)
        *wire = w;
}

// ---- life cycle ----

extern "C" int cu_tp_size(const cu_tp_t *t)
{
    return t->n;
}

extern "C" int cu_tp_compressed(const cu_tp_t *t)
{
    return t->compressed;
}

extern "C" void cu_tp_destroy(cu_tp_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    cu_tp_t *t = *self_p;
    for (int i = 0; i < t->n; i++) {
        s_rank *g = &t->r[i];
        if (cudaSetDevice(g->dev) != cudaSuccess)
            continue;
        (void)cudaDeviceSynchronize();
        if (g->comm)
            (void)ncclCommDestroy(g->comm);
        cudaFree(g->xf);
        cudaFree(g->out);
        cudaFree(g->dec);
        cudaFree(g->acc);
        cudaFree(g->rs_send);
        cudaFree(g->rs_recv);
        cudaFree(g->ag);
        cudaFree(g->scratch);
        cudaFree(g->sticky);
    }
    (void)cudaGetLastError();
    free(t);
    *self_p = NULL;
}

static int s_alloc(cu_tp_t *t, int i, void **p, size_t bytes, char *err, size_t errlen)
{
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess)
        return s_err(TAH_EDEVICE, err, errlen, "tp all-reduce, rank %d (cuda:%d): cudaMalloc of %.1f MB failed: %s", i,
                     t->r[i].dev, (double)bytes / 1e6, cudaGetErrorString(e));
    return 0;
}

static int s_new(cu_tp_t *t, const int *devices, char *err, size_t errlen)
{
    int visible = 0;
    cudaError_t ce = cudaGetDeviceCount(&visible);
    if (ce != cudaSuccess)
        return s_err(TAH_EDEVICE, err, errlen, "tp all-reduce: cudaGetDeviceCount failed: %s", cudaGetErrorString(ce));
    for (int i = 0; i < t->n; i++) {
        if (devices[i] < 0 || devices[i] >= visible)
            return s_err(TAH_EINVAL, err, errlen, "tp all-reduce: rank %d: no such device cuda:%d (%d visible)", i,
                         devices[i], visible);
        for (int j = 0; j < i; j++)
            if (devices[j] == devices[i])
                return s_err(TAH_EINVAL, err, errlen, "tp all-reduce: cuda:%d given twice (ranks %d and %d); "
                             "HINT: one GPU per rank", devices[i], j, i);
        t->r[i].dev = devices[i];
    }
    if (t->compressed) {
        t->unit = s_lcm(s_lcm(tp_codec_unit(&t->rs), tp_codec_unit(&t->ag)), 4); // and 16-byte starts (fp32)
        t->kmax = s_chunk(t, t->max_n);
        t->npmax = t->kmax * (size_t)t->n;
        const size_t p1 = s_plen(&t->rs, t->kmax), p2 = s_plen(&t->ag, t->kmax);
        const codec_shape_t sh = { 1, 1, (uint32_t)t->kmax };
        const size_t sb1 = p1 ? cu_codec_scratch_bytes_x(&t->rs, sh, CU_BF16) : 0; // bf16 input encoded in place
        const size_t sb2 = p2 ? cu_codec_scratch_bytes(&t->ag, sh) : 0;
        if (!p1 || !p2 || !sb1 || !sb2)
            return s_err(TAH_EINVAL, err, errlen, "tp all-reduce: the codecs cannot encode a chunk of %zu floats",
                         t->kmax);
        const size_t sb = sb1 > sb2 ? sb1 : sb2, N = (size_t)t->n;
        for (int i = 0; i < t->n; i++) {
            s_rank *g = &t->r[i];
            S_CU(cudaSetDevice(g->dev), i);
            int rc;
            if ((rc = s_alloc(t, i, (void **)&g->xf, t->npmax * 4, err, errlen)) ||
                (rc = s_alloc(t, i, (void **)&g->out, t->npmax * 4, err, errlen)) ||
                (rc = s_alloc(t, i, (void **)&g->dec, t->npmax * 4, err, errlen)) ||
                (rc = s_alloc(t, i, (void **)&g->acc, t->kmax * 4, err, errlen)) ||
                (rc = s_alloc(t, i, (void **)&g->rs_send, N * s_cap(p1), err, errlen)) ||
                (rc = s_alloc(t, i, (void **)&g->rs_recv, N * s_cap(p1), err, errlen)) ||
                (rc = s_alloc(t, i, (void **)&g->ag, N * s_cap(p2), err, errlen)) ||
                (rc = s_alloc(t, i, &g->scratch, sb, err, errlen)) ||
                (rc = s_alloc(t, i, (void **)&g->sticky, sizeof(unsigned int), err, errlen)))
                return rc;
            // padding and slot tails are never written by the kernels: zero once;
            // the scratch too (its status word starts clean: k_sticky)
            S_CU(cudaMemset(g->scratch, 0, sb), i);
            S_CU(cudaMemset(g->xf, 0, t->npmax * 4), i);
            S_CU(cudaMemset(g->rs_send, 0, N * s_cap(p1)), i);
            S_CU(cudaMemset(g->rs_recv, 0, N * s_cap(p1)), i);
            S_CU(cudaMemset(g->ag, 0, N * s_cap(p2)), i);
            S_CU(cudaMemset(g->sticky, 0, sizeof(unsigned int)), i);
            S_CU(cudaDeviceSynchronize(), i);
        }
    }
    ncclComm_t comms[CU_TP_MAX];
    int devs[CU_TP_MAX];
    for (int i = 0; i < t->n; i++)
        devs[i] = t->r[i].dev;
    S_NC(ncclCommInitAll(comms, t->n, devs));
    for (int i = 0; i < t->n; i++)
        t->r[i].comm = comms[i];
    return 0;
}

extern "C" cu_tp_t *cu_tp_new(int n, const int *devices, const codec_spec_t *rs, const codec_spec_t *ag,
                              size_t max_n, char *err, size_t errlen)
{
    if (n < 1 || n > CU_TP_MAX || !devices || !rs || !ag || max_n < 1) {
        s_err(TAH_EINVAL, err, errlen, "tp all-reduce: %d ranks (want 1..%d), max_n %zu", n, CU_TP_MAX, max_n);
        return NULL;
    }
    // NVLink multicast (NVLS) must stay off on these machines: before NCCL initialises
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    cu_tp_t *t = (cu_tp_t *)calloc(1, sizeof *t);
    if (!t) {
        s_err(TAH_ENOMEM, err, errlen, "tp all-reduce: out of host memory");
        return NULL;
    }
    t->n = n;
    t->max_n = max_n;
    t->rs = *rs;
    t->ag = *ag;
    t->compressed = rs->id != 0 || ag->id != 0;
    if (t->compressed) { // a "none" shot of a compressed pair moves raw fp32
        char cerr[CODEC_ERRLEN];
        if ((t->rs.id == 0 && codec_spec_parse("fp32", &t->rs, cerr, sizeof cerr) != 0) ||
            (t->ag.id == 0 && codec_spec_parse("fp32", &t->ag, cerr, sizeof cerr) != 0)) {
            s_err(TAH_EINVAL, err, errlen, "tp all-reduce: fp32 codec: %s", cerr);
            free(t);
            return NULL;
        }
    }
    if (s_new(t, devices, err, errlen) != 0) {
        cu_tp_destroy(&t);
        return NULL;
    }
    return t;
}

// ---- all-reduce ----

static ncclDataType_t s_nccl_type(int type)
{
    return type == CU_TP_BF16 ? ncclBfloat16 : ncclFloat32;
}

static int s_codec(int rc, const char *what, int i, int j, char *err, size_t errlen)
{
    if (rc == 0)
        return 0;
    char why[CODEC_ERRLEN];
    snprintf(why, sizeof why, "%s", err && errlen ? err : "");
    return s_err(rc, err, errlen, "tp all-reduce, rank %d: %s of chunk %d: %s", i, what, j, why);
}

static int s_twoshot(cu_tp_t *t, void *const *in, int in_type, void *const *out, int out_type, size_t n,
                     uint64_t id, const cudaStream_t *st, int parts, char *err, size_t errlen)
{
    const int N = t->n;
    const size_t k = s_chunk(t, n), npad = k * (size_t)N;
    const size_t p1 = s_plen(&t->rs, k), p2 = s_plen(&t->ag, k), cap1 = s_cap(p1), cap2 = s_cap(p2);
    const codec_shape_t sh = { 1, 1, (uint32_t)k };
    // an input of whole chunks is encoded where it lies, bf16 included (cu_codec_encode_x); the
    // padded case goes through g->xf as fp32
    const int direct_in = npad == n, direct_out = out_type == CU_TP_F32 && npad == n;
    const cu_dtype_t xt = direct_in && in_type == CU_TP_BF16 ? CU_BF16 : CU_F32;
    const size_t xs = xt == CU_BF16 ? 2 : 4; // bytes per input element
    int rc;
    if (parts & CU_TP_CODEC) // 0-1: fp32 copy (padded input only), encode every chunk
        for (int i = 0; i < N; i++) {
            s_rank *g = &t->r[i];
            S_CU(cudaSetDevice(g->dev), i);
            const uint8_t *src = direct_in ? (const uint8_t *)in[i] : (const uint8_t *)g->xf;
            if (!direct_in) {
                if (in_type == CU_TP_BF16) {
                    k_bf16_to_f32<<<s_blocks(n), 256, 0, st[i]>>>(g->xf, (const __nv_bfloat16 *)in[i], n);
                    S_CU(cudaGetLastError(), i);
                } else {
                    S_CU(cudaMemcpyAsync(g->xf, in[i], n * 4, cudaMemcpyDeviceToDevice, st[i]), i);
                }
                if (npad > n) // a larger earlier all-reduce may have written there
                    S_CU(cudaMemsetAsync(g->xf + n, 0, (npad - n) * 4, st[i]), i);
            }
            for (int j = 0; j < N; j++) {
                codec_spec_t spec;
                tp_chunk_spec(&t->rs, id, 0, i, j, &spec);
                rc = cu_codec_encode_x(&spec, sh, xt, src + (size_t)j * k * xs, g->rs_send + (size_t)j * cap1,
                                       g->scratch, st[i], err, errlen);
                if (rc)
                    return s_codec(rc, "reduce-scatter encode", i, j, err, errlen);
            }
            k_sticky<<<1, 1, 0, st[i]>>>(g->sticky, (cu_head *)g->scratch, S_PH_INPUT);
            S_CU(cudaGetLastError(), i);
        }
    if (parts & CU_TP_COMM) { // 2: all-to-all of the payloads
        S_NC(ncclGroupStart());
        for (int i = 0; i < N; i++) {
            s_rank *g = &t->r[i];
            for (int j = 0; j < N; j++) {
                if (j == i)
                    continue;
                S_NC_IN_GROUP(ncclSend(g->rs_send + (size_t)j * cap1, p1, ncclUint8, j, g->comm, st[i]));
                S_NC_IN_GROUP(ncclRecv(g->rs_recv + (size_t)j * cap1, p1, ncclUint8, j, g->comm, st[i]));
            }
        }
        S_NC(ncclGroupEnd());
    }
    if (parts & CU_TP_CODEC) // 3-4: decode my chunk from every rank, sum in rank order, encode the sum
        for (int i = 0; i < N; i++) {
            s_rank *g = &t->r[i];
            S_CU(cudaSetDevice(g->dev), i);
            for (int j = 0; j < N; j++) {
                // my own payload never left: it is still in the send slot
                const uint8_t *src = (j == i ? g->rs_send : g->rs_recv) + (size_t)j * cap1;
                rc = cu_codec_decode(&t->rs, sh, src, g->dec + (size_t)j * k, g->scratch, st[i], err, errlen);
                if (rc)
                    return s_codec(rc, "reduce-scatter decode", i, j, err, errlen);
            }
            k_sum_ranks<<<s_blocks(k / 4), 256, 0, st[i]>>>((float4 *)g->acc, (const float4 *)g->dec, k / 4, N);
            S_CU(cudaGetLastError(), i);
            codec_spec_t spec;
            tp_chunk_spec(&t->ag, id, 1, i, i, &spec);
            rc = cu_codec_encode(&spec, sh, g->acc, g->ag + (size_t)i * cap2, g->scratch, st[i], err, errlen);
            if (rc)
                return s_codec(rc, "all-gather encode", i, i, err, errlen);
            k_sticky<<<1, 1, 0, st[i]>>>(g->sticky, (cu_head *)g->scratch, S_PH_SUM);
            S_CU(cudaGetLastError(), i);
        }
    if (parts & CU_TP_COMM) { // 5: all-gather, in place
        S_NC(ncclGroupStart());
        for (int i = 0; i < N; i++) {
            s_rank *g = &t->r[i];
            S_NC_IN_GROUP(ncclAllGather(g->ag + (size_t)i * cap2, g->ag, cap2, ncclUint8, g->comm, st[i]));
        }
        S_NC(ncclGroupEnd());
    }
    if (parts & CU_TP_CODEC) // 6: decode every chunk into the output
        for (int i = 0; i < N; i++) {
            s_rank *g = &t->r[i];
            S_CU(cudaSetDevice(g->dev), i);
            float *dst = direct_out ? (float *)out[i] : g->out;
            for (int j = 0; j < N; j++) {
                rc = cu_codec_decode(&t->ag, sh, g->ag + (size_t)j * cap2, dst + (size_t)j * k, g->scratch, st[i], err,
                                     errlen);
                if (rc)
                    return s_codec(rc, "all-gather decode", i, j, err, errlen);
            }
            if (!direct_out) {
                if (out_type == CU_TP_BF16) {
                    k_f32_to_bf16<<<s_blocks(n), 256, 0, st[i]>>>((__nv_bfloat16 *)out[i], g->out, n);
                    S_CU(cudaGetLastError(), i);
                } else {
                    S_CU(cudaMemcpyAsync(out[i], g->out, n * 4, cudaMemcpyDeviceToDevice, st[i]), i);
                }
            }
            k_sticky<<<1, 1, 0, st[i]>>>(g->sticky, (cu_head *)g->scratch, S_PH_OUTPUT);
            S_CU(cudaGetLastError(), i);
        }
    return 0;
}

extern "C" int cu_tp_allreduce(cu_tp_t *t, void *const *in, int in_type, void *const *out, int out_type, size_t n,
                               uint64_t id, const cudaStream_t *st, int parts, char *err, size_t errlen)
{
    if (!t || !in || !out || !st || n < 1 || n > t->max_n || (in_type != CU_TP_F32 && in_type != CU_TP_BF16) ||
        (out_type != CU_TP_F32 && out_type != CU_TP_BF16) || (!t->compressed && in_type != out_type))
        return s_err(TAH_EINVAL, err, errlen, "tp all-reduce: bad arguments (n %zu of at most %zu, types %d -> %d%s)",
                     n, t ? t->max_n : 0, in_type, out_type,
                     t && !t->compressed && in_type != out_type ? ": codec none needs one type" : "");
    if (t->compressed)
        return s_twoshot(t, in, in_type, out, out_type, n, id, st, parts, err, errlen);
    S_NC(ncclGroupStart());
    for (int i = 0; i < t->n; i++)
        S_NC_IN_GROUP(ncclAllReduce(in[i], out[i], n, s_nccl_type(in_type), ncclSum, t->r[i].comm, st[i]));
    S_NC(ncclGroupEnd());
    return 0;
}

extern "C" int cu_tp_broadcast(cu_tp_t *t, float *const *buf, size_t n, int root, const cudaStream_t *st, char *err,
                               size_t errlen)
{
    if (!t || !buf || !st || root < 0 || root >= t->n)
        return s_err(TAH_EINVAL, err, errlen, "tp broadcast: bad arguments (root %d)", root);
    S_NC(ncclGroupStart());
    for (int i = 0; i < t->n; i++)
        S_NC_IN_GROUP(ncclBroadcast(buf[i], buf[i], n, ncclFloat32, root, t->r[i].comm, st[i]));
    S_NC(ncclGroupEnd());
    return 0;
}

extern "C" int cu_tp_status(cu_tp_t *t, const cudaStream_t *st, char *err, size_t errlen)
{
    unsigned int bits[CU_TP_MAX] = { 0 };
    for (int i = 0; i < t->n; i++) {
        S_CU(cudaSetDevice(t->r[i].dev), i);
        if (t->compressed)
            S_CU(cudaMemcpyAsync(&bits[i], t->r[i].sticky, sizeof bits[i], cudaMemcpyDeviceToHost, st[i]), i);
    }
    for (int i = 0; i < t->n; i++) {
        S_CU(cudaSetDevice(t->r[i].dev), i);
        S_CU(cudaStreamSynchronize(st[i]), i);
    }
    unsigned int any = 0;
    for (int i = 0; i < t->n; i++)
        any |= bits[i];
    if (!any)
        return 0;
    for (int j = 0; j < t->n; j++) {
        S_CU(cudaSetDevice(t->r[j].dev), j);
        S_CU(cudaMemsetAsync(t->r[j].sticky, 0, sizeof(unsigned int), st[j]), j);
    }
    // the earliest phase that saw something, the lowest rank; a non-finite
    // input explains what later phases saw (garbage codes, a bad payload)
    static const char *const k_what[S_NPH] = { "in the tensor to reduce (reduce-scatter encode)",
                                               "in the sum of the chunks (reduce-scatter decode, all-gather encode)",
                                               "in the decoded result (all-gather decode)" };
    for (int ph = 0; ph < S_NPH; ph++)
        for (int i = 0; i < t->n; i++) {
            const unsigned int b = (bits[i] >> (CU_ST_BITS * ph)) & ((1u << CU_ST_BITS) - 1u);
            if (b & CU_ST_NONFINITE)
                return s_err(TAH_ENONFINITE, err, errlen, "tp all-reduce, rank %d (cuda:%d): non-finite value (NaN "
                             "or Inf) %s", i, t->r[i].dev, k_what[ph]);
            if (b & CU_ST_RANGE)
                return s_err(TAH_ERANGE, err, errlen, "tp all-reduce, rank %d (cuda:%d): value out of the codec's "
                             "range %s", i, t->r[i].dev, k_what[ph]);
            if (b & CU_ST_CORRUPT)
                return s_err(TAH_ECORRUPT, err, errlen, "tp all-reduce, rank %d (cuda:%d): a payload with metadata "
                             "no encoder writes %s", i, t->r[i].dev, k_what[ph]);
        }
    return 0;
}
