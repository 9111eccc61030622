// cu_common.cuh — what every codec kernel file shares (private to cuda/):
// error checking with the call site, the status word in scratch, codecs/half.c's
// fp16 bits (hardware roundings, checked on every float), a port of codecs/bitpack.c,
// byte-granular stores that widen when the address allows, and the segmented-warp helpers.
//
// Segments: the small-tile kernels (TAH tile <= 256, ash-fp8 block <= 256,
// fixpt/int group <= 256) give each tile a segment of `tpg` lanes of one
// warp (tpg a power of two, 1..32), 8 consecutive elements per lane:
//
//   warp lanes  | 0 1 2 ... tpg-1 | tpg ... 2tpg-1 | ...    (32/tpg segments)
//   elements    | 0-7 8-15 ...    | 0-7 8-15 ...   |        (of its own tile)
//
// Reductions and Hadamard stages beyond 8 elements are __shfl_xor_sync with
// offsets < tpg, so they never leave the segment; every lane of the warp
// executes every shuffle (full mask), lanes without a tile contribute
// neutral values and store nothing.
#ifndef TAH_CU_COMMON_CUH
#define TAH_CU_COMMON_CUH

#include <cuda_bf16.h> // __nv_bfloat16 (bf16 input of the encoders)
#include <cuda_fp16.h> // __float2half_rd, __float2half_ru
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "codec.h"      // codec_spec_t, codec_frame_size, codec_spec_validate
#include "codec_impl.h" // codec_shape_elems
}
#include "cu_codec.h"

#define CU_FULL 0xffffffffu

// Status at the start of scratch, without a memset per call: every call
// gets a fresh 61-bit tag (host counter, cu_codec.cu). Each kernel's thread
// (0,0) stores the tag in `tag`; a thread that saw a condition sets its bit
// in `status` = (tag << 3) | bits with a CAS that starts a new word when the
// stored tag is an older call's. cu_codec_status reports the bits only when
// status's tag equals `tag` (the last call's): a stale word reads as 0.
#define CU_ST_NONFINITE 1u
#define CU_ST_RANGE 2u
#define CU_ST_CORRUPT 4u
#define CU_ST_BITS 3u
#define CU_TAG_MASK ((1ull << 61) - 1u)
#define CU_SCRATCH_HEAD 256u // status + small per-call scalars; the rest is per-codec

struct cu_head {
    unsigned long long status;  // (tag << CU_ST_BITS) | condition bits
    unsigned long long tag;     // the last call's tag
};

// What every kernel gets: the head and this call's tag.
struct cu_hp {
    cu_head *p;
    unsigned long long tag;
};
// Host-side failure with the call site: fills err, returns TAH_EDEVICE.
int cu_fail(cudaError_t e, const char *what, const char *file, int line, char *err, size_t errlen);

#define CUDA_CHECK(call)                                                     \
    do {                                                                     \
        cudaError_t e_ = (call);                                             \
        if (e_ != cudaSuccess)                                               \
            return cu_fail(e_, #call, __FILE__, __LINE__, err, errlen);      \
    } while (0)

// After every launch: configuration errors surface here, not later.
#define CU_CHECK_LAUNCH(name)                                                          \
    do {                                                                               \
        cudaError_t e_ = cudaGetLastError();                                           \
        if (e_ != cudaSuccess)                                                         \
            return cu_fail(e_, "launch of " name, __FILE__, __LINE__, err, errlen);    \
    } while (0)

__device__ __forceinline__ void d_flag(cu_hp h, unsigned int bit)
{
    unsigned long long *w = &h.p->status;
    unsigned long long old = *(volatile unsigned long long *)w;
    for (;;) {
        const unsigned long long nw = (old >> CU_ST_BITS) == h.tag ? (old | bit) : ((h.tag << CU_ST_BITS) | bit);
        if (nw == old)
            return;
        const unsigned long long prev = atomicCAS(w, old, nw);
        if (prev == old)
            return;
        old = prev;
    }
}

// Every kernel's first statement: this call ran (see cu_head).
__device__ __forceinline__ void d_mark(cu_hp h)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        h.p->tag = h.tag;
}

