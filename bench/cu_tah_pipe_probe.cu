// cu_tah_pipe_probe.cu — how fast could a TAH-Quant encoder be that reads x twice, the second
// time from L2, with one code width per tile and no emit kernel? (round 33's probe; figures and
// conclusions in cuda/NOTES.md, "Thirty-fourth version": on an H200 the two kernels take 55 us,
// the pipelined grid 66-81, the shipped encoder 41; the entropy pass alone 16-29 us.)
//
// The shipped encoder (k_tah_spec + k_tah_emit, cuda/cu_tah.cu) quantises every tile both ways
// from one read of x and lets a second kernel pick each tile's width once the sample's keys are
// ranked. This probe times the other order, the one issue 6 suggests: an entropy pass (E units:
// each tile's key, into the sample's histogram), the sample's threshold found by the unit that
// finishes it last, then a quantise pass (Q units: x read again, min/max and top-2, the rotation
// test, the tile's metadata at its one width, its codes straight into the frame at the offset
// a decoupled look-back over the sample's units gives). Both kinds of unit come from one
// persistent grid in the order E(0) E(1) Q(0) E(2) Q(1) ..., so a sample's second read follows
// its first by about a sample (6.5 MB: L2). Layout: a tile's 64 floats are 16 per lane of a
// lane quad (contiguous, 4 float4), 8 tiles a round, 4 rounds a unit of 32 tiles; the per-tile
// scalar work runs once per tile with tile t of the unit on lane t (two shuffles a round move
// statistics there and back). Rotated tiles (about 3 in 16) are gathered 8 at a time, reloaded
// (L1/L2) and transformed by a quad each.
//
// What is NOT the codec: the entropy sums are trees (tah.c sums its 16 accumulators in order),
// the frame exponent is the tile's own (the real encoder fixes up the metadata of tiles coded
// before the frame's absmax is known: ~1 us more), no zero-minimum rule, no frame header, index
// or non-finite handling. So the frames are not tah.c's; the probe times the work, and checks
// only that each sample gets exactly n_hi high tiles and that the pipelined kernel writes the
// same bytes as the same units run as separate E and Q kernels.
//
// Not part of the build (sm_90; standalone):
//   nvcc -std=c++17 -O3 -arch=sm_90 bench/cu_tah_pipe_probe.cu -o cu_tah_pipe_probe
//   ./cu_tah_pipe_probe
// Lines: queued ms (the memset of the work words and one launch between two events, median of 25
// after 3 warm-ups), then without the memset's own time, each as % of the copy rate for the
// encoder's bytes (x read + 4.425 bits/element). The copy rate here is one cudaMemcpyAsync's,
// lower than bench_cu_codec's: compare milliseconds with that bench, not percentages.
// Exit: 0 ok, 1 CUDA error or a failed check.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#define CK(call)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            fprintf(stderr, "cu_tah_pipe_probe: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,          \
                    cudaGetErrorString(e_));                                                          \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

#define FULL 0xffffffffu
static const uint32_t B = 8, SQ = 1024u * 25u;  // samples, tiles per sample (1024 x 1600 / 64)
static const uint32_t UT = 32, NU = SQ / UT;      // tiles per unit, units per sample
static const uint32_t NHI = 20480;                // round(0.8 * SQ)
static const uint32_t BINS = 4096;
static const uint64_t CODE_BYTES = (uint64_t)NHI * 32 + (uint64_t)(SQ - NHI) * 24; // per sample
#define TAU 2.0f
#define RHO 1e-6f
#define KSCALE 682.5f // 4095 / 6

struct ws_t {
    uint32_t *hist;          // [B][BINS]
    uint32_t *edone;         // [B] E units done
    uint32_t *ready;         // [B] threshold published: T | need << 12, bit 31 set
    unsigned long long *lb;  // [B][NU] look-back words: flag << 62 | eq << 31 | gt
    uint32_t *claim;         // work counter
    uint32_t *amax;
    uint16_t *key;           // [B][SQ]
    uint8_t *codes, *flags;  // frame parts
    uint32_t *meta;
};

// d_mlog, d_log2f, d_ent_key and d_exp are cuda/cu_tah.cu's (constants fixed at the default spec),
// copied so that the probe builds alone
__device__ __forceinline__ float d_mlog(float v)
{
    return __fsub_rn(__uint_as_float((__float_as_uint(v) >> 8) + (0x43c00000u - (127u << 15))), 384.0f);
}

__device__ __forceinline__ float d_log2f(float x)
{
    const uint32_t u = __float_as_uint(x);
    const float e = __fsub_rn(__uint_as_float(0x4b000000u | (u >> 23)), 8388735.0f);
    const float f = __fsub_rn(__uint_as_float((u & 0x007fffffu) | 0x3f800000u), 1.0f);
    float q = __fadd_rn(__fmul_rn(-0.0353865251f, f), 0.148412362f);
    q = __fadd_rn(__fmul_rn(q, f), -0.305121601f);
    q = __fadd_rn(__fmul_rn(q, f), 0.469920516f);
    q = __fadd_rn(__fmul_rn(q, f), -0.720519781f);
    q = __fadd_rn(__fmul_rn(q, f), 1.44268477f);
    return __fadd_rn(e, __fmul_rn(f, q));
}

