// cu_ash.cu — ASH-FP8 (TACO) on the GPU, codecs/ash.c's payload: per block
// of n = `block` elements, f32 alpha, f32 s, n E4M3 codes.
//
// block 256 (the default): k_ash_enc256 / k_ash_dec256, four blocks per warp on the split
// layout (lane l holds elements 4l..4l+3 and 128+4l..128+4l+3; stages 1, 2 in registers,
// 4..64 across lanes, 128 between the lane's two runs; see the comment above k_ash_enc256).
//
// blocks 16..128: a segment of tpg = n/8 lanes per block (k_ash_enc_warp, k_ash_dec_warp),
// lane l holds elements [8l, 8l+8) in registers (two 16-byte loads):
//
//   warp (n = 128): lane 0: x[0..8)  lane 1: x[8..16) ... lane 15: x[120..128)
//   Hadamard: stages h = 1,2,4 inside the lane, h = 8..64 with
//   __shfl_xor_sync(lane ^ 1 .. lane ^ 8); max|z| a shuffle reduction;
//   codes: 4 hardware cvt.rn.satfinite.e4m3x2 per lane, one 8-byte store.
//
// The sum of squares S is codecs/ash.c's pairwise tree, so alpha is the
// CPU's to the bit: each lane's 8 squares as a tree of 8 in registers, then
// __shfl_xor_sync 1, 2, ... pairs the neighbouring lanes' sums level by level
// (d_sumsq_seg). Outside [2^-64, FLT_MAX] (rare: ash.c's header) the same tree
// again, of x scaled by 2^80 or 2^-80.
//
// block >= 512: one CTA of 256 threads per block, the block in a buffer
// (shared memory up to 8192 elements, else a slice of the scratch), the
// same operations with __syncthreads between Hadamard stages.
//
// Decode mirrors it; the tensor's last block, when partial, is decoded by
// one CTA with ash.c's folded transform (s_decode_partial), so the floats
// match the CPU's. Metadata and codes are checked as ash.c checks them.
#include <cuda_fp8.h> // __nv_cvt_float2_to_fp8x2
#include <float.h>
#include <math.h>

#include "cu_common.cuh"

#define S_CTA 256u // k_ash_enc_cta adds its 8 warps' sums as a tree of 8
#define S_SMEM_MAX 8192u  // block elements kept in shared memory (32 KB)
#define S_BIG_GRID 256u   // CTAs of the scratch-buffer path (n > S_SMEM_MAX)

struct s_ap {
    uint64_t total, nb, nfull; // elements, blocks, full blocks
    uint32_t n, tpg;
    float tau, eps, norm;      // norm = (float)(1/sqrt(n)), as fwht_f32
    bool vec_x;                // x / out 16-byte aligned
};

// Constants of the partial last block's folded decode (host-computed as ash.c does).
struct s_partial {
    uint32_t m, P, h, r, p;
    float normP, kP, normp, kp, normh, kh;
};

