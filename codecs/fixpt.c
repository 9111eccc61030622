/* fixpt.c — scaled fixed-point for activation gradients: g^ = Q(c*g)/c.
 *
 * The tensor is N = B*S*C contiguous floats in groups of `group` elements
 * (the last group may be shorter). With c = `scale`, b = `bits` and
 * qmax = 2^(b-1) - 1, per group:
 *   y = c * g                           (float product)
 *   d = max|y| / qmax, rounded UP to fp16 (so qmax * d >= max|y| and no
 *       code clips); d > 65504 is TAH_ERANGE: lower the scale c. A group
 *       of zeros has d = 0.
 *   t = clamp(y * (1/d), -qmax, qmax)   (1/d rounded once; 0 when d = 0)
 *   nearest:    q = round(t), ties to EVEN
 *   stochastic: q = floor(t) + (u < t - floor(t)), u uniform in [0,1) on a
 *               2^-23 grid from a counter-based hash of (seed, i), i the
 *               element's index in the tensor (i < CODEC_MAX_ELEMS = 2^31):
 *                 k   = mix(mix(seed) + 0x9e3779b97f4a7c15) >> 32
 *                 u_i = (lowbias32(i xor k) >> 9) * 2^-23
 *               where mix is the splitmix64 finaliser (xor-shift 30, times
 *               0xbf58476d1ce4e5b9, xor-shift 27, times 0x94d049bb133111eb,
 *               xor-shift 31) and lowbias32 the 32-bit hash x ^= x >> 16,
 *               x *= 0x7feb352d, x ^= x >> 15, x *= 0x846ca68b, x ^= x >> 16:
 *               a few 32-bit operations per element (SIMD lanes, GPU lanes).
 *               Reproducible, independent of thread order, and the same on
 *               a GPU. E[q] = t up to the 2^-23 grid of u.
 *   code = q + qmax, in [0, 2*qmax] = [0, 2^b - 2]; code 2^b - 1 is invalid.
 * Decode: g^ = (code - qmax) * (d / c).
 *
 * Payload:
 *   ngroups u16 fp16 steps d (little-endian), group order
 *   then each group's codes, b bits each, packed with bitpack_pack (LSB
 *   first), every group starting on a byte boundary: a full group takes
 *   ceil(group*b/8) bytes, the last group ceil(len*b/8); padding bits are 0.
 * At b = 8, group = 128: 8 + 16/128 = 8.125 bits per element plus header.
 *
 * Decode rejects (TAH_ECORRUPT) a step that is negative, Inf or NaN, the
 * code 2^b - 1, and non-zero padding bits. */
#include <float.h>
#include <math.h>

#include "bitpack.h" /* bitpack_pack, bitpack_unpack, bitpack_bytes */
#include "codec_impl.h"
#include "half.h"    /* half_from_f32_up, half_to_f32 */

#define S_CHUNK 1024u /* codes per packing chunk; a multiple of 8 keeps chunks byte-aligned */
#define S_ROUND 12582912.0f /* 1.5 * 2^23: (t + S_ROUND) - S_ROUND rounds |t| < 2^22 to nearest even */

static uint64_t s_ngroups(uint64_t n, uint32_t group) { return (n + group - 1) / group; }

static uint64_t s_payload_size(const codec_spec_t *spec, codec_shape_t shape)
{
    const codec_fixpt_params_t *p = &spec->p.fixpt;
    uint64_t n = codec_shape_elems(shape);
    uint64_t full = n / p->group, rem = n % p->group;
    uint64_t codes = full * bitpack_bytes(p->group, p->bits) + (rem ? bitpack_bytes(rem, p->bits) : 0);
    return 2 * s_ngroups(n, p->group) + codes;
}

/* max |x| over m finite floats (independent lanes: vectorises) */
static float s_absmax(const float *x, uint32_t m)
{
    float acc[16] = { 0 };
    uint32_t i = 0;
    for (; i + 16 <= m; i += 16)
        for (uint32_t k = 0; k < 16; k++) {
            float a = fabsf(x[i + k]);
            acc[k] = a > acc[k] ? a : acc[k];
        }
    for (; i < m; i++) {
        float a = fabsf(x[i]);
        acc[0] = a > acc[0] ? a : acc[0];
    }
    float mx = 0.0f;
    for (uint32_t k = 0; k < 16; k++)
        mx = acc[k] > mx ? acc[k] : mx;
    return mx;
}

static void s_quant_nearest(uint16_t *codes, const float *g, uint32_t m, float c, float inv, float qmaxf,
                            int32_t qmax)
{
    for (uint32_t i = 0; i < m; i++) {
        float t = (c * g[i]) * inv;
        t = t < -qmaxf ? -qmaxf : t;
        t = t > qmaxf ? qmaxf : t;
        float r = (t + S_ROUND) - S_ROUND;
        codes[i] = (uint16_t)((int32_t)r + qmax);
    }
}

