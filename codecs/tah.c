/* tah.c — TAH-Quant (tile-wise adaptive Hadamard quantisation) for forward
 * activations of shape (B,S,C).
 *
 * Tiles: each token's C channels are cut into Q = ceil(C/G) quantisation
 * tiles of G channels (the last one zero-padded to G) and into allocation
 * tiles of A = k*G channels (the last one may hold fewer quant tiles).
 *
 * Encode, per sample b:
 *   1. entropy of every allocation tile, H = -sum p_k log2 p_k with
 *      p_k = |a_k| / (||a||_1 + eps), each log2 |a_k| by Mitchell's
 *      approximation (below), as a 12-bit key; the n_hi = round(hi_frac *
 *      S*ceil(Q/k)) tiles of the highest keys (ties: lower index first) get
 *      bits_hi, the rest bits_lo — exactly n_hi per sample, found with one
 *      4096-bin histogram, when window = 0; with window = W > 0 (default 32)
 *      the sample's allocation tiles go in windows of W (the last may be
 *      shorter) and window [w0, w1) takes its share h(w1) - h(w0),
 *      h(t) = round(t n_hi / N) (halves up), by the same order: still exactly
 *      n_hi per sample, so frames and decoders are the same, and an encoder
 *      needs no pass over the whole sample before it quantises (cuda/NOTES.md,
 *      round 36: equal error on the fidelity tensors, the demo's validation
 *      loss 0.006-0.033 lower in 4 of 4 seeds at W = 32; until November 2026
 *      every frame took the per-sample rule);
 *   2. per quant tile, if |a(1)| > tau (|a(2)| + rho): swap the largest-
 *      magnitude element to position 0 and apply H_G/sqrt(G) (fwht_f32);
 *   3. asymmetric uniform quantisation: fp16 minimum rounded down, fp16 step
 *      rounded up (so min + step*(2^b-1) covers the tile), codes
 *      (v - min) * (1/step) rounded once to nearest (ties to even; a fused
 *      multiply-add) and clamped.
 *      (Until November 2026 the test of 2. was |a(1)| / (|a(2)| + rho) > tau
 *      and 3.'s ties went up: a division per tile and an add per code more
 *      on the GPU, about 3 % of its encode; until round 37 the code's
 *      product was rounded before the rounding to an integer, and the
 *      entropy's products before their sums. Frames decode the same way.)
 * All fp16 metadata is relative to a power of two 2^e per exponent group,
 * 32 consecutive allocation tiles of a sample (CODEC_TAH_EXP_TILES; the last
 * one may be shorter), chosen from the group's absmax, so any finite float32
 * tensor is encodable and every group is coded at its own scale (frame
 * version 4; until November 2026 one e per frame, a max over the whole
 * tensor before any metadata could be written).
 *
 * Payload (T = B*S*Q tiles, lg = log2 G, n_eg = ceil(S*nA/32)):
 *   u32 0, u32 0
 *   index: per sample ceil(S*Q/128) x u32, entry k the sample's high quant
 *          tiles before its tile 128k (CODEC_TAH_IX_TILES; frame version 3):
 *          a decoder's thread can find any tile's code offset from one entry
 *          and at most 127 flags
 *   exps:  per sample n_eg x i8 e (in [-126, 127]), then zero bytes to a
 *          multiple of 8 over all samples (decoders ignore them)
 *   flags: T entries of (2+lg) bits, LSB-first stream, byte-padded:
 *          bit 0 high width, bit 1 rotated, bits 2.. pivot index (0 if not rotated)
 *   meta:  T x (u16 fp16 min, u16 fp16 step)
 *   codes: per sample a fixed region sized for its largest possible number
 *          of high tiles; inside, tiles in (s, q) order, G*bits/8 bytes each
 *          (bitpack layout), zero after the last tile.
 * Entropies are float32 sums: a tile whose L1 norm overflows float32 (values
 * above ~1e35) ranks as entropy 0; the count of high tiles stays exact.
 * (Until November 2026 the per-element log2 was a degree-5 polynomial and the
 * key the entropy's float bits: frames then differ only in which tiles near
 * the threshold are high; both decode the same way.)
 *
 * Default (G=A=64, 80 % INT4, INT3, windows of 32): 8 + 32 + 0.8*256 + 0.2*192 bits per
 * 64 elements = 4.425 bits/element plus 72 bytes per frame, 4 bytes per 8192
 * elements (the index) and 1 byte per 2048 (the exponents), +0.2 % in all, and
 * at most 7 bytes of padding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bitpack.h" /* bitpack_pack, bitpack_unpack */
