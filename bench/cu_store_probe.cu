// cu_store_probe.cu — how fast a kernel with a decoder's traffic (1 byte read, 4 bytes written
// per element) or an 8-bit encoder's (4 read, 1 written) can run, by how it stores and loads
// (round 23's probe; figures and conclusions in cuda/NOTES.md, "Twenty-fourth version").
//
// The codec decoders reach 77-79 % of the device-to-device copy rate on an H200, which is also
// what bench_cu_codec's trivial kernel of the same traffic reaches (cuda/cu_bench.cu): plain
// 16-byte stores. This probe asks whether the store path itself is the limit: the same traffic
// with plain stores (st.global.v4, and .cs), with stores from shared memory by the bulk copy
// engine (cp.async.bulk.global.shared::cta, one 4 or 8 KB copy per warp and chunk, two or
// three buffers per warp), and write-only forms of each beside cudaMemsetAsync. For the
// encoders' traffic: plain loads with U float4 per lane in flight, against bulk loads into
// shared memory completing on an mbarrier, two or three stages deep.
//
// Each variant's output is checked on the host. Not part of the build (sm_90; standalone):
//   nvcc -std=c++17 -O3 -arch=sm_90 bench/cu_store_probe.cu -o cu_store_probe
//   ./cu_store_probe [--csv FILE]
// One line per variant: queued ms (one launch between two events, median of 25 after 3
// warm-ups), back-to-back ms (8 launches between two events, / 8), and each as % of the
// measured device-to-device copy rate (bytes read + written). Exit: 0 ok, 1 CUDA error or a
// wrong output, 2 usage.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <vector>

#define CK(call)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            fprintf(stderr, "cu_store_probe: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,             \
                    cudaGetErrorString(e_));                                                          \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

static const uint32_t N = 8u * 1024u * 1600u; // elements: the codec bench's tensor

// the decoders' element: code byte c -> c * 0.5 + 1 (exact)
__device__ __forceinline__ float4 d_dec4(uint32_t w)
{
    return make_float4((float)(w & 0xffu) * 0.5f + 1.0f, (float)((w >> 8) & 0xffu) * 0.5f + 1.0f,
                       (float)((w >> 16) & 0xffu) * 0.5f + 1.0f, (float)(w >> 24) * 0.5f + 1.0f);
}

// ---- decoder traffic, plain stores: warp chunk of U x 128 elements, lane 4 per row ----
template <int U, bool CS>
__global__ void __launch_bounds__(256)
    k_dec_plain(const uint32_t *__restrict__ in, float4 *__restrict__ out, uint32_t nchunk)
{
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t w = (blockIdx.x * blockDim.x + threadIdx.x) / 32u, nw = gridDim.x * blockDim.x / 32u;
    for (uint32_t c = w; c < nchunk; c += nw) {
        uint32_t v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            v[u] = in[(size_t)c * 32u * U + 32u * u + lane];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float4 *o = out + (size_t)c * 32u * U + 32u * u + lane;
            if (CS)
                __stcs(o, d_dec4(v[u]));
            else
                *o = d_dec4(v[u]);
        }
    }
}

__device__ __forceinline__ void d_bulk_store(float4 *dst, uint32_t src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
template <int K>
__device__ __forceinline__ void d_bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(K) : "memory");
}