__device__ __forceinline__ uint32_t d_ent_key(float S1, float SL)
{
    if (S1 == 0.0f)
        return 0u;
    const float D = __fadd_rn(S1, 1e-12f);
    const float h = __fsub_rn(__fmul_rn(d_log2f(D), __fdiv_rn(S1, D)), __fdiv_rn(SL, D));
    const float k = h > 0.0f ? __fmul_rn(h, KSCALE) : 0.0f;
    return k < (float)(BINS - 1u) ? (uint32_t)k : BINS - 1u;
}

__device__ __forceinline__ int32_t d_exp(uint32_t amax_bits)
{
    if (amax_bits == 0)
        return 0;
    int32_t ex = amax_bits >= 0x00800000u ? (int32_t)(amax_bits >> 23) - 126 : (31 - __clz((int)amax_bits)) - 148;
    int32_t e = ex + 3 - 14;
    return e < -126 ? -126 : e;
}

// the unit's 32 tiles: round r, quad q = lane >> 2 holds tile 8 r + q, lane u = lane & 3 its
// elements 16 u .. 16 u + 15 (float4 4 u + j)
template <int IL = 0> // IL: lane u holds float4s u + 4 j (each load a quad's 64 contiguous bytes)
__device__ __forceinline__ void d_load(const float *x, uint64_t tile0, uint32_t lane, float4 v[4][4])
{
    const float4 *p = (const float4 *)x + (tile0 + (lane >> 2)) * 16u + (IL ? 1u : 4u) * (lane & 3u);
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            v[r][j] = __ldg(p + r * 8 * 16 + (IL ? 4 : 1) * j);
}

__device__ __forceinline__ float d_el(const float4 &q, int c) { return c == 0 ? q.x : c == 1 ? q.y : c == 2 ? q.z : q.w; }

// E unit: keys of tiles tile0 .. +31 of sample s; the last unit of the sample finds T
__device__ __forceinline__ void d_fence() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// The end of an E unit of sample s (its histogram atomics issued): a fence, the sample's counter,
// and in the unit that finishes the sample last, T and need
template <int HR>
__device__ void d_e_signal(const ws_t &w, uint32_t s, uint32_t lane)
{
    d_fence();
    __syncwarp();
    uint32_t last = 0;
    if (lane == 0)
        last = atomicAdd(&w.edone[s], 1u) == NU - 1u;
    if (!__shfl_sync(FULL, last, 0))
        return;
    d_fence();
    // T: the largest key with at least NHI keys >= T; need: keys == T that are high. Two
    // round trips to L2: every lane's 128 bins (32 loads in flight), then the 128 bins of the
    // lane where the count crosses NHI, 4 a lane
    const uint4 *H = (const uint4 *)(w.hist + s * BINS);
    const uint32_t hstep = B * BINS / 4u; // uint4s between copies
    uint32_t tot = 0;
    for (int h = 0; h < HR; h++) {
        uint4 hv[32];
#pragma unroll
        for (int i = 0; i < 32; i++)
            hv[i] = __ldcg(H + h * hstep + 32u * lane + i);
#pragma unroll
        for (int i = 0; i < 32; i++)
            tot += hv[i].x + hv[i].y + hv[i].z + hv[i].w;
    }
    uint32_t incl = tot; // keys in the bins of this lane and the lanes above it
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t t = __shfl_down_sync(FULL, incl, o);
        if (lane + o < 32)
            incl += t;
    }
    const uint32_t cm = __ballot_sync(FULL, incl >= NHI); // lanes 0 .. L
    const uint32_t L = 31u - __clz((int)cm);
    const uint32_t base = __shfl_sync(FULL, incl - tot, L); // keys above lane L's bins
    uint4 q = __ldcg(H + 32u * L + lane); // bins 128 L + 4 lane .. + 3
    for (int h = 1; h < HR; h++) {
        const uint4 o = __ldcg(H + h * hstep + 32u * L + lane);
        q.x += o.x;
        q.y += o.y;
        q.z += o.z;
        q.w += o.w;
    }
    const uint32_t q4 = q.x + q.y + q.z + q.w;
    uint32_t in2 = q4;
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t t = __shfl_down_sync(FULL, in2, o);
        if (lane + o < 32)
            in2 += t;
    }
    const uint32_t a4 = base + in2 - q4; // keys above bin 128 L + 4 lane + 3
    uint32_t T = 0, need = 0, found = 0;
    const uint32_t qc[4] = { q.x, q.y, q.z, q.w };
    uint32_t acc = a4;
