// cu_stream_probe.cu — how fast TAH-Quant encode's staging scheme can stream x, alone and with
// its writes (round 18's probe; figures and conclusions in cuda/NOTES.md, "Nineteenth version").
//
// k_tah_spec (cuda/cu_tah.cu) gives each warp units of 32 tiles (8 KB of the 8x1024x1600 fp32
// tensor), staged through shared memory, each lane then holding one tile's 64 floats; it also
// writes a 64-byte record and a 2-byte key per tile. This probe runs that data flow without the
// codec arithmetic: per unit, each lane reads its tile's row and runs K rounds of 64 independent
// FMAs (K = 10 is about k_tah_spec's instruction count per unit), then optionally writes a
// record per tile. Variants: how the unit is staged (cp.async into padded rows, with the
// L2::256B prefetch hint, one 8 KB bulk copy, or plain per-lane loads without shared memory),
// buffers per warp, warps per SM, how the records are stored (16-byte stores 64 bytes apart, or
// 2 KB of consecutive stores through shared memory) and L2 policies (x evict-first, records
// evict-last). With records, a second kernel discards their L2 lines, as k_tah_emit does.
//
// Not part of the build (it needs sm_90; standalone on a GPU machine):
//   nvcc -std=c++17 -O3 -arch=sm_90 bench/cu_stream_probe.cu -o cu_stream_probe
//   ./cu_stream_probe [--csv FILE]
// Prints one line per variant (median of 22 timed runs after 3 warm-ups): kernel ms, with
// the discard kernel, read GB/s of x, and % of the device-to-device copy rate (read + written).
// Exit: 0 ok, 1 CUDA error, 2 usage.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <vector>

#define CK(call)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            fprintf(stderr, "cu_stream_probe: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,            \
                    cudaGetErrorString(e_));                                                          \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

enum { ST_CPASYNC, ST_CPASYNC256, ST_BULK, ST_LDG };     // how a unit is staged
enum { REC_NONE, REC_DIRECT, REC_ROWS };                 // how the records are stored
enum { POL_X_FIRST = 1, POL_REC_LAST = 2 };              // L2 policies (bits)

__device__ __forceinline__ uint64_t s_policy(bool last)
{
    uint64_t p;
    if (last)
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    else
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

__global__ void k_discard(uint4 *rec, size_t lines)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < lines; i += (size_t)gridDim.x * blockDim.x)
        asm volatile("discard.global.L2 [%0], 128;" ::"l"(rec + 8 * i) : "memory");
}

// warps of 4 per CTA; unit u of warp gw: gw, gw + nw, ...; NB buffers of 32 rows of RW words
template <int STAGE, int NB, int RW, int REC, int POL>
__global__ void __launch_bounds__(128) k_probe(const float4 *__restrict__ x, uint32_t nunits, int K, uint4 *rec,
                                                uint16_t *key, uint32_t *sink)
{
    extern __shared__ __align__(128) float4 sm[];
    __shared__ __align__(8) unsigned long long mbar[4][NB];
    const uint32_t lane = threadIdx.x & 31u, wid = threadIdx.x >> 5;
    const uint32_t gw = blockIdx.x * 4u + wid, nw = gridDim.x * 4u;
    float4 *wb = sm + (size_t)wid * NB * 32u * (RW / 4u);
    const uint32_t wbs = (uint32_t)__cvta_generic_to_shared(wb);
    const uint64_t pfirst = s_policy(false), plast = s_policy(true);
    uint32_t acc = 0;
    float f[16] = {};
    auto issue = [&](uint32_t u, uint32_t slot) {
        if (STAGE == ST_BULK) {
            const uint32_t mb = (uint32_t)__cvta_generic_to_shared(&mbar[wid][slot]);
            if (lane == 0 && u < nunits) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 8192;" ::"r"(mb) : "memory");
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 8192, [%2];" ::"r"(
                                 wbs + slot * 8192u),
                             "l"(x + (size_t)u * 512u), "r"(mb)
                             : "memory");
            }
            return;
        }
        if (u < nunits) {
            const float4 *gp = x + (size_t)u * 512u + lane;
            const uint32_t sa = wbs + slot * 32u * RW * 4u + ((lane / 16u) * RW + (lane % 16u) * 4u) * 4u;
#pragma unroll
            for (uint32_t m = 0; m < 16u; m++) {
                const uint32_t d = sa + 4u * RW * 2u * m;
                if (POL & POL_X_FIRST)
                    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(d), "l"(gp + 32u * m),
                                 "l"(pfirst)
                                 : "memory");
                else if (STAGE == ST_CPASYNC256)
                    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d), "l"(gp + 32u * m) : "memory");
                else
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(gp + 32u * m) : "memory");
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    if (STAGE == ST_BULK) {
        if (lane == 0)
            for (int s = 0; s < NB; s++)
                asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((uint32_t)__cvta_generic_to_shared(&mbar[wid][s]))
                             : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        __syncwarp();
    }
    if (STAGE != ST_LDG)
        for (int s = 0; s < NB - 1; s++)
            issue(gw + (uint32_t)s * nw, (uint32_t)s);
    uint32_t it = 0;
    for (uint32_t u = gw; u < nunits; u += nw, it++) {
        float4 q[16];
        const uint32_t slot = it % NB;
        if (STAGE == ST_LDG) {
            const float4 *row = x + (size_t)u * 512u + lane * 16u;
#pragma unroll
            for (int c = 0; c < 16; c++)
                q[c] = row[c];
        } else {
            issue(u + (uint32_t)(NB - 1) * nw, (it + NB - 1) % NB);
            if (STAGE == ST_BULK)
                asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(
                                 (uint32_t)__cvta_generic_to_shared(&mbar[wid][slot])),
                             "r"((it / NB) & 1u)
                             : "memory");
            else
                asm volatile("cp.async.wait_group %0;" ::"n"(NB - 1) : "memory");
            __syncwarp();
            // bulk: unpadded rows, read chunk c ^ (lane % 8) (the bank pattern of a 128-byte swizzle)
            const float4 *row = wb + slot * 32u * (RW / 4u) + lane * (RW / 4u);
#pragma unroll
            for (int c = 0; c < 16; c++)
                q[c] = row[STAGE == ST_BULK ? (c ^ (int)(lane & 7u)) : c];
        }