// ---- decoder traffic, bulk stores: warp chunk of BYTES/4 elements through a shared buffer ----
template <int BYTES, int NB>
__global__ void __launch_bounds__(128)
    k_dec_bulk(const uint32_t *__restrict__ in, float4 *__restrict__ out, uint32_t nchunk)
{
    extern __shared__ __align__(128) float4 sm[];
    constexpr int R = BYTES / 512; // rows of 32 float4 per chunk
    const uint32_t lane = threadIdx.x & 31u, wid = threadIdx.x >> 5;
    const uint32_t w = blockIdx.x * 4u + wid, nw = gridDim.x * 4u;
    float4 *wb = sm + (size_t)wid * NB * (BYTES / 16);
    uint32_t it = 0;
    for (uint32_t c = w; c < nchunk; c += nw, it++) {
        uint32_t v[R];
#pragma unroll
        for (int u = 0; u < R; u++)
            v[u] = in[(size_t)c * 32u * R + 32u * u + lane];
        float4 *b = wb + (it % NB) * (BYTES / 16);
        if (lane == 0)
            d_bulk_wait_read<NB - 1>(); // the buffer's previous copy has read it
        __syncwarp();
#pragma unroll
        for (int u = 0; u < R; u++)
            b[32u * u + lane] = d_dec4(v[u]);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncwarp();
        if (lane == 0)
            d_bulk_store(out + (size_t)c * 32u * R, (uint32_t)__cvta_generic_to_shared(b), BYTES);
    }
    if (lane == 0)
        d_bulk_wait_read<0>(); // shared memory must outlive the copies' reads
}

// ---- write only ----
template <bool CS>
__global__ void __launch_bounds__(256)
    k_wr_plain(float4 *__restrict__ out, uint32_t n4)
{
    const float4 v = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
        if (CS)
            __stcs(out + i, v);
        else
            out[i] = v;
    }
}

template <int BYTES, int NB>
__global__ void __launch_bounds__(128)
    k_wr_bulk(float4 *__restrict__ out, uint32_t nchunk)
{
    extern __shared__ __align__(128) float4 sm[];
    const uint32_t lane = threadIdx.x & 31u, wid = threadIdx.x >> 5;
    const uint32_t w = blockIdx.x * 4u + wid, nw = gridDim.x * 4u;
    float4 *b = sm + (size_t)wid * (BYTES / 16);
    for (uint32_t i = lane; i < BYTES / 16; i += 32u)
        b[i] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
    if (lane == 0) {
        uint32_t k = 0;
        for (uint32_t c = w; c < nchunk; c += nw, k++) {
            if (k >= (uint32_t)NB)
                d_bulk_wait_read<NB - 1>();
            d_bulk_store(out + (size_t)c * (BYTES / 16), (uint32_t)__cvta_generic_to_shared(b), BYTES);
        }
        d_bulk_wait_read<0>();
    }
}

// ---- encoder traffic (4 read, 1 written): the byte is bits 23..30 of |x| ----
__device__ __forceinline__ uint32_t d_enc4(float4 f)
{
    return ((__float_as_uint(f.x) >> 23) & 0xffu) | (((__float_as_uint(f.y) >> 23) & 0xffu) << 8) |
           (((__float_as_uint(f.z) >> 23) & 0xffu) << 16) | (((__float_as_uint(f.w) >> 23) & 0xffu) << 24);
}

template <int U>
__global__ void __launch_bounds__(256)
    k_enc_plain(const float4 *__restrict__ x, uint32_t *__restrict__ out, uint32_t nchunk)
{
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t w = (blockIdx.x * blockDim.x + threadIdx.x) / 32u, nw = gridDim.x * blockDim.x / 32u;
    for (uint32_t c = w; c < nchunk; c += nw) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            v[u] = x[(size_t)c * 32u * U + 32u * u + lane];
#pragma unroll
        for (int u = 0; u < U; u++)
            out[(size_t)c * 32u * U + 32u * u + lane] = d_enc4(v[u]);
    }
}

