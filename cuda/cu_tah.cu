// cu_tah.cu — TAH-Quant on the GPU, codecs/tah.c's payload to the byte.
//
// Frames of version 4: fp16 metadata relative to an exponent per 32 allocation tiles of a
// sample (codecs/tah.c; gmax in the scratch holds each group's max |x| bits).
//
// Encode, any spec and shape (and TAH_CU_FUSE=0 or TAH_CU_SPEC=0): memset + four launches:
//   1. k_tah_entropy: entropy key of every allocation tile, each group's absmax (atomicMax).
//      4 lanes per allocation tile, 8 tiles per warp; lane u holds tah.c's
//      16-lane accumulators 4u..4u+3 (one 16-byte load per 16 elements):
//
//        tile elements: | 0 1 2 3 | 4 5 6 7 | 8 .. 11 | 12 .. 15 | 16 ...
//        lane u:        |    0    |    1    |    2    |    3     |  0 ...
//
//      the 16 accumulators are summed in tah.c's order (lane 0 first) by
//      every lane from 16 shuffles, so the float sums, the log2s and the
//      entropy key are bit-identical to the CPU's.
//   2. k_tah_select: one CTA per sample: radix select on the 12-bit entropy
//      keys (2 rounds of a 256-bin shared-memory histogram, MSB first), exactly
//      n_hi high tiles with ties to the lower index (a block scan over the
//      keys equal to the threshold), then a block scan of the high quant
//      tile counts: each allocation tile's offset into the sample's code
//      region. Also zeroes the unused end of that region and writes the sample's exponents.
//      (k_tah_select_sm, round 4: round 2 histograms only the keys that
//      share round 1's prefix, compacted in shared memory.)
//   3. k_tah_quant: one segment of G/8 lanes per quant tile (G <= 256),
//      8 elements per lane in registers; top-2 magnitudes with the pivot,
//      min/max, the rotation test, pivot swap + Hadamard (registers and
//      __shfl_xor_sync), fp16 metadata rounded down/up, b-bit codes packed
//      into b bytes per lane. Tiles go in reverse order so the second read
//      of x starts with what pass 1 left in L2. Round 4: S_QUANT_U = 2
//      tiles per segment per iteration, both tiles' x and prefix loads
//      issued first (the prefix load no longer waits for the rotation).
//   4. k_tah_flags: the (2+lg)-bit flag fields, gathered into bytes (not
//      launched for tile 64: k_tah_quant writes flag byte t itself).
// Decode: k_tah_dcount (per chunk of a sample's quant tiles: high counts,
// flags checked) then k_tah_dchunk (per chunk: offsets from the counts and
// a block scan, segment per tile as in 3, 4 tiles per segment in flight).
//
// Round 17, the default spec (tile = alloc_tile = 64, 4/3 bits, window 0 or 32) on C % 64 == 0
// with aligned buffers and samples of fewer than 2^16 tiles: k_tah_spec + k_tah_emit (see the
// comment above them): every tile quantised from one read of x, a lane a tile on rows staged in
// shared memory, the selection afterwards. (Rounds 6-36 had a one-launch form of 1-3 in between,
// k_tah_fused, for window 0: removed with frame version 4.)
//
// Round 8, the default spec on C % 64 == 0 with aligned buffers: k_tah_dw64 decodes with lane
// pairs (round 19: from the frame's index, CTAs of 256 tiles; see the comment above it).
// TAH_CU_TPT=0 selects the segment kernels above for a same-binary comparison.
//
// Which zero is a tile's minimum (+0 or -0 changes the fp16 min's sign bit)
// follows tah.c's reduction order; see d_zkey.
#include <float.h>

#include "cu_common.cuh"

#define S_SEL_THREADS 1024u
#define S_ENT_EPS 1e-12f
#define S_MAX_TILE 256u
#define S_QUANT_U 2 // tiles per segment per k_tah_quant iteration (round 4)
#define S_FUSE_MAXGRID 1024u // CTAs of k_tah_spec's grid, and samples, at most
// k_tah_select(_sm)'s radix rounds of 8 bits over the 12-bit keys (CODEC_TAH_KEY_BINS): bits
// 8..15, then 0..7; the first round's shift
#define S_SEL_SHIFT0 8
static_assert(CODEC_TAH_KEY_BINS <= 1u << (S_SEL_SHIFT0 + 8), "the radix rounds cover every key");

struct s_tg {
    uint32_t C, G, lg, k, Q, nA, r, A, bh, bl, fbits;
    uint32_t win; // tah.c's window: 0, the sample's high tiles by one threshold; else per window
    uint64_t S, B, T, n_alloc, n_hi, flags_bytes, meta_bytes, code_bytes;
    uint64_t ix_n, flags_off, meta_off, codes_off; // ix_n: index entries per sample (CODEC_TAH_IX_TILES)
    uint64_t n_eg, eg_off, eg_bytes; // exponent groups per sample (CODEC_TAH_EXP_TILES), their bytes' offset and span
    float tau, rho, norm, kscale; // kscale: codec_tah_key_scale
    uint64_t mQ, mS; // ceil(2^64 / Q), ceil(2^64 / S) for d_div32 (0 when Q, S are 1 or above 32 bits)
    uint64_t mW;     // ceil(2^64 / (2 n_alloc)): k_tah_spec's window shares (d_win_hi_before)
    bool vec;
};

static uint64_t s_magic(uint64_t d) { return d >= 2 && d <= 0xffffffffull ? UINT64_MAX / d + 1 : 0; }

// Scratch past the head: key u32[B*n_alloc] | pre u32[B*n_alloc] | hi u8[B*n_alloc] (8-aligned) | flagv u16[T]
// (8-aligned) | cnt u64[B*cps] (decode: per-chunk high counts, see k_tah_dcount) | gmax u32[B*n_eg] (16-aligned
// span: each exponent group's max |x| bits) | k_tah_spec's s_fz: cnt u64[S_FUSE_MAXGRID] |
// ztag u64[S_FUSE_MAXGRID] | (16-aligned) sdone u32[S_FUSE_MAXGRID] | hist u32[B*CODEC_TAH_KEY_BINS]
struct s_tw {
    uint32_t *key; // entropy keys (k_tah_entropy)
    uint32_t *pre;
    uint8_t *hi;
    uint16_t *flagv;
    unsigned long long *cnt;
    uint32_t *gmax; // per exponent group of each sample: its max |x| bits (k_tah_entropy's atomicMax)
};

// k_tah_spec's and k_tah_emit's scratch (past gmax). A word that carries the call's tag (cu_hp) needs no
// clearing between calls; the counters and histograms are zeroed by the call itself.
#define S_FZ_CTR S_FUSE_MAXGRID // sdone: hist stays 16-byte aligned
struct s_fz {
    unsigned long long *cnt;  // [S_FUSE_MAXGRID] per CTA: the tag's low 36 bits << 28 | keys == T << 14 | keys > T
    unsigned long long *ztag; // [S_FUSE_MAXGRID] per sample: the call's tag once its histogram is zeroed
    uint32_t *sdone;          // [S_FUSE_MAXGRID] per sample: the units it has handed out past the fixed rounds
    uint32_t *hist;           // [B][CODEC_TAH_KEY_BINS] per sample: its keys' histogram (k_tah_spec's: two bins a word)
};

// Decode chunks: one CTA of S_DEC_WARPS warps decodes S_DEC_U passes of
// 32/tpg tiles per warp, a run of consecutive quant tiles of one sample.
#define S_DEC_WARPS 8u
#define S_DEC_U 4u
#define S_DEC_MAXCH (S_DEC_WARPS * S_DEC_U * 32u) // tile 8: one lane per tile
static uint32_t s_dec_chunk(const s_tg &g) { return S_DEC_WARPS * S_DEC_U * (g.G >= 256u ? 1u : 32u / (g.G / 8u)); }
static uint64_t s_dec_cps(const s_tg &g) // chunks per sample
{
    const uint64_t ch = s_dec_chunk(g);
    return (g.S * g.Q + ch - 1) / ch;
}

static uint32_t s_log2u(uint32_t v)
{
    uint32_t l = 0;
    while ((1u << l) < v)
        l++;
    return l;
}

static s_tg s_geometry(const codec_spec_t *spec, codec_shape_t shape, const void *xy)
{
    const codec_tah_params_t *p = &spec->p.tah;
    s_tg g;
    g.C = shape.c;
    g.G = p->tile;
    g.lg = s_log2u(p->tile);
    g.A = p->alloc_tile;
    g.k = p->alloc_tile / p->tile;
    g.Q = (shape.c + g.G - 1) / g.G;
    g.nA = (g.Q + g.k - 1) / g.k;
    g.r = g.Q - (g.nA - 1) * g.k;
    g.bh = p->bits_hi;
    g.bl = p->bits_lo;
    g.fbits = 2 + g.lg;
    g.win = p->window;
    g.S = shape.s;
    g.B = shape.b;
    g.T = g.B * g.S * g.Q;
    g.n_alloc = g.S * g.nA;
    double want = floor((double)p->hi_frac * (double)g.n_alloc + 0.5);
    g.n_hi = want < 0 ? 0 : (want > (double)g.n_alloc ? g.n_alloc : (uint64_t)want);
    uint64_t full = (g.r == g.k) ? g.n_alloc : g.S * (g.nA - 1);
    uint64_t hi_q_max = (g.n_hi <= full) ? g.n_hi * g.k : full * g.k + (g.n_hi - full) * g.r;
    uint64_t sq = g.S * g.Q;
    g.flags_bytes = (g.T * g.fbits + 7) / 8;
    g.meta_bytes = 4 * g.T;
    g.code_bytes = hi_q_max * g.G * g.bh / 8 + (sq - hi_q_max) * g.G * g.bl / 8;
    g.ix_n = (sq + CODEC_TAH_IX_TILES - 1) / CODEC_TAH_IX_TILES;
    g.n_eg = (g.n_alloc + CODEC_TAH_EXP_TILES - 1) / CODEC_TAH_EXP_TILES;
    g.eg_off = 8 + 4 * g.B * g.ix_n;
    g.eg_bytes = (g.B * g.n_eg + 7) & ~7ull;
    g.flags_off = g.eg_off + g.eg_bytes;
    g.meta_off = g.flags_off + g.flags_bytes;
    g.codes_off = g.meta_off + g.meta_bytes;
    g.tau = p->tau;
    g.rho = p->rho;
    g.norm = (float)(1.0 / sqrt((double)g.G));
    g.kscale = codec_tah_key_scale(g.A);
    g.vec = ((uintptr_t)xy & 15u) == 0 && g.C % 4 == 0;
    g.mQ = s_magic(g.Q);
    g.mS = s_magic(g.S);
    g.mW = s_magic(2 * g.n_alloc);
    return g;
}

static s_tw s_carve(void *work, const s_tg &g)
{
    s_tw t;
    uint8_t *w = (uint8_t *)work;
    const uint64_t na = g.B * g.n_alloc;
    t.key = (uint32_t *)w;
    t.pre = (uint32_t *)(w + 4 * na);
    t.hi = w + 8 * na;
    t.flagv = (uint16_t *)(w + 8 * na + ((na + 7) & ~7ull));
    t.cnt = (unsigned long long *)(w + 8 * na + ((na + 7) & ~7ull) + ((2 * g.T + 7) & ~7ull));
    t.gmax = (uint32_t *)(t.cnt + g.B * s_dec_cps(g));
    return t;
}

// Round 17's encode (k_tah_spec, k_tah_emit): records of S_REC_W words per tile, in blocks of
// S_SP_UNIT tiles (a sample's units, the last one padded) stored as 4 planes of 16-byte words
// (plane m: word m of the block's tiles, consecutive), so that both kernels' warps access
// them in 512-byte runs; keys per sample rounded up to 8 (k_tah_emit's 16-byte loads); the
// shapes it takes (samples of fewer than 2^16 tiles: k_tah_emit counts in 16-bit halves).
#define S_REC_W 16u
#define S_SP_UNIT 32u
#define S_REC_BLOCK (S_SP_UNIT * S_REC_W / 4u) // 16-byte words per block of records
#define S_EM_TILES 512u // k_tah_emit: tiles per CTA (two per thread)
static uint64_t s_spec_nk(const s_tg &g) { return (g.n_alloc + 7u) & ~7ull; }
static uint64_t s_spec_nu(const s_tg &g) { return (g.n_alloc + S_SP_UNIT - 1u) / S_SP_UNIT; }
static bool s_spec_shape(const s_tg &g)
{
    return g.G == 64 && g.k == 1 && g.C % 64u == 0 && g.bh == 4 && g.bl == 3 && g.n_alloc < 65536u;
}

size_t cu_tah_scratch(const codec_spec_t *spec, codec_shape_t shape)
{
    const s_tg g = s_geometry(spec, shape, NULL);
    const uint64_t na = g.B * g.n_alloc;
    return (size_t)(8 * na + ((na + 7) & ~7ull) + ((2 * g.T + 7) & ~7ull) + 8 * g.B * s_dec_cps(g) +
                    4 * ((g.B * g.n_eg + 3) & ~3ull) + 16ull * S_FUSE_MAXGRID + 15 + 4ull * S_FZ_CTR + 4ull * CODEC_TAH_KEY_BINS * g.B +
                    (s_spec_shape(g) ? 127 + 16ull * S_REC_BLOCK * g.B * s_spec_nu(g) + 2 * g.B * s_spec_nk(g) : 0));
}

// ---- shared pieces ----

// tah.c's s_log2f (the log2 of a tile's L1 sum), operation for operation (exponent as a
// float by the 2^23 trick: 2^23 + k - (2^23 + 127) = k - 127 exactly, without an I2F)
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

// tah.c's s_mlog384: 384 + Mitchell's log2 of v >= 0, one shift-and-add (d_ent_key takes the
// 384 S1 off the tile's sum)
__device__ __forceinline__ float d_mlog(float v)
{
    return __uint_as_float((__float_as_uint(v) >> 8) + (0x43c00000u - (127u << 15)));
}

// ldexpf(x, e): for -126 <= e <= 127 one product with the normal float 2^e, which
// rounds once exactly where ldexpf does (a subnormal or overflowing result); other e
// (frames beyond 2^127 or below 2^-126) through ldexpf itself.
__device__ __forceinline__ float d_ldexpf(float x, int32_t e)
{
    return (e >= -126 && e <= 127) ? __fmul_rn(x, __uint_as_float((uint32_t)(127 + e) << 23)) : ldexpf(x, e);
}

// tah.c's e: absmax * 2^-e <= 2^(14) before rotation growth; 0 for a zero frame
__device__ __forceinline__ int32_t d_tah_exp(uint32_t amax_bits, uint32_t lg)
{
    if (amax_bits == 0)
        return 0;
    int32_t ex = amax_bits >= 0x00800000u ? (int32_t)(amax_bits >> 23) - 126 : (31 - __clz((int)amax_bits)) - 148;
    int32_t e = ex + (int32_t)((lg + 1) / 2) - 14;
    return e < -126 ? -126 : e;
}

// The exponent group (tah.c's CODEC_TAH_EXP_TILES) of sample b's quant tile (s, q): that of its
// allocation tile s nA + q / k; an index into gmax and the frame's exponent bytes.
__device__ __forceinline__ uint64_t d_group(const s_tg &g, uint64_t b, uint64_t s, uint32_t q)
{
    return b * g.n_eg + (s * g.nA + (g.k > 1u ? q / g.k : q)) / CODEC_TAH_EXP_TILES;
}

// The payload's two reserved words and the exponent bytes' padding, by threads 0..7 of one CTA.
__device__ __forceinline__ void d_put_head(uint8_t *p, const s_tg &g, uint32_t tid)
{
    if (tid < 2u)
        d_put_u32(p + 4 * tid, 0);
    if (tid < 8u && g.B * g.n_eg + tid < g.eg_bytes)
        p[g.eg_off + g.B * g.n_eg + tid] = 0;
}

// Sample b's exponent bytes from gmax (threads tid of nt); sample 0's call also d_put_head.
__device__ void d_put_exps(uint8_t *p, const s_tg &g, const uint32_t *gmax, uint64_t b, uint32_t tid, uint32_t nt)
{
    for (uint64_t i = b * g.n_eg + tid; i < (b + 1) * g.n_eg; i += nt)
        p[g.eg_off + i] = (uint8_t)(int8_t)d_tah_exp(__ldcg(&gmax[i]), g.lg);
    if (b == 0)
        d_put_head(p, g, tid);
}

__device__ __forceinline__ uint32_t d_get_bits(const uint8_t *stream, uint64_t bitpos, uint32_t nbits)
{
    const uint8_t *p = stream + bitpos / 8;
    uint32_t sh = (uint32_t)(bitpos % 8);
    uint32_t nbytes = (sh + nbits + 7) / 8;
    uint32_t w = 0;
    for (uint32_t i = 0; i < nbytes; i++)
        w |= (uint32_t)p[i] << (8 * i);
    return (w >> sh) & ((1u << nbits) - 1u);
}

// Exclusive scan over a CTA of S_SEL_THREADS threads; *total gets the sum.
__device__ uint32_t d_block_scan(uint32_t v, uint32_t *ws, uint32_t *total)
{
    const uint32_t lane = threadIdx.x & 31u, wid = threadIdx.x / 32u, nw = blockDim.x / 32u;
    uint32_t x = v;
    for (int o = 1; o < 32; o *= 2) {
        uint32_t y = __shfl_up_sync(CU_FULL, x, o);
        if (lane >= (uint32_t)o)
            x += y;
    }
    if (lane == 31)
        ws[wid] = x;
    __syncthreads();
    if (wid == 0) {
        uint32_t t = lane < nw ? ws[lane] : 0u;
        for (int o = 1; o < 32; o *= 2) {
            uint32_t y = __shfl_up_sync(CU_FULL, t, o);
            if (lane >= (uint32_t)o)
                t += y;
        }
        ws[lane] = t;
    }
    __syncthreads();
    const uint32_t excl = x - v + (wid > 0 ? ws[wid - 1] : 0u);
    *total = ws[nw - 1];
    __syncthreads();
    return excl;
}

// Which zero tah.c picks as a tile's minimum when the minimum is 0: its
// 8-lane reductions keep the first value strictly below, lanes i % 8,
// combined in lane order, so the zero with the smallest (i % 8, i / 8)
// wins (also when the CPU seeds every lane with element 0: its key is 0).
// A partial unrotated tile is scanned in index order: key i. Low bit: sign.
__device__ __forceinline__ uint32_t d_zkey(uint32_t i, uint32_t G, bool ordered, float v)
{
    uint32_t key = ordered ? i : (i % 8u) * G + i / 8u;
    return key * 2u + (__float_as_uint(v) >> 31);
}

