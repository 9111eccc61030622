// cu_group.cu — the grouped codecs on the GPU: scaled fixed-point (fixpt,
// nearest and stochastic rounding) and grouped INT (int, asymmetric and
// symmetric). Same payloads as codecs/fixpt.c and codecs/intq.c.
//
// Which kernel runs: the default specs (fixpt 8 bits, int 4 bits, group 128) on whole,
// aligned groups take the warp-per-group kernels of round 10 (k_fix_enc_row, k_int_quad (round 30),
// k_group_dec_row; below). The other shapes and specs, and TAH_CU_TPT=0, take the segment
// kernels described first. (docs/cuda-codecs.md lists every path.)
//
// Encode, one launch (fixpt; int since round 6: k_int_fused, a cooperative
// launch with one grid barrier between the statistics and the codes, since an
// exponent per block of S_IBLK groups scales the metadata of the block's groups;
// with TAH_CU_FUSE=0: two launches):
//
//   group <= 256: a segment of tpg = pow2ceil(ceil(group/8)) lanes per
//   group, lane l holds elements [8l, 8l+8) of it in registers:
//
//     warp:   | group g: lanes 0..tpg-1 | group g+1 | ...  (32/tpg groups)
//     lane l: x[g*group + 8l .. +8)  ->  codes packed into `bits` bytes
//             at codes(g) + l*bits   (8 b-bit codes are exactly b bytes)
//
//   group > 256: one CTA of 256 threads per group, thread t takes the
//   8-element chunks t, t+256, ... (two passes: stats, then codes).
//
// The group statistics (max|x|; or min, max and which zero is the minimum)
// are segment reductions, then every lane computes the step in the CPU's
// float/double operations, so the metadata is bit-identical. The int
// encoder walks groups in reverse order so its second read of x finds the
// end of the tensor, read last by the first pass, still in L2.
// int with 4 <= tpg <= 32 (round 4): pass 1
// (k_int_stats) writes every group's (min, max) to scratch, pass 2
// (k_int_codes) takes its blocks' exponents from them, computes each group's
// metadata on one lane and only quantises (see the comment above
// k_int_stats); other int groups: k_absmax (each block's max |x|), then
// k_group_encode / k_group_enc_seg. fixpt with 4 <= tpg <= 32: k_fix_enc,
// the step once per group on one lane. Stochastic rounding hashes each element's index with
// fixpt.c's lowbias32 (d_stoch_u): 32-bit operations only.
// Round 10: the default specs (fixpt 8 bits, int 4 bits, group 128) on whole groups go
// through warp-per-group kernels instead (k_fix_enc_row, k_group_dec_row: lane l on
// elements 4l..4l+3 of a group); int encode reads x once (round 15: a CTA per exponent
// block; round 30: a quad of lanes per group, comment above k_int_quad).
// TAH_CU_TPT=0 keeps the segment kernels (a same-binary comparison).
//
// Decode (groups above 256: k_group_decode): a flat grid, one thread per 8-code chunk (b bytes
// in, 8 floats out), checking the metadata and codes exactly as the CPU decoder does; groups up
// to 256 on segments (k_group_dec_seg), the default spec by k_group_dec_row.
#include <float.h>

#include <cooperative_groups.h> // this_grid().sync() in k_int_fused

#include "cu_common.cuh"

enum { M_FIX_NEAR = 0, M_FIX_STOCH = 1, M_INT_ASYM = 2, M_INT_SYM = 3 };

#define S_CTA 256u
#define S_ROWS 4 // rows of groups per warp iteration in the segment kernels
#define S_IBLK 64u // int: groups per exponent (intq.c's S_BLOCK)

struct s_gp {
    uint64_t n, ng;      // elements, groups
    uint64_t nblk;       // int: exponent blocks of S_IBLK groups (0 for fixpt)
    uint64_t meta_off;   // payload offset of the per-group metadata (int: after the exponents)
    uint64_t codes_off;  // payload offset of the first group's codes
    uint32_t key;        // fixpt stochastic: fixpt.c's k
    uint32_t group, bits, tpg, gbytes, cpg; // cpg: 8-code chunks per full group
    uint32_t L;          // int asymmetric levels 2^b - 1
    int32_t qmax;        // 2^(b-1) - 1
    float c;             // fixpt scale
    double inv_l;        // int: 1 / qmax (symmetric) or 1 / L (d_step_up)
    bool vec;            // x/out 16-byte aligned and group % 4 == 0
};

// fixpt.c's uniform u = (lowbias32(x) >> 9) 2^-23 from x1 = x ^ (x >> 16), lowbias32's first
// step (k_fix_enc_row takes it once per group of 4 indices): the rest of the hash, then u built
// as a float in [1, 2) less 1 (exact: no conversion)
__device__ __forceinline__ float d_stoch_u1(uint32_t x1)
{
    x1 *= 0x7feb352du;
    x1 ^= x1 >> 15;
    x1 *= 0x846ca68bu;
    x1 ^= x1 >> 16;
    return __fsub_rn(__uint_as_float((x1 >> 9) | 0x3f800000u), 1.0f);
}

// fixpt.c's uniform of element idx: x = idx ^ k
__device__ __forceinline__ float d_stoch_u(uint32_t key, uint32_t idx)
{
    const uint32_t x = idx ^ key;
    return d_stoch_u1(x ^ (x >> 16));
}

// fixpt.c's stochastic code of t (|t| <= qmax < 2^15): floor(t) + (u < frac) + qmax, frac =
// t - floor(t). Without conversions: t + 1.5 * 2^23 rounded down is floor(t) + 1.5 * 2^23 exactly
// (ulp 1 there, |t| < 2^22), so its bits less 0x4b400000 are floor(t) and subtracting 1.5 * 2^23
// again gives floor(t) as a float exactly; frac is then fixpt.c's t - (float)fl, rounded once.
__device__ __forceinline__ int32_t d_stoch_code(float t, uint32_t key, uint32_t idx, int32_t qmax)
{
    const float s = __fadd_rd(t, 12582912.0f);
    const float frac = __fsub_rn(t, __fsub_rn(s, 12582912.0f));
    return (int32_t)(__float_as_uint(s) - 0x4b400000u) + (int32_t)(d_stoch_u(key, idx) < frac) + qmax;
}

// Block exponent of intq.c: e = clamp(ceil(log2 amax) - 14, -126, 114), 0 for 0.
__device__ __forceinline__ int32_t d_int_exp(uint32_t amax_bits)
{
    if (amax_bits == 0)
        return 0;
    int32_t ex; // frexp exponent: amax = f * 2^ex, f in [0.5, 1)
    bool pow2;
    if (amax_bits >= 0x00800000u) {
        ex = (int32_t)(amax_bits >> 23) - 126;
        pow2 = (amax_bits & 0x7fffffu) == 0;
    } else {
        int32_t top = 31 - __clz((int)amax_bits);
        ex = top - 148;
        pow2 = (amax_bits & (amax_bits - 1u)) == 0;
    }
    int32_t e = (pow2 ? ex - 1 : ex) - 14;
    return e < -126 ? -126 : (e > 114 ? 114 : e);
}

__device__ __forceinline__ float d_pow2f(int32_t e) { return __uint_as_float((uint32_t)(127 + e) << 23); }

// 2^e of a block exponent e (1, and corrupt when `valid`, outside intq.c's range).
__device__ __forceinline__ float d_int_pow2e(int32_t e, bool valid, uint32_t &corrupt)
{
    const bool ok = e >= -126 && e <= 114;
    corrupt |= (uint32_t)(valid && !ok);
    return ok ? d_pow2f(e) : 1.0f;
}

// 2^e of group gi's block exponent, read from the payload.
__device__ __forceinline__ float d_int_pup(const uint8_t *p, uint64_t gi, uint32_t &corrupt)
{
    return d_int_pow2e((int8_t)p[gi / S_IBLK], true, corrupt);
}

// Whether the bytes between the exponents and the metadata (at most 3) are not all zero.
__device__ __forceinline__ bool d_int_pad_bad(const uint8_t *p, const s_gp &g)
{
    uint32_t b = 0;
    for (uint64_t k = g.nblk; k < g.meta_off; k++)
        b |= p[k];
    return b != 0;
}

// An int encoder's write of block blk's exponent; block 0's writer also zeroes the bytes
// after the exponents.
__device__ __forceinline__ void d_int_put_exp(uint8_t *p, const s_gp &g, uint64_t blk, int32_t e)
{
    p[blk] = (uint8_t)(int8_t)e;
    if (blk == 0)
        for (uint64_t k = g.nblk; k < g.meta_off; k++)
            p[k] = 0;
}

// intq.c's s_step_up: fp16 value >= v / L (v >= 0, below 2^17 here). intq.c takes
// st = (float)(v / L) and one float up if st * L < v (exact in double): the smallest float
// >= v / L. Round 10: v * (1 / L) (inv_l, rounded once on the host) instead of the double
// division: v * inv_l is within (1 + 2^-51) of v / L, so its float rounding is that
// smallest float or the float just below it, which the same test moves up: the same st.
__device__ __forceinline__ uint16_t d_step_up(double v, uint32_t L, double inv_l)
{
    float st = (float)__dmul_rn(v, inv_l);
    if ((double)st * (double)L < v)
        st = __uint_as_float(__float_as_uint(st) + 1u); // st >= 0: next float up
    return d_half_from_f32_up(st);
}

// Which zero intq.c's s_minmax returns when the minimum is zero: its 16
// lanes (lane i%16 for i below the last multiple of 16, the tail in lane 0
// after them) keep the first value strictly below, and lanes combine in
// order, so the winner is the zero with the smallest (lane, position).
__device__ __forceinline__ uint32_t d_int_zkey(uint32_t i, uint32_t len, bool neg)
{
    uint32_t main_end = len & ~15u;
    uint32_t lane = i < main_end ? (i & 15u) : 0u;
    uint32_t pos = i < main_end ? (i >> 4) : (main_end >> 4) + (i - main_end);
    return ((lane << 17) | pos) * 2u + (uint32_t)neg;
}

struct s_gs {
    float a, b;  // fixpt: a = max|x|; int: a = min, b = max
    uint32_t z;  // int: smallest zero key (see d_int_zkey), ~0 if no zero
};

template <int MODE>
__device__ __forceinline__ void d_gs_merge(s_gs &s, const s_gs &o)
{
    if (MODE <= M_FIX_STOCH) {
        s.a = fmaxf(s.a, o.a);
    } else {
        s.a = fminf(s.a, o.a);
        s.b = fmaxf(s.b, o.b);
        s.z = min(s.z, o.z);
    }
}

template <int MODE>
__device__ __forceinline__ s_gs d_gs_shfl(const s_gs &s, uint32_t o)
{
    s_gs r;
    r.a = __shfl_xor_sync(CU_FULL, s.a, (int)o);
    r.b = __shfl_xor_sync(CU_FULL, s.b, (int)o);
    r.z = __shfl_xor_sync(CU_FULL, s.z, (int)o);
    return r;
}

// Per-group quantiser state, the same for every lane of the segment.
struct s_gq {
    float inv, mn, pdown;
};

// Statistics of an empty group (the identities of d_gs_merge).
template <int MODE>
__device__ __forceinline__ s_gs d_gs_init()
{
    s_gs s;
    s.a = MODE <= M_FIX_STOCH ? 0.0f : __uint_as_float(0x7f800000u);
    s.b = -__uint_as_float(0x7f800000u);
    s.z = 0xffffffffu;
    return s;
}

