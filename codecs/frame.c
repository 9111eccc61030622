/* frame.c — the codec frame: header, parameter block, checksum, and the
 * dispatch to each codec's payload encoder/decoder. The only reader and
 * writer of the frame header (layout in codec.h). */
#include "codec.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "codec_impl.h"
#include "crc32c.h" /* crc32c_update */

#define S_OFF_MAGIC 0
#define S_OFF_VERSION 4
#define S_OFF_CODEC 6
#define S_OFF_RES0 7
#define S_OFF_B 8
#define S_OFF_S 12
#define S_OFF_C 16
#define S_OFF_RES1 20
#define S_OFF_PAYLOAD_LEN 24
#define S_OFF_PARAMS 32
#define S_OFF_RES2 56
#define S_OFF_CRC 60

static const codec_ops_t *s_ops(codec_id_t id)
{
    switch (id) {
    case CODEC_FP32: return &codec_raw_fp32_ops;
    case CODEC_FP16: return &codec_raw_fp16_ops;
    case CODEC_BF16: return &codec_raw_bf16_ops;
    case CODEC_TAH: return &codec_tah_ops;
    case CODEC_FIXPT: return &codec_fixpt_ops;
    case CODEC_ASH_FP8: return &codec_ash_ops;
    case CODEC_INT: return &codec_int_ops;
    }
    return NULL;
}

#define S_FAIL(code, ...)                                \
    do {                                                 \
        if (err && errlen)                               \
            snprintf(err, errlen, __VA_ARGS__);          \
        return (code);                                   \
    } while (0)

static int s_check_shape(codec_shape_t shape, char *err, size_t errlen)
{
    if (shape.b == 0 || shape.s == 0 || shape.c == 0)
        S_FAIL(TAH_ESHAPE, "shape (%u,%u,%u) has an empty dimension", shape.b, shape.s, shape.c);
    if (codec_shape_elems(shape) > CODEC_MAX_ELEMS)
        S_FAIL(TAH_ESHAPE, "shape (%u,%u,%u) has %" PRIu64 " elements, more than the limit %" PRIu64, shape.b,
               shape.s, shape.c, codec_shape_elems(shape), (uint64_t)CODEC_MAX_ELEMS);
    return 0;
}

/* ---- parameter block: one fixed layout per codec, zero elsewhere ---- */

static void s_params_pack(const codec_spec_t *spec, uint8_t p[CODEC_PARAMS_SIZE])
{
    memset(p, 0, CODEC_PARAMS_SIZE);
    switch (spec->id) {
    case CODEC_TAH:
        codec_put_u32(p + 0, spec->p.tah.tile);
        codec_put_u32(p + 4, spec->p.tah.alloc_tile);
        codec_put_f32(p + 8, spec->p.tah.hi_frac);
        p[12] = (uint8_t)spec->p.tah.bits_hi;
        p[13] = (uint8_t)spec->p.tah.bits_lo;
        codec_put_f32(p + 16, spec->p.tah.tau);
        codec_put_f32(p + 20, spec->p.tah.rho);
        codec_put_u16(p + 14, (uint16_t)spec->p.tah.window);
        break;
    case CODEC_FIXPT:
        p[0] = (uint8_t)spec->p.fixpt.bits;
        p[1] = (uint8_t)spec->p.fixpt.stochastic;
        codec_put_u32(p + 4, spec->p.fixpt.group);
        codec_put_f32(p + 8, spec->p.fixpt.scale);
        codec_put_u64(p + 16, spec->p.fixpt.seed);
        break;
    case CODEC_ASH_FP8:
        codec_put_u32(p + 0, spec->p.ash.block);
        codec_put_f32(p + 4, spec->p.ash.tau);
        codec_put_f32(p + 8, spec->p.ash.eps);
        break;
    case CODEC_INT:
        p[0] = (uint8_t)spec->p.intq.bits;
        p[1] = (uint8_t)spec->p.intq.symmetric;
        codec_put_u32(p + 4, spec->p.intq.group);
        break;
    default:
        break;
    }
}

