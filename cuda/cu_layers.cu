// cu_layers.cu — the element-wise, LayerNorm, bias and cross-entropy kernels
// of the CUDA stage (see cu_layers.cuh); pipeline/layers.c is the oracle.
//
// Thread maps:
//   element-wise        one thread per element, grid-stride
//   layernorm fwd/bwd   one warp per row (lanes stride the C channels);
//                       parameter gradients: column kernel below
//   column sums         block (32, 8): lane x owns column c0 + x, the 8 rows
//                       of threads stride one chunk of rows; shared-memory
//                       sum over y, then one atomicAdd per column per chunk
//   cross-entropy       one 256-thread block per row
#include <math.h>
#include <stdint.h>

#include <type_traits> // std::integral_constant (s_by_nch), std::is_same (d_ce_exp)

#include "cu_layers.cuh"

#define S_BLOCK 256
#define S_LN_EPS 1e-5f /* LAYERS_LN_EPS */
#define S_GELU_SCALE 0.7978845608028654f

cudaError_t cl_smem_optin(const void *kernel, size_t bytes, cl_optin *state)
{
    if (bytes <= 48 * 1024)
        return cudaSuccess;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    const int known = dev >= 0 && dev < 64;
    if (known && state->bytes[dev] >= (int)bytes)
        return cudaSuccess;
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess && known)
        state->bytes[dev] = (int)bytes;
    return e;
}

static unsigned s_grid(size_t n, unsigned block)
{
    size_t g = (n + block - 1) / block;
    return (unsigned)(g < 65535u * 16u ? (g ? g : 1) : 65535u * 16u);
}

__device__ __forceinline__ float d_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float d_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// all threads of the block get the sum (max); blockDim.x a multiple of 32, <= 1024
__device__ float d_block_sum(float v, float *sh /* [32] */)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = d_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return d_warp_sum(v);
}

__device__ float d_block_max(float v, float *sh /* [32] */)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = d_warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return d_warp_max(v);
}

// ---- 16-byte vectors: 8 bf16 or 4 floats ----

template <class X> struct s_vec {
    static constexpr int W = 16 / (int)sizeof(X); // elements per 16 bytes
};
// 16 loaded bytes (4 floats or 8 bf16) as floats
template <class X> __device__ __forceinline__ void d_cvt16(float *f, uint4 v);
template <> __device__ __forceinline__ void d_cvt16<float>(float *f, uint4 v)
{
    f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
}
template <> __device__ __forceinline__ void d_cvt16<cu_bf16>(float *f, uint4 v)
{
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 t = __bfloat1622float2(h[k]);
        f[2 * k] = t.x, f[2 * k + 1] = t.y;
    }
}
// W (4 or 8) floats of a 16-byte-aligned fp32 vector
template <int W> __device__ __forceinline__ void d_ldw(float *f, const float *p)
{
#pragma unroll
    for (int i = 0; i < W; i += 4) {
        const float4 t = *(const float4 *)(p + i);
        f[i] = t.x, f[i + 1] = t.y, f[i + 2] = t.z, f[i + 3] = t.w;
    }
}
// 16 bytes at p (16-byte aligned) as floats (fp32: a float4 load, as the kernels were measured with)
template <class X> __device__ __forceinline__ void d_ld16(float *f, const X *p) { d_cvt16<X>(f, *(const uint4 *)p); }
template <> __device__ __forceinline__ void d_ld16<float>(float *f, const float *p)
{
    const float4 v = *(const float4 *)p;
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
}
// W floats as 16 bytes of X (bf16: rounded to nearest)
template <class X> __device__ __forceinline__ uint4 d_pack16(const float *f);
template <> __device__ __forceinline__ uint4 d_pack16<float>(const float *f)
{
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}
template <> __device__ __forceinline__ uint4 d_pack16<cu_bf16>(const float *f)
{
    uint4 v;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&v;
#pragma unroll
    for (int k = 0; k < 4; k++)
        h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    return v;
}
template <class X> __device__ __forceinline__ void d_st16(X *p, const float *f) { *(uint4 *)p = d_pack16<X>(f); }

static bool s_aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

// ---- conversions ----

template <class X> __global__ void k_from_f32(X *y, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = cu_st<X>(x[i]);
}

template <class X> __global__ void k_to_f32(float *y, const X *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = cu_ld(x[i]);
}

template <class X> cudaError_t cl_from_f32(X *y, const float *x, size_t n, cudaStream_t st)
{
    k_from_f32<X><<<s_grid(n, S_BLOCK), S_BLOCK, 0, st>>>(y, x, n);
    return cudaGetLastError();
}

template <class X> cudaError_t cl_to_f32(float *y, const X *x, size_t n, cudaStream_t st)
{
    k_to_f32<X><<<s_grid(n, S_BLOCK), S_BLOCK, 0, st>>>(y, x, n);
    return cudaGetLastError();
}

// ---- encoder ----

template <class X>
__global__ void k_encoder_forward(X *out, const int *tok, const float *wte, const float *wpe, int T, int C,
                                  size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        out[i] = cu_st<X>(wte[(size_t)tok[bt] * C + c] + wpe[(size_t)t * C + c]);
    }
}