// bulk loads of BYTES per warp chunk, NB stages, completion on an mbarrier per stage
template <int BYTES, int NB>
__global__ void __launch_bounds__(128)
    k_enc_bulk(const float4 *__restrict__ x, uint32_t *__restrict__ out, uint32_t nchunk)
{
    extern __shared__ __align__(128) float4 sm[];
    __shared__ __align__(8) unsigned long long mbar[4][NB];
    constexpr int R = BYTES / 512;
    const uint32_t lane = threadIdx.x & 31u, wid = threadIdx.x >> 5;
    const uint32_t w = blockIdx.x * 4u + wid, nw = gridDim.x * 4u;
    float4 *wb = sm + (size_t)wid * NB * (BYTES / 16);
    if (lane == 0)
        for (int s = 0; s < NB; s++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((uint32_t)__cvta_generic_to_shared(&mbar[wid][s]))
                         : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncwarp();
    auto issue = [&](uint32_t c, uint32_t s) {
        if (lane == 0 && c < nchunk) {
            const uint32_t mb = (uint32_t)__cvta_generic_to_shared(&mbar[wid][s]);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mb), "n"(BYTES) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                             (uint32_t)__cvta_generic_to_shared(wb + s * (BYTES / 16))),
                         "l"(x + (size_t)c * (BYTES / 16)), "n"(BYTES), "r"(mb)
                         : "memory");
        }
    };
    for (int s = 0; s < NB - 1; s++)
        issue(w + (uint32_t)s * nw, (uint32_t)s);
    uint32_t it = 0;
    for (uint32_t c = w; c < nchunk; c += nw, it++) {
        const uint32_t s = it % NB;
        issue(c + (uint32_t)(NB - 1) * nw, (it + NB - 1) % NB); // its buffer was read last iteration
        asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(
                         (uint32_t)__cvta_generic_to_shared(&mbar[wid][s])),
                     "r"((it / NB) & 1u)
                     : "memory");
        const float4 *b = wb + s * (BYTES / 16);
        uint32_t o[R];
#pragma unroll
        for (int u = 0; u < R; u++)
            o[u] = d_enc4(b[32u * u + lane]);
        __syncwarp(); // every lane has read the stage before lane 0 refills it next iteration
#pragma unroll
        for (int u = 0; u < R; u++)
            out[(size_t)c * 32u * R + 32u * u + lane] = o[u];
    }
}

// ---- int-encoder skeletons (4 bytes read, half a byte written per element) ----
// k_int_row's shape without its arithmetic: a CTA of NW warps takes a block of NW * U rows of
// 128 floats; per row a warp max (one redux), the block's max through shared memory and one
// CTA barrier, then per row 2 bytes per lane (its 4 elements' nibbles scaled by the block max).
__device__ __forceinline__ uint32_t d_nib4(float4 f, float inv)
{
    const uint32_t a = (uint32_t)(fabsf(f.x) * inv), b = (uint32_t)(fabsf(f.y) * inv);
    const uint32_t c = (uint32_t)(fabsf(f.z) * inv), d = (uint32_t)(fabsf(f.w) * inv);
    return (a & 15u) | ((b & 15u) << 4) | ((c & 15u) << 8) | ((d & 15u) << 12);
}
__device__ __forceinline__ uint32_t d_amax4(float4 f)
{
    return max(max(__float_as_uint(f.x) & 0x7fffffffu, __float_as_uint(f.y) & 0x7fffffffu),
               max(__float_as_uint(f.z) & 0x7fffffffu, __float_as_uint(f.w) & 0x7fffffffu));
}

template <int NW, int U>
__global__ void __launch_bounds__(NW * 32)
    k_int_blk(const float4 *__restrict__ x, uint16_t *__restrict__ out, uint32_t nblk)
{
    __shared__ uint32_t ws[NW];
    const uint32_t lane = threadIdx.x & 31u, wid = threadIdx.x >> 5;
    const size_t r0 = ((size_t)blockIdx.x * NW + wid) * U; // the warp's first row
    float4 v[U];
    uint32_t am = 0;
#pragma unroll
    for (int u = 0; u < U; u++)
        v[u] = x[(r0 + u) * 32u + lane];
#pragma unroll
    for (int u = 0; u < U; u++)
        am = max(am, __reduce_max_sync(0xffffffffu, d_amax4(v[u])));
    if (lane == 0)
        ws[wid] = am;
    __syncthreads();
    uint32_t bm = 0;
#pragma unroll
    for (int w = 0; w < NW; w++)
        bm = max(bm, ws[w]);
    const float inv = bm ? 15.0f / __uint_as_float(bm) : 0.0f;
#pragma unroll
    for (int u = 0; u < U; u++)
        __stcs(out + (r0 + u) * 32u + lane, (uint16_t)d_nib4(v[u], inv));
}

