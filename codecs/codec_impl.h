/* codec_impl.h — what each codec provides to the frame layer (private to codecs/).
 *
 * frame.c owns the header, the checksum, parameter (de)serialisation, size
 * checks and the finite checks on input and output; a codec only maps a
 * validated spec and shape to a payload of payload_size() bytes and back.
 * Parameters reaching a codec have passed codec_spec_validate(). */
#ifndef TAH_CODEC_IMPL_H
#define TAH_CODEC_IMPL_H

#include "codec.h"

typedef struct codec_ops {
    codec_id_t id;
    const char *name;
    /* Exact payload bytes for this spec and shape (shape already checked:
     * every dim >= 1, B*S*C <= CODEC_MAX_ELEMS). */
    uint64_t (*payload_size)(const codec_spec_t *spec, codec_shape_t shape);
    /* x holds B*S*C finite floats; write exactly payload_size() bytes.
     * Returns 0 or TAH_ENOMEM (scratch) / TAH_ERANGE. */
    int (*encode)(const codec_spec_t *spec, codec_shape_t shape, const float *x, uint8_t *payload);
    /* payload is exactly payload_size() bytes from an untrusted peer: any
     * metadata it holds (scales, indices, flags) must be checked before use.
     * Returns 0, TAH_ECORRUPT or TAH_ENONFINITE. Output finiteness is
     * checked again by the frame layer. */
    int (*decode)(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *payload, float *out);
} codec_ops_t;

extern const codec_ops_t codec_raw_fp32_ops;
extern const codec_ops_t codec_raw_fp16_ops;
extern const codec_ops_t codec_raw_bf16_ops;
extern const codec_ops_t codec_tah_ops;
extern const codec_ops_t codec_fixpt_ops;
extern const codec_ops_t codec_ash_ops;
extern const codec_ops_t codec_int_ops;

static inline uint64_t codec_shape_elems(codec_shape_t s)
{
    return (uint64_t)s.b * s.s * s.c;
}

/* The splitmix64 finaliser (fixpt's stochastic rounding key, codec_spec_derive) */
static inline uint64_t codec_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* fixpt's stochastic rounding key k of a seed (fixpt.c's header), for the CPU and GPU encoders */
static inline uint32_t codec_fixpt_key(uint64_t seed)
{
    return (uint32_t)(codec_mix64(codec_mix64(seed) + 0x9e3779b97f4a7c15ull) >> 32);
}

/* Little-endian loads and stores of unaligned scalars. */
static inline void codec_put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline uint16_t codec_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline void codec_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline uint32_t codec_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline void codec_put_u64(uint8_t *p, uint64_t v)
{
    codec_put_u32(p, (uint32_t)v); codec_put_u32(p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t codec_get_u64(const uint8_t *p)
{
    return (uint64_t)codec_get_u32(p) | ((uint64_t)codec_get_u32(p + 4) << 32);
}
static inline uint32_t codec_f32_bits(float f) { union { float f; uint32_t u; } v = { .f = f }; return v.u; }
static inline float codec_bits_f32(uint32_t u) { union { uint32_t u; float f; } v = { .u = u }; return v.f; }
static inline void codec_put_f32(uint8_t *p, float f) { codec_put_u32(p, codec_f32_bits(f)); }
static inline float codec_get_f32(const uint8_t *p) { return codec_bits_f32(codec_get_u32(p)); }

/* TAH-Quant's ranking keys (tah.c, and cuda/cu_tah.cu computes the same):
 * floor(entropy * scale), at most CODEC_TAH_KEY_BINS - 1. The scale is
 * 2^(12 - c) with 2^c >= ceil(log2 alloc_tile) + 1, so entropies up to
 * log2(alloc_tile) + 0.09 (Mitchell's log2 reads low, the entropy high) fit:
 * 512 for alloc_tile <= 128 (steps of 1/512 bit). */
#define CODEC_TAH_KEY_BINS 4096u
/* TAH frames' index (frame version 3): per sample, u32 entry k is the number
 * of high quantisation tiles before the sample's tile k * CODEC_TAH_IX_TILES,
 * so a decoder can start anywhere in a sample without counting flags. */
#define CODEC_TAH_IX_TILES 128u
/* TAH frames' exponents (frame version 4): one per CODEC_TAH_EXP_TILES
 * consecutive allocation tiles of a sample, so an encoder can write a group's
 * metadata as soon as it has seen the group. */
#define CODEC_TAH_EXP_TILES 32u
static inline float codec_tah_key_scale(uint32_t alloc_tile)
{
    uint32_t lg = 0, c = 0;
    while ((1u << lg) < alloc_tile)
        lg++;
    while ((1u << c) < lg + 1)
        c++;
    return (float)(1u << (12 - c));
}

#endif