// min/max of the segment's tile over element indices < lim, the zero rule above.
// Round 6: the zero keys are formed and reduced only when some segment of the warp
// has a zero minimum (warp-uniform branch; rare on real activations), which gives
// the same result: the key only decides the sign of a zero minimum.
__device__ __forceinline__ void d_tile_minmax(const float v[8], uint32_t tl, uint32_t tpg, uint32_t G, uint32_t lim,
                                              bool ordered, float &mn, float &mx)
{
    float a = __uint_as_float(0x7f800000u), b = -a;
#pragma unroll
    for (int r = 0; r < 8; r++) {
        const uint32_t i = 8u * tl + (uint32_t)r;
        if (i < lim) {
            a = fminf(a, v[r]);
            b = fmaxf(b, v[r]);
        }
    }
    a = d_seg_minf(a, tpg);
    b = d_seg_maxf(b, tpg);
    if (__any_sync(CU_FULL, a == 0.0f)) {
        uint32_t z = 0xffffffffu;
#pragma unroll
        for (int r = 0; r < 8; r++) {
            const uint32_t i = 8u * tl + (uint32_t)r;
            if (i < lim && v[r] == 0.0f)
                z = min(z, d_zkey(i, G, ordered, v[r]));
        }
        z = d_seg_minu(z, tpg);
        if (a == 0.0f)
            a = (z & 1u) ? -0.0f : 0.0f;
    }
    mn = a;
    mx = b;
}

// ---- encode ----

#define S_ENT_STEPS 4 // 16-element steps of a lane quad loaded per batch in k_tah_entropy

__device__ __forceinline__ void d_ent_load4(const float *src, bool vec, float f[4])
{
    if (vec) {
        const float4 q = *(const float4 *)src;
        f[0] = q.x; f[1] = q.y; f[2] = q.z; f[3] = q.w;
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++)
            f[i] = src[i];
    }
}

// tah.c's entropy key from S1 = sum |a| and SL = sum |a| mlog |a|: h = log2(D) S1/D - SL/D,
// D = S1 + eps, key floor(h * kscale) for h > 0 (0 for an all-zero tile or a NaN h), at most
// CODEC_TAH_KEY_BINS - 1
__device__ __forceinline__ uint32_t d_ent_key(float S1, float SL, float kscale)
{
    if (S1 == 0.0f)
        return 0u;
    SL = __fmaf_rn(-384.0f, S1, SL); // SL summed d_mlog's 384 + log2 |a|
    const float D = __fadd_rn(S1, S_ENT_EPS);
    const float h = __fsub_rn(__fmul_rn(d_log2f(D), __fdiv_rn(S1, D)), __fdiv_rn(SL, D));
    const float k = h > 0.0f ? __fmul_rn(h, kscale) : 0.0f;
    return k < (float)(CODEC_TAH_KEY_BINS - 1u) ? (uint32_t)k : CODEC_TAH_KEY_BINS - 1u;
}

// one 16-element step of tah.c's 16 accumulators (lane u holds 4u..4u+3).
// mb: max of |f|'s bits (round 5; was fmaxf plus a non-finite test per element): for
// finite floats the same maximum, and >= 0x7f800000 exactly when some f is Inf or NaN.
// (N accumulators: the lane pairs of round 8 hold 8.)
template <int N>
__device__ __forceinline__ void d_ent_step(const float f[N], float s1[N], float sl[N], uint32_t &mb)
{
#pragma unroll
    for (int i = 0; i < N; i++) {
        const float v = fabsf(f[i]);
        s1[i] = __fadd_rn(s1[i], v);
        sl[i] = __fmaf_rn(v, d_mlog(v), sl[i]);
        mb = max(mb, __float_as_uint(v));
    }
}

// Entropy key of allocation tile `tile` (global index, B*n_alloc of them) by the lane quad
// lane & ~3 .. +3 of the calling warp (every lane of the warp calls: shuffles); folds
// the max of |x|'s bits into amax. All 4 lanes of the quad return the key.
__device__ __forceinline__ uint32_t d_tah_ent_tile(const float *__restrict__ x, const s_tg &g, uint64_t tile, bool valid,
                                                uint32_t lane, uint32_t &amax)
{
    const uint32_t u = lane & 3u;
    const uint64_t token = valid ? tile / g.nA : 0;
    const uint32_t j = valid ? (uint32_t)(tile - token * g.nA) : 0u;
    const uint32_t c0 = j * g.A;
    const uint32_t w = valid ? (g.C - c0 < g.A ? g.C - c0 : g.A) : 0u;
    const float *row = x + token * g.C + c0;
    const uint32_t nfull = w / 16u;
    float s1[4] = { 0.0f, 0.0f, 0.0f, 0.0f }, sl[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    // S_ENT_STEPS steps per batch, all loads first (round 4: 64 bytes per lane in flight,
    // was 32), then the steps in order: the same accumulation order per lane
    uint32_t st = 0;
    for (; st + S_ENT_STEPS <= nfull; st += S_ENT_STEPS) {
        float f[S_ENT_STEPS][4];
#pragma unroll
        for (int k = 0; k < S_ENT_STEPS; k++)
            d_ent_load4(row + 16u * (st + (uint32_t)k) + 4u * u, g.vec, f[k]);
#pragma unroll
        for (int k = 0; k < S_ENT_STEPS; k++)
            d_ent_step<4>(f[k], s1, sl, amax);
    }
    for (; st < nfull; st++) {
        float f[4];
        d_ent_load4(row + 16u * st + 4u * u, g.vec, f);
        d_ent_step<4>(f, s1, sl, amax);
    }
    // tah.c: S1 = 0 + s1[0] + s1[1] + ... + s1[15], lane 4u'+i held by lane u', register i
    float S1 = 0.0f, SL = 0.0f;
    const int seg0 = (int)(lane & ~3u);
#pragma unroll
    for (int up = 0; up < 4; up++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            S1 = __fadd_rn(S1, __shfl_sync(CU_FULL, s1[i], seg0 + up));
            SL = __fadd_rn(SL, __shfl_sync(CU_FULL, sl[i], seg0 + up));
        }
    }
    for (uint32_t i = 16u * nfull; i < w; i++) { // tail, in order, by every lane of the tile
        const float v = fabsf(row[i]);
        S1 = __fadd_rn(S1, v);
        SL = __fmaf_rn(v, d_mlog(v), SL);
        amax = max(amax, __float_as_uint(v));
    }
    return d_ent_key(S1, SL, g.kscale);
}

__global__ void __launch_bounds__(256) k_tah_entropy(const float *__restrict__ x, uint32_t *__restrict__ key,
                                                     uint32_t *__restrict__ gmax, cu_hp head, s_tg g)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u, u = lane & 3u, sub = lane >> 2;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32u;
    const uint64_t ntiles = g.B * g.n_alloc;
    bool bad = false;
    for (uint64_t base = warp * 8u; base < ntiles; base += nwarps * 8u) {
        const uint64_t tile = base + sub;
        const bool valid = tile < ntiles;
        uint32_t amax = 0; // max |x| bits of the tile (>= 0x7f800000: non-finite x)
        const uint32_t k = d_tah_ent_tile(x, g, tile, valid, lane, amax);
        amax = max(amax, __shfl_xor_sync(CU_FULL, amax, 1));
        amax = max(amax, __shfl_xor_sync(CU_FULL, amax, 2));
        bad |= amax >= 0x7f800000u; // the payload is unspecified then; the group's absmax is left alone
        if (valid && u == 0) {
            key[tile] = k;
            const uint64_t b = tile / g.n_alloc;
            if (amax != 0 && amax < 0x7f800000u)
                atomicMax(&gmax[b * g.n_eg + (tile - b * g.n_alloc) / CODEC_TAH_EXP_TILES], amax);
        }
    }
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

__global__ void __launch_bounds__(S_SEL_THREADS) k_tah_select(const uint32_t *__restrict__ key, uint32_t *pre,
                                                              const uint32_t *__restrict__ gmax, uint8_t *p,
                                                              cu_hp head, s_tg g)
{
    d_mark(head);
    __shared__ uint32_t hist[256];
    __shared__ uint32_t ws[32];
    __shared__ uint32_t sh_prefix, sh_need;
    const uint64_t b = blockIdx.x, na = g.n_alloc;
    const uint32_t *keys = key + b * na;
    const bool all = g.n_hi == 0 || g.n_hi == na, win = g.win != 0; // win: tah.c's s_select_windows
    if (threadIdx.x == 0) {
        sh_prefix = 0;
        sh_need = (uint32_t)g.n_hi;
    }
    __syncthreads();
    if (!all && !win) {
        uint32_t mask = 0;
        for (int shift = S_SEL_SHIFT0; shift >= 0; shift -= 8) {
            for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x)
                hist[i] = 0;
            __syncthreads();
            const uint32_t prefix = sh_prefix;
            // entropies share their top bits: one atomic per distinct bin per warp
            for (uint64_t i0 = 0; i0 < na; i0 += blockDim.x) {
                const uint64_t i = i0 + threadIdx.x;
                const uint32_t key = i < na ? keys[i] : 0u;
                const uint32_t bin = (i < na && (key & mask) == prefix) ? (key >> shift) & 0xffu : 0x100u;
                const uint32_t peers = __match_any_sync(CU_FULL, bin);
                if (bin != 0x100u && (threadIdx.x & 31u) == (uint32_t)(__ffs((int)peers) - 1))
                    atomicAdd(&hist[bin], (uint32_t)__popc((int)peers));
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                uint32_t need = sh_need, d = 256;
                while (d-- > 0) {
                    if (hist[d] >= need)
                        break;
                    need -= hist[d];
                }
                sh_prefix = prefix | (d << shift);
                sh_need = need;
            }
            mask |= 0xffu << shift;
            __syncthreads();
        }
    }
    const uint32_t T = sh_prefix, need = sh_need;
    uint32_t run_eq = 0, run_hq = 0;
    for (uint64_t c0 = 0; c0 < na; c0 += blockDim.x) {
        const uint64_t i = c0 + threadIdx.x;
        const bool in = i < na;
        const uint32_t key = in ? keys[i] : 0u;
        const uint32_t eq = (uint32_t)(in && !all && key == T);
        uint32_t eq_total, hq_total;
        const uint32_t eq_before = d_block_scan(eq, ws, &eq_total);
        bool hi;
        if (all) {
            hi = in && g.n_hi != 0;
        } else if (win) { // the tile's rank in its window against the window's share of n_hi
            const uint64_t w0 = in ? i / g.win * g.win : 0, w1 = min(w0 + g.win, na);
            auto before = [&](uint64_t t) { return (2 * t * g.n_hi + na) / (2 * na); }; // tah.c's s_win_hi_before
            const uint64_t share = before(w1) - before(w0);
            uint64_t rank = 0;
            for (uint64_t j = w0; in && j < w1; j++) {
                const uint32_t kj = keys[j];
                rank += kj > key || (kj == key && j < i);
            }
            hi = in && rank < share;
        } else {
            hi = in && (key > T || (eq && run_eq + eq_before < need));
        }
        const uint32_t jj = in ? (uint32_t)(i % g.nA) : 0u;
        const uint32_t wq = hi ? (jj == g.nA - 1 ? g.r : g.k) : 0u;
        const uint32_t hq_before = d_block_scan(wq, ws, &hq_total);
        if (in)
            pre[b * na + i] = (run_hq + hq_before) | ((uint32_t)hi << 31);
        run_eq += eq_total;
        run_hq += hq_total;
    }
    // zero the sample's code region past its last tile
    const uint64_t used = (uint64_t)(g.G / 8u) * ((uint64_t)g.bl * g.S * g.Q + (uint64_t)(g.bh - g.bl) * run_hq);
    uint8_t *region = p + g.codes_off + b * g.code_bytes;
    for (uint64_t y = used + threadIdx.x; y < g.code_bytes; y += blockDim.x)
        region[y] = 0;
    d_put_exps(p, g, gmax, b, threadIdx.x, blockDim.x);
}

// Whether a key of the select is high: above the threshold T, or equal to it while fewer than
// `need` equal keys came before it (e counts them, in index order); when every tile has one
// width (all), whether that width is the high one.
__device__ __forceinline__ bool d_sel_hi(uint32_t key, uint32_t T, uint32_t need, bool all, bool all_hi, uint32_t &e)
{
    if (all)
        return all_hi;
    const bool isq = key == T;
    const bool hi = key > T || (isq && e < need);
    e += (uint32_t)isq;
    return hi;
}

// Warp 0 picks the radix digit of the select from hist[256]: the largest d
// with sum(hist[d..255]) >= need (k_tah_select's serial walk from the top,
// in parallel: lane l holds bins 8l..8l+7). Writes *prefix |= d << shift
// and *need_out = need - sum(hist[d+1..255]).
__device__ void d_sel_digit(const uint32_t *hist, uint32_t need, uint32_t prefix, int shift, uint32_t *prefix_out,
                            uint32_t *need_out)
{
    const uint32_t lane = threadIdx.x & 31u;
    uint32_t c = 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
        c += hist[8u * lane + (uint32_t)i];
    uint32_t suf = c; // inclusive suffix over lanes l..31
    for (int o = 1; o < 32; o *= 2) {
        const uint32_t y = __shfl_down_sync(CU_FULL, suf, o);
        if (lane + (uint32_t)o < 32u)
            suf += y;
    }
    uint32_t run = suf - c, d_found = 0, need_new = 0; // run: sum of the bins above the one looked at
    bool found = false;
#pragma unroll
    for (int i = 7; i >= 0; i--) {
        const uint32_t h = hist[8u * lane + (uint32_t)i];
        if (!found && run + h >= need) {
            found = true;
            d_found = 8u * lane + (uint32_t)i;
            need_new = need - run;
        }
        run += h;
    }
    const uint32_t ball = __ballot_sync(CU_FULL, found);
    const uint32_t top = 31u - (uint32_t)__clz((int)ball); // ball != 0: need <= keys under the prefix
    if (lane == top) {
        *prefix_out = prefix | (d_found << shift);
        *need_out = need_new;
    }
}

// k_tah_select with the sample's keys staged in shared memory (one batch of
// loads instead of five dependent passes over global memory), each thread
// owning a contiguous run of keys for the final scans (two block scans in
// all instead of two per 1024 keys). Same results: same radix digits, ties
// to the lower index, same prefix sums.
__global__ void __launch_bounds__(S_SEL_THREADS) k_tah_select_sm(const uint32_t *__restrict__ key,
                                                                 uint32_t *__restrict__ pre,
                                                                 const uint32_t *__restrict__ gmax, uint8_t *p,
                                                                 cu_hp head, s_tg g)
{
    d_mark(head);
    extern __shared__ uint32_t sk[]; // n_alloc keys, then n_alloc packed prefixes
    __shared__ uint32_t hist[256];
    __shared__ uint32_t ws[32];
    __shared__ uint32_t sh_prefix, sh_need, sh_nc;
    const uint64_t b = blockIdx.x;
    const uint32_t na = (uint32_t)g.n_alloc, bd = blockDim.x, tid = threadIdx.x, lane = tid & 31u;
    const uint32_t *keys = key + b * g.n_alloc;
    uint32_t *cand = sk + na; // round-2 candidates (the prefix area, unused until the scans)
    const bool all = g.n_hi == 0 || g.n_hi == g.n_alloc;
    for (uint32_t i0 = 0; i0 < na; i0 += 8u * bd) { // 8 independent loads in flight per thread
        uint32_t v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const uint32_t i = i0 + (uint32_t)u * bd + tid;
            v[u] = i < na ? keys[i] : 0u;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const uint32_t i = i0 + (uint32_t)u * bd + tid;
            if (i < na)
                sk[i] = v[u];
        }
    }
    if (tid == 0) {
        sh_prefix = 0;
        sh_need = (uint32_t)g.n_hi;
        sh_nc = 0;
    }
    if (!all) {
        uint32_t mask = 0;
        const uint32_t *src = sk; // round 1: every key; round 2: the keys with round 1's prefix
        uint32_t cnt = na;
        for (int shift = S_SEL_SHIFT0; shift >= 0; shift -= 8) {
            for (uint32_t i = tid; i < 256; i += bd)
                hist[i] = 0;
            __syncthreads(); // keys staged, hist zeroed, sh_prefix/sh_need current
            const uint32_t prefix = sh_prefix, need = sh_need;
            for (uint32_t i0 = 0; i0 < cnt; i0 += bd) { // bounds uniform: whole warps iterate together
                const uint32_t i = i0 + tid;
                const uint32_t key = i < cnt ? src[i] : 0u;
                const uint32_t bin = (i < cnt && (key & mask) == prefix) ? (key >> shift) & 0xffu : 0x100u;
                const uint32_t peers = __match_any_sync(CU_FULL, bin);
                if (bin != 0x100u && lane == (uint32_t)(__ffs((int)peers) - 1))
                    atomicAdd(&hist[bin], (uint32_t)__popc((int)peers));
            }
            __syncthreads();
            if (tid < 32)
                d_sel_digit(hist, need, prefix, shift, &sh_prefix, &sh_need);
            mask |= 0xffu << shift;
            __syncthreads();
            if (shift == S_SEL_SHIFT0) {
                // Compact the keys with round 1's prefix (key >> 8) into cand (any order: a
                // histogram does not depend on it). Round 2 counts exactly the keys it counted
                // over all of sk, since every key matching its longer prefix is among these.
                const uint32_t pf = sh_prefix;
                for (uint32_t i0 = 0; i0 < na; i0 += bd) {
                    const uint32_t i = i0 + tid;
                    const bool keep = i < na && (sk[i] & mask) == pf;
                    const uint32_t bal = __ballot_sync(CU_FULL, keep);
                    uint32_t at = 0;
                    if (lane == 0 && bal != 0)
                        at = atomicAdd(&sh_nc, (uint32_t)__popc((int)bal));
                    at = __shfl_sync(CU_FULL, at, 0);
                    if (keep)
                        cand[at + (uint32_t)__popc((int)(bal & ((1u << lane) - 1u)))] = sk[i];
                }
                __syncthreads();
                src = cand;
                cnt = sh_nc;
            }
        }
    } else {
        __syncthreads();
    }
    const uint32_t T = sh_prefix, need = sh_need;
    const uint32_t per = (na + bd - 1) / bd;
    const uint32_t i0 = min(tid * per, na), i1 = min(i0 + per, na);
    uint32_t eq = 0;
    if (!all)
        for (uint32_t i = i0; i < i1; i++)
            eq += (uint32_t)(sk[i] == T);
    uint32_t eq_total, hq_total;
    const uint32_t eq_before = d_block_scan(eq, ws, &eq_total);
    uint32_t hq = 0, e = eq_before;
    uint32_t jj = i0 % g.nA;
    for (uint32_t i = i0; i < i1; i++) {
        const bool hi = d_sel_hi(sk[i], T, need, all, g.n_hi != 0, e);
        hq += hi ? (jj == g.nA - 1 ? g.r : g.k) : 0u;
        jj = jj + 1 == g.nA ? 0u : jj + 1;
    }
    const uint32_t hq_before = d_block_scan(hq, ws, &hq_total); // its barriers end every read of other chunks
    uint32_t *sp = sk + na;
    uint32_t run = hq_before;
    e = eq_before;
    jj = i0 % g.nA;
    for (uint32_t i = i0; i < i1; i++) {
        const bool hi = d_sel_hi(sk[i], T, need, all, g.n_hi != 0, e);
        sp[i] = run | ((uint32_t)hi << 31);
        run += hi ? (jj == g.nA - 1 ? g.r : g.k) : 0u;
        jj = jj + 1 == g.nA ? 0u : jj + 1;
    }
    __syncthreads();
    for (uint32_t i = tid; i < na; i += bd) // coalesced
        pre[b * g.n_alloc + i] = sp[i];
    const uint64_t used = (uint64_t)(g.G / 8u) * ((uint64_t)g.bl * g.S * g.Q + (uint64_t)(g.bh - g.bl) * hq_total);
    uint8_t *region = p + g.codes_off + b * g.code_bytes;
    for (uint64_t y = used + tid; y < g.code_bytes; y += bd)
        region[y] = 0;
    d_put_exps(p, g, gmax, b, tid, bd);
}