#ifdef TAH_CU_SOFT_E4M3
// Integer port of codecs/fp8.c's encoder (RNE, saturating): the fallback if
// the hardware conversion ever disagrees with it (test_cu_codec checks).
__device__ __forceinline__ uint32_t d_e4m3_soft(float f)
{
    uint32_t x = __float_as_uint(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t e = ax >> 23;
    uint32_t sh = (e >= 110u && e <= 120u) ? 141u - e : 31u;
    uint32_t sub = (mant + (1u << (sh - 1)) - 1u + ((mant >> sh) & 1u)) >> sh;
    uint32_t nrm = (ax - 0x3c000000u + 0x7ffffu + ((ax >> 20) & 1u)) >> 20;
    nrm = nrm > 0x7eu ? 0x7eu : nrm;
    uint32_t r = ax < 0x3c800000u ? sub : nrm;
    r = ax > 0x7f800000u ? 0x7fu : r;
    return r | sign;
}
__device__ __forceinline__ uint32_t d_e4m3x2(float a, float b) { return d_e4m3_soft(a) | (d_e4m3_soft(b) << 8); }
#else
// hardware cvt.rn.satfinite.e4m3x2.f32: low byte from a
__device__ __forceinline__ uint32_t d_e4m3x2(float a, float b)
{
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}
#endif

// codes of z[0..8) scaled as ash.c: z * (1/s), or z / s when 1/s overflows
__device__ __forceinline__ uint64_t d_codes8(const float z[8], float s, float inv)
{
    float t[8];
    if (inv <= FLT_MAX) { // one test for the 8 (the divisions are the rare path)
#pragma unroll
        for (int r = 0; r < 8; r++)
            t[r] = __fmul_rn(z[r], inv);
    } else {
#pragma unroll
        for (int r = 0; r < 8; r++)
            t[r] = __fdiv_rn(z[r], s);
    }
    uint64_t q = 0;
#pragma unroll
    for (int r = 0; r < 8; r += 2)
        q |= (uint64_t)d_e4m3x2(t[r], t[r + 1]) << (8 * r);
    return q;
}

// exact E4M3 -> float (port of fp8.c's decoder)
__device__ __forceinline__ float d_e4m3_to_f32(uint32_t c)
{
    uint32_t c7 = c & 0x7fu, m = c & 7u;
    uint32_t sign = (c & 0x80u) << 24;
    uint32_t nrm = (c7 << 20) + 0x3c000000u;
    uint32_t pw = (uint32_t)(m >= 2u) + (uint32_t)(m >= 4u);
    uint32_t sub = m ? (((118u + pw) << 23) | ((m << (23u - pw)) & 0x7fffffu)) : 0u;
    uint32_t bits = c7 < 8u ? sub : nrm;
    return __uint_as_float(bits | sign);
}

// alpha = clamp(tau / (sqrt(sum/n) + eps), 2^-126, 2^127), in double then float
__device__ __forceinline__ float d_alpha(double sum, uint32_t n, float tau, float eps)
{
    double sigma = __dadd_rn(sqrt(sum / (double)n), (double)eps);
    double ad = sigma > 0.0 ? (double)tau / sigma : (double)FLT_MAX;
    ad = ad < (double)FLT_MIN ? (double)FLT_MIN : ad;
    ad = ad > 0x1p127 ? 0x1p127 : ad;
    return (float)ad;
}

// ash.c's S: the pairwise tree, in float, of the squares of x * sc (sc = 1, or 2^80 / 2^-80 where
// the first tree is outside [2^-64, FLT_MAX]: d_sumsq_redo; d_sumsq_s scales the result back).
__device__ __forceinline__ bool d_sumsq_ok(float s) { return s >= 0x1p-64f && s <= FLT_MAX; }
__device__ __forceinline__ float d_sumsq_redo(float s) { return s < 0x1p-64f ? 0x1p80f : 0x1p-80f; }
__device__ __forceinline__ double d_sumsq_s(float s, float sc)
{
    return sc == 1.0f ? (double)s : (double)s * (sc > 1.0f ? 0x1p-160 : 0x1p160);
}

template <bool SC>
__device__ __forceinline__ float d_sq(float v, float sc)
{
    const float u = SC ? __fmul_rn(v, sc) : v;
    return __fmul_rn(u, u);
}

// the tree of 4 consecutive elements
template <bool SC>
__device__ __forceinline__ float d_sq4(const float *v, float sc)
{
    return __fadd_rn(__fadd_rn(d_sq<SC>(v[0], sc), d_sq<SC>(v[1], sc)), __fadd_rn(d_sq<SC>(v[2], sc), d_sq<SC>(v[3], sc)));
}

// the tree of a segment of tpg lanes, lane tl holding elements [8 tl, 8 tl + 8): every lane of
// the segment returns it (each adds its left and right halves: IEEE addition commutes)
template <bool SC>
__device__ __forceinline__ float d_sumsq_seg(const float v[8], uint32_t tpg, float sc)
{
    float t = __fadd_rn(d_sq4<SC>(v, sc), d_sq4<SC>(v + 4, sc));
    for (uint32_t o = 1; o < tpg; o *= 2)
        t = __fadd_rn(t, __shfl_xor_sync(CU_FULL, t, (int)o));
    return t;
}

// the tree of a run of c (a power of two) consecutive elements at q, by a binary counter of
// partial sums (the tree of ash.c's s_tree, which builds it a level at a time)
__device__ __forceinline__ float d_sumsq_run(const float *q, uint32_t c, float sc)
{
    float st[17];
    for (uint32_t i = 0; i < c; i++) {
        float v = d_sq<true>(q[i], sc);
        uint32_t k = 0;
        for (uint32_t b = i; b & 1u; b >>= 1, k++)
            v = __fadd_rn(st[k], v);
        st[k] = v;
    }
    return st[31 - __clz((int)c)];
}

__device__ __forceinline__ float d_clampf(float y)
{
    y = y > FLT_MAX ? FLT_MAX : y;
    return y < -FLT_MAX ? -FLT_MAX : y;
}

// ---------------------------------------------------------------- block <= 256

// Block b (of a.n = 8 tpg elements; b >= a.nb: none, but the lanes still take part in the
// shuffles) by the segment of tpg lanes that the calling lane belongs to (lane tl: elements
// [8 tl, 8 tl + 8)); every lane of the warp calls. Non-finite x sets bad, a non-finite z range.
template <typename X>
__device__ __forceinline__ void d_ash_enc_seg(const X *__restrict__ x, uint8_t *__restrict__ p, const s_ap &a,
                                              uint64_t b, uint32_t lane, uint32_t tpg, uint32_t &bad, uint32_t &range)
{
    const uint32_t n = a.n, tl = lane % tpg;
    const bool valid = b < a.nb;
    const uint64_t off = b * n;
    const uint32_t m = valid ? (uint32_t)(a.total - off < n ? a.total - off : n) : 0u;
    float v[8];
    d_load8(x, off + 8u * tl, off + m, a.vec_x, v); // m = 0: all zeros, nothing read
#pragma unroll
    for (int r = 0; r < 8; r++)
        bad |= (uint32_t)d_nonfinite(v[r]);
    const float sf = d_sumsq_seg<false>(v, tpg, 1.0f); // ash.c's S (padding: zeros from d_load8)
    double sum = sf;
    if (!__all_sync(CU_FULL, d_sumsq_ok(sf))) { // rare: the tree again, scaled
        const float sc = d_sumsq_ok(sf) ? 1.0f : d_sumsq_redo(sf);
        sum = d_sumsq_s(d_sumsq_seg<true>(v, tpg, sc), sc);
    }
    const float alpha = d_alpha(sum, n, a.tau, a.eps);
#pragma unroll
    for (int r = 0; r < 8; r++)
        v[r] = __fmul_rn(alpha, v[r]);
    d_fwht_seg(v, lane, tpg);
    uint32_t am = 0;
#pragma unroll
    for (int r = 0; r < 8; r++) {
        v[r] = __fmul_rn(v[r], a.norm);
        am = max(am, __float_as_uint(v[r]) & 0x7fffffffu);
    }
    am = d_seg_maxu(am, tpg);
    if (!valid)
        return;
    range |= (uint32_t)(am >= 0x7f800000u);
    uint8_t *dst = p + b * (uint64_t)(8u + n);
    uint64_t meta = 0, codes = 0;
    if (am != 0) {
        float s = __fdiv_rn(__uint_as_float(am), 448.0f);
        if (s == 0.0f)
            s = __uint_as_float(1u); // 2^-149
        const float inv = __fdiv_rn(1.0f, s);
        codes = d_codes8(v, s, inv);
        meta = (uint64_t)__float_as_uint(alpha) | ((uint64_t)__float_as_uint(s) << 32);
    }
    if (tl == 0)
        d_store_bytes(dst, meta, 0, 8);
    d_store_bytes(dst + 8u + 8u * tl, codes, 0, 8);
}

template <typename X>
__global__ void __launch_bounds__(256) k_ash_enc_warp(const X *__restrict__ x, uint8_t *__restrict__ p, cu_hp head,
                                                      s_ap a)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u, spw = 32u / a.tpg;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32u;
    uint32_t bad = 0, range = 0;
    for (uint64_t base = warp * spw; base < a.nb; base += nwarps * spw)
        d_ash_enc_seg(x, p, a, base + lane / a.tpg, lane, a.tpg, bad, range);
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
    if (range)
        d_flag(head, CU_ST_RANGE);
}

// Checks of one block's scalars (ash.c's s_check_block); 1 if corrupt.
__device__ __forceinline__ uint32_t d_check_meta(uint32_t ua, uint32_t us, float &s, float &inv_alpha)
{
    if (ua >= 0x7f800000u || us >= 0x7f800000u)
        return 1;
    const float alpha = __uint_as_float(ua);
    s = __uint_as_float(us);
    inv_alpha = 0.0f;
    if (s == 0.0f)
        return 0;
    if (alpha < FLT_MIN || alpha > 0x1p127f)
        return 1;
    inv_alpha = __fdiv_rn(1.0f, alpha);
    return 0;
}

