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

#include "cu_layers.cuh"

#define S_BLOCK 256
#define S_LN_EPS 1e-5f /* LAYERS_LN_EPS */
#define S_GELU_SCALE 0.7978845608028654f

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

template <class X> __global__ void k_encoder_backward_wte(float *dwte, const X *dout, const int *tok, int C, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C);
        atomicAdd(&dwte[(size_t)tok[bt] * C + c], cu_ld(dout[i]));
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
cudaError_t cl_encoder_backward(float *dwte, float *dwpe, const X *dout, const int *tok, int B, int T, int C,
                                cudaStream_t st)
{
    size_t n = (size_t)B * T * C;
    k_encoder_backward_wte<X><<<s_grid(n, S_BLOCK), S_BLOCK, 0, st>>>(dwte, dout, tok, C, n);
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

// column sums: dw[c] += sum_n d[n,c] * norm[n,c] (when dw), db[c] += sum_n d[n,c]
template <class X>
__global__ void k_colsum(float *dw, float *db, const X *dout, const X *inp, const float *mean, const float *rstd,
                         int N, int C, int rows_per_chunk)
{
    __shared__ float sw[8][33], sb[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int n0 = blockIdx.y * rows_per_chunk;
    const int n1 = min(N, n0 + rows_per_chunk);
    float aw = 0.0f, ab = 0.0f;
    if (c < C) {
        for (int n = n0 + threadIdx.y; n < n1; n += 8) {
            float d = cu_ld(dout[(size_t)n * C + c]);
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
                            int N, int C, cudaStream_t st)
{
    int chunks = (N + 255) / 256;
    if (chunks > 1024)
        chunks = 1024;
    int rows = (N + chunks - 1) / chunks;
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)chunks), block(32, 8);
    k_colsum<X><<<grid, block, 0, st>>>(dw, db, dout, inp, mean, rstd, N, C, rows);
    return cudaGetLastError();
}

template <class X>
cudaError_t cl_layernorm_forward(X *out, float *mean, float *rstd, const X *inp, const float *w, const float *b,
                                 int N, int C, cudaStream_t st)
{
    k_layernorm_forward<X><<<(unsigned)((N + 7) / 8), 256, 0, st>>>(out, mean, rstd, inp, w, b, N, C);
    return cudaGetLastError();
}

template <class X>
cudaError_t cl_layernorm_backward(X *dinp, float *dw, float *db, const X *dout, const X *inp, const float *w,
                                  const float *mean, const float *rstd, int N, int C, cudaStream_t st)
{
    k_layernorm_backward_x<X><<<(unsigned)((N + 7) / 8), 256, 0, st>>>(dinp, dout, inp, w, mean, rstd, N, C);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    return s_colsum<X>(dw, db, dout, inp, mean, rstd, N, C, st);
}

template <class X> cudaError_t cl_bias_backward(float *dbias, const X *dout, int N, int OC, cudaStream_t st)
{
    return s_colsum<X>(NULL, dbias, dout, NULL, NULL, NULL, N, OC, st);
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

template <class X> cudaError_t cl_gelu_forward(X *out, const X *inp, size_t n, cudaStream_t st)
{
    k_gelu_forward<X><<<s_grid(n, S_BLOCK), S_BLOCK, 0, st>>>(out, inp, n);
    return cudaGetLastError();
}

template <class X> cudaError_t cl_gelu_backward(X *dinp, const X *inp, const X *dout, size_t n, cudaStream_t st)
{
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
    template cudaError_t cl_encoder_backward<X>(float *, float *, const X *, const int *, int, int, int,      \
                                                cudaStream_t);                                                \
    template cudaError_t cl_layernorm_forward<X>(X *, float *, float *, const X *, const float *,             \
                                                 const float *, int, int, cudaStream_t);                      \
    template cudaError_t cl_layernorm_backward<X>(X *, float *, float *, const X *, const X *, const float *, \
                                                  const float *, const float *, int, int, cudaStream_t);      \
    template cudaError_t cl_bias_backward<X>(float *, const X *, int, int, cudaStream_t);                     \
    template cudaError_t cl_gelu_forward<X>(X *, const X *, size_t, cudaStream_t);                            \
    template cudaError_t cl_gelu_backward<X>(X *, const X *, const X *, size_t, cudaStream_t);                \
    template cudaError_t cl_crossentropy_forward<X>(float *, float *, const X *, const int *, int, int, int,  \
                                                    cudaStream_t);                                            \
    template cudaError_t cl_crossentropy_backward<X>(X *, const float *, const int *, float, int, int, int,   \
                                                     cudaStream_t);
S_INST(float)
S_INST(cu_bf16)