// fixpt.c's step of a group whose max |x| is amax: d = c amax / qmax, one float up while
// d * qmax < c amax (exact in double), rounded up to fp16 (dh, returned); inv = 1 / dh (0 for
// 0). c amax beyond FLT_MAX or an Inf step set range when the group is valid.
__device__ __forceinline__ uint16_t d_fix_step(const s_gp &g, float amax, bool valid, uint32_t &range, float &inv)
{
    const float ymax = __fmul_rn(g.c, amax);
    if (!(ymax <= FLT_MAX))
        range |= (uint32_t)valid;
    float d = __fdiv_rn(ymax, (float)g.qmax);
    if ((double)d * (double)g.qmax < (double)ymax)
        d = __uint_as_float(__float_as_uint(d) + 1u);
    const uint16_t dh = d_half_from_f32_up(d);
    if ((dh & 0x7c00u) == 0x7c00u)
        range |= (uint32_t)valid;
    const float df = d_half_to_f32(dh);
    inv = df > 0.0f ? __fdiv_rn(1.0f, df) : 0.0f;
    return dh;
}

// The group's step (and, asymmetric int, its minimum), exactly as the CPU
// computes it from the merged statistics; lane tl 0 of a valid group writes
// the group's metadata. An out-of-range step sets range.
template <int MODE>
__device__ __forceinline__ s_gq d_group_step(const s_gp &g, const s_gs &s, float pdown, bool valid, uint32_t tl,
                                             uint64_t gi, uint8_t *p, uint32_t &range)
{
    s_gq q;
    q.mn = 0.0f;
    q.pdown = pdown;
    if (MODE <= M_FIX_STOCH) {
        const uint16_t dh = d_fix_step(g, s.a, valid, range, q.inv);
        if (valid && tl == 0)
            d_put_u16(p + g.meta_off + 2 * gi, dh);
    } else if (MODE == M_INT_SYM) {
        const float lo = __fmul_rn(s.a, pdown), hi = __fmul_rn(s.b, pdown);
        const float amax = fabsf(lo) > fabsf(hi) ? fabsf(lo) : fabsf(hi);
        const uint16_t sh = d_step_up((double)amax, (uint32_t)g.qmax, g.inv_l);
        const float step = d_half_to_f32(sh);
        q.inv = step > 0.0f ? __fdiv_rn(1.0f, step) : 0.0f;
        if (valid && tl == 0)
            d_put_u16(p + g.meta_off + 2 * gi, sh);
    } else {
        float lo_raw = s.a;
        if (lo_raw == 0.0f) // which zero: the CPU's (sign of the winning zero key)
            lo_raw = (s.z & 1u) ? -0.0f : 0.0f;
        const float lo = __fmul_rn(lo_raw, pdown), hi = __fmul_rn(s.b, pdown);
        const uint16_t mh = d_half_from_f32_down(lo);
        q.mn = d_half_to_f32(mh);
        const uint16_t sh = d_step_up((double)hi - (double)q.mn, g.L, g.inv_l);
        const float step = d_half_to_f32(sh);
        q.inv = step > 0.0f ? __fdiv_rn(1.0f, step) : 0.0f;
        if (valid && tl == 0) {
            d_put_u16(p + g.meta_off + 4 * gi, mh);
            d_put_u16(p + g.meta_off + 4 * gi + 2, sh);
        }
    }
    return q;
}

// The code of element idx (its index in the tensor: the stochastic
// rounding's random stream), value xv, before masking to the code width.
template <int MODE>
__device__ __forceinline__ int32_t d_group_code(const s_gp &g, const s_gq &q, float xv, uint64_t idx)
{
    const float qmaxf = (float)g.qmax;
    float t;
    if (MODE == M_FIX_NEAR) {
        t = __fmul_rn(__fmul_rn(g.c, xv), q.inv);
        t = t < -qmaxf ? -qmaxf : t;
        t = t > qmaxf ? qmaxf : t;
        return (int32_t)rintf(t) + g.qmax;
    } else if (MODE == M_FIX_STOCH) {
        t = __fmul_rn(__fmul_rn(g.c, xv), q.inv);
        t = t < -qmaxf ? -qmaxf : t;
        t = t > qmaxf ? qmaxf : t;
        return d_stoch_code(t, g.key, (uint32_t)idx, g.qmax);
    } else if (MODE == M_INT_ASYM) {
        const float Lf = (float)g.L;
        t = __fmul_rn(__fsub_rn(__fmul_rn(xv, q.pdown), q.mn), q.inv);
        t = t < 0.0f ? 0.0f : t;
        t = t > Lf ? Lf : t;
        return (int32_t)rintf(t);
    } else {
        t = __fmul_rn(__fmul_rn(xv, q.pdown), q.inv);
        t = t < -qmaxf ? -qmaxf : t;
        t = t > qmaxf ? qmaxf : t;
        return (int32_t)rintf(t) + g.qmax;
    }
}

// a lane's statistics of chunk j (8 elements, v) of a group of len elements; non-finite x in bad
template <int MODE>
__device__ __forceinline__ void d_group_stats(const float v[8], uint32_t len, uint32_t j, s_gs &s, uint32_t &bad)
{
    const uint32_t m = len > 8u * j ? (len - 8u * j < 8u ? len - 8u * j : 8u) : 0u;
#pragma unroll
    for (int r = 0; r < 8; r++) {
        if ((uint32_t)r < m) {
            bad |= (uint32_t)d_nonfinite(v[r]);
            if (MODE <= M_FIX_STOCH) {
                s.a = fmaxf(s.a, fabsf(v[r]));
            } else {
                s.a = fminf(s.a, v[r]);
                s.b = fmaxf(s.b, v[r]);
                if (v[r] == 0.0f)
                    s.z = min(s.z, d_int_zkey(8u * j + (uint32_t)r, len, __float_as_uint(v[r]) >> 31));
            }
        }
    }
}

// group > 256: one CTA of S_CTA threads per group (thread tl takes chunks tl, tl + S_CTA, ..)
// (int: blk_amax holds each exponent block's max |x| bits, from k_absmax)
template <int MODE, typename X>
__global__ void __launch_bounds__(256) k_group_encode(const X *__restrict__ x, uint8_t *__restrict__ p,
                                                      const uint32_t *__restrict__ blk_amax, cu_hp head, s_gp g)
{
    d_mark(head);
    __shared__ s_gs red[S_CTA / 32];
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t tpg = S_CTA, tl = threadIdx.x;
    const uint32_t mask = (1u << g.bits) - 1u;
    uint32_t bad = 0, range = 0;

    for (uint64_t gi_raw = blockIdx.x; gi_raw < g.ng; gi_raw += gridDim.x) { // uniform per CTA
        const uint64_t gi = MODE >= M_INT_ASYM ? g.ng - 1 - gi_raw : gi_raw; // int: reverse order
        float pdown = 1.0f;
        if (MODE >= M_INT_ASYM) {
            const int32_t e = d_int_exp(blk_amax[gi / S_IBLK]);
            pdown = d_pow2f(-e);
            if (gi % S_IBLK == 0 && tl == 0)
                d_int_put_exp(p, g, gi / S_IBLK, e);
        }
        const uint64_t off = gi * g.group;
        const uint32_t len = (uint32_t)(g.n - off < g.group ? g.n - off : g.group);
        const uint32_t nch = (len + 7u) / 8u;

        // pass A: statistics; the first chunk stays in registers
        float cv[8];
        s_gs s = d_gs_init<MODE>();
        for (uint32_t j = tl; j < nch; j += tpg) {
            float v[8];
            d_load8(x, off + 8u * j, off + len, g.vec, v);
            d_group_stats<MODE>(v, len, j, s, bad);
            if (j == tl)
#pragma unroll
                for (int r = 0; r < 8; r++)
                    cv[r] = v[r];
        }
        for (uint32_t o = 1; o < 32; o *= 2)
            d_gs_merge<MODE>(s, d_gs_shfl<MODE>(s, o));
        if (lane == 0)
            red[threadIdx.x / 32] = s;
        __syncthreads();
        s = red[0];
        for (uint32_t w = 1; w < S_CTA / 32; w++)
            d_gs_merge<MODE>(s, red[w]);
        __syncthreads(); // red is reused by the next group

        // the step, exactly as the CPU computes it
        const s_gq q = d_group_step<MODE>(g, s, pdown, true, tl, gi, p, range);

        // pass B: codes
        uint8_t *dst = p + g.codes_off + gi * g.gbytes;
        for (uint32_t j = tl; j < nch; j += tpg) {
            float v[8];
            if (j == tl) {
#pragma unroll
                for (int r = 0; r < 8; r++)
                    v[r] = cv[r];
            } else {
                d_load8(x, off + 8u * j, off + len, g.vec, v);
            }
            const uint32_t m = len - 8u * j < 8u ? len - 8u * j : 8u;
            uint32_t code[8];
#pragma unroll
            for (int r = 0; r < 8; r++) {
                const int32_t c = d_group_code<MODE>(g, q, v[r], off + 8u * j + (uint32_t)r);
                code[r] = (uint32_t)r < m ? ((uint32_t)c & mask) : 0u;
            }
            uint64_t lo, hi;
            d_pack8(code, g.bits, lo, hi);
            d_store_bytes(dst + (uint64_t)j * g.bits, lo, hi, (m * g.bits + 7u) / 8u);
        }
    }
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
    if (range)
        d_flag(head, CU_ST_RANGE);
}

// ---- the segment path, U rows of groups per warp iteration ----
// Same segments as k_group_encode (tpg lanes per group, lane tl holds chunk
// tl: tpg >= cpg, so one chunk per lane), but a warp takes U rows of 32/tpg
// groups per iteration and issues all U rows' 16-byte loads before the
// first use (U x 32 bytes in flight per lane instead of 32). BITS > 0 makes
// the code width a compile-time constant (the default specs: fixpt 8,
// int 4) so the packing is a few shifts; BITS = 0 reads g.bits.
// Per group, the arithmetic is k_group_encode's, in the same order.

