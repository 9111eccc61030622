/* ash.c — ASH-FP8 (TACO): adaptive scale, Hadamard rotation, FP8 E4M3.
 *
 * The tensor is N = B*S*C contiguous floats cut into blocks of n = `block`
 * (a power of two); the last block is zero-padded to n. Per block:
 *   sigma = sqrt(S / n) + eps           (double; mean over the PADDED
 *                                         length n; S below)
 *   alpha = tau / sigma                 (double, then float, clamped to the
 *                                         normal float range [2^-126, 2^127]
 *                                         so it is finite and > 0)
 *   z     = fwht_f32(alpha * x)         (orthonormal H/sqrt(n); alpha*x in float)
 *   s     = max|z| / 448                (float, at least 2^-149; TAH_ERANGE
 *                                         if z overflowed: tau * n > FLT_MAX)
 *   q     = e4m3(z * (1/s))             (round to nearest even, saturating;
 *                                         1/s is rounded once, so a code can
 *                                         land on 448 by saturation; z / s
 *                                         when 1/s overflows)
 * A block whose z is all zero (x all zero) stores alpha = 0, s = 0 and
 * codes 0.
 * S, the sum of squares: the pairwise sum (adjacent halves, recursively:
 * T(x[a, a+2w)) = T(x[a, a+w)) + T(x[a+w, a+2w))) of the float squares
 * fl(x_i * x_i) over the padded block, in float. Where that S is not in
 * [2^-64, FLT_MAX], the same tree of the squares of x_i * 2^80 (S below
 * 2^-64: small values whose squares may have lost bits) or of x_i * 2^-80
 * (S above: squares that overflowed), times 2^-160 or 2^160 in double.
 * (Until November 2026 S was always a double sum of 8 chains i mod 8: a GPU
 * encoder then staged every square through shared memory and converted it
 * to double; the float tree is what its registers and shuffles give,
 * 68 -> 74 % of copy on an H200. Frames differ only in alpha's last
 * bits; decoders read alpha from the frame.)
 *
 * Payload: for each block b = 0..ceil(N/n)-1, in order:
 *   f32 alpha, f32 s (little-endian), then n E4M3 codes (one byte each).
 * So a frame costs 8 + 64/n bits per element plus the header (8.25 at n=256).
 *
 * Decode: x = fwht_f32(e4m3_to_f32(q) * s) * (1/alpha), clamped to
 * +-FLT_MAX (rounding can step past it where |x| is close), writing only the
 * N real elements. The last, partial block of m < n real elements is decoded
 * inside its own m output slots: the first m outputs of an n-point Hadamard
 * only need the codes folded (summed over aliases) onto a smaller power of
 * two, see s_decode_partial. Decoding never allocates.
 *
 * Validation: alpha and s must be finite with the sign bit clear; s > 0
 * needs alpha in [2^-126, 2^127] (what the encoder writes); s = 0 decodes
 * to zeros. Codes 0x7f and 0xff (E4M3 NaN) are rejected. Anything else is
 * TAH_ECORRUPT. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec_impl.h"
#include "fp8.h"  /* fp8_e4m3_{from,to}_f32_scaled_n, fp8_e4m3_from_f32 */
#include "fwht.h" /* fwht_f32 */

#define S_META 8u         /* f32 alpha + f32 s */
#define S_FOLD_CHUNK 256u /* codes decoded at a time by the partial-block fold */

static uint64_t s_nblocks(uint64_t n, uint32_t block) { return (n + block - 1) / block; }

static uint64_t s_payload_size(const codec_spec_t *spec, codec_shape_t shape)
{
    uint32_t block = spec->p.ash.block;
    return s_nblocks(codec_shape_elems(shape), block) * (S_META + block);
}

/* S (the header) of x[0..m), the block's real values padded with zeros to
 * n (a power of two), each x scaled by sc first (a power of two): the tree
 * a level at a time, each level's sums of adjacent pairs packed (so the
 * loops vectorise). t: 3n/2 floats of scratch. */
static float s_tree(const float *x, uint32_t m, uint32_t n, float sc, float *t)
{
    for (uint32_t i = 0; i < m; i++) {
        float u = x[i] * sc;
        t[i] = u * u;
    }
    for (uint32_t i = m; i < n; i++)
        t[i] = 0.0f;
    float *a = t, *b = t + n;
    for (uint32_t len = n / 2; len >= 1; len /= 2) {
        for (uint32_t j = 0; j < len; j++)
            b[j] = a[2 * j] + a[2 * j + 1];
        float *c = a;
        a = b;
        b = c;
    }
    return a[0];
}