/* Unpack, then require the block to re-pack to the same bytes: that rejects
 * non-zero reserved bytes and out-of-range narrow fields in one rule. */
static int s_params_unpack(codec_id_t id, const uint8_t p[CODEC_PARAMS_SIZE], codec_spec_t *spec, char *err,
                           size_t errlen)
{
    codec_spec_default(id, spec);
    switch (id) {
    case CODEC_TAH:
        spec->p.tah.tile = codec_get_u32(p + 0);
        spec->p.tah.alloc_tile = codec_get_u32(p + 4);
        spec->p.tah.hi_frac = codec_get_f32(p + 8);
        spec->p.tah.bits_hi = p[12];
        spec->p.tah.bits_lo = p[13];
        spec->p.tah.tau = codec_get_f32(p + 16);
        spec->p.tah.rho = codec_get_f32(p + 20);
        spec->p.tah.window = codec_get_u16(p + 14);
        break;
    case CODEC_FIXPT:
        spec->p.fixpt.bits = p[0];
        spec->p.fixpt.stochastic = p[1];
        spec->p.fixpt.group = codec_get_u32(p + 4);
        spec->p.fixpt.scale = codec_get_f32(p + 8);
        spec->p.fixpt.seed = codec_get_u64(p + 16);
        break;
    case CODEC_ASH_FP8:
        spec->p.ash.block = codec_get_u32(p + 0);
        spec->p.ash.tau = codec_get_f32(p + 4);
        spec->p.ash.eps = codec_get_f32(p + 8);
        break;
    case CODEC_INT:
        spec->p.intq.bits = p[0];
        spec->p.intq.symmetric = p[1];
        spec->p.intq.group = codec_get_u32(p + 4);
        break;
    default:
        break;
    }
    char why[CODEC_ERRLEN];
    int rc = codec_spec_validate(spec, why, sizeof why);
    if (rc != 0)
        S_FAIL(TAH_EPARAM, "frame parameters invalid: %s", why);
    uint8_t again[CODEC_PARAMS_SIZE];
    s_params_pack(spec, again);
    if (memcmp(again, p, CODEC_PARAMS_SIZE) != 0)
        S_FAIL(TAH_EPARAM, "frame parameter block of codec '%s' has non-zero reserved bytes", codec_name(id));
    return 0;
}

int64_t codec_frame_size(const codec_spec_t *spec, codec_shape_t shape)
{
    int rc = codec_spec_validate(spec, NULL, 0);
    if (rc != 0)
        return rc;
    rc = s_check_shape(shape, NULL, 0);
    if (rc != 0)
        return rc;
    return (int64_t)(CODEC_HEADER_SIZE + s_ops(spec->id)->payload_size(spec, shape));
}

/* Index of the first non-finite element, or n if all are finite. The fast
 * pass ORs a flag per element so it vectorises; the slow pass runs only on
 * failure to name the element. */
static uint64_t s_first_nonfinite(const float *x, uint64_t n)
{
    const uint32_t *u = (const uint32_t *)(const void *)x;
    uint32_t bad = 0;
    for (uint64_t i = 0; i < n; i++)
        bad |= ((u[i] & 0x7f800000u) == 0x7f800000u);
    if (!bad)
        return n;
    for (uint64_t i = 0; i < n; i++)
        if ((u[i] & 0x7f800000u) == 0x7f800000u)
            return i;
    return n;
}

/* The one writer of the header: fields, parameter block, then the CRC-32C
 * of bytes [0,60) followed by the payload already in frame[64..). */