__device__ __forceinline__ uint32_t d_has_nan_code(uint64_t q)
{
    uint32_t nan = 0;
#pragma unroll
    for (int r = 0; r < 8; r++)
        nan |= (uint32_t)(((q >> (8 * r)) & 0x7fu) == 0x7fu);
    return nan;
}

__global__ void __launch_bounds__(256) k_ash_dec_warp(const uint8_t *__restrict__ p, float *__restrict__ out,
                                                      cu_hp head, s_ap a)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t n = a.n, tpg = a.tpg, spw = 32u / tpg, seg = lane / tpg, tl = lane % tpg;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32u;
    uint32_t corrupt = 0, bad = 0;
    for (uint64_t base = warp * spw; base < a.nfull; base += nwarps * spw) {
        const uint64_t b = base + seg;
        const bool valid = b < a.nfull; // the partial last block has its own kernel
        const uint8_t *src = p + b * (uint64_t)(8u + n);
        uint64_t q = 0, hi;
        float s = 0.0f, inv_alpha = 0.0f;
        if (valid) {
            corrupt |= d_check_meta(d_get_u32(src), d_get_u32(src + 4), s, inv_alpha);
            d_load_bytes(src + 8u + 8u * tl, 8, q, hi);
            corrupt |= d_has_nan_code(q);
        }
        float v[8];
#pragma unroll
        for (int r = 0; r < 8; r++)
            v[r] = __fmul_rn(d_e4m3_to_f32((uint32_t)(q >> (8 * r)) & 0xffu), s);
        d_fwht_seg(v, lane, tpg);
        if (!valid)
            continue;
#pragma unroll
        for (int r = 0; r < 8; r++) {
            float y = s == 0.0f ? 0.0f : d_clampf(__fmul_rn(__fmul_rn(v[r], a.norm), inv_alpha));
            bad |= (uint32_t)d_nonfinite(y);
            v[r] = y;
        }
        d_store8(out, b * n + 8u * tl, 8, a.vec_x, v);
    }
    if (corrupt)
        d_flag(head, CU_ST_CORRUPT);
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

// ---------------------------------------------------------------- block = 256, 4 blocks per warp
//
// The default block (n = 256): each warp takes K = 4 consecutive blocks per
// iteration; all 8 of its 16-byte loads per lane are issued before the
// first use. The sums of squares of the 4 blocks (codecs/ash.c's pairwise
// tree) come from registers and 10 shuffles (d_sumsq_k4): lanes with
// d_blk(lane) = b hold block b's S and compute its alpha (one double sqrt +
// division per warp iteration instead of one per block); the Hadamard then
// runs per block. (Until round 32 ash.c's S was a double sum of 8 chains
// i mod 8: the squares went through shared memory, each converted to double,
// 68 % of copy on an H200 where the tree gives 74 %.)
//
// Round 7: the split layout (cu_common.cuh): lane l holds elements 4l..4l+3
// and 128+4l..128+4l+3 of a block, so each 16-byte load (encode) and store
// (decode) instruction covers whole sectors (round 6's lane l: 8l..8l+7 gave
// each instruction half of every sector; the decoder was L2-bound at 80 %
// L2 busy, 36 % DRAM). The Hadamard stages keep the CPU's order: h = 1, 2
// inside each run of 4, h = 4..64 across lanes (lane bits 0..4), h = 128
// between the two runs. Codes go out as two 4-byte runs per lane. The
// encoder's block maximum is one warp reduction (redux) and the scale s and
// 1/s of the warp's 4 blocks are computed on the lanes of d_blk, one block each,
// then shuffled (round 6: both IEEE divisions on every lane of every block).
#define S_K 4u        // blocks per warp iteration (n = 256)
#define S_WARPS (S_CTA / 32u)
#define S_ENC_CTA 128u // k_ash_enc256's CTA (see the comment above it)
#define S_ENC_WARPS (S_ENC_CTA / 32u)

// S of the warp's S_K = 4 blocks on the split layout (lane l: elements 4l..4l+3 of each block
// in v[b][0..3], 128+4l.. in v[b][4..7]). The tree's nodes of 4 elements are the lanes' runs
// (t[2b + r]: block b, run r); the levels above them pair lanes l ^ 1, l ^ 2, ..., l ^ 16 within
// each run, then run 0 + run 1. The first three levels each halve what a lane keeps (the 8
// values, then 4, 2, 1: 7 shuffles, not 24), the last two are plain butterflies, and the runs
// meet across lane ^ 4. Lane l ends with block d_blk(l)'s S; d_blk_lane(b) is a lane holding
// block b's (so is that lane + 4, + 8, ...).
__device__ __forceinline__ uint32_t d_blk(uint32_t lane) { return ((lane & 1u) << 1) | ((lane >> 1) & 1u); }
__device__ __forceinline__ uint32_t d_blk_lane(uint32_t b) { return (b >> 1) | ((b & 1u) << 1); }

__device__ __forceinline__ float d_sumsq_k4(const float v[S_K][8], uint32_t lane)
{
    float t[2 * S_K];
#pragma unroll
    for (uint32_t b = 0; b < S_K; b++) {
        t[2 * b] = d_sq4<false>(v[b], 1.0f);
        t[2 * b + 1] = d_sq4<false>(v[b] + 4, 1.0f);
    }
    const bool c = lane & 1u, d = lane & 2u, e = lane & 4u;
    float h[4], q[2];
#pragma unroll
    for (int i = 0; i < 4; i++) // keep values 4c .. 4c+3
        h[i] = __fadd_rn(c ? t[4 + i] : t[i], __shfl_xor_sync(CU_FULL, c ? t[i] : t[4 + i], 1));
#pragma unroll
    for (int i = 0; i < 2; i++) // keep 4c + 2d, 4c + 2d + 1
        q[i] = __fadd_rn(d ? h[2 + i] : h[i], __shfl_xor_sync(CU_FULL, d ? h[i] : h[2 + i], 2));
    float r = __fadd_rn(e ? q[1] : q[0], __shfl_xor_sync(CU_FULL, e ? q[0] : q[1], 4)); // value 4c + 2d + e
    r = __fadd_rn(r, __shfl_xor_sync(CU_FULL, r, 8));
    r = __fadd_rn(r, __shfl_xor_sync(CU_FULL, r, 16)); // block 2c + d, run e
    return __fadd_rn(r, __shfl_xor_sync(CU_FULL, r, 4)); // run 0 + run 1
}

