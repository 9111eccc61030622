/* codec.h — tensor codecs and their self-describing wire frame (libtahcodec).
 *
 * What it does: compresses a float32 tensor of shape (B,S,C) into one
 * contiguous byte frame and back. Codecs:
 *   fp32, fp16, bf16   raw baselines (fp16/bf16 round to nearest even)
 *   tah                TAH-Quant: tile-wise INT-hi/INT-lo, entropy-guided bit
 *                      allocation, pivot-swap + Hadamard for outlier tiles
 *   fixpt              scaled fixed-point: g^ = Q(c*g)/c, per-group symmetric
 *   ash-fp8            TACO's adaptive-scale Hadamard + FP8 E4M3, two scales
 *   int                grouped INT-b (Flash-Communication style)
 *
 * A codec is named everywhere by one spec string, NAME[:key=value,...]
 * (codec_spec_parse, the only parser of it). Keys per codec:
 *   tah     tile, alloc_tile, hi_frac, bits_hi, bits_lo, tau, rho
 *   fixpt   bits, scale, group, stochastic, seed
 *   ash-fp8 block, tau, eps
 *   int     bits, group, symmetric
 *
 * Frame format (little-endian; docs/codecs.md has the per-codec payloads):
 *   0  u32 magic 0x46484154 ("TAHF")   4 u16 version (4)   6 u8 codec id
 *   7  u8  reserved (0)                8 u32 B  12 u32 S  16 u32 C
 *   20 u32 reserved (0)               24 u64 payload length
 *   32 24 bytes codec parameters      56 u32 reserved (0)
 *   60 u32 CRC-32C of bytes [0,60) and the payload
 *   64 payload
 * The frame length is a pure function of (spec, shape): codec_frame_size()
 * gives it before encoding, so a link can use fixed-size buffers.
 *
 * Memory: the caller owns every buffer. Encoders may allocate scratch
 * proportional to one sample's tiles and free it before returning; decoders
 * never allocate. Decoding any byte string either fills the output or
 * returns a negative TAH_E* code with a message; it never reads outside
 * [frame, frame+len) nor writes outside the output it was given.
 *
 * Non-finite input is rejected by every encoder (TAH_ENONFINITE), and every
 * decoder rejects frames whose scales or values are not finite. */
#ifndef TAH_CODEC_H
#define TAH_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h" /* TAH_E* codes */

#define CODEC_FRAME_MAGIC 0x46484154u /* "TAHF" */
#define CODEC_FRAME_VERSION 4u /* 2: int frames carry an exponent per 64 groups; 3: TAH frames an index;
                                  4: TAH frames an exponent per 32 allocation tiles */
#define CODEC_HEADER_SIZE 64u
#define CODEC_PARAMS_SIZE 24u
/* Largest tensor a frame may describe (elements). 2^31 floats = 8 GiB. */
#define CODEC_MAX_ELEMS ((uint64_t)1 << 31)
#define CODEC_ERRLEN 256

typedef enum codec_id {
    CODEC_FP32 = 1,
    CODEC_FP16 = 2,
    CODEC_BF16 = 3,
    CODEC_TAH = 4,
    CODEC_FIXPT = 5,
    CODEC_ASH_FP8 = 6,
    CODEC_INT = 7,
} codec_id_t;

typedef struct codec_tah_params {
    uint32_t tile;       /* G: channels per quantization tile, power of two, 8..4096 (64) */
    uint32_t alloc_tile; /* A: channels per allocation tile, multiple of G (= G) */
    float hi_frac;       /* p: fraction of allocation tiles per sample at bits_hi, [0,1] (0.8) */
    uint32_t bits_hi;    /* high bit width, 2..8 (4) */
    uint32_t bits_lo;    /* low bit width, 2..bits_hi (3) */
    float tau;           /* outlier threshold on |a(1)|/(|a(2)|+rho), >= 0 (2.0) */
    float rho;           /* denominator guard of the outlier test, >= 0 (1e-6) */
    uint32_t window;     /* 0: the high tiles are chosen per sample; W in 1..CODEC_TAH_WINDOW_MAX: per
                            window of W allocation tiles, each its share of the sample's (32) */
} codec_tah_params_t;
#define CODEC_TAH_WINDOW_MAX 1024u

typedef struct codec_fixpt_params {
    uint32_t bits;       /* b: 2..16 (8) */
    float scale;         /* c: constant pre-scale, finite > 0 (1024) */
    uint32_t group;      /* elements per group, 1..65536 (128) */
    uint32_t stochastic; /* 0 round to nearest, 1 stochastic rounding (0) */
    uint64_t seed;       /* stochastic rounding seed (0) */
} codec_fixpt_params_t;

typedef struct codec_ash_params {
    uint32_t block;      /* B: elements per block, power of two, 16..65536 (256) */
    float tau;           /* target RMS after the first scale, finite > 0 (1.0) */
    float eps;           /* RMS guard, finite >= 0 (1e-12) */
} codec_ash_params_t;

