/* test_frame.c — the frame layer against hostile bytes, for every codec:
 * truncation at every length, every single-bit flip of the header and a
 * sample of the payload, forged headers with a valid checksum (absurd
 * shapes, bad parameters, wrong lengths, unknown codecs, new versions),
 * NaN metadata, and random payloads behind a valid header. Each must give
 * its specific error (or a clean decode), never a crash: the sanitizer
 * build runs this file too. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec.h"
#include "crc32c.h" /* to forge frames whose checksum is right */
#include "synth.h"

static const char *const k_specs[] = {
    "fp32", "fp16", "bf16", "tah", "tah:tile=8,alloc_tile=16,hi_frac=0.5", "fixpt", "fixpt:bits=3,group=7",
    "fixpt:bits=12,stochastic=1,seed=5", "ash-fp8", "ash-fp8:block=16", "int", "int:bits=3,group=10,symmetric=1",
};
#define N_SPECS (sizeof k_specs / sizeof k_specs[0])

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void fix_crc(uint8_t *f, size_t len)
{
    uint32_t c = crc32c_update(0, f, 60);
    c = crc32c_update(c, f + CODEC_HEADER_SIZE, len - CODEC_HEADER_SIZE);
    put_u32(f + 60, c);
}

static uint8_t *encode(const char *spec_str, codec_shape_t shape, size_t *len, float **x_out)
{
    codec_spec_t spec;
    char err[CODEC_ERRLEN];
    assert_int_equal(codec_spec_parse(spec_str, &spec, err, sizeof err), 0);
    uint64_t n = (uint64_t)shape.b * shape.s * shape.c;
    float *x = malloc(n * sizeof *x);
    codec_synth_activations(x, shape, 3);
    for (uint64_t i = 0; i < n; i++) /* keep fixpt's scaled steps within fp16 */
        x[i] *= 0.01f;
    int64_t size = codec_frame_size(&spec, shape);
    assert_true(size > CODEC_HEADER_SIZE);
    uint8_t *f = malloc((size_t)size);
    if (codec_encode(&spec, shape, x, f, (size_t)size, len, err, sizeof err) != 0)
        fail_msg("%s: %s", spec_str, err);
    if (x_out)
        *x_out = x;
    else
        free(x);
    return f;
}

static int decode(const uint8_t *f, size_t len, float *out, size_t out_elems)
{
    char err[CODEC_ERRLEN];
    err[0] = '\0';
    int rc = codec_decode(f, len, out, out_elems, NULL, err, sizeof err);
    if (rc != 0)
        assert_true(strlen(err) > 0); /* every error comes with a message */
    return rc;
}

static void test_roundtrip_and_info(void **state)
{
    (void)state;
    codec_shape_t shape = { 2, 9, 72 };
    size_t n = 2 * 9 * 72;
    float *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < N_SPECS; i++) {
        size_t len;
        float *x;
        uint8_t *f = encode(k_specs[i], shape, &len, &x);
        codec_frame_info_t info;
        assert_int_equal(codec_frame_info(f, len, &info, NULL, 0), 0);
        assert_int_equal(info.shape.b, 2);
        assert_int_equal(info.shape.s, 9);
        assert_int_equal(info.shape.c, 72);
        assert_int_equal(info.frame_size, len);
        assert_int_equal(decode(f, len, y, n), 0);
        /* fp32 is bit-exact; the rest are close (their own tests bound them) */
        double e2 = 0, x2 = 0;
        for (size_t k = 0; k < n; k++) {
            e2 += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
            x2 += (double)x[k] * x[k];
        }
        if (i == 0)
            assert_true(e2 == 0.0);
        if (!(sqrt(e2 / x2) < 0.25))
            fail_msg("%s: relative error %g", k_specs[i], sqrt(e2 / x2));
        /* output buffer too small */
        assert_int_equal(decode(f, len, y, n - 1), TAH_ESPACE);
        free(f);
        free(x);
    }
    free(y);
}

static void test_truncation_and_trailing(void **state)
{
    (void)state;
    codec_shape_t shape = { 1, 5, 40 };
    float y[200];
    for (size_t i = 0; i < N_SPECS; i++) {
        size_t len;
        uint8_t *f = encode(k_specs[i], shape, &len, NULL);
        for (size_t cut = 0; cut < len; cut++) {
            int rc = decode(f, cut, y, 200);
            assert_int_equal(rc, TAH_ETRUNC);
        }
        uint8_t *g = malloc(len + 1);
        memcpy(g, f, len);
        g[len] = 0;
        assert_int_equal(decode(g, len + 1, y, 200), TAH_ESIZE);
        free(g);
        free(f);
    }
    assert_int_equal(decode(NULL, 0, y, 200), TAH_ETRUNC);
}