__device__ __forceinline__ bool d_nonfinite(float f) { return (__float_as_uint(f) & 0x7f800000u) == 0x7f800000u; }

// min and max that propagate NaN (min.NaN / max.NaN, sm_80+): a NaN operand gives the
// canonical NaN 0x7fffffff
__device__ __forceinline__ float d_fmin_nan(float a, float b)
{
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float d_fmax_nan(float a, float b)
{
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// ---- cp.async staging (round 8: TAH and int encoders) ----
// 16 bytes global -> shared, through L2 only; groups committed and waited on per thread
// (a warp's copies of a group are all visible once each lane has waited for it, d_cp_wait0, and
// __syncwarp).
__device__ __forceinline__ void d_cp16s(uint32_t sa, const float *gmem) // sa: a shared-window address
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
}
// 8 bytes global -> shared (8-byte aligned; cp.async's .ca form, the only one for 8)
__device__ __forceinline__ void d_cp8(uint64_t *smem, const uint64_t *gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"((uint32_t)__cvta_generic_to_shared(smem)),
                 "l"(gmem)
                 : "memory");
}
__device__ __forceinline__ void d_cp16(float *smem, const float *gmem)
{
    d_cp16s((uint32_t)__cvta_generic_to_shared(smem), gmem);
}
// the same with an L2 cache policy (d_l2_evict_first): for data read once, so that it does
// not push out lines a later kernel reads (TAH encode's records)
__device__ __forceinline__ void d_cp16s_pol(uint32_t sa, const float *gmem, uint64_t pol)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "l"(pol)
                 : "memory");
}
__device__ __forceinline__ uint64_t d_l2_evict_first()
{
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
__device__ __forceinline__ void d_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void d_cp_wait0() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Copy n rows of CPR 16-byte chunks, contiguous at src, into buf's rows of ROWW words
// (CPR * n <= 32 M: M copies per lane at most), then commit the group of copies (also when
// n = 0, which keeps the wait counts in step). A full unit's copies evict first from L2
// (data read once, d_l2_evict_first).
// A full unit (CPR * n = 32 M) takes the first form: both addresses of copy m are a lane's
// base plus a constant (the general form cost ~20 instructions per copy, ncu: a fifth of
// TAH encode's first phase).
template <uint32_t CPR, uint32_t ROWW, uint32_t M>
__device__ __forceinline__ void d_stage_rows(float *buf, const float *src, uint32_t n, uint32_t lane)
{
    static_assert(32u % CPR == 0u, "a warp's copy covers whole rows");
    if (CPR * n == 32u * M) {
        const uint32_t sa = (uint32_t)__cvta_generic_to_shared(buf + (lane / CPR) * ROWW + (lane % CPR) * 4u);
        const float *g = src + 4u * lane;
        const uint64_t pol = d_l2_evict_first();
#pragma unroll
        for (uint32_t m = 0; m < M; m++) // copy m: rows (32 / CPR) m + lane / CPR
            d_cp16s_pol(sa + 4u * ROWW * (32u / CPR) * m, g + 128u * m, pol);
    } else {
#pragma unroll
        for (uint32_t m = 0; m < M; m++) {
            const uint32_t c = lane + 32u * m; // chunk c: row c / CPR, bytes 16 (c % CPR) ..
            if (c < CPR * n)
                d_cp16(buf + (c / CPR) * ROWW + (c % CPR) * 4u, src + (size_t)c * 4u);
        }
    }
    d_cp_commit();
}

// ---- fp16: codecs/half.c's bits (half_to_f32 ported; the roundings below are the hardware's) ----
// half_from_f32 is IEEE's round to nearest even (subnormal halves, Inf from 65520 up): cvt.rn
__device__ __forceinline__ uint16_t d_half_from_f32(float f) { return __half_as_ushort(__float2half_rn(f)); }

__device__ __forceinline__ float d_half_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = __fmul_rn((float)m, 0x1p-24f);
        return sign ? -v : v;
    }
    if (e == 31)
        return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

