/* raw.c — uncompressed baselines: fp32 (bit-exact), fp16 and bf16 (round to
 * nearest even). Payload: B*S*C little-endian values of 4 or 2 bytes. */
#include <string.h>

#include "codec_impl.h"
#include "half.h" /* half_from_f32_n, half_to_f32_n, bf16_* */

#define S_CHUNK 1024

static uint64_t s_fp32_size(const codec_spec_t *spec, codec_shape_t shape)
{
    (void)spec;
    return 4 * codec_shape_elems(shape);
}

static uint64_t s_16_size(const codec_spec_t *spec, codec_shape_t shape)
{
    (void)spec;
    return 2 * codec_shape_elems(shape);
}

static int s_fp32_encode(const codec_spec_t *spec, codec_shape_t shape, const float *x, uint8_t *payload)
{
    (void)spec;
    uint64_t n = codec_shape_elems(shape);
    for (uint64_t i = 0; i < n; i++)
        codec_put_f32(payload + 4 * i, x[i]);
    return 0;
}

static int s_fp32_decode(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *payload, float *out)
{
    (void)spec;
    uint64_t n = codec_shape_elems(shape);
    for (uint64_t i = 0; i < n; i++)
        out[i] = codec_get_f32(payload + 4 * i);
    return 0;
}

/* fp16: values beyond +-65504 would become Inf; refuse them instead. */
static int s_fp16_encode(const codec_spec_t *spec, codec_shape_t shape, const float *x, uint8_t *payload)
{
    (void)spec;
    uint64_t n = codec_shape_elems(shape);
    uint16_t h[S_CHUNK];
    for (uint64_t i = 0; i < n; i += S_CHUNK) {
        size_t m = (size_t)(n - i < S_CHUNK ? n - i : S_CHUNK);
        half_from_f32_n(h, x + i, m);
        uint16_t inf = 0;
        for (size_t k = 0; k < m; k++) {
            inf |= (uint16_t)((h[k] & 0x7c00u) == 0x7c00u);
            codec_put_u16(payload + 2 * (i + k), h[k]);
        }
        if (inf)
            return TAH_ERANGE;
    }
    return 0;
}

static int s_fp16_decode(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *payload, float *out)
{
    (void)spec;
    uint64_t n = codec_shape_elems(shape);
    uint16_t h[S_CHUNK];
    for (uint64_t i = 0; i < n; i += S_CHUNK) {
        size_t m = (size_t)(n - i < S_CHUNK ? n - i : S_CHUNK);
        for (size_t k = 0; k < m; k++)
            h[k] = codec_get_u16(payload + 2 * (i + k));
        half_to_f32_n(out + i, h, m);
    }
    return 0;
}

static int s_bf16_encode(const codec_spec_t *spec, codec_shape_t shape, const float *x, uint8_t *payload)
{
    (void)spec;
    uint64_t n = codec_shape_elems(shape);
    uint16_t inf = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h = bf16_from_f32(x[i]);
        inf |= (uint16_t)((h & 0x7f80u) == 0x7f80u);
        codec_put_u16(payload + 2 * i, h);
    }
    return inf ? TAH_ERANGE : 0;
}

static int s_bf16_decode(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *payload, float *out)
{
    (void)spec;
    uint64_t n = codec_shape_elems(shape);
    for (uint64_t i = 0; i < n; i++)
        out[i] = bf16_to_f32(codec_get_u16(payload + 2 * i));
    return 0;
}

const codec_ops_t codec_raw_fp32_ops = { CODEC_FP32, "fp32", s_fp32_size, s_fp32_encode, s_fp32_decode };
const codec_ops_t codec_raw_fp16_ops = { CODEC_FP16, "fp16", s_16_size, s_fp16_encode, s_fp16_decode };
const codec_ops_t codec_raw_bf16_ops = { CODEC_BF16, "bf16", s_16_size, s_bf16_encode, s_bf16_decode };