template <int MODE, int BITS, int U, typename X>
__global__ void __launch_bounds__(256) k_group_enc_seg(const X *__restrict__ x, uint8_t *__restrict__ p,
                                                       const uint32_t *__restrict__ blk_amax, cu_hp head, s_gp g)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t tpg = g.tpg, tl = lane % tpg, spw = 32u / tpg;
    const uint32_t bits = BITS > 0 ? (uint32_t)BITS : g.bits;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32u;
    const uint32_t mask = (1u << bits) - 1u;
    uint32_t bad = 0, range = 0;
    const uint64_t rows_per_it = (uint64_t)U * spw;
    for (uint64_t base = warp * rows_per_it; base < g.ng; base += nwarps * rows_per_it) { // uniform per warp
        float v[U][8];
        uint64_t gi[U];
        uint32_t len[U];
        bool valid[U];
#pragma unroll
        for (int u = 0; u < U; u++) { // all loads first
            const uint64_t gi_raw = base + (uint64_t)u * spw + lane / tpg;
            valid[u] = gi_raw < g.ng;
            gi[u] = MODE >= M_INT_ASYM ? g.ng - 1 - (valid[u] ? gi_raw : 0) : (valid[u] ? gi_raw : 0);
            const uint64_t off = gi[u] * g.group;
            len[u] = valid[u] ? (uint32_t)(g.n - off < g.group ? g.n - off : g.group) : 0u;
            const uint64_t end = 8u * tl < len[u] ? off + len[u] : off; // lanes past the group read nothing
            d_load8(x, off + 8u * tl, end, g.vec, v[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            s_gs s = d_gs_init<MODE>();
            d_group_stats<MODE>(v[u], len[u], tl, s, bad);
            for (uint32_t o = 1; o < tpg; o *= 2)
                d_gs_merge<MODE>(s, d_gs_shfl<MODE>(s, o));
            const bool ok = valid[u];
            float pdown = 1.0f;
            if (MODE >= M_INT_ASYM) {
                const int32_t e = d_int_exp(blk_amax[gi[u] / S_IBLK]);
                pdown = d_pow2f(-e);
                if (ok && gi[u] % S_IBLK == 0 && tl == 0)
                    d_int_put_exp(p, g, gi[u] / S_IBLK, e);
            }
            const s_gq q = d_group_step<MODE>(g, s, pdown, ok, tl, gi[u], p, range);
            if (!ok || 8u * tl >= len[u])
                continue;
            const uint32_t m = len[u] - 8u * tl < 8u ? len[u] - 8u * tl : 8u;
            const uint64_t off = gi[u] * g.group;
            uint32_t code[8];
#pragma unroll
            for (int r = 0; r < 8; r++) {
                const int32_t c = d_group_code<MODE>(g, q, v[u][r], off + 8u * tl + (uint32_t)r);
                code[r] = (uint32_t)r < m ? ((uint32_t)c & mask) : 0u;
            }
            uint64_t lo, hi;
            d_pack8(code, bits, lo, hi);
            d_store_bytes(p + g.codes_off + gi[u] * g.gbytes + (uint64_t)tl * bits, lo, hi, (m * bits + 7u) / 8u);
        }
    }
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
    if (range)
        d_flag(head, CU_ST_RANGE);
}

// Decode on the same segments: lane tl of a group's segment decodes its chunk tl
// (tl < cpg); U rows of spw groups per warp iteration (slot k = u*spw + segment is
// group base + k). Same checks and the same float operations per element as
// k_group_decode.
//
// Round 7: (1) lane k loads and checks slot k's metadata once (k = step / c, or step
// and bias) and each row's lanes fetch it by shuffles, where round 3 had every lane of
// a row load, check and divide (an IEEE division per lane and row); (2) 32-bit element
// indices (B*S*C <= 2^31); (3) the default widths convert codes to floats without a
// conversion instruction: the code as the low mantissa bits of 2^23 (a byte permute or
// mask), minus 2^23 (+ qmax): exact small integers, the same floats as (float)code;
// the invalid-code checks are SWAR on the code word; (4) the clamp to +-FLT_MAX and
// the finite check run only in warps where a group's extreme codes (0 and the
// largest valid code) decode to a value beyond FLT_MAX: decoding is monotonic in the
// code (step >= 0, pup > 0, each rounding monotonic), so elsewhere every value is
// finite and the clamp changes nothing.
template <int U>
struct s_dbuf {
    uint64_t lo[U], hi[U];
    uint32_t meta;
    int32_t e; // int: the exponent of slot `lane`'s block
};

// n <= 8 bytes at src, little-endian: one 8-, 4- or 2-byte load when aligned.
__device__ __forceinline__ uint64_t d_load_le8(const uint8_t *src, uint32_t n)
{
    const uintptr_t a = (uintptr_t)src;
    if (n == 8 && (a & 7u) == 0)
        return *(const uint64_t *)src;
    if (n == 4 && (a & 3u) == 0)
        return *(const uint32_t *)src;
    if (n == 2 && (a & 1u) == 0)
        return *(const uint16_t *)src;
    uint64_t v = 0;
    for (uint32_t i = 0; i < n; i++)
        v |= (uint64_t)src[i] << (8 * i);
    return v;
}

template <int MODE, int BITS, int U>
__device__ __forceinline__ void d_dec_load(const uint8_t *__restrict__ p, const s_gp &g, uint32_t base, uint32_t lane,
                                           s_dbuf<U> &b)
{
    const uint32_t tpg = g.tpg, tl = lane % tpg, spw = 32u / tpg;
    const uint32_t bits = BITS > 0 ? (uint32_t)BITS : g.bits;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t gi = base + (uint32_t)u * spw + lane / tpg; // B*S*C <= 2^31: 32-bit indices
        const uint32_t off = gi * g.group;
        const uint32_t len = gi < (uint32_t)g.ng ? min((uint32_t)g.n - off, g.group) : 0u;
        const uint32_t m = 8u * tl < len ? min(len - 8u * tl, 8u) : 0u;
        b.lo[u] = 0;
        b.hi[u] = 0;
        if (m != 0) {
            const uint8_t *src = p + g.codes_off + (uint64_t)gi * g.gbytes + tl * bits;
            if (BITS > 0 && BITS <= 8)
                b.lo[u] = d_load_le8(src, (m * bits + 7u) / 8u);
            else
                d_load_bytes(src, (m * bits + 7u) / 8u, b.lo[u], b.hi[u]);
        }
    }
    const uint32_t mg = base + lane;
    b.meta = 0;
    b.e = 0;
    if (lane < (uint32_t)U * spw && mg < (uint32_t)g.ng) {
        b.meta = MODE == M_INT_ASYM ? d_get_u32(p + g.meta_off + 4 * mg) : d_get_u16(p + g.meta_off + 2 * mg);
        if (MODE >= M_INT_ASYM)
            b.e = (int8_t)p[mg / S_IBLK];
    }
}

// A group's metadata word (fixpt: fp16 dh; int symmetric: fp16 step; asymmetric: fp16 min |
// step << 16) checked as the CPU decoder checks it (corrupt, when valid), as a = k = dh / c
// (fixpt) or the step (int) and b = the int bias (min, or -qmax step; 0 for fixpt); returns
// whether the group's extreme codes decode beyond FLT_MAX (valid groups only), where the
// clamp (int) and the finite check apply.
template <int MODE>
__device__ __forceinline__ bool d_dec_meta(uint32_t meta, const s_gp &g, float pup, bool valid, float &a, float &b,
                                           uint32_t &corrupt)
{
    b = 0.0f;
    if (MODE <= M_FIX_STOCH) {
        const uint16_t dh = (uint16_t)meta;
        corrupt |= (uint32_t)(valid && ((dh & 0x8000u) || (dh & 0x7c00u) == 0x7c00u));
        a = __fdiv_rn(d_half_to_f32(dh), g.c);
        return valid && !(__fmul_rn((float)g.qmax, a) <= FLT_MAX);
    }
    uint16_t sh;
    float mn = 0.0f;
    if (MODE == M_INT_SYM) {
        sh = (uint16_t)meta;
    } else {
        const uint16_t mh = (uint16_t)meta;
        corrupt |= (uint32_t)(valid && (mh & 0x7c00u) == 0x7c00u);
        mn = d_half_to_f32(mh);
        sh = (uint16_t)(meta >> 16);
    }
    corrupt |= (uint32_t)(valid && ((sh & 0x8000u) || (sh & 0x7c00u) == 0x7c00u));
    a = d_half_to_f32(sh);
    b = MODE == M_INT_SYM ? __fmul_rn(-(float)g.qmax, a) : mn;
    const float top = MODE == M_INT_SYM ? (float)(2 * g.qmax) : (float)g.L; // largest valid code
    const float y0 = __fmul_rn(__fadd_rn(__fmul_rn(0.0f, a), b), pup);
    const float y1 = __fmul_rn(__fadd_rn(__fmul_rn(top, a), b), pup);
    return valid && !(fabsf(y0) <= FLT_MAX && fabsf(y1) <= FLT_MAX);
}

template <int MODE, int BITS, int U>
__device__ __forceinline__ void d_dec_iter(float *__restrict__ out, const s_gp &g, uint32_t base, uint32_t lane,
                                           const s_dbuf<U> &b, uint32_t &corrupt, uint32_t &bad)
{
    const uint32_t tpg = g.tpg, tl = lane % tpg, spw = 32u / tpg;
    const uint32_t bits = BITS > 0 ? (uint32_t)BITS : g.bits;
    const uint32_t bad_code = (1u << bits) - 1u;
    // slot `lane`'s metadata: checked once, k (fixpt) or step and bias (int)
    const bool mvalid = lane < (uint32_t)U * spw && base + lane < (uint32_t)g.ng;
    const float pup = MODE >= M_INT_ASYM ? d_int_pow2e(b.e, mvalid, corrupt) : 1.0f; // int: the slot's block
    float ka, kb;
    const bool wide = d_dec_meta<MODE>(b.meta, g, pup, mvalid, ka, kb, corrupt);
    const bool slow = __any_sync(CU_FULL, wide); // warp-uniform
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int src = (int)((uint32_t)u * spw + lane / tpg);
        const float q_k = __shfl_sync(CU_FULL, ka, src), q_step = q_k; // k (fixpt) or the step (int)
        const float q_bias = __shfl_sync(CU_FULL, kb, src);
        const float q_pup = __shfl_sync(CU_FULL, pup, src);
        const uint32_t gi = base + (uint32_t)src;
        const uint32_t off = gi * g.group;
        const uint32_t len = gi < (uint32_t)g.ng ? min((uint32_t)g.n - off, g.group) : 0u;
        if (8u * tl >= len)
            continue;
        const uint32_t m = min(len - 8u * tl, 8u);
        const uint64_t lo = b.lo[u], hi = b.hi[u];
        const uint32_t pb = m * bits;
        const uint64_t pad = pb < 64 ? ((lo >> pb) | hi) : (pb < 128 ? hi >> (pb - 64) : 0);
        corrupt |= (uint32_t)(pad != 0);
        float v[8];
        if (MODE <= M_FIX_STOCH && BITS == 8) {
            // bytes equal to 0xff (the invalid code); bytes past m are 0
            corrupt |= (uint32_t)((((lo & 0x7f7f7f7f7f7f7f7full) + 0x0101010101010101ull) & lo &
                                   0x8080808080808080ull) != 0);
            const uint32_t w0 = (uint32_t)lo, w1 = (uint32_t)(lo >> 32);
#pragma unroll
            for (int r = 0; r < 8; r++) {
                const uint32_t f = __byte_perm(r < 4 ? w0 : w1, 0x4b000000u, 0x7440u | (uint32_t)(r & 3));
                v[r] = __fmul_rn(__fsub_rn(__uint_as_float(f), 8388735.0f), q_k); // (code - 127) * k
            }
        } else if (MODE >= M_INT_ASYM && BITS == 4) {
            const uint32_t w = (uint32_t)lo;
            if (MODE == M_INT_SYM) // nibbles equal to 0xf (the invalid code); nibbles past m are 0
                corrupt |= (uint32_t)((((w & 0x77777777u) + 0x11111111u) & w & 0x88888888u) != 0);
#pragma unroll
            for (int r = 0; r < 8; r++) {
                const float c = __fsub_rn(__uint_as_float(((w >> (4 * r)) & 0xfu) | 0x4b000000u), 8388608.0f);
                v[r] = __fmul_rn(__fadd_rn(__fmul_rn(c, q_step), q_bias), q_pup);
            }
        } else {
            uint32_t code[8];
            d_unpack8(lo, hi, bits, code);
#pragma unroll
            for (int r = 0; r < 8; r++) {
                if (MODE <= M_FIX_STOCH)
                    v[r] = __fmul_rn((float)((int32_t)code[r] - g.qmax), q_k);
                else
                    v[r] = __fmul_rn(__fadd_rn(__fmul_rn((float)code[r], q_step), q_bias), q_pup);
                if (MODE != M_INT_ASYM && (uint32_t)r < m)
                    corrupt |= (uint32_t)(code[r] == bad_code);
            }
        }
        if (slow) {
#pragma unroll
            for (int r = 0; r < 8; r++) {
                float y = v[r];
                if (MODE >= M_INT_ASYM) {
                    y = y > FLT_MAX ? FLT_MAX : y;
                    y = y < -FLT_MAX ? -FLT_MAX : y;
                }
                v[r] = y;
                if ((uint32_t)r < m)
                    bad |= (uint32_t)d_nonfinite(y);
            }
        }
        d_store8(out, (uint64_t)(off + 8u * tl), m, g.vec, v);
    }
}