#include "codec_impl.h"
#include "fwht.h" /* fwht_f32 */
#include "half.h" /* half_from_f32_down/up, half_to_f32 */
#include "simd.h" /* simd_f8 lanes for the per-tile reductions */

#define S_ENTROPY_EPS 1e-12f
#define S_EXP_MIN (-126) /* 2^-e stays a finite float (subnormal inputs); an i8 holds the rest */

typedef struct s_geom {
    uint32_t G, lg, k, Q, nA, r; /* r: quant tiles in a token's last allocation tile */
    uint32_t bh, bl;
    uint64_t S, B, tiles, n_alloc, n_hi, hi_q_max;
    uint64_t ix_n; /* index entries per sample */
    uint64_t n_eg; /* exponent groups per sample */
    uint64_t ix_bytes, eg_bytes, flags_bytes, meta_bytes, code_bytes; /* code_bytes: per sample */
} s_geom_t;

static uint32_t s_log2(uint32_t v)
{
    uint32_t l = 0;
    while ((1u << l) < v)
        l++;
    return l;
}

static void s_geometry(const codec_tah_params_t *p, codec_shape_t shape, s_geom_t *g)
{
    g->G = p->tile;
    g->lg = s_log2(p->tile);
    g->k = p->alloc_tile / p->tile;
    g->Q = (shape.c + g->G - 1) / g->G;
    g->nA = (g->Q + g->k - 1) / g->k;
    g->r = g->Q - (g->nA - 1) * g->k;
    g->bh = p->bits_hi;
    g->bl = p->bits_lo;
    g->S = shape.s;
    g->B = shape.b;
    g->tiles = g->B * g->S * g->Q;
    g->n_alloc = g->S * g->nA;
    double want = floor((double)p->hi_frac * (double)g->n_alloc + 0.5);
    g->n_hi = want < 0 ? 0 : (want > (double)g->n_alloc ? g->n_alloc : (uint64_t)want);
    /* worst case: the high tiles are the full allocation tiles first */
    uint64_t full = (g->r == g->k) ? g->n_alloc : g->S * (g->nA - 1);
    g->hi_q_max = (g->n_hi <= full) ? g->n_hi * g->k : full * g->k + (g->n_hi - full) * g->r;
    uint64_t sq = g->S * g->Q;
    g->ix_n = (sq + CODEC_TAH_IX_TILES - 1) / CODEC_TAH_IX_TILES;
    g->ix_bytes = 4 * g->B * g->ix_n;
    g->n_eg = (g->n_alloc + CODEC_TAH_EXP_TILES - 1) / CODEC_TAH_EXP_TILES;
    g->eg_bytes = (g->B * g->n_eg + 7) & ~(uint64_t)7;
    g->flags_bytes = (g->tiles * (2 + g->lg) + 7) / 8;
    g->meta_bytes = 4 * g->tiles;
    g->code_bytes = g->hi_q_max * g->G * g->bh / 8 + (sq - g->hi_q_max) * g->G * g->bl / 8;
}

/* The exponent of sample b's quant tile (s, q): its allocation tile's group's */
static int32_t s_tile_exp(const s_geom_t *g, const int8_t *eg, uint64_t b, uint64_t s, uint32_t q)
{
    return eg[b * g->n_eg + (s * g->nA + q / g->k) / CODEC_TAH_EXP_TILES];
}

static uint64_t s_payload_size(const codec_spec_t *spec, codec_shape_t shape)
{
    s_geom_t g;
    s_geometry(&spec->p.tah, shape, &g);
    return 8 + g.ix_bytes + g.eg_bytes + g.flags_bytes + g.meta_bytes + g.B * g.code_bytes;
}

/* ---- bit field access for the flags stream (fields of at most 14 bits) ---- */