static void test_bit_flips(void **state)
{
    (void)state;
    codec_shape_t shape = { 2, 3, 64 };
    float y[384];
    for (size_t i = 0; i < N_SPECS; i++) {
        size_t len;
        uint8_t *f = encode(k_specs[i], shape, &len, NULL);
        /* every bit of the header, then every 7th bit of the payload: a
         * single flipped bit is always caught (CRC-32C detects all of them) */
        for (size_t bit = 0; bit < 8 * len; bit += (bit < 8 * CODEC_HEADER_SIZE ? 1 : 7)) {
            f[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            int rc = decode(f, len, y, 384);
            if (rc == 0)
                fail_msg("%s: flipped bit %zu decoded cleanly", k_specs[i], bit);
            f[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        }
        assert_int_equal(decode(f, len, y, 384), 0);
        free(f);
    }
}

static void test_forged_headers(void **state)
{
    (void)state;
    codec_shape_t shape = { 1, 4, 64 };
    float y[256];
    size_t len;
    uint8_t *f = encode("tah", shape, &len, NULL);
    uint8_t *g = malloc(len);
    char err[CODEC_ERRLEN];
#define FORGE(stmt, expect)                                              \
    do {                                                                 \
        memcpy(g, f, len);                                               \
        stmt;                                                            \
        fix_crc(g, len);                                                 \
        int rc_ = codec_decode(g, len, y, 256, NULL, err, sizeof err);   \
        if (rc_ != (expect))                                             \
            fail_msg("%s: got %d (%s), want %d", #stmt, rc_, err, expect); \
    } while (0)
    FORGE(g[0] = 'X', TAH_EMAGIC);
    FORGE(g[4] = 1, TAH_EVERSION); /* version 1: int frames with one exponent */
    FORGE(g[4] = 2, TAH_EVERSION); /* version 2: TAH frames without an index */
    FORGE(g[4] = 3, TAH_EVERSION); /* version 3: TAH frames with one exponent */
    FORGE(g[4] = 5, TAH_EVERSION);
    FORGE(g[6] = 99, TAH_ECODEC);
    FORGE(g[6] = 0, TAH_ECODEC);
    FORGE(g[7] = 1, TAH_ECORRUPT);
    FORGE(put_u32(g + 20, 1), TAH_ECORRUPT);
    FORGE(put_u32(g + 56, 1), TAH_ECORRUPT);
    FORGE(put_u32(g + 8, 0), TAH_ESHAPE);                 /* B = 0 */
    FORGE(put_u32(g + 12, 0xffffffffu), TAH_ESHAPE);      /* 2^32 * 64 elements */
    FORGE((put_u32(g + 8, 65536), put_u32(g + 12, 65536)), TAH_ESHAPE);
    FORGE(put_u32(g + 8, 2), TAH_ESIZE);                  /* shape no longer fits the length */
    FORGE(put_u32(g + 24, 12345), TAH_ESIZE);             /* payload length field */
    FORGE(put_u32(g + 32, 63), TAH_EPARAM);               /* tile not a power of two */
    FORGE(put_u32(g + 32, 1u << 20), TAH_EPARAM);         /* tile too large */
    FORGE(put_u32(g + 40, 0x7fc00000u), TAH_EPARAM);      /* hi_frac NaN */
    FORGE(g[44] = 9, TAH_EPARAM);                          /* bits_hi */
    FORGE((g[46] = 0x01, g[47] = 0x04), TAH_EPARAM);       /* window 1025 > CODEC_TAH_WINDOW_MAX */
    FORGE(g[46] = 1, 0); /* window 1: the encoder's rule; decoders read every window's frame alike */
    /* payload: 0, 0, the index (4 tiles: one entry), one exponent (8 bytes with its padding),
     * 4 flag bytes, meta */
    const size_t ix = CODEC_HEADER_SIZE + 8, eg = ix + 4, fl = eg + 8, meta = fl + 4;
    /* metadata: a NaN / Inf / negative fp16 step in the first tile */
    FORGE((g[meta + 2] = 0x00, g[meta + 3] = 0x7e), TAH_ECORRUPT);
    FORGE((g[meta + 2] = 0x00, g[meta + 3] = 0xbc), TAH_ECORRUPT);
    FORGE(put_u32(g + CODEC_HEADER_SIZE, 5000), TAH_ECORRUPT); /* the reserved words */
    FORGE(g[eg] = (uint8_t)-127, TAH_ECORRUPT);                /* an exponent below -126 */
    FORGE(g[eg] = (uint8_t)-126, 0);                           /* the lowest: decodes (to tiny values) */
    FORGE(g[eg + 1] = 7, 0);                                   /* padding: ignored */
    /* a pivot on a tile that is not rotated */
    FORGE(g[fl] = (uint8_t)((g[fl] & 1u) | (5u << 2)), TAH_ECORRUPT);
    /* one high tile too many or too few (flip the width bit of tile 0) */
    FORGE(g[fl] ^= 1u, TAH_ECORRUPT);
    /* an index entry that is not the count before its tile (entry 0 must be 0) */
    FORGE(put_u32(g + ix, 1), TAH_ECORRUPT);
#undef FORGE
    free(g);
    free(f);
}

static void test_random_payloads(void **state)
{
    (void)state;
    /* random bytes behind a valid header and checksum: decode either works
     * (then the output is finite) or reports corruption */
    codec_shape_t shape = { 1, 3, 48 };
    float y[144];
    for (size_t i = 0; i < N_SPECS; i++) {
        size_t len;
        uint8_t *f = encode(k_specs[i], shape, &len, NULL);
        for (uint64_t trial = 0; trial < 300; trial++) {
            for (size_t k = CODEC_HEADER_SIZE; k < len; k++)
                f[k] = (uint8_t)codec_synth_u64(trial * 131 + i, k);
            fix_crc(f, len);
            int rc = decode(f, len, y, 144);
            if (rc == 0) {
                for (int k = 0; k < 144; k++)
                    assert_true(isfinite(y[k]));
            } else {
                assert_true(rc == TAH_ECORRUPT || rc == TAH_ENONFINITE);
            }
        }
        free(f);
    }
}

static void test_encode_errors(void **state)
{
    (void)state;
    codec_spec_t spec;
    uint8_t buf[4096];
    float x[64] = { 0 };
    char err[CODEC_ERRLEN];
    codec_spec_parse("fp32", &spec, NULL, 0);
    codec_shape_t shape = { 1, 1, 64 };
    assert_int_equal(codec_encode(&spec, shape, x, buf, 100, NULL, err, sizeof err), TAH_ESPACE);
    codec_shape_t zero = { 1, 0, 64 };
    assert_int_equal(codec_encode(&spec, zero, x, buf, sizeof buf, NULL, err, sizeof err), TAH_ESHAPE);
    codec_shape_t huge = { 65536, 65536, 2 };
    assert_int_equal(codec_frame_size(&spec, huge), TAH_ESHAPE);
    /* the largest allowed shape is accepted by the size computation */
    codec_shape_t largest = { 1, 1u << 15, 1u << 16 };
    for (size_t i = 0; i < N_SPECS; i++) {
        codec_spec_parse(k_specs[i], &spec, NULL, 0);
        assert_true(codec_frame_size(&spec, largest) > 0);
    }
    /* fp16 and bf16 refuse what would overflow to Inf */
    x[3] = 1e5f;
    codec_spec_parse("fp16", &spec, NULL, 0);
    assert_int_equal(codec_encode(&spec, shape, x, buf, sizeof buf, NULL, err, sizeof err), TAH_ERANGE);
    x[3] = 3.4028235e38f;
    codec_spec_parse("bf16", &spec, NULL, 0);
    assert_int_equal(codec_encode(&spec, shape, x, buf, sizeof buf, NULL, err, sizeof err), TAH_ERANGE);
    /* an invalid spec is refused before anything is written */
    spec.id = (codec_id_t)42;
    assert_int_equal(codec_encode(&spec, shape, x, buf, sizeof buf, NULL, err, sizeof err), TAH_ECODEC);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_and_info), cmocka_unit_test(test_truncation_and_trailing),
        cmocka_unit_test(test_bit_flips),          cmocka_unit_test(test_forged_headers),
        cmocka_unit_test(test_random_payloads),    cmocka_unit_test(test_encode_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
