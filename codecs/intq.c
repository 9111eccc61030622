/* intq.c — grouped INT-b quantisation (Flash-Communication style).
 *
 * The tensor is N = B*S*C contiguous floats in groups of `group` elements
 * (the last group may be shorter); b = `bits` in {2,3,4,5,6,8}.
 *
 * Block exponents: fp16 metadata cannot describe |x| > 65504, and loses
 * precision on tiny values, so every block of S_BLOCK (64) consecutive groups
 * carries one power-of-two exponent e and its groups' metadata is stored
 * relative to 2^e:
 *   e = clamp(ceil(log2(absmax of the block)) - 14, -126, 114)   (0 for an all-zero block)
 * so absmax * 2^-e <= 2^14 and both 2^e and 2^-e are normal floats. The
 * encoder works on xs = x * 2^-e (exact unless xs is a float subnormal,
 * i.e. x is 2^-140 below its block's absmax). Any finite float32 tensor is
 * encodable. A block's exponent depends on that block alone, so the encoder
 * reads x once, block by block (until November 2026 one exponent served the
 * whole frame, which took a pass over all of x first; frame version 1).
 *
 * Asymmetric (default), L = 2^b - 1:
 *   mn   = min(xs) rounded DOWN to fp16
 *   step = (max(xs) - mn) / L rounded UP to fp16, so [mn, mn + L*step]
 *          covers the group (up to double rounding of max - mn)
 *   q    = clamp(round((xs - mn) * (1/step)), 0, L)   (1/step rounded once;
 *          0 when step = 0), round = nearest, ties to EVEN
 *   x^   = (mn + q*step) * 2^e
 * Symmetric, qmax = 2^(b-1) - 1:
 *   step = max|xs| / qmax rounded UP to fp16
 *   q    = clamp(round(xs * (1/step)), -qmax, qmax), code = q + qmax
 *   x^   = (code - qmax) * step * 2^e; code 2^b - 1 is invalid
 * Decoded values are clamped to +-FLT_MAX (rounding the metadata outward
 * can step past the largest float when |x| is within 2^-10 of it).
 *
 * Payload (little-endian):
 *   per block: i8 e; zero bytes up to a multiple of 4
 *   per group: asymmetric u16 fp16 mn, u16 fp16 step; symmetric u16 fp16 step
 *   then each group's codes, b bits each, packed with bitpack_pack (LSB
 *   first), every group starting on a byte boundary: a full group takes
 *   ceil(group*b/8) bytes, the last ceil(len*b/8); padding bits are 0.
 * At b = 4, group = 128 asymmetric: 4 + 32/128 + 8/8192 = 4.251 bits per
 * element, plus the header.
 *
 * Decode rejects (TAH_ECORRUPT) an e outside [-126, 114], non-zero bytes
 * after the exponents, a non-finite mn, a negative or non-finite step, an
 * invalid symmetric code and non-zero padding bits. */
#include <float.h>
#include <math.h>

#include "bitpack.h" /* bitpack_pack, bitpack_unpack, bitpack_bytes */
#include "codec_impl.h"
#include "half.h"    /* half_from_f32_down, half_from_f32_up, half_to_f32 */

#define S_CHUNK 1024u /* codes per packing chunk; a multiple of 8 keeps chunks byte-aligned */
#define S_ROUND 12582912.0f /* 1.5 * 2^23: (t + S_ROUND) - S_ROUND rounds |t| < 2^22 to nearest even */
#define S_EXP_MIN (-126)
#define S_EXP_MAX 114
#define S_BLOCK 64u /* groups per exponent */

static uint64_t s_ngroups(uint64_t n, uint32_t group) { return (n + group - 1) / group; }
static uint32_t s_meta_bytes(const codec_int_params_t *p) { return p->symmetric ? 2u : 4u; }
/* bytes of the exponents and their padding: the metadata's offset */
static uint64_t s_exp_bytes(uint64_t ng) { return ((ng + S_BLOCK - 1) / S_BLOCK + 3) & ~(uint64_t)3; }

static uint64_t s_payload_size(const codec_spec_t *spec, codec_shape_t shape)
{
    const codec_int_params_t *p = &spec->p.intq;
    uint64_t n = codec_shape_elems(shape);
    uint64_t full = n / p->group, rem = n % p->group;
    uint64_t codes = full * bitpack_bytes(p->group, p->bits) + (rem ? bitpack_bytes(rem, p->bits) : 0);
    return s_exp_bytes(s_ngroups(n, p->group)) + s_meta_bytes(p) * s_ngroups(n, p->group) + codes;
}