// one block per distinct token u of the micro-batch (row urow[u]), its threads
// over the channels: the positions order[useg[u] .. useg[u+1]) of that token,
// ascending, added one after the other -- layers.c's order, no atomics, so
// the same bits every run
template <class X>
__global__ void k_encoder_backward_wte(float *dwte, const X *dout, const int *order, const int *useg, const int *urow,
                                       int C)
{
    const int u = blockIdx.x, k0 = useg[u], k1 = useg[u + 1];
    float *dw = dwte + (size_t)urow[u] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = dw[c];
#pragma unroll 8
        for (int k = k0; k < k1; k++) // the loads run ahead of the (ordered) additions
            acc += cu_ld(dout[(size_t)order[k] * C + c]);
        dw[c] = acc;
    }
}

// one thread per (t, c): sums over b in order
template <class X> __global__ void k_encoder_backward_wpe(float *dwpe, const X *dout, int B, int T, int C)
{
    size_t n = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int b = 0; b < B; b++)
            acc += cu_ld(dout[(size_t)b * n + i]);
        dwpe[i] += acc;
    }
}

template <class X>
cudaError_t cl_encoder_forward(X *out, const int *tok, const float *wte, const float *wpe, int B, int T, int C,
                               cudaStream_t st)
{
    size_t n = (size_t)B * T * C;
    k_encoder_forward<X><<<s_grid(n, S_BLOCK), S_BLOCK, 0, st>>>(out, tok, wte, wpe, T, C, n);
    return cudaGetLastError();
}

template <class X>
cudaError_t cl_encoder_backward(float *dwte, float *dwpe, const X *dout, const int *order, const int *useg,
                                const int *urow, int nu, int B, int T, int C, cudaStream_t st)
{
    if (nu > 0)
        k_encoder_backward_wte<X><<<nu, C < S_BLOCK ? 32 * ((C + 31) / 32) : S_BLOCK, 0, st>>>(dwte, dout, order, useg,
                                                                                           urow, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    k_encoder_backward_wpe<X><<<s_grid((size_t)T * C, S_BLOCK), S_BLOCK, 0, st>>>(dwpe, dout, B, T, C);
    return cudaGetLastError();
}

// ---- layernorm ----

template <class X>
__global__ void k_layernorm_forward(X *out, float *mean, float *rstd, const X *inp, const float *w, const float *b,
                                    int N, int C)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const X *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32)
        s += cu_ld(x[i]);
    const float m = d_warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = cu_ld(x[i]) - m;
        v += d * d;
    }
    v = d_warp_sum(v) / (float)C;
    const float rs = 1.0f / sqrtf(v + S_LN_EPS);
    X *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32)
        o[i] = cu_st<X>(rs * (cu_ld(x[i]) - m) * w[i] + b[i]);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
}

// The same with 16-byte vectors (C % W == 0, C <= 32 W S_NCH, 16-byte aligned rows): lane k holds
// vectors k, k + 32, ... of its warp's row as loaded, one memory round trip per row. (The scalar
// kernel above read x three times in 2- or 4-byte loads: ~56 us a call for GPT-2's (32768, 768)
// in bf16 on an H200.)
template <class X, int S_NCH>
__global__ void __launch_bounds__(256) k_layernorm_forward_v(X *out, float *mean, float *rstd, const X *inp,
                                                             const float *w, const float *b, int N, int C)
{
    constexpr int W = s_vec<X>::W;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const int nv = C / W;
    const X *x = inp + (size_t)row * C;
    uint4 r[S_NCH];
#pragma unroll
    for (int k = 0; k < S_NCH; k++)
        if (lane + 32 * k < nv)
            r[k] = *(const uint4 *)(x + (lane + 32 * k) * W);
    // fn(k, f) for each vector k the lane holds, f its W floats
    auto each = [&](auto fn) {
#pragma unroll
        for (int k = 0; k < S_NCH; k++)
            if (lane + 32 * k < nv) {
                float f[W];
                d_cvt16<X>(f, r[k]);
                fn(k, f);
            }
    };
    float s = 0.0f;
    each([&](int, const float *f) {
#pragma unroll
        for (int j = 0; j < W; j++)
            s += f[j];
    });
    const float m = d_warp_sum(s) / (float)C;
    float v = 0.0f;
    each([&](int, const float *f) {
#pragma unroll
        for (int j = 0; j < W; j++) {
            const float d = f[j] - m;
            v += d * d;
        }
    });
    v = d_warp_sum(v) / (float)C;
    const float rs = 1.0f / sqrtf(v + S_LN_EPS);
    X *o = out + (size_t)row * C;
    each([&](int k, float *f) {
        const int c = (lane + 32 * k) * W;
        float wv[W], bv[W];
        d_ldw<W>(wv, w + c);
        d_ldw<W>(bv, b + c);
#pragma unroll
        for (int j = 0; j < W; j++)
            f[j] = rs * (f[j] - m) * wv[j] + bv[j];
        d_st16<X>(o + c, f);
    });
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
}

