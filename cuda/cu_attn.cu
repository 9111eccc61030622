// cu_attn.cu — causal self-attention of the CUDA stage, flash style: the
// forward keeps a running max and sum per query row (online softmax) and
// stores the row's logsumexp; the backward recomputes the probabilities
// from it. Nothing of size (T,T) is ever stored. fp32 arithmetic
// throughout (X = float or bf16 is only the storage type).
//
// Layout: qkv (B,T,3C) with q | k | v, head h at columns h*hs of each;
// out (B,T,C); lse and dsum (B,NH,T).
//
// Thread maps (one block per (tile, b*NH+h)):
//   forward   64 threads, thread = query row i of a 64-row tile; K and V
//             tiles of 64 rows staged in shared memory (every thread reads
//             the same key row: broadcast); q and the output accumulator in
//             registers.
//   dK,dV     KB threads, thread = key row j (k_j, v_j in its own padded
//             shared row, dk/dv accumulators in registers); query tiles
//             i >= j0 staged in shared memory (q pre-scaled, dout, lse,
//             dsum).
//   dQ        QB threads, thread = query row i (q_i, dout_i in its own
//             padded shared row, dq in registers); key tiles j <= i staged.
//   D = rowsum(dout * out) first, one thread per row (it equals
//   rowsum(P * dP) of layers.c's softmax backward).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "cu_layers.cuh"

// bf16 runs the tensor-core kernels (cu_flash.cu) unless TAH_CU_ATTN_LEGACY=1
static bool s_legacy(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("TAH_CU_ATTN_LEGACY");
        v = e && !strcmp(e, "1");
    }
    return v == 1;
}

template <class X, int HS>
__global__ void __launch_bounds__(64) k_attn_fwd(X *out, float *lse, const X *qkv, int T, int C, int NH, float scale)
{
    constexpr int BR = 64, BC = HS >= 128 ? 32 : 64;
    __shared__ float Ks[BC][HS], Vs[BC][HS];
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int i0 = blockIdx.x * BR, i = i0 + threadIdx.x;
    const size_t C3 = 3 * (size_t)C;
    const X *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    float q[HS], acc[HS];
    float mx = -INFINITY, l = 0.0f;
#pragma unroll
    for (int d = 0; d < HS; d++) {
        q[d] = i < T ? cu_ld(base[(size_t)i * C3 + d]) * scale : 0.0f;
        acc[d] = 0.0f;
    }
    const int jend = min(T, i0 + BR);
    for (int j0 = 0; j0 < jend; j0 += BC) {
        __syncthreads();
        for (int e = threadIdx.x; e < BC * HS; e += BR) {
            int r = e / HS, d = e % HS, j = j0 + r;
            Ks[r][d] = j < T ? cu_ld(base[(size_t)j * C3 + C + d]) : 0.0f;
            Vs[r][d] = j < T ? cu_ld(base[(size_t)j * C3 + 2 * C + d]) : 0.0f;
        }
        __syncthreads();
        if (i < T) {
            const int nk = min(BC, i - j0 + 1);
            for (int r = 0; r < nk; r++) {
                float s = 0.0f;
#pragma unroll
                for (int d = 0; d < HS; d++)
                    s += q[d] * Ks[r][d];
                if (s > mx) {
                    float corr = expf(mx - s);
                    l *= corr;
#pragma unroll
                    for (int d = 0; d < HS; d++)
                        acc[d] *= corr;
                    mx = s;
                }
                float p = expf(s - mx);
                l += p;
#pragma unroll
                for (int d = 0; d < HS; d++)
                    acc[d] += p * Vs[r][d];
            }
        }
    }
    if (i < T) {
        const float inv = 1.0f / l;
        X *o = out + ((size_t)b * T + i) * C + (size_t)h * HS;
#pragma unroll
        for (int d = 0; d < HS; d++)
            o[d] = cu_st<X>(acc[d] * inv);
        lse[(size_t)bh * T + i] = mx + logf(l);
    }
}