#pragma unroll
    for (int i = 3; i >= 0; i--) {
        if (!found && acc < NHI && acc + qc[i] >= NHI) {
            T = 128u * L + 4u * lane + (uint32_t)i;
            need = NHI - acc;
            found = 1;
        }
        acc += qc[i];
    }
    const uint32_t fm = __ballot_sync(FULL, found);
    const uint32_t src = fm ? __ffs(fm) - 1 : 0;
    T = __shfl_sync(FULL, T, src);
    need = __shfl_sync(FULL, need, src);
    if (lane == 0)
        atomicExch(&w.ready[s], 0x80000000u | T | (need << 12));
}

// MODE 0: all; 1: no histogram, no threshold; 2: the loads and a sum only. HR: copies of each
// sample's histogram (a warp adds to copy wg % HR; the threshold sums them)
template <int MODE, int HR>
__device__ __forceinline__ void d_e_compute(const float4 (&v)[4][4], const ws_t &w, uint32_t s, uint32_t u,
                                            uint32_t lane, uint32_t &amax)
{
    const uint64_t tile0 = (uint64_t)s * SQ + (uint64_t)u * UT;
    if (MODE == 2) {
        float t = 0.0f;
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                t += v[r][j].x + v[r][j].y + v[r][j].z + v[r][j].w;
        amax = max(amax, __float_as_uint(t));
        return;
    }
    float S1o = 0.0f, SLo = 0.0f;
#pragma unroll
    for (int r = 0; r < 4; r++) {
        float s1[4] = {}, sl[4] = {};
        uint32_t mb = 0;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float a = fabsf(d_el(v[r][j], c));
                s1[c] = __fadd_rn(s1[c], a);
                sl[c] = __fadd_rn(sl[c], __fmul_rn(a, d_mlog(a)));
                mb = max(mb, __float_as_uint(a));
            }
        float S1 = __fadd_rn(__fadd_rn(s1[0], s1[1]), __fadd_rn(s1[2], s1[3]));
        float SL = __fadd_rn(__fadd_rn(sl[0], sl[1]), __fadd_rn(sl[2], sl[3]));
        S1 = __fadd_rn(S1, __shfl_xor_sync(FULL, S1, 1));
        SL = __fadd_rn(SL, __shfl_xor_sync(FULL, SL, 1));
        S1 = __fadd_rn(S1, __shfl_xor_sync(FULL, S1, 2));
        SL = __fadd_rn(SL, __shfl_xor_sync(FULL, SL, 2));
        amax = max(amax, mb);
        // tile 8 r + q to lane 8 r + q
        const float a1 = __shfl_sync(FULL, S1, 4u * (lane & 7u)), a2 = __shfl_sync(FULL, SL, 4u * (lane & 7u));
        if ((lane >> 3) == (uint32_t)r) {
            S1o = a1;
            SLo = a2;
        }
    }
    const uint32_t k = d_ent_key(S1o, SLo);
    w.key[tile0 + lane] = (uint16_t)k;
    if (MODE == 1)
        return;
    const uint32_t wg = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    atomicAdd(&w.hist[((wg % HR) * B + s) * BINS + k], 1u);
}

template <int MODE = 0, int IL = 0, int HR = 1>
__device__ void d_unit_e(const float *x, const ws_t &w, uint32_t s, uint32_t u, uint32_t lane, uint32_t &amax,
                         bool pipe)
{
    float4 v[4][4];
    d_load<IL>(x, (uint64_t)s * SQ + (uint64_t)u * UT, lane, v);
    d_e_compute<MODE, HR>(v, w, s, u, lane, amax);
    if (pipe && MODE == 0)
        d_e_signal<HR>(w, s, lane);
}

__device__ __forceinline__ uint32_t d_wait_ready(const ws_t &w, uint32_t s, uint32_t lane)
{
    uint32_t r = 0;
    if (lane == 0) {
        while (((r = *(volatile uint32_t *)&w.ready[s]) & 0x80000000u) == 0)
            __nanosleep(100);
        d_fence();
    }
    return __shfl_sync(FULL, r, 0);
}

// quad-wide FWHT of 64 elements (16 per lane, contiguous), times 1/8
__device__ __forceinline__ void d_fwht(float z[16], uint32_t lane)
{
#pragma unroll
    for (int h = 1; h < 16; h <<= 1)
#pragma unroll
        for (int i = 0; i < 16; i++)
            if ((i & h) == 0) {
                const float a = z[i], b = z[i + h];
                z[i] = __fadd_rn(a, b);
                z[i + h] = __fsub_rn(a, b);
            }
#pragma unroll
    for (int m = 1; m <= 2; m <<= 1) {
        const bool up = (lane & (uint32_t)m) != 0;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const float o = __shfl_xor_sync(FULL, z[i], m);
            z[i] = up ? __fsub_rn(o, z[i]) : __fadd_rn(z[i], o);
        }
    }
#pragma unroll
    for (int i = 0; i < 16; i++)
        z[i] = __fmul_rn(z[i], 0.125f);
}