template <class X>
__global__ void k_layernorm_backward_x(X *dinp, const X *dout, const X *inp, const float *w, const float *mean,
                                       const float *rstd, int N, int C)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const X *d = dout + (size_t)row * C, *x = inp + (size_t)row * C;
    X *dx = dinp + (size_t)row * C;
    const float m = mean[row], s = rstd[row];
    float a = 0.0f, bn = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float norm = (cu_ld(x[i]) - m) * s;
        float dnorm = w[i] * cu_ld(d[i]);
        a += dnorm;
        bn += dnorm * norm;
    }
    a = d_warp_sum(a) / (float)C;
    bn = d_warp_sum(bn) / (float)C;
    for (int i = lane; i < C; i += 32) {
        float norm = (cu_ld(x[i]) - m) * s;
        float dnorm = w[i] * cu_ld(d[i]);
        dx[i] = cu_st<X>(cu_ld(dx[i]) + (dnorm - a - norm * bn) * s);
    }
}

// column sums: dw[c] += sum_n d[n,c] * norm[n,c] (when dw), db[c] += sum_n d[n,c];
// dout's rows are ld apart, inp's C
template <class X>
__global__ void k_colsum(float *dw, float *db, const X *dout, const X *inp, const float *mean, const float *rstd,
                         int N, int C, int ld, int rows_per_chunk)
{
    __shared__ float sw[8][33], sb[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int n0 = blockIdx.y * rows_per_chunk;
    const int n1 = min(N, n0 + rows_per_chunk);
    float aw = 0.0f, ab = 0.0f;
    if (c < C) {
        for (int n = n0 + threadIdx.y; n < n1; n += 8) {
            float d = cu_ld(dout[(size_t)n * ld + c]);
            ab += d;
            if (dw)
                aw += d * ((cu_ld(inp[(size_t)n * C + c]) - mean[n]) * rstd[n]);
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int y = 1; y < 8; y++) {
            aw += sw[y][threadIdx.x];
            ab += sb[y][threadIdx.x];
        }
        if (dw)
            atomicAdd(&dw[c], aw);
        atomicAdd(&db[c], ab);
    }
}

template <class X>
static cudaError_t s_colsum(float *dw, float *db, const X *dout, const X *inp, const float *mean, const float *rstd,
                            int N, int C, int ld, cudaStream_t st)
{
    int chunks = (N + 255) / 256;
    if (chunks > 1024)
        chunks = 1024;
    int rows = (N + chunks - 1) / chunks;
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)chunks), block(32, 8);
    k_colsum<X><<<grid, block, 0, st>>>(dw, db, dout, inp, mean, rstd, N, C, ld, rows);
    return cudaGetLastError();
}