template <int MODE, int BITS, int U, int MINB>
__global__ void __launch_bounds__(256, MINB) k_group_dec_seg(const uint8_t *__restrict__ p, float *__restrict__ out,
                                                          cu_hp head, s_gp g)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint32_t nwarps = gridDim.x * blockDim.x / 32u;
    const uint32_t nslot = (uint32_t)U * (32u / g.tpg);
    const uint32_t stride = nwarps * nslot, ng = (uint32_t)g.ng; // B*S*C <= 2^31
    uint32_t corrupt = 0, bad = 0;
    s_dbuf<U> b;
    for (uint32_t base = warp * nslot; base < ng; base += stride) { // uniform per warp
        d_dec_load<MODE, BITS, U>(p, g, base, lane, b);
        d_dec_iter<MODE, BITS, U>(out, g, base, lane, b, corrupt, bad);
    }
    if (MODE >= M_INT_ASYM && warp == 0 && lane == 0)
        corrupt |= (uint32_t)d_int_pad_bad(p, g);
    if (corrupt)
        d_flag(head, CU_ST_CORRUPT);
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

// the largest |x| of four floats as bits (>= 0x7f800000 when one is Inf or NaN)
__device__ __forceinline__ uint32_t d_absbits_max4(float4 f)
{
    return max(max(__float_as_uint(f.x) & 0x7fffffffu, __float_as_uint(f.y) & 0x7fffffffu),
               max(__float_as_uint(f.z) & 0x7fffffffu, __float_as_uint(f.w) & 0x7fffffffu));
}

// ---- round 10: a warp per group (groups of 128, whole, 8-bit fixpt / 4-bit int) ----
// Lane l takes elements 4l..4l+3 of each of the warp's S_ROW_DEC groups, so each access
// instruction covers a group's codes (128 or 64 contiguous bytes) or 512 contiguous bytes
// of out, the trivial streaming kernels' pattern; lane u < S_ROW_DEC checks group u's
// metadata and turns it into (k) or (step, bias) and an overflow flag, which the lanes
// fetch by shuffles (warp-uniform, so the overflow test needs no vote). Same checks and
// arithmetic as d_dec_iter.
#define S_ROW_DEC 4u // groups per warp (one iteration; see cuda/NOTES.md round 10)

template <int MODE>
__global__ void __launch_bounds__(256) k_group_dec_row(const uint8_t *__restrict__ p, float *__restrict__ out,
                                                       cu_hp head, s_gp g)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u, ng = (uint32_t)g.ng; // B*S*C <= 2^31
    const uint32_t g0 = (blockIdx.x * blockDim.x + threadIdx.x) / 32u * S_ROW_DEC;
    if (g0 >= ng)
        return; // warp-uniform
    uint32_t corrupt = 0, bad = 0;
    const uint32_t cpg = MODE <= M_FIX_STOCH ? 128u : 64u, mpg = MODE == M_INT_ASYM ? 4u : 2u; // bytes per group
    const uint8_t *cw = p + g.codes_off + cpg * (uint64_t)g0 + (cpg / 32u) * lane;
    const uint8_t *mw = p + g.meta_off + mpg * (uint64_t)g0;
    uint32_t code[S_ROW_DEC];
#pragma unroll
    for (uint32_t u = 0; u < S_ROW_DEC; u++)
        code[u] = g0 + u >= ng ? 0u // warp-uniform
                  : MODE <= M_FIX_STOCH ? *(const uint32_t *)(cw + cpg * u) : *(const uint16_t *)(cw + cpg * u);
    // lane u < S_ROW_DEC: group g0 + u's metadata, checked and turned into k (fixpt) or step and
    // bias (int), and whether the group's extreme codes overflow; the lanes fetch them by
    // shuffles
    const bool mvalid = lane < S_ROW_DEC && g0 + lane < ng;
    const uint32_t mt =
        mvalid ? (MODE == M_INT_ASYM ? *(const uint32_t *)(mw + mpg * lane) : *(const uint16_t *)(mw + mpg * lane)) : 0u;
    float pup = 1.0f; // int: the warp's S_ROW_DEC groups share a block (S_ROW_DEC divides S_IBLK)
    if (MODE >= M_INT_ASYM)
        pup = d_int_pup(p, g0, corrupt);
    float ka, kb; // fixpt: k; int: step, bias
    // (metadata 0 on the other lanes checks clean and does not overflow: no need to pass mvalid)
    const bool wide_l = d_dec_meta<MODE>(mt, g, pup, true, ka, kb, corrupt);
    float *ow = out + 128u * (uint64_t)g0 + 4u * lane;
#pragma unroll
    for (uint32_t u = 0; u < S_ROW_DEC; u++) {
        const float k = __shfl_sync(CU_FULL, ka, (int)u);
        const float bias = MODE <= M_FIX_STOCH ? 0.0f : __shfl_sync(CU_FULL, kb, (int)u);
        const bool wide = __shfl_sync(CU_FULL, (uint32_t)wide_l, (int)u) != 0;
        if (g0 + u >= ng)
            break; // warp-uniform
        const uint32_t w = code[u];
        float v[4];
        if (MODE <= M_FIX_STOCH) {
            corrupt |= (uint32_t)((((w & 0x7f7f7f7fu) + 0x01010101u) & w & 0x80808080u) != 0); // 0xff bytes
#pragma unroll
            for (int r = 0; r < 4; r++)
                v[r] = __fmul_rn(__fsub_rn(__uint_as_float(__byte_perm(w, 0x4b000000u, 0x7440u | (uint32_t)r)),
                                           8388735.0f),
                                 k); // (code - 127) * k
        } else {
            if (MODE == M_INT_SYM)
                corrupt |= (uint32_t)((((w & 0x7777u) + 0x1111u) & w & 0x8888u) != 0); // 0xf nibbles
            const uint32_t ev = w & 0x0f0fu, od = (w >> 4) & 0x0f0fu; // codes 0, 2 / 1, 3 in bytes
#pragma unroll
            for (int r = 0; r < 4; r++) { // the code's float: its bits below 2^23's, less 2^23
                const float c = __fsub_rn(
                    __uint_as_float(__byte_perm(r & 1 ? od : ev, 0x4b000000u, 0x7650u | (uint32_t)(r >> 1))),
                    8388608.0f);
                v[r] = __fmul_rn(__fadd_rn(__fmul_rn(c, k), bias), pup); // k: the step
            }
        }
        if (wide) { // warp-uniform: the group's extreme codes overflow
#pragma unroll
            for (int r = 0; r < 4; r++) {
                if (MODE >= M_INT_ASYM) {
                    v[r] = v[r] > FLT_MAX ? FLT_MAX : v[r];
                    v[r] = v[r] < -FLT_MAX ? -FLT_MAX : v[r];
                }
                bad |= (uint32_t)d_nonfinite(v[r]);
            }
        }
        __stcs((float4 *)(ow + 128u * u), make_float4(v[0], v[1], v[2], v[3])); // streaming (k_tah_dw64)
    }
    if (MODE >= M_INT_ASYM && g0 == 0 && lane == 0) // at the end: before the loads it cost 2 % (H100)
        corrupt |= (uint32_t)d_int_pad_bad(p, g);
    if (corrupt)
        d_flag(head, CU_ST_CORRUPT);
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

// int pass 1 of the generic paths: each exponent block's max |x| bits into blk_amax (zeroed
// by the host; a block is S_IBLK groups, blk_elems elements, a multiple of 8, so no 8-element
// chunk straddles two blocks) and the finite check. A warp takes 32 consecutive chunks per
// step, 4 steps' loads first; per step one atomicMax per block its chunks touch.
template <typename X>
__global__ void __launch_bounds__(256) k_absmax(const X *__restrict__ x, uint64_t n, bool vec,
                                                uint32_t *__restrict__ blk_amax, uint64_t blk_elems, cu_hp head)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x; // chunks per step, a multiple of 32
    uint32_t bad = 0;
    for (uint64_t w0 = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) & ~31ull; w0 * 8 < n; w0 += 4 * stride) {
        float v[4][8]; // uniform per warp: w0 is the warp's first chunk
#pragma unroll
        for (int u = 0; u < 4; u++)
            d_load8(x, (w0 + (uint64_t)u * stride + lane) * 8, n, vec, v[u]); // past n: zeros, nothing read
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const uint64_t c = w0 + (uint64_t)u * stride + lane;
            uint32_t mx = 0;
#pragma unroll
            for (int r = 0; r < 8; r++) {
                const uint32_t a = __float_as_uint(v[u][r]) & 0x7fffffffu;
                bad |= (uint32_t)(a >= 0x7f800000u);
                mx = max(mx, a);
            }
            const bool in = c * 8 < n;
            const uint64_t blk = c * 8 / blk_elems;
            uint32_t live = __ballot_sync(CU_FULL, in);
            while (live) { // warp-uniform; the lanes of one block are consecutive
                const int lead = __ffs((int)live) - 1;
                const uint64_t b0 = __shfl_sync(CU_FULL, blk, lead);
                const bool mine = in && blk == b0;
                const uint32_t m = __reduce_max_sync(CU_FULL, mine ? mx : 0u);
                if (lane == (uint32_t)lead && m != 0)
                    atomicMax(&blk_amax[b0], m);
                live &= ~__ballot_sync(CU_FULL, mine);
            }
        }
    }
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

// ---- int encode, round 4: statistics pass + codes pass (4 <= tpg <= 32) ----
// Pass 1 (k_int_stats) reads x once in enc_seg's segments and writes each
// group's (min, max) as a float2 to scratch, the min's zero sign already
// resolved as the CPU's s_minmax picks it (d_int_zkey). Pass 2 (k_int_codes)
// handles U*spw <= 32 groups per warp iteration (slot k = u*spw + segment,
// group base + k, reverse order as before): the exponents of the (at most
// two) blocks the slots fall in from the blocks' statistics (max of |min|,
// |max| bits: the block's max |x| for finite x), then lane k alone computes
// slot k's metadata (the double division of d_step_up once per group, not on
// all tpg lanes of the segment) and stores it as one u32 (asym) / u16 (sym);
// each row's lanes fetch (2^-e, mn, 1/step) by shuffles. Per element the
// float operations are enc_seg's, in the same order, on the same metadata
// values, so the frame is the same.
// A group's metadata from its statistics sv = (min, max) and its block's scale pdown, as
// intq.c computes it: mn (0 when symmetric) and 1/step; stored when `store`. Returns the
// step's fp16 bits.
template <int MODE>
__device__ __forceinline__ uint16_t d_int_meta(float2 sv, float pdown, const s_gp &g, uint8_t *p, uint64_t gi, bool store,
                                           float &mn, float &inv)
{
    const float lo = __fmul_rn(sv.x, pdown), hi = __fmul_rn(sv.y, pdown);
    mn = 0.0f;
    if (MODE == M_INT_SYM) {
        const float am = fabsf(lo) > fabsf(hi) ? fabsf(lo) : fabsf(hi);
        const uint16_t sh = d_step_up((double)am, (uint32_t)g.qmax, g.inv_l);
        const float step = d_half_to_f32(sh);
        inv = step > 0.0f ? __fdiv_rn(1.0f, step) : 0.0f;
        if (store)
            d_put_u16(p + g.meta_off + 2 * gi, sh);
        return sh;
    }
    const uint16_t mh = d_half_from_f32_down(lo);
    mn = d_half_to_f32(mh);
    const uint16_t sh = d_step_up((double)hi - (double)mn, g.L, g.inv_l);
    const float step = d_half_to_f32(sh);
    inv = step > 0.0f ? __fdiv_rn(1.0f, step) : 0.0f;
    if (store)
        d_put_u32(p + g.meta_off + 4 * gi, (uint32_t)mh | ((uint32_t)sh << 16));
    return sh;
}