static double s_sumsq(const float *x, uint32_t m, uint32_t n, float *t)
{
    float s = s_tree(x, m, n, 1.0f, t);
    if (s >= 0x1p-64f && s <= FLT_MAX)
        return s;
    if (s < 0x1p-64f) /* small: no square of x 2^80 overflows (each x^2 < 2^-64) */
        return (double)s_tree(x, m, n, 0x1p80f, t) * 0x1p-160;
    return (double)s_tree(x, m, n, 0x1p-80f, t) * 0x1p160; /* squares overflowed (or a NaN) */
}

/* max |z| over n floats as float bits (n a power of two >= 16). Comparing
 * the magnitude bits as integers orders non-negative floats and puts NaN
 * above Inf, so a NaN in z is seen (as a value >= 0x7f800000). */
static uint32_t s_absmax_bits(const float *z, uint32_t n)
{
    uint32_t acc[16] = { 0 };
    for (uint32_t i = 0; i < n; i += 16)
        for (uint32_t k = 0; k < 16; k++) {
            uint32_t a;
            memcpy(&a, z + i + k, sizeof a); /* bit cast without aliasing the float stores */
            a &= 0x7fffffffu;
            acc[k] = a > acc[k] ? a : acc[k];
        }
    uint32_t m = 0;
    for (uint32_t k = 0; k < 16; k++)
        m = acc[k] > m ? acc[k] : m;
    return m;
}

/* Encode one block: x holds m <= n real values; buf is 3n/2 floats of scratch. */
static int s_encode_block(const codec_ash_params_t *p, const float *x, uint32_t m, float *buf, uint8_t *dst)
{
    const uint32_t n = p->block;
    double sigma = sqrt(s_sumsq(x, m, n, buf) / (double)n) + (double)p->eps;
    double alpha_d = sigma > 0.0 ? (double)p->tau / sigma : (double)FLT_MAX;
    if (alpha_d < (double)FLT_MIN)
        alpha_d = (double)FLT_MIN;
    if (alpha_d > 0x1p127)
        alpha_d = 0x1p127;
    float alpha = (float)alpha_d;
    for (uint32_t i = 0; i < m; i++)
        buf[i] = alpha * x[i];
    for (uint32_t i = m; i < n; i++)
        buf[i] = 0.0f;
    fwht_f32(buf, n);
    uint32_t amax_bits = s_absmax_bits(buf, n);
    if (amax_bits >= 0x7f800000u)
        return TAH_ERANGE; /* tau * block beyond float range: H overflowed */
    if (amax_bits == 0) {
        memset(dst, 0, S_META + n);
        return 0;
    }
    float s = codec_bits_f32(amax_bits) / FP8_E4M3_MAX;
    if (s == 0.0f)
        s = 0x1p-149f; /* max|z| below 448 * 2^-150 (tiny tau): z/s stays <= 448 */
    codec_put_f32(dst, alpha);
    codec_put_f32(dst + 4, s);
    float inv = 1.0f / s;
    if (inv <= FLT_MAX) {
        fp8_e4m3_from_f32_scaled_n(dst + S_META, buf, inv, n);
    } else { /* s subnormal (tiny tau): 1/s overflows, divide instead */
        for (uint32_t i = 0; i < n; i++)
            dst[S_META + i] = fp8_e4m3_from_f32(buf[i] / s);
    }
    return 0;
}

static int s_encode(const codec_spec_t *spec, codec_shape_t shape, const float *x, uint8_t *payload)
{
    const codec_ash_params_t *p = &spec->p.ash;
    const uint32_t n = p->block;
    const uint64_t total = codec_shape_elems(shape);
    const uint64_t nb = s_nblocks(total, n);
    float *buf = malloc((size_t)n * 3 / 2 * sizeof *buf);
    if (!buf)
        return TAH_ENOMEM;
    int rc = 0;
    for (uint64_t b = 0; b < nb && rc == 0; b++) {
        uint64_t off = b * n;
        uint32_t m = (uint32_t)(total - off < n ? total - off : n);
        rc = s_encode_block(p, x + off, m, buf, payload + b * (uint64_t)(S_META + n));
    }
    free(buf);
    return rc;
}

/* Check a block's scalars and codes. *s gets s (0: the block decodes to
 * zeros), *inv_alpha 1/alpha. The encoder keeps alpha in [2^-126, 2^127],
 * so a block with s > 0 must too; 1/alpha is then a finite normal float. */
static int s_check_block(const uint8_t *src, uint32_t n, float *s_out, float *inv_alpha)
{
    uint32_t ua = codec_get_u32(src), us = codec_get_u32(src + 4);
    /* finite and sign bit clear: the bits are below +Inf's */
    if (ua >= 0x7f800000u || us >= 0x7f800000u)
        return TAH_ECORRUPT;
    float alpha = codec_bits_f32(ua), s = codec_bits_f32(us);
    const uint8_t *q = src + S_META;
    uint32_t nan = 0;
    for (uint32_t i = 0; i < n; i++)
        nan |= (uint32_t)((q[i] & 0x7fu) == 0x7fu);
    if (nan)
        return TAH_ECORRUPT;
    *s_out = s;
    *inv_alpha = 0.0f;
    if (s == 0.0f)
        return 0;
    if (alpha < FLT_MIN || alpha > 0x1p127f)
        return TAH_ECORRUPT;
    *inv_alpha = 1.0f / alpha;
    return 0;
}