// Fused LayerNorm backward (C % (16-byte vector) == 0, C <= 32 * W * S_LN_NCH):
// warp per row (rows strided over the grid), lane k owns vectors k, k+32, ...
// of the row: dx += ..., and the lane's dw/db partial sums stay in registers
// across its rows; the S_LN_WARPS warps of a block add theirs into shared memory
// in warp order, the block writes part[block][2C] (dw | db), and k_colpart_sum
// adds the blocks in block order: no atomics, run-to-run reproducible.
// DS: also the column sums of dx as stored (the bias gradient of the layer that
// produced dx, which would otherwise read dx again): part[block][3C] (dw | db | ds);
// each warp adds its rows' into its own C floats of shared memory (in registers they
// would spill; as 16-byte words, quarter q of every lane's vectors together, so that
// a warp's accesses are consecutive), and the warps' are added in warp order as the
// others.
#define S_LN_NCH 8 /* most vectors per lane (C <= 2048 in bf16) */
#define S_LN_WARPS 4 /* per block: 4 blocks per SM at C <= 768 in bf16 (128 registers) */
template <class X, int S_NCH, bool DS>
__global__ void __launch_bounds__(32 * S_LN_WARPS, S_NCH <= 3 ? 4 : 1)
    k_layernorm_backward(X *dinp, float *part, const X *dout, const X *inp, const float *w, const float *mean,
                         const float *rstd, int N, int C)
{
    constexpr int W = s_vec<X>::W, NP = DS ? 3 : 2;
    extern __shared__ float s_acc[]; // [NP C], then (DS) each warp's ds [S_LN_WARPS][C]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nv = C / W;
    float4 *const s_ds = (float4 *)(s_acc + NP * C + warp * C); // [W / 4][nv]
    float aw[S_NCH][W], ab[S_NCH][W];
#pragma unroll
    for (int k = 0; k < S_NCH; k++)
#pragma unroll
        for (int j = 0; j < W; j++)
            aw[k][j] = ab[k][j] = 0.0f;
    for (int i = threadIdx.x; i < (DS ? NP + S_LN_WARPS : NP) * C; i += blockDim.x)
        s_acc[i] = 0.0f;
    if (DS)
        __syncthreads();
    for (int row = blockIdx.x * S_LN_WARPS + warp; row < N; row += gridDim.x * S_LN_WARPS) {
        const X *d = dout + (size_t)row * C, *x = inp + (size_t)row * C;
        X *dx = dinp + (size_t)row * C;
        const float m = mean[row], rs = rstd[row];
        // the row's dout, x and dx (the sum this adds to) are loaded together, one memory round
        // trip per row instead of two (the reductions sit between), and kept as loaded (packed
        // bf16: half the registers, so more rows are in flight per SM); the second pass converts
        // them again and recomputes norm and dnorm, the same operations giving the same values
        uint4 rd[S_NCH], rx[S_NCH], ro[S_NCH];
        float a = 0.0f, bn = 0.0f;
#pragma unroll
        for (int k = 0; k < S_NCH; k++) {
            const int v = lane + 32 * k;
            if (v < nv) {
                rd[k] = *(const uint4 *)(d + v * W);
                rx[k] = *(const uint4 *)(x + v * W);
                ro[k] = *(const uint4 *)(dx + v * W);
            }
        }
#pragma unroll
        for (int k = 0; k < S_NCH; k++) {
            const int v = lane + 32 * k;
            if (v < nv) {
                float dv[W], xv[W], wv[W];
                d_cvt16<X>(dv, rd[k]);
                d_cvt16<X>(xv, rx[k]);
                d_ldw<W>(wv, w + v * W);
#pragma unroll
                for (int j = 0; j < W; j++) {
                    const float norm = (xv[j] - m) * rs, dnorm = wv[j] * dv[j];
                    aw[k][j] += dv[j] * norm;
                    ab[k][j] += dv[j];
                    a += dnorm;
                    bn += dnorm * norm;
                }
            }
        }
        a = d_warp_sum(a) / (float)C;
        bn = d_warp_sum(bn) / (float)C;
#pragma unroll
        for (int k = 0; k < S_NCH; k++) {
            const int v = lane + 32 * k;
            if (v < nv) {
                float dv[W], xv[W], wv[W], o[W];
                d_cvt16<X>(dv, rd[k]);
                d_cvt16<X>(xv, rx[k]);
                d_cvt16<X>(o, ro[k]);
                d_ldw<W>(wv, w + v * W);
#pragma unroll
                for (int j = 0; j < W; j++) {
                    const float norm = (xv[j] - m) * rs, dnorm = wv[j] * dv[j];
                    o[j] += (dnorm - a - norm * bn) * rs;
                }
                const uint4 q = d_pack16<X>(o);
                *(uint4 *)(dx + v * W) = q;
                if (DS) {
                    d_cvt16<X>(o, q);
#pragma unroll
                    for (int j = 0; j < W / 4; j++) {
                        float4 t = s_ds[j * nv + v];
                        t.x += o[4 * j], t.y += o[4 * j + 1], t.z += o[4 * j + 2], t.w += o[4 * j + 3];
                        s_ds[j * nv + v] = t;
                    }
                }
            }
        }
    }
    for (int ww = 0; ww < S_LN_WARPS; ww++) {
        __syncthreads();
        if (warp == ww)
#pragma unroll
            for (int k = 0; k < S_NCH; k++) {
                const int v = lane + 32 * k;
                if (v < nv)
#pragma unroll
                    for (int j = 0; j < W; j++) {
                        s_acc[v * W + j] += aw[k][j];
                        s_acc[C + v * W + j] += ab[k][j];
                        if (DS)
                            s_acc[2 * C + v * W + j] += ((const float *)&s_ds[j / 4 * nv + v])[j % 4];
                    }
            }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NP * C; i += blockDim.x)
        part[(size_t)blockIdx.x * NP * C + i] = s_acc[i];
}

// up to 3 column vectors of n floats each, side by side in the partial rows (LayerNorm's
// dw | db | ds; attention's q | k | v bias): column c of a partial row goes to
// o[c / n][c % n] (none where that o is NULL)
struct s_cp_out {
    float *o[3];
    int n;
};