// The Hadamard of a block of 256 on the split layout: h = 1, 2 in each run of 4
// registers, h = 4..64 across lanes, h = 128 between the runs; the CPU's butterflies in
// the CPU's order (the cross-lane ones by d_bfly).
__device__ __forceinline__ void d_fwht32h(float v[8], uint32_t lane)
{
#pragma unroll
    for (int h = 1; h < 4; h *= 2) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if ((i & h) == 0) {
                float a = v[i], b = v[i + h];
                v[i] = __fadd_rn(a, b);
                v[i + h] = __fsub_rn(a, b);
            }
        }
    }
#pragma unroll
    for (uint32_t o = 1; o < 32; o *= 2) {
        const float sgn = (lane & o) ? -1.0f : 1.0f;
#pragma unroll
        for (int r = 0; r < 8; r++) {
            const float other = __shfl_xor_sync(CU_FULL, v[r], (int)o);
            v[r] = d_bfly(v[r], sgn, other);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float a = v[i], b = v[i + 4];
        v[i] = __fadd_rn(a, b);
        v[i + 4] = __fsub_rn(a, b);
    }
}

// The bits of max |v[r]|, NaN-propagating (max.NaN: a NaN anywhere gives the canonical
// NaN 0x7fffffff): for the rest the same as the integer max of the |v| bits, in 7
// instructions (|.| is an operand modifier) instead of 8 masks and 4 maxima.
__device__ __forceinline__ uint32_t d_absbits_max8_nan(const float v[8])
{
    float m[4];
#pragma unroll
    for (int r = 0; r < 4; r++)
        m[r] = d_fmax_nan(fabsf(v[r]), fabsf(v[r + 4]));
    return __float_as_uint(d_fmax_nan(d_fmax_nan(m[0], m[1]), d_fmax_nan(m[2], m[3])));
}

__device__ __forceinline__ uint32_t d_absbits_max8(const float v[8])
{
    uint32_t am = 0;
#pragma unroll
    for (int r = 0; r < 8; r++)
        am = max(am, __float_as_uint(v[r]) & 0x7fffffffu);
    return am;
}

// Round 11: CTAs of 4 warps, FULL at 72 registers and 7 CTAs per SM (28 warps; round 10's
// 8-warp CTAs at 80 registers fit 3, 24 warps; capped at 64 for 32 warps it spills and
// measured 2.5 points slower); the general form at 6 CTAs (85 registers, no spill).
// FULL (round 10): every block whole, x 16-byte aligned, the payload 4-byte aligned and
// fewer than 2^31 elements: 32-bit offsets from per-warp base pointers (the loads and
// stores take immediate offsets), no partial-block branches, 4-byte code stores. Round 11:
// also a whole number of warp iterations (nb % S_K == 0, no load guards), and one
// warp-uniform test per iteration for the common case (below) instead of a zero-block and
// a 1/s test per block.
template <bool FULL, typename X>
__global__ void __launch_bounds__(S_ENC_CTA, FULL ? 7 : 6) k_ash_enc256(const X *__restrict__ x, uint8_t *__restrict__ p,
                                                    cu_hp head, s_ap a)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t cb = d_blk(lane); // the block whose S, alpha, s and 1/s this lane computes
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32u;
    uint32_t inmax = 0, range = 0;
    for (uint64_t base = warp * S_K; base < a.nb; base += nwarps * S_K) {
        float v[S_K][8];
        if (FULL) {
            const X *xw = x + 256u * (uint32_t)base + 4u * lane;
#pragma unroll
            for (uint32_t b = 0; b < S_K; b++) {
                d_load4v(xw + 256u * b, 0, v[b]);
                d_load4v(xw + 256u * b + 128u, 0, v[b] + 4);
            }
        } else {
#pragma unroll
            for (uint32_t b = 0; b < S_K; b++) {
                const uint64_t off = (base + b) * 256u;
                const uint32_t len = base + b < a.nb ? (uint32_t)(a.total - off < 256u ? a.total - off : 256u) : 0u;
                d_load8h(x, off, len, lane, 32u, a.vec_x, v[b]); // past len: zeros, nothing read
            }
        }
        if (!FULL)
#pragma unroll
            for (uint32_t b = 0; b < S_K; b++)
                inmax = max(inmax, d_absbits_max8(v[b]));
        // ash.c's S of block cb (blocks past nb, !FULL: zeros, unused)
        const float sf = d_sumsq_k4(v, lane);
        if (!__all_sync(CU_FULL, d_sumsq_ok(sf) || (!FULL && base + cb >= a.nb))) { // blocks past nb: unused
            // rare (S outside [2^-64, FLT_MAX]: tiny, huge or non-finite x): these 4 blocks by the
            // segment encoder (a warp per block), which takes ash.c's scaled tree; v is not live
            // past this branch, so it costs the common path no registers
            uint32_t bad = 0;
#pragma unroll 1
            for (uint32_t b = 0; b < S_K; b++)
                d_ash_enc_seg(x, p, a, base + b, lane, 32u, bad, range);
            inmax |= bad << 31;
            continue;
        }
        const double sum = sf;
        const float alpha_cb = d_alpha(sum, 256u, a.tau, a.eps);
        // the transform of every block, its max |z| (warp-uniform)
        uint32_t am[S_K];
#pragma unroll
        for (uint32_t b = 0; b < S_K; b++) {
            const float alpha = __shfl_sync(CU_FULL, alpha_cb, (int)d_blk_lane(b));
#pragma unroll
            for (int r = 0; r < 8; r++)
                v[b][r] = __fmul_rn(alpha, v[b][r]);
            d_fwht32h(v[b], lane);
#pragma unroll
            for (int r = 0; r < 8; r++)
                v[b][r] = __fmul_rn(v[b][r], a.norm);
            am[b] = __reduce_max_sync(CU_FULL, d_absbits_max8_nan(v[b]));
            range |= (uint32_t)((FULL || base + b < a.nb) && am[b] >= 0x7f800000u);
        }
        // the chain lanes of block cb: its scale s and 1/s
        uint32_t am_c = am[0];
#pragma unroll
        for (uint32_t b = 1; b < S_K; b++)
            am_c = cb == b ? am[b] : am_c;
        float s_c = 0.0f, inv_c = 0.0f;
        if (am_c != 0) {
            s_c = __fdiv_rn(__uint_as_float(am_c), 448.0f);
            if (s_c == 0.0f)
                s_c = __uint_as_float(1u); // 2^-149
            inv_c = __fdiv_rn(1.0f, s_c);
        }
        // FULL, no zero block and every 1/s finite (nearly always): the codes by products
        // alone, packed by byte permutes, stored from a per-warp base with immediate
        // offsets; lane d_blk_lane(b) holds block b's alpha and that lane + 4 its s, which lanes 0 and 1
        // fetch as the block's two metadata words
        if (FULL && __all_sync(CU_FULL, am_c != 0 && inv_c <= FLT_MAX)) {
            const float mv = (lane & 4u) ? s_c : alpha_cb; // lanes d_blk_lane(b) and d_blk_lane(b) + 4
            uint32_t *pw = (uint32_t *)(p + 264u * (uint32_t)base) + lane;
#pragma unroll
            for (uint32_t b = 0; b < S_K; b++) {
                const float inv = __shfl_sync(CU_FULL, inv_c, (int)d_blk_lane(b));
                const float mw = __shfl_sync(CU_FULL, mv, (int)(d_blk_lane(b) + 4u * (lane & 1u)));
                uint32_t c[4];
#pragma unroll
                for (int r = 0; r < 4; r++)
                    c[r] = d_e4m3x2(__fmul_rn(v[b][2 * r], inv), __fmul_rn(v[b][2 * r + 1], inv));
                if (lane < 2u)
                    pw[66u * b] = __float_as_uint(mw);
                pw[66u * b + 2u] = __byte_perm(c[0], c[1], 0x5410u);
                pw[66u * b + 34u] = __byte_perm(c[2], c[3], 0x5410u);
            }
            continue;
        }
#pragma unroll
        for (uint32_t b = 0; b < S_K; b++) {
            const uint64_t blk = base + b;
            const float alpha = __shfl_sync(CU_FULL, alpha_cb, (int)d_blk_lane(b));
            const float s = __shfl_sync(CU_FULL, s_c, (int)d_blk_lane(b));
            const float inv = __shfl_sync(CU_FULL, inv_c, (int)d_blk_lane(b));
            if (!FULL && blk >= a.nb) // warp-uniform
                break;
            uint64_t meta = 0, codes = 0;
            if (am[b] != 0) {
                codes = d_codes8(v[b], s, inv);
                meta = (uint64_t)__float_as_uint(alpha) | ((uint64_t)__float_as_uint(s) << 32);
            }
            if (FULL) {
                uint32_t *dw = (uint32_t *)(p + 264u * (uint32_t)blk);
                if (lane < 2u)
                    dw[lane] = lane ? (uint32_t)(meta >> 32) : (uint32_t)meta;
                dw[2u + lane] = (uint32_t)codes;
                dw[34u + lane] = (uint32_t)(codes >> 32);
            } else {
                uint8_t *dst = p + blk * (uint64_t)(8u + 256u);
                if (lane == 0)
                    d_store_bytes(dst, meta, 0, 8);
                d_store_bytes(dst + 8u + 4u * lane, (uint32_t)codes, 0, 4);
                d_store_bytes(dst + 8u + 128u + 4u * lane, codes >> 32, 0, 4);
            }
        }
    }
    if (inmax >= 0x7f800000u)
        d_flag(head, CU_ST_NONFINITE);
    if (range)
        d_flag(head, CU_ST_RANGE);
}