// the lane's 16 codes at bits (4 or 3), packed, stored at its place in the tile's code bytes
__device__ __forceinline__ void d_codes(const float z[16], float cm, float inv, bool hi, uint8_t *tc, uint32_t u)
{
    uint32_t c[16];
#pragma unroll
    for (int i = 0; i < 16; i++)
        c[i] = __float_as_uint(__fadd_rn(__fmul_rn(__fsub_rn(z[i], cm), inv), 8388608.0f)) & 15u;
    if (hi) {
        uint32_t w0 = 0, w1 = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            w0 |= c[i] << (4 * i);
            w1 |= c[i + 8] << (4 * i);
        }
        *(uint2 *)(tc + 8u * u) = make_uint2(w0, w1);
    } else {
        uint32_t w0 = 0, w1 = 0;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int b = 3 * i;
            if (b < 32)
                w0 |= (c[i] & 7u) << b;
            if (b + 3 > 32)
                w1 |= (c[i] & 7u) >> (32 - b);
        }
        uint16_t *o = (uint16_t *)(tc + 6u * u);
        o[0] = (uint16_t)w0;
        o[1] = (uint16_t)(w0 >> 16);
        o[2] = (uint16_t)w1;
    }
}

// tile metadata at one width: inputs at x's scale, e_t from the tile's max |x|
struct meta_t {
    float cm, inv;
    uint32_t word;
};
__device__ __forceinline__ meta_t d_meta(float mn, float mx, int32_t et, bool hi, bool raw)
{
    const float down = __uint_as_float((uint32_t)(127 - et) << 23);
    const uint16_t min16 = __half_as_ushort(__float2half_rd(__fmul_rn(mn, down)));
    const float minf = __half2float(__ushort_as_half(min16));
    const float span = __fsub_rn(__fmul_rn(mx, down), minf);
    const uint16_t st = __half_as_ushort(__float2half_ru(__fdiv_rn(span, hi ? 15.0f : 7.0f)));
    const float fs = __half2float(__ushort_as_half(st));
    float inv = fs > 0.0f ? __frcp_rn(fs) : 0.0f, cm = minf;
    if (raw) {
        cm = __fmul_rn(minf, __uint_as_float((uint32_t)(127 + et) << 23));
        inv = __fmul_rn(inv, down);
    }
    return { cm, inv, (uint32_t)min16 | ((uint32_t)st << 16) };
}

