// cu_colsum_probe.cu — how fast the GPU stage's bias gradients (column sums of a bf16 gradient
// of N rows) can be read, by how the kernel keeps loads in flight.
//
// The stage's k_colsum_part (cuda/cu_layers.cu) reads its tensors at about half the copy rate
// on an H200 (2.44 ms of a GPT-2 124M step for 5.4 GB). It gives each block of 8 warps one
// round of 8 loads per lane (a chunk of 64 rows), then a reduction through shared memory.
// This probe runs, on the stage's shapes (32768 rows of 768, 2304 and 3072 bf16 columns):
//   read   a plain read of the tensor (16 bytes per lane, 8 in flight, grid-stride): the ceiling;
//   cur    k_colsum_part as the stage has it, then the ordered column pass (k_colpart_sum);
//   pipeR  resident blocks over long row chunks, each lane double-buffering rounds of R rows
//          (the next round's loads issued before the current one is added), then the same
//          reduction and column pass.
// Every variant's sums are checked against a double-precision host sum (relative 1e-4).
// Not part of the build (sm_90; standalone):
//   nvcc -std=c++17 -O3 -arch=sm_90 bench/cu_colsum_probe.cu -o cu_colsum_probe
//   ./cu_colsum_probe
// One line per (shape, variant): median ms of 25 (one launch sequence between two events,
// after 3 warm-ups) and GB/s of the tensor read. Exit: 0 ok, 1 CUDA error or a wrong sum.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>

#include <algorithm>
#include <functional>
#include <vector>

#define CK(call)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            fprintf(stderr, "cu_colsum_probe: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,            \
                    cudaGetErrorString(e_));                                                          \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