// 8 codes -> floats * s: hardware cvt.rn.f16x2.e4m3x2 (exact: every E4M3
// value is an fp16 value; NaN codes are rejected by the caller), then exact
// f16 -> f32, then the CPU's one rounding e4m3_to_f32(q) * s.
__device__ __forceinline__ void d_dequant8(uint64_t q, float s, float v[8])
{
#ifdef TAH_CU_SOFT_E4M3
#pragma unroll
    for (int r = 0; r < 8; r++)
        v[r] = __fmul_rn(d_e4m3_to_f32((uint32_t)(q >> (8 * r)) & 0xffu), s);
#else
#pragma unroll
    for (int r = 0; r < 8; r += 2) {
        const unsigned short two = (unsigned short)(q >> (8 * r));
        unsigned int h2;
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(two));
        float lo, hi;
        asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"((unsigned short)(h2 & 0xffffu)));
        asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"((unsigned short)(h2 >> 16)));
        v[r] = __fmul_rn(lo, s);
        v[r + 1] = __fmul_rn(hi, s);
    }
#endif
}

// any byte of q with (byte & 0x7f) == 0x7f (E4M3 NaN): SWAR, no carries
// between bytes (each masked byte + 1 <= 0x80)
__device__ __forceinline__ uint32_t d_has_nan_code_swar(uint64_t q)
{
    const uint64_t t = q & 0x7f7f7f7f7f7f7f7full;
    return (uint32_t)(((t + 0x0101010101010101ull) & 0x8080808080808080ull) != 0);
}