/* out[j] = clamp(out[j] * k, +-FLT_MAX) for j < m: a value within rounding
 * of +-FLT_MAX may step past it; the true value did not. */
static void s_scale_clamp(float *out, uint32_t m, float k)
{
    for (uint32_t j = 0; j < m; j++) {
        float y = out[j] * k;
        y = y > FLT_MAX ? FLT_MAX : y;
        y = y < -FLT_MAX ? -FLT_MAX : y;
        out[j] = y;
    }
}

/* out[j] = sum over k in [0,n) with k mod p == j of sign(k) * e4m3(q[k]) * s,
 * for j < p, where sign(k) = -1 when bit `negbit` of k is set (0: all +1). */
static void s_fold(float *out, const uint8_t *q, uint32_t n, uint32_t p, uint32_t negbit, float s)
{
    float tmp[S_FOLD_CHUNK];
    for (uint32_t j = 0; j < p; j++)
        out[j] = 0.0f;
    for (uint32_t c = 0; c < n; c += p) {
        float sg = (c & negbit) ? -s : s;
        for (uint32_t j0 = 0; j0 < p; j0 += S_FOLD_CHUNK) {
            uint32_t k = p - j0 < S_FOLD_CHUNK ? p - j0 : S_FOLD_CHUNK;
            fp8_e4m3_to_f32_scaled_n(tmp, q + c + j0, sg, k);
            for (uint32_t j = 0; j < k; j++)
                out[j0 + j] += tmp[j];
        }
    }
}

static uint32_t s_pow2_ceil(uint32_t m)
{
    uint32_t p = 1;
    while (p < m)
        p *= 2;
    return p;
}

/* First m < n outputs of the n-point orthonormal FWHT of w = e4m3(q) * s,
 * into out[0..m), times inv_alpha. Index bits of the Hadamard:
 * H_P[i][j] = (-1)^popcount(i & j), so outputs i < P only see w folded
 * modulo P. With P = pow2_ceil(m) and h = P/2 (when m < P):
 *   out[0..h)   = H_h (fold of w modulo h)
 *   out[h..m)   = first m-h entries of H_h (a - b), a/b the two halves of the
 *                 fold modulo P, i.e. w folded modulo p = pow2_ceil(m-h) with
 *                 sign -1 where bit h of the index is set.
 * The second part is computed first in out[0..p) (p <= h) and moved up.
 * Each fwht_f32 of size k scales by 1/sqrt(k); the rest, sqrt(k/n), after. */
static void s_decode_partial(float *out, const uint8_t *q, uint32_t n, uint32_t m, float s, float inv_alpha)
{
    uint32_t P = s_pow2_ceil(m);
    if (P == m) {
        s_fold(out, q, n, P, 0, s);
        fwht_f32(out, P);
        s_scale_clamp(out, m, (float)sqrt((double)P / (double)n));
        s_scale_clamp(out, m, inv_alpha);
        return;
    }
    uint32_t h = P / 2, r = m - h, p = s_pow2_ceil(r);
    s_fold(out, q, n, p, h, s);
    fwht_f32(out, p);
    for (uint32_t j = 0; j < r; j++)
        out[h + j] = out[j];
    s_scale_clamp(out + h, r, (float)sqrt((double)p / (double)n));
    s_fold(out, q, n, h, 0, s);
    fwht_f32(out, h);
    s_scale_clamp(out, h, (float)sqrt((double)h / (double)n));
    s_scale_clamp(out, m, inv_alpha);
}

static int s_decode(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *payload, float *out)
{
    const uint32_t n = spec->p.ash.block;
    const uint64_t total = codec_shape_elems(shape);
    const uint64_t nb = s_nblocks(total, n);
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *src = payload + b * (uint64_t)(S_META + n);
        const uint8_t *q = src + S_META;
        uint64_t off = b * n;
        uint32_t m = (uint32_t)(total - off < n ? total - off : n);
        float s, inv_alpha;
        int rc = s_check_block(src, n, &s, &inv_alpha);
        if (rc != 0)
            return rc;
        float *o = out + off;
        if (s == 0.0f) {
            memset(o, 0, (size_t)m * sizeof *o);
        } else if (m == n) {
            fp8_e4m3_to_f32_scaled_n(o, q, s, n);
            fwht_f32(o, n);
            s_scale_clamp(o, n, inv_alpha);
        } else {
            s_decode_partial(o, q, n, m, s, inv_alpha);
        }
    }
    return 0;
}

const codec_ops_t codec_ash_ops = { CODEC_ASH_FP8, "ash-fp8", s_payload_size, s_encode, s_decode };
