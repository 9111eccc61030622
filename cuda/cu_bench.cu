// cu_bench.cu — helpers for bench/bench_cu_codec.c only (not in libtahcuda).
//
// cu_bench_spin: a kernel that waits `us` microseconds without touching
// memory. Enqueued before a timed region, it keeps the GPU busy while the
// host enqueues the start event, the codec call and the stop event, so the
// events measure device time (kernels, memsets, the gaps between them) and
// not the host's launch latency; it moves no bytes, so unlike an L2-flushing
// memset it leaves no dirty lines for the timed call to write back.
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