static void s_put_bits(uint8_t *stream, uint64_t bitpos, uint32_t nbits, uint32_t v)
{
    uint8_t *p = stream + bitpos / 8;
    uint32_t sh = (uint32_t)(bitpos % 8);
    uint32_t w = v << sh; /* at most 14 + 7 bits: three bytes */
    uint32_t nbytes = (sh + nbits + 7) / 8;
    for (uint32_t i = 0; i < nbytes; i++)
        p[i] |= (uint8_t)(w >> (8 * i));
}

static uint32_t s_get_bits(const uint8_t *stream, uint64_t bitpos, uint32_t nbits)
{
    const uint8_t *p = stream + bitpos / 8;
    uint32_t sh = (uint32_t)(bitpos % 8);
    uint32_t nbytes = (sh + nbits + 7) / 8;
    uint32_t w = 0;
    for (uint32_t i = 0; i < nbytes; i++)
        w |= (uint32_t)p[i] << (8 * i);
    return (w >> sh) & ((1u << nbits) - 1u);
}

/* ---- entropy ---- */

/* log2(x) for x > 0 to about 1e-5, in plain float arithmetic (a multiply and an
 * add per term, no division, no FMA) so every machine and the GPU kernel compute
 * the same bits: x = (1 + f) * 2^e with f in [0, 1), log2(1 + f) = f * q(f) with
 * q a degree-5 polynomial fitted to log2(1 + f) / f on [0, 1) (largest error of
 * the float evaluation 1.4e-5 over all normal floats). Used once per tile, for
 * log2(D) below. */
static inline float s_log2f(float x)
{
    uint32_t u = codec_f32_bits(x);
    float e = (float)((int32_t)(u >> 23) - 127);
    float f = codec_bits_f32((u & 0x007fffffu) | 0x3f800000u) - 1.0f;
    float q = -0.0353865251f * f + 0.148412362f;
    q = q * f + -0.305121601f;
    q = q * f + 0.469920516f;
    q = q * f + -0.720519781f;
    q = q * f + 1.44268477f;
    return e + f * q;
}

/* 384 + Mitchell's log2 of v >= 0: for v = (1 + f) 2^e, e + f with f cut to 15
 * bits, i.e. (v's bits >> 8 less 127 * 2^15) * 2^-15, which is in [-127, 128]
 * for finite v; added to the bits of 384 = 1.5 * 2^8, whose binade [256, 512)
 * has ulp 2^-15, it gives 384 + e + f exactly: a shift and an add per element
 * (where the polynomial above costs about 15 operations). e + f is at most
 * 0.086 below log2 v (exact at powers of two). The entropy's sum keeps the 384
 * of every element and takes 384 * S1 off once (round 38: a subtraction per
 * element fewer on the GPU; keys within ~2e-4 bits of the unbiased sum's). */
static inline float s_mlog384(float v) { return codec_bits_f32((codec_f32_bits(v) >> 8) + (0x43c00000u - (127u << 15))); }

#define S_KEY_BINS CODEC_TAH_KEY_BINS /* entropy keys are 12-bit (codec_tah_key_scale) */

/* Entropy key (0..4095) of the normalised magnitudes of a[0..n); also folds
 * max|a| into *absmax. H = log2(D) * S1/D - SL/D with S1 = sum |a|,
 * SL = sum |a| * s_mlog384(|a|) (fused multiply-adds) less 384 * S1 (one more),
 * D = S1 + eps (log2(D) by the polynomial: an
 * error there would shift whole tiles), in 16 lane sums added in lane order;
 * key = floor(H * scale), H clamped to >= 0. Mitchell's error on the element
 * logs averages over the tile (for 64 Gaussian values its spread between
 * tiles is ~0.005 bits, against ~0.05 between their entropies), and ranking
 * is all the entropy does. */