// half.c's half_from_f32_down / _up are IEEE's roundings toward -Inf / +Inf (subnormal
// halves; beyond 65504: +-65504 or +-Inf as the direction says), so the hardware's cvt.rm /
// cvt.rp give the same bits for every float but NaN (test_cu_codec checks all 2^32; a NaN
// comes only from non-finite input, whose payload is unspecified). Round 12: one instruction
// where the port of half.c took about 25 (TAH and int metadata, the fixpt step).
__device__ __forceinline__ uint16_t d_half_from_f32_down(float f) { return __half_as_ushort(__float2half_rd(f)); }
__device__ __forceinline__ uint16_t d_half_from_f32_up(float f) { return __half_as_ushort(__float2half_ru(f)); }

// ---- 8 codes <-> `bits` bytes (bitpack.c layout: LSB-first stream) ----
// Eight b-bit codes are exactly b bytes (b <= 16): kept as two u64 words.
__device__ __forceinline__ void d_pack8(const uint32_t c[8], uint32_t bits, uint64_t &lo, uint64_t &hi)
{
    const uint32_t mask = (1u << bits) - 1u;
    lo = 0;
    hi = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        uint32_t pos = (uint32_t)k * bits;
        uint64_t v = c[k] & mask;
        if (pos < 64) {
            lo |= v << pos;
            if (pos + bits > 64)
                hi |= v >> (64 - pos);
        } else {
            hi |= v << (pos - 64);
        }
    }
}

__device__ __forceinline__ void d_unpack8(uint64_t lo, uint64_t hi, uint32_t bits, uint32_t c[8])
{
    const uint32_t mask = (1u << bits) - 1u;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        uint32_t pos = (uint32_t)k * bits;
        uint64_t v;
        if (pos < 64) {
            v = lo >> pos;
            if (pos + bits > 64)
                v |= hi << (64 - pos);
        } else {
            v = hi >> (pos - 64);
        }
        c[k] = (uint32_t)v & mask;
    }
}

// Byte i of the little-endian pair (lo, hi).
__device__ __forceinline__ uint32_t d_byte_of(uint64_t lo, uint64_t hi, uint32_t i)
{
    return (uint32_t)((i < 8 ? lo >> (8 * i) : hi >> (8 * (i - 8))) & 0xffu);
}

// Store the first n (<= 16) bytes of (lo, hi) at dst: one wide store when
// the address and length allow, else words, else bytes.
__device__ __forceinline__ void d_store_bytes(uint8_t *dst, uint64_t lo, uint64_t hi, uint32_t n)
{
    uintptr_t a = (uintptr_t)dst;
    if (n == 16 && (a & 15u) == 0) {
        *(uint4 *)dst = make_uint4((uint32_t)lo, (uint32_t)(lo >> 32), (uint32_t)hi, (uint32_t)(hi >> 32));
    } else if (n == 8 && (a & 7u) == 0) {
        *(uint64_t *)dst = lo;
    } else if ((n & 3u) == 0 && (a & 3u) == 0) {
        for (uint32_t i = 0; i < n / 4; i++)
            ((uint32_t *)dst)[i] = (uint32_t)((i < 2 ? lo >> (32 * i) : hi >> (32 * (i - 2))));
    } else if ((n & 1u) == 0 && (a & 1u) == 0) {
        for (uint32_t i = 0; i < n / 2; i++)
            ((uint16_t *)dst)[i] = (uint16_t)(d_byte_of(lo, hi, 2 * i) | (d_byte_of(lo, hi, 2 * i + 1) << 8));
    } else {
        for (uint32_t i = 0; i < n; i++)
            dst[i] = (uint8_t)d_byte_of(lo, hi, i);
    }
}