template <class X, int HS>
__global__ void k_attn_dsum(float *dsum, const X *dout, const X *out, int B, int T, int C, int NH)
{
    const size_t n = (size_t)B * NH * T;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) {
        const size_t bh = k / T;
        const int i = (int)(k % T), b = (int)(bh / NH), h = (int)(bh % NH);
        const size_t o = ((size_t)b * T + i) * C + (size_t)h * HS;
        float s = 0.0f;
#pragma unroll
        for (int d = 0; d < HS; d++)
            s += cu_ld(dout[o + d]) * cu_ld(out[o + d]);
        dsum[k] = s;
    }
}

template <int HS> struct s_tiles {
    static constexpr int KB = HS >= 128 ? 32 : 64; // key rows per dK/dV block (threads)
    static constexpr int QT = 1024 / HS;           // query rows per staged tile there
    static constexpr int QB = HS >= 128 ? 32 : 64; // query rows per dQ block (threads)
    static constexpr int KT = 1024 / HS;           // key rows per staged tile there
};

template <class X, int HS>
__global__ void __launch_bounds__(s_tiles<HS>::KB)
    k_attn_bwd_kv(X *dqkv, const X *dout, const float *lse, const float *dsum, const X *qkv, int T, int C, int NH,
                  float scale)
{
    constexpr int KB = s_tiles<HS>::KB, QT = s_tiles<HS>::QT;
    __shared__ float Ks[KB][HS + 1], Vs[KB][HS + 1], Qs[QT][HS], Ds[QT][HS], Ls[QT], Ss[QT];
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int j0 = blockIdx.x * KB, tid = threadIdx.x, j = j0 + tid;
    const size_t C3 = 3 * (size_t)C;
    const X *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const X *dbase = dout + (size_t)b * T * C + (size_t)h * HS;
    for (int e = tid; e < KB * HS; e += KB) {
        int r = e / HS, d = e % HS, jj = j0 + r;
        Ks[r][d] = jj < T ? cu_ld(base[(size_t)jj * C3 + C + d]) : 0.0f;
        Vs[r][d] = jj < T ? cu_ld(base[(size_t)jj * C3 + 2 * C + d]) : 0.0f;
    }
    float dk[HS], dv[HS];
#pragma unroll
    for (int d = 0; d < HS; d++)
        dk[d] = dv[d] = 0.0f;
    for (int q0 = j0; q0 < T; q0 += QT) {
        __syncthreads(); // also orders the Ks/Vs stores above before first use
        for (int e = tid; e < QT * HS; e += KB) {
            int r = e / HS, d = e % HS, ii = q0 + r;
            Qs[r][d] = ii < T ? cu_ld(base[(size_t)ii * C3 + d]) * scale : 0.0f;
            Ds[r][d] = ii < T ? cu_ld(dbase[(size_t)ii * C + d]) : 0.0f;
        }
        for (int r = tid; r < QT; r += KB) {
            int ii = q0 + r;
            Ls[r] = ii < T ? lse[(size_t)bh * T + ii] : 0.0f;
            Ss[r] = ii < T ? dsum[(size_t)bh * T + ii] : 0.0f;
        }
        __syncthreads();
        if (j < T) {
            const int r0 = max(0, j - q0), r1 = min(QT, T - q0);
            for (int r = r0; r < r1; r++) {
                float s = 0.0f, dp = 0.0f;
#pragma unroll
                for (int d = 0; d < HS; d++) {
                    s += Qs[r][d] * Ks[tid][d];
                    dp += Ds[r][d] * Vs[tid][d];
                }
                const float p = expf(s - Ls[r]);
                const float ds = p * (dp - Ss[r]);
#pragma unroll
                for (int d = 0; d < HS; d++) {
                    dv[d] += p * Ds[r][d];
                    dk[d] += ds * Qs[r][d];
                }
            }
        }
    }
    if (j < T) {
        X *o = dqkv + ((size_t)b * T + j) * C3 + (size_t)h * HS;
#pragma unroll
        for (int d = 0; d < HS; d++) {
            o[C + d] = cu_st<X>(dk[d]);
            o[2 * C + d] = cu_st<X>(dv[d]);
        }
    }
}