// k_int_stats' work for warp `warp` of `nwarps`; non-finite x in bad.
template <int MODE, int U, typename X>
__device__ __forceinline__ void d_int_stats(const X *__restrict__ x, float2 *__restrict__ st, const s_gp &g,
                                                uint64_t warp, uint64_t nwarps, uint32_t &bad)
{
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t tpg = g.tpg, tl = lane % tpg, spw = 32u / tpg;
    const uint64_t rows_per_it = (uint64_t)U * spw;
    for (uint64_t base = warp * rows_per_it; base < g.ng; base += nwarps * rows_per_it) { // uniform per warp
        float v[U][8];
        uint64_t gi[U];
        uint32_t len[U];
#pragma unroll
        for (int u = 0; u < U; u++) { // all loads first
            const uint64_t gi_raw = base + (uint64_t)u * spw + lane / tpg;
            const bool valid = gi_raw < g.ng;
            gi[u] = valid ? gi_raw : 0;
            const uint64_t off = gi[u] * g.group;
            len[u] = valid ? (uint32_t)(g.n - off < g.group ? g.n - off : g.group) : 0u;
            const uint64_t end = 8u * tl < len[u] ? off + len[u] : off;
            d_load8(x, off + 8u * tl, end, g.vec, v[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            s_gs s;
            s.a = __uint_as_float(0x7f800000u);
            s.b = -__uint_as_float(0x7f800000u);
            s.z = 0xffffffffu;
            d_group_stats<MODE>(v[u], len[u], tl, s, bad);
            for (uint32_t o = 1; o < tpg; o *= 2)
                d_gs_merge<MODE>(s, d_gs_shfl<MODE>(s, o));
            if (len[u] != 0 && tl == 0) {
                float lo = s.a;
                if (lo == 0.0f) // which zero: the CPU's (sign of the winning zero key)
                    lo = (s.z & 1u) ? -0.0f : 0.0f;
                st[gi[u]] = make_float2(lo, s.b);
            }
        }
    }
}

// The exponent of block blk from its groups' statistics (a warp, two loads per lane).
__device__ __forceinline__ int32_t d_blk_exp(const float2 *st, const s_gp &g, uint64_t blk, uint32_t lane)
{
    uint32_t m = 0;
#pragma unroll
    for (uint32_t k = 0; k < S_IBLK; k += 32u) {
        const uint64_t gi = blk * S_IBLK + k + lane;
        if (gi < g.ng) {
            const float2 sv = st[gi];
            m = max(m, max(__float_as_uint(sv.x) & 0x7fffffffu, __float_as_uint(sv.y) & 0x7fffffffu));
        }
    }
    return d_int_exp(__reduce_max_sync(CU_FULL, m));
}

template <int MODE, int U, typename X>
__global__ void __launch_bounds__(256) k_int_stats(const X *__restrict__ x, float2 *__restrict__ st,
                                                   cu_hp head, s_gp g)
{
    d_mark(head);
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32u;
    uint32_t bad = 0;
    d_int_stats<MODE, U, X>(x, st, g, warp, nwarps, bad);
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

// k_int_codes' work for warp `warp` of `nwarps`.
template <int MODE, int BITS, int U, typename X>
// (st without __restrict__: in k_int_fused other CTAs wrote it in this launch.)
__device__ __forceinline__ void d_int_codes(const X *__restrict__ x, const float2 *st,
                                            uint8_t *__restrict__ p, const s_gp &g, uint64_t warp, uint64_t nwarps)
{
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t tpg = g.tpg, tl = lane % tpg, spw = 32u / tpg;
    const uint32_t bits = BITS > 0 ? (uint32_t)BITS : g.bits;
    const uint32_t mask = (1u << bits) - 1u;
    const float qmaxf = (float)g.qmax, Lf = (float)g.L;
    const uint32_t nslot = (uint32_t)U * spw; // <= 32 (tpg >= 4)
    for (uint64_t base = warp * nslot; base < g.ng; base += nwarps * nslot) { // uniform per warp
        // this lane's slot: its group's statistics first (L2: pass 1 wrote them)
        const uint64_t mraw = base + lane;
        const bool mvalid = lane < nslot && mraw < g.ng;
        const uint64_t mgi = g.ng - 1 - (mvalid ? mraw : 0);
        const float2 sv = mvalid ? st[mgi] : make_float2(0.0f, 0.0f);
        // the slots' blocks: slot 0's group is the highest, the last valid slot's the lowest, and
        // nslot <= 32 < S_IBLK, so at most two
        const uint64_t b_hi = (g.ng - 1 - base) / S_IBLK;
        const uint64_t b_lo = (g.ng - 1 - min(base + nslot - 1u, g.ng - 1)) / S_IBLK;
        const int32_t e_hi = d_blk_exp(st, g, b_hi, lane);
        const int32_t e_lo = b_lo == b_hi ? e_hi : d_blk_exp(st, g, b_lo, lane);
        const int32_t e = mgi / S_IBLK == b_hi ? e_hi : e_lo;
        const float pdown = d_pow2f(-e);
        if (mvalid && mgi % S_IBLK == 0)
            d_int_put_exp(p, g, mgi / S_IBLK, e);
        float v[U][8];
        uint64_t gi[U];
        uint32_t len[U];
        bool valid[U];
#pragma unroll
        for (int u = 0; u < U; u++) { // all loads first
            const uint64_t gi_raw = base + (uint64_t)u * spw + lane / tpg;
            valid[u] = gi_raw < g.ng;
            gi[u] = g.ng - 1 - (valid[u] ? gi_raw : 0); // reverse order
            const uint64_t off = gi[u] * g.group;
            len[u] = valid[u] ? (uint32_t)(g.n - off < g.group ? g.n - off : g.group) : 0u;
            const uint64_t end = 8u * tl < len[u] ? off + len[u] : off;
            d_load8(x, off + 8u * tl, end, g.vec, v[u]);
        }
        // slot `lane`'s metadata, exactly as the CPU computes it
        float mn, inv;
        d_int_meta<MODE>(sv, pdown, g, p, mgi, mvalid, mn, inv);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int slot = (int)((uint32_t)u * spw + lane / tpg);
            const float q_inv = __shfl_sync(CU_FULL, inv, slot);
            const float q_mn = MODE == M_INT_SYM ? 0.0f : __shfl_sync(CU_FULL, mn, slot);
            const float q_pd = __shfl_sync(CU_FULL, pdown, slot);
            if (!valid[u] || 8u * tl >= len[u])
                continue;
            const uint32_t m = len[u] - 8u * tl < 8u ? len[u] - 8u * tl : 8u;
            uint32_t code[8];
#pragma unroll
            for (int r = 0; r < 8; r++) {
                float t;
                int32_t c;
                if (MODE == M_INT_ASYM) {
                    t = __fmul_rn(__fsub_rn(__fmul_rn(v[u][r], q_pd), q_mn), q_inv);
                    t = t < 0.0f ? 0.0f : t;
                    t = t > Lf ? Lf : t;
                    c = (int32_t)rintf(t);
                } else {
                    t = __fmul_rn(__fmul_rn(v[u][r], q_pd), q_inv);
                    t = t < -qmaxf ? -qmaxf : t;
                    t = t > qmaxf ? qmaxf : t;
                    c = (int32_t)rintf(t) + g.qmax;
                }
                code[r] = (uint32_t)r < m ? ((uint32_t)c & mask) : 0u;
            }
            uint64_t lo, hi;
            d_pack8(code, bits, lo, hi);
            d_store_bytes(p + g.codes_off + gi[u] * g.gbytes + (uint64_t)tl * bits, lo, hi, (m * bits + 7u) / 8u);
        }
    }
}

template <int MODE, int BITS, int U, typename X>
__global__ void __launch_bounds__(256) k_int_codes(const X *__restrict__ x, const float2 *__restrict__ st,
                                                   uint8_t *__restrict__ p, cu_hp head, s_gp g)
{
    d_mark(head);
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32u;
    d_int_codes<MODE, BITS, U, X>(x, st, p, g, warp, nwarps);
}

// int encode in one cooperative launch (round 6, 4 <= tpg <= 32): k_int_stats' pass, one
// grid barrier, then k_int_codes' pass (groups in reverse: the end of x, read last, is
// still in L2). Replaces k_int_stats + k_int_codes: the same statistics, exponents and
// codes.
#define S_INT_MAXGRID 1024u
template <int MODE, int BITS, int U, int MINB, typename X>
__global__ void __launch_bounds__(256, MINB) k_int_fused(const X *__restrict__ x, float2 *st,
                                                      uint8_t *__restrict__ p, cu_hp head, s_gp g)
{
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    d_mark(head);
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32u;
    uint32_t bad = 0;
    d_int_stats<MODE, U, X>(x, st, g, warp, nwarps, bad);
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
    grid.sync(); // every group's statistics written
    d_int_codes<MODE, BITS, U, X>(x, st, p, g, warp, nwarps);
}

// int encode, the default int specs (4 bits, group 128, asymmetric or symmetric) on whole
// groups (n % 128 == 0): x read once, one launch (k_int_quad, below).
//
// Round 10's codes without intq.c's clamp of t to [0, L] (symmetric [-qmax, qmax]),
// which never changes a code here (finite x; eps = 2^-24):
//   asymmetric: mn <= lo <= xs (roundings down and monotonic), so xs - mn >= +0 and t >= +0;
//     xs <= hi, step * L >= (double)(hi - mn) >= (hi - mn)(1 - 2^-53) (the test in
//     d_step_up, then the fp16 rounding up), so t <= L (1 + eps)^3 / (1 - 2^-53) < L + 1/2;
//   symmetric: |xs| <= max(|lo|, |hi|) <= step * qmax likewise, so |t| < qmax + 1/2;
//   step == 0: inv = 0 and t = 0. A subnormal xs - mn is exact, inv is a normal float
//   (2^-24 <= step <= 65504). So rint(t) is already in range, as the clamped t's.
//
// 4 codes (4 consecutive elements of a group, f) in the low 16 bits: intq.c's arithmetic
// without the clamp (above). The codes are the low bytes of t + K, K an even integer in
// [2^23, 2^24) (rounding to nearest even there is rint(t)'s): asymmetric K = 1.5 * 2^23, low
// byte rint(t) in [0, 15]; symmetric (4 bits, qmax 7) K = 1.5 * 2^23 + 8, low byte
// rint(t) + 8 in [1, 15], less 1. Two byte permutes gather them, a shift and an or pack them.
// FMA (asymmetric, block exponent e <= 0, where x 2^-e is exact): x 2^-e - mn as one FMA,
// rounded as the FMUL and FSUB are.
template <int MODE, bool FMA>
__device__ __forceinline__ uint32_t d_int_codes4(float4 f, float pdown, float mn, float inv)
{
    const float v[4] = { f.x, f.y, f.z, f.w };
    uint32_t w[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const float t = MODE == M_INT_SYM ? __fmul_rn(__fmul_rn(v[r], pdown), inv)
                        : FMA             ? __fmul_rn(__fmaf_rn(v[r], pdown, -mn), inv)
                                          : __fmul_rn(__fsub_rn(__fmul_rn(v[r], pdown), mn), inv);
        w[r] = __float_as_uint(__fadd_rn(t, MODE == M_INT_SYM ? 12582920.0f : 12582912.0f));
    }
    uint32_t w02 = __byte_perm(w[0], w[2], 0x0040u), w13 = __byte_perm(w[1], w[3], 0x0040u);
    if (MODE == M_INT_SYM) {
        w02 -= 0x0101u;
        w13 -= 0x0101u;
    }
    return w02 | (w13 << 4);
}

// k_int_quad (round 30, in place of round 15's k_int_row): a CTA of 8 warps takes one exponent
// block (S_IBLK = 64 groups), a quad of 4 lanes takes a group. k_int_row's lanes held 4
// elements of a group, so every group cost each lane two full-warp reductions (min and max on
// order-preserving keys), a zero check and a shuffle of its metadata, and a warp's one
// metadata computation served 4 groups: 11.2 M warp instructions for the bench tensor, which
// the H200 issued slower than it streamed the bytes (68 % of copy). Here 5.5 M:
// - Lane j of a quad holds the group's 4-element chunks j, j+4, ..., j+28 (elements 16k + 4j
//   .. +3, k = 0..7), so each load instruction of a warp reads 8 groups' 64 contiguous bytes.
// - Min and max: 31 comparisons a lane and two quad shuffles. They propagate NaN (min.NaN,
//   max.NaN), so the block's max of its groups' |min| and |max| bits is its max |x| and shows
//   a non-finite x (>= 0x7f800000) without a per-element test.
// - Every lane of a quad computes its group's metadata (no shuffle hands it out).
// - Codes: where the block exponent e <= 0, x 2^-e is exact (a power of two at least 1, and
//   |x| 2^-e <= 2^14), so the asymmetric code's x 2^-e - mn is one FMA, rounded as the FMUL
//   and FSUB were. A chunk's 4 codes are 16 bits at byte 8k + 2j of the group's 64; they go
//   through shared memory so that each lane stores 16 contiguous bytes (one 16-byte store
//   where the codes are 16-byte aligned, else four of 4): 16-bit stores straight from the
//   registers measured 70 % of copy on the H200, pairs swapped into 32-bit stores 75 %, this 76 %.
// Measured and not kept (cuda/NOTES.md, round 30): two rows of 8 groups a warp (fewer
// instructions, 96 registers: slower), a persistent grid that copies each CTA's next block into
// shared memory (cp.async) while it quantises the current one (slower).
#define S_IQ_CTA (4u * S_IBLK) // threads of k_int_quad: a quad per group

// one group's codes from its quad: sq, the quad's 64 bytes in shared memory; cg, the group's
// codes in the payload (16-byte aligned when a16)
template <int MODE, bool FMA>
__device__ __forceinline__ void d_int_quad_codes(const float4 (&v)[8], uint8_t *sq, uint8_t *cg, bool a16, uint32_t j,
                                                 float pdown, float mn, float inv)
{
#pragma unroll
    for (int k = 0; k < 8; k++)
        *(uint16_t *)(sq + 8 * k + 2 * j) = (uint16_t)d_int_codes4<MODE, FMA>(v[k], pdown, mn, inv);
    __syncwarp(0xfu << (threadIdx.x & 28u));
    const uint4 w = *(const uint4 *)(sq + 16 * j);
    if (a16) {
        *(uint4 *)(cg + 16 * j) = w;
    } else {
        uint32_t *c4 = (uint32_t *)(cg + 16 * j);
        c4[0] = w.x;
        c4[1] = w.y;
        c4[2] = w.z;
        c4[3] = w.w;
    }
}

template <int MODE, typename X>
__global__ void __launch_bounds__(S_IQ_CTA) k_int_quad(const X *__restrict__ x, uint8_t *__restrict__ p, cu_hp head,
                                                       s_gp g)
{
    d_mark(head);
    constexpr uint32_t NW = S_IQ_CTA / 32u; // warps
    __shared__ uint32_t ws[NW];
    __shared__ __align__(16) uint8_t sc[80u * S_IBLK]; // group q's codes at 80 q: no bank conflict
    const uint32_t lane = threadIdx.x & 31u, j = lane & 3u, q = threadIdx.x / 4u, ng = (uint32_t)g.ng; // B*S*C <= 2^31
    const uint32_t gi = blockIdx.x * S_IBLK + q;
    const bool live = gi < ng; // quad-uniform
    float4 v[8];
    if (live) {
        const X *xq = x + 128u * (uint64_t)gi + 4u * j;
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = d_load_f4(xq + 16 * k);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f); // zeros leave the block's max alone
    }
    float a = d_fmin_nan(d_fmin_nan(v[0].x, v[0].y), d_fmin_nan(v[0].z, v[0].w)); // the group's min
    float b = d_fmax_nan(d_fmax_nan(v[0].x, v[0].y), d_fmax_nan(v[0].z, v[0].w)); // and max
#pragma unroll
    for (int k = 1; k < 8; k++) {
        a = d_fmin_nan(a, d_fmin_nan(d_fmin_nan(v[k].x, v[k].y), d_fmin_nan(v[k].z, v[k].w)));
        b = d_fmax_nan(b, d_fmax_nan(d_fmax_nan(v[k].x, v[k].y), d_fmax_nan(v[k].z, v[k].w)));
    }
    a = d_fmin_nan(a, __shfl_xor_sync(CU_FULL, a, 1));
    b = d_fmax_nan(b, __shfl_xor_sync(CU_FULL, b, 1));
    a = d_fmin_nan(a, __shfl_xor_sync(CU_FULL, a, 2));
    b = d_fmax_nan(b, __shfl_xor_sync(CU_FULL, b, 2));
    if (live && a == 0.0f) { // quad-uniform; which zero is the minimum: intq.c's (d_int_zkey)
        uint32_t z = 0xffffffffu;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float e4[4] = { v[k].x, v[k].y, v[k].z, v[k].w };
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (e4[i] == 0.0f)
                    z = min(z, d_int_zkey(16u * (uint32_t)k + 4u * j + (uint32_t)i, 128u, __float_as_uint(e4[i]) >> 31));
        }
        const uint32_t quad = 0xfu << (lane & 28u);
        z = min(z, __shfl_xor_sync(quad, z, 1));
        z = min(z, __shfl_xor_sync(quad, z, 2));
        a = (z & 1u) ? -0.0f : 0.0f;
        if (b == 0.0f) // all zeros: intq.c's max is the same element as its min
            b = a;
    }
    const uint32_t amax =
        __reduce_max_sync(CU_FULL, max(__float_as_uint(a) & 0x7fffffffu, __float_as_uint(b) & 0x7fffffffu));
    if (lane == 0)
        ws[threadIdx.x / 32u] = amax;
    __syncthreads();
    uint32_t bmax = 0;
#pragma unroll
    for (uint32_t i = 0; i < NW; i++)
        bmax = max(bmax, ws[i]);
    if (bmax >= 0x7f800000u && threadIdx.x == 0)
        d_flag(head, CU_ST_NONFINITE); // the payload is then unspecified
    const int32_t e = d_int_exp(bmax);
    if (threadIdx.x == 0)
        d_int_put_exp(p, g, blockIdx.x, e);
    if (!live)
        return; // quad-uniform, after the barrier
    const float pdown = d_pow2f(-e);
    float mn, inv;
    d_int_meta<MODE>(make_float2(a, b), pdown, g, p, gi, j == 0, mn, inv);
    uint8_t *sq = sc + 80u * q, *cg = p + g.codes_off + 64u * (uint64_t)gi;
    const bool a16 = ((uintptr_t)(p + g.codes_off) & 15u) == 0;
    if (MODE == M_INT_ASYM && e <= 0)
        d_int_quad_codes<MODE, true>(v, sq, cg, a16, j, pdown, mn, inv);
    else
        d_int_quad_codes<MODE, false>(v, sq, cg, a16, j, pdown, mn, inv);
}