// Load n (<= 16) bytes from src into (lo, hi), zero above n.
__device__ __forceinline__ void d_load_bytes(const uint8_t *src, uint32_t n, uint64_t &lo, uint64_t &hi)
{
    uintptr_t a = (uintptr_t)src;
    lo = 0;
    hi = 0;
    if (n == 16 && (a & 15u) == 0) {
        uint4 v = *(const uint4 *)src;
        lo = (uint64_t)v.x | ((uint64_t)v.y << 32);
        hi = (uint64_t)v.z | ((uint64_t)v.w << 32);
    } else if (n == 8 && (a & 7u) == 0) {
        lo = *(const uint64_t *)src;
    } else if ((n & 3u) == 0 && (a & 3u) == 0) {
        for (uint32_t i = 0; i < n / 4; i++) {
            uint64_t w = ((const uint32_t *)src)[i];
            if (i < 2)
                lo |= w << (32 * i);
            else
                hi |= w << (32 * (i - 2));
        }
    } else {
        for (uint32_t i = 0; i < n; i++) {
            uint64_t b = src[i];
            if (i < 8)
                lo |= b << (8 * i);
            else
                hi |= b << (8 * (i - 8));
        }
    }
}

__device__ __forceinline__ void d_put_u16(uint8_t *p, uint16_t v)
{
    if (((uintptr_t)p & 1u) == 0) {
        *(uint16_t *)p = v;
    } else {
        p[0] = (uint8_t)v;
        p[1] = (uint8_t)(v >> 8);
    }
}

__device__ __forceinline__ uint16_t d_get_u16(const uint8_t *p)
{
    if (((uintptr_t)p & 1u) == 0)
        return *(const uint16_t *)p;
    return (uint16_t)(p[0] | (p[1] << 8));
}

__device__ __forceinline__ void d_put_u32(uint8_t *p, uint32_t v)
{
    if (((uintptr_t)p & 3u) == 0) {
        *(uint32_t *)p = v;
    } else {
        for (int i = 0; i < 4; i++)
            p[i] = (uint8_t)(v >> (8 * i));
    }
}