template <class X, int HS>
__global__ void __launch_bounds__(s_tiles<HS>::QB)
    k_attn_bwd_q(X *dqkv, const X *dout, const float *lse, const float *dsum, const X *qkv, int T, int C, int NH,
                 float scale)
{
    constexpr int QB = s_tiles<HS>::QB, KT = s_tiles<HS>::KT;
    __shared__ float Qs[QB][HS + 1], Ds[QB][HS + 1], Ks[KT][HS], Vs[KT][HS];
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int i0 = blockIdx.x * QB, tid = threadIdx.x, i = i0 + tid;
    const size_t C3 = 3 * (size_t)C;
    const X *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const X *dbase = dout + (size_t)b * T * C + (size_t)h * HS;
    for (int e = tid; e < QB * HS; e += QB) {
        int r = e / HS, d = e % HS, ii = i0 + r;
        Qs[r][d] = ii < T ? cu_ld(base[(size_t)ii * C3 + d]) * scale : 0.0f;
        Ds[r][d] = ii < T ? cu_ld(dbase[(size_t)ii * C + d]) : 0.0f;
    }
    const float L = i < T ? lse[(size_t)bh * T + i] : 0.0f;
    const float S = i < T ? dsum[(size_t)bh * T + i] : 0.0f;
    float dq[HS];
#pragma unroll
    for (int d = 0; d < HS; d++)
        dq[d] = 0.0f;
    const int jend = min(T, i0 + QB);
    for (int j0 = 0; j0 < jend; j0 += KT) {
        __syncthreads();
        for (int e = tid; e < KT * HS; e += QB) {
            int r = e / HS, d = e % HS, jj = j0 + r;
            Ks[r][d] = jj < T ? cu_ld(base[(size_t)jj * C3 + C + d]) : 0.0f;
            Vs[r][d] = jj < T ? cu_ld(base[(size_t)jj * C3 + 2 * C + d]) : 0.0f;
        }
        __syncthreads();
        if (i < T) {
            const int nk = min(KT, i - j0 + 1);
            for (int r = 0; r < nk; r++) {
                float s = 0.0f, dp = 0.0f;
#pragma unroll
                for (int d = 0; d < HS; d++) {
                    s += Qs[tid][d] * Ks[r][d];
                    dp += Ds[tid][d] * Vs[r][d];
                }
                const float ds = expf(s - L) * (dp - S);
#pragma unroll
                for (int d = 0; d < HS; d++)
                    dq[d] += ds * Ks[r][d];
            }
        }
    }
    if (i < T) {
        X *o = dqkv + ((size_t)b * T + i) * C3 + (size_t)h * HS;
#pragma unroll
        for (int d = 0; d < HS; d++)
            o[d] = cu_st<X>(dq[d] * scale);
    }
}

int cl_attention_supports(int hs)
{
    return hs == 16 || hs == 32 || hs == 64 || hs == 128;
}

template <class X, int HS>
static cudaError_t s_fwd(X *out, float *lse, const X *qkv, int B, int T, int C, int NH, cudaStream_t st)
{
    dim3 grid((unsigned)((T + 63) / 64), (unsigned)(B * NH));
    k_attn_fwd<X, HS><<<grid, 64, 0, st>>>(out, lse, qkv, T, C, NH, 1.0f / sqrtf((float)HS));
    return cudaGetLastError();
}

