// cu_raw.cu — fp32 / fp16 / bf16 payloads on the GPU (codecs/raw.c's format:
// B*S*C little-endian values of 4 or 2 bytes; fp16/bf16 round to nearest
// even and refuse values that would become Inf with TAH_ERANGE).
//
// Thread -> elements: a flat grid, thread i handles elements [4i, 4i+4):
// one 16-byte load and one 16- (fp32) or 8-byte (fp16/bf16) store when x
// and the payload are 16-byte aligned, scalar accesses otherwise.
#include <cuda_fp16.h> // __half2float

#include "cu_common.cuh"

enum { S_FP32 = 0, S_FP16 = 1, S_BF16 = 2 };

// bf16 round to nearest even, as codecs/half.c's bf16_from_f32 (finite input)
__device__ __forceinline__ uint16_t d_bf16(float f)
{
    uint32_t x = __float_as_uint(f);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

template <int MODE, typename X>
__global__ void k_raw_encode(const X *__restrict__ x, uint64_t n, uint8_t *__restrict__ p, cu_hp head, bool vec)
{
    d_mark(head);
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint32_t bad = 0, range = 0;
    for (uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c * 4 < n; c += stride) {
        const uint64_t i0 = c * 4;
        const uint32_t m = n - i0 < 4 ? (uint32_t)(n - i0) : 4u;
        float v[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        if (vec && m == 4) {
            d_load4v(x, i0, v);
        } else {
            for (uint32_t r = 0; r < m; r++)
                v[r] = d_ldx(x, i0 + r);
        }
        uint32_t w[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            bad |= (uint32_t)d_nonfinite(v[r]);
            if (MODE == S_FP32) {
                w[r] = __float_as_uint(v[r]);
            } else if (MODE == S_FP16) {
                w[r] = d_half_from_f32(v[r]);
                range |= (uint32_t)((w[r] & 0x7c00u) == 0x7c00u);
            } else {
                w[r] = d_bf16(v[r]);
                range |= (uint32_t)((w[r] & 0x7f80u) == 0x7f80u);
            }
        }
        if (MODE == S_FP32) {
            if (vec && m == 4)
                *(uint4 *)(p + 4 * i0) = make_uint4(w[0], w[1], w[2], w[3]);
            else
                for (uint32_t r = 0; r < m; r++)
                    d_put_u32(p + 4 * (i0 + r), w[r]);
        } else {
            if (vec && m == 4)
                *(uint2 *)(p + 2 * i0) = make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
            else
                for (uint32_t r = 0; r < m; r++)
                    d_put_u16(p + 2 * (i0 + r), (uint16_t)w[r]);
        }
    }
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
    if (range)
        d_flag(head, CU_ST_RANGE);
}

template <int MODE>
__global__ void k_raw_decode(const uint8_t *__restrict__ p, uint64_t n, float *__restrict__ out, cu_hp head,
                             bool vec)
{
    d_mark(head);
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint32_t bad = 0;
    for (uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c * 4 < n; c += stride) {
        const uint64_t i0 = c * 4;
        const uint32_t m = n - i0 < 4 ? (uint32_t)(n - i0) : 4u;
        uint32_t w[4] = { 0, 0, 0, 0 };
        if (MODE == S_FP32) {
            if (vec && m == 4) {
                uint4 a = *(const uint4 *)(p + 4 * i0);
                w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
            } else {
                for (uint32_t r = 0; r < m; r++)
                    w[r] = d_get_u32(p + 4 * (i0 + r));
            }
        } else {
            if (vec && m == 4) {
                uint2 a = *(const uint2 *)(p + 2 * i0);
                w[0] = a.x & 0xffffu; w[1] = a.x >> 16; w[2] = a.y & 0xffffu; w[3] = a.y >> 16;
            } else {
                for (uint32_t r = 0; r < m; r++)
                    w[r] = d_get_u16(p + 2 * (i0 + r));
            }
        }
        float v[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            if (MODE == S_FP32)
                v[r] = __uint_as_float(w[r]);
            else if (MODE == S_FP16)
                v[r] = __half2float(__ushort_as_half((unsigned short)w[r]));
            else
                v[r] = __uint_as_float(w[r] << 16);
            bad |= (uint32_t)((uint32_t)r < m && d_nonfinite(v[r]));
        }
        if (vec && m == 4)
            *(float4 *)(out + i0) = make_float4(v[0], v[1], v[2], v[3]);
        else
            for (uint32_t r = 0; r < m; r++)
                out[i0 + r] = v[r];
    }
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

static bool s_aligned16(const void *a, const void *b)
{
    return (((uintptr_t)a | (uintptr_t)b) & 15u) == 0;
}

template <typename X>
static int s_raw_encode(const codec_spec_t *spec, uint64_t n, const X *x, uint8_t *payload, cu_hp head,
                        cudaStream_t st, char *err, size_t errlen)
{
    const unsigned int grid = cu_grid((n + 3) / 4, 256);
    const bool vec = s_aligned16(x, payload);
    switch (spec->id) {
    case CODEC_FP32: k_raw_encode<S_FP32><<<grid, 256, 0, st>>>(x, n, payload, head, vec); break;
    case CODEC_FP16: k_raw_encode<S_FP16><<<grid, 256, 0, st>>>(x, n, payload, head, vec); break;
    default: k_raw_encode<S_BF16><<<grid, 256, 0, st>>>(x, n, payload, head, vec); break;
    }
    CU_CHECK_LAUNCH("k_raw_encode");
    return 0;
}

int cu_raw_encode(const codec_spec_t *spec, uint64_t n, cu_dtype_t xt, const void *x, uint8_t *payload,
                  cu_hp head, cudaStream_t st, char *err, size_t errlen)
{
    if (xt == CU_BF16)
        return s_raw_encode(spec, n, (const cu_bf16 *)x, payload, head, st, err, errlen);
    return s_raw_encode(spec, n, (const float *)x, payload, head, st, err, errlen);
}

int cu_raw_decode(const codec_spec_t *spec, uint64_t n, const uint8_t *payload, float *out, cu_hp head,
                  cudaStream_t st, char *err, size_t errlen)
{
    const unsigned int grid = cu_grid((n + 3) / 4, 256);
    const bool vec = s_aligned16(out, payload);
    switch (spec->id) {
    case CODEC_FP32: k_raw_decode<S_FP32><<<grid, 256, 0, st>>>(payload, n, out, head, vec); break;
    case CODEC_FP16: k_raw_decode<S_FP16><<<grid, 256, 0, st>>>(payload, n, out, head, vec); break;
    default: k_raw_decode<S_BF16><<<grid, 256, 0, st>>>(payload, n, out, head, vec); break;
    }
    CU_CHECK_LAUNCH("k_raw_decode");
    return 0;
}

__global__ void k_half_dir(const float *__restrict__ x, uint16_t *__restrict__ h, uint64_t n, int dir)
{
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        h[i] = dir < 0 ? d_half_from_f32_down(x[i]) : (dir > 0 ? d_half_from_f32_up(x[i]) : d_half_from_f32(x[i]));
}

extern "C" int cu_half_from_f32_n(const float *d_x, uint16_t *d_h, size_t n, int dir, cudaStream_t stream)
{
    if (n == 0)
        return 0;
    k_half_dir<<<cu_grid(n, 256), 256, 0, stream>>>(d_x, d_h, n, dir);
    return cudaGetLastError() == cudaSuccess ? 0 : TAH_EDEVICE;
}