__device__ __forceinline__ uint32_t d_get_u32(const uint8_t *p)
{
    if (((uintptr_t)p & 3u) == 0)
        return *(const uint32_t *)p;
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// ---- encoder input: fp32 or bf16 (cu_dtype_t) ----
// Every encoder kernel reads x through the helpers below, templated on its element type X.
// A bf16 element is widened exactly (its 16 bits above 16 zero bits), so an encode of bf16
// input does the float operations of an encode of the widened floats: the same payload as
// codec_encode of those floats. `vec` (a 16-byte aligned base, and offsets that keep fp32
// runs of 4 16-byte aligned) covers both types: a bf16 run of 4 is one 8-byte load.
typedef __nv_bfloat16 cu_bf16;

__device__ __forceinline__ float d_ldx(const float *x, uint64_t i) { return x[i]; }
__device__ __forceinline__ float d_ldx(const cu_bf16 *x, uint64_t i)
{
    return __uint_as_float((uint32_t)__bfloat16_as_ushort(x[i]) << 16);
}
// two bf16 in a 32-bit word (little-endian: the lower address in the low half) as floats
__device__ __forceinline__ float d_bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float d_bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Four consecutive elements at p as a float4 (p 16-byte aligned for fp32, 8-byte for bf16).
__device__ __forceinline__ float4 d_load_f4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float4 d_load_f4(const cu_bf16 *p)
{
    const uint2 a = *(const uint2 *)p;
    return make_float4(d_bf_lo(a.x), d_bf_hi(a.x), d_bf_lo(a.y), d_bf_hi(a.y));
}

// The same four from x[off..off+4) into v (aligned: off % 4 == 0 and vec).
template <typename X>
__device__ __forceinline__ void d_load4v(const X *x, uint64_t off, float v[4])
{
    const float4 a = d_load_f4(x + off);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
}

// Eight consecutive floats from x[off..off+8) with zeros at and beyond
// `end`; two 16-byte loads when the whole run is in range and aligned. The
// callers' vec implies off % 4 == 0 (fp32: 16-byte aligned), not off % 8 == 0
// (a group of 300 starts at 300 g): bf16 takes one 16-byte load where the run
// is 16-byte aligned, else two of 8 bytes.
__device__ __forceinline__ void d_load8(const cu_bf16 *x, uint64_t off, uint64_t end, bool vec, float v[8])
{
    if (vec && off + 8 <= end) {
        uint4 a;
        if ((off & 7u) == 0) {
            a = *(const uint4 *)(x + off);
        } else {
            const uint2 lo = *(const uint2 *)(x + off), hi = *(const uint2 *)(x + off + 4);
            a = make_uint4(lo.x, lo.y, hi.x, hi.y);
        }
        v[0] = d_bf_lo(a.x); v[1] = d_bf_hi(a.x); v[2] = d_bf_lo(a.y); v[3] = d_bf_hi(a.y);
        v[4] = d_bf_lo(a.z); v[5] = d_bf_hi(a.z); v[6] = d_bf_lo(a.w); v[7] = d_bf_hi(a.w);
    } else {
#pragma unroll
        for (int r = 0; r < 8; r++)
            v[r] = off + r < end ? d_ldx(x, off + r) : 0.0f;
    }
}
__device__ __forceinline__ void d_load8(const float *x, uint64_t off, uint64_t end, bool vec, float v[8])
{
    if (vec && off + 8 <= end) {
        float4 a = *(const float4 *)(x + off);
        float4 b = *(const float4 *)(x + off + 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int r = 0; r < 8; r++)
            v[r] = off + r < end ? x[off + r] : 0.0f;
    }
}

// Store the first m (<= 8) of v at out[off..).
__device__ __forceinline__ void d_store8(float *out, uint64_t off, uint32_t m, bool vec, const float v[8])
{
    if (vec && m == 8) {
        *(float4 *)(out + off) = make_float4(v[0], v[1], v[2], v[3]);
        *(float4 *)(out + off + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int r = 0; r < 8; r++)
            if ((uint32_t)r < m)
                out[off + r] = v[r];
    }
}

// ---- the split layout (round 7) ----
// A unit (group, block, tile) of 8 * tpg elements on a segment of tpg lanes, lane tl
// holding elements [4 tl, 4 tl + 4) in v[0..3] and [4 tpg + 4 tl, 4 tpg + 4 tl + 4) in
// v[4..7] (element i of the unit: register (i & 3) | (i >= 4 tpg) << 2, lane (i / 4) % tpg):
//
//   unit elements | 0-3 4-7 ... (4tpg-4)-(4tpg-1) | 4tpg-(4tpg+3) ... |
//   lane, regs    | 0,0-3  1,0-3 ...  tpg-1,0-3   | 0,4-7         ... |
//
// so every 16-byte access instruction of a segment covers whole 32-byte sectors (the
// consecutive layout above gives each instruction half of every sector it touches;
// round 7's profile had the L2 the busiest unit, 60-80 %, DRAM 30-50 %). Codes of b
// bits (b even) follow: a lane's two runs of 4 codes are b/2 bytes each. Used by
// ASH-FP8's block-256 kernels (decode 58 -> 67 % of copy with the other round-7
// changes); for the group codecs and TAH's decoder it measured no faster, they keep
// the consecutive layout (cuda/NOTES.md, round 7).

// Load lane tl's 8 elements of the unit at x[off..off+len) (zeros past len; off % 4 == 0).
template <typename X>
__device__ __forceinline__ void d_load8h(const X *x, uint64_t off, uint32_t len, uint32_t tl, uint32_t tpg,
                                         bool vec, float v[8])
{
    const uint32_t p0 = 4u * tl, p1 = 4u * (tpg + tl);
    if (vec && p1 + 4u <= len) {
        d_load4v(x, off + p0, v);
        d_load4v(x, off + p1, v + 4);
    } else {
#pragma unroll
        for (int r = 0; r < 8; r++) {
            const uint32_t i = (r < 4 ? p0 : p1) + (uint32_t)(r & 3);
            v[r] = i < len ? d_ldx(x, off + i) : 0.0f;
        }
    }
}

// Store lane tl's 8 elements of the unit at out[off..off+len) (nothing past len).
__device__ __forceinline__ void d_store8h(float *out, uint64_t off, uint32_t len, uint32_t tl, uint32_t tpg, bool vec,
                                          const float v[8])
{
    const uint32_t p0 = 4u * tl, p1 = 4u * (tpg + tl);
    if (vec && p1 + 4u <= len) {
        *(float4 *)(out + off + p0) = make_float4(v[0], v[1], v[2], v[3]);
        *(float4 *)(out + off + p1) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int r = 0; r < 8; r++) {
            const uint32_t i = (r < 4 ? p0 : p1) + (uint32_t)(r & 3);
            if (i < len)
                out[off + i] = v[r];
        }
    }
}