// o[c] += the sum over b < nblocks of part[b * stride + c], c < nc, in a fixed order (the
// same bits every run): a block of 8 warps per 32 columns (S_CP_THREADS), warp w adds rows
// b = w, w + 8, ... in order, eight loads in flight, and the 8 sums are added in warp order.
// (One thread per column adding all rows in a chain, as before, took 60-150 us a call: a
// dependent L2 round trip per row on 3 blocks for C = 768; ~5 ms of a GPT-2 bf16 step.)
// One launch for all of a LayerNorm's vectors: each launch is ~5 us of latency.
#define S_CP_THREADS 256
__global__ void __launch_bounds__(S_CP_THREADS) k_colpart_sum(s_cp_out out, const float *part, int nblocks,
                                                              size_t stride, int nc)
{
    __shared__ float sum[S_CP_THREADS / 32][33];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, c = blockIdx.x * 32 + lane;
    float acc = 0.0f;
    if (c < nc) {
        int b = w;
        for (; b + 56 < nblocks; b += 64) {
            float t[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                t[u] = part[(size_t)(b + 8 * u) * stride + c];
#pragma unroll
            for (int u = 0; u < 8; u++)
                acc += t[u];
        }
        for (; b < nblocks; b += 8)
            acc += part[(size_t)b * stride + c];
    }
    sum[w][lane] = acc;
    __syncthreads();
    if (w == 0 && c < nc) {
        float t = sum[0][lane];
#pragma unroll
        for (int k = 1; k < S_CP_THREADS / 32; k++)
            t += sum[k][lane];
        const int q = c / out.n;
        if (out.o[q])
            out.o[q][c - q * out.n] += t;
    }
}
static unsigned s_cp_grid(int n) { return (unsigned)((n + 31) / 32); }
cudaError_t cl_colpart_sum(float *const *out, int np, int n, const float *part, int nblocks, cudaStream_t st)
{
    if (np < 1 || np > 3)
        return cudaErrorInvalidValue;
    s_cp_out o = { { NULL, NULL, NULL }, n };
    for (int i = 0; i < np; i++)
        o.o[i] = out[i];
    k_colpart_sum<<<s_cp_grid(np * n), S_CP_THREADS, 0, st>>>(o, part, nblocks, (size_t)np * n, np * n);
    return cudaGetLastError();
}

// Column sums db[c] += sum_n d[n,c], deterministic: grid (groups of 32 16-byte column vectors,
// CL_COLPART_CHUNKS row chunks), a block of 8 warps per (group, chunk): warp w adds the chunk's
// rows w, w + 8, ... (ld apart; 8 loads in flight), lane l the group's vector l; the 8 warps'
// sums are added in warp order into part[chunk][OC], then k_colpart_sum. (A thread per vector
// over all its chunk's rows, 3 warps per block for OC = 768, had too few loads in flight:
// ~1.9 TB/s on an H200.)
template <class X>
__global__ void __launch_bounds__(256) k_colsum_part(float *part, const X *dout, int N, int OC, int ld,
                                                     int rows_per_chunk)
{
    constexpr int W = s_vec<X>::W;
    __shared__ float sum[8][32 * W];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, v = blockIdx.x * 32 + lane;
    const bool on = v * W < OC;
    const int n0 = blockIdx.y * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
    float acc[W];
#pragma unroll
    for (int j = 0; j < W; j++)
        acc[j] = 0.0f;
    if (on) {
        int n = n0 + w;
        for (; n + 56 < n1; n += 64) {
            float t[8][W];
#pragma unroll
            for (int u = 0; u < 8; u++)
                d_ld16<X>(t[u], dout + (size_t)(n + 8 * u) * ld + v * W);
#pragma unroll
            for (int u = 0; u < 8; u++)
#pragma unroll
                for (int j = 0; j < W; j++)
                    acc[j] += t[u][j];
        }
        for (; n < n1; n += 8) {
            float t[W];
            d_ld16<X>(t, dout + (size_t)n * ld + v * W);
#pragma unroll
            for (int j = 0; j < W; j++)
                acc[j] += t[j];
        }
    }
#pragma unroll
    for (int j = 0; j < W; j++)
        sum[w][lane * W + j] = acc[j];
    __syncthreads();
    if (w == 0 && on)
#pragma unroll
        for (int j = 0; j < W; j++) {
            float a = sum[0][lane * W + j];
#pragma unroll
            for (int k = 1; k < 8; k++)
                a += sum[k][lane * W + j];
            part[(size_t)blockIdx.y * OC + v * W + j] = a;
        }
}

// f(std::integral_constant<int, K>{}) for the smallest K of {1, 2, 3, 4, 6, 8} >= nch (the
// LayerNorm kernels' 16-byte vectors per lane; nch <= S_LN_NCH)
template <class F> static cudaError_t s_by_nch(int nch, F f)
{
    if (nch <= 1)
        return f(std::integral_constant<int, 1>{});
    if (nch <= 2)
        return f(std::integral_constant<int, 2>{});
    if (nch <= 3)
        return f(std::integral_constant<int, 3>{});
    if (nch <= 4)
        return f(std::integral_constant<int, 4>{});
    if (nch <= 6)
        return f(std::integral_constant<int, 6>{});
    return f(std::integral_constant<int, 8>{});
}

template <class X>
cudaError_t cl_layernorm_forward(X *out, float *mean, float *rstd, const X *inp, const float *w, const float *b,
                                 int N, int C, cudaStream_t st)
{
    constexpr int W = s_vec<X>::W;
    const unsigned grid = (unsigned)((N + 7) / 8);
    const int nch = (C / W + 31) / 32;
    if (C % W == 0 && nch <= S_LN_NCH && s_aligned16(out) && s_aligned16(inp) && s_aligned16(w) && s_aligned16(b))
        return s_by_nch(nch, [&](auto K) {
            k_layernorm_forward_v<X, decltype(K)::value><<<grid, 256, 0, st>>>(out, mean, rstd, inp, w, b, N, C);
            return cudaGetLastError();
        });
    k_layernorm_forward<X><<<grid, 256, 0, st>>>(out, mean, rstd, inp, w, b, N, C);
    return cudaGetLastError();
}

template <class X>
cudaError_t cl_layernorm_backward(X *dinp, float *dw, float *db, const X *dout, const X *inp, const float *w,
                                  const float *mean, const float *rstd, int N, int C, float *part, cudaStream_t st,
                                  float *ds)
{
    constexpr int W = s_vec<X>::W;
    if (part && C % W == 0 && C <= 32 * W * S_LN_NCH && s_aligned16(dinp) && s_aligned16(dout) &&
        s_aligned16(inp) && s_aligned16(w)) {
        const size_t sm = (ds ? 3 + S_LN_WARPS : 2) * (size_t)C * sizeof(float); // <= 56 KB (C <= 2048)
        int nb = (N + S_LN_WARPS - 1) / S_LN_WARPS;
        if (nb > CL_COLPART_BLOCKS)
            nb = CL_COLPART_BLOCKS;
        const int nch = (C / W + 31) / 32;
        auto launch = [&](auto K, auto DS) {
            const void *kern = (const void *)k_layernorm_backward<X, decltype(K)::value, decltype(DS)::value>;
            static cl_optin optin_; // one per instantiation: per element type, K and DS
            cudaError_t oe = cl_smem_optin(kern, sm, &optin_);
            if (oe != cudaSuccess)
                return oe;
            k_layernorm_backward<X, decltype(K)::value, decltype(DS)::value>
                <<<(unsigned)nb, 32 * S_LN_WARPS, sm, st>>>(dinp, part, dout, inp, w, mean, rstd, N, C);
            return cudaGetLastError();
        };
        cudaError_t e = s_by_nch(nch, [&](auto K) {
            return ds ? launch(K, std::true_type{}) : launch(K, std::false_type{});
        });
        if (e != cudaSuccess)
            return e;
        float *const o[3] = { dw, db, ds };
        return cl_colpart_sum(o, ds ? 3 : 2, C, part, nb, st);
    }
    k_layernorm_backward_x<X><<<(unsigned)((N + 7) / 8), 256, 0, st>>>(dinp, dout, inp, w, mean, rstd, N, C);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = s_colsum<X>(dw, db, dout, inp, mean, rstd, N, C, C, st);
    if (e == cudaSuccess && ds)
        e = cl_bias_backward<X>(ds, dinp, N, C, part, st, C);
    return e;
}

template <class X>
cudaError_t cl_bias_backward(float *dbias, const X *dout, int N, int OC, float *part, cudaStream_t st, int ld)
{
    constexpr int W = s_vec<X>::W;
    if (ld <= 0)
        ld = OC;
    if (part && OC % W == 0 && ld % W == 0 && s_aligned16(dout)) {
        int chunks = (N + 63) / 64;
        if (chunks > CL_COLPART_CHUNKS)
            chunks = CL_COLPART_CHUNKS;
        const int rows = (N + chunks - 1) / chunks, nv = OC / W;
        dim3 grid((unsigned)((nv + 31) / 32), (unsigned)chunks);
        k_colsum_part<X><<<grid, 256, 0, st>>>(part, dout, N, OC, ld, rows);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return e;
        return cl_colpart_sum(&dbias, 1, OC, part, chunks, st);
    }
    return s_colsum<X>(NULL, dbias, dout, NULL, NULL, NULL, N, OC, ld, st);
}

template <class X>
cudaError_t cl_qkv_bias_backward(float *const *dbias, const X *dqkv, int N, int C, float *part, cudaStream_t st)
{
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 3 && e == cudaSuccess; i++)
        if (dbias[i])
            e = cl_bias_backward<X>(dbias[i], dqkv + (size_t)i * C, N, C, part, st, 3 * C);
    return e;
}