// FULL (round 10): out 16-byte aligned, the payload 4-byte aligned, fewer than 2^31
// elements: direct 4-byte loads, 32-bit offsets, 16-byte stores.
template <bool FULL>
__global__ void __launch_bounds__(256) k_ash_dec256(const uint8_t *__restrict__ p, float *__restrict__ out,
                                                    cu_hp head, s_ap a)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u, cb = lane >> 3;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32u;
    uint32_t corrupt = 0, outmax = 0;
    for (uint64_t base = warp * S_K; base < a.nfull; base += nwarps * S_K) {
        uint64_t q[S_K];
#pragma unroll
        for (uint32_t b = 0; b < S_K; b++) {
            q[b] = 0;
            if (base + b < a.nfull) { // codes 4l..4l+3 and 128+4l..128+4l+3
                if (FULL) {
                    const uint32_t *c = (const uint32_t *)(p + 264u * ((uint32_t)base + b)) + 2u + lane;
                    q[b] = (uint64_t)c[0] | ((uint64_t)c[32] << 32);
                } else {
                    const uint8_t *c = p + (base + b) * 264u + 8u;
                    q[b] = (uint64_t)d_get_u32(c + 4u * lane) | ((uint64_t)d_get_u32(c + 128u + 4u * lane) << 32);
                }
            }
        }
        // lanes 8b..8b+7: block b's scalars
        float s_cb = 0.0f, ia_cb = 0.0f;
        if (base + cb < a.nfull) {
            if (FULL) {
                const uint32_t *mw = (const uint32_t *)(p + 264u * ((uint32_t)base + cb));
                corrupt |= d_check_meta(mw[0], mw[1], s_cb, ia_cb);
            } else {
                const uint8_t *src = p + (base + cb) * 264u;
                corrupt |= d_check_meta(d_get_u32(src), d_get_u32(src + 4), s_cb, ia_cb);
            }
        }
#pragma unroll
        for (uint32_t b = 0; b < S_K; b++) {
            const float s = __shfl_sync(CU_FULL, s_cb, 8 * (int)b);
            const float inv_alpha = __shfl_sync(CU_FULL, ia_cb, 8 * (int)b);
            if (base + b >= a.nfull) // warp-uniform
                break;
            corrupt |= d_has_nan_code_swar(q[b]);
            float v[8];
            d_dequant8(q[b], s, v);
            d_fwht32h(v, lane);
            // |dequantised| <= 448 s, each of the 8 stages and 2 products rounds once, so
            // |y| <= 256 * 448 s norm / alpha (1 + 2^-24)^11: below FLT_MAX nothing is clamped
            // or non-finite (block-uniform); else ash.c's clamp and the finite check
            const bool safe = FULL && (double)s * (114688.0 * (1.0 + 0x1p-20)) * (double)a.norm * (double)inv_alpha <=
                                          (double)FLT_MAX;
#pragma unroll
            for (int r = 0; r < 8; r++) {
                const float y = __fmul_rn(__fmul_rn(v[r], a.norm), inv_alpha);
                v[r] = safe ? y : d_clampf(y);
            }
            if (s == 0.0f) // block-uniform: an all-zero block (1/alpha may be Inf)
#pragma unroll
                for (int r = 0; r < 8; r++)
                    v[r] = 0.0f;
            if (!safe)
                outmax = max(outmax, d_absbits_max8(v));
            if (FULL) {
                float *o = out + 256u * ((uint32_t)base + b) + 4u * lane; // streaming stores (k_tah_dw64)
                __stcs((float4 *)o, make_float4(v[0], v[1], v[2], v[3]));
                __stcs((float4 *)(o + 128u), make_float4(v[4], v[5], v[6], v[7]));
            } else {
                d_store8h(out, (base + b) * 256u, 256u, lane, 32u, a.vec_x, v);
            }
        }
    }
    if (corrupt)
        d_flag(head, CU_ST_CORRUPT);
    if (outmax >= 0x7f800000u)
        d_flag(head, CU_ST_NONFINITE);
}

// ---------------------------------------------------------------- CTA helpers

// In-place orthonormal FWHT of buf[0..n) by the whole CTA (fwht_f32's butterfly order).
__device__ void d_cta_fwht(float *buf, uint32_t n, float norm)
{
    for (uint32_t h = 1; h < n; h *= 2) {
        for (uint32_t pi = threadIdx.x; pi < n / 2; pi += blockDim.x) {
            const uint32_t i = (pi / h) * 2u * h + (pi % h);
            const float u = buf[i], v = buf[i + h];
            buf[i] = __fadd_rn(u, v);
            buf[i + h] = __fsub_rn(u, v);
        }
        __syncthreads();
    }
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
        buf[i] = __fmul_rn(buf[i], norm);
    __syncthreads();
}

__device__ uint32_t d_cta_maxu(uint32_t v, uint32_t *red)
{
    for (int o = 16; o > 0; o /= 2)
        v = max(v, __shfl_xor_sync(CU_FULL, v, o));
    if ((threadIdx.x & 31u) == 0)
        red[threadIdx.x / 32u] = v;
    __syncthreads();
    uint32_t r = 0;
    for (uint32_t w = 0; w < blockDim.x / 32u; w++)
        r = max(r, red[w]);
    __syncthreads();
    return r;
}

// ---------------------------------------------------------------- block >= 512

template <typename X>
__global__ void __launch_bounds__(256) k_ash_enc_cta(const X *__restrict__ x, uint8_t *__restrict__ p, cu_hp head,
                                                     s_ap a, float *work)
{
    d_mark(head);
    extern __shared__ float smem[];
    __shared__ float wsum[S_CTA / 32u];
    __shared__ uint32_t red[S_CTA / 32u];
    const uint32_t n = a.n;
    float *buf = work ? work + (uint64_t)blockIdx.x * n : smem;
    uint32_t bad = 0;
    for (uint64_t b = blockIdx.x; b < a.nb; b += gridDim.x) {
        const uint64_t off = b * n;
        const uint32_t m = (uint32_t)(a.total - off < n ? a.total - off : n);
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = i < m ? d_ldx(x, off + i) : 0.0f;
            bad |= (uint32_t)d_nonfinite(v);
            buf[i] = v;
        }
        __syncthreads();
        // ash.c's S: thread t the tree of its run of n / 256 elements, then the warp's lanes
        // pairwise (xor 1 .. 16), then the 8 warps' sums as a tree of 8 (padding: zeros); where
        // that is outside [2^-64, FLT_MAX] (CTA-uniform), again with x scaled
        const float *run = buf + (size_t)threadIdx.x * (n / S_CTA);
        float sc = 1.0f, sf = 0.0f;
        for (int pass = 0; pass < 2; pass++) {
            float t = d_sumsq_run(run, n / S_CTA, sc);
            for (int o = 1; o < 32; o *= 2)
                t = __fadd_rn(t, __shfl_xor_sync(CU_FULL, t, o));
            if ((threadIdx.x & 31u) == 0)
                wsum[threadIdx.x / 32u] = t;
            __syncthreads();
            sf = __fadd_rn(__fadd_rn(__fadd_rn(wsum[0], wsum[1]), __fadd_rn(wsum[2], wsum[3])),
                           __fadd_rn(__fadd_rn(wsum[4], wsum[5]), __fadd_rn(wsum[6], wsum[7])));
            __syncthreads(); // wsum read before it is written again
            if (pass == 1 || d_sumsq_ok(sf))
                break;
            sc = d_sumsq_redo(sf);
        }
        const double sum = d_sumsq_s(sf, sc);
        const float alpha = d_alpha(sum, n, a.tau, a.eps);
        for (uint32_t i = threadIdx.x; i < m; i += blockDim.x)
            buf[i] = __fmul_rn(alpha, buf[i]);
        __syncthreads();
        d_cta_fwht(buf, n, a.norm);
        uint32_t am = 0;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
            am = max(am, __float_as_uint(buf[i]) & 0x7fffffffu);
        am = d_cta_maxu(am, red);
        if (am >= 0x7f800000u && threadIdx.x == 0)
            d_flag(head, CU_ST_RANGE);
        uint8_t *dst = p + b * (uint64_t)(8u + n);
        float s = 0.0f, inv = 0.0f;
        if (am != 0) {
            s = __fdiv_rn(__uint_as_float(am), 448.0f);
            if (s == 0.0f)
                s = __uint_as_float(1u);
            inv = __fdiv_rn(1.0f, s);
        }
        if (threadIdx.x == 0) {
            const uint64_t meta =
                am ? ((uint64_t)__float_as_uint(alpha) | ((uint64_t)__float_as_uint(s) << 32)) : 0;
            d_store_bytes(dst, meta, 0, 8);
        }
        for (uint32_t i8 = threadIdx.x; i8 < n / 8u; i8 += blockDim.x) {
            float z[8];
#pragma unroll
            for (int r = 0; r < 8; r++)
                z[r] = buf[8u * i8 + r];
            d_store_bytes(dst + 8u + 8u * i8, am ? d_codes8(z, s, inv) : 0, 0, 8);
        }
        __syncthreads(); // buf is reused by the next block
    }
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