#pragma unroll
        for (int c = 0; c < 16; c++)
            acc ^= __float_as_uint(q[c].x) ^ __float_as_uint(q[c].y) ^ __float_as_uint(q[c].z) ^ __float_as_uint(q[c].w);
        for (int k = 0; k < K; k++) {
#pragma unroll
            for (int c = 0; c < 16; c++) {
                f[c] = __fmaf_rn(f[c], q[c].x, q[c].y);
                f[(c + 5) & 15] = __fmaf_rn(f[(c + 5) & 15], q[c].z, q[c].w);
                f[(c + 9) & 15] = __fmaf_rn(f[(c + 9) & 15], q[c].x, q[c].w);
                f[(c + 13) & 15] = __fmaf_rn(f[(c + 13) & 15], q[c].y, q[c].z);
            }
        }
        if (REC != REC_NONE) {
            const uint4 r[4] = { make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), acc),
                                 make_uint4(__float_as_uint(f[4]), __float_as_uint(f[5]), __float_as_uint(f[6]), u),
                                 make_uint4(__float_as_uint(f[8]), __float_as_uint(f[9]), __float_as_uint(f[10]), lane),
                                 make_uint4(__float_as_uint(f[12]), __float_as_uint(f[13]), u, acc ^ lane) };
            uint4 *rw = rec + (size_t)u * 128u;
            key[(size_t)u * 32u + lane] = (uint16_t)acc;
            if (REC == REC_DIRECT || STAGE == ST_LDG) {
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    if (POL & POL_REC_LAST)
                        asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(rw + 4 * lane + m),
                                     "r"(r[m].x), "r"(r[m].y), "r"(r[m].z), "r"(r[m].w), "l"(plast)
                                     : "memory");
                    else
                        rw[4 * lane + m] = r[m];
                }
            } else { // each record into its tile's row, then 2 KB of consecutive stores
                uint4 *srow = (uint4 *)(wb + slot * 32u * (RW / 4u) + lane * (RW / 4u));
#pragma unroll
                for (int m = 0; m < 4; m++)
                    srow[m] = r[m];
                __syncwarp();
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    const uint32_t i = lane + 32u * (uint32_t)m;
                    rw[i] = ((const uint4 *)(wb + slot * 32u * (RW / 4u) + (i / 4u) * (RW / 4u)))[i % 4u];
                }
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int i = 0; i < 16; i++)
        acc ^= __float_as_uint(f[i]);
    if (acc == 0x9e3779b9u)
        atomicAdd(sink, 1u); // keeps the loads and the arithmetic
}

struct s_ctx {
    const float4 *x;
    uint4 *rec;
    uint16_t *key;
    uint32_t *sink, nunits;
    double copy_gbs;
    FILE *csv;
};