// ---- residual + bias after a compressed all-reduce (element-wise) ----

template <class X>
__global__ void k_residual_bias(X *out, const X *x, const float *sum, const float *bias, size_t n, int C)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = cu_st<X>(cu_ld(x[i]) + sum[i] + bias[i % (size_t)C]);
}

template <class X>
cudaError_t cl_residual_bias(X *out, const X *x, const float *sum, const float *bias, int N, int C, cudaStream_t st)
{
    const size_t n = (size_t)N * C;
    k_residual_bias<X><<<s_grid(n, S_BLOCK), S_BLOCK, 0, st>>>(out, x, sum, bias, n, C);
    return cudaGetLastError();
}

// ---- GELU (tanh approximation, layers.c's formula) ----

__device__ __forceinline__ float d_tanh(float u)
{
    float e = expf(-2.0f * fabsf(u));
    float t = (1.0f - e) / (1.0f + e);
    return u < 0.0f ? -t : t;
}

template <class X> __global__ void k_gelu_forward(X *out, const X *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = cu_ld(inp[i]);
        float cube = 0.044715f * x * x * x;
        out[i] = cu_st<X>(0.5f * x * (1.0f + d_tanh(S_GELU_SCALE * (x + cube))));
    }
}

template <class X> __global__ void k_gelu_backward(X *dinp, const X *inp, const X *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = cu_ld(inp[i]);
        float cube = 0.044715f * x * x * x;
        float th = d_tanh(S_GELU_SCALE * (x + cube));
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) + x * 0.5f * sech2 * S_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = cu_st<X>(local * cu_ld(dout[i]));
    }
}

__device__ __forceinline__ float d_gelu(float x)
{
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + d_tanh(S_GELU_SCALE * (x + cube)));
}

__device__ __forceinline__ float d_dgelu(float x)
{
    float cube = 0.044715f * x * x * x;
    float th = d_tanh(S_GELU_SCALE * (x + cube));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + x * 0.5f * sech2 * S_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

// 16-byte vectors, one per thread per grid-stride step (n % W == 0)
template <class X> __global__ void k_gelu_forward_v(X *out, const X *inp, size_t nv)
{
    constexpr int W = s_vec<X>::W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nv; i += (size_t)gridDim.x * blockDim.x) {
        float f[W];
        d_ld16<X>(f, inp + i * W);
#pragma unroll
        for (int j = 0; j < W; j++)
            f[j] = d_gelu(f[j]);
        d_st16<X>(out + i * W, f);
    }
}