__global__ void __launch_bounds__(256) k_ash_dec_cta(const uint8_t *__restrict__ p, float *__restrict__ out,
                                                     cu_hp head, s_ap a, float *work)
{
    d_mark(head);
    extern __shared__ float smem[];
    const uint32_t n = a.n;
    float *buf = work ? work + (uint64_t)blockIdx.x * n : smem;
    uint32_t corrupt = 0, bad = 0;
    for (uint64_t b = blockIdx.x; b < a.nfull; b += gridDim.x) {
        const uint8_t *src = p + b * (uint64_t)(8u + n);
        float s = 0.0f, inv_alpha = 0.0f;
        corrupt |= d_check_meta(d_get_u32(src), d_get_u32(src + 4), s, inv_alpha);
        for (uint32_t i8 = threadIdx.x; i8 < n / 8u; i8 += blockDim.x) {
            uint64_t q, hi;
            d_load_bytes(src + 8u + 8u * i8, 8, q, hi);
            corrupt |= d_has_nan_code(q);
#pragma unroll
            for (int r = 0; r < 8; r++)
                buf[8u * i8 + r] = __fmul_rn(d_e4m3_to_f32((uint32_t)(q >> (8 * r)) & 0xffu), s);
        }
        __syncthreads();
        d_cta_fwht(buf, n, a.norm);
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
            const float y = s == 0.0f ? 0.0f : d_clampf(__fmul_rn(buf[i], inv_alpha));
            bad |= (uint32_t)d_nonfinite(y);
            out[b * n + i] = y;
        }
        __syncthreads();
    }
    if (corrupt)
        d_flag(head, CU_ST_CORRUPT);
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

// ---------------------------------------------------------------- partial last block

// out[j] = sum over c (step pp) of sign * e4m3(q[c+j]) * s, serially in c (ash.c's s_fold)
__device__ void d_fold(float *o, const uint8_t *q, uint32_t n, uint32_t pp, uint32_t negbit, float s)
{
    for (uint32_t j = threadIdx.x; j < pp; j += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t c = 0; c < n; c += pp) {
            const float sg = (c & negbit) ? -s : s;
            acc = __fadd_rn(acc, __fmul_rn(d_e4m3_to_f32(q[c + j]), sg));
        }
        o[j] = acc;
    }
    __syncthreads();
}

__device__ void d_scale_clamp(float *o, uint32_t m, float k)
{
    for (uint32_t j = threadIdx.x; j < m; j += blockDim.x)
        o[j] = d_clampf(__fmul_rn(o[j], k));
    __syncthreads();
}

__global__ void __launch_bounds__(256) k_ash_dec_partial(const uint8_t *__restrict__ p, float *out, cu_hp head,
                                                         s_ap a, s_partial c)
{
    d_mark(head);
    const uint32_t n = a.n;
    const uint64_t b = a.nb - 1;
    const uint8_t *src = p + b * (uint64_t)(8u + n);
    const uint8_t *q = src + 8;
    float *o = out + b * n;
    float s = 0.0f, inv_alpha = 0.0f;
    uint32_t corrupt = d_check_meta(d_get_u32(src), d_get_u32(src + 4), s, inv_alpha);
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
        corrupt |= (uint32_t)((q[i] & 0x7fu) == 0x7fu);
    if (__syncthreads_or((int)corrupt)) {
        if (threadIdx.x == 0)
            d_flag(head, CU_ST_CORRUPT);
        return;
    }
    if (s == 0.0f) {
        for (uint32_t j = threadIdx.x; j < c.m; j += blockDim.x)
            o[j] = 0.0f;
        return;
    }
    if (c.P == c.m) {
        d_fold(o, q, n, c.P, 0, s);
        d_cta_fwht(o, c.P, c.normP);
        d_scale_clamp(o, c.m, c.kP);
    } else {
        d_fold(o, q, n, c.p, c.h, s);
        d_cta_fwht(o, c.p, c.normp);
        for (uint32_t j = threadIdx.x; j < c.r; j += blockDim.x)
            o[c.h + j] = o[j]; // r <= p <= h: the ranges do not overlap
        __syncthreads();
        d_scale_clamp(o + c.h, c.r, c.kp);
        d_fold(o, q, n, c.h, 0, s);
        d_cta_fwht(o, c.h, c.normh);
        d_scale_clamp(o, c.h, c.kh);
    }
    d_scale_clamp(o, c.m, inv_alpha);
    uint32_t bad = 0;
    for (uint32_t j = threadIdx.x; j < c.m; j += blockDim.x)
        bad |= (uint32_t)d_nonfinite(o[j]);
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

// ---------------------------------------------------------------- host side

__global__ void k_e4m3(const float *__restrict__ x, uint8_t *__restrict__ q, uint64_t n)
{
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; 2 * i < n; i += stride) {
        const float a = x[2 * i], b = 2 * i + 1 < n ? x[2 * i + 1] : 0.0f;
        const uint32_t v = d_e4m3x2(a, b);
        q[2 * i] = (uint8_t)v;
        if (2 * i + 1 < n)
            q[2 * i + 1] = (uint8_t)(v >> 8);
    }
}

extern "C" int cu_fp8_e4m3_from_f32_n(const float *d_x, uint8_t *d_q, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return 0;
    k_e4m3<<<cu_grid((n + 1) / 2, 256), 256, 0, stream>>>(d_x, d_q, n);
    return cudaGetLastError() == cudaSuccess ? 0 : TAH_EDEVICE;
}