static uint32_t s_entropy_key(const float *a, uint32_t n, float kscale, float *absmax)
{
    enum { L = 16 };
    float s1[L] = { 0 }, sl[L] = { 0 }, mx[L] = { 0 };
    uint32_t i = 0;
    for (; i + L <= n; i += L) {
        for (uint32_t j = 0; j < L; j++) {
            float v = fabsf(a[i + j]);
            s1[j] += v;
            sl[j] = fmaf(v, s_mlog384(v), sl[j]);
            mx[j] = mx[j] > v ? mx[j] : v;
        }
    }
    float S1 = 0.0f, SL = 0.0f, M = *absmax;
    for (uint32_t j = 0; j < L; j++) {
        S1 += s1[j];
        SL += sl[j];
        M = M > mx[j] ? M : mx[j];
    }
    for (; i < n; i++) {
        float v = fabsf(a[i]);
        S1 += v;
        SL = fmaf(v, s_mlog384(v), SL);
        M = M > v ? M : v;
    }
    *absmax = M;
    if (S1 == 0.0f)
        return 0;
    SL = fmaf(-384.0f, S1, SL);
    float D = S1 + S_ENTROPY_EPS;
    float h = s_log2f(D) * (S1 / D) - SL / D;
    float k = h > 0.0f ? h * kscale : 0.0f; /* NaN (S1 overflowed) ranks 0 */
    return k < (float)(S_KEY_BINS - 1) ? (uint32_t)k : S_KEY_BINS - 1;
}

/* Mark exactly n_hi of the n entries as high: the largest keys (< 4096),
 * equal keys by lower index. One histogram, then the threshold from the top. */
static void s_select_top(const uint16_t *key, uint64_t n, uint64_t n_hi, uint8_t *hi)
{
    if (n_hi == 0 || n_hi == n) {
        memset(hi, n_hi ? 1 : 0, n);
        return;
    }
    uint64_t hist[S_KEY_BINS] = { 0 };
    for (uint64_t i = 0; i < n; i++)
        hist[key[i]]++;
    uint32_t T = S_KEY_BINS;
    uint64_t need = n_hi; /* how many still to take among keys == T */
    while (T-- > 0) {
        if (hist[T] >= need)
            break;
        need -= hist[T];
    }
    /* take all keys > T, and the first `need` keys == T in index order */
    for (uint64_t i = 0; i < n; i++) {
        if (key[i] > T)
            hi[i] = 1;
        else if (key[i] == T && need > 0) {
            hi[i] = 1;
            need--;
        } else
            hi[i] = 0;
    }
}

/* The window rule's high entries before entry t (a window boundary) of n:
 * round(t n_hi / n), halves up (the GPU's d_win_hi_before). */
static uint64_t s_win_hi_before(uint64_t t, uint64_t n_hi, uint64_t n) { return (2 * t * n_hi + n) / (2 * n); }

/* window = W > 0: each window of W entries its share of n_hi (tah.c's header),
 * by the same order as s_select_top; small windows rank directly. */
static void s_select_windows(const uint16_t *key, uint64_t n, uint64_t n_hi, uint64_t W, uint8_t *hi)
{
    for (uint64_t w0 = 0; w0 < n; w0 += W) {
        const uint64_t w1 = w0 + W < n ? w0 + W : n;
        const uint64_t q = s_win_hi_before(w1, n_hi, n) - s_win_hi_before(w0, n_hi, n);
        if (w1 - w0 > 64) {
            s_select_top(key + w0, w1 - w0, q, hi + w0);
            continue;
        }
        for (uint64_t i = w0; i < w1; i++) {
            uint64_t rank = 0; /* entries ahead of i: larger keys, equal keys before it */
            for (uint64_t j = w0; j < w1; j++)
                rank += key[j] > key[i] || (key[j] == key[i] && j < i);
            hi[i] = rank < q;
        }
    }
}

/* ---- quantisation of one tile ---- */

/* ---- per-tile reductions, 8 lanes (G is a power of two >= 8) ---- */

static void s_minmax(const float *v, uint32_t n, float *mn_out, float *mx_out)
{
    simd_f8 mn = simd_load(v), mx = mn;
    for (uint32_t i = 8; i < n; i += 8) {
        simd_f8 a = simd_load(v + i);
        mn = simd_min(a, mn);
        mx = simd_max(a, mx);
    }
    *mn_out = simd_hmin(mn);
    *mx_out = simd_hmax(mx);
}

static void s_minmax_scalar(const float *v, uint32_t n, float *mn, float *mx)
{
    *mn = *mx = v[0];
    for (uint32_t i = 1; i < n; i++) {
        *mn = v[i] < *mn ? v[i] : *mn;
        *mx = v[i] > *mx ? v[i] : *mx;
    }
}

/* What the encoder needs to know of a tile before deciding to rotate it. */
typedef struct s_tile_stats {
    float m1, m2; /* largest and second-largest magnitude */
    uint32_t piv; /* first index holding m1 (0 if the tile is all zeros) */
    float mn, mx; /* min and max value */
} s_tile_stats_t;