// Q unit: sample s's threshold is known (rd); codes, metadata and flags of tiles tile0 .. +31.
// QM bit 0: no rotated-tile pass; bit 1: no codes
template <int QM = 0>
__device__ void d_unit_q(const float *x, const ws_t &w, uint32_t s, uint32_t u, uint32_t rd, uint32_t lane)
{
    const uint64_t tile0 = (uint64_t)s * SQ + (uint64_t)u * UT;
    const uint32_t T = rd & 4095u, need = (rd >> 12) & 0x7ffffu;
    const uint32_t key = w.key[tile0 + lane];
    // look-back: (gt, eq) of the sample's units before this one
    const uint32_t gtm = __ballot_sync(FULL, key > T), eqm = __ballot_sync(FULL, key == T);
    unsigned long long *lb = w.lb + (size_t)s * NU;
    const unsigned long long agg = ((unsigned long long)__popc(eqm) << 31) | (unsigned long long)__popc(gtm);
    if (lane == 0)
        atomicExch(&lb[u], (u == 0 ? 2ull << 62 : 1ull << 62) | agg);
    unsigned long long pre = 0; // gt | eq << 31 before this unit
    if (u > 0) {
        int32_t j = (int32_t)u - 1 - (int32_t)lane;
        while (true) {
            unsigned long long v = 0;
            if (j >= 0)
                while (((v = *(volatile unsigned long long *)&lb[j]) >> 62) == 0)
                    ;
            const uint32_t pm = __ballot_sync(FULL, j < 0 || (v >> 62) == 2);
            const uint32_t stop = pm ? __ffs(pm) - 1 : 32u; // nearest inclusive prefix
            unsigned long long add = (lane <= stop && j >= 0) ? (v & ((1ull << 62) - 1)) : 0ull;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                add += __shfl_xor_sync(FULL, add, o);
            pre += add;
            if (pm)
                break;
            j -= 32;
        }
        if (lane == 0)
            atomicExch(&lb[u], (2ull << 62) | (pre + agg));
    }
    const uint32_t pgt = (uint32_t)pre & 0x7fffffffu, peq = (uint32_t)(pre >> 31);
    const uint32_t lt = (1u << lane) - 1u;
    const uint32_t eqb = peq + __popc(eqm & lt);
    const bool hi = key > T || (key == T && eqb < need);
    const uint32_t hp = pgt + __popc(gtm & lt) + min(eqb, need); // high tiles before this one
    const uint32_t idx = u * UT + lane;
    const uint32_t off = 32u * hp + 24u * (idx - hp);
    uint8_t *codes = w.codes + (size_t)s * CODE_BYTES;

    float4 v[4][4];
    d_load(x, tile0, lane, v);
    float mno = 0, mxo = 0;
    uint32_t b1o = 0, b2o = 0;
#pragma unroll
    for (int r = 0; r < 4; r++) {
        float mn = v[r][0].x, mx = mn;
        uint32_t b1 = 0, b2 = 0;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float e = d_el(v[r][j], c);
                const uint32_t bb = __float_as_uint(e) & 0x7fffffffu;
                b2 = max(b2, min(bb, b1));
                b1 = max(b1, bb);
                mn = fminf(mn, e);
                mx = fmaxf(mx, e);
            }
#pragma unroll
        for (int m = 1; m <= 2; m <<= 1) {
            mn = fminf(mn, __shfl_xor_sync(FULL, mn, m));
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, m));
            const uint32_t o1 = __shfl_xor_sync(FULL, b1, m), o2 = __shfl_xor_sync(FULL, b2, m);
            b2 = max(max(b2, o2), min(b1, o1));
            b1 = max(b1, o1);
        }
        const uint32_t src = 4u * (lane & 7u);
        const float a = __shfl_sync(FULL, mn, src), b = __shfl_sync(FULL, mx, src);
        const uint32_t c1 = __shfl_sync(FULL, b1, src), c2 = __shfl_sync(FULL, b2, src);
        if ((lane >> 3) == (uint32_t)r) {
            mno = a;
            mxo = b;
            b1o = c1;
            b2o = c2;
        }
    }
    // the tile of this lane
    const int32_t et = d_exp(b1o);
    const float down = __uint_as_float((uint32_t)(127 - et) << 23);
    const float m1 = __fmul_rn(__uint_as_float(b1o), down), m2 = __fmul_rn(__uint_as_float(b2o), down);
    const bool rot = m1 > __fmul_rn(TAU, __fadd_rn(m2, __fmul_rn(RHO, down)));
    meta_t md = d_meta(mno, mxo, et, hi, true);
    if (!rot) {
        w.meta[tile0 + lane] = md.word;
        w.flags[tile0 + lane] = (uint8_t)hi;
    }
    // codes of the unrotated tiles, round by round
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const uint32_t src = 8u * (uint32_t)r + (lane >> 2);
        const float cm = __shfl_sync(FULL, md.cm, src), inv = __shfl_sync(FULL, md.inv, src);
        const uint32_t o = __shfl_sync(FULL, off, src);
        const uint32_t fl = __shfl_sync(FULL, (uint32_t)hi | ((uint32_t)rot << 1), src);
        if (!(fl & 2u) && !(QM & 2)) {
            float z[16];
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    z[4 * j + c] = d_el(v[r][j], c);
            d_codes(z, cm, inv, fl & 1u, codes + o, lane & 3u);
        }
    }
    // rotated tiles, 8 at a time: quad q takes the q-th of them
    uint32_t rm = (QM & 1) ? 0u : __ballot_sync(FULL, rot);
    while (rm) {
        uint32_t mine = rm, t = 32;
        for (uint32_t q = 0; q <= (lane >> 2) && mine; q++) {
            t = __ffs(mine) - 1;
            mine &= mine - 1;
        }
        const bool act = ((lane >> 2) < (uint32_t)__popc(rm));
        const uint32_t tt = act ? t : 0u;
        for (int q = 0; q < 8 && rm; q++)
            rm &= rm - 1;
        const float dn = __shfl_sync(FULL, down, tt);
        const uint32_t pb1 = __shfl_sync(FULL, b1o, tt);
        const uint32_t o = __shfl_sync(FULL, off, tt);
        const uint32_t h = __shfl_sync(FULL, (uint32_t)hi, tt);
        const float4 *p = (const float4 *)x + (tile0 + tt) * 16u + 4u * (lane & 3u);
        float z[16];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float4 q = __ldg(p + j);
            z[4 * j] = q.x;
            z[4 * j + 1] = q.y;
            z[4 * j + 2] = q.z;
            z[4 * j + 3] = q.w;
        }
        // pivot: the first element of the largest |x|, swapped to position 0
        uint32_t pi = 64;
#pragma unroll
        for (int i = 15; i >= 0; i--)
            if ((__float_as_uint(z[i]) & 0x7fffffffu) == pb1)
                pi = 16u * (lane & 3u) + (uint32_t)i;
        pi = min(pi, __shfl_xor_sync(FULL, pi, 1));
        pi = min(pi, __shfl_xor_sync(FULL, pi, 2));
        const uint32_t qb = lane & ~3u;
        float zp = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++)
            if ((pi & 15u) == (uint32_t)i)
                zp = z[i];
        const float vp = __shfl_sync(FULL, zp, qb + (pi >> 4) % 4u), v0 = __shfl_sync(FULL, z[0], qb);
        if ((lane & 3u) == 0)
            z[0] = vp;