/* min and max of x[0..m) (vectorises: independent lanes) */
static void s_minmax(const float *x, uint64_t m, float *mn, float *mx)
{
    float lo[16], hi[16];
    for (uint32_t k = 0; k < 16; k++)
        lo[k] = hi[k] = x[0];
    uint64_t i = 0;
    for (; i + 16 <= m; i += 16)
        for (uint32_t k = 0; k < 16; k++) {
            float v = x[i + k];
            lo[k] = v < lo[k] ? v : lo[k];
            hi[k] = v > hi[k] ? v : hi[k];
        }
    for (; i < m; i++) {
        lo[0] = x[i] < lo[0] ? x[i] : lo[0];
        hi[0] = x[i] > hi[0] ? x[i] : hi[0];
    }
    float a = lo[0], b = hi[0];
    for (uint32_t k = 1; k < 16; k++) {
        a = lo[k] < a ? lo[k] : a;
        b = hi[k] > b ? hi[k] : b;
    }
    *mn = a;
    *mx = b;
}

/* e = clamp(ceil(log2(amax)) - 14, S_EXP_MIN, S_EXP_MAX); 0 for amax = 0 */
static int32_t s_block_exp(float amax)
{
    if (amax == 0.0f)
        return 0;
    int ex;
    float f = frexpf(amax, &ex); /* amax = f * 2^ex, f in [0.5, 1) */
    int32_t e = (f == 0.5f ? ex - 1 : ex) - 14;
    return e < S_EXP_MIN ? S_EXP_MIN : (e > S_EXP_MAX ? S_EXP_MAX : e);
}

/* fp16 value >= v / L (v >= 0 finite, L <= 255): the float quotient is
 * nudged up when it fell short, then rounded up to fp16 (finite here). */
static uint16_t s_step_up(double v, uint32_t L)
{
    float st = (float)(v / L);
    if ((double)st * L < v)
        st = nextafterf(st, INFINITY);
    return half_from_f32_up(st);
}

static void s_quant_asym(uint16_t *codes, const float *x, uint32_t m, float pdown, float mn, float inv, float L)
{
    for (uint32_t i = 0; i < m; i++) {
        float t = (x[i] * pdown - mn) * inv;
        t = t < 0.0f ? 0.0f : t;
        t = t > L ? L : t;
        codes[i] = (uint16_t)((t + S_ROUND) - S_ROUND);
    }
}

static void s_quant_sym(uint16_t *codes, const float *x, uint32_t m, float pdown, float inv, float qmaxf,
                        int32_t qmax)
{
    for (uint32_t i = 0; i < m; i++) {
        float t = (x[i] * pdown) * inv;
        t = t < -qmaxf ? -qmaxf : t;
        t = t > qmaxf ? qmaxf : t;
        codes[i] = (uint16_t)((int32_t)((t + S_ROUND) - S_ROUND) + qmax);
    }
}

static int s_encode(const codec_spec_t *spec, codec_shape_t shape, const float *x, uint8_t *payload)
{
    const codec_int_params_t *p = &spec->p.intq;
    const uint32_t bits = p->bits, group = p->group, mb = s_meta_bytes(p);
    const uint32_t L = (1u << bits) - 1u;
    const int32_t qmax = (1 << (bits - 1)) - 1;
    const uint64_t n = codec_shape_elems(shape), ng = s_ngroups(n, group), nblk = (ng + S_BLOCK - 1) / S_BLOCK;
    const uint64_t gbytes = bitpack_bytes(group, bits), eb = s_exp_bytes(ng);
    uint8_t *meta = payload + eb, *code_base = payload + eb + (uint64_t)mb * ng;
    uint16_t codes[S_CHUNK];
    float glo[S_BLOCK], ghi[S_BLOCK]; /* the block's groups' min and max */
    for (uint64_t k = nblk; k < eb; k++)
        payload[k] = 0;
    for (uint64_t blk = 0; blk < nblk; blk++) {
        const uint64_t g0 = blk * S_BLOCK, g1 = ng - g0 < S_BLOCK ? ng : g0 + S_BLOCK;
        float amax = 0.0f;
        for (uint64_t g = g0; g < g1; g++) {
            const uint64_t off = g * group;
            const uint32_t len = (uint32_t)(n - off < group ? n - off : group);
            s_minmax(x + off, len, &glo[g - g0], &ghi[g - g0]);
            const float a = fabsf(glo[g - g0]) > fabsf(ghi[g - g0]) ? fabsf(glo[g - g0]) : fabsf(ghi[g - g0]);
            amax = a > amax ? a : amax;
        }
        const int32_t e = s_block_exp(amax);
        const float pdown = ldexpf(1.0f, -e);
        payload[blk] = (uint8_t)(int8_t)e;
        for (uint64_t g = g0; g < g1; g++) {
            const uint64_t off = g * group;
            const uint32_t len = (uint32_t)(n - off < group ? n - off : group);
            const float *gx = x + off;
            const float lo = glo[g - g0] * pdown, hi = ghi[g - g0] * pdown;
            float mn = 0.0f, inv;
            if (p->symmetric) {
                float amax_g = fabsf(lo) > fabsf(hi) ? fabsf(lo) : fabsf(hi);
                uint16_t sh = s_step_up((double)amax_g, (uint32_t)qmax);
                codec_put_u16(meta + 2 * g, sh);
                float step = half_to_f32(sh);
                inv = step > 0.0f ? 1.0f / step : 0.0f;
            } else {
                uint16_t mh = half_from_f32_down(lo);
                mn = half_to_f32(mh);
                uint16_t sh = s_step_up((double)hi - (double)mn, L);
                codec_put_u16(meta + 4 * g, mh);
                codec_put_u16(meta + 4 * g + 2, sh);
                float step = half_to_f32(sh);
                inv = step > 0.0f ? 1.0f / step : 0.0f;
            }
            uint8_t *dst = code_base + g * gbytes;
            for (uint32_t k = 0; k < len; k += S_CHUNK) {
                uint32_t m = len - k < S_CHUNK ? len - k : S_CHUNK;
                if (p->symmetric)
                    s_quant_sym(codes, gx + k, m, pdown, inv, (float)qmax, qmax);
                else
                    s_quant_asym(codes, gx + k, m, pdown, mn, inv, (float)L);
                bitpack_pack(dst + (size_t)k / 8 * bits, codes, m, bits);
            }
        }
    }
    return 0;
}

