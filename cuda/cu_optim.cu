// cu_optim.cu — AdamW over a stage's single parameter allocation (one
// launch: blockIdx.y = tensor, grid-stride over its elements), the
// per-segment double sums of squares for the global norm, and the
// tied-embedding sum (see cu_layers.cuh). pipeline/optim.c is the oracle.
// A tensor or segment is `rows` runs of n elements, `stride` apart (a
// tensor-parallel rank's slice of a sharded weight); rows <= 1 is one
// contiguous run, indexed without a division.
#include <stdint.h>

#include "cu_layers.cuh"

// element e of a strided set: run e / n, offset e % n in it
__device__ __forceinline__ size_t d_strided(size_t off, size_t n, size_t rows, size_t stride, size_t e)
{
    if (rows <= 1)
        return off + e;
    const size_t r = e / n;
    return off + r * stride + (e - r * n);
}

// whether a set can go 4 elements at a time: every run's groups of 4 whole (one run, or
// runs of a multiple of 4 elements a multiple of 4 apart) and its first element at x's
// 16-byte aligned address (x: the set's base pointer as bytes, esz bytes an element)
__device__ __forceinline__ bool d_by4(const void *x, size_t esz, size_t off, size_t n, size_t rows, size_t stride)
{
    return ((uintptr_t)x + off * esz) % (4 * esz) == 0 && (rows <= 1 || (n % 4 == 0 && stride % 4 == 0));
}

// optim_adamw's update of one element (the same operations in the same order)
__device__ __forceinline__ float d_adamw1(float pi, float gi, float &mi, float &vi, float lr, float b1, float b2,
                                          float eps, float bc1, float bc2, float grad_scale, float wd)
{
    gi = gi * grad_scale;
    mi = b1 * mi + (1.0f - b1) * gi;
    vi = b2 * vi + (1.0f - b2) * gi * gi;
    const float mh = mi / bc1, vh = vi / bc2;
    return pi - lr * (mh / (sqrtf(vh) + eps) + wd * pi);
}

// Tensors that d_by4 allows (all of GPT-2's, whole or sharded) go 4 elements a thread at a
// time (16-byte loads and stores: more bytes in flight per thread), the rest one element at
// a time; the arithmetic is d_adamw1's either way.
__global__ void k_adamw(float *p, cu_bf16 *p16, float *m, float *v, const float *g, cl_adamw_tensors t, float lr,
                        float b1, float b2, float eps, float bc1, float bc2, float grad_scale)
{
    const int k = blockIdx.y;
    const size_t off = t.off[k], n = t.n[k], rows = t.rows[k], stride = t.stride[k];
    const size_t total = rows > 1 ? rows * n : n;
    const float wd = t.wd[k];
    const size_t j0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x, nj = (size_t)gridDim.x * blockDim.x;
    size_t done = 0; // elements before the scalar loop
    if (d_by4(p, 4, off, n, rows, stride) && d_by4(g, 4, off, n, rows, stride) && d_by4(m, 4, off, n, rows, stride) &&
        d_by4(v, 4, off, n, rows, stride) && (!p16 || d_by4(p16, 2, off, n, rows, stride))) {
        const size_t n4 = total / 4;
        for (size_t j = j0; j < n4; j += nj) {
            const size_t i = d_strided(off, n, rows, stride, 4 * j);
            const float4 gq = *(const float4 *)(g + i), pq = *(const float4 *)(p + i);
            float4 mq = *(const float4 *)(m + i), vq = *(const float4 *)(v + i);
            float4 o;
            o.x = d_adamw1(pq.x, gq.x, mq.x, vq.x, lr, b1, b2, eps, bc1, bc2, grad_scale, wd);
            o.y = d_adamw1(pq.y, gq.y, mq.y, vq.y, lr, b1, b2, eps, bc1, bc2, grad_scale, wd);
            o.z = d_adamw1(pq.z, gq.z, mq.z, vq.z, lr, b1, b2, eps, bc1, bc2, grad_scale, wd);
            o.w = d_adamw1(pq.w, gq.w, mq.w, vq.w, lr, b1, b2, eps, bc1, bc2, grad_scale, wd);
            *(float4 *)(m + i) = mq;
            *(float4 *)(v + i) = vq;
            *(float4 *)(p + i) = o;
            if (p16) {
                __nv_bfloat162 h[2] = { __floats2bfloat162_rn(o.x, o.y), __floats2bfloat162_rn(o.z, o.w) };
                *(uint2 *)(p16 + i) = *(const uint2 *)h;
            }
        }
        done = 4 * n4;
    }
    for (size_t j = done + j0; j < total; j += nj) {
        const size_t i = d_strided(off, n, rows, stride, j);
        float mi = m[i], vi = v[i];
        const float pi = d_adamw1(p[i], g[i], mi, vi, lr, b1, b2, eps, bc1, bc2, grad_scale, wd);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        if (p16)
            p16[i] = __float2bfloat16_rn(pi);
    }
}

