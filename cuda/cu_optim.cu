// cu_optim.cu — AdamW over a stage's single parameter allocation (one
// launch: blockIdx.y = tensor, grid-stride over its elements), the
// per-segment double sums of squares for the global norm, and the
// tied-embedding sum (see cu_layers.cuh). pipeline/optim.c is the oracle.
// A tensor or segment is `rows` runs of n elements, `stride` apart (a
// tensor-parallel rank's slice of a sharded weight); rows <= 1 is one
// contiguous run, indexed without a division.
#include "cu_layers.cuh"

// element e of a strided set: run e / n, offset e % n in it
__device__ __forceinline__ size_t d_strided(size_t off, size_t n, size_t rows, size_t stride, size_t e)
{
    if (rows <= 1)
        return off + e;
    const size_t r = e / n;
    return off + r * stride + (e - r * n);
}

__global__ void k_adamw(float *p, cu_bf16 *p16, float *m, float *v, const float *g, cl_adamw_tensors t, float lr,
                        float b1, float b2, float eps, float bc1, float bc2, float grad_scale)
{
    const int k = blockIdx.y;
    const size_t off = t.off[k], n = t.n[k], rows = t.rows[k], stride = t.stride[k];
    const size_t total = rows > 1 ? rows * n : n;
    const float wd = t.wd[k];
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < total; j += (size_t)gridDim.x * blockDim.x) {
        const size_t i = d_strided(off, n, rows, stride, j);
        float gi = g[i] * grad_scale;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mh = mi / bc1, vh = vi / bc2;
        float pi = p[i];
        pi -= lr * (mh / (sqrtf(vh) + eps) + wd * pi);
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
    size_t blocks = (maxn + 255) / 256;
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

__global__ void k_sumsq(double *partials, const float *x, const unsigned long long *segs)
{
    __shared__ double sh[256];
    const int s = blockIdx.y;
    const size_t off = segs[4 * s], n = segs[4 * s + 1], rows = segs[4 * s + 2], stride = segs[4 * s + 3];
    const size_t total = rows > 1 ? rows * n : n;
    double acc = 0.0;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < total; j += (size_t)gridDim.x * blockDim.x) {
        double a = (double)x[d_strided(off, n, rows, stride, j)];
        acc += a * a;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        partials[(size_t)s * CL_SUMSQ_BLOCKS + blockIdx.x] = sh[0];
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