/* lowbias32 (see the top) */
static inline uint32_t s_hash32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

/* elements index0 .. index0 + m - 1 with the key k (see the top): 32-bit
 * lanes only, so the loop vectorises */
static void s_quant_stochastic(uint16_t *codes, const float *g, uint32_t m, float c, float inv, float qmaxf,
                               int32_t qmax, uint32_t k, uint32_t index0)
{
    for (uint32_t i = 0; i < m; i++) {
        float t = (c * g[i]) * inv;
        t = t < -qmaxf ? -qmaxf : t;
        t = t > qmaxf ? qmaxf : t;
        int32_t fl = (int32_t)t;               /* truncation ... */
        fl -= (int32_t)((float)fl > t);        /* ... to floor */
        float frac = t - (float)fl;            /* exact for |t| >= 1, else rounded once */
        float u = (float)(s_hash32((index0 + i) ^ k) >> 9) * 0x1p-23f;
        codes[i] = (uint16_t)(fl + (int32_t)(u < frac) + qmax);
    }
}

static int s_encode(const codec_spec_t *spec, codec_shape_t shape, const float *x, uint8_t *payload)
{
    const codec_fixpt_params_t *p = &spec->p.fixpt;
    const uint32_t bits = p->bits, group = p->group;
    const int32_t qmax = (1 << (bits - 1)) - 1;
    const float qmaxf = (float)qmax, c = p->scale;
    const uint64_t n = codec_shape_elems(shape), ng = s_ngroups(n, group);
    const uint64_t gbytes = bitpack_bytes(group, bits);
    const uint32_t key = codec_fixpt_key(p->seed); /* k (see the top) */
    uint16_t codes[S_CHUNK];
    uint8_t *code_base = payload + 2 * ng;
    for (uint64_t g = 0; g < ng; g++) {
        const uint64_t off = g * group;
        const uint32_t len = (uint32_t)(n - off < group ? n - off : group);
        const float *gx = x + off;
        float ymax = c * s_absmax(gx, len); /* = max|c*g|: rounding is monotonic */
        if (!(ymax <= FLT_MAX))
            return TAH_ERANGE;
        float d = ymax / qmaxf;
        if ((double)d * qmax < (double)ymax)
            d = nextafterf(d, INFINITY);
        uint16_t dh = half_from_f32_up(d);
        if ((dh & 0x7c00u) == 0x7c00u)
            return TAH_ERANGE; /* step above 65504: the scale c is too large */
        codec_put_u16(payload + 2 * g, dh);
        float df = half_to_f32(dh);
        float inv = df > 0.0f ? 1.0f / df : 0.0f;
        uint8_t *dst = code_base + g * gbytes;
        for (uint32_t k = 0; k < len; k += S_CHUNK) {
            uint32_t m = len - k < S_CHUNK ? len - k : S_CHUNK;
            if (p->stochastic)
                s_quant_stochastic(codes, gx + k, m, c, inv, qmaxf, qmax, key, (uint32_t)(off + k));
            else
                s_quant_nearest(codes, gx + k, m, c, inv, qmaxf, qmax);
            bitpack_pack(dst + (size_t)k / 8 * bits, codes, m, bits);
        }
    }
    return 0;
}

static int s_decode(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *payload, float *out)
{
    const codec_fixpt_params_t *p = &spec->p.fixpt;
    const uint32_t bits = p->bits, group = p->group;
    const int32_t qmax = (1 << (bits - 1)) - 1;
    const uint32_t bad_code = (1u << bits) - 1u;
    const float c = p->scale;
    const uint64_t n = codec_shape_elems(shape), ng = s_ngroups(n, group);
    const uint64_t gbytes = bitpack_bytes(group, bits);
    const uint8_t *code_base = payload + 2 * ng;
    uint16_t codes[S_CHUNK];
    for (uint64_t g = 0; g < ng; g++) {
        const uint64_t off = g * group;
        const uint32_t len = (uint32_t)(n - off < group ? n - off : group);
        uint16_t dh = codec_get_u16(payload + 2 * g);
        if ((dh & 0x8000u) || (dh & 0x7c00u) == 0x7c00u)
            return TAH_ECORRUPT; /* negative, Inf or NaN step */
        const float k = half_to_f32(dh) / c;
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
                o[i] = (float)((int32_t)codes[i] - qmax) * k;
            }
            if (bad)
                return TAH_ECORRUPT;
        }
    }
    return 0;
}

const codec_ops_t codec_fixpt_ops = { CODEC_FIXPT, "fixpt", s_payload_size, s_encode, s_decode };