// A cross-lane butterfly in one instruction (round 7): other + sgn * v with sgn = +1 on
// the lower lane (u + v) and -1 on the upper (u - v). sgn * v is exact, so the fused
// multiply-add rounds once, to the same value (signed zeros included) as the CPU's
// addition or subtraction; the explicit __fmaf_rn is not a contraction (-fmad=false
// keeps the compiler from forming others).
__device__ __forceinline__ float d_bfly(float v, float sgn, float other) { return __fmaf_rn(v, sgn, other); }

// Hadamard stages h = 1, 2, 4 of 8 elements in registers (element i in v[i]), the
// CPU's butterflies (lower gets u + v, upper u - v). Also stages 8, 16, 32 of a
// 64-element tile whose lane holds elements l + 8i (TAH's transposed passes).
__device__ __forceinline__ void d_fwht8(float v[8])
{
#pragma unroll
    for (int h = 1; h < 8; h *= 2) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if ((i & h) == 0) {
                float a = v[i], b = v[i + h];
                v[i] = __fadd_rn(a, b);
                v[i + h] = __fsub_rn(a, b);
            }
        }
    }
}

// Hadamard stages h = 1, 2, 4 on a lane's 8 consecutive elements, then
// h = 8*o for o = 1 .. tpg/2 across the segment; butterflies in the CPU's
// order (ascending h; lower gets u + v, upper u - v), so bit-identical.
__device__ __forceinline__ void d_fwht_seg(float v[8], uint32_t lane, uint32_t tpg)
{
    d_fwht8(v);
    for (uint32_t o = 1; o < tpg; o *= 2) {
        const float sgn = (lane & o) ? -1.0f : 1.0f;
#pragma unroll
        for (int r = 0; r < 8; r++) {
            float other = __shfl_xor_sync(CU_FULL, v[r], (int)o);
            v[r] = d_bfly(v[r], sgn, other);
        }
    }
}

// Segment reductions (offsets < tpg stay inside the segment).
__device__ __forceinline__ float d_seg_maxf(float v, uint32_t tpg)
{
    for (uint32_t o = 1; o < tpg; o *= 2)
        v = fmaxf(v, __shfl_xor_sync(CU_FULL, v, (int)o));
    return v;
}
__device__ __forceinline__ float d_seg_minf(float v, uint32_t tpg)
{
    for (uint32_t o = 1; o < tpg; o *= 2)
        v = fminf(v, __shfl_xor_sync(CU_FULL, v, (int)o));
    return v;
}
__device__ __forceinline__ uint32_t d_seg_maxu(uint32_t v, uint32_t tpg)
{
    for (uint32_t o = 1; o < tpg; o *= 2)
        v = max(v, __shfl_xor_sync(CU_FULL, v, (int)o));
    return v;
}
__device__ __forceinline__ uint32_t d_seg_minu(uint32_t v, uint32_t tpg)
{
    for (uint32_t o = 1; o < tpg; o *= 2)
        v = min(v, __shfl_xor_sync(CU_FULL, v, (int)o));
    return v;
}

// ---- per-codec entry points (cu_codec.cu dispatches; scratch is past the head) ----
int cu_raw_encode(const codec_spec_t *spec, uint64_t n, cu_dtype_t xt, const void *x, uint8_t *payload,
                  cu_hp head, cudaStream_t st, char *err, size_t errlen);
int cu_raw_decode(const codec_spec_t *spec, uint64_t n, const uint8_t *payload, float *out, cu_hp head,
                  cudaStream_t st, char *err, size_t errlen);
size_t cu_group_scratch(const codec_spec_t *spec, uint64_t n);
int cu_group_encode(const codec_spec_t *spec, uint64_t n, cu_dtype_t xt, const void *x, uint8_t *payload,
                    cu_hp head, void *work, cudaStream_t st, char *err, size_t errlen);