/* v[0..G) = src[0..w) * scale, zero-padded; in the same pass the lane-wise
 * top two magnitudes (with the top one's index) and min/max. */
static void s_load_tile(float *restrict v, const float *restrict src, uint32_t w, uint32_t G, float scale,
                        s_tile_stats_t *st)
{
    simd_f8 sc = simd_splat(scale);
    simd_f8 m1 = simd_splat(0.0f), m2 = m1, mn = simd_splat(src[0] * scale), mx = mn;
    simd_i8 idx = { 0 }, iv = { 0, 1, 2, 3, 4, 5, 6, 7 };
    if (w < G) { /* partial tile: scale and pad first, then reduce the padded tile */
        for (uint32_t i = 0; i < G; i++)
            v[i] = i < w ? src[i] * scale : 0.0f;
        src = v;
        sc = simd_splat(1.0f);
    }
    for (uint32_t i = 0; i < G; i += 8, iv += 8) {
        simd_f8 a = simd_load(src + i) * sc;
        simd_store(v + i, a);
        simd_f8 m = simd_abs(a);
        m2 = simd_max(m2, simd_min(m, m1));
        simd_i8 gt = m > m1;
        idx = simd_sel_i(gt, iv, idx);
        m1 = simd_sel(gt, m, m1);
        mn = simd_min(a, mn);
        mx = simd_max(a, mx);
    }
    /* merge lanes: the winner is the largest m1, lowest index on ties; the
     * second magnitude is the winner's m2 or any other lane's m1 */
    int win = 0;
    for (int j = 1; j < 8; j++)
        if (m1[j] > m1[win] || (m1[j] == m1[win] && idx[j] < idx[win]))
            win = j;
    st->m1 = m1[win];
    st->piv = m1[win] > 0.0f ? (uint32_t)idx[win] : 0;
    st->m2 = m2[win];
    for (int j = 0; j < 8; j++)
        if (j != win && m1[j] > st->m2)
            st->m2 = m1[j];
    st->mn = simd_hmin(mn);
    st->mx = simd_hmax(mx);
    if (w < G) /* unrotated, the padding is not data: its codes are clamped and dropped */
        s_minmax_scalar(v, w, &st->mn, &st->mx);
}

/* Quantise v[0..G) (already scaled by 2^-e) into codes; returns fp16 meta. */
static void s_quant_tile(const float *v, uint32_t G, uint32_t bits, float mn, float mx, uint16_t *codes,
                         uint16_t *min16, uint16_t *step16)
{
    const float levels = (float)((1u << bits) - 1u);
    *min16 = half_from_f32_down(mn);
    float minf = half_to_f32(*min16);
    *step16 = half_from_f32_up((mx - minf) / levels);
    float step = half_to_f32(*step16);
    float inv = step > 0.0f ? 1.0f / step : 0.0f;
    for (uint32_t i = 0; i < G; i++) {
        /* (v - minf) inv to nearest, ties to even, in one rounding (the fused add of 2^23, whose
         * ulp is 1), where |q| < 2^22; beyond, the clamps */
        float q = fmaf(v[i] - minf, inv, 0x1p23f) - 0x1p23f;
        q = q < levels ? q : levels;
        q = q > 0.0f ? q : 0.0f; /* only padding lies below the minimum */
        codes[i] = (uint16_t)q;  /* an integer in [0, levels] */
    }
}