// 8 bf16 of a 16-byte word, widened (exact)
__device__ __forceinline__ void d_wide8(const uint4 q, float f[8])
{
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__global__ void __launch_bounds__(256) k_read(const uint4 *__restrict__ x, size_t n16, uint32_t *sink)
{
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nt = (size_t)gridDim.x * blockDim.x;
    uint32_t a = 0;
    size_t i = t;
    for (; i + 7 * nt < n16; i += 8 * nt) {
        uint4 q[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            q[u] = __ldcs(x + i + u * nt);
#pragma unroll
        for (int u = 0; u < 8; u++)
            a ^= q[u].x ^ q[u].y ^ q[u].z ^ q[u].w;
    }
    for (; i < n16; i += nt) {
        const uint4 q = __ldcs(x + i);
        a ^= q.x ^ q.y ^ q.z ^ q.w;
    }
    if (a == 0x12345678u)
        sink[0] = a;
}

// the 8 warps' sums of the block's 32 column vectors, added in warp order, into its partial row
__device__ __forceinline__ void d_block_part(float *part, float (*sum)[32 * 8], const float acc[8], int OC, int v,
                                             int w, int lane, bool on)
{
#pragma unroll
    for (int j = 0; j < 8; j++)
        sum[w][lane * 8 + j] = acc[j];
    __syncthreads();
    if (w == 0 && on)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float a = sum[0][lane * 8 + j];
#pragma unroll
            for (int k = 1; k < 8; k++)
                a += sum[k][lane * 8 + j];
            part[(size_t)blockIdx.y * OC + v * 8 + j] = a;
        }
}

// ---- the stage's kernels (cuda/cu_layers.cu, bf16: 8 columns per 16-byte vector) ----
__global__ void __launch_bounds__(256) k_colsum_part(float *part, const __nv_bfloat16 *dout, int N, int OC, int ld,
                                                     int rows_per_chunk)
{
    constexpr int W = 8;
    __shared__ float sum[8][32 * W];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, v = blockIdx.x * 32 + lane;
    const bool on = v * W < OC;
    const int n0 = blockIdx.y * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
    float acc[W] = {};
    if (on) {
        int n = n0 + w;
        for (; n + 56 < n1; n += 64) {
            uint4 q[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                q[u] = *(const uint4 *)(dout + (size_t)(n + 8 * u) * ld + v * W);
#pragma unroll
            for (int u = 0; u < 8; u++) {
                float t[W];
                d_wide8(q[u], t);
#pragma unroll
                for (int j = 0; j < W; j++)
                    acc[j] += t[j];
            }
        }
        for (; n < n1; n += 8) {
            float t[W];
            d_wide8(*(const uint4 *)(dout + (size_t)n * ld + v * W), t);
#pragma unroll
            for (int j = 0; j < W; j++)
                acc[j] += t[j];
        }
    }
    d_block_part(part, sum, acc, OC, v, w, lane, on);
}

__global__ void __launch_bounds__(256) k_colpart_sum(float *out, const float *part, int nblocks, size_t stride, int n)
{
    __shared__ float sum[8][33];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, c = blockIdx.x * 32 + lane;
    float acc = 0.0f;
    if (c < n) {
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
    if (w == 0 && c < n) {
        float t = sum[0][lane];
#pragma unroll
        for (int k = 1; k < 8; k++)
            t += sum[k][lane];
        out[c] = t;
    }
}

// ---- pipelined: warp w of a block adds rows n0 + w + 8 i of its chunk, R rows a round, the
// next round's R loads issued before the current round is added ----
template <int R>
__global__ void __launch_bounds__(256) k_colsum_pipe(float *part, const __nv_bfloat16 *dout, int N, int OC, int ld,
                                                     int rows_per_chunk)
{
    constexpr int W = 8;
    __shared__ float sum[8][32 * W];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, v = blockIdx.x * 32 + lane;
    const bool on = v * W < OC;
    const int n0 = blockIdx.y * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
    float acc[W] = {};
    if (on) {
        const __nv_bfloat16 *p = dout + v * W;
        auto ld_round = [&](uint4 q[R], int n) {
#pragma unroll
            for (int u = 0; u < R; u++)
                q[u] = n + 8 * u < n1 ? __ldcs((const uint4 *)(p + (size_t)(n + 8 * u) * ld)) : make_uint4(0, 0, 0, 0);
        };
        auto add_round = [&](const uint4 q[R]) {
#pragma unroll
            for (int u = 0; u < R; u++) {
                float t[W];
                d_wide8(q[u], t);
#pragma unroll
                for (int j = 0; j < W; j++)
                    acc[j] += t[j];
            }
        };
        uint4 a[R], b[R];
        int n = n0 + w;
        ld_round(a, n);
        for (;;) {
            n += 8 * R;
            if (n >= n1) {
                add_round(a);
                break;
            }
            ld_round(b, n);
            add_round(a);
            n += 8 * R;
            if (n >= n1) {
                add_round(b);
                break;
            }
            ld_round(a, n);
            add_round(b);
        }
    }
    d_block_part(part, sum, acc, OC, v, w, lane, on);
}

static float s_time(const std::function<void()> &f)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++)
        f();
    std::vector<float> ms;
    for (int i = 0; i < 25; i++) {
        CK(cudaEventRecord(a));
        f();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float t;
        CK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    CK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ms[ms.size() / 2];
}

int main(void)
{
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    const int sms = pr.multiProcessorCount, N = 32768;
    printf("device %s, %d SMs\n", pr.name, sms);
    int bad = 0;
    for (int OC : {768, 2304, 3072}) {
        const size_t n = (size_t)N * OC;
        std::vector<__nv_bfloat16> h(n);
        std::vector<double> ref(OC, 0.0);
        uint32_t s = 12345u;
        for (size_t i = 0; i < n; i++) {
            s = s * 1664525u + 1013904223u;
            h[i] = __float2bfloat16((float)((s >> 8) & 0xffff) / 65536.0f - 0.4f);
            ref[i % OC] += (double)__bfloat162float(h[i]);
        }
        __nv_bfloat16 *d;
        float *part, *out;
        uint32_t *sink;
        CK(cudaMalloc(&d, n * 2));
        CK(cudaMalloc(&part, (size_t)4096 * OC * 4));
        CK(cudaMalloc(&out, (size_t)OC * 4));
        CK(cudaMalloc(&sink, 4));
        CK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
        const double gb = (double)n * 2 / 1e9;
        const int groups = (OC / 8 + 31) / 32;
        auto check = [&](const char *name) {
            std::vector<float> o(OC);
            CK(cudaMemcpy(o.data(), out, OC * 4, cudaMemcpyDeviceToHost));
            for (int c = 0; c < OC; c++)
                if (fabs(o[c] - ref[c]) > 1e-4 * fabs(ref[c]) + 1e-2) {
                    printf("  %s: column %d %.6f, want %.6f\n", name, c, o[c], ref[c]);
                    bad = 1;
                    return;
                }
        };
        float t = s_time([&] { k_read<<<sms * 8, 256>>>((const uint4 *)d, n / 8, sink); });
        printf("OC %4d  read          %.4f ms  %6.0f GB/s\n", OC, t, gb / t * 1e3);
        {
            const int chunks = 512, rows = N / chunks;
            t = s_time([&] {
                k_colsum_part<<<dim3(groups, chunks), 256>>>(part, d, N, OC, OC, rows);
                k_colpart_sum<<<(OC + 31) / 32, 256>>>(out, part, chunks, OC, OC);
            });
            check("cur");
            printf("OC %4d  cur           %.4f ms  %6.0f GB/s\n", OC, t, gb / t * 1e3);
            t = s_time([&] { k_colsum_part<<<dim3(groups, chunks), 256>>>(part, d, N, OC, OC, rows); });
            printf("OC %4d  cur part only %.4f ms  %6.0f GB/s\n", OC, t, gb / t * 1e3);
        }
        auto pipe = [&](auto RK, int per_sm) {
            constexpr int R = decltype(RK)::value;
            int chunks = (sms * per_sm + groups - 1) / groups;
            const int rows = (N + chunks - 1) / chunks;
            chunks = (N + rows - 1) / rows;
            const float tt = s_time([&] {
                k_colsum_pipe<R><<<dim3(groups, chunks), 256>>>(part, d, N, OC, OC, rows);
                k_colpart_sum<<<(OC + 31) / 32, 256>>>(out, part, chunks, OC, OC);
            });
            char name[64];
            snprintf(name, sizeof name, "pipe%d x%d", R, per_sm);
            check(name);
            printf("OC %4d  %-13s %.4f ms  %6.0f GB/s  (%d chunks of %d rows)\n", OC, name, tt, gb / tt * 1e3, chunks,
                   rows);
        };
        for (int per_sm : {2, 3, 4, 8}) {
            pipe(std::integral_constant<int, 4>{}, per_sm);
            pipe(std::integral_constant<int, 8>{}, per_sm);
        }
        CK(cudaFree(d));
        CK(cudaFree(part));
        CK(cudaFree(out));
        CK(cudaFree(sink));
    }
    return bad;
}