int cu_group_decode(const codec_spec_t *spec, uint64_t n, const uint8_t *payload, float *out, cu_hp head,
                    cudaStream_t st, char *err, size_t errlen);
size_t cu_ash_scratch(const codec_spec_t *spec, uint64_t n);
int cu_ash_encode(const codec_spec_t *spec, uint64_t n, cu_dtype_t xt, const void *x, uint8_t *payload,
                  cu_hp head, void *work, cudaStream_t st, char *err, size_t errlen);
int cu_ash_decode(const codec_spec_t *spec, uint64_t n, const uint8_t *payload, float *out, cu_hp head,
                  void *work, cudaStream_t st, char *err, size_t errlen);
size_t cu_tah_scratch(const codec_spec_t *spec, codec_shape_t shape);
// stages: CU_TAH_ENTROPY | CU_TAH_SELECT | CU_TAH_QUANT (all of them for a real encode; the
// benchmark times subsets through cu_codec_encode_stages, cu_codec.cu)
#define CU_TAH_MEMSET 1u
#define CU_TAH_ENTROPY 2u
#define CU_TAH_SELECT 4u
#define CU_TAH_QUANT 8u
#define CU_TAH_ALL 15u
int cu_tah_encode(const codec_spec_t *spec, codec_shape_t shape, const float *x, uint8_t *payload, cu_hp head,
                  void *work, cudaStream_t st, unsigned int stages, char *err, size_t errlen);
// bf16 input read by the kernels themselves (k_tah_spec's staging): 0 or a TAH_E* code, 1 where
// that encode does not apply (its shape and alignment conditions, TAH_CU_SPEC=0 or
// TAH_CU_FUSE=0): the caller then widens x and runs cu_tah_encode.
int cu_tah_encode_bf16(const codec_spec_t *spec, codec_shape_t shape, const cu_bf16 *x, uint8_t *payload, cu_hp head,
                       void *work, cudaStream_t st, char *err, size_t errlen);
int cu_tah_decode(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *payload, float *out,
                  cu_hp head, void *work, cudaStream_t st, char *err, size_t errlen);

// The one-launch encoders (round 6: k_int_fused, k_tah_fused; and TAH-Quant's k_tah_spec +
// k_tah_emit) unless TAH_CU_FUSE=0 (then int: k_int_stats + k_int_codes; TAH-Quant: a memset
// and four kernels). The default int encoder, k_int_quad, is one launch either way.
bool cu_fuse(void);
// The newer kernels unless TAH_CU_TPT=0 (then round 7's segment kernels: a same-binary
// comparison): round 8's lane pairs per TAH tile (encode and decode), round 10's warp per
// group (fixpt and int, groups of 128) and ASH-FP8's FULL block-256 form.
bool cu_tpt(void);
// TAH encode as k_tah_spec + k_tah_emit (round 17: both code widths of every tile from one
// read of x, the selection afterwards) unless TAH_CU_SPEC=0 (then k_tah_fused).
bool cu_spec(void);
// Dynamic shared memory a block of the current device may opt in to, less
// `reserve` bytes for the kernel's static shared memory (0 on error).
size_t cu_smem_optin(size_t reserve);
// Raise `kernel`'s dynamic shared-memory limit to `bytes` (no-op <= 48 KB).
cudaError_t cu_smem_allow(const void *kernel, size_t bytes);
// Blocks of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory) that
// can be resident at once on the current device: the largest grid of a cooperative
// launch (cudaLaunchCooperativeKernel, grid-wide barriers). 0 when the device has no
// cooperative launch or a query fails.
int cu_coop_blocks(const void *kernel, int threads, size_t smem);

// Grid for `units` work items handled `per_block` at a time (grid-stride loops cover any excess).
static inline unsigned int cu_grid(uint64_t units, uint64_t per_block)
{
    uint64_t g = (units + per_block - 1) / per_block;
    if (g < 1)
        g = 1;
    return g > 0x7fffffffull ? 0x7fffffffu : (unsigned int)g;
}

#endif