cudaError_t cl_adamw(float *p, cu_bf16 *p16, float *m, float *v, const float *g, const cl_adamw_tensors *t, float lr,
                     float b1, float b2, float eps, float bc1, float bc2, float grad_scale, cudaStream_t st)
{
    if (t->count <= 0)
        return cudaSuccess;
    size_t maxn = 0;
    for (int k = 0; k < t->count; k++) {
        const size_t total = t->rows[k] > 1 ? t->rows[k] * t->n[k] : t->n[k];
        maxn = total > maxn ? total : maxn;
    }
    size_t blocks = (maxn / 4 + 255) / 256;
    if (blocks > 4096)
        blocks = 4096;
    dim3 grid((unsigned)(blocks ? blocks : 1), (unsigned)t->count);
    k_adamw<<<grid, 256, 0, st>>>(p, p16, m, v, g, *t, lr, b1, b2, eps, bc1, bc2, grad_scale);
    return cudaGetLastError();
}

__global__ void k_rows(float *t, cu_bf16 *t16, float *buf, const int *rows, size_t n, int C, int mode)
{
    const size_t total = n * (size_t)C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = e / (size_t)C, j = e - i * (size_t)C, k = (size_t)rows[i] * (size_t)C + j;
        if (mode == CL_ROWS_GET) {
            buf[e] = t[k];
        } else if (mode == CL_ROWS_SET) {
            t[k] = buf[e];
            if (t16)
                t16[k] = __float2bfloat16_rn(buf[e]);
        } else {
            t[k] = buf[e] + t[k];
        }
    }
}

cudaError_t cl_rows(float *t, cu_bf16 *t16, float *buf, const int *rows, size_t n, int C, int mode, cudaStream_t st)
{
    const size_t total = n * (size_t)C;
    if (total == 0)
        return cudaSuccess;
    size_t blocks = (total + 255) / 256;
    k_rows<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, st>>>(t, t16, buf, rows, n, C, mode);
    return cudaGetLastError();
}

// a += the squares of q's elements in double, in order
__device__ __forceinline__ void d_sq4(double &a, float4 q)
{
    a += (double)q.x * (double)q.x;
    a += (double)q.y * (double)q.y;
    a += (double)q.z * (double)q.z;
    a += (double)q.w * (double)q.w;
}

// Block k of segment s adds the squares of its share in double: a segment that d_by4 allows
// in 16-byte loads, four in flight per thread, each into its own accumulator (a segment of
// 38 M elements, GPT-2's wte, has only CL_SUMSQ_BLOCKS blocks; one 4-byte load in flight
// per thread kept them far below the copy rate); the rest element by element. The sums are
// combined in a fixed order (warp shuffles, then the warps in order).
__global__ void __launch_bounds__(256) k_sumsq(double *partials, const float *x, const unsigned long long *segs)
{
    __shared__ double sh[8];
    const int s = blockIdx.y;
    const size_t off = segs[4 * s], n = segs[4 * s + 1], rows = segs[4 * s + 2], stride = segs[4 * s + 3];
    const size_t total = rows > 1 ? rows * n : n;
    const size_t j0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x, nj = (size_t)gridDim.x * blockDim.x;
    double acc = 0.0;
    size_t done = 0;
    if (d_by4(x, 4, off, n, rows, stride)) {
        const size_t n4 = total / 4;
        auto ld4 = [&](size_t j) { return *(const float4 *)(x + d_strided(off, n, rows, stride, 4 * j)); };
        double a[4] = { 0.0, 0.0, 0.0, 0.0 };
        size_t j = j0;
        for (; j + 3 * nj < n4; j += 4 * nj) {
            float4 q[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                q[u] = ld4(j + u * nj);
#pragma unroll
            for (int u = 0; u < 4; u++)
                d_sq4(a[u], q[u]);
        }
        for (; j < n4; j += nj)
            d_sq4(a[0], ld4(j));
        acc = (a[0] + a[1]) + (a[2] + a[3]);
        done = 4 * n4;
    }
    for (size_t j = done + j0; j < total; j += nj) {
        const double a = (double)x[d_strided(off, n, rows, stride, j)];
        acc += a * a;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            t += sh[w];
        partials[(size_t)s * CL_SUMSQ_BLOCKS + blockIdx.x] = t;
    }
}

cudaError_t cl_sumsq(double *partials, const float *x, const unsigned long long *segs, int nseg, cudaStream_t st)
{
    if (nseg <= 0)
        return cudaSuccess;
    dim3 grid(CL_SUMSQ_BLOCKS, (unsigned)nseg);
    k_sumsq<<<grid, 256, 0, st>>>(partials, x, segs);
    return cudaGetLastError();
}

__global__ void k_tied_sum(float *a, float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = a[i] + b[i];
        a[i] = s;
        b[i] = s;
    }
}

cudaError_t cl_tied_sum(float *a, float *b, size_t n, cudaStream_t st)
{
    size_t blocks = (n + 255) / 256;
    if (blocks > 65535)
        blocks = 65535;
    k_tied_sum<<<(unsigned)(blocks ? blocks : 1), 256, 0, st>>>(a, b, n);
    return cudaGetLastError();
}
