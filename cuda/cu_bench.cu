// cu_bench.cu — helpers for bench/bench_cu_codec.c only (not in libtahcuda).
//
// cu_bench_spin: a kernel that waits `us` microseconds without touching
// memory. Enqueued before a timed region, it keeps the GPU busy while the
// host enqueues the start event, the codec call and the stop event, so the
// events measure device time (kernels, memsets, the gaps between them) and
// not the host's launch latency; it moves no bytes, so unlike an L2-flushing
// memset it leaves no dirty lines for the timed call to write back.
//
// cu_bench_stream (round 7): the ceilings a codec kernel is measured against
// besides the copy: trivial streaming kernels with a codec's byte mix (read
// 4 bytes per element and write 1, as an 8-bit encoder; read 1 and write 4,
// as a decoder; 4 and 4; 4 and 0; 0 and 4), one 16-byte access per 4
// elements per thread, so the bench can say how far a codec is from the best
// a kernel of its traffic reaches in the same timing harness.
//
// Modes 5 and 6 (round 23) store with st.global.cs, as the decoders do: on an H200 that
// raised the decode mix's ceiling by ~4 points (bench/cu_store_probe.cu).
//
//   thread -> elements: unit i = 16 elements: four float4 of the fp32 side
//   (512-byte rows of its warp, see k_bench_stream), one uint4 of the byte
//   side; grid-stride over units (n a multiple of 512).
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void k_bench_spin(uint64_t ns)
{
    uint64_t t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        uint64_t t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 >= ns)
            break;
        __nanosleep(1000);
    }
}

extern "C" int cu_bench_spin(cudaStream_t st, unsigned int us)
{
    k_bench_spin<<<1, 32, 0, st>>>((uint64_t)us * 1000u);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

// MODE 0: f32 -> u8 (read 64 B, write 16 B per unit); 1: u8 -> f32 (16, 64);
// 2: f32 -> f32 (64, 64); 3: f32 read only; 4: f32 write only; 5 and 6: 1 and 4 with
// streaming stores (st.global.cs, as the decoders store; round 23). Unit i of warp block
// w = i / 32, lane l = i % 32: float4 j (0..3) at 128 w + 32 j + l, uint4 at i, so every
// access instruction of a warp covers 512 contiguous bytes.
template <int MODE>
__global__ void __launch_bounds__(256) k_bench_stream(const uint4 *__restrict__ in, uint4 *__restrict__ out,
                                                      uint64_t units, unsigned int *sink)
{
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint32_t acc = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < units; i += stride) {
        const uint64_t f = 128u * (i / 32u) + (i % 32u); // float4 0 of the unit
        if (MODE == 0) {
            uint4 a = in[f], b = in[f + 32], c = in[f + 64], d = in[f + 96];
            out[i] = make_uint4(a.x ^ a.y ^ a.z ^ a.w, b.x ^ b.y ^ b.z ^ b.w, c.x ^ c.y ^ c.z ^ c.w,
                                d.x ^ d.y ^ d.z ^ d.w);
        } else if (MODE == 1 || MODE == 5) {
            uint4 a = in[i];
            const uint4 o[4] = { make_uint4(a.x, a.x >> 8, a.x >> 16, a.x >> 24),
                                 make_uint4(a.y, a.y >> 8, a.y >> 16, a.y >> 24),
                                 make_uint4(a.z, a.z >> 8, a.z >> 16, a.z >> 24),
                                 make_uint4(a.w, a.w >> 8, a.w >> 16, a.w >> 24) };
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if (MODE == 5)
                    __stcs(&out[f + 32 * k], o[k]);
                else
                    out[f + 32 * k] = o[k];
            }
        } else if (MODE == 2) {
            uint4 a = in[f], b = in[f + 32], c = in[f + 64], d = in[f + 96];
            out[f] = a;
            out[f + 32] = b;
            out[f + 64] = c;
            out[f + 96] = d;
        } else if (MODE == 3) {
            uint4 a = in[f], b = in[f + 32], c = in[f + 64], d = in[f + 96];
            acc ^= a.x ^ b.y ^ c.z ^ d.w;
        } else {
            const uint32_t v = (uint32_t)i;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if (MODE == 6)
                    __stcs(&out[f + 32 * k], make_uint4(v, v, v, v));
                else
                    out[f + 32 * k] = make_uint4(v, v, v, v);
            }
        }
    }
    if (MODE == 3 && acc == 0x9e3779b9u)
        atomicAdd(sink, 1u); // keeps the loads
}

// n elements (a multiple of 16); persist: a grid of the resident CTAs (grid-stride),
// else one unit per thread. 0, or -1 if the launch failed.
extern "C" int cu_bench_stream(int mode, const void *in, void *out, uint64_t n, int persist, cudaStream_t st)
{
    const uint64_t units = n / 16;
    static unsigned int *sink = NULL;
    if (!sink && cudaMalloc((void **)&sink, sizeof *sink) != cudaSuccess)
        return -1;
    unsigned int grid = (unsigned int)((units + 255) / 256);
    if (persist) {
        int dev = 0, sms = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            return -1;
        const unsigned int res = (unsigned int)sms * 8u; // 8 CTAs of 256: 2048 threads per SM
        grid = grid < res ? grid : res;
    }
    const uint4 *a = (const uint4 *)in;
    uint4 *b = (uint4 *)out;
    switch (mode) {
    case 0: k_bench_stream<0><<<grid, 256, 0, st>>>(a, b, units, sink); break;
    case 1: k_bench_stream<1><<<grid, 256, 0, st>>>(a, b, units, sink); break;
    case 2: k_bench_stream<2><<<grid, 256, 0, st>>>(a, b, units, sink); break;
    case 3: k_bench_stream<3><<<grid, 256, 0, st>>>(a, b, units, sink); break;
    case 4: k_bench_stream<4><<<grid, 256, 0, st>>>(a, b, units, sink); break;
    case 5: k_bench_stream<5><<<grid, 256, 0, st>>>(a, b, units, sink); break;
    default: k_bench_stream<6><<<grid, 256, 0, st>>>(a, b, units, sink); break;
    }
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