template <class X> __global__ void k_gelu_backward_v(X *dinp, const X *inp, const X *dout, size_t nv)
{
    constexpr int W = s_vec<X>::W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nv; i += (size_t)gridDim.x * blockDim.x) {
        float x[W], d[W];
        d_ld16<X>(x, inp + i * W);
        d_ld16<X>(d, dout + i * W);
#pragma unroll
        for (int j = 0; j < W; j++)
            d[j] *= d_dgelu(x[j]);
        d_st16<X>(dinp + i * W, d);
    }
}

template <class X> cudaError_t cl_gelu_forward(X *out, const X *inp, size_t n, cudaStream_t st)
{
    constexpr int W = s_vec<X>::W;
    if (n % W == 0 && s_aligned16(out) && s_aligned16(inp)) {
        k_gelu_forward_v<X><<<s_grid(n / W, S_BLOCK), S_BLOCK, 0, st>>>(out, inp, n / W);
        return cudaGetLastError();
    }
    k_gelu_forward<X><<<s_grid(n, S_BLOCK), S_BLOCK, 0, st>>>(out, inp, n);
    return cudaGetLastError();
}

template <class X> cudaError_t cl_gelu_backward(X *dinp, const X *inp, const X *dout, size_t n, cudaStream_t st)
{
    constexpr int W = s_vec<X>::W;
    if (n % W == 0 && s_aligned16(dinp) && s_aligned16(inp) && s_aligned16(dout)) {
        k_gelu_backward_v<X><<<s_grid(n / W, S_BLOCK), S_BLOCK, 0, st>>>(dinp, inp, dout, n / W);
        return cudaGetLastError();
    }
    k_gelu_backward<X><<<s_grid(n, S_BLOCK), S_BLOCK, 0, st>>>(dinp, inp, dout, n);
    return cudaGetLastError();
}

// ---- softmax + cross-entropy ----

template <class X>
__global__ void k_ce_forward(float *losses, float *lse, const X *logits, const int *targets, int V, int Vp)
{
    __shared__ float sh[32];
    const size_t row = blockIdx.x;
    const X *x = logits + row * Vp;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, cu_ld(x[i]));
    mx = d_block_max(mx, sh);
    float s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        s += expf(cu_ld(x[i]) - mx);
    s = d_block_sum(s, sh);
    if (threadIdx.x == 0) {
        float l = mx + logf(s);
        lse[row] = l;
        losses[row] = l - cu_ld(x[targets[row]]);
    }
}

template <class X>
__global__ void k_ce_backward(X *logits, const float *lse, const int *targets, float dloss, int V, int Vp)
{
    const size_t row = blockIdx.x;
    X *x = logits + row * Vp;
    const float l = lse[row];
    const int tg = targets[row];
    for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
        float g = i < V ? (expf(cu_ld(x[i]) - l) - (i == tg ? 1.0f : 0.0f)) * dloss : 0.0f;
        x[i] = cu_st<X>(g);
    }
}

// e^(a - b) as the fused cross-entropy takes it, a <= b always (a logit and the row's max or
// logsumexp): expf for fp32 logits (the CPU stage's values to the last digits); for bf16
// logits, whose values carry 8 significant bits, cl_exp2(a log2 e - b log2 e) by one FFMA,
// b log2 e hoisted by the compiler where b is fixed.
template <class X> __device__ __forceinline__ float d_ce_exp(float a, float b)
{
    constexpr float L2E = 1.4426950408889634f;
    if constexpr (std::is_same<X, float>::value)
        return expf(a - b);
    else
        return cl_exp2(__fmaf_rn(a, L2E, -b * L2E));
}

