/* half.c — fp16 / bf16 conversions. */
#include "half.h"

#include "codec_impl.h" /* codec_f32_bits, codec_bits_f32 */

#if defined(__F16C__)
#include <immintrin.h>
#endif

uint16_t half_from_f32(float f)
{
    uint32_t x = codec_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* Inf or NaN (quiet) */
        return (uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (ax >= 0x477ff000u) /* >= 65520 rounds past the largest finite half */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal half; the FPU rounds for us:
                               in [0.5,1) one float ulp is 2^-24, the half subnormal step */
        float v = codec_bits_f32(ax) + 0.5f;
        return (uint16_t)(sign | (codec_f32_bits(v) - 0x3f000000u));
    }
    uint32_t odd = (ax >> 13) & 1u;
    ax += 0xc8000fffu + odd; /* rebias exponent (127 -> 15) and round half to even */
    return (uint16_t)(sign | (ax >> 13));
}

float half_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31)
        return codec_bits_f32(sign | 0x7f800000u | (m << 13));
    return codec_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static uint16_t s_half_next_down(uint16_t h)
{
    if ((h & 0x7fffu) == 0)
        return 0x8001u;
    return (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
}

static uint16_t s_half_next_up(uint16_t h)
{
    if ((h & 0x7fffu) == 0)
        return 0x0001u;
    return (h & 0x8000u) ? (uint16_t)(h - 1u) : (uint16_t)(h + 1u);
}

uint16_t half_from_f32_down(float f)
{
    uint16_t h = half_from_f32(f);
    if (half_to_f32(h) > f)
        h = s_half_next_down(h);
    return h;
}

uint16_t half_from_f32_up(float f)
{
    uint16_t h = half_from_f32(f);
    if (half_to_f32(h) < f)
        h = s_half_next_up(h);
    return h;
}

void half_from_f32_n(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
    }
#endif
    for (; i < n; i++)
        dst[i] = half_from_f32(src[i]);
}

void half_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i))));
#endif
    for (; i < n; i++)
        dst[i] = half_to_f32(src[i]);
}

uint16_t bf16_from_f32(float f)
{
    uint32_t x = codec_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float bf16_to_f32(uint16_t h)
{
    return codec_bits_f32((uint32_t)h << 16);
}