template <class X, int HS>
static cudaError_t s_bwd(X *dqkv, float *dsum, const X *dout, const X *out, const float *lse, const X *qkv, int B,
                         int T, int C, int NH, cudaStream_t st)
{
    const float scale = 1.0f / sqrtf((float)HS);
    size_t n = (size_t)B * NH * T, blocks = (n + 255) / 256;
    k_attn_dsum<X, HS><<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, st>>>(dsum, dout, out, B, T, C, NH);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    constexpr int KB = s_tiles<HS>::KB, QB = s_tiles<HS>::QB;
    dim3 gkv((unsigned)((T + KB - 1) / KB), (unsigned)(B * NH));
    k_attn_bwd_kv<X, HS><<<gkv, KB, 0, st>>>(dqkv, dout, lse, dsum, qkv, T, C, NH, scale);
    if ((e = cudaGetLastError()) != cudaSuccess)
        return e;
    dim3 gq((unsigned)((T + QB - 1) / QB), (unsigned)(B * NH));
    k_attn_bwd_q<X, HS><<<gq, QB, 0, st>>>(dqkv, dout, lse, dsum, qkv, T, C, NH, scale);
    return cudaGetLastError();
}

template <class X>
cudaError_t cl_attention_forward(X *out, float *lse, const X *qkv, int B, int T, int C, int NH, cudaStream_t st)
{
    if constexpr (std::is_same<X, cu_bf16>::value)
        if (!s_legacy())
            return cl_flash_forward(out, lse, qkv, B, T, C, NH, st);
    switch (C / NH) {
    case 16: return s_fwd<X, 16>(out, lse, qkv, B, T, C, NH, st);
    case 32: return s_fwd<X, 32>(out, lse, qkv, B, T, C, NH, st);
    case 64: return s_fwd<X, 64>(out, lse, qkv, B, T, C, NH, st);
    case 128: return s_fwd<X, 128>(out, lse, qkv, B, T, C, NH, st);
    default: return cudaErrorInvalidValue;
    }
}

template <class X>
cudaError_t cl_attention_backward(X *dqkv, float *dsum, const X *dout, const X *out, const float *lse, const X *qkv,
                                  int B, int T, int C, int NH, cudaStream_t st, float *const *dbias, float *part)
{
    if constexpr (std::is_same<X, cu_bf16>::value)
        if (!s_legacy())
            return cl_flash_backward(dqkv, dsum, dout, out, lse, qkv, B, T, C, NH, st, dbias, part);
    cudaError_t e;
    switch (C / NH) {
    case 16: e = s_bwd<X, 16>(dqkv, dsum, dout, out, lse, qkv, B, T, C, NH, st); break;
    case 32: e = s_bwd<X, 32>(dqkv, dsum, dout, out, lse, qkv, B, T, C, NH, st); break;
    case 64: e = s_bwd<X, 64>(dqkv, dsum, dout, out, lse, qkv, B, T, C, NH, st); break;
    case 128: e = s_bwd<X, 128>(dqkv, dsum, dout, out, lse, qkv, B, T, C, NH, st); break;
    default: return cudaErrorInvalidValue;
    }
    if (e == cudaSuccess && dbias)
        e = cl_qkv_bias_backward<X>(dbias, dqkv, B * T, C, part, st);
    return e;
}

template cudaError_t cl_attention_forward<float>(float *, float *, const float *, int, int, int, int, cudaStream_t);
template cudaError_t cl_attention_forward<cu_bf16>(cu_bf16 *, float *, const cu_bf16 *, int, int, int, int,
                                                   cudaStream_t);
template cudaError_t cl_attention_backward<float>(float *, float *, const float *, const float *, const float *,
                                                  const float *, int, int, int, int, cudaStream_t, float *const *,
                                                  float *);
template cudaError_t cl_attention_backward<cu_bf16>(cu_bf16 *, float *, const cu_bf16 *, const cu_bf16 *,
                                                    const float *, const cu_bf16 *, int, int, int, int,
                                                    cudaStream_t, float *const *, float *);