// n / d for 32-bit n and d, m = ceil(2^64 / d) (s_magic; 0 for d = 1): exact, since
// m*d - 2^64 < d makes the error of n*m / 2^64 below n / 2^64 < 1/d.
__device__ __forceinline__ uint32_t d_div32(uint32_t n, uint32_t d, uint64_t m)
{
    return d == 1u ? n : (uint32_t)__umul64hi((uint64_t)n, m);
}

// 8 elements per lane of tile `tile`'s segment, optionally scaled
__device__ __forceinline__ void d_tile_geom(const s_tg &g, uint64_t tile, uint64_t &token, uint32_t &q,
                                            uint64_t &b, uint64_t &s, uint32_t &w)
{
    if (g.T <= 0xffffffffull) { // round 6: multiply-high by ceil(2^64/d), no division loop
        const uint32_t t32 = (uint32_t)tile, tok = d_div32(t32, g.Q, g.mQ), S32 = (uint32_t)g.S;
        const uint32_t b32 = d_div32(tok, S32, g.mS);
        token = tok;
        q = t32 - tok * g.Q;
        b = b32;
        s = tok - b32 * S32;
    } else {
        token = tile / g.Q;
        q = (uint32_t)(tile - token * g.Q);
        b = token / g.S;
        s = token - b * g.S;
    }
    const uint32_t c0 = q * g.G;
    w = g.C - c0 < g.G ? g.C - c0 : g.G;
}

// tah.c's s_quant_tile metadata: the fp16 minimum rounded down, the fp16 step rounded up
// so min + step * levels covers the tile, the quantiser's minf and 1/step (0 for a zero
// step); range is set when either fp16 field is Inf or NaN.
__device__ __forceinline__ void d_tah_meta(float mn, float mx, float levels, uint16_t &min16, uint16_t &step16,
                                           float &minf, float &inv, uint32_t &range)
{
    min16 = d_half_from_f32_down(mn);
    // the fields widened by cvt.f32.f16 (half.c's value for every half but NaN, which these never
    // are) and 1 / step by __frcp_rn (rounded once, as __fdiv_rn(1, step)): round 16
    minf = __half2float(__ushort_as_half(min16));
    step16 = d_half_from_f32_up(__fdiv_rn(__fsub_rn(mx, minf), levels));
    const float step = __half2float(__ushort_as_half(step16));
    inv = step > 0.0f ? __frcp_rn(step) : 0.0f;
    range |= (uint32_t)((step16 & 0x7c00u) == 0x7c00u || (min16 & 0x7c00u) == 0x7c00u);
}

// v[0..N) *= down (exact: a power of two), then the two largest magnitudes m1 >= m2 of
// the lane's elements (a multiset: equal maxima give m2 = m1; a NaN element leaves m1 and
// raises m2 to m1, and non-finite input leaves the payload unspecified); d_top2_merge merges
// them with those of lane ^ o. The pivot, the first index of m1, matters only for rotated
// tiles: d_first_max finds it in their pass (round 14; before, every element tracked it).
template <int N>
__device__ __forceinline__ void d_scale_top2(float v[N], float down, float &m1, float &m2)
{
    m1 = 0.0f;
    m2 = 0.0f;
#pragma unroll
    for (int r = 0; r < N; r++) {
        v[r] = __fmul_rn(v[r], down);
        const float m = fabsf(v[r]);
        m2 = fmaxf(m2, fminf(m, m1));
        m1 = fmaxf(m1, m);
    }
}

__device__ __forceinline__ void d_top2_merge(float &m1, float &m2, uint32_t mask, uint32_t o)
{
    const float b1 = __shfl_xor_sync(mask, m1, (int)o), b2 = __shfl_xor_sync(mask, m2, (int)o);
    m2 = fmaxf(fmaxf(m2, b2), fminf(m1, b1));
    m1 = fmaxf(m1, b1);
}

// The pivot of a tile (a segment of tpg lanes, lane tl: elements 8tl..8tl+7 in z): the first
// index whose magnitude is m1, the tile's largest (0 when none is: every element NaN, whose
// payload is unspecified).
__device__ __forceinline__ uint32_t d_first_max(const float z[8], float m1, uint32_t tl, uint32_t tpg)
{
    uint32_t i = 8u * tpg;
#pragma unroll
    for (int r = 7; r >= 0; r--)
        if (fabsf(z[r]) == m1)
            i = 8u * tl + (uint32_t)r;
    for (uint32_t o = 1; o < tpg; o *= 2)
        i = min(i, (uint32_t)__shfl_xor_sync(CU_FULL, i, (int)o));
    return i < 8u * tpg ? i : 0u;
}

// swap element 0 and element piv of the segment's tile (registers of two lanes)
__device__ __forceinline__ void d_swap0(float z[8], uint32_t lane, uint32_t tl, uint32_t tpg, uint32_t piv)
{
    const int sbase = (int)(lane - tl);
    const uint32_t pl = piv / 8u, pr = piv % 8u;
    float sel = z[0];
#pragma unroll
    for (int r = 0; r < 8; r++)
        if ((uint32_t)r == pr)
            sel = z[r];
    const float val0 = __shfl_sync(CU_FULL, z[0], sbase);
    const float valp = __shfl_sync(CU_FULL, sel, sbase + (int)pl);
    (void)tpg;
    if (tl == 0)
        z[0] = valp;
    if (tl == pl) {
#pragma unroll
        for (int r = 0; r < 8; r++)
            if ((uint32_t)r == pr)
                z[r] = val0;
    }
}


// U quant tiles per segment (tiles[u], valids[u], their prefix words phv[u] =
// high quant tiles before the allocation tile | is_hi << 31): every tile's x loads
// issued before the first use, then each tile as tah.c quantises it (segment of
// G/8 lanes per tile, lane tl holds elements 8tl..8tl+7). Warp-uniform call.
// TPG, BH, BL: tile/8 and the code widths when known at compile time (0: from g); with
// them the segment loops unroll and the packing is constant shifts (round 6).
template <int U, uint32_t TPG, uint32_t BH, uint32_t BL, typename X>
__device__ __forceinline__ void d_tah_quant_u(const X *__restrict__ x, uint8_t *__restrict__ p,
                                              uint16_t *__restrict__ flagv, const s_tg &g, const uint64_t tiles[U],
                                              const bool valids[U], const uint32_t phv[U],
                                              const uint32_t *__restrict__ gmax, bool flag_bytes, uint32_t lane,
                                              uint32_t &range)
{
    const uint32_t tpg = TPG ? TPG : g.G / 8u, tl = lane % tpg, G = 8u * tpg;
    float vv[U][8];
    uint32_t ab[U]; // the tiles' groups' max |x| bits
#pragma unroll
    for (int u = 0; u < U; u++) {
        uint64_t token, b, s;
        uint32_t q, w;
        d_tile_geom(g, tiles[u], token, q, b, s, w);
        if (!valids[u])
            w = 0;
        const uint64_t x0 = token * g.C + (uint64_t)q * G;
        d_load8(x, x0 + 8u * tl, x0 + w, g.vec, vv[u]);
        ab[u] = valids[u] ? __ldcg(&gmax[d_group(g, b, s, q)]) : 0u;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const bool valid = valids[u];
        const uint64_t tile = tiles[u];
        uint64_t token, b, s;
        uint32_t q, w;
        d_tile_geom(g, tile, token, q, b, s, w);
        if (!valid)
            w = 0;
        float v[8];
#pragma unroll
        for (int r = 0; r < 8; r++)
            v[r] = vv[u][r];
        const int32_t e = d_tah_exp(ab[u], g.lg);
        const float down = __uint_as_float((uint32_t)(127 - e) << 23), rho_down = __fmul_rn(g.rho, down);
        // scale; top-2 magnitudes (multiset)
        float m1, m2;
        d_scale_top2<8>(v, down, m1, m2);
        for (uint32_t o = 1; o < tpg; o *= 2)
            d_top2_merge(m1, m2, CU_FULL, o);
        uint32_t piv = 0; // rotated tiles: the first index of m1
        float mn, mx;
        const bool full = w == G;
        d_tile_minmax(v, tl, tpg, G, full ? G : w, !full, mn, mx);
        const bool rot = valid && m1 > __fmul_rn(g.tau, __fadd_rn(m2, rho_down));
        if (__any_sync(CU_FULL, rot)) {
            float z[8];
#pragma unroll
            for (int r = 0; r < 8; r++)
                z[r] = v[r];
            piv = d_first_max(z, m1, tl, tpg);
            d_swap0(z, lane, tl, tpg, piv);
            d_fwht_seg(z, lane, tpg);
#pragma unroll
            for (int r = 0; r < 8; r++)
                z[r] = __fmul_rn(z[r], g.norm);
            float rmn, rmx;
            d_tile_minmax(z, tl, tpg, G, G, false, rmn, rmx);
            if (rot) {
#pragma unroll
                for (int r = 0; r < 8; r++)
                    v[r] = z[r];
                mn = rmn;
                mx = rmx;
            }
        }
        if (!valid)
            continue;
        const uint32_t ph = phv[u]; // high-quant-tile prefix | is_hi << 31
        const uint32_t is_hi = ph >> 31;
        const uint32_t bits = BH ? (is_hi ? BH : BL) : (is_hi ? g.bh : g.bl);
        const float levels = (float)((1u << bits) - 1u);
        uint16_t min16, step16;
        float minf, inv;
        d_tah_meta(mn, mx, levels, min16, step16, minf, inv, range);
        uint32_t code[8];
#pragma unroll
        for (int r = 0; r < 8; r++) {
            float t = __fmaf_rn(__fsub_rn(v[r], minf), inv, 8388608.0f);
            t = __fsub_rn(t, 8388608.0f); // tah.c: (v - minf) inv to nearest, ties to even, one rounding
            t = t < levels ? t : levels;
            t = t > 0.0f ? t : 0.0f;
            code[r] = (uint32_t)t;
        }
        const uint64_t qidx = s * g.Q + q;
        const uint64_t hiq_before = (ph & 0x7fffffffu) + (is_hi && g.k > 1u ? q % g.k : 0u);
        const uint32_t bh = BH ? BH : g.bh, bl = BH ? BL : g.bl;
        const uint64_t off = (uint64_t)tpg * ((uint64_t)bl * qidx + (uint64_t)(bh - bl) * hiq_before);
        uint64_t lo, hi;
        uint8_t *dst = p + g.codes_off + b * g.code_bytes + off + (uint64_t)tl * bits;
        if (BH) { // constant widths: a few shifts, a resolved store path
            if (is_hi) {
                d_pack8(code, BH, lo, hi);
                d_store_bytes(dst, lo, hi, BH);
            } else {
                d_pack8(code, BL, lo, hi);
                d_store_bytes(dst, lo, hi, BL);
            }
        } else {
            d_pack8(code, bits, lo, hi);
            d_store_bytes(dst, lo, hi, bits);
        }
        if (tl == 0) {
            if (qidx % CODEC_TAH_IX_TILES == 0u) // the index entry at this tile
                d_put_u32(p + 8 + 4 * (b * g.ix_n + qidx / CODEC_TAH_IX_TILES), (uint32_t)hiq_before);
            d_put_u32(p + g.meta_off + 4 * tile, (uint32_t)min16 | ((uint32_t)step16 << 16));
            const uint32_t fv = is_hi | ((uint32_t)rot << 1) | ((rot ? piv : 0u) << 2);
            if (flag_bytes)
                p[g.flags_off + tile] = (uint8_t)fv; // fbits == 8: tile t's field is byte t (no k_tah_flags)
            else
                flagv[tile] = (uint16_t)fv;
        }
    }
}

template <int U>
__global__ void __launch_bounds__(256) k_tah_quant(const float *__restrict__ x, const uint32_t *__restrict__ pre,
                                                   const uint32_t *__restrict__ gmax, uint16_t *__restrict__ flagv,
                                                   uint8_t *__restrict__ p, cu_hp head, s_tg g, bool flag_bytes)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u, tpg = g.G / 8u, spw = 32u / tpg, seg = lane / tpg;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32u;
    uint32_t range = 0;
    // U tiles per segment per iteration: every tile's x and prefix loads issued before the first use
    for (uint64_t base = warp * spw * U; base < g.T; base += nwarps * spw * U) { // uniform per warp
        uint64_t tiles[U];
        bool valids[U];
        uint32_t phv[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint64_t traw = base + (uint64_t)u * spw + seg;
            valids[u] = traw < g.T;
            tiles[u] = valids[u] ? g.T - 1 - traw : 0; // reverse: pass 1 left the end in L2
            uint64_t token, b, s;
            uint32_t q, w;
            d_tile_geom(g, tiles[u], token, q, b, s, w);
            phv[u] = valids[u] ? pre[b * g.n_alloc + s * g.nA + (g.k > 1u ? q / g.k : q)] : 0u; // prefix | is_hi << 31
        }
        d_tah_quant_u<U, 0, 0, 0>(x, p, flagv, g, tiles, valids, phv, gmax, flag_bytes, lane, range);
    }
    if (range)
        d_flag(head, CU_ST_RANGE);
}

// ---- the default spec's kernels (G = A = 64, 4/3 bits, C % 64 == 0) ----
//
// Round 7's kernels gave a tile a segment of 8 lanes: every reduction (entropy's 16
// accumulators, top-2, min/max), every cross-lane Hadamard stage and the fp16 metadata
// chain ran on all 8 lanes with shuffles, ~1250 warp instructions per 4 tiles in the
// quant. The kernels below give a tile one lane (k_tah_spec: tah.c's scalar loops in its
// order on a staged row) or a pair of lanes, i and i + 16 (k_tah_dw64, h = lane >> 4).
__device__ __forceinline__ uint32_t d_half(uint32_t lane) { return lane >> 4; }

// The passes over a warp's rotated tiles (bit t of rm: tile t of its 32 rotated), 4 per
// pass, a segment of 8 lanes each: d_rot_pick gives segment lane >> 3 its tile (act
// false when the pass has fewer), d_rot_drop removes the pass's tiles from rm.
// The tile is found by clearing rm's lowest set bits (~10 instructions; round 16, TAH decode
// 1 % faster than __fns, ~110).
__device__ __forceinline__ uint32_t d_rot_pick(uint32_t rm, uint32_t lane, bool &act)
{
    const uint32_t seg = lane >> 3;
    act = seg < (uint32_t)__popc((int)rm);
    const uint32_t t1 = rm & (rm - 1u), t2 = t1 & (t1 - 1u), t3 = t2 & (t2 - 1u);
    const uint32_t t = seg == 0u ? rm : (seg == 1u ? t1 : (seg == 2u ? t2 : t3));
    return act ? (uint32_t)__ffs((int)t) - 1u : 0u;
}

__device__ __forceinline__ uint32_t d_rot_drop(uint32_t rm)
{
    for (uint32_t k = 0; k < 4u && rm != 0u; k++)
        rm &= rm - 1u;
    return rm;
}

// The pass's pivots (tp: segment lane >> 3's tile's) to the lanes of their tiles: tile `me` is
// in this pass when it is among rm's first 4 bits, its segment the rank of its bit.
__device__ __forceinline__ void d_rot_take_piv(uint32_t rm, uint32_t me, uint32_t tp, uint32_t lane, uint32_t &piv)
{
    const uint32_t rank = (uint32_t)__popc((int)(rm & ((1u << me) - 1u)));
    const bool mine = ((rm >> me) & 1u) && rank < 4u;
    const uint32_t pv = __shfl_sync(CU_FULL, tp, (int)(mine ? 8u * rank : lane));
    if (mine)
        piv = pv;
}

// Elements 8 i .. 8 i + 7 of a staged row: fp32 rows hold 64 floats; bf16 rows hold the tile's
// 64 bf16 in their first 128 bytes (k_tah_spec<cu_bf16>), widened here exactly.
template <typename X>
__device__ __forceinline__ void d_row8(const float *row, uint32_t i, float z[8])
{
    if constexpr (sizeof(X) == 2) {
        const uint4 a = ((const uint4 *)row)[i];
        z[0] = d_bf_lo(a.x); z[1] = d_bf_hi(a.x); z[2] = d_bf_lo(a.y); z[3] = d_bf_hi(a.y);
        z[4] = d_bf_lo(a.z); z[5] = d_bf_hi(a.z); z[6] = d_bf_lo(a.w); z[7] = d_bf_hi(a.w);
    } else {
        const float4 q0 = ((const float4 *)row)[2u * i], q1 = ((const float4 *)row)[2u * i + 1u];
        z[0] = q0.x; z[1] = q0.y; z[2] = q0.z; z[3] = q0.w;
        z[4] = q1.x; z[5] = q1.y; z[6] = q1.z; z[7] = q1.w;
    }
}

// Staging (round 8): tiles go to shared memory with cp.async (16 bytes per lane and copy,
// straight to shared memory, L2 only), a tile a row, while the warp computes on what it staged
// before (each lane loading its own tile into registers had the grid's warps alternate between
// waiting for DRAM and computing).
#define S_ST_ROWW 68u // words per staged tile (64 + 4 pad: 16-byte accesses of 8 rows hit 8 bank groups)