static uint32_t s_pow2ceil(uint32_t v)
{
    uint32_t p = 1;
    while (p < v)
        p *= 2;
    return p;
}

static s_ap s_params(const codec_spec_t *spec, uint64_t total, const void *xy)
{
    s_ap a;
    a.n = spec->p.ash.block;
    a.total = total;
    a.nb = (total + a.n - 1) / a.n;
    a.nfull = total / a.n;
    a.tpg = a.n <= 256 ? a.n / 8u : S_CTA;
    a.tau = spec->p.ash.tau;
    a.eps = spec->p.ash.eps;
    a.norm = (float)(1.0 / sqrt((double)a.n));
    a.vec_x = ((uintptr_t)xy & 15u) == 0;
    return a;
}

// The block-256 kernels' FULL form: whole blocks, x / out 16-byte aligned (vec_x), the
// payload 4-byte aligned, fewer than 2^31 elements.
static bool s_full(const s_ap &a, const void *payload)
{
    return cu_tpt() && a.n == 256 && a.nb == a.nfull && a.vec_x && ((uintptr_t)payload & 3u) == 0 &&
           a.total < 0x80000000ull;
}

size_t cu_ash_scratch(const codec_spec_t *spec, uint64_t n)
{
    const uint32_t block = spec->p.ash.block;
    if (block <= S_SMEM_MAX)
        return 0;
    const uint64_t nb = (n + block - 1) / block;
    return (size_t)(nb < S_BIG_GRID ? nb : S_BIG_GRID) * block * sizeof(float);
}

template <typename X>
static int s_ash_encode(const codec_spec_t *spec, uint64_t n, const X *x, uint8_t *payload, cu_hp head, void *work,
                        cudaStream_t st, char *err, size_t errlen)
{
    const s_ap a = s_params(spec, n, x);
    if (a.n == 256) {
        if (s_full(a, payload) && a.nb % S_K == 0) // FULL encode: whole warp iterations
            k_ash_enc256<true, X><<<cu_grid(a.nb, S_K * S_ENC_WARPS), S_ENC_CTA, 0, st>>>(x, payload, head, a);
        else
            k_ash_enc256<false, X><<<cu_grid(a.nb, S_K * S_ENC_WARPS), S_ENC_CTA, 0, st>>>(x, payload, head, a);
        CU_CHECK_LAUNCH("k_ash_enc256");
    } else if (a.n <= 256) {
        const uint64_t per_block = 8u * (32u / a.tpg);
        k_ash_enc_warp<<<cu_grid(a.nb, per_block), 256, 0, st>>>(x, payload, head, a);
        CU_CHECK_LAUNCH("k_ash_enc_warp");
    } else if (a.n <= S_SMEM_MAX) {
        k_ash_enc_cta<<<cu_grid(a.nb, 1), S_CTA, a.n * sizeof(float), st>>>(x, payload, head, a, NULL);
        CU_CHECK_LAUNCH("k_ash_enc_cta");
    } else {
        const unsigned int grid = a.nb < S_BIG_GRID ? (unsigned int)a.nb : S_BIG_GRID;
        k_ash_enc_cta<<<grid, S_CTA, 0, st>>>(x, payload, head, a, (float *)work);
        CU_CHECK_LAUNCH("k_ash_enc_cta");
    }
    return 0;
}

int cu_ash_encode(const codec_spec_t *spec, uint64_t n, cu_dtype_t xt, const void *x, uint8_t *payload,
                  cu_hp head, void *work, cudaStream_t st, char *err, size_t errlen)
{
    if (xt == CU_BF16)
        return s_ash_encode(spec, n, (const cu_bf16 *)x, payload, head, work, st, err, errlen);
    return s_ash_encode(spec, n, (const float *)x, payload, head, work, st, err, errlen);
}

int cu_ash_decode(const codec_spec_t *spec, uint64_t n, const uint8_t *payload, float *out, cu_hp head,
                  void *work, cudaStream_t st, char *err, size_t errlen)
{
    const s_ap a = s_params(spec, n, out);
    if (a.nfull > 0) {
        if (a.n == 256) {
            if (s_full(a, payload))
                k_ash_dec256<true><<<cu_grid(a.nfull, S_K * S_WARPS), S_CTA, 0, st>>>(payload, out, head, a);
            else
                k_ash_dec256<false><<<cu_grid(a.nfull, S_K * S_WARPS), S_CTA, 0, st>>>(payload, out, head, a);
            CU_CHECK_LAUNCH("k_ash_dec256");
        } else if (a.n <= 256) {
            const uint64_t per_block = 8u * (32u / a.tpg);
            k_ash_dec_warp<<<cu_grid(a.nfull, per_block), 256, 0, st>>>(payload, out, head, a);
            CU_CHECK_LAUNCH("k_ash_dec_warp");
        } else if (a.n <= S_SMEM_MAX) {
            k_ash_dec_cta<<<cu_grid(a.nfull, 1), S_CTA, a.n * sizeof(float), st>>>(payload, out, head, a, NULL);
            CU_CHECK_LAUNCH("k_ash_dec_cta");
        } else {
            const unsigned int grid = a.nfull < S_BIG_GRID ? (unsigned int)a.nfull : S_BIG_GRID;
            k_ash_dec_cta<<<grid, S_CTA, 0, st>>>(payload, out, head, a, (float *)work);
            CU_CHECK_LAUNCH("k_ash_dec_cta");
        }
    }
    if (a.nfull < a.nb) {
        s_partial c = {};
        c.m = (uint32_t)(n - a.nfull * a.n);
        c.P = s_pow2ceil(c.m);
        c.normP = (float)(1.0 / sqrt((double)c.P));
        c.kP = (float)sqrt((double)c.P / (double)a.n);
        if (c.P != c.m) {
            c.h = c.P / 2;
            c.r = c.m - c.h;
            c.p = s_pow2ceil(c.r);
            c.normp = (float)(1.0 / sqrt((double)c.p));
            c.kp = (float)sqrt((double)c.p / (double)a.n);
            c.normh = (float)(1.0 / sqrt((double)c.h));
            c.kh = (float)sqrt((double)c.h / (double)a.n);
        }
        k_ash_dec_partial<<<1, S_CTA, 0, st>>>(payload, out, head, a, c);
        CU_CHECK_LAUNCH("k_ash_dec_partial");
    }
    return 0;
}