// fixpt encode (4 <= tpg <= 32; round 4, restructured in round 7): the step once per
// group on one lane. A warp iteration takes U rows of spw = 32/tpg groups (slot
// k = u*spw + segment is group base + k); after the U rows' segment maxima, lane k
// gathers slot k's max|x| and computes that group's step alone (two IEEE divisions, a
// double compare, the fp16 rounding up), each row's lanes fetch 1/d by one shuffle.
//
// Round 7: (1) 32-bit element indices (B*S*C <= 2^31); (2) the
// statistics as one integer max of |x|'s bits per element (the same max for finite x;
// >= 0x7f800000 iff some x is Inf or NaN, then the status is TAH_ENONFINITE and the
// payload unspecified, as before); (3) nearest rounding at 8 bits: the codes as the low
// bytes of t + (1.5 * 2^23 + 128), packed by byte permutes, minus 1 per byte, where
// round 4 clamped t to +-qmax, rounded with rintf and added qmax. The same codes:
//   |t| <= qmax (1 + 2^-23) < qmax + 1/2, since d * qmax >= max|c x| (checked in double),
//   the fp16 step df >= d and 1/df is rounded once, so the clamp never changes rint(t);
//   t + M for an even integer M in [2^23 + 128, 2^24 - 128] rounds to M + rint(t), ties
//   to even as rintf (and as fixpt.c's (t + 1.5*2^23) - 1.5*2^23), so the low byte is
//   128 + rint(t) in [1, 255] and the code rint(t) + 127 is that byte minus 1 (no borrow).
// Other modes and widths keep round 4's per-element operations. (Tried and measured
// slower, H200: a persistent grid of resident CTAs, prefetching the next iteration
// into a second register buffer, and lanes holding elements [4l, 4l+4) and
// [4tpg+4l, +4) so each 16-byte load covers whole sectors; cuda/NOTES.md round 7.)
template <int U>
struct s_fbuf {
    float v[U][8];
};

template <int U, typename X>
__device__ __forceinline__ void d_fix_load(const X *__restrict__ x, const s_gp &g, uint32_t base, uint32_t lane,
                                           s_fbuf<U> &b)
{
    const uint32_t tpg = g.tpg, tl = lane % tpg, spw = 32u / tpg;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t gi = base + (uint32_t)u * spw + lane / tpg; // B*S*C <= 2^31: 32-bit indices
        const bool valid = gi < (uint32_t)g.ng;
        const uint32_t off = (valid ? gi : 0u) * g.group;
        const uint32_t len = valid ? min((uint32_t)g.n - off, g.group) : 0u;
        const uint32_t end = 8u * tl < len ? off + len : off; // lanes past the group read nothing
        d_load8(x, off + 8u * tl, end, g.vec, b.v[u]);
    }
}

template <int MODE, int BITS, int U>
__device__ __forceinline__ void d_fix_iter(uint8_t *__restrict__ p, const s_gp &g, uint32_t base, uint32_t lane,
                                           const s_fbuf<U> &b, uint32_t &inmax, uint32_t &range)
{
    const uint32_t tpg = g.tpg, tl = lane % tpg, spw = 32u / tpg;
    const uint32_t bits = BITS > 0 ? (uint32_t)BITS : g.bits;
    const uint32_t mask = (1u << bits) - 1u;
    const uint32_t nslot = (uint32_t)U * spw; // <= 32 (tpg >= 4)
    const float qmaxf = (float)g.qmax;
    // segment maxima of |x| bits (zeros past a group's end change nothing), then slot
    // `lane`'s maximum: row lane / spw, segment lane % spw
    uint32_t slot_bits = 0;
#pragma unroll
    for (int u = 0; u < U; u++) {
        uint32_t m = 0;
#pragma unroll
        for (int r = 0; r < 8; r++)
            m = max(m, __float_as_uint(b.v[u][r]) & 0x7fffffffu);
        m = d_seg_maxu(m, tpg);
        const uint32_t a = __shfl_sync(CU_FULL, m, (int)((lane % spw) * tpg));
        if (lane / spw == (uint32_t)u)
            slot_bits = a;
    }
    inmax = max(inmax, slot_bits);
    // slot `lane`'s step, exactly as the CPU computes it
    const uint32_t mgi = base + lane;
    const bool mvalid = lane < nslot && mgi < (uint32_t)g.ng;
    float inv;
    const uint16_t dh = d_fix_step(g, __uint_as_float(slot_bits), mvalid, range, inv);
    if (mvalid)
        d_put_u16(p + g.meta_off + 2 * (uint64_t)mgi, dh);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t slot = (uint32_t)u * spw + lane / tpg;
        const float q_inv = __shfl_sync(CU_FULL, inv, (int)slot);
        const uint32_t gi = base + slot;
        const uint32_t off = gi * g.group;
        const uint32_t len = gi < (uint32_t)g.ng ? min((uint32_t)g.n - off, g.group) : 0u;
        if (8u * tl >= len) // also every lane of an invalid group (len 0)
            continue;
        const uint32_t m = min(len - 8u * tl, 8u);
        uint64_t lo, hi = 0;
        if (MODE == M_FIX_NEAR && BITS == 8) {
            uint32_t w[8];
#pragma unroll
            for (int r = 0; r < 8; r++)
                w[r] = __float_as_uint(__fadd_rn(__fmul_rn(__fmul_rn(g.c, b.v[u][r]), q_inv), 12583040.0f));
            const uint32_t w03 = __byte_perm(__byte_perm(w[0], w[1], 0x0040u), __byte_perm(w[2], w[3], 0x0040u), 0x5410u);
            const uint32_t w47 = __byte_perm(__byte_perm(w[4], w[5], 0x0040u), __byte_perm(w[6], w[7], 0x0040u), 0x5410u);
            lo = (uint64_t)(w03 - 0x01010101u) | ((uint64_t)(w47 - 0x01010101u) << 32);
        } else {
            uint32_t code[8];
#pragma unroll
            for (int r = 0; r < 8; r++) {
                float t = __fmul_rn(__fmul_rn(g.c, b.v[u][r]), q_inv);
                t = t < -qmaxf ? -qmaxf : t;
                t = t > qmaxf ? qmaxf : t;
                int32_t c;
                if (MODE == M_FIX_NEAR) {
                    c = (int32_t)rintf(t) + g.qmax;
                } else {
                    c = d_stoch_code(t, g.key, off + 8u * tl + (uint32_t)r, g.qmax);
                }
                code[r] = (uint32_t)r < m ? ((uint32_t)c & mask) : 0u;
            }
            d_pack8(code, bits, lo, hi);
        }
        d_store_bytes(p + g.codes_off + (uint64_t)gi * g.gbytes + tl * bits, lo, hi, (m * bits + 7u) / 8u);
    }
}