// One pass over a staged unit's rotated tiles (bit t of rm: row t rotated), 4 per pass, a
// segment of 8 lanes each: the pivot, element 0 swapped with it, the transform and its min/max
// as tah.c; the transformed floats go back to the row, (min, max) to mm[t]. The lanes of tile
// `me` take its pivot into piv (d_rot_take_piv); m1 and the tile's scale factor dscale are read
// from lane t (k_tah_spec: a lane a tile). Returns rm less the pass's tiles.
// xs (round 38; warp-uniform, the caller's exponent e in [-100, -3], as on activations): the
// tile is transformed at x's own scale, without 2^-e and without 1/sqrt(64) = 2^-3, which makes
// every value the scaled one's times 2^(e+3) exactly (scaling by 2^-e >= 8 is exact, a sum that
// falls below FLT_MIN is exact at both scales, and the scaled values are multiples of 2^-146, so
// the scaled tile's final 1/8 is exact too); the caller scales its min and max and its codes'
// constants instead, and passes m1 unscaled (the pivot is the same index on x). Otherwise each
// load is scaled by dscale and the transform by norm, as tah.c computes them.
// The pivot is swapped on the row, then stages h = 1, 2, 4 run on a lane's 8 consecutive
// elements and h = 8, 16, 32 on elements sl + 8k (the row written and read back between), so no
// butterfly crosses lanes (round 38: ~60 fewer instructions a pass than shuffled butterflies and
// a register swap). Lane sl then holds tah.c's SIMD lane sl (element i: lane i % 8), so its
// min/max is tah.c's lane order directly.
template <typename X>
__device__ __forceinline__ uint32_t d_rot_pass(float *unit, float2 *mm, uint32_t rm, uint32_t me, bool xs, float dscale,
                                               float m1, float norm, uint32_t lane, uint32_t &piv)
{
    const uint32_t sl = lane & 7u;
    bool act;
    const uint32_t t = d_rot_pick(rm, lane, act);
    float *row = unit + t * S_ST_ROWW;
    const float dt = __shfl_sync(CU_FULL, dscale, (int)t);
    auto load = [&](float z[8]) {
        d_row8<X>(row, sl, z);
        if (!xs)
#pragma unroll
            for (int r = 0; r < 8; r++)
                z[r] = __fmul_rn(z[r], dt);
    };
    float z[8];
    load(z);
    const uint32_t tp = d_first_max(z, __shfl_sync(CU_FULL, m1, (int)t), sl, 8u);
    d_rot_take_piv(rm, me, tp, lane, piv);
    __syncwarp(); // every segment's row read before a pivot is swapped
    if (act && sl == 0u && tp != 0u) {
        if constexpr (sizeof(X) == 2) {
            uint16_t *r16 = (uint16_t *)row;
            const uint16_t a = r16[0];
            r16[0] = r16[tp];
            r16[tp] = a;
        } else {
            const float a = row[0];
            row[0] = row[tp];
            row[tp] = a;
        }
    }
    __syncwarp();
    load(z);
    d_fwht8(z);
    __syncwarp(); // a bf16 row's lanes read before the floats overwrite it
    float4 *r4 = (float4 *)row + 2u * sl;
    if (act) {
        r4[0] = make_float4(z[0], z[1], z[2], z[3]);
        r4[1] = make_float4(z[4], z[5], z[6], z[7]);
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < 8; k++)
        z[k] = row[sl + 8u * (uint32_t)k];
    d_fwht8(z); // h = 8, 16, 32 of the tile
    if (!xs)
#pragma unroll
        for (int r = 0; r < 8; r++)
            z[r] = __fmul_rn(z[r], norm);
    float a = z[0], b = z[0];
#pragma unroll
    for (int k = 1; k < 8; k++) {
        a = fminf(a, z[k]);
        b = fmaxf(b, z[k]);
    }
    a = d_seg_minf(a, 8u);
    b = d_seg_maxf(b, 8u);
    if (__any_sync(CU_FULL, a == 0.0f)) { // which zero: d_zkey's unordered key of element sl + 8k
        uint32_t zk = 0xffffffffu;
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (z[k] == 0.0f)
                zk = min(zk, d_zkey(sl + 8u * (uint32_t)k, 64u, false, z[k]));
        zk = d_seg_minu(zk, 8u);
        if (a == 0.0f)
            a = (zk & 1u) ? -0.0f : 0.0f;
    }
    if (act) { // lane sl wrote and reads only its own elements here
#pragma unroll
        for (int k = 0; k < 8; k++)
            row[sl + 8u * (uint32_t)k] = z[k];
        if (sl == 0u)
            mm[t] = make_float2(a, b);
    }
    __syncwarp();
    return d_rot_drop(rm);
}

// A sample's threshold from its key histogram H (CODEC_TAH_KEY_BINS bins, read through L2),
// by a CTA of 256 threads (16 bins each, thread 0 the top ones, one block scan): T, the largest
// key with at least nh keys >= T, to *sh_T and need, how many keys == T are high (the lowest
// indices first), to *sh_need, written by the one thread whose bins hold T. The caller
// synchronises before reading them. PK: H packs two bins a word (d_hist_add).
template <bool PK>
__device__ __forceinline__ void d_tah_threshold(const uint32_t *H, uint32_t nh, uint32_t *ws, uint32_t *sh_T,
                                                uint32_t *sh_need)
{
    constexpr uint32_t nb = CODEC_TAH_KEY_BINS / 256u, nw = PK ? nb / 2u : nb;
    static_assert(nw % 4u == 0u, "16-byte histogram loads");
    const uint32_t hb = (255u - threadIdx.x) * nb; // thread 0: the top bins
    uint32_t hv[nb], c = 0;
#pragma unroll
    for (uint32_t q = 0; q < nw; q += 4u) {
        const uint4 v = __ldcg((const uint4 *)&H[hb / (nb / nw) + q]);
        const uint32_t w[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
        for (uint32_t r = 0; r < 4u; r++) {
            if constexpr (PK) {
                hv[2u * (q + r)] = w[r] & 0xffffu;
                hv[2u * (q + r) + 1u] = w[r] >> 16;
            } else
                hv[q + r] = w[r];
            c += PK ? (w[r] & 0xffffu) + (w[r] >> 16) : w[r];
        }
    }
    uint32_t tot;
    uint32_t above = d_block_scan(c, ws, &tot); // keys above this thread's bins
    if (above < nh && above + c >= nh)
#pragma unroll
        for (int q = (int)nb - 1; q >= 0; q--) {
            if (above + hv[q] >= nh) {
                *sh_T = hb + (uint32_t)q;
                *sh_need = nh - above;
                break;
            }
            above += hv[q];
        }
}

// c more keys in bin `key` of a sample's histogram H: a word a bin, or (PK) two 16-bit bins a
// word, bin 2i in the low half (k_tah_spec's samples have fewer than 2^16 tiles: no carry), so
// that each of k_tah_emit's CTAs reads 8 KB of it instead of 16 KB for its threshold
template <bool PK>
__device__ __forceinline__ void d_hist_add(uint32_t *H, uint32_t key, uint32_t c)
{
    if (PK)
        atomicAdd(&H[key >> 1], c << (16u * (key & 1u)));
    else
        atomicAdd(&H[key], c);
}

// A CTA's keys (n of them at keys; 0xffffffff: an empty slot) added to the sample's histogram H:
// counted first in a shared-memory window lh of LH bins around keys[0] (a CTA's keys cluster),
// keys outside it straight to H, then the window's non-zero bins added to H. Block-wide.
template <uint32_t LH, bool PK>
__device__ __forceinline__ void d_hist_window(const uint32_t *keys, uint32_t n, uint32_t *lh, uint32_t *H)
{
    const uint32_t tid = threadIdx.x;
    const uint32_t base = max(keys[0], LH / 2u) - LH / 2u;
    for (uint32_t q = tid; q < LH; q += blockDim.x)
        lh[q] = 0;
    __syncthreads();
    for (uint32_t i = tid; i < n; i += blockDim.x) {
        const uint32_t key = keys[i];
        if (key - base < LH)
            atomicAdd(&lh[key - base], 1u);
        else if (key != 0xffffffffu)
            d_hist_add<PK>(H, key, 1u);
    }
    __syncthreads();
    for (uint32_t q = tid; q < LH; q += blockDim.x)
        if (lh[q] != 0u)
            d_hist_add<PK>(H, base + q, lh[q]);
}

// The ordering around the words CTAs poll: release/acquire fences at GPU scope (round 16;
// __threadfence is fence.sc, which also orders against every other SC fence), and S_POLL_NS between
// polls, so that the polls do not queue at the L2 slice of the word ahead of the atomics they wait for.
// A CTA publishes as CUDA's last-block pattern does: every thread fences its own writes, then the
// barrier, then one thread's flag or counter (a second fence by that thread after the barrier cost
// 2 %, H100).
__device__ __forceinline__ void d_fence_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
#define S_POLL_NS 100

// ---- encode, round 17: every tile quantised from one read of x (k_tah_spec); for window 0 the
// selection and the frame afterwards (k_tah_emit) ----
//
// Round 6's k_tah_fused (a persistent grid: entropy keys, the select across its CTAs, the codes
// from a second read of x; removed in round 37) made the codes wait ~7 us for the select. Here
// the codes are not made to wait. A unit of k_tah_spec is 32 tiles, one exponent group (frame
// version 4), so the warp has its group's exponent once it has the tiles' max |x|, and quantises
// each tile as tah.c does right after its entropy key, from the same staged row:
//  - window 0: both ways (4 and 3 bits) into a record of 64 bytes per tile; k_tah_emit then
//    ranks the keys and copies the chosen width's codes into the frame;
//  - window mode (window 32: a unit is a window): the unit's tiles rank themselves, each is coded
//    at its width only, and the warp writes the frame itself: no records, no k_tah_emit (round
//    37; until then, with one exponent per frame, each tile was quantised at its own exponent and
//    k_tah_emit rescaled the fields, or quantised the tile again: H200 39.5 -> 45.5 % of copy).
// Record, u32 words: [0..7] the tile's 4-bit codes and [8..13] its 3-bit codes (bitpack's
// stream, as the frame holds them), [14] min16 | step16 (4-bit) << 16, [15] step16 (3-bit) |
// the flag byte without its width bit << 16 (the minimum is the same for both widths).
// Measured (H100, bench tensor): round 17 ~0.054 ms in all (k_tah_spec ~42 us, k_tah_emit ~11)
// against k_tah_fused's ~0.059; round 18 0.0485 (x evict-first so the records stay in L2, the
// records in planes, the emit's look-back overlapped; cuda/NOTES.md, "Nineteenth version").

// k_tah_spec's staging: units of 32 tiles, one per lane (row `lane` of the unit), one buffer
// per warp, 4 warps per CTA, 4 CTAs per SM (16 warps of up to 128 registers). A lane reads its
// tile from the staged row in each pass (round 35; until then two buffers a warp, 3 CTAs per
// SM, and the tile's 64 floats held in registers from the entropy to the codes: ~7 % slower on
// an H200, cuda/NOTES.md "Thirty-sixth version").
#define S_SP_WARPS 4u
#define S_SP_CTAS 4u
#define S_SP_WARPW (S_SP_UNIT * S_ST_ROWW)
#define S_SP_CTA (S_SP_WARPS * S_SP_WARPW * 4u)
#define S_SP_CAP 24u // units of keys in a CTA's bag for its histogram (an even share is ~12)
#define S_SP_LH 256u // its histogram window: keys counted in shared memory first, a window of S_SP_LH bins

// Copy tiles gt .. gt+n-1 (n <= 32) into buf's rows: chunk c = lane + 32 m is row c / 16's
// chunk c % 16; one group of copies (committed also when n = 0). Full units evict first from
// L2: x is read once, and the stream of it had pushed out k_tah_emit's records, which then
// went to DRAM and came back (H100: 1.9 us of the encode).
// bf16 input: each row's first 128 bytes (8 chunks), half the bytes of the stream.
template <typename X>
__device__ __forceinline__ void d_stage_unit32(float *buf, const X *x, uint64_t gt, uint32_t n, uint32_t lane)
{
    if constexpr (sizeof(X) == 2)
        d_stage_rows<8u, S_ST_ROWW, 8u>(buf, (const float *)(x + gt * 64u), n, lane);
    else
        d_stage_rows<16u, S_ST_ROWW, 16u>(buf, x + gt * 64u, n, lane);
}

// 8 codes below 8 as nibbles (LSB first) -> the same codes as 24 bits, 3 each (k_tah_spec, window mode)
__device__ __forceinline__ uint32_t d_nib3(uint32_t w)
{
    const uint32_t y = (w & 0x07070707u) | ((w >> 1) & 0x38383838u); // byte k: codes 2k, 2k + 1
    const uint32_t u = (y & 0x003f003fu) | ((y >> 2) & 0x0fc00fc0u); // half h: codes 4h .. 4h + 3
    return (u & 0xfffu) | ((u >> 4) & 0xfff000u);
}

// The staged unit's tile of this lane (row `lane`; valid: the unit has it; unit u of sample b, an
// exponent group), as tah.c encodes it at the group's exponent e, both widths (WM, window mode:
// `share` of the unit's nval tiles are high, so each tile takes its own width, as nibbles): its
// entropy key (returned); the group's exponent byte; its record at rec (its 16-byte words
// S_SP_UNIT apart: the block's planes) or, WM, its flag byte, fields and codes in the frame at p
// (hb0: the sample's high tiles before the unit); nonfinite set for non-finite x.
// Warp-uniform call (the group's max, the rotated tiles' pass, the run of codes).
//  - one pass over the row: tah.c's 16 entropy accumulators in its order, the largest
//    and second largest |x| (as bits), min and max, all on x itself: scaling by 2^-e is
//    monotone, so these are the scaled tile's once scaled (a zero minimum, whose sign tah.c
//    takes from its lane order, is looked up again: d_zkey);
//  - the codes of an unrotated tile at x's own scale, (x - minf 2^e) (inv 2^-e): the same
//    products as tah.c's (v - minf) inv when both scalings are exact, which |e| <= 100
//    ensures (beyond it, rare, the row is scaled first, as tah.c does);
//  - rotated tiles (about 3 in 16) in d_rot_pass, 4 at a time on their rows; at x's own scale
//    where the exponent allows, as it does on activations.
// Each pass reads the row 8 floats at a time (the bf16 row widened as read; a rotated row holds
// the transformed floats), so the tile is not held in registers.
template <typename X, bool WM>
__device__ __forceinline__ uint32_t d_tah_spec_t64(float *unit, float2 *mm, bool valid, uint4 *__restrict__ rec,
                                                   uint8_t *__restrict__ p, const s_tg &g, uint32_t lane, uint32_t b,
                                                   uint32_t u, uint32_t share, uint32_t hb0, uint32_t nval,
                                                   bool &nonfinite)
{
    constexpr uint32_t BH = 4u, BL = 3u;
    const float *row = unit + lane * S_ST_ROWW;
    // tah.c's 16 accumulators: element i goes to i % 16, level i / 16; chunk c of 8 holds
    // accumulators 8 (c % 2) .. 8 (c % 2) + 7 at level c / 2, so each one's adds keep tah.c's order
    float s1[16], sl[16], mn = 0.0f, mx = 0.0f;
    uint32_t b1 = 0, b2 = 0;
#pragma unroll
    for (int c = 0; c < 8; c++) {
        float z[8];
        d_row8<X>(row, (uint32_t)c, z);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float x = z[i], a = fabsf(x); // an invalid lane's row is stale: its results are never used
            const int jq = 8 * (c % 2) + i;
            const float ml = d_mlog(a);
            // tah.c's accumulators start at +0: 0 + a is a, fma(a, ml, 0) is a ml (ml >= 257)
            s1[jq] = c < 2 ? a : __fadd_rn(s1[jq], a);
            sl[jq] = c < 2 ? __fmul_rn(a, ml) : __fmaf_rn(a, ml, sl[jq]);
            const uint32_t bb = __float_as_uint(a);
            b2 = max(b2, min(bb, b1));
            b1 = max(b1, bb);
            mn = c == 0 && i == 0 ? x : fminf(mn, x);
            mx = c == 0 && i == 0 ? x : fmaxf(mx, x);
        }
    }
    float S1 = s1[0], SL = sl[0];
#pragma unroll
    for (int j = 1; j < 16; j++) {
        S1 = __fadd_rn(S1, s1[j]);
        SL = __fadd_rn(SL, sl[j]);
    }
    const uint32_t key = d_ent_key(S1, SL, g.kscale);
    uint32_t hib = 0; // window mode (the unit is a window of tah.c's window rule): the unit's `share`
    if (WM) {         // largest keys, ties to the lower lane: T the share-th largest key, bit by bit
        uint32_t T = 0;
#pragma unroll
        for (int bit = 11; bit >= 0; bit--) { // keys are 12-bit (CODEC_TAH_KEY_BINS)
            const uint32_t c = T | (1u << bit);
            if ((uint32_t)__popc((int)__ballot_sync(CU_FULL, valid && key >= c)) >= share)
                T = c;
        }
        const uint32_t gt = (uint32_t)__popc((int)__ballot_sync(CU_FULL, valid && key > T));
        const uint32_t eq = __ballot_sync(CU_FULL, valid && key == T) & ((1u << lane) - 1u);
        hib = (uint32_t)(valid && share != 0u && (key > T || (key == T && gt + (uint32_t)__popc((int)eq) < share)));
    }
    // the unit's exponent: its group's (k = 1), from its tiles' largest |x|
    const uint32_t gb = __reduce_max_sync(CU_FULL, valid ? b1 : 0u);
    nonfinite |= gb >= 0x7f800000u; // the payload is unspecified then
    const int32_t et = d_tah_exp(gb < 0x7f800000u ? gb : 0u, g.lg);
    const bool rawok = et >= -100 && et <= 100; // warp-uniform
    const float down = __uint_as_float((uint32_t)(127 - et) << 23);
    const float m1 = __fmul_rn(__uint_as_float(b1), down), m2 = __fmul_rn(__uint_as_float(b2), down);
    float mns = __fmul_rn(mn, down), mxs = __fmul_rn(mx, down);
    if (mns == 0.0f) { // rare on activations: which zero (one lane per tile)
        uint32_t z = 0xffffffffu;
        for (int c = 0; c < 8; c++) {
            float e8[8];
            d_row8<X>(row, (uint32_t)c, e8);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float sv = __fmul_rn(valid ? e8[i] : 0.0f, down);
                if (sv == 0.0f)
                    z = min(z, d_zkey((uint32_t)(8 * c + i), 64u, false, sv));
            }
        }
        mns = (z & 1u) ? -0.0f : 0.0f;
        if (mxs == 0.0f)
            mxs = mns;
    }
    const bool rot = valid && m1 > __fmul_rn(g.tau, __fadd_rn(m2, __fmul_rn(g.rho, down)));
    uint32_t piv = 0;
    uint32_t rm = __ballot_sync(CU_FULL, rot); // bit t: tile t rotated
    const bool xs = et >= -100 && et <= -3; // warp-uniform: rotated rows at x's own scale (d_rot_pass)
    while (rm != 0u)
        rm = d_rot_pass<X>(unit, mm, rm, lane, xs, down, xs ? __uint_as_float(b1) : m1, g.norm, lane, piv);
    if (rot) { // the row holds the transformed tile now (valid; xs: times 2^(e+3)), its min and max in mm
        const float2 q = mm[lane];
        const float up = xs ? __uint_as_float((uint32_t)(124 - et) << 23) : 1.0f; // 2^(-e-3)
        mns = __fmul_rn(q.x, up);
        mxs = __fmul_rn(q.y, up);
    }
    // beyond |e| <= 100 (values near the ends of the float range) an unrotated tile's codes come
    // from its scaled row, as tah.c computes them: scaled as floats in place, last chunk first (a
    // bf16 row's chunk c is overwritten only by chunks c/2 and below)
    const bool scaled = !rawok && valid && !rot;
    if (scaled) {
        for (int c = 7; c >= 0; c--) {
            float z[8];
            d_row8<X>(row, (uint32_t)c, z);
            float4 *r4 = (float4 *)row + 2 * c;
            r4[0] = make_float4(__fmul_rn(z[0], down), __fmul_rn(z[1], down), __fmul_rn(z[2], down), __fmul_rn(z[3], down));
            r4[1] = make_float4(__fmul_rn(z[4], down), __fmul_rn(z[5], down), __fmul_rn(z[6], down), __fmul_rn(z[7], down));
        }
    }
    // tah.c's s_quant_tile metadata for both widths: one minimum, two steps (window mode: the
    // tile's width only, its step in both fields)
    const uint16_t min16 = d_half_from_f32_down(mns);
    const float minf = __half2float(__ushort_as_half(min16));
    const float span = __fsub_rn(mxs, minf);
    const uint16_t sth =
        d_half_from_f32_up(__fdiv_rn(span, (float)((1u << (WM && !hib ? BL : BH)) - 1u)));
    const uint16_t stl = WM ? sth : d_half_from_f32_up(__fdiv_rn(span, (float)((1u << BL) - 1u)));
    const float fh = __half2float(__ushort_as_half(sth)), fl = __half2float(__ushort_as_half(stl));
    float ih = fh > 0.0f ? __frcp_rn(fh) : 0.0f, il = WM ? ih : fl > 0.0f ? __frcp_rn(fl) : 0.0f, cm = minf;
    if (rot ? xs : !scaled) { // the row at x's own scale, 2^es times tah.c's values
        const int32_t es = rot ? et + 3 : et;
        const float dn = __uint_as_float((uint32_t)(127 - es) << 23);
        cm = __fmul_rn(minf, __uint_as_float((uint32_t)(127 + es) << 23));
        ih = __fmul_rn(ih, dn);
        il = __fmul_rn(il, dn);
    }
    // both widths' codes, packed as they come (the clamps never act). tah.c's
    // code is t = dv inv in [0, 2^B - 1/2) rounded once to nearest, ties to even: dv inv + 2^23
    // rounded so (one FMA) is 2^23 + that code exactly (ulp 1 there), so each code is one FFMA (FP32
    // pipe) instead of a conversion (16 per clock per SM), and it is packed as its float's bits, 2^23's bits
    // (K) included: K's share of every word is a constant (kh, kl: folded by the compiler),
    // taken off at the end. A non-finite t (non-finite x: payload unspecified) spoils only its
    // tile.
    constexpr uint32_t K = 0x4b000000u;
    uint32_t wh[8] = {}, wl[6] = {}, kh[8] = {}, kl[6] = {};
    auto pack = [](uint32_t *w4, uint32_t *w3, int r, uint32_t c4, uint32_t c3) {
        const int bh = (int)BH * r, bl = (int)BL * r;
        w4[bh / 32] += c4 << (bh % 32);
        w3[bl / 32] += c3 << (bl % 32);
        if (bl % 32 + (int)BL > 32)
            w3[bl / 32 + 1] += c3 >> (32 - bl % 32);
    };
