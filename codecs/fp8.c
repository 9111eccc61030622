/* fp8.c — FP8 E4M3 / E5M2 conversions (contract in fp8.h).
 *
 * Encoding works on the float's bits, branch-free so loops vectorise:
 *   normal range:    add the rounding bias (half an fp8 ulp minus one, plus
 *                    the kept lsb for ties-to-even) to the rebiased bits and
 *                    shift the dropped mantissa bits out; a carry into the
 *                    exponent is the correct rounding up.
 *   subnormal range: E4M3 (hot path) shifts the 24-bit significand right
 *                    with the same ties-to-even bias, integer-only so the
 *                    loop vectorises (gcc will not if-convert a float add
 *                    under -ftrapping-math); E5M2 adds a float K whose ulp
 *                    is its subnormal step (K = 2^7: ulp 2^-16) and lets
 *                    the FPU round (ties to even, the default mode); the
 *                    low bits of K+|x| are the code. A result of 8 (E4M3) /
 *                    4 (E5M2) is the smallest normal, the right code.
 * then saturate to the largest finite code and patch NaN. */
#include "fp8.h"

#include <string.h>

#define S_F32_INF 0x7f800000u

/* bit casts through memcpy: unlike a union, gcc vectorises loops using them */
static inline uint32_t s_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float s_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint8_t s_e4m3_encode(float f)
{
    uint32_t x = s_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    /* subnormal, |x| < 2^-6: code = RNE(|x| * 2^9) = RNE(M >> (141 - E)) with
     * M the 24-bit significand and E the biased exponent; E <= 120 so the
     * shift is >= 21, and a shift past 31 would give 0 anyway (M < 2^24).
     * Outside E in [110, 120] the result is unused or 0: shift by 31. */
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t e = ax >> 23;
    uint32_t sh = (e >= 110u && e <= 120u) ? 141u - e : 31u;
    uint32_t sub = (mant + (1u << (sh - 1)) - 1u + ((mant >> sh) & 1u)) >> sh;
    /* normal: rebias 127 -> 7 (subtract 120 << 23), keep 3 mantissa bits */
    uint32_t nrm = (ax - 0x3c000000u + 0x7ffffu + ((ax >> 20) & 1u)) >> 20;
    nrm = nrm > 0x7eu ? 0x7eu : nrm; /* saturate (and Inf) to 448 */
    /* selects as masks: gcc's vectoriser rejects the ternary form here */
    uint32_t is_sub = 0u - (uint32_t)(ax < 0x3c800000u);
    uint32_t is_nan = 0u - (uint32_t)(ax > S_F32_INF);
    uint32_t r = (sub & is_sub) | (nrm & ~is_sub);
    r |= is_nan & 0x7fu;             /* NaN: 0x7f (nrm is 0x7e there) */
    return (uint8_t)(r | sign);
}

/* Integer-only with mask selects, so the bulk loop vectorises. */
static inline float s_e4m3_decode(uint8_t c)
{
    uint32_t c7 = c & 0x7fu, m = c & 7u;
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t nrm = (c7 << 20) + 0x3c000000u;            /* exponent e+120, mantissa m<<20 */
    /* e == 0: m * 2^-9 = 2^(p-9) * (m / 2^p), p = floor(log2 m) */
    uint32_t p = (uint32_t)(m >= 2u) + (uint32_t)(m >= 4u);
    uint32_t sub = (((118u + p) << 23) | ((m << (23u - p)) & 0x7fffffu)) & (0u - (uint32_t)(m != 0u));
    uint32_t is_sub = 0u - (uint32_t)(c7 < 8u);
    uint32_t is_nan = 0u - (uint32_t)(c7 == 0x7fu);
    uint32_t bits = (sub & is_sub) | (nrm & ~is_sub);
    bits = (bits & ~is_nan) | (0x7fc00000u & is_nan);
    return s_float(bits | sign);
}

uint8_t fp8_e4m3_from_f32(float f) { return s_e4m3_encode(f); }

float fp8_e4m3_to_f32(uint8_t c) { return s_e4m3_decode(c); }

void fp8_e4m3_from_f32_n(uint8_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = s_e4m3_encode(src[i]);
}

void fp8_e4m3_from_f32_scaled_n(uint8_t *dst, const float *src, float scale, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = s_e4m3_encode(src[i] * scale);
}

void fp8_e4m3_to_f32_n(float *dst, const uint8_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = s_e4m3_decode(src[i]);
}

void fp8_e4m3_to_f32_scaled_n(float *dst, const uint8_t *src, float scale, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = s_e4m3_decode(src[i]) * scale;
}

uint8_t fp8_e5m2_from_f32(float f)
{
    uint32_t x = s_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t sub = s_bits(s_float(ax) + 128.0f) - 0x43000000u;
    /* rebias 127 -> 15 (subtract 112 << 23), keep 2 mantissa bits */
    uint32_t nrm = (ax - 0x38000000u + 0xfffffu + ((ax >> 21) & 1u)) >> 21;
    uint32_t r = ax < 0x38800000u ? sub : nrm;
    r = r > 0x7bu ? 0x7bu : r;       /* saturate finite values to 57344 */
    r = ax == S_F32_INF ? 0x7cu : r; /* Inf stays Inf */
    r = ax > S_F32_INF ? 0x7eu : r;  /* NaN (quiet) */
    return (uint8_t)(r | sign);
}

float fp8_e5m2_to_f32(uint8_t c)
{
    uint32_t c7 = c & 0x7fu;
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t bits;
    if (c7 < 4u)                       /* subnormal: m * 2^-16 */
        bits = s_bits((float)c7 * 0x1p-16f);
    else if (c7 < 0x7cu)               /* exponent e+112, mantissa m<<21 */
        bits = (c7 << 21) + 0x38000000u;
    else if (c7 == 0x7cu)
        bits = S_F32_INF;
    else
        bits = 0x7fc00000u | ((c7 & 3u) << 21);
    return s_float(bits | sign);
}