static float s_median(std::vector<float> &t)
{
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// one variant at `cps` CTAs per SM (shared memory padded to allow no more)
template <int STAGE, int NB, int RW, int REC, int POL>
static void s_run(const s_ctx &c, const char *name, int K, int cps)
{
    auto kern = k_probe<STAGE, NB, RW, REC, POL>;
    size_t smem = STAGE == ST_LDG ? 0 : (size_t)4 * NB * 32 * RW * 4;
    const size_t pad = (size_t)(228 * 1024) / (size_t)cps - 1024 - 64 * NB;
    smem = std::max(smem, std::min(pad, (size_t)227 * 1024));
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int dev = 0, sms = 0, occ = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 128, smem));
    cudaEvent_t e0, e1, e2;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&e2));
    std::vector<float> tk, td;
    for (int r = 0; r < 25; r++) {
        CK(cudaEventRecord(e0));
        kern<<<(unsigned)(occ * sms), 128, smem>>>(c.x, c.nunits, K, c.rec, c.key, c.sink);
        CK(cudaGetLastError());
        CK(cudaEventRecord(e1));
        if (REC != REC_NONE) {
            k_discard<<<1056, 256>>>(c.rec, (size_t)c.nunits * 16u);
            CK(cudaGetLastError());
        }
        CK(cudaEventRecord(e2));
        CK(cudaEventSynchronize(e2));
        float a, b;
        CK(cudaEventElapsedTime(&a, e0, e1));
        CK(cudaEventElapsedTime(&b, e0, e2));
        if (r >= 3) {
            tk.push_back(a);
            td.push_back(b);
        }
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaEventDestroy(e2));
    const float ms = s_median(tk), msd = s_median(td);
    const double gbs = (double)c.nunits * 8192.0 / (ms * 1e-3) / 1e9;
    const char *rn = REC == REC_NONE ? "-" : REC == REC_DIRECT ? "direct" : "rows";
    const char *pn = POL == 0 ? "-" : POL == POL_X_FIRST ? "x-first" : POL == POL_REC_LAST ? "rec-last" : "both";
    printf("%-12s %3d %2d %8s %8s %3d %8.4f %8.4f %7.0f %6.1f %%\n", name, NB, K, rn, pn, occ * 4, ms, msd, gbs,
           100.0 * gbs / c.copy_gbs);
    if (c.csv)
        fprintf(c.csv, "%s,%d,%d,%s,%s,%d,%.5f,%.5f,%.0f,%.1f\n", name, NB, K, rn, pn, occ * 4, ms, msd, gbs,
                100.0 * gbs / c.copy_gbs);
}

int main(int argc, char **argv)
{
    const char *csv_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv_path = argv[++i];
        else {
            fprintf(stderr, "usage: cu_stream_probe [--csv FILE]\n");
            return 2;
        }
    }
    const size_t n = 8ull * 1024 * 1600; // the codec bench's tensor
    s_ctx c = {};
    float4 *x = NULL, *y = NULL;
    CK(cudaMalloc(&x, n * 4));
    CK(cudaMalloc(&y, n * 4));
    CK(cudaMalloc(&c.rec, n));        // 64 bytes per tile of 64 floats
    CK(cudaMalloc(&c.key, n / 32));   // 2 bytes per tile
    CK(cudaMalloc(&c.sink, 4));
    CK(cudaMemset(x, 0x3f, n * 4));
    c.x = x;
    c.nunits = (uint32_t)(n / 2048);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < 25; r++) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 3)
            t.push_back(ms);
    }
    c.copy_gbs = 2.0 * n * 4 / (s_median(t) * 1e-3) / 1e9;
    if (csv_path && !(c.csv = fopen(csv_path, "w"))) {
        fprintf(stderr, "cu_stream_probe: %s: cannot open for writing\n", csv_path);
        return 1;
    }
    if (c.csv)
        fprintf(c.csv, "staging,buffers,K,records,policy,warps_per_sm,ms,ms_with_discard,read_gbs,pct_copy\n");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("cu_stream_probe: %s, copy %.0f GB/s (read + written); x: %.1f MB read once\n", prop.name, c.copy_gbs,
           n * 4 / 1e6);
    printf("%-12s %3s %2s %8s %8s %3s %8s %8s %7s %8s\n", "staging", "NB", "K", "records", "L2", "w/SM", "ms",
           "+discard", "GB/s", "% copy");
    for (int K : { 0, 10 }) {
        s_run<ST_CPASYNC, 2, 68, REC_NONE, 0>(c, "cp.async", K, 3); // k_tah_spec's scheme
        s_run<ST_CPASYNC, 3, 68, REC_NONE, 0>(c, "cp.async", K, 2);
        s_run<ST_CPASYNC256, 2, 68, REC_NONE, 0>(c, "cp.async256", K, 3);
        s_run<ST_BULK, 2, 64, REC_NONE, 0>(c, "bulk-8KB", K, 3);
        s_run<ST_BULK, 3, 64, REC_NONE, 0>(c, "bulk-8KB", K, 2);
        s_run<ST_LDG, 1, 64, REC_NONE, 0>(c, "ldg-row", K, 3);
        s_run<ST_LDG, 1, 64, REC_NONE, 0>(c, "ldg-row", K, 8);
        s_run<ST_CPASYNC, 2, 68, REC_DIRECT, 0>(c, "cp.async", K, 3);
        s_run<ST_CPASYNC, 2, 68, REC_DIRECT, POL_X_FIRST>(c, "cp.async", K, 3);
        s_run<ST_CPASYNC, 2, 68, REC_DIRECT, POL_X_FIRST | POL_REC_LAST>(c, "cp.async", K, 3);
        s_run<ST_CPASYNC, 2, 68, REC_ROWS, 0>(c, "cp.async", K, 3);
        s_run<ST_CPASYNC, 2, 68, REC_ROWS, POL_X_FIRST>(c, "cp.async", K, 3);
    }
    if (c.csv && fclose(c.csv) != 0) {
        fprintf(stderr, "cu_stream_probe: %s: write failed\n", csv_path);
        return 1;
    }
    CK(cudaFree(x));
    CK(cudaFree(y));
    CK(cudaFree(c.rec));
    CK(cudaFree(c.key));
    CK(cudaFree(c.sink));
    return 0;
}