template <int MODE, int BITS, int U, int MINB, typename X>
__global__ void __launch_bounds__(256, MINB) k_fix_enc(const X *__restrict__ x, uint8_t *__restrict__ p,
                                                       cu_hp head, s_gp g)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint32_t nwarps = gridDim.x * blockDim.x / 32u;
    const uint32_t nslot = (uint32_t)U * (32u / g.tpg);
    const uint32_t stride = nwarps * nslot, ng = (uint32_t)g.ng; // B*S*C <= 2^31
    uint32_t inmax = 0, range = 0;
    s_fbuf<U> b;
    for (uint32_t base = warp * nslot; base < ng; base += stride) { // uniform per warp
        d_fix_load<U, X>(x, g, base, lane, b);
        d_fix_iter<MODE, BITS, U>(p, g, base, lane, b, inmax, range);
    }
    if (inmax >= 0x7f800000u)
        d_flag(head, CU_ST_NONFINITE);
    if (range)
        d_flag(head, CU_ST_RANGE);
}

// Round 10: fixpt encode (8 bits, whole groups of 128) with a warp per group, lane
// l on elements 4l..4l+3 (see k_group_dec_row): S_ROW_ENC groups' loads in flight per lane,
// each group's max|x| by one redux, lane u computes group u's step (d_fix_iter's
// arithmetic), and every group's codes leave as one 128-byte store of the warp.
// Stochastic rounding since round 26 (it had kept the segment kernel, k_fix_enc).
#define S_ROW_ENC 4u // groups per warp (one iteration)

template <int MODE, typename X>
__global__ void __launch_bounds__(256) k_fix_enc_row(const X *__restrict__ x, uint8_t *__restrict__ p, cu_hp head,
                                                     s_gp g)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u, ng = (uint32_t)g.ng; // B*S*C <= 2^31
    const uint32_t g0 = (blockIdx.x * blockDim.x + threadIdx.x) / 32u * S_ROW_ENC;
    if (g0 >= ng)
        return; // warp-uniform
    const X *xw = x + 128u * (uint64_t)g0 + 4u * lane;
    float4 v[S_ROW_ENC];
#pragma unroll
    for (uint32_t u = 0; u < S_ROW_ENC; u++) // past the end: zeros, nothing stored
        v[u] = g0 + u < ng ? d_load_f4(xw + 128u * u) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    uint32_t slot_bits = 0; // lane u: group g0 + u's max|x| bits
#pragma unroll
    for (uint32_t u = 0; u < S_ROW_ENC; u++) {
        const uint32_t a = __reduce_max_sync(CU_FULL, d_absbits_max4(v[u]));
        if (lane == u)
            slot_bits = a;
    }
    slot_bits = __shfl_sync(CU_FULL, slot_bits, (int)(lane % S_ROW_ENC)); // copies: one path
    const bool mvalid = lane < S_ROW_ENC && g0 + lane < ng;
    uint32_t range = 0;
    float inv;
    const uint16_t dh = d_fix_step(g, __uint_as_float(slot_bits), mvalid, range, inv);
    if (mvalid)
        *(uint16_t *)(p + 2u * (uint64_t)(g0 + lane)) = dh;
    uint8_t *cw = p + g.codes_off + 128u * (uint64_t)g0 + 4u * lane;
    // stochastic: fixpt.c's clamp of t to +-127 can act only where (|c| max|x|) fl(1/step) rounds
    // above 127 (|t| is largest at max|x|: the roundings are monotonic and sign-symmetric); a
    // warp none of whose groups does skips it (2 of ~22 instructions per element; test_cu_codec's
    // step-edge input has groups where it acts)
    const bool clamp = MODE == M_FIX_STOCH &&
                       !__all_sync(CU_FULL, !mvalid || __fmul_rn(__fmul_rn(fabsf(g.c), __uint_as_float(slot_bits)), inv) <= 127.0f);
#pragma unroll
    for (uint32_t u = 0; u < S_ROW_ENC; u++) {
        const float q_inv = __shfl_sync(CU_FULL, inv, (int)u);
        if (g0 + u >= ng)
            break; // warp-uniform
        uint32_t w[4];
        const float f[4] = { v[u].x, v[u].y, v[u].z, v[u].w };
        if (MODE == M_FIX_NEAR) {
#pragma unroll
            for (int r = 0; r < 4; r++) // round(c x / step) + 128 in the low byte
                w[r] = __float_as_uint(__fadd_rn(__fmul_rn(__fmul_rn(g.c, f[r]), q_inv), 12583040.0f));
        } else { // d_stoch_code with qmax = 127 folded into the floor's constant: floor(t) + 127 +
                 // (u < frac) in the low byte (at most 254: no carry)
            const uint32_t i0 = 128u * (g0 + u) + 4u * lane; // a multiple of 4: i0 + r = i0 | r
            // d_stoch_u(k, i0 | r) with lowbias32's first xor-shift taken once per group: r < 4
            // leaves (i0 ^ r ^ k) >> 16 = (i0 ^ k) >> 16, so that step is A ^ r
            const uint32_t A = (i0 ^ g.key) ^ ((i0 ^ g.key) >> 16);
            auto codes = [&](bool cl) {
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    float t = __fmul_rn(__fmul_rn(g.c, f[r]), q_inv);
                    if (cl)
                        t = fminf(fmaxf(t, -127.0f), 127.0f);
                    const float s = __fadd_rd(t, 12583039.0f); // 1.5 * 2^23 + 127
                    const float frac = __fsub_rn(t, __fsub_rn(s, 12583039.0f));
                    w[r] = __float_as_uint(s) + (uint32_t)(d_stoch_u1(A ^ (uint32_t)r) < frac);
                }
            };
            if (clamp)
                codes(true);
            else
                codes(false);
        }
        const uint32_t w03 = __byte_perm(__byte_perm(w[0], w[1], 0x0040u), __byte_perm(w[2], w[3], 0x0040u), 0x5410u);
        *(uint32_t *)(cw + 128u * u) = MODE == M_FIX_NEAR ? w03 - 0x01010101u : w03;
    }
    if (slot_bits >= 0x7f800000u)
        d_flag(head, CU_ST_NONFINITE);
    if (range)
        d_flag(head, CU_ST_RANGE);
}