#pragma unroll
    for (int c = 0; c < 8; c++) {
        float z[8];
        if (sizeof(X) == 4 || rot || scaled) // the row: x, or the floats of a rotated or scaled tile
            d_row8<float>(row, (uint32_t)c, z);
        else
            d_row8<X>(row, (uint32_t)c, z);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int r = 8 * c + i;
            const float dv = __fsub_rn(z[i], cm);
            const uint32_t ch = __float_as_uint(__fmaf_rn(dv, ih, 8388608.0f));
            if (WM) { // the tile's width only, as nibbles (a low tile's codes are below 8: narrowed
                wh[r / 8] += ch << (4 * (r % 8)); // to its 3-bit stream below, d_nib3)
                kh[r / 8] += K << (4 * (r % 8));
                continue;
            }
            const uint32_t cl = __float_as_uint(__fmaf_rn(dv, il, 8388608.0f));
            pack(wh, wl, r, ch, cl);
            pack(kh, kl, r, K, K);
        }
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        wh[i] -= kh[i];
#pragma unroll
    for (int i = 0; i < 6; i++)
        wl[i] -= kl[i];
    const uint32_t fv = hib | ((uint32_t)rot << 1) | ((rot ? piv : 0u) << 2); // hib: window mode's width
    const uint64_t tb = (uint64_t)b * g.n_alloc, t = S_SP_UNIT * u + lane; // the sample's first tile; this one
    if (lane == 0)
        p[g.eg_off + (uint64_t)b * g.n_eg + u] = (uint8_t)(int8_t)et;
    if (!WM) {
        if (!valid)
            return key;
        const uint32_t w14 = (uint32_t)min16 | ((uint32_t)sth << 16);
        const uint32_t w15 = (uint32_t)stl | (fv << 16);
        rec[0] = make_uint4(wh[0], wh[1], wh[2], wh[3]); // the record's planes (S_REC_BLOCK)
        rec[S_SP_UNIT] = make_uint4(wh[4], wh[5], wh[6], wh[7]);
        rec[2u * S_SP_UNIT] = make_uint4(wl[0], wl[1], wl[2], wl[3]);
        rec[3u * S_SP_UNIT] = make_uint4(wl[4], wl[5], w14, w15);
        return key;
    }
    // window mode: the frame itself. Flag byte, fields; the index entry at the unit's first tile
    // when it is one; the unit's codes are one run of the sample's region from hb0 (the high
    // tiles before the unit), placed in the unit's buffer (its rows are read) and written in
    // 8-byte words, consecutive across the warp
    if (valid) {
        p[g.flags_off + tb + t] = (uint8_t)fv;
        *(uint32_t *)(p + g.meta_off + 4 * (tb + t)) = (uint32_t)min16 | ((uint32_t)sth << 16);
    }
    if (lane == 0 && (S_SP_UNIT * u) % CODEC_TAH_IX_TILES == 0u)
        d_put_u32(p + 8 + 4 * ((uint64_t)b * g.ix_n + S_SP_UNIT * u / CODEC_TAH_IX_TILES), hb0);
    const uint32_t hm = __ballot_sync(CU_FULL, hib != 0u);
    const uint32_t o = BL * lane + (uint32_t)__popc((int)(hm & ((1u << lane) - 1u))); // in 8-byte words
    const uint32_t nw = BL * nval + (uint32_t)__popc((int)hm);
    uint64_t *run = (uint64_t *)unit;
    __syncwarp(); // every row read before the buffer holds the run
    if (valid && hib) {
#pragma unroll
        for (int k = 0; k < 4; k++)
            run[o + (uint32_t)k] = (uint64_t)wh[2 * k] | ((uint64_t)wh[2 * k + 1] << 32);
    } else if (valid) { // 8 codes below 8 a word -> 24 bits
        uint32_t v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = d_nib3(wh[k]);
        run[o] = (uint64_t)(v[0] | v[1] << 24) | ((uint64_t)(v[1] >> 8 | v[2] << 16) << 32);
        run[o + 1] = (uint64_t)(v[2] >> 16 | v[3] << 8) | ((uint64_t)(v[4] | v[5] << 24) << 32);
        run[o + 2] = (uint64_t)(v[5] >> 8 | v[6] << 16) | ((uint64_t)(v[6] >> 16 | v[7] << 8) << 32);
    }
    __syncwarp();
    uint64_t *dst = (uint64_t *)(p + g.codes_off + (uint64_t)b * g.code_bytes) + BL * S_SP_UNIT * u + hb0;
    for (uint32_t q = lane; q < nw; q += 32u)
        dst[q] = run[q];
    return key;
}

// tah.c's window rule: the high tiles of a sample (na allocation tiles, n_hi high) before its tile
// t, round(t n_hi / na) halves up, by a multiply-high with the magic of 2 na (exact while the
// numerator times 2 na stays below 2^64: the spec's samples have na < 2^16)
__device__ __forceinline__ uint32_t d_win_hi_before(uint64_t t, uint64_t n_hi, uint64_t na, uint64_t m2na)
{
    return (uint32_t)__umul64hi(2u * t * n_hi + na, m2na); // m2na: s_magic(2 na), s_tg's mW
}

// The entropy keys and each unit's codes right after its keys (d_tah_spec_t64), and no select
// (a unit is an exponent group: k = 1). WM, window mode (g.win == S_SP_UNIT: every unit is one of
// tah.c's windows): each unit's tiles take their widths at once (d_tah_spec_t64's rank) and go
// straight to the frame; no records, keys, bag or histogram. CTA (b, j) starts on sample b; the
// sample's units of 32 tiles go to its P * 4 warps: two rounds in a fixed order (warp w of CTA j:
// units 4P r + 4j + w), then one at a time from the sample's counter (sdone[b]; window mode: one
// counter for the tensor's remaining units, sdone[0]), each claimed when the warp's unit is done, and its copy
// waited for (the other warps fill the wait), so that the last units go to the warps free
// first. (Round 25 claimed the next unit one ahead until the sample's last two rounds, with two
// buffers a warp; claiming at a unit's start with one buffer measured 4 % slower in round 35.
// Until round 24 four rounds were fixed and claims made two units ahead: the last units were
// handed out ~10 us before they ran; cuda/NOTES.md, "Twenty-fifth version".) Keys go to key16 (sample b's at
// b * nk) and, for the CTA's histogram, to a bag in shared memory (lmax / 32 units; past that,
// straight to the sample's histogram). The words the CTAs share: CTA (b, 0) zeroes sample b's
// histogram and counter and tags ztag[b]; every CTA waits for the tag before it uses them. An
// ordinary launch, not a cooperative one (which had kept k_tah_emit's programmatic launch from
// starting before this grid's end; cuda/NOTES.md, "Twenty-sixth version"): a CTA waits only for
// lower-numbered CTAs (here CTA (b, 0); in k_tah_emit's look-back, the sample's CTAs before it), and NVIDIA
// GPUs dispatch a grid's CTAs in increasing order, the property CUB's single-pass scan also
// relies on; the grid is also no larger than fits on the GPU at once.
template <typename X, bool WM>
__global__ void __launch_bounds__(128, S_SP_CTAS) k_tah_spec(const X *__restrict__ x, uint4 *__restrict__ rec,
                                                     uint16_t *__restrict__ key16, uint8_t *__restrict__ p, s_fz z,
                                                     cu_hp head, s_tg g, uint32_t P, uint32_t nk, uint32_t lmax)
{
    d_mark(head);
    if (blockIdx.x == 0)
        d_put_head(p, g, threadIdx.x);
    extern __shared__ __align__(16) uint32_t sk[]; // the bag of keys, then the staging buffers
    __shared__ uint32_t lh[S_SP_LH];
    __shared__ float2 s_mm[S_SP_WARPS][S_SP_UNIT];
    __shared__ uint32_t s_slot;
    const uint32_t tid = threadIdx.x, lane = tid & 31u, wid = tid >> 5, nwarp = blockDim.x >> 5;
    const uint32_t cta = blockIdx.x, b = cta / P, j = cta - b * P;
    const uint32_t na = (uint32_t)g.n_alloc, nUs = (na + S_SP_UNIT - 1u) / S_SP_UNIT, cap = lmax / S_SP_UNIT;
    const bool all = g.n_hi == 0 || g.n_hi == g.n_alloc, wm = WM;
    uint32_t *H = z.hist + (size_t)b * CODEC_TAH_KEY_BINS;
    if (tid == 0)
        s_slot = 0;
    if (j == 0) {
        if (!all && !wm)
            for (uint32_t i = tid; i < CODEC_TAH_KEY_BINS / 2u; i += blockDim.x) // two bins a word
                H[i] = 0;
        if (tid == 0)
            z.sdone[b] = 0;
        d_fence_gpu();
        __syncthreads();
        if (tid == 0)
            *(volatile unsigned long long *)&z.ztag[b] = head.tag;
    }
    __syncthreads();

    bool nonfinite = false;
    float *wb = (float *)(sk + ((lmax + 3u) & ~3u)) + (size_t)wid * S_SP_WARPW;
    const uint32_t w4 = nwarp * j + wid, stride = nwarp * P;
    uint32_t u = w4, ub = b; // the unit and its sample; the two fixed rounds: w4, w4 + stride of sample b
    if (u < nUs)
        d_stage_unit32(wb, x, (uint64_t)ub * na + S_SP_UNIT * u, min(S_SP_UNIT, na - S_SP_UNIT * u), lane);
    // GC (window mode, no per-sample work after the units): the units past the fixed rounds from
    // one counter for the whole tensor, samples interleaved, so that a warp done with its sample's
    // units takes another's (H200: +0.3-0.9 points of copy, bf16 input +0.7-1.3)
    constexpr bool GC = WM;
    const uint32_t zb = GC ? 0u : b, rem = nUs > 2u * stride ? nUs - 2u * stride : 0u;
    // the tags, read at the first iteration and looked at only when needed: a load that waits
    // behind the stream of x takes 2-5 us, and polling at the first claim had stalled every warp
    // (ncu: 6 % of the stall samples)
    unsigned long long tz = 0;
    if (lane == 0)
        tz = *(volatile unsigned long long *)&z.ztag[zb];
    auto claim = [&]() {
        uint32_t c = nUs;
        if (lane == 0) {
            while (tz != head.tag) { // CTA (zb, 0)'s zeroing (done long ago, as a rule)
                __nanosleep(S_POLL_NS);
                tz = *(volatile unsigned long long *)&z.ztag[zb];
            }
            c = atomicAdd(&z.sdone[zb], 1u);
        }
        c = __shfl_sync(CU_FULL, c, 0);
        if (!GC)
            return 2u * stride + c;
        if (c >= (uint32_t)g.B * rem)
            return nUs;
        ub = c % (uint32_t)g.B;
        return 2u * stride + c / (uint32_t)g.B;
    };
    for (uint32_t it = 0; u < nUs; it++) { // uniform per warp
        d_cp_wait0();
        __syncwarp();
        const uint32_t lt = S_SP_UNIT * u + lane;
        const bool valid = lt < na;
        const uint32_t w0 = S_SP_UNIT * u, nval = min(S_SP_UNIT, na - w0);
        const uint32_t hb0 = wm ? d_win_hi_before(w0, g.n_hi, na, g.mW) : 0u;
        const uint32_t share = wm ? d_win_hi_before(w0 + nval, g.n_hi, na, g.mW) - hb0 : 0xffffffffu;
        uint4 *rl = rec + ((size_t)b * nUs + u) * S_REC_BLOCK + lane;
        const uint32_t key = d_tah_spec_t64<X, WM>(wb, s_mm[wid], valid, rl, p, g, lane, ub, u, share, hb0, nval,
                                                   nonfinite);
        if (!wm) {
            if (valid)
                key16[(size_t)b * nk + lt] = (uint16_t)key;
            uint32_t slot = 0;
            if (lane == 0)
                slot = atomicAdd(&s_slot, 1u);
            slot = __shfl_sync(CU_FULL, slot, 0);
            if (slot < cap)
                sk[S_SP_UNIT * slot + lane] = valid ? key : 0xffffffffu;
            else if (valid && !all) { // the bag is full: this unit's keys straight to the histogram
                while (*(volatile unsigned long long *)&z.ztag[b] != head.tag)
                    __nanosleep(S_POLL_NS);
                d_hist_add<true>(H, key, 1u);
            }
        }
        __syncwarp(); // the buffer read (and rewritten by the rotated pass) before its next copies
        u = it == 0u ? u + stride : claim();
        d_stage_unit32(wb, x, (uint64_t)ub * na + S_SP_UNIT * u, u < nUs ? min(S_SP_UNIT, na - S_SP_UNIT * u) : 0u,
                       lane);
        if (lane == 0 && it == 0u && tz != head.tag) // read again, to be current by the first claim
            tz = *(volatile unsigned long long *)&z.ztag[zb];
    }
    if (lane == 0 && nonfinite)
        d_flag(head, CU_ST_NONFINITE);
    if (tid == 0) { // the sample's histogram zeroed before the bag's counts go in
        while (tz != head.tag) {
            __nanosleep(S_POLL_NS);
            tz = *(volatile unsigned long long *)&z.ztag[b];
        }
        d_fence_gpu();
    }
    __syncthreads();
    const uint32_t nbag = S_SP_UNIT * min(s_slot, cap);
    if (!all && nbag != 0u) // the bag's histogram
        d_hist_window<S_SP_LH, true>(sk, nbag, lh, H);
}