#pragma unroll
        for (int i = 0; i < 16; i++)
            if ((lane & 3u) == (pi >> 4) % 4u && (pi & 15u) == (uint32_t)i && pi != 0)
                z[i] = v0;
#pragma unroll
        for (int i = 0; i < 16; i++)
            z[i] = __fmul_rn(z[i], dn);
        d_fwht(z, lane);
        float mn = z[0], mx = z[0];
#pragma unroll
        for (int i = 1; i < 16; i++) {
            mn = fminf(mn, z[i]);
            mx = fmaxf(mx, z[i]);
        }
        mn = fminf(mn, __shfl_xor_sync(FULL, mn, 1));
        mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 1));
        mn = fminf(mn, __shfl_xor_sync(FULL, mn, 2));
        mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 2));
        const meta_t mr = d_meta(mn, mx, 0, h != 0, false);
        if (act) {
            if (!(QM & 2))
                d_codes(z, mr.cm, mr.inv, h != 0, codes + o, lane & 3u);
            if ((lane & 3u) == 0) {
                w.meta[tile0 + tt] = mr.word;
                w.flags[tile0 + tt] = (uint8_t)(h | 2u | (min(pi, 63u) << 2));
            }
        }
    }
}

// An E unit whose completion is signalled late: its loads are issued first, then the completion
// of the warp's previous E unit (pend, if any) is signalled (the fence then waits while these
// loads are in flight anyway), then its keys; pend becomes s
template <int HR>
__device__ __forceinline__ void d_unit_e_def(const float *x, const ws_t &w, uint32_t s, uint32_t u, uint32_t lane,
                                             uint32_t &amax, uint32_t &pend)
{
    float4 v[4][4];
    d_load<0>(x, (uint64_t)s * SQ + (uint64_t)u * UT, lane, v);
    if (pend != 0xffffffffu)
        d_e_signal<HR>(w, pend, lane);
    d_e_compute<0, HR>(v, w, s, u, lane, amax);
    pend = s;
}

// the warp's max |x| bits into the frame's
__device__ __forceinline__ void d_amax_out(const ws_t &w, uint32_t amax, uint32_t lane)
{
    amax = __reduce_max_sync(FULL, amax);
    if (lane == 0)
        atomicMax(w.amax, amax);
}

// E over all units as a kernel of its own (the last unit of each sample finds its threshold);
// DEF: completions signalled late (d_unit_e_def)
template <int MODE = 0, int IL = 0, int HR = 1, bool PIPE = true, bool DEF = false>
__global__ void __launch_bounds__(128) k_e(const float *x, ws_t w)
{
    const uint32_t lane = threadIdx.x & 31u, wg = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const uint32_t nw = gridDim.x * blockDim.x >> 5;
    uint32_t amax = 0, pend = 0xffffffffu;
    for (uint32_t i = wg; i < B * NU; i += nw) {
        if (DEF)
            d_unit_e_def<HR>(x, w, i / NU, i % NU, lane, amax, pend);
        else
            d_unit_e<MODE, IL, HR>(x, w, i / NU, i % NU, lane, amax, PIPE);
    }
    if (pend != 0xffffffffu)
        d_e_signal<HR>(w, pend, lane);
    d_amax_out(w, amax, lane);
}

template <int QM = 0>
__global__ void __launch_bounds__(128) k_q(const float *x, ws_t w)
{
    const uint32_t lane = threadIdx.x & 31u, wg = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const uint32_t nw = gridDim.x * blockDim.x >> 5;
    for (uint32_t i = wg; i < B * NU; i += nw) { // units in order per sample: the look-back needs
        const uint32_t s = i % B, u = i / B;        // a unit's predecessors claimed before it
        d_unit_q<QM>(x, w, s, u, w.ready[s], lane);
    }
}

// one persistent grid: items in the order E(0) E(1) Q(0) E(2) Q(1) ... (LEAD samples ahead)
template <int LEAD, int HR = 1, bool DEF = false> // DEF: E units signalled late (d_unit_e_def)
__global__ void __launch_bounds__(128, 4) k_pipe(const float *x, ws_t w)
{
    const uint32_t lane = threadIdx.x & 31u;
    const uint32_t total = 2u * B * NU;
    uint32_t amax = 0, pend = 0xffffffffu;
    while (true) {
        uint32_t i = 0;
        if (lane == 0)
            i = atomicAdd(w.claim, 1u);
        i = __shfl_sync(FULL, i, 0);
        if (i >= total)
            break;
        // phase p: E units of sample p (p < B), then Q units of sample p - LEAD (p >= LEAD)
        uint32_t p, k;
        const uint32_t e_only = LEAD * NU; // phases 0 .. LEAD - 1 have E units only
        if (i < e_only) {
            p = i / NU;
            k = i % NU;
        } else if (i < e_only + (B - LEAD) * 2u * NU) {
            const uint32_t r = i - e_only;
            p = LEAD + r / (2u * NU);
            k = r % (2u * NU);
        } else { // trailing phases: Q units only
            const uint32_t r = i - e_only - (B - LEAD) * 2u * NU;
            p = B + r / NU;
            k = NU + r % NU;
        }
        if (k < NU && DEF)
            d_unit_e_def<HR>(x, w, p, k, lane, amax, pend);
        else if (k < NU)
            d_unit_e<0, 0, HR>(x, w, p, k, lane, amax, true);
        else {
            if (pend != 0xffffffffu) {
                d_e_signal<HR>(w, pend, lane);
                pend = 0xffffffffu;
            }
            const uint32_t s = p - LEAD;
            const uint32_t rd = d_wait_ready(w, s, lane);
            d_unit_q(x, w, s, k - NU, rd, lane);
        }
    }
    if (pend != 0xffffffffu)
        d_e_signal<HR>(w, pend, lane);
    d_amax_out(w, amax, lane);
}