static int s_decode(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *payload, float *out)
{
    const codec_int_params_t *p = &spec->p.intq;
    const uint32_t bits = p->bits, group = p->group, mb = s_meta_bytes(p);
    const int32_t qmax = (1 << (bits - 1)) - 1;
    const uint32_t bad_code = p->symmetric ? (1u << bits) - 1u : (1u << bits); /* asymmetric: all valid */
    const uint64_t n = codec_shape_elems(shape), ng = s_ngroups(n, group), nblk = (ng + S_BLOCK - 1) / S_BLOCK;
    const uint64_t gbytes = bitpack_bytes(group, bits), eb = s_exp_bytes(ng);
    for (uint64_t k = 0; k < nblk; k++) {
        const int32_t e = (int8_t)payload[k];
        if (e < S_EXP_MIN || e > S_EXP_MAX)
            return TAH_ECORRUPT;
    }
    for (uint64_t k = nblk; k < eb; k++)
        if (payload[k] != 0)
            return TAH_ECORRUPT;
    const uint8_t *meta = payload + eb, *code_base = payload + eb + (uint64_t)mb * ng;
    uint16_t codes[S_CHUNK];
    float pup = 1.0f;
    for (uint64_t g = 0; g < ng; g++) {
        const uint64_t off = g * group;
        const uint32_t len = (uint32_t)(n - off < group ? n - off : group);
        if (g % S_BLOCK == 0)
            pup = ldexpf(1.0f, (int8_t)payload[g / S_BLOCK]);
        float mn = 0.0f, step;
        uint16_t sh;
        if (p->symmetric) {
            sh = codec_get_u16(meta + 2 * g);
        } else {
            uint16_t mh = codec_get_u16(meta + 4 * g);
            if ((mh & 0x7c00u) == 0x7c00u)
                return TAH_ECORRUPT; /* Inf or NaN minimum */
            mn = half_to_f32(mh);
            sh = codec_get_u16(meta + 4 * g + 2);
        }
        if ((sh & 0x8000u) || (sh & 0x7c00u) == 0x7c00u)
            return TAH_ECORRUPT; /* negative, Inf or NaN step */
        step = half_to_f32(sh);
        const float bias = p->symmetric ? -(float)qmax * step : mn; /* exact: qmax*step fits 24 bits */
        const uint8_t *src = code_base + g * gbytes;
        if (!bitpack_tail_clear(src, len, bits))
            return TAH_ECORRUPT; /* padding bits must be zero */
        for (uint32_t j = 0; j < len; j += S_CHUNK) {
            uint32_t m = len - j < S_CHUNK ? len - j : S_CHUNK;
            bitpack_unpack(codes, src + (size_t)j / 8 * bits, m, bits);
            uint32_t bad = 0;
            float *o = out + off + j;
            for (uint32_t i = 0; i < m; i++) {
                bad |= (uint32_t)(codes[i] == bad_code);
                float y = ((float)codes[i] * step + bias) * pup;
                y = y > FLT_MAX ? FLT_MAX : y;
                y = y < -FLT_MAX ? -FLT_MAX : y;
                o[i] = y;
            }
            if (bad)
                return TAH_ECORRUPT;
        }
    }
    return 0;
}

const codec_ops_t codec_int_ops = { CODEC_INT, "int", s_payload_size, s_encode, s_decode };