// The frame from k_tah_spec's records (window 0): CTA (b, j) writes tiles [512 j, 512 j + 512) of
// sample b. Every CTA finds the sample's threshold T and `need` from its histogram and
// counts its own keys > T and == T, publishes them in cnt[cta] with 36 bits of the call's tag,
// and sums those of the sample's CTAs before it (lower-numbered: k_tah_spec's comment);
// then each thread its two tiles (i = c0 + tid, c0 + 256 + tid): high or low, the high tiles
// before it, and the record's codes of that width into the frame (the fields are the frame's:
// k_tah_spec quantised at the group's exponent and wrote it).
__global__ void __launch_bounds__(256, 4) k_tah_emit(const uint4 *__restrict__ rec, const uint16_t *__restrict__ key16,
                                                  s_fz z, uint8_t *__restrict__ p, cu_hp head, s_tg g, uint32_t PB,
                                                  uint32_t nk)
{
    constexpr uint32_t BH = 4u, BL = 3u;
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory"); // k_tah_spec done, its writes visible
#endif
    __shared__ uint32_t ws[32], sh_T, sh_need, sh_pre, sh_end;
    __shared__ __align__(16) uint64_t srun[S_EM_TILES * 4u]; // the CTA's codes (32 bytes a tile at most)
    const uint32_t tid = threadIdx.x, lane = tid & 31u;
    if (tid == 0) {
        sh_pre = 0;
        sh_end = 0; // before the block scans' barriers below
    }
    const uint32_t b = blockIdx.x / PB, j = blockIdx.x - b * PB;
    const uint32_t n = (uint32_t)g.n_alloc, c0 = j * S_EM_TILES;
    const uint64_t tb = (uint64_t)b * n; // the sample's first tile
    const bool all = g.n_hi == 0 || g.n_hi == g.n_alloc;
    const uint32_t nu = (n + S_SP_UNIT - 1u) / S_SP_UNIT;
    const uint4 *rb = rec + ((size_t)b * nu + c0 / S_SP_UNIT) * S_REC_BLOCK; // the CTA's blocks
    // the keys first; the records (13 MB in all) only once the counts are published, so that
    // their reads do not queue ahead of the histogram's and the counts' (2 us, H100)
    uint32_t key[2] = {};
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const uint32_t i = c0 + 256u * (uint32_t)s + tid;
        key[s] = i < n ? __ldcg(&key16[(size_t)b * nk + i]) : 0u;
    }
    uint32_t T = 0, need = 0;
    if (!all) {
        d_tah_threshold<true>(z.hist + (size_t)b * CODEC_TAH_KEY_BINS, (uint32_t)g.n_hi, ws, &sh_T, &sh_need);
        __syncthreads();
        T = sh_T;
        need = sh_need;
    }
    // this CTA's (keys > T) | (keys == T) << 16 per thread and in all (at most 512 of each)
    uint32_t cs[2], xs0[2], ctot = 0;
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const bool ok = c0 + 256u * (uint32_t)s + tid < n;
        cs[s] = ok && !all ? (uint32_t)(key[s] > T) | ((uint32_t)(key[s] == T) << 16) : 0u;
        uint32_t tot;
        xs0[s] = ctot + d_block_scan(cs[s], ws, &tot);
        ctot += tot;
    }
    if (!all) { // published with the tag; the sample's CTAs before this one summed
        const unsigned long long tag36 = head.tag & 0xfffffffffull;
        if (tid == 0)
            *(volatile unsigned long long *)&z.cnt[blockIdx.x] =
                (tag36 << 28) | ((unsigned long long)(ctot >> 16) << 14) | (ctot & 0x3fffu);
    }
    unsigned long long pv = 0; // the predecessor's slot of this thread, first read
    if (!all && tid < j)
        pv = *(volatile unsigned long long *)&z.cnt[(size_t)b * PB + tid];
    asm volatile("" ::: "memory"); // the record loads after the publication
    // each thread's two records, plane by plane: a warp's loads are 512 consecutive bytes (a
    // warp's 32 tiles are one block of records: c0 and 256 are multiples of S_SP_UNIT)
    // (the planes of the width a tile cannot take are not loaded: 4-bit codes for keys below T,
    // 3-bit codes above it)
    uint4 r[2][4];
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const uint32_t i = c0 + 256u * (uint32_t)s + tid;
        const bool mh = all ? g.n_hi != 0 : key[s] >= T;
        const bool ml = all ? g.n_hi == 0 : key[s] <= T;
#pragma unroll
        for (int m = 0; m < 4; m++)
            r[s][m] = i < n && (m == 3 || (m < 2 ? mh : ml))
                          ? __ldcg(&rb[(256u * (uint32_t)s + tid - lane) / S_SP_UNIT * S_REC_BLOCK + S_SP_UNIT * (uint32_t)m + lane])
                          : make_uint4(0u, 0u, 0u, 0u);
    }
    // the CTA's codes are one run of the sample's region, from the code offset of tile c0: each
    // thread puts its tiles' codes in shared memory at their place in the run (hl: the run's
    // high tiles before the tile), then the CTA writes the run in 8-byte words, consecutive per
    // warp (the tiles' own 24 or 32 bytes, 8-byte stores 24 to 32 bytes apart across a warp, had
    // cost ~5 us more, H100). Only a tile at T needs the ties before the run (preE) to know
    // its width; a CTA without one places its run while the counts before it arrive.
    uint32_t hls[2];
    auto place = [&](uint32_t preE) {
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const uint32_t i = c0 + 256u * (uint32_t)s + tid;
            const bool ok = i < n;
            const uint32_t E = preE + (xs0[s] >> 16);
            bool hi;
            uint32_t hl;
            if (all) {
                hi = g.n_hi != 0;
                hl = hi ? i - c0 : 0u;
            } else {
                hi = key[s] > T || (key[s] == T && E < need);
                hl = (xs0[s] & 0xffffu) + min(E, need) - min(preE, need);
            }
            const uint32_t w14 = r[s][3].z, w15 = r[s][3].w;
            const uint32_t o = 8u * (BL * (i - c0) + (BH - BL) * hl); // in the run
            if (ok) {
                atomicMax(&sh_end, o + 8u * (hi ? BH : BL)); // the run's end
                uint64_t *dst = (uint64_t *)((uint8_t *)srun + o);
                if (hi) {
                    dst[0] = (uint64_t)r[s][0].x | ((uint64_t)r[s][0].y << 32);
                    dst[1] = (uint64_t)r[s][0].z | ((uint64_t)r[s][0].w << 32);
                    dst[2] = (uint64_t)r[s][1].x | ((uint64_t)r[s][1].y << 32);
                    dst[3] = (uint64_t)r[s][1].z | ((uint64_t)r[s][1].w << 32);
                } else {
                    dst[0] = (uint64_t)r[s][2].x | ((uint64_t)r[s][2].y << 32);
                    dst[1] = (uint64_t)r[s][2].z | ((uint64_t)r[s][2].w << 32);
                    dst[2] = (uint64_t)r[s][3].x | ((uint64_t)r[s][3].y << 32);
                }
                *(uint32_t *)(p + g.meta_off + 4 * (tb + i)) = (w14 & 0xffffu) | ((hi ? w14 >> 16 : w15 & 0xffffu) << 16);
                p[g.flags_off + tb + i] = (uint8_t)((hi ? 1u : 0u) | ((w15 >> 16) & 0xfeu));
            }
            hls[s] = hl;
        }
    };
    const bool local = all || (ctot >> 16) == 0u; // no tile of this CTA at T
    if (local)
        place(0u);
    uint32_t pre = 0; // (> T) | (== T) << 16 before c0 (a sample has < 2^16 keys)
    if (!all) { // the predecessors' counts (read above; again until they are this call's)
        const unsigned long long tag36 = head.tag & 0xfffffffffull;
        uint32_t pc = 0;
        for (uint32_t i = tid; i < j; i += blockDim.x) {
            unsigned long long v = i == tid ? pv : *(volatile unsigned long long *)&z.cnt[(size_t)b * PB + i];
            while ((v >> 28) != tag36) {
                __nanosleep(S_POLL_NS);
                v = *(volatile unsigned long long *)&z.cnt[(size_t)b * PB + i];
            }
            pc += ((uint32_t)v & 0x3fffu) | ((((uint32_t)v >> 14) & 0x3fffu) << 16);
        }
        pc = __reduce_add_sync(CU_FULL, pc);
        if (lane == 0 && pc != 0u)
            atomicAdd(&sh_pre, pc);
        __syncthreads();
        pre = sh_pre;
        if (!local)
            place(pre >> 16);
    }
    const uint32_t hq0 = all ? (g.n_hi != 0 ? c0 : 0u) : (pre & 0xffffu) + min(pre >> 16, need);
    const uint64_t cb = 8ull * ((uint64_t)BL * c0 + (uint64_t)(BH - BL) * hq0); // the run's offset
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const uint32_t i = c0 + 256u * (uint32_t)s + tid;
        if (i < n && i % CODEC_TAH_IX_TILES == 0u) // the index entry at this tile
            d_put_u32(p + 8 + 4 * ((uint64_t)b * g.ix_n + i / CODEC_TAH_IX_TILES), hq0 + hls[s]);
    }
    __syncthreads();
    {
        const uint64_t *src = (const uint64_t *)srun;
        uint64_t *dst = (uint64_t *)(p + g.codes_off + b * g.code_bytes + cb);
        for (uint32_t q = tid; q < sh_end / 8u; q += blockDim.x)
            dst[q] = src[q];
    }
    // the records are not read again: their L2 lines go without a write-back (13 MB of the
    // bench tensor's would otherwise reach DRAM while the frame is written: 2 us). The CTA's
    // blocks of records are its own: each thread drops one 128-byte line once all are used.
    __syncthreads();
    if (tid < (min(c0 + S_EM_TILES, n) - c0 + S_SP_UNIT - 1u) / S_SP_UNIT * (S_REC_BLOCK / 8u))
        asm volatile("discard.global.L2 [%0], 128;" ::"l"(rb + 8u * tid) : "memory");
}

__global__ void __launch_bounds__(256) k_tah_flags(const uint16_t *__restrict__ flagv, uint8_t *__restrict__ p,
                                                   s_tg g)
{
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t y = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; y < g.flags_bytes; y += stride) {
        const uint64_t bit0 = 8 * y;
        const uint64_t t0 = bit0 / g.fbits, t1 = (bit0 + 7) / g.fbits;
        uint32_t byte = 0;
        for (uint64_t t = t0; t <= t1 && t < g.T; t++) {
            const int64_t sh = (int64_t)(t * g.fbits) - (int64_t)bit0;
            const uint32_t f = flagv[t];
            byte |= sh >= 0 ? (f << sh) : (f >> -sh);
        }
        p[g.flags_off + y] = (uint8_t)byte;
    }
}

// ---- decode ----

// Decode one lane's 8 codes of a tile segment: min + code * step, then,
// when the tile was rotated (rot; the warp must be converged: the
// transform shuffles), the inverse transform (normalised FWHT, then the
// pivot swap back with piv). Lanes of unrotated tiles take part in the
// shuffles and keep their values.
__device__ __forceinline__ void d_tah_dequant(const uint32_t code[8], float minf, float step, bool rot, uint32_t piv,
                                              uint32_t lane, uint32_t tl, uint32_t tpg, float norm, float v[8])
{
#pragma unroll
    for (int r = 0; r < 8; r++)
        v[r] = __fadd_rn(minf, __fmul_rn((float)code[r], step));
    if (__any_sync(CU_FULL, rot)) {
        float z[8];
#pragma unroll
        for (int r = 0; r < 8; r++)
            z[r] = v[r];
        d_fwht_seg(z, lane, tpg);
#pragma unroll
        for (int r = 0; r < 8; r++)
            z[r] = __fmul_rn(z[r], norm);
        d_swap0(z, lane, tl, tpg, rot ? piv : 0u);
        if (rot) {
#pragma unroll
            for (int r = 0; r < 8; r++)
                v[r] = z[r];
        }
    }
}

// ---- decode, chunked ----
//
// The code offset of quant tile t of sample b is G/8 * (bl * t + (bh - bl) * H(t)),
// H(t) = the high quant tiles before t in the sample (tah.c's layout). Two
// launches, both over the whole GPU:
//   k_tah_dcount: one warp per chunk of CH consecutive quant tiles of a
//     sample: its high quant tiles (low word) and high allocation tiles
//     (high word) -> cnt[chunk]; every flag check of tah.c's decoder (reserved
//     pivot bits, one high bit per allocation tile, e and the reserved word).
//   k_tah_dchunk: one CTA per chunk. Warp 0 sums the sample's earlier chunk
//     counts (the last chunk also checks the sample's high allocation tiles
//     against n_hi); one block scan of the chunk's flags gives H per tile
//     (shared memory); then each warp decodes S_DEC_U passes of 32/tpg tiles,
//     all passes' meta and code loads issued before the first use:
//
//       CTA (chunk of CH tiles) | warp 0: tiles 0..U*spw-1 | warp 1: ... |
//       warp pass u             | seg 0: tile u*spw | seg 1: tile u*spw+1 | ...
//       segment (tpg lanes)     | lane tl: elements 8tl..8tl+7

// n (<= 8) bytes at src, little-endian, from the aligned words that hold
// them (1-3 32-bit loads; the words never leave the 4-byte-aligned span
// around the bytes, so they stay inside the allocation).
__device__ __forceinline__ uint64_t d_load_upto8(const uint8_t *src, uint32_t n)
{
    const uintptr_t a = (uintptr_t)src;
    const uint32_t *w = (const uint32_t *)(a & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)(a & 3u) * 8u;
    const uint32_t nw = ((uint32_t)(a & 3u) + n + 3u) / 4u;
    const uint32_t w0 = w[0];
    const uint32_t w1 = nw > 1u ? w[1] : 0u;
    const uint32_t w2 = nw > 2u ? w[2] : 0u;
    uint64_t v = ((uint64_t)w0 | ((uint64_t)w1 << 32)) >> sh;
    if (sh != 0u)
        v |= (uint64_t)w2 << (64u - sh);
    return n < 8u ? v & ((1ull << (8u * n)) - 1ull) : v;
}

__global__ void __launch_bounds__(256) k_tah_dcount(const uint8_t *__restrict__ p, unsigned long long *__restrict__ cnt,
                                                    cu_hp head, s_tg g, uint32_t CH, uint32_t cps)
{
    d_mark(head);
    const uint32_t lane = threadIdx.x & 31u;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * blockDim.x / 32u;
    const uint8_t *flags = p + g.flags_off;
    const uint32_t SQ = (uint32_t)(g.S * g.Q);
    uint32_t corrupt = 0;
    if (blockIdx.x == 0 && threadIdx.x == 0) // the reserved words (exponents: k_tah_dchunk, at each tile)
        corrupt |= (uint32_t)(d_get_u32(p) != 0 || d_get_u32(p + 4) != 0);
    for (uint64_t c = warp; c < g.B * cps; c += nwarps) {
        const uint64_t b = c / cps;
        const uint32_t t0 = (uint32_t)(c - b * cps) * CH;
        const uint32_t n = min(CH, SQ - t0);
        const uint64_t tb = b * SQ + t0;
        uint32_t hq = 0, ha = 0;
#pragma unroll 4
        for (uint32_t i = lane; i < n; i += 32u) {
            const uint64_t tile = tb + i;
            const uint32_t f = d_get_bits(flags, tile * g.fbits, g.fbits);
            const uint32_t ts = t0 + i, qq = ts - d_div32(ts, g.Q, g.mQ) * g.Q;
            const uint32_t qk = g.k > 1u ? qq % g.k : 0u; // quant tile within its allocation tile
            corrupt |= (uint32_t)(!(f & 2u) && (f >> 2) != 0);
            if (qk != 0u)
                corrupt |= (d_get_bits(flags, (tile - qk) * g.fbits, g.fbits) ^ f) & 1u;
            hq += f & 1u;
            ha += (f & 1u) & (uint32_t)(qk == 0u);
        }
        hq = __reduce_add_sync(CU_FULL, hq);
        ha = __reduce_add_sync(CU_FULL, ha);
        if (lane == 0)
            cnt[c] = (unsigned long long)hq | ((unsigned long long)ha << 32);
    }
    if (corrupt)
        d_flag(head, CU_ST_CORRUPT);
}

// This thread's share of the high tiles among flag bytes fs[0 .. t) (bit 0 of byte t is
// tile t's width): 16-byte loads after an aligning head, strided over the CTA (round 7).
__device__ __forceinline__ uint32_t d_count_hi(const uint8_t *fs, uint32_t t)
{
    const uint32_t tid = threadIdx.x;
    uint32_t c = 0;
    const uint32_t hd = min((uint32_t)((16u - ((uintptr_t)fs & 15u)) & 15u), t); // bytes to a 16-byte boundary
    if (tid < hd)
        c += fs[tid] & 1u;
    const uint4 *f4 = (const uint4 *)(fs + hd);
    const uint32_t nv = (t - hd) / 16u;
#pragma unroll 4
    for (uint32_t j = tid; j < nv; j += blockDim.x) {
        const uint4 w = f4[j];
        c += __popc(w.x & 0x01010101u) + __popc(w.y & 0x01010101u) + __popc(w.z & 0x01010101u) +
             __popc(w.w & 0x01010101u);
    }
    for (uint32_t j = hd + 16u * nv + tid; j < t; j += blockDim.x)
        c += fs[j] & 1u;
    return c;
}