static float s_median(std::vector<float> t)
{
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const size_t n = (size_t)B * SQ * 64;
    std::vector<float> hx(n);
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i += 2) { // Gaussian (Box-Muller), rows of a few scales
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        const double u1 = ((st >> 11) + 1.0) / 9007199254740993.0;
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        const double u2 = (st >> 11) / 9007199254740992.0;
        const double r = sqrt(-2.0 * log(u1)), sc = 1.0 + (double)((i / 1600) % 7);
        hx[i] = (float)(sc * r * cos(6.283185307179586 * u2));
        hx[i + 1] = (float)(sc * r * sin(6.283185307179586 * u2));
    }
    float *dx, *dy;
    CK(cudaMalloc(&dx, n * 4));
    CK(cudaMalloc(&dy, n * 4));
    CK(cudaMemcpy(dx, hx.data(), n * 4, cudaMemcpyHostToDevice));
    ws_t w;
    void *zero_base;
    const size_t zbytes = (size_t)8 * B * BINS * 4 + B * 4 + B * 4 + (size_t)B * NU * 8 + 4 + 4;
    CK(cudaMalloc(&zero_base, zbytes));
    w.hist = (uint32_t *)zero_base;
    w.lb = (unsigned long long *)(w.hist + 8 * B * BINS);
    w.edone = (uint32_t *)(w.lb + (size_t)B * NU);
    w.ready = w.edone + B;
    w.claim = w.ready + B;
    w.amax = w.claim + 1;
    CK(cudaMalloc(&w.key, (size_t)B * SQ * 2));
    CK(cudaMalloc(&w.codes, (size_t)B * CODE_BYTES));
    CK(cudaMalloc(&w.flags, (size_t)B * SQ));
    CK(cudaMalloc(&w.meta, (size_t)B * SQ * 4));
    int nsm = 0, occ = 0;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto timed = [&](auto &&f) {
        std::vector<float> t;
        for (int i = -3; i < 25; i++) {
            CK(cudaEventRecord(e0));
            f();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (i >= 0)
                t.push_back(ms);
        }
        return s_median(t);
    };
    const float tcopy = timed([&] { CK(cudaMemcpyAsync(dy, dx, n * 4, cudaMemcpyDeviceToDevice)); });
    const double copy_bw = 2.0 * n * 4 / (tcopy * 1e-3);
    const double bytes = n * 4.0 + n * 4.425 / 8.0;
    printf("cu_tah_pipe_probe: %s, %d SMs, L2 %d MB; copy %.1f GB/s; encode bytes %.1f MB, 100%% = %.4f ms\n",
           prop.name, nsm, prop.l2CacheSize >> 20, copy_bw / 1e9, bytes / 1e6, bytes / copy_bw * 1e3);
    const float tz = timed([&] { CK(cudaMemsetAsync(zero_base, 0, zbytes)); });
    auto line = [&](const char *name, float ms) {
        printf("%-58s %8.4f ms %6.1f %%   without the memset %8.4f ms %6.1f %%\n", name, ms,
               100.0 * bytes / copy_bw / (ms * 1e-3), ms - tz, 100.0 * bytes / copy_bw / ((ms - tz) * 1e-3));
    };
    int occ_e = 0, occ_q = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_e, k_e<0, 0>, 128, 0));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_q, k_q<0>, 128, 0));
    printf("k_e %d, k_q %d CTAs of 4 warps per SM\n", occ_e, occ_q);
    std::vector<uint8_t> ref_codes((size_t)B * CODE_BYTES), got((size_t)B * CODE_BYTES);
    std::vector<uint32_t> ref_meta((size_t)B * SQ), gm((size_t)B * SQ);
    int fails = 0;
    auto check = [&](const char *name, bool ref) {
        std::vector<uint8_t> fl((size_t)B * SQ);
        CK(cudaMemcpy(fl.data(), w.flags, fl.size(), cudaMemcpyDeviceToHost));
        for (uint32_t s = 0; s < B; s++) {
            uint32_t nh = 0;
            for (uint32_t t = 0; t < SQ; t++)
                nh += fl[(size_t)s * SQ + t] & 1u;
            if (nh != NHI) {
                printf("FAIL %s: sample %u has %u high tiles, want %u\n", name, s, nh, NHI);
                fails++;
            }
        }
        CK(cudaMemcpy(got.data(), w.codes, got.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gm.data(), w.meta, gm.size() * 4, cudaMemcpyDeviceToHost));
        if (ref) {
            ref_codes = got;
            ref_meta = gm;
        } else if (got != ref_codes || gm != ref_meta) {
            printf("FAIL %s: codes or metadata differ from the separate kernels'\n", name);
            fails++;
        }
    };
    auto sep_e = [&] {
        CK(cudaMemsetAsync(zero_base, 0, zbytes));
        k_e<<<nsm * occ_e, 128>>>(dx, w);
    };
    auto sep_all = [&] {
        sep_e();
        k_q<0><<<nsm * occ_q, 128>>>(dx, w);
    };
    sep_all();
    CK(cudaDeviceSynchronize());
    check("separate", true);
    line("memset of the work words (in every line below)", tz);
    line("E kernel alone (keys, histogram, threshold)", timed(sep_e));
    auto evar = [&](const char *name, auto kern) {
        int o = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kern, 128, 0));
        line(name, timed([&] {
                 CK(cudaMemsetAsync(zero_base, 0, zbytes));
                 kern<<<nsm * o, 128>>>(dx, w);
             }));
    };
    evar("E kernel, fence.acq_rel instead of __threadfence", k_e<0, 0, 1>);
    evar("E kernel, histogram atomics, no fence, no threshold", k_e<0, 0, 1, false>);
    evar("E kernel, each unit signalled after the next one's loads", k_e<0, 0, 1, true, true>);
    evar("E kernel, 8 copies of the histogram", k_e<0, 0, 8>);
    evar("E kernel, 8 copies, interleaved loads", k_e<0, 1, 8>);
    evar("E kernel, keys only (no histogram)", k_e<1, 0>);
    evar("E kernel, loads and a sum only", k_e<2, 0>);
    evar("E kernel, interleaved loads", k_e<0, 1>);
    evar("E kernel, interleaved loads, keys only", k_e<1, 1>);
    evar("E kernel, interleaved loads, loads and a sum only", k_e<2, 1>);
    line("E kernel, then Q kernel", timed(sep_all));
    auto qvar = [&](const char *name, auto kern) {
        int o = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kern, 128, 0));
        line(name, timed([&] {
                 sep_e();
                 kern<<<nsm * o, 128>>>(dx, w);
             }));
    };
    qvar("E, then Q without the rotated-tile pass", k_q<1>);
    qvar("E, then Q without codes", k_q<2>);
    qvar("E, then Q without either", k_q<3>);
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_pipe<2>, 128, 0));
    printf("k_pipe: %d CTAs of 4 warps per SM\n", occ);
    auto pipe1 = [&] {
        CK(cudaMemsetAsync(zero_base, 0, zbytes));
        k_pipe<1><<<nsm * occ, 128>>>(dx, w);
    };
    auto pipe2 = [&] {
        CK(cudaMemsetAsync(zero_base, 0, zbytes));
        k_pipe<2><<<nsm * occ, 128>>>(dx, w);
    };
    auto pipe3 = [&] {
        CK(cudaMemsetAsync(zero_base, 0, zbytes));
        k_pipe<3><<<nsm * occ, 128>>>(dx, w);
    };
    pipe2();
    CK(cudaDeviceSynchronize());
    check("pipe LEAD=2", false);
    line("pipelined, LEAD 1", timed(pipe1));
    line("pipelined, LEAD 2", timed(pipe2));
    line("pipelined, LEAD 3", timed(pipe3));
    line("pipelined, LEAD 2, deferred E signals", timed([&] {
             CK(cudaMemsetAsync(zero_base, 0, zbytes));
             k_pipe<2, 1, true><<<nsm * occ, 128>>>(dx, w);
         }));
    line("pipelined, LEAD 3, deferred E signals", timed([&] {
             CK(cudaMemsetAsync(zero_base, 0, zbytes));
             k_pipe<3, 1, true><<<nsm * occ, 128>>>(dx, w);
         }));
    CK(cudaDeviceSynchronize());
    check("pipe LEAD=3, deferred", false);
    line("pipelined, LEAD 2, 8 histogram copies", timed([&] {
             CK(cudaMemsetAsync(zero_base, 0, zbytes));
             k_pipe<2, 8><<<nsm * occ, 128>>>(dx, w);
         }));
    line("pipelined, LEAD 3, 8 histogram copies", timed([&] {
             CK(cudaMemsetAsync(zero_base, 0, zbytes));
             k_pipe<3, 8><<<nsm * occ, 128>>>(dx, w);
         }));
    CK(cudaDeviceSynchronize());
    check("pipe LEAD=3", false);
    printf("%s\n", fails ? "FAIL" : "checks passed");
    return fails ? 1 : 0;
}