static void s_write_header(const codec_spec_t *spec, codec_shape_t shape, uint64_t payload, uint8_t *frame)
{
    memset(frame, 0, CODEC_HEADER_SIZE);
    codec_put_u32(frame + S_OFF_MAGIC, CODEC_FRAME_MAGIC);
    codec_put_u16(frame + S_OFF_VERSION, CODEC_FRAME_VERSION);
    frame[S_OFF_CODEC] = (uint8_t)spec->id;
    codec_put_u32(frame + S_OFF_B, shape.b);
    codec_put_u32(frame + S_OFF_S, shape.s);
    codec_put_u32(frame + S_OFF_C, shape.c);
    codec_put_u64(frame + S_OFF_PAYLOAD_LEN, payload);
    s_params_pack(spec, frame + S_OFF_PARAMS);
    uint32_t crc = crc32c_update(0, frame, S_OFF_CRC);
    crc = crc32c_update(crc, frame + CODEC_HEADER_SIZE, payload);
    codec_put_u32(frame + S_OFF_CRC, crc);
}

/* Validate spec and shape for writing a frame; the codec and its payload size. */
static int s_prepare(const codec_spec_t *spec, codec_shape_t shape, const codec_ops_t **ops, uint64_t *payload,
                     char *err, size_t errlen)
{
    int rc = codec_spec_validate(spec, err, errlen);
    if (rc != 0)
        return rc;
    rc = s_check_shape(shape, err, errlen);
    if (rc != 0)
        return rc;
    *ops = s_ops(spec->id);
    *payload = (*ops)->payload_size(spec, shape);
    return 0;
}

int codec_encode(const codec_spec_t *spec, codec_shape_t shape, const float *x, uint8_t *frame, size_t cap,
                 size_t *written, char *err, size_t errlen)
{
    const codec_ops_t *ops = NULL;
    uint64_t payload = 0;
    int rc = s_prepare(spec, shape, &ops, &payload, err, errlen);
    if (rc != 0)
        return rc;
    uint64_t n = codec_shape_elems(shape);
    uint64_t total = CODEC_HEADER_SIZE + payload;
    if (cap < total)
        S_FAIL(TAH_ESPACE, "encode: frame buffer has %zu bytes, %s needs %" PRIu64, cap, ops->name, total);
    uint64_t bad = s_first_nonfinite(x, n);
    if (bad < n)
        S_FAIL(TAH_ENONFINITE, "encode: input element %" PRIu64 " is %g (only finite values can be encoded)", bad,
               (double)x[bad]);
    rc = ops->encode(spec, shape, x, frame + CODEC_HEADER_SIZE);
    if (rc != 0)
        S_FAIL(rc, "encode %s: %s", ops->name, tah_strerror(rc));
    s_write_header(spec, shape, payload, frame);
    if (written)
        *written = (size_t)total;
    return 0;
}

int codec_frame_seal(const codec_spec_t *spec, codec_shape_t shape, uint8_t *frame, size_t len, char *err,
                     size_t errlen)
{
    const codec_ops_t *ops = NULL;
    uint64_t payload = 0;
    int rc = s_prepare(spec, shape, &ops, &payload, err, errlen);
    if (rc != 0)
        return rc;
    uint64_t total = CODEC_HEADER_SIZE + payload;
    if (!frame || (uint64_t)len != total)
        S_FAIL(TAH_ESIZE, "seal: frame has %zu bytes, %s with shape (%u,%u,%u) is %" PRIu64, frame ? len : 0,
               ops->name, shape.b, shape.s, shape.c, total);
    s_write_header(spec, shape, payload, frame);
    return 0;
}