static int s_encode(const codec_spec_t *spec, codec_shape_t shape, const float *x, uint8_t *payload)
{
    const codec_tah_params_t *p = &spec->p.tah;
    s_geom_t g;
    s_geometry(p, shape, &g);
    const uint32_t C = shape.c, G = g.G, A = p->alloc_tile;
    uint8_t *hi = malloc(g.n_alloc);
    uint16_t *ekey = malloc(g.B * g.n_alloc * sizeof *ekey);
    float *gmax = calloc(g.B * g.n_eg, sizeof *gmax);
    if (!hi || !ekey || !gmax) {
        free(hi);
        free(ekey);
        free(gmax);
        return TAH_ENOMEM;
    }

    /* pass 1: entropy keys of every allocation tile, and each exponent group's absmax */
    const float kscale = codec_tah_key_scale(A);
    for (uint64_t b = 0; b < g.B; b++) {
        for (uint64_t a = 0; a < g.n_alloc; a++) { /* the sample's allocation tile a = s nA + j */
            const uint64_t s = a / g.nA;
            const uint32_t j = (uint32_t)(a - s * g.nA), c0 = j * A, w = (C - c0 < A) ? C - c0 : A;
            float *m = &gmax[b * g.n_eg + a / CODEC_TAH_EXP_TILES];
            ekey[b * g.n_alloc + a] = (uint16_t)s_entropy_key(x + (b * g.S + s) * C + c0, w, kscale, m);
        }
    }

    uint8_t *ix = payload + 8;
    int8_t *eg = (int8_t *)(ix + g.ix_bytes);
    uint8_t *flags = ix + g.ix_bytes + g.eg_bytes;
    uint8_t *meta = flags + g.flags_bytes;
    uint8_t *codes_base = meta + g.meta_bytes;
    codec_put_u32(payload, 0);
    codec_put_u32(payload + 4, 0);
    memset(eg, 0, g.eg_bytes);
    /* e: absmax * 2^-e <= 2^14, and a rotated tile (up to sqrt(G) larger)
     * still below 2^(14 + lg/2) <= 65504 needs e raised by ceil(lg/2); at most
     * 128 + 6 - 14 for G <= 4096 */
    for (uint64_t i = 0; i < g.B * g.n_eg; i++) {
        int ex = 0;
        if (gmax[i] > 0.0f)
            frexpf(gmax[i], &ex); /* absmax < 2^ex */
        int32_t e = gmax[i] > 0.0f ? ex + (int32_t)((g.lg + 1) / 2) - 14 : 0;
        eg[i] = (int8_t)(e < S_EXP_MIN ? S_EXP_MIN : e);
    }
    free(gmax);
    memset(flags, 0, g.flags_bytes);
    memset(codes_base, 0, g.B * g.code_bytes);

    float v[4096];
    uint16_t codes[4096];
    const uint32_t fbits = 2 + g.lg;
    for (uint64_t b = 0; b < g.B; b++) {
        if (p->window)
            s_select_windows(ekey + b * g.n_alloc, g.n_alloc, g.n_hi, p->window, hi);
        else
            s_select_top(ekey + b * g.n_alloc, g.n_alloc, g.n_hi, hi);
        uint8_t *out = codes_base + b * g.code_bytes;
        uint64_t hq = 0; /* the sample's high quant tiles so far */
        for (uint64_t s = 0; s < g.S; s++) {
            const float *row = x + (b * g.S + s) * C;
            for (uint32_t q = 0; q < g.Q; q++) {
                uint64_t tile = (b * g.S + s) * g.Q + q, t = s * g.Q + q;
                if (t % CODEC_TAH_IX_TILES == 0)
                    codec_put_u32(ix + 4 * (b * g.ix_n + t / CODEC_TAH_IX_TILES), (uint32_t)hq);
                uint32_t c0 = q * G, w = (C - c0 < G) ? C - c0 : G;
                const float down = ldexpf(1.0f, -s_tile_exp(&g, eg, b, s, q));
                /* scale into the metadata's range; top two magnitudes decide rotation */
                s_tile_stats_t st;
                s_load_tile(v, row + c0, w, G, down, &st);
                uint32_t piv = st.piv;
                uint32_t rot = st.m1 > p->tau * (st.m2 + p->rho * down);
                if (rot) {
                    float tmp = v[0];
                    v[0] = v[piv];
                    v[piv] = tmp;
                    fwht_f32(v, G);
                    s_minmax(v, G, &st.mn, &st.mx); /* the padding is part of the transform */
                } else
                    piv = 0;
                uint32_t is_hi = hi[s * g.nA + q / g.k];
                uint32_t bits = is_hi ? g.bh : g.bl;
                hq += is_hi;
                uint16_t min16, step16;
                s_quant_tile(v, G, bits, st.mn, st.mx, codes, &min16, &step16);
                if ((step16 & 0x7c00u) == 0x7c00u || (min16 & 0x7c00u) == 0x7c00u) {
                    free(hi);
                    free(ekey);
                    return TAH_ERANGE; /* cannot happen for finite input; kept as a guard */
                }
                bitpack_pack(out, codes, G, bits);
                out += (size_t)G * bits / 8;
                codec_put_u16(meta + 4 * tile, min16);
                codec_put_u16(meta + 4 * tile + 2, step16);
                s_put_bits(flags, tile * fbits, fbits, is_hi | (rot << 1) | (piv << 2));
            }
        }
    }
    free(hi);
    free(ekey);
    return 0;
}