// BH, BL: the code widths when known at compile time (0: g.bh, g.bl); TPG: tile/8 likewise
// (round 6: the segment loops of the rotation unroll)
// SELF (round 7; tile 64 with alloc_tile 64, fbits 8, S*Q < 2^16): one launch, no
// k_tah_dcount: each CTA counts the high tiles before its chunk itself, from the
// sample's flag bytes (bit 0 of byte t is tile t's width: 16-byte loads of at most
// 25 KB per CTA, from L2), and makes k_tah_dcount's checks for its own tiles (no
// pivot without rotation; e in range and the reserved word 0 on thread 0; the
// sample's last chunk: the sample's high tiles equal n_hi). The count rides in the
// high 16 bits of the chunk's block scan.
template <uint32_t BH, uint32_t BL, uint32_t TPG, bool SELF>
__global__ void __launch_bounds__(256) k_tah_dchunk(const uint8_t *__restrict__ p,
                                                    const unsigned long long *__restrict__ cnt,
                                                    float *__restrict__ out, cu_hp head, s_tg g, uint32_t CH,
                                                    uint32_t cps)
{
    d_mark(head);
    __shared__ uint32_t s_h[S_DEC_MAXCH];  // H(tile): high quant tiles of the sample before it
    __shared__ uint16_t s_f[S_DEC_MAXCH];  // the tile's flag field
    __shared__ uint32_t ws[32];
    __shared__ uint32_t s_base;
    const uint32_t tid = threadIdx.x, lane = tid & 31u, wid = tid / 32u;
    const uint32_t bh = BH ? BH : g.bh, bl = BH ? BL : g.bl;
    const uint64_t b = blockIdx.x / cps;
    const uint32_t ci = (uint32_t)(blockIdx.x - b * cps);
    const uint32_t SQ = (uint32_t)(g.S * g.Q), t0 = ci * CH, n = min(CH, SQ - t0);
    const uint8_t *flags = p + g.flags_off;
    uint32_t corrupt = 0, bad = 0;
    uint32_t pre = 0; // SELF: this thread's share of the sample's high tiles before the chunk
    if (SELF) {
        if (tid == 0) // the reserved words (!SELF: k_tah_dcount)
            corrupt |= (uint32_t)(d_get_u32(p) != 0 || d_get_u32(p + 4) != 0);
        pre = d_count_hi(flags + b * SQ, t0);
    }
    if (!SELF && wid == 0) { // the sample's high quant tiles before this chunk
        const unsigned long long *cb = cnt + b * cps;
        unsigned long long acc = 0;
#pragma unroll 4
        for (uint32_t j = lane; j < ci; j += 32u)
            acc += cb[j];
        for (int o = 16; o > 0; o /= 2)
            acc += __shfl_xor_sync(CU_FULL, acc, o);
        if (lane == 0) {
            s_base = (uint32_t)acc;
            if (ci == cps - 1u && ((acc + cb[ci]) >> 32) != g.n_hi)
                corrupt = 1; // the sample's high allocation tiles
        }
    }
    // flags of the chunk; thread tid owns tiles tid*per .. tid*per+per-1
    const uint32_t per = (CH + blockDim.x - 1u) / blockDim.x; // <= 4
    uint32_t fl[4], hq = 0;
#pragma unroll
    for (uint32_t j = 0; j < 4u; j++) {
        const uint32_t i = tid * per + j;
        fl[j] = (j < per && i < n) ? d_get_bits(flags, (b * SQ + t0 + i) * g.fbits, g.fbits) : 0u;
        hq += fl[j] & 1u;
        if (SELF)
            corrupt |= (uint32_t)(!(fl[j] & 2u) && (fl[j] >> 2) != 0); // a pivot without rotation
    }
    uint32_t hq_total, run;
    if (SELF) { // low 16 bits: the chunk's high tiles (<= CH); high: the count before the chunk (< 2^16)
        uint32_t tot;
        const uint32_t sc = d_block_scan(hq | (pre << 16), ws, &tot);
        hq_total = tot & 0xffffu;
        run = (sc & 0xffffu) + (tot >> 16);
        if (tid == 0 && ci == cps - 1u && (uint64_t)((tot >> 16) + hq_total) != g.n_hi)
            corrupt = 1; // the sample's high tiles
    } else {
        run = d_block_scan(hq, ws, &hq_total);
        run += s_base; // after the scan's barriers, which publish warp 0's store
    }
#pragma unroll
    for (uint32_t j = 0; j < 4u; j++) {
        const uint32_t i = tid * per + j;
        if (j < per && i < CH) {
            s_h[i] = run;
            s_f[i] = (uint16_t)fl[j];
            if (i < n && (t0 + i) % CODEC_TAH_IX_TILES == 0u) // the index entry at this tile
                corrupt |= (uint32_t)(d_get_u32(p + 8 + 4 * (b * g.ix_n + (t0 + i) / CODEC_TAH_IX_TILES)) != run);
            run += fl[j] & 1u;
        }
    }
    __syncthreads();

    const uint32_t tpg = TPG ? TPG : g.G / 8u, spw = 32u / tpg, seg = lane / tpg, tl = lane % tpg;
    const uint32_t i_w = wid * S_DEC_U * spw + seg; // this lane's tile in pass 0
    const uint8_t *codes = p + g.codes_off + b * g.code_bytes;
    uint32_t meta[S_DEC_U], fv[S_DEC_U];
    int32_t ev[S_DEC_U]; // the tiles' exponents
    uint64_t word[S_DEC_U];
#pragma unroll
    for (uint32_t u = 0; u < S_DEC_U; u++) { // every pass's loads first
        const uint32_t i = i_w + u * spw;
        const bool valid = i < n;
        const uint32_t f = valid ? s_f[i] : 0u;
        const uint32_t bits = (f & 1u) ? bh : bl;
        const uint64_t off = (uint64_t)tpg * ((uint64_t)bl * (t0 + i) + (uint64_t)(bh - bl) * (valid ? s_h[i] : 0u));
        const bool in = valid && off + (uint64_t)tpg * bits <= g.code_bytes;
        corrupt |= (uint32_t)(valid && !in); // offsets from flags that failed k_tah_dcount's checks
        fv[u] = f;
        meta[u] = valid ? d_get_u32(p + g.meta_off + 4 * (b * SQ + t0 + i)) : 0u;
        const uint32_t ts = valid ? t0 + i : 0u, s = d_div32(ts, g.Q, g.mQ);
        ev[u] = valid ? (int32_t)(int8_t)p[g.eg_off + d_group(g, b, s, ts - s * g.Q)] : 0;
        corrupt |= (uint32_t)(ev[u] < -126);
        word[u] = in ? d_load_upto8(codes + off + (uint64_t)tl * bits, bits) : 0ull;
    }
#pragma unroll
    for (uint32_t u = 0; u < S_DEC_U; u++) {
        const uint32_t i = i_w + u * spw;
        const bool valid = i < n;
        const uint32_t f = fv[u];
        const uint16_t min16 = (uint16_t)meta[u], step16 = (uint16_t)(meta[u] >> 16);
        corrupt |= (uint32_t)(valid && ((min16 & 0x7c00u) == 0x7c00u || (step16 & 0x7c00u) == 0x7c00u ||
                                        (step16 & 0x8000u)));
        const float minf = ldexpf(d_half_to_f32(min16), ev[u]);
        const float step = ldexpf(d_half_to_f32(step16), ev[u]);
        uint32_t code[8];
        if (BH) {
            if (f & 1u)
                d_unpack8(word[u], 0ull, BH, code);
            else
                d_unpack8(word[u], 0ull, BL, code);
        } else {
            d_unpack8(word[u], 0ull, (f & 1u) ? bh : bl, code);
        }
        float v[8];
        d_tah_dequant(code, minf, step, valid && (f & 2u), f >> 2, lane, tl, tpg, g.norm, v);
        const uint32_t ts = t0 + i, s = d_div32(ts, g.Q, g.mQ), q = ts - s * g.Q;
        const uint32_t w = g.C - q * g.G < g.G ? g.C - q * g.G : g.G;
        if (valid && 8u * tl < w) {
            const uint32_t m = w - 8u * tl < 8u ? w - 8u * tl : 8u;
#pragma unroll
            for (int r = 0; r < 8; r++)
                bad |= (uint32_t)((uint32_t)r < m && d_nonfinite(v[r]));
            d_store8(out, (b * g.S + s) * g.C + (uint64_t)q * g.G + 8u * tl, m, g.vec, v);
        }
    }
    if (corrupt)
        d_flag(head, CU_ST_CORRUPT);
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

// TAH decode with a lane pair per tile (round 8; tile = alloc_tile = 64, 4/3 bits, C % 64
// == 0, 8-bit flags: full tiles). Round 19 (frame version 3): a CTA of 8 warps decodes 128 R
// consecutive tiles of one sample, warp w the R rounds of 16 from tile 16 R (8 j + w) (lanes
// l and l + 16: tile l of the round, lane h elements 32h..32h+31). No CTA waits for another
// and none counts the sample's flags before it, so the grid is as many CTAs as that takes
// and the hardware balances them (rounds 8-18 had a resident grid of one run per CTA,
// each CTA counting up to a whole sample's flags first: 0.0289 -> 0.0252 ms, H100):
//   - the high tiles of the sample before the warp's first tile: the index entry of its
//     block of 128 and the flag bytes between (fewer than 128); then a ballot per round
//     gives H(tile);
//   - codes (lane h: 16 bytes at 16h of a high tile, 12 at 12h of a low one, 32-bit
//     loads from the 8-aligned tile start 8 (3 tile + H); low codes spread to nibbles
//     so one dequant loop serves both widths; the code floats by byte permutes), meta,
//     min + code * step, the inverse rotation of the warp's rotated tiles on their
//     shared-memory rows (below); a round's code words are fetched one round ahead, its
//     flag and meta words two (round 11);
//   - the 64 floats through shared memory, then per warp 8 stores of 512 contiguous
//     bytes. A row of 17 float4 holds a tile: a quarter warp's 16-byte stores (8 tiles)
//     and loads (8 chunks of one row) hit 8 bank groups.
// The checks of k_tah_dchunk<SELF>: e and the reserved word, no pivot without rotation,
// the sample's high tiles equal n_hi (the warp that ends the sample), each index entry
// (entry 0 is 0; the warp that ends an entry's block of 128 checks the next one, so by
// induction every entry is the count it names), codes inside the sample's region, fp16
// fields finite with a non-negative step; non-finite output flags NONFINITE (an
// unrotated tile is checked only when codes 0 and 15 bound it beyond FLT_MAX: the value
// is monotonic in the code).
#define S_DT_ROW 17u // float4 per shared-memory row
#define S_DT_RUNW 128u // 8-byte words of a window's codes (32 tiles of at most 4 words)
#define S_DT_SMEM (8u * 16u * S_DT_ROW * 16u + 8u * 8u * S_DT_RUNW) // 8 warps: 16 tiles each, a window's codes

template <uint32_t BH, uint32_t BL, uint32_t R>
__global__ void __launch_bounds__(256, 4) k_tah_dw64(const uint8_t *__restrict__ p, float *__restrict__ out,
                                                     cu_hp head, s_tg g, uint32_t P)
{
    d_mark(head);
    extern __shared__ float4 s_rows[]; // [8 warps x 16 tiles][S_DT_ROW]
    const uint32_t tid = threadIdx.x, lane = tid & 31u, wid = tid / 32u, h = d_half(lane);
    const uint64_t b = blockIdx.x / P;
    const uint32_t j = (uint32_t)(blockIdx.x - b * P);
    const uint32_t SQ = (uint32_t)(g.S * g.Q);
    const uint8_t *fs = p + g.flags_off + b * SQ; // byte t: tile t's flag field
    const uint32_t *ix = (const uint32_t *)(p + 8) + b * g.ix_n; // the sample's index (4-aligned: host)
    uint32_t corrupt = 0, bad = 0;
    // warp wid's R rounds [w0, w1): tiles 16 R wid .. of the CTA's 128 R
    const uint32_t w0 = 16u * R * (8u * j + wid), w1 = min(SQ, w0 + 16u * R);
    if (w0 >= w1)
        return; // no CTA barrier below
    const uint32_t lt = lane & 15u; // the pair's tile in a round
    const uint32_t *mw = (const uint32_t *)(p + g.meta_off) + b * SQ; // 4-byte aligned (host)
    // Round 38: the warp's tiles [w0, w1) are one window of tah.c's window rule at its default of
    // 32 (w0 is a multiple of 32), so the default encoder put h(w0) = round(w0 n_hi / SQ) high
    // tiles before them and the window's codes are the 8-byte words [sb, sb + nw) of the sample's
    // region. Those are copied to the warp's shared buffer now, beside the flag, meta and index
    // loads, instead of after the count of high tiles (two dependent DRAM trips: a fifth of the
    // kernel's stall samples in round 27, 39 % in round 38's profile). The bounds come from the
    // geometry alone (h(w1) <= n_hi), so the copies stay inside the sample's region, and the
    // buffer holds exactly the frame's words [sb, sb + nw): a lane whose code words lie there
    // reads the same bytes from it as from global memory, whatever the frame holds. The count
    // checks the prediction (spec below) only so that a frame encoded otherwise (window 0) goes
    // to global memory without the test.
    uint64_t *rb = (uint64_t *)(s_rows + 8u * 16u * S_DT_ROW) + (size_t)wid * S_DT_RUNW;
    const bool pred = SQ < 65536u; // d_win_hi_before exact
    uint32_t hs0 = 0, sb = 0, nw = 0;
    if (pred) {
        hs0 = d_win_hi_before(w0, g.n_hi, SQ, g.mW);
        const uint32_t hs1 = d_win_hi_before(w1, g.n_hi, SQ, g.mW);
        sb = BL * w0 + (BH - BL) * hs0;
        nw = BL * (w1 - w0) + (BH - BL) * (hs1 - hs0); // <= S_DT_RUNW
        const uint64_t *src = (const uint64_t *)(p + g.codes_off + b * g.code_bytes) + sb + lane;
#pragma unroll
        for (uint32_t k = 0; k < S_DT_RUNW / 32u; k++)
            if (lane + 32u * k < nw)
                d_cp8(rb + lane + 32u * k, src + 32u * k);
        d_cp_commit();
    }
    bool spec = false; // the prediction held: fetch reads the codes from rb
    // tile t0 + lt's flag and meta words (0 past the warp's run); the first round's are loaded
    // before the count below, which they do not need
    auto flag_meta = [&](uint32_t t0, uint32_t &f, uint32_t &meta) {
        const bool v = t0 + lt < w1;
        f = v ? fs[t0 + lt] : 0u;
        meta = v ? mw[t0 + lt] : 0u;
    };
    uint32_t f0, m0, f1, m1; // rounds 0 and 1
    flag_meta(w0, f0, m0);
    flag_meta(w0 + 16u, f1, m1);
    // the sample's high tiles before w0: the index entry at or before it and the flags between
    // (fewer than 128: a byte per lane, up to 4 per lane)
    const uint32_t k0 = w0 / CODEC_TAH_IX_TILES, nb = w0 - CODEC_TAH_IX_TILES * k0;
    const uint32_t ix0 = ix[k0];
    uint32_t c = 0;
#pragma unroll
    for (uint32_t q = 0; q < CODEC_TAH_IX_TILES / 32u; q++)
        c += lane + 32u * q < nb ? fs[CODEC_TAH_IX_TILES * k0 + lane + 32u * q] & 1u : 0u;
    uint32_t run = ix0 + __reduce_add_sync(CU_FULL, c); // high tiles before the next round
    spec = pred && run == hs0; // warp-uniform
    if (w0 == 0u && lane == 0)
        corrupt |= (uint32_t)(ix0 != 0u); // each later entry is checked where its block ends (below)
    // a round's flag, meta word and raw code words, fetched one round ahead: the next
    // round's ballot and loads are issued before this round's arithmetic
    struct s_fetch {
        uint32_t f, meta, w[4];
        int32_t e; // the tile's exponent (its group's: k = 1)
        bool in;
    };
    auto fetch = [&](uint32_t t0, uint32_t f, uint32_t meta) { // f, meta: flag_meta(t0)
        s_fetch r;
        const bool valid = t0 + lt < w1;
        r.f = f;
        corrupt |= (uint32_t)(!(r.f & 2u) && (r.f >> 2) != 0); // a pivot without rotation
        const uint32_t hm = __ballot_sync(CU_FULL, h == 0 && (r.f & 1u)); // bit k: round tile k is high
        const uint32_t H = run + (uint32_t)__popc((int)(hm & ((1u << lt) - 1u)));
        run += (uint32_t)__popc((int)hm);
        const uint32_t ts = t0 + lt;
        const uint64_t off = 8ull * ((uint64_t)BL * ts + (uint64_t)(BH - BL) * H);
        const bool hi = r.f & 1u;
        r.in = valid && off + 8ull * (hi ? BH : BL) <= g.code_bytes;
        corrupt |= (uint32_t)(valid && !r.in);
        r.meta = r.in ? meta : 0u;
        r.e = valid ? (int32_t)(int8_t)p[g.eg_off + b * g.n_eg + ts / CODEC_TAH_EXP_TILES] : 0;
        corrupt |= (uint32_t)(r.e < -126);
#pragma unroll
        for (int k = 0; k < 4; k++)
            r.w[k] = 0;
        if (r.in) {
            const uint32_t wo = (uint32_t)(off / 8u) - sb; // in rb (wraps below sb: outside)
            if (spec && wo < nw && nw - wo >= (hi ? BH : BL)) {
                const uint32_t *s4 = (const uint32_t *)(rb + wo) + (hi ? 4u : 3u) * h;
#pragma unroll
                for (int k = 0; k < 3; k++)
                    r.w[k] = s4[k];
                if (hi)
                    r.w[3] = s4[3];
            } else {
                const uint8_t *src = p + g.codes_off + b * g.code_bytes + off;
                const uint32_t *s4 = (const uint32_t *)(src + (hi ? 16u : 12u) * h);
#pragma unroll
                for (int k = 0; k < 3; k++)
                    r.w[k] = s4[k];
                if (hi)
                    r.w[3] = s4[3];
            }
        }
        return r;
    };
    if (pred) { // the window's codes in rb, visible to the warp
        d_cp_wait0();
        __syncwarp();
    }
    s_fetch cur = fetch(w0, f0, m0);
    if (blockIdx.x == 0 && tid == 0) // the reserved words
        corrupt |= (uint32_t)(d_get_u32(p) != 0 || d_get_u32(p + 4) != 0);
    for (uint32_t t0 = w0; t0 < w1; t0 += 16u) { // rounds of 16 tiles, uniform per warp
        s_fetch nxt = cur;
        if (t0 + 16u < w1) { // uniform
            // the flag and meta words two rounds ahead, so the next round's ballot does not
            // wait for a load issued in this round
            uint32_t f2, m2;
            flag_meta(t0 + 32u, f2, m2);
            nxt = fetch(t0 + 16u, f1, m1);
            f1 = f2;
            m1 = m2;
        }
        const uint32_t f = cur.f, meta = cur.meta;
        const bool in = cur.in, hi = f & 1u;
        // a tile outside the sample's code region (corrupt) has meta and code words 0 from
        // fetch: it decodes as zeros (0 + c * 0) through the same path, unrotated
        float v[32];
        bool rot;
        { // pair-uniform
            // this lane's 32 codes as 4 words of nibbles: BH = 4 bits are that already; BL = 3
            // bits (12 bytes) spread 24 bits (8 codes) per word in three mask-and-shift steps
            uint32_t w[4];
            if (hi) {
#pragma unroll
                for (int k = 0; k < 4; k++)
                    w[k] = cur.w[k];
            } else {
                const uint32_t a = cur.w[0], c = cur.w[1], d = cur.w[2];
                const uint32_t u[4] = { a & 0xffffffu, (a >> 24) | ((c & 0xffffu) << 8), (c >> 16) | ((d & 0xffu) << 16),
                                        d >> 8 };
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    uint32_t x = (u[k] & 0xfffu) | ((u[k] & 0xfff000u) << 4);     // 4 fields | 4 fields << 16
                    x = (x & 0x003f003fu) | ((x & 0x0fc00fc0u) << 2);             // pairs into bytes
                    w[k] = (x & 0x07070707u) | ((x & 0x38383838u) << 1);          // fields into nibbles
                }
            }
            const uint16_t min16 = (uint16_t)meta, step16 = (uint16_t)(meta >> 16);
            corrupt |= (uint32_t)(in && ((min16 & 0x7c00u) == 0x7c00u || (step16 & 0x7c00u) == 0x7c00u || (step16 & 0x8000u)));
            const float minf = d_ldexpf(d_half_to_f32(min16), cur.e);
            const float step = d_ldexpf(d_half_to_f32(step16), cur.e);
            // min + code * step in one rounding (an FMA) where code * step is exact: a normal step
            // (an fp16 value scaled by 2^e: at most 11 significant bits) times a code below 16 has at
            // most 15, and stays finite for steps up to 2^124; tah.c's product then sum round only the sum.
            // A warp with a zero, subnormal or larger step anywhere takes tah.c's two roundings.
            auto dequant = [&](auto one) {
#pragma unroll
                for (int k = 0; k < 4; k++) { // the code as a float: its bits below 2^23's, less 2^23 (exact)
                    const uint32_t ev = w[k] & 0x0f0f0f0fu, od = (w[k] >> 4) & 0x0f0f0f0fu; // codes 0,2,4,6 / 1,3,5,7
#pragma unroll
                    for (int r = 0; r < 8; r++) {
                        const uint32_t bits = __byte_perm(r & 1 ? od : ev, 0x4b000000u, 0x7650u | (uint32_t)(r >> 1));
                        v[8 * k + r] = one(__fsub_rn(__uint_as_float(bits), 8388608.0f));
                    }
                }
            };
            if (__all_sync(CU_FULL, step == 0.0f || (step >= FLT_MIN && step <= 0x1p124f)))
                dequant([&](float c) { return __fmaf_rn(c, step, minf); });
            else
                dequant([&](float c) { return __fadd_rn(minf, __fmul_rn(c, step)); });
            rot = in && (f & 2u); // rotated tiles: transformed and checked on their rows (below)
            // unrotated: v is monotonic in the code (step >= 0), so codes 0 and 15 bound it
            if (!rot && !(fabsf(minf) <= FLT_MAX && fabsf(__fadd_rn(minf, __fmul_rn(15.0f, step))) <= FLT_MAX)) {
                float nz = 0.0f; // v * 0 is NaN exactly when v is Inf or NaN
#pragma unroll
                for (int r = 0; r < 32; r++)
                    nz = __fmaf_rn(v[r], 0.0f, nz);
                bad |= (uint32_t)(nz != nz);
            }
        }
        // through shared memory: this warp's 16 tiles, then 512-byte stores
        float4 *rows = s_rows + (size_t)wid * 16u * S_DT_ROW;
#pragma unroll
        for (int c = 0; c < 8; c++)
            rows[lt * S_DT_ROW + 8u * h + (uint32_t)c] = make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
        __syncwarp();
        // tah.c's inverse rotation (fwht_f32, then element 0 swapped with the pivot) of the
        // warp's rotated tiles on their rows: a segment of 8 lanes per tile (d_fwht_seg, lane
        // tl elements 8tl..8tl+7), 4 tiles per pass; about 3 of 16 tiles rotate, so one pass
        // instead of every lane pair running the 64-point transform in divergence
        uint32_t rm = __ballot_sync(CU_FULL, rot && h == 0); // bit t: tile t rotated (t < 16)
        const uint32_t fw = f; // lane t's flag field: tile t's pivot
        while (rm != 0u) { // warp-uniform
            const uint32_t tl = lane & 7u;
            bool act;
            const uint32_t t = d_rot_pick(rm, lane, act);
            float4 *r4 = rows + t * S_DT_ROW + 2u * tl;
            const float4 q0 = r4[0], q1 = r4[1];
            float z[8] = { q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w };
            d_fwht_seg(z, lane, 8u);
            float nz = 0.0f;
#pragma unroll
            for (int r = 0; r < 8; r++) {
                z[r] = __fmul_rn(z[r], g.norm);
                nz = __fmaf_rn(z[r], 0.0f, nz);
            }
            const uint32_t piv = __shfl_sync(CU_FULL, fw >> 2, (int)t);
            if (act) {
                bad |= (uint32_t)(nz != nz);
                r4[0] = make_float4(z[0], z[1], z[2], z[3]);
                r4[1] = make_float4(z[4], z[5], z[6], z[7]);
            }
            __syncwarp();
            if (act && tl == 0) {
                float *row = (float *)(rows + t * S_DT_ROW);
                const float tv = row[0];
                row[0] = row[piv];
                row[piv] = tv;
            }
            __syncwarp();
            rm = d_rot_drop(rm);
        }
        // lane l: float4 l % 16 of rows 2k + l / 16 (a full round without bounds tests); streaming
        // stores (st.global.cs), as every decoder's output: +0.5 point queued, +1.5 back to back (H100)
        float4 *o4 = (float4 *)(out + (b * SQ + t0) * 64u) + lane;
        const float4 *r4 = rows + (lane / 16u) * S_DT_ROW + lane % 16u;
        if (t0 + 16u <= w1) {
#pragma unroll
            for (int k = 0; k < 8; k++)
                __stcs(&o4[32 * k], r4[2 * S_DT_ROW * k]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (t0 + 2u * (uint32_t)k + lane / 16u < w1)
                    __stcs(&o4[32 * k], r4[2 * S_DT_ROW * k]);
        }
        __syncwarp(); // rows read before the next round writes them
        cur = nxt;
    }
    if (lane == 0 && w1 == SQ) // the sample's high tiles
        corrupt |= (uint32_t)((uint64_t)run != g.n_hi);
    else if (lane == 0 && w1 % CODEC_TAH_IX_TILES == 0u) // the next entry: the count at its tile
        corrupt |= (uint32_t)(run != ix[w1 / CODEC_TAH_IX_TILES]);
    if (corrupt)
        d_flag(head, CU_ST_CORRUPT);
    if (bad)
        d_flag(head, CU_ST_NONFINITE);
}

// ---- host ----

static int s_check_tile(const s_tg &g, char *err, size_t errlen)
{
    if (g.G > S_MAX_TILE) {
        if (err && errlen)
            snprintf(err, errlen, "cuda tah: tile=%u: the GPU kernels handle tiles up to %u (use the CPU codec)",
                     g.G, S_MAX_TILE);
        return TAH_EPARAM;
    }
    return 0;
}

// k_tah_spec's and k_tah_emit's words past gmax
static s_fz s_fz_carve(const s_tw &t, const s_tg &g)
{
    uint8_t *zb = (uint8_t *)(t.gmax + ((g.B * g.n_eg + 3) & ~3ull));
    s_fz a_z;
    a_z.cnt = (unsigned long long *)zb;
    a_z.ztag = (unsigned long long *)(zb + 8 * S_FUSE_MAXGRID);
    a_z.sdone = (uint32_t *)(((uintptr_t)zb + 16 * S_FUSE_MAXGRID + 15) & ~(uintptr_t)15);
    a_z.hist = a_z.sdone + S_FZ_CTR;
    return a_z;
}

// The conditions of k_tah_spec and k_tah_dw64 (one or two lanes a tile): every quant tile full and an allocation tile
// (C % 64 == 0, G = A = 64), 16-byte aligned rows, 8-aligned code regions and 4-aligned
// meta words (TAH_CU_TPT=0 turns them off, for a same-run comparison).
static bool s_pair_ok(const s_tg &g, const void *x, const uint8_t *payload)
{
    const uintptr_t pa = (uintptr_t)payload;
    return cu_tpt() && g.G == 64 && g.k == 1 && g.C % 64u == 0 && ((uintptr_t)x & 15u) == 0 && (pa + g.codes_off) % 8u == 0 &&
           g.code_bytes % 8u == 0 && (pa + g.meta_off) % 4u == 0 && g.T <= 0xffffffffull;
}

// Whether k_tah_emit may be a programmatic dependent launch on the current device: only where the
// code it runs was compiled for sm_90 or later (its PTX then has the griddepcontrol.wait the
// launch relies on; a build for an older architecture JIT-compiled on a Hopper has not). Cached
// per device (a benign race: every thread computes the same answer).
static bool s_emit_pdl()
{
    static signed char known[64]; // [device]: 0 unknown, 1 yes, -1 no
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return false;
    if (known[dev] == 0) {
        cudaFuncAttributes fa;
        const bool ok = cudaFuncGetAttributes(&fa, (const void *)k_tah_emit) == cudaSuccess && fa.ptxVersion >= 90;
        known[dev] = ok ? 1 : -1;
    }
    return known[dev] > 0;
}

// Round 17's encode (k_tah_spec + k_tah_emit; window mode: k_tah_spec alone) where it applies: 0
// or a TAH_E* code, 1 when it does not (the lane-pair conditions, the default widths, samples of
// fewer than 2^16 tiles).
// X: fp32 or bf16 input (cu_bf16: the staged rows are the bf16 tiles, widened as read).
template <typename X>
static int s_encode_spec(const s_tg &g, const X *x, uint8_t *payload, cu_hp head, const s_tw &t,
                         cudaStream_t st, char *err, size_t errlen)
{
    if (!cu_spec() || !s_spec_shape(g) || !s_pair_ok(g, x, payload) || g.B > S_FUSE_MAXGRID)
        return 1;
    const void *kern = g.win != 0 ? (const void *)k_tah_spec<X, true> : (const void *)k_tah_spec<X, false>;
    const uint64_t lmax = g.win != 0 ? 0 : S_SP_CAP * S_SP_UNIT; // the bag of keys (none in window mode)
    const size_t smem = S_SP_CTA + 4 * lmax;
    CUDA_CHECK(cu_smem_allow(kern, smem));
    uint64_t blocks = (uint64_t)cu_coop_blocks(kern, S_SP_WARPS * 32, smem);
    blocks = blocks < S_FUSE_MAXGRID ? blocks : S_FUSE_MAXGRID;
    uint64_t P = blocks / g.B;
    const uint64_t nus = (g.n_alloc + S_SP_UNIT - 1) / S_SP_UNIT;
    P = P < (nus + S_SP_WARPS - 1) / S_SP_WARPS ? P : (nus + S_SP_WARPS - 1) / S_SP_WARPS;
    if (P == 0)
        return 1;
    // k_tah_emit's CTAs wait for the counts of those before them (see k_tah_spec's comment on
    // why an ordinary launch is enough). It is a programmatic dependent launch (s_emit_pdl): its
    // CTAs start as k_tah_spec's end and wait at griddepcontrol.wait for its writes, instead of
    // after the grid's completion (~1.5 us, H100)
    uint32_t a_PB = (uint32_t)((g.n_alloc + S_EM_TILES - 1) / S_EM_TILES);
    const void *ekern = (const void *)k_tah_emit;
    if (g.win == 0 && (g.B * a_PB > (uint64_t)cu_coop_blocks(ekern, 256, 0) || g.B * a_PB > S_FUSE_MAXGRID))
        return 1;
    s_fz a_z = s_fz_carve(t, g);
    uint8_t *a_p = payload;
    uint4 *a_rec = (uint4 *)(((uintptr_t)(a_z.hist + CODEC_TAH_KEY_BINS * g.B) + 127) & ~(uintptr_t)127);
    uint16_t *a_key = (uint16_t *)(a_rec + g.B * s_spec_nu(g) * S_REC_BLOCK);
    const X *a_x = x;
    cu_hp a_head = head;
    s_tg a_g = g;
    uint32_t a_P = (uint32_t)P, a_nk = (uint32_t)s_spec_nk(g), a_lmax = (uint32_t)lmax;
    void *args[] = { &a_x, &a_rec, &a_key, &a_p, &a_z, &a_head, &a_g, &a_P, &a_nk, &a_lmax };
    CUDA_CHECK(cudaLaunchKernel(kern, dim3((unsigned int)(P * g.B)), dim3(S_SP_WARPS * 32), args, smem, st));
    if (g.win != 0)
        return 0; // the frame is written
    void *eargs[] = { &a_rec, &a_key, &a_z, &a_p, &a_head, &a_g, &a_PB, &a_nk };
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned int)(g.B * a_PB));
    cfg.blockDim = dim3(256);
    cfg.stream = st;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &at;
    cfg.numAttrs = s_emit_pdl() ? 1 : 0;
    cudaError_t le = cudaLaunchKernelExC(&cfg, ekern, eargs);
    if (le != cudaSuccess && cfg.numAttrs != 0) { // a driver that refuses the attribute: a plain launch
        (void)cudaGetLastError();
        cfg.numAttrs = 0;
        le = cudaLaunchKernelExC(&cfg, ekern, eargs);
    }
    CUDA_CHECK(le);
    return 0;
}