typedef struct codec_int_params {
    uint32_t bits;       /* b in {2,3,4,5,6,8} (4) */
    uint32_t group;      /* elements per group, 1..65536 (128) */
    uint32_t symmetric;  /* 0 asymmetric (scale, min), 1 symmetric (scale) (0) */
} codec_int_params_t;

typedef struct codec_spec {
    codec_id_t id;
    union {
        codec_tah_params_t tah;
        codec_fixpt_params_t fixpt;
        codec_ash_params_t ash;
        codec_int_params_t intq;
    } p;
} codec_spec_t;

/* Tensor shape (B,S,C). Codecs without a notion of token or channel treat
 * the tensor as B*S*C contiguous elements. */
typedef struct codec_shape {
    uint32_t b, s, c;
} codec_shape_t;

/* What a frame header says, after validation. */
typedef struct codec_frame_info {
    codec_spec_t spec;
    codec_shape_t shape;
    uint64_t nelems;      /* B*S*C */
    uint64_t frame_size;  /* header + payload bytes */
    double bits_per_elem; /* 8 * frame_size / nelems */
} codec_frame_info_t;

/* ---- specs ---- */

/* Name of a codec id ("tah", "ash-fp8"), or NULL for an unknown id. */
const char *codec_name(codec_id_t id);
/* Look up a codec by name; 0 and *id set, or TAH_ECODEC. */
int codec_id_from_name(const char *name, codec_id_t *id);
/* Default parameters of a codec. */
int codec_spec_default(codec_id_t id, codec_spec_t *spec);
/* Parse "NAME[:key=value,...]" into spec (defaults for keys not given), then
 * validate. On error fills err (may be NULL) with the offending part. */
int codec_spec_parse(const char *str, codec_spec_t *spec, char *err, size_t errlen);
/* Set one key ("hi_frac", "0.8") on spec; used by the parser and CLIs. */
int codec_spec_set(codec_spec_t *spec, const char *key, const char *value, char *err, size_t errlen);
/* Check every parameter's range. */
int codec_spec_validate(const codec_spec_t *spec, char *err, size_t errlen);
/* Canonical spec string with every parameter ("tah:tile=64,..."). */
int codec_spec_format(const codec_spec_t *spec, char *buf, size_t buflen);
/* The spec for tensor number `id` of a stream of tensors coded with base:
 * stochastic fixpt gets the seed splitmix64(seed xor splitmix64(id)), so
 * that every tensor draws its own rounding coins (with one seed, element i
 * of every tensor would round with the same coin, and the rounding errors of
 * a slowly changing gradient would add up step after step instead of
 * averaging out); every other spec is base unchanged. */
void codec_spec_derive(const codec_spec_t *base, uint64_t id, codec_spec_t *out);
/* The revision of the rules above and of fixpt's coins (fixpt.c): nodes
 * exchange stochastic frames only when they follow the same rules (a frame
 * must carry its message's derived seed), so a node announces its revision
 * and the coordinator places a job with a stochastic link codec only on
 * nodes of its own (tah.proto, Hello.seed_rules). 1: per-message seeds and
 * lowbias32 coins; 0: a build from before the revision was announced. */
#define CODEC_SEED_RULES 1u
/* The spec of one tensor of a pipeline's training run: codec_spec_derive of
 * base for (stream, the stage that encodes it, step, micro-batch). Streams:
 * the forward activations (evaluation's too), the backward gradients, the
 * tied rows. tah-node and tah-train derive the same. */
enum { CODEC_STREAM_FWD = 0, CODEC_STREAM_BWD = 1, CODEC_STREAM_TIED = 2 };
void codec_spec_for_tensor(const codec_spec_t *base, int stream, int stage, int step, int mb, codec_spec_t *out);

/* ---- frames ---- */

/* Total frame bytes for this spec and shape, or a negative TAH_E* code if
 * the spec or shape is invalid. */
int64_t codec_frame_size(const codec_spec_t *spec, codec_shape_t shape);

/* Encode x (B*S*C floats, row-major (B,S,C)) into frame[0..cap). Writes
 * exactly codec_frame_size() bytes; *written gets that length (may be NULL). */
int codec_encode(const codec_spec_t *spec, codec_shape_t shape, const float *x,
                 uint8_t *frame, size_t cap, size_t *written, char *err, size_t errlen);

/* Write the header and checksum of a frame whose payload, frame[64..len),
 * was produced elsewhere (the GPU encoder, cuda/cu_codec.h) with this spec
 * and shape. len must be exactly codec_frame_size(); the payload is not
 * inspected (the encoder that wrote it checked its input). */
int codec_frame_seal(const codec_spec_t *spec, codec_shape_t shape, uint8_t *frame, size_t len, char *err,
                     size_t errlen);

/* Validate a frame's header, length and checksum without decoding. */
int codec_frame_info(const uint8_t *frame, size_t len, codec_frame_info_t *info,
                     char *err, size_t errlen);

/* Decode a frame into out[0..out_elems). info (may be NULL) receives what
 * the header said. out_elems must be >= the frame's B*S*C. */
int codec_decode(const uint8_t *frame, size_t len, float *out, size_t out_elems,
                 codec_frame_info_t *info, char *err, size_t errlen);

#endif