static int s_decode(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *payload, float *out)
{
    const codec_tah_params_t *p = &spec->p.tah;
    s_geom_t g;
    s_geometry(p, shape, &g);
    const uint32_t C = shape.c, G = g.G, fbits = 2 + g.lg;
    if (codec_get_u32(payload) != 0 || codec_get_u32(payload + 4) != 0)
        return TAH_ECORRUPT;
    const uint8_t *ix = payload + 8;
    const int8_t *eg = (const int8_t *)(ix + g.ix_bytes);
    for (uint64_t i = 0; i < g.B * g.n_eg; i++)
        if (eg[i] < S_EXP_MIN)
            return TAH_ECORRUPT;
    const uint8_t *flags = ix + g.ix_bytes + g.eg_bytes;
    const uint8_t *meta = flags + g.flags_bytes;
    const uint8_t *codes_base = meta + g.meta_bytes;
    float v[4096];
    uint16_t codes[4096];

    for (uint64_t b = 0; b < g.B; b++) {
        /* validate this sample's flags before trusting any offset they imply:
         * one width per allocation tile, exactly n_hi high allocation tiles,
         * no pivot without rotation, every index entry the count it names */
        uint64_t n_hi = 0, hq = 0;
        for (uint64_t s = 0; s < g.S; s++) {
            for (uint32_t q = 0; q < g.Q; q++) {
                uint64_t tile = (b * g.S + s) * g.Q + q, t = s * g.Q + q;
                uint32_t f = s_get_bits(flags, tile * fbits, fbits);
                if (t % CODEC_TAH_IX_TILES == 0 &&
                    codec_get_u32(ix + 4 * (b * g.ix_n + t / CODEC_TAH_IX_TILES)) != hq)
                    return TAH_ECORRUPT;
                hq += f & 1u;
                if (!(f & 2u) && (f >> 2) != 0)
                    return TAH_ECORRUPT;
                if (q % g.k == 0)
                    n_hi += f & 1u;
                else if ((f & 1u) != (s_get_bits(flags, (tile - 1) * fbits, fbits) & 1u))
                    return TAH_ECORRUPT;
            }
        }
        if (n_hi != g.n_hi)
            return TAH_ECORRUPT;

        const uint8_t *in = codes_base + b * g.code_bytes;
        for (uint64_t s = 0; s < g.S; s++) {
            float *row = out + (b * g.S + s) * C;
            for (uint32_t q = 0; q < g.Q; q++) {
                uint64_t tile = (b * g.S + s) * g.Q + q;
                uint32_t f = s_get_bits(flags, tile * fbits, fbits);
                uint32_t bits = (f & 1u) ? g.bh : g.bl;
                uint16_t min16 = codec_get_u16(meta + 4 * tile);
                uint16_t step16 = codec_get_u16(meta + 4 * tile + 2);
                if ((min16 & 0x7c00u) == 0x7c00u || (step16 & 0x7c00u) == 0x7c00u || (step16 & 0x8000u))
                    return TAH_ECORRUPT;
                const int32_t e = s_tile_exp(&g, eg, b, s, q);
                float minf = ldexpf(half_to_f32(min16), e), step = ldexpf(half_to_f32(step16), e);
                bitpack_unpack(codes, in, G, bits);
                in += (size_t)G * bits / 8;
                for (uint32_t i = 0; i < G; i++)
                    v[i] = minf + (float)codes[i] * step;
                if (f & 2u) {
                    uint32_t piv = f >> 2;
                    fwht_f32(v, G);
                    float tmp = v[0];
                    v[0] = v[piv];
                    v[piv] = tmp;
                }
                uint32_t c0 = q * G, w = (C - c0 < G) ? C - c0 : G;
                memcpy(row + c0, v, w * sizeof *v);
            }
        }
    }
    return 0;
}

const codec_ops_t codec_tah_ops = { CODEC_TAH, "tah", s_payload_size, s_encode, s_decode };