int cu_tah_encode_bf16(const codec_spec_t *spec, codec_shape_t shape, const cu_bf16 *x, uint8_t *payload, cu_hp head,
                       void *work, cudaStream_t st, char *err, size_t errlen)
{
    const s_tg g = s_geometry(spec, shape, x);
    int rc = s_check_tile(g, err, errlen);
    if (rc != 0)
        return rc;
    return cu_fuse() && (g.win == 0 || g.win == S_SP_UNIT) ? s_encode_spec(g, x, payload, head, s_carve(work, g), st, err, errlen)
                                                           : 1;
}

int cu_tah_encode(const codec_spec_t *spec, codec_shape_t shape, const float *x, uint8_t *payload, cu_hp head,
                  void *work, cudaStream_t st, unsigned int stages, char *err, size_t errlen)
{
    const s_tg g = s_geometry(spec, shape, x);
    int rc = s_check_tile(g, err, errlen);
    if (rc != 0)
        return rc;
    const s_tw t = s_carve(work, g);
    if (stages == CU_TAH_ALL && cu_fuse() && (g.win == 0 || g.win == S_SP_UNIT)) {
        rc = s_encode_spec(g, x, payload, head, t, st, err, errlen); // windows: of one unit only
        if (rc <= 0)
            return rc; // else the shape does not suit it: the kernels below (any window: k_tah_select)
    }
    if (stages & CU_TAH_MEMSET) // atomicMax starts at 0
        CUDA_CHECK(cudaMemsetAsync(t.gmax, 0, 4 * g.B * g.n_eg, st));
    if (stages & CU_TAH_ENTROPY) {
        k_tah_entropy<<<cu_grid(g.B * g.n_alloc, 64), 256, 0, st>>>(x, t.key, t.gmax, head, g);
        CU_CHECK_LAUNCH("k_tah_entropy");
    }
    const size_t sel_smem = 8 * (size_t)g.n_alloc; // keys + packed prefixes
    if (!(stages & CU_TAH_SELECT)) {
        // benchmark split only (cu_codec_encode_stages)
    } else if (g.win == 0 && g.n_alloc <= 0xffffffffull && sel_smem <= cu_smem_optin(4096)) {
        CUDA_CHECK(cu_smem_allow((const void *)k_tah_select_sm, sel_smem));
        k_tah_select_sm<<<(unsigned int)g.B, S_SEL_THREADS, sel_smem, st>>>(t.key, t.pre, t.gmax, payload, head, g);
        CU_CHECK_LAUNCH("k_tah_select_sm");
    } else {
        k_tah_select<<<(unsigned int)g.B, S_SEL_THREADS, 0, st>>>(t.key, t.pre, t.gmax, payload, head, g);
        CU_CHECK_LAUNCH("k_tah_select");
    }
    const uint64_t per_block = 8u * (32u / (g.G / 8u));
    const bool flag_bytes = g.fbits == 8;
    if (!(stages & CU_TAH_QUANT))
        return 0;
    k_tah_quant<S_QUANT_U><<<cu_grid(g.T, per_block * S_QUANT_U), 256, 0, st>>>(x, t.pre, t.gmax, t.flagv, payload,
                                                                               head, g, flag_bytes);
    CU_CHECK_LAUNCH("k_tah_quant");
    if (!flag_bytes) {
        k_tah_flags<<<cu_grid(g.flags_bytes, 256), 256, 0, st>>>(t.flagv, payload, g);
        CU_CHECK_LAUNCH("k_tah_flags");
    }
    return 0;
}

int cu_tah_decode(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *payload, float *out,
                  cu_hp head, void *work, cudaStream_t st, char *err, size_t errlen)
{
    const s_tg g = s_geometry(spec, shape, out);
    int rc = s_check_tile(g, err, errlen);
    if (rc != 0)
        return rc;
    const s_tw t = s_carve(work, g);
    const uint64_t cps = s_dec_cps(g);
    // not reached by any shape a frame can hold (B*S*C <= CODEC_MAX_ELEMS = 2^31 elements)
    if (g.S * g.Q >= 0x80000000ull || g.B * cps > 0x7fffffffull) {
        snprintf(err, errlen, "tah decode: shape (%llu,%llu,%u) beyond the GPU decoder's 2^31 tiles",
                 (unsigned long long)g.B, (unsigned long long)g.S, g.C);
        return TAH_ESHAPE;
    }
    const uint32_t CH = s_dec_chunk(g);
    // round 8: a lane pair per tile when the tiles are full and the spec the default's
    const uintptr_t pa = (uintptr_t)payload;
    if (cu_tpt() && g.G == 64 && g.k == 1 && g.bh == 4 && g.bl == 3 && g.C % 64u == 0 && pa % 4u == 0 &&
        ((uintptr_t)out & 15u) == 0 && (pa + g.codes_off) % 8u == 0 && g.code_bytes % 8u == 0 &&
        (pa + g.meta_off) % 4u == 0) {
        // two rounds of 16 tiles per warp (256 tiles per CTA): 0.0252 ms against 0.0253 for one
        // and 0.0284 for four (H100)
        constexpr uint32_t R = 2;
        const void *kern = (const void *)k_tah_dw64<4, 3, R>;
        CUDA_CHECK(cu_smem_allow(kern, S_DT_SMEM));
        const uint64_t P = (g.S * g.Q + 128u * R - 1u) / (128u * R); // CTAs per sample
        k_tah_dw64<4, 3, R><<<(unsigned int)(g.B * P), 256, S_DT_SMEM, st>>>(payload, out, head, g, (uint32_t)P);
        CU_CHECK_LAUNCH("k_tah_dw64");
        return 0;
    }
    // round 7: one launch (SELF) when every quant tile is an allocation tile of 8-bit flags;
    // otherwise k_tah_dcount first
    const bool self = g.k == 1 && g.fbits == 8 && g.S * g.Q < 65536u && CH % 16u == 0;
    const bool b43 = g.bh == 4 && g.bl == 3;
    void (*chunk)(const uint8_t *, const unsigned long long *, float *, cu_hp, s_tg, uint32_t, uint32_t) =
        self ? (b43 ? k_tah_dchunk<4, 3, 8, true> : k_tah_dchunk<0, 0, 8, true>)
             : (b43 ? (g.G == 64 ? k_tah_dchunk<4, 3, 8, false> : k_tah_dchunk<4, 3, 0, false>)
                    : k_tah_dchunk<0, 0, 0, false>);
    if (!self) {
        k_tah_dcount<<<cu_grid(g.B * cps, 8), 256, 0, st>>>(payload, t.cnt, head, g, CH, (uint32_t)cps);
        CU_CHECK_LAUNCH("k_tah_dcount");
    }
    chunk<<<(unsigned int)(g.B * cps), 256, 0, st>>>(payload, t.cnt, out, head, g, CH, (uint32_t)cps);
    CU_CHECK_LAUNCH("k_tah_dchunk");
    return 0;
}