int codec_frame_info(const uint8_t *frame, size_t len, codec_frame_info_t *info, char *err, size_t errlen)
{
    if (!frame || len < CODEC_HEADER_SIZE)
        S_FAIL(TAH_ETRUNC, "frame: %zu bytes, shorter than the %u-byte header", frame ? len : 0,
               CODEC_HEADER_SIZE);
    uint32_t magic = codec_get_u32(frame + S_OFF_MAGIC);
    if (magic != CODEC_FRAME_MAGIC)
        S_FAIL(TAH_EMAGIC, "frame: bad magic 0x%08x (expected 0x%08x); not a tah codec frame", magic,
               CODEC_FRAME_MAGIC);
    uint16_t version = codec_get_u16(frame + S_OFF_VERSION);
    if (version != CODEC_FRAME_VERSION)
        S_FAIL(TAH_EVERSION,
               "frame: version %u, this build reads version %u; HINT: written by another tah release (both ends "
               "need the same frame version)",
               version, CODEC_FRAME_VERSION);
    codec_id_t id = (codec_id_t)frame[S_OFF_CODEC];
    if (!codec_name(id))
        S_FAIL(TAH_ECODEC, "frame: unknown codec id %u", frame[S_OFF_CODEC]);
    if (frame[S_OFF_RES0] != 0 || codec_get_u32(frame + S_OFF_RES1) != 0 || codec_get_u32(frame + S_OFF_RES2) != 0)
        S_FAIL(TAH_ECORRUPT, "frame: reserved header fields are not zero");
    codec_shape_t shape = { codec_get_u32(frame + S_OFF_B), codec_get_u32(frame + S_OFF_S),
                            codec_get_u32(frame + S_OFF_C) };
    int rc = s_check_shape(shape, err, errlen);
    if (rc != 0)
        return rc;
    codec_spec_t spec;
    rc = s_params_unpack(id, frame + S_OFF_PARAMS, &spec, err, errlen);
    if (rc != 0)
        return rc;
    uint64_t expect = s_ops(id)->payload_size(&spec, shape);
    uint64_t said = codec_get_u64(frame + S_OFF_PAYLOAD_LEN);
    if (said != expect)
        S_FAIL(TAH_ESIZE, "frame: payload length %" PRIu64 " but %s with shape (%u,%u,%u) needs %" PRIu64, said,
               codec_name(id), shape.b, shape.s, shape.c, expect);
    uint64_t total = CODEC_HEADER_SIZE + expect;
    if ((uint64_t)len < total)
        S_FAIL(TAH_ETRUNC, "frame: truncated: %zu bytes, header says %" PRIu64, len, total);
    if ((uint64_t)len > total)
        S_FAIL(TAH_ESIZE, "frame: %zu bytes, header says %" PRIu64 " (trailing garbage)", len, total);
    uint32_t crc = crc32c_update(0, frame, S_OFF_CRC);
    crc = crc32c_update(crc, frame + CODEC_HEADER_SIZE, expect);
    uint32_t stored = codec_get_u32(frame + S_OFF_CRC);
    if (crc != stored)
        S_FAIL(TAH_ECHECKSUM, "frame: checksum 0x%08x, computed 0x%08x (corrupted in transit?)", stored, crc);
    if (info) {
        info->spec = spec;
        info->shape = shape;
        info->nelems = codec_shape_elems(shape);
        info->frame_size = total;
        info->bits_per_elem = 8.0 * (double)total / (double)info->nelems;
    }
    return 0;
}

int codec_decode(const uint8_t *frame, size_t len, float *out, size_t out_elems, codec_frame_info_t *info,
                 char *err, size_t errlen)
{
    codec_frame_info_t fi;
    int rc = codec_frame_info(frame, len, &fi, err, errlen);
    if (rc != 0)
        return rc;
    if ((uint64_t)out_elems < fi.nelems)
        S_FAIL(TAH_ESPACE, "decode: output holds %zu floats, frame has %" PRIu64, out_elems, fi.nelems);
    const codec_ops_t *ops = s_ops(fi.spec.id);
    rc = ops->decode(&fi.spec, fi.shape, frame + CODEC_HEADER_SIZE, out);
    if (rc != 0)
        S_FAIL(rc, "decode %s: %s in payload", ops->name, tah_strerror(rc));
    uint64_t bad = s_first_nonfinite(out, fi.nelems);
    if (bad < fi.nelems)
        S_FAIL(TAH_ENONFINITE, "decode %s: element %" PRIu64 " decodes to %g", ops->name, bad, (double)out[bad]);
    if (info)
        *info = fi;
    return 0;
}