// Fused cross-entropy (Vp % W == 0): one block per row, 16-byte loads;
// pass 1 an online max / sum per thread, merged over the block; pass 2
// (the row is mostly still in L2) writes softmax - onehot over the logits
// (padding columns 0), unscaled: the head's backward GEMMs take dloss as
// their alpha.
template <class X>
__global__ void __launch_bounds__(256) k_ce_fused(float *losses, float *lse, X *logits, const int *targets, int V,
                                                  int Vp)
{
    constexpr int W = s_vec<X>::W;
    __shared__ float shm[32], shs[32];
    const size_t row = blockIdx.x;
    X *x = logits + row * Vp;
    const int nv = Vp / W;
    float mx = -INFINITY, sum = 0.0f;
    for (int v = threadIdx.x; v < nv; v += blockDim.x) {
        float f[W];
        d_ld16<X>(f, x + v * W);
        float lm = mx;
#pragma unroll
        for (int j = 0; j < W; j++)
            if (v * W + j < V)
                lm = fmaxf(lm, f[j]);
        if (lm > mx) {
            sum *= d_ce_exp<X>(mx, lm);
            mx = lm;
        }
#pragma unroll
        for (int j = 0; j < W; j++)
            if (v * W + j < V)
                sum += d_ce_exp<X>(f[j], mx);
    }
    // merge (mx, sum) over the warp, then the block
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, mx, o), os = __shfl_xor_sync(0xffffffffu, sum, o);
        const float nm = fmaxf(mx, om);
        sum = (mx == -INFINITY ? 0.0f : sum * d_ce_exp<X>(mx, nm)) +
              (om == -INFINITY ? 0.0f : os * d_ce_exp<X>(om, nm));
        mx = nm;
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        shm[w] = mx;
        shs[w] = sum;
    }
    __syncthreads();
    if (w == 0) {
        mx = lane < nw ? shm[lane] : -INFINITY;
        sum = lane < nw ? shs[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) {
            const float om = __shfl_xor_sync(0xffffffffu, mx, o), os = __shfl_xor_sync(0xffffffffu, sum, o);
            const float nm = fmaxf(mx, om);
            sum = (mx == -INFINITY ? 0.0f : sum * d_ce_exp<X>(mx, nm)) +
                  (om == -INFINITY ? 0.0f : os * d_ce_exp<X>(om, nm));
            mx = nm;
        }
        if (lane == 0) {
            const float l = mx + logf(sum);
            shm[0] = l;
            lse[row] = l;
            losses[row] = l - cu_ld(x[targets[row]]);
        }
    }
    __syncthreads();
    const float l = shm[0];
    const int tg = targets[row];
    for (int v = threadIdx.x; v < nv; v += blockDim.x) {
        float f[W];
        d_ld16<X>(f, x + v * W);
#pragma unroll
        for (int j = 0; j < W; j++) {
            const int i = v * W + j;
            f[j] = i < V ? d_ce_exp<X>(f[j], l) - (i == tg ? 1.0f : 0.0f) : 0.0f;
        }
        d_st16<X>(x + v * W, f);
    }
}

template <class X>
int cl_crossentropy_fusable(const X *logits, int Vp)
{
    return Vp % s_vec<X>::W == 0 && s_aligned16(logits);
}

template <class X>
cudaError_t cl_crossentropy_fused(float *losses, float *lse, X *logits, const int *targets, int N, int V, int Vp,
                                  cudaStream_t st)
{
    k_ce_fused<X><<<(unsigned)N, 256, 0, st>>>(losses, lse, logits, targets, V, Vp);
    return cudaGetLastError();
}

template <class X>
cudaError_t cl_crossentropy_forward(float *losses, float *lse, const X *logits, const int *targets, int N, int V,
                                    int Vp, cudaStream_t st)
{
    k_ce_forward<X><<<(unsigned)N, 256, 0, st>>>(losses, lse, logits, targets, V, Vp);
    return cudaGetLastError();
}

template <class X>
cudaError_t cl_crossentropy_backward(X *logits, const float *lse, const int *targets, float dloss, int N, int V,
                                     int Vp, cudaStream_t st)
{
    k_ce_backward<X><<<(unsigned)N, 256, 0, st>>>(logits, lse, targets, dloss, V, Vp);
    return cudaGetLastError();
}

#define S_INST(X)                                                                                             \
    template cudaError_t cl_from_f32<X>(X *, const float *, size_t, cudaStream_t);                            \
    template cudaError_t cl_to_f32<X>(float *, const X *, size_t, cudaStream_t);                              \
    template cudaError_t cl_encoder_forward<X>(X *, const int *, const float *, const float *, int, int, int, \
                                               cudaStream_t);                                                 \
    template cudaError_t cl_encoder_backward<X>(float *, float *, const X *, const int *, const int *,        \
                                                const int *, int, int, int, int, cudaStream_t);               \
    template cudaError_t cl_layernorm_forward<X>(X *, float *, float *, const X *, const float *,             \
                                                 const float *, int, int, cudaStream_t);                      \
    template cudaError_t cl_layernorm_backward<X>(X *, float *, float *, const X *, const X *, const float *, \
                                                  const float *, const float *, int, int, float *,            \
                                                  cudaStream_t, float *);                                     \
    template cudaError_t cl_bias_backward<X>(float *, const X *, int, int, float *, cudaStream_t, int);       \
    template cudaError_t cl_qkv_bias_backward<X>(float *const *, const X *, int, int, float *, cudaStream_t); \
    template cudaError_t cl_residual_bias<X>(X *, const X *, const float *, const float *, int, int,          \
                                             cudaStream_t);                                                   \
    template int cl_crossentropy_fusable<X>(const X *, int);                                                  \
    template cudaError_t cl_crossentropy_fused<X>(float *, float *, X *, const int *, int, int, int,          \
                                                  cudaStream_t);                                              \
    template cudaError_t cl_gelu_forward<X>(X *, const X *, size_t, cudaStream_t);                            \
    template cudaError_t cl_gelu_backward<X>(X *, const X *, const X *, size_t, cudaStream_t);                \
    template cudaError_t cl_crossentropy_forward<X>(float *, float *, const X *, const int *, int, int, int,  \
                                                    cudaStream_t);                                            \
    template cudaError_t cl_crossentropy_backward<X>(X *, const float *, const int *, float, int, int, int,   \
                                                     cudaStream_t);
S_INST(float)
S_INST(cu_bf16)