template <int MODE>
__global__ void __launch_bounds__(256) k_group_decode(const uint8_t *__restrict__ p, float *__restrict__ out,
                                                      cu_hp head, s_gp g)
{
    d_mark(head);
    const uint64_t nchunks = g.ng * g.cpg, stride = (uint64_t)gridDim.x * blockDim.x;
    const uint32_t bad_code = (1u << g.bits) - 1u;
    uint32_t corrupt = 0, bad = 0;
    for (uint64_t id = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; id < nchunks; id += stride) {
        const uint64_t gi = id / g.cpg;
        const uint32_t j = (uint32_t)(id - gi * g.cpg);
        const uint64_t off = gi * g.group;
        const uint32_t len = (uint32_t)(g.n - off < g.group ? g.n - off : g.group);
        if (8u * j >= len)
            continue;
        const uint32_t m = len - 8u * j < 8u ? len - 8u * j : 8u;
        float k = 0.0f, step = 0.0f, bias = 0.0f, pup = 1.0f;
        if (MODE <= M_FIX_STOCH) {
            const uint16_t dh = d_get_u16(p + g.meta_off + 2 * gi);
            corrupt |= (uint32_t)((dh & 0x8000u) || (dh & 0x7c00u) == 0x7c00u);
            k = __fdiv_rn(d_half_to_f32(dh), g.c);
        } else {
            uint16_t sh;
            float mn = 0.0f;
            if (MODE == M_INT_SYM) {
                sh = d_get_u16(p + g.meta_off + 2 * gi);
            } else {
                const uint16_t mh = d_get_u16(p + g.meta_off + 4 * gi);
                corrupt |= (uint32_t)((mh & 0x7c00u) == 0x7c00u);
                mn = d_half_to_f32(mh);
                sh = d_get_u16(p + g.meta_off + 4 * gi + 2);
            }
            corrupt |= (uint32_t)((sh & 0x8000u) || (sh & 0x7c00u) == 0x7c00u);
            step = d_half_to_f32(sh);
            bias = MODE == M_INT_SYM ? __fmul_rn(-(float)g.qmax, step) : mn;
            pup = d_int_pup(p, gi, corrupt);
        }
        const uint32_t nbytes = (m * g.bits + 7u) / 8u, pb = m * g.bits;
        uint64_t lo, hi;
        d_load_bytes(p + g.codes_off + gi * g.gbytes + (uint64_t)j * g.bits, nbytes, lo, hi);
        const uint64_t pad = pb < 64 ? ((lo >> pb) | hi) : (pb < 128 ? hi >> (pb - 64) : 0);
        corrupt |= (uint32_t)(pad != 0);
        uint32_t code[8];
        d_unpack8(lo, hi, g.bits, code);
        float v[8];
#pragma unroll
        for (int r = 0; r < 8; r++) {
            float y;
            if (MODE <= M_FIX_STOCH) {
                y = __fmul_rn((float)((int32_t)code[r] - g.qmax), k);
            } else {
                y = __fmul_rn(__fadd_rn(__fmul_rn((float)code[r], step), bias), pup);
                y = y > FLT_MAX ? FLT_MAX : y;
                y = y < -FLT_MAX ? -FLT_MAX : y;
            }
            v[r] = y;
            if ((uint32_t)r < m) {
                if (MODE != M_INT_ASYM)
                    corrupt |= (uint32_t)(code[r] == bad_code);
                bad |= (uint32_t)d_nonfinite(y);
            }
        }
        d_store8(out, off + 8u * j, m, g.vec, v);
    }
    if (MODE >= M_INT_ASYM && blockIdx.x == 0 && threadIdx.x == 0)
        corrupt |= (uint32_t)d_int_pad_bad(p, g);
    if (corrupt)
        d_flag(head, CU_ST_CORRUPT);
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

static uint32_t s_pow2ceil(uint32_t v)
{
    uint32_t p = 1;
    while (p < v)
        p *= 2;
    return p;
}

static int s_mode(const codec_spec_t *spec)
{
    if (spec->id == CODEC_FIXPT)
        return spec->p.fixpt.stochastic ? M_FIX_STOCH : M_FIX_NEAR;
    return spec->p.intq.symmetric ? M_INT_SYM : M_INT_ASYM;
}

static s_gp s_params(const codec_spec_t *spec, uint64_t n, const void *xy)
{
    s_gp g;
    const bool fix = spec->id == CODEC_FIXPT;
    g.n = n;
    g.group = fix ? spec->p.fixpt.group : spec->p.intq.group;
    g.bits = fix ? spec->p.fixpt.bits : spec->p.intq.bits;
    g.ng = (n + g.group - 1) / g.group;
    g.gbytes = (uint32_t)(((uint64_t)g.group * g.bits + 7) / 8);
    g.cpg = (g.group + 7) / 8;
    g.tpg = g.cpg <= 32 ? s_pow2ceil(g.cpg) : S_CTA;
    g.L = (1u << g.bits) - 1u;
    g.qmax = (1 << (g.bits - 1)) - 1;
    g.c = fix ? spec->p.fixpt.scale : 1.0f;
    g.inv_l = fix ? 0.0 : 1.0 / (double)(spec->p.intq.symmetric ? (uint32_t)g.qmax : g.L);
    g.key = fix ? codec_fixpt_key(spec->p.fixpt.seed) : 0;
    const uint64_t mb = fix ? 2u : (spec->p.intq.symmetric ? 2u : 4u);
    g.nblk = fix ? 0 : (g.ng + S_IBLK - 1) / S_IBLK;
    g.meta_off = (g.nblk + 3) & ~3ull; // intq.c: the exponents, padded to 4 bytes
    g.codes_off = g.meta_off + mb * g.ng;
    g.vec = ((uintptr_t)xy & 15u) == 0 && g.group % 4 == 0;
    return g;
}

// The code width compiled in for each mode (the default specs' bits).
static constexpr int s_fast_bits(int mode) { return mode <= M_FIX_STOCH ? 8 : 4; }

// Round 10's warp-per-group kernels: the default widths (fixpt 8 bits, int 4) on whole
// groups of 128, x or out 16-byte aligned, the payload's metadata and codes aligned to
// their access width.
static bool s_row_ok(const s_gp &g, int mode, const void *payload, const void *xy)
{
    return cu_tpt() && g.group == 128 && g.n % 128u == 0 && g.bits == (mode <= M_FIX_STOCH ? 8u : 4u) &&
           ((uintptr_t)xy & 15u) == 0 && ((uintptr_t)payload & 3u) == 0 && g.codes_off % 4u == 0;
}

// int: the round-4 two-pass path (k_int_stats + k_int_codes) for 4 <= tpg <= 32.
static bool s_int_split(const s_gp &g) { return g.tpg >= 4 && g.tpg <= 32; }

size_t cu_group_scratch(const codec_spec_t *spec, uint64_t n)
{
    if (spec->id != CODEC_INT)
        return 0;
    const uint64_t group = spec->p.intq.group, ng = (n + group - 1) / group;
    return (size_t)ng * sizeof(float2)                             // per-group (min, max): the stats paths
           + 4u * (size_t)((ng + S_IBLK - 1) / S_IBLK);            // per-block max |x| bits: the generic paths
}

template <int MODE, typename X>
static int s_encode_mode(const s_gp &g, const X *x, uint8_t *payload, cu_hp head, void *work, cudaStream_t st,
                         char *err, size_t errlen)
{
    if constexpr (MODE >= M_INT_ASYM) {
        if (s_row_ok(g, MODE, payload, x)) {
            k_int_quad<MODE><<<(unsigned int)g.nblk, S_IQ_CTA, 0, st>>>(x, payload, head, g);
            CU_CHECK_LAUNCH("k_int_quad");
            return 0;
        }
        if (s_int_split(g)) {
            float2 *stats = (float2 *)work;
            const unsigned int grid = cu_grid(g.ng, (uint64_t)(256 / 32) * S_ROWS * (32 / g.tpg));
            if (cu_fuse()) { // one cooperative launch, no memset (round 6; 2 rows per warp at 4
                             // CTAs per SM measured slower: 0.0565 vs 0.0505 ms, H200)
                const void *kern = g.bits == s_fast_bits(MODE)
                                       ? (const void *)k_int_fused<MODE, s_fast_bits(MODE), S_ROWS, 3, X>
                                       : (const void *)k_int_fused<MODE, 0, S_ROWS, 3, X>;
                uint64_t blocks = (uint64_t)cu_coop_blocks(kern, 256, 0);
                blocks = blocks < S_INT_MAXGRID ? blocks : S_INT_MAXGRID;
                blocks = blocks < grid ? blocks : grid;
                if (blocks > 0) {
                    const X *a_x = x;
                    float2 *a_st = stats;
                    uint8_t *a_p = payload;
                    cu_hp a_head = head;
                    s_gp a_g = g;
                    void *args[] = { &a_x, &a_st, &a_p, &a_head, &a_g };
                    CUDA_CHECK(cudaLaunchCooperativeKernel(kern, dim3((unsigned int)blocks), dim3(256), args, 0, st));
                    return 0;
                }
            }
            k_int_stats<MODE, S_ROWS><<<grid, 256, 0, st>>>(x, stats, head, g);
            CU_CHECK_LAUNCH("k_int_stats");
            if (g.bits == s_fast_bits(MODE))
                k_int_codes<MODE, s_fast_bits(MODE), S_ROWS><<<grid, 256, 0, st>>>(x, stats, payload, head, g);
            else
                k_int_codes<MODE, 0, S_ROWS><<<grid, 256, 0, st>>>(x, stats, payload, head, g);
            CU_CHECK_LAUNCH("k_int_codes");
            return 0;
        }
    }
    if constexpr (MODE <= M_FIX_STOCH) {
        if (s_row_ok(g, MODE, payload, x)) {
            k_fix_enc_row<MODE><<<cu_grid(g.ng, 8u * S_ROW_ENC), 256, 0, st>>>(x, payload, head, g);
            CU_CHECK_LAUNCH("k_fix_enc_row");
            return 0;
        }
    }
    if constexpr (MODE <= M_FIX_STOCH) {
        if (g.tpg >= 4 && g.tpg <= 32) {
            // 4 rows per warp iteration, one iteration per warp (round 7's measurements: the
            // persistent grid and 2 rows with prefetch were slower)
            const unsigned int grid = cu_grid(g.ng, (uint64_t)(256 / 32) * S_ROWS * (32 / g.tpg));
            if (g.bits == s_fast_bits(MODE))
                k_fix_enc<MODE, s_fast_bits(MODE), S_ROWS, 4><<<grid, 256, 0, st>>>(x, payload, head, g);
            else
                k_fix_enc<MODE, 0, S_ROWS, 3><<<grid, 256, 0, st>>>(x, payload, head, g);
            CU_CHECK_LAUNCH("k_fix_enc");
            return 0;
        }
    }
    uint32_t *blk_amax = nullptr;
    if (MODE >= M_INT_ASYM) { // each block's max |x| (work: cu_group_scratch's per-block words)
        blk_amax = (uint32_t *)((float2 *)work + g.ng);
        CUDA_CHECK(cudaMemsetAsync(blk_amax, 0, 4u * g.nblk, st)); // atomicMax from 0
        const bool vec = ((uintptr_t)x & 15u) == 0;
        k_absmax<<<cu_grid((g.n + 7) / 8, 256 * 4), 256, 0, st>>>(x, g.n, vec, blk_amax, (uint64_t)S_IBLK * g.group,
                                                                   head);
        CU_CHECK_LAUNCH("k_absmax");
    }
    if (g.tpg == S_CTA) {
        k_group_encode<MODE><<<cu_grid(g.ng, 1), S_CTA, 0, st>>>(x, payload, blk_amax, head, g);
    } else {
        const uint64_t per_block = (uint64_t)(256 / 32) * S_ROWS * (32 / g.tpg); // groups per CTA iteration
        const unsigned int grid = cu_grid(g.ng, per_block);
        if (g.bits == s_fast_bits(MODE))
            k_group_enc_seg<MODE, s_fast_bits(MODE), S_ROWS><<<grid, 256, 0, st>>>(x, payload, blk_amax, head, g);
        else
            k_group_enc_seg<MODE, 0, S_ROWS><<<grid, 256, 0, st>>>(x, payload, blk_amax, head, g);
    }
    CU_CHECK_LAUNCH("k_group_encode");
    return 0;
}

template <typename X>
static int s_group_encode(const codec_spec_t *spec, uint64_t n, const X *x, uint8_t *payload, cu_hp head, void *work,
                          cudaStream_t st, char *err, size_t errlen)
{
    const s_gp g = s_params(spec, n, x);
    switch (s_mode(spec)) {
    case M_FIX_NEAR: return s_encode_mode<M_FIX_NEAR>(g, x, payload, head, work, st, err, errlen);
    case M_FIX_STOCH: return s_encode_mode<M_FIX_STOCH>(g, x, payload, head, work, st, err, errlen);
    case M_INT_ASYM: return s_encode_mode<M_INT_ASYM>(g, x, payload, head, work, st, err, errlen);
    default: return s_encode_mode<M_INT_SYM>(g, x, payload, head, work, st, err, errlen);
    }
}

int cu_group_encode(const codec_spec_t *spec, uint64_t n, cu_dtype_t xt, const void *x, uint8_t *payload,
                    cu_hp head, void *work, cudaStream_t st, char *err, size_t errlen)
{
    if (xt == CU_BF16)
        return s_group_encode(spec, n, (const cu_bf16 *)x, payload, head, work, st, err, errlen);
    return s_group_encode(spec, n, (const float *)x, payload, head, work, st, err, errlen);
}

template <int MODE> // M_FIX_NEAR (both fixpt modes decode alike), M_INT_ASYM, M_INT_SYM
static int s_decode_mode(const s_gp &g, const uint8_t *payload, float *out, cu_hp head, cudaStream_t st, char *err,
                         size_t errlen)
{
    if (s_row_ok(g, MODE, payload, out)) {
        k_group_dec_row<MODE><<<cu_grid(g.ng, 8u * S_ROW_DEC), 256, 0, st>>>(payload, out, head, g);
        CU_CHECK_LAUNCH("k_group_dec_row");
        return 0;
    }
    if (g.tpg <= 32) {
        // rows per warp iteration (lane k < 32 holds slot k's metadata), one iteration per warp
        const uint32_t rows = g.tpg >= 4 ? S_ROWS : g.tpg;
        const unsigned int grid = cu_grid(g.ng, (uint64_t)(256 / 32) * rows * (32 / g.tpg));
        if (g.bits == s_fast_bits(MODE) && g.tpg >= 4)
            k_group_dec_seg<MODE, s_fast_bits(MODE), S_ROWS, 4><<<grid, 256, 0, st>>>(payload, out, head, g);
        else if (g.tpg >= 4)
            k_group_dec_seg<MODE, 0, S_ROWS, 3><<<grid, 256, 0, st>>>(payload, out, head, g);
        else
            k_group_dec_seg<MODE, 0, 1, 3><<<grid, 256, 0, st>>>(payload, out, head, g);
        CU_CHECK_LAUNCH("k_group_dec_seg");
        return 0;
    }
    k_group_decode<MODE><<<cu_grid(g.ng * g.cpg, 256), 256, 0, st>>>(payload, out, head, g);
    CU_CHECK_LAUNCH("k_group_decode");
    return 0;
}

int cu_group_decode(const codec_spec_t *spec, uint64_t n, const uint8_t *payload, float *out, cu_hp head,
                    cudaStream_t st, char *err, size_t errlen)
{
    const s_gp g = s_params(spec, n, out);
    switch (s_mode(spec)) {
    case M_FIX_NEAR:
    case M_FIX_STOCH: return s_decode_mode<M_FIX_NEAR>(g, payload, out, head, st, err, errlen);
    case M_INT_ASYM: return s_decode_mode<M_INT_ASYM>(g, payload, out, head, st, err, errlen);
    default: return s_decode_mode<M_INT_SYM>(g, payload, out, head, st, err, errlen);
    }
}