// the same per block, in a resident grid whose CTAs stage block i + 1 into shared memory
// (cp.async, 16 bytes per lane and row) while they work on block i
template <int NW, int U>
__global__ void __launch_bounds__(NW * 32)
    k_int_pipe(const float4 *__restrict__ x, uint16_t *__restrict__ out, uint32_t nblk)
{
    extern __shared__ __align__(16) float4 st[]; // [2][NW * U * 32]
    __shared__ uint32_t ws[2][NW];
    const uint32_t lane = threadIdx.x & 31u, wid = threadIdx.x >> 5;
    auto issue = [&](uint32_t blk, uint32_t s) {
        if (blk < nblk) {
            const size_t r0 = ((size_t)blk * NW + wid) * U;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const uint32_t sa = (uint32_t)__cvta_generic_to_shared(st + (size_t)s * NW * U * 32u + (wid * U + u) * 32u + lane);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(x + (r0 + u) * 32u + lane) : "memory");
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    issue(blockIdx.x, 0);
    uint32_t it = 0;
    for (uint32_t blk = blockIdx.x; blk < nblk; blk += gridDim.x, it++) {
        const uint32_t s = it & 1u;
        issue(blk + gridDim.x, s ^ 1u); // its stage was last read before the previous barrier
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        __syncwarp();
        float4 v[U];
        uint32_t am = 0;
#pragma unroll
        for (int u = 0; u < U; u++) {
            v[u] = st[(size_t)s * NW * U * 32u + (wid * U + u) * 32u + lane];
            am = max(am, __reduce_max_sync(0xffffffffu, d_amax4(v[u])));
        }
        if (lane == 0)
            ws[s][wid] = am;
        __syncthreads(); // also: every warp has read stage s before block i + 2 is issued into it
        uint32_t bm = 0;
#pragma unroll
        for (int w = 0; w < NW; w++)
            bm = max(bm, ws[s][w]);
        const float inv = bm ? 15.0f / __uint_as_float(bm) : 0.0f;
        const size_t r0 = ((size_t)blk * NW + wid) * U;
#pragma unroll
        for (int u = 0; u < U; u++)
            __stcs(out + (r0 + u) * 32u + lane, (uint16_t)d_nib4(v[u], inv));
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// ---- harness ----
static float s_median(std::vector<float> t)
{
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct s_res {
    float q, b; // queued ms, back-to-back ms
};

static s_res s_time(const std::function<void()> &launch)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++)
        launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> tq, tb;
    for (int r = 0; r < 25; r++) {
        float ms;
        CK(cudaEventRecord(e0));
        launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        tq.push_back(ms);
        CK(cudaEventRecord(e0));
        for (int k = 0; k < 8; k++)
            launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        tb.push_back(ms / 8.0f);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return { s_median(tq), s_median(tb) };
}

static FILE *g_csv;
static double g_copy; // GB/s, read + written
static int g_bad;

static void s_row(const char *mix, const char *name, double bytes, s_res r, bool ok)
{
    const double pq = bytes / (r.q * 1e-3) / 1e9 / g_copy * 100.0, pb = bytes / (r.b * 1e-3) / 1e9 / g_copy * 100.0;
    printf("%-8s %-34s %8.4f ms %6.1f %%   b2b %8.4f ms %6.1f %%%s\n", mix, name, r.q, pq, r.b, pb, ok ? "" : "  WRONG OUTPUT");
    if (g_csv)
        fprintf(g_csv, "%s,%s,%.5f,%.2f,%.5f,%.2f,%d\n", mix, name, r.q, pq, r.b, pb, ok ? 1 : 0);
    g_bad |= !ok;
}

int main(int argc, char **argv)
{
    const char *csv = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv = argv[++i];
        else {
            fprintf(stderr, "usage: cu_store_probe [--csv FILE]\n");
            return 2;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    printf("device %s, %d SMs, L2 %d MB, %u elements\n", prop.name, sms, prop.l2CacheSize >> 20, N);
    if (csv && !(g_csv = fopen(csv, "w"))) {
        fprintf(stderr, "cu_store_probe: cannot write %s\n", csv);
        return 1;
    }
    if (g_csv)
        fprintf(g_csv, "mix,variant,queued_ms,queued_pct,b2b_ms,b2b_pct,ok\n");
    uint32_t *codes, *enc;
    float4 *out, *x;
    CK(cudaMalloc(&codes, N));
    CK(cudaMalloc(&out, 4ull * N));
    CK(cudaMalloc(&x, 4ull * N));
    CK(cudaMalloc(&enc, N));
    std::vector<uint8_t> hc(N);
    std::vector<float> hx(N);
    uint32_t s = 12345u;
    for (uint32_t i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        hc[i] = (uint8_t)(s >> 24);
        hx[i] = ((float)(s >> 8) - 8388608.0f) * 0x1p-10f;
    }
    CK(cudaMemcpy(codes, hc.data(), N, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(x, hx.data(), 4ull * N, cudaMemcpyHostToDevice));
    // the copy rate: 52 MB device to device
    {
        s_res r = s_time([&] { CK(cudaMemcpyAsync(out, x, 4ull * N, cudaMemcpyDeviceToDevice)); });
        g_copy = 8.0 * N / (r.q * 1e-3) / 1e9;
        printf("copy %.4f ms queued: %.0f GB/s (read + written); b2b %.4f ms\n", r.q, g_copy, r.b);
    }
    std::vector<float> ho(N);
    std::vector<uint8_t> he(N);
    auto dec_ok = [&] {
        CK(cudaMemcpy(ho.data(), out, 4ull * N, cudaMemcpyDeviceToHost));
        CK(cudaMemset(out, 0, 4ull * N));
        for (uint32_t i = 0; i < N; i++)
            if (ho[i] != (float)hc[i] * 0.5f + 1.0f)
                return false;
        return true;
    };
    auto ones_ok = [&] {
        CK(cudaMemcpy(ho.data(), out, 4ull * N, cudaMemcpyDeviceToHost));
        CK(cudaMemset(out, 0, 4ull * N));
        for (uint32_t i = 0; i < N; i++)
            if (ho[i] != 1.0f)
                return false;
        return true;
    };
    auto enc_ok = [&] {
        CK(cudaMemcpy(he.data(), enc, N, cudaMemcpyDeviceToHost));
        CK(cudaMemset(enc, 0, N));
        for (uint32_t i = 0; i < N; i++) {
            uint32_t u;
            memcpy(&u, &hx[i], 4);
            if (he[i] != (uint8_t)(u >> 23))
                return false;
        }
        return true;
    };
    const double dec_bytes = 5.0 * N, wr_bytes = 4.0 * N, enc_bytes = 5.0 * N;
    const uint32_t n4 = N / 4u;

    // decoder traffic, plain stores: full grid (a chunk per warp) and resident grids
    auto dec_plain = [&](const char *name, auto kern, int U, int ctas) {
        const uint32_t nchunk = n4 / (32u * (uint32_t)U);
        const uint32_t grid = ctas > 0 ? (uint32_t)(ctas * sms) : (nchunk + 7u) / 8u;
        s_res r = s_time([&] { kern<<<grid, 256>>>(codes, out, nchunk); });
        s_row("decode", name, dec_bytes, r, dec_ok());
    };
    dec_plain("plain U=1 full grid", k_dec_plain<1, false>, 1, 0);
    dec_plain("plain U=4 full grid", k_dec_plain<4, false>, 4, 0);
    dec_plain("plain .cs U=4 full grid", k_dec_plain<4, true>, 4, 0);
    dec_plain("plain .cs U=8 full grid", k_dec_plain<8, true>, 8, 0);
    dec_plain("plain .cs U=4 8 CTA/SM", k_dec_plain<4, true>, 4, 8);
    dec_plain("plain .cs U=4 4 CTA/SM", k_dec_plain<4, true>, 4, 4);

    auto dec_bulk = [&](const char *name, auto kern, int bytes, int nb, int ctas) {
        const uint32_t nchunk = 4u * N / (uint32_t)bytes;
        const size_t smem = (size_t)4 * nb * bytes;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        const uint32_t grid = ctas > 0 ? (uint32_t)(ctas * sms) : (nchunk + 3u) / 4u;
        s_res r = s_time([&] { kern<<<grid, 128, smem>>>(codes, out, nchunk); });
        char nm[80];
        snprintf(nm, sizeof nm, "%s (%zu KB smem/CTA)", name, smem >> 10);
        s_row("decode", nm, dec_bytes, r, dec_ok());
    };
    dec_bulk("bulk 4K x2, full grid", k_dec_bulk<4096, 2>, 4096, 2, 0);
    dec_bulk("bulk 4K x2, 6 CTA/SM", k_dec_bulk<4096, 2>, 4096, 2, 6);
    dec_bulk("bulk 4K x3, 4 CTA/SM", k_dec_bulk<4096, 3>, 4096, 3, 4);
    dec_bulk("bulk 8K x2, 3 CTA/SM", k_dec_bulk<8192, 2>, 8192, 2, 3);
    dec_bulk("bulk 8K x2, full grid", k_dec_bulk<8192, 2>, 8192, 2, 0);
    dec_bulk("bulk 2K x4, 6 CTA/SM", k_dec_bulk<2048, 4>, 2048, 4, 6);

    // write only
    {
        s_res r = s_time([&] { CK(cudaMemsetAsync(out, 0, 4ull * N)); });
        s_row("write", "cudaMemsetAsync", wr_bytes, r, true);
        CK(cudaMemset(out, 0, 4ull * N));
        r = s_time([&] { k_wr_plain<false><<<(n4 + 255u) / 256u, 256>>>(out, n4); });
        s_row("write", "plain full grid", wr_bytes, r, ones_ok());
        r = s_time([&] { k_wr_plain<true><<<(n4 + 255u) / 256u, 256>>>(out, n4); });
        s_row("write", "plain .cs full grid", wr_bytes, r, ones_ok());
        r = s_time([&] { k_wr_plain<true><<<8 * sms, 256>>>(out, n4); });
        s_row("write", "plain .cs 8 CTA/SM", wr_bytes, r, ones_ok());
        auto wr_bulk = [&](const char *name, auto kern, int bytes, int ctas) {
            const uint32_t nchunk = 4u * N / (uint32_t)bytes;
            const size_t smem = (size_t)4 * bytes;
            CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            s_res rr = s_time([&] { kern<<<(uint32_t)(ctas * sms), 128, smem>>>(out, nchunk); });
            s_row("write", name, wr_bytes, rr, ones_ok());
        };
        wr_bulk("bulk 4K, 4 in flight, 4 CTA/SM", k_wr_bulk<4096, 4>, 4096, 4);
        wr_bulk("bulk 8K, 4 in flight, 4 CTA/SM", k_wr_bulk<8192, 4>, 8192, 4);
        wr_bulk("bulk 16K, 2 in flight, 2 CTA/SM", k_wr_bulk<16384, 2>, 16384, 2);
    }

    // encoder traffic
    auto enc_plain = [&](const char *name, auto kern, int U, int ctas) {
        const uint32_t nchunk = n4 / (32u * (uint32_t)U);
        const uint32_t grid = ctas > 0 ? (uint32_t)(ctas * sms) : (nchunk + 7u) / 8u;
        s_res r = s_time([&] { kern<<<grid, 256>>>(x, enc, nchunk); });
        s_row("encode", name, enc_bytes, r, enc_ok());
    };
    enc_plain("plain U=4 full grid", k_enc_plain<4>, 4, 0);
    enc_plain("plain U=8 full grid", k_enc_plain<8>, 8, 0);
    enc_plain("plain U=4 8 CTA/SM", k_enc_plain<4>, 4, 8);
    enc_plain("plain U=8 4 CTA/SM", k_enc_plain<8>, 8, 4);
    auto enc_bulk = [&](const char *name, auto kern, int bytes, int nb, int ctas) {
        const uint32_t nchunk = 4u * N / (uint32_t)bytes;
        const size_t smem = (size_t)4 * nb * bytes;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        s_res r = s_time([&] { kern<<<(uint32_t)(ctas * sms), 128, smem>>>(x, enc, nchunk); });
        char nm[80];
        snprintf(nm, sizeof nm, "%s (%zu KB smem/CTA)", name, smem >> 10);
        s_row("encode", nm, enc_bytes, r, enc_ok());
    };
    enc_bulk("bulk 4K x3, 4 CTA/SM", k_enc_bulk<4096, 3>, 4096, 3, 4);
    enc_bulk("bulk 8K x2, 3 CTA/SM", k_enc_bulk<8192, 2>, 8192, 2, 3);
    enc_bulk("bulk 8K x3, 2 CTA/SM", k_enc_bulk<8192, 3>, 8192, 3, 2);
    enc_bulk("bulk 4K x4, 3 CTA/SM", k_enc_bulk<4096, 4>, 4096, 4, 3);

    // int-encoder skeletons: blocks of 8192 floats (64 groups of 128), 1600 blocks
    {
        uint16_t *q = (uint16_t *)enc; // N / 2 bytes used
        std::vector<uint16_t> hq(N / 4u);
        auto int_ok = [&](uint32_t blk_elems) {
            CK(cudaMemcpy(hq.data(), q, N / 2u, cudaMemcpyDeviceToHost));
            CK(cudaMemset(q, 0, N / 2u));
            for (uint32_t b0 = 0; b0 < N; b0 += blk_elems) {
                uint32_t bm = 0;
                for (uint32_t i = b0; i < b0 + blk_elems; i++) {
                    uint32_t u;
                    memcpy(&u, &hx[i], 4);
                    bm = std::max(bm, u & 0x7fffffffu);
                }
                float bmf;
                memcpy(&bmf, &bm, 4);
                const float inv = bm ? 15.0f / bmf : 0.0f;
                for (uint32_t i = b0; i < b0 + blk_elems; i += 4) {
                    uint32_t w = 0;
                    for (int r = 0; r < 4; r++)
                        w |= ((uint32_t)(fabsf(hx[i + r]) * inv) & 15u) << (4 * r);
                    if (hq[i / 4] != (uint16_t)w)
                        return false;
                }
            }
            return true;
        };
        const double int_bytes = 4.5 * N;
        s_res r = s_time([&] { k_int_blk<16, 4><<<N / 8192u, 512>>>(x, q, N / 8192u); });
        s_row("int", "blk 16 warps x 4 rows (k_int_row's shape)", int_bytes, r, int_ok(8192));
        r = s_time([&] { k_int_blk<8, 8><<<N / 8192u, 256>>>(x, q, N / 8192u); });
        s_row("int", "blk 8 warps x 8 rows", int_bytes, r, int_ok(8192));
        r = s_time([&] { k_int_blk<32, 2><<<N / 8192u, 1024>>>(x, q, N / 8192u); });
        s_row("int", "blk 32 warps x 2 rows", int_bytes, r, int_ok(8192));
        const size_t smem = 2u * 8192u * 4u;
        CK(cudaFuncSetAttribute(k_int_pipe<16, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CK(cudaFuncSetAttribute(k_int_pipe<8, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        for (int c = 2; c <= 3; c++) {
            r = s_time([&] { k_int_pipe<16, 4><<<c * sms, 512, smem>>>(x, q, N / 8192u); });
            char nm[80];
            snprintf(nm, sizeof nm, "pipe 16 warps x 4 rows, %d CTA/SM", c);
            s_row("int", nm, int_bytes, r, int_ok(8192));
        }
        r = s_time([&] { k_int_pipe<8, 8><<<3 * sms, 256, smem>>>(x, q, N / 8192u); });
        s_row("int", "pipe 8 warps x 8 rows, 3 CTA/SM", int_bytes, r, int_ok(8192));
    }

    if (g_csv)
        fclose(g_csv);
    CK(cudaFree(codes));
    CK(cudaFree(out));
    CK(cudaFree(x));
    CK(cudaFree(enc));
    return g_bad ? 1 : 0;
}
