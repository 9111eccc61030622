/* test_frame_seal.c — codec_frame_seal, the header writer for payloads
 * produced elsewhere (the GPU encoder): for every codec, sealing a copy of a
 * CPU frame's payload gives the CPU frame byte for byte, the sealed frame
 * decodes, a wrong length is refused, and a changed payload changes the
 * checksum (the seal covers the payload, not a stale CRC). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec.h"
#include "synth.h"

static const char *const k_specs[] = {
    "fp32", "fp16", "bf16", "tah", "tah:tile=8,alloc_tile=16,hi_frac=0.5", "fixpt",
    "fixpt:bits=3,group=7,stochastic=1,seed=9", "ash-fp8", "ash-fp8:block=16", "int",
    "int:bits=3,group=10,symmetric=1",
};
#define N_SPECS (sizeof k_specs / sizeof k_specs[0])

static void test_seal_matches_encode(void **state)
{
    (void)state;
    const codec_shape_t shape = { 2, 3, 72 };
    const size_t n = 2 * 3 * 72;
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    codec_synth_activations(x, shape, 11);
    for (size_t i = 0; i < n; i++)
        x[i] *= 0.01f; /* keep fixpt's steps within fp16 */
    for (size_t k = 0; k < N_SPECS; k++) {
        codec_spec_t spec;
        char err[CODEC_ERRLEN];
        assert_int_equal(codec_spec_parse(k_specs[k], &spec, err, sizeof err), 0);
        int64_t size = codec_frame_size(&spec, shape);
        assert_true(size > CODEC_HEADER_SIZE);
        uint8_t *ref = malloc((size_t)size), *f = malloc((size_t)size);
        float *y = malloc(n * sizeof *y);
        assert_non_null(ref);
        assert_non_null(f);
        assert_non_null(y);
        size_t len = 0;
        assert_int_equal(codec_encode(&spec, shape, x, ref, (size_t)size, &len, err, sizeof err), 0);
        /* payload from "elsewhere", header full of garbage */
        memset(f, 0xa5, CODEC_HEADER_SIZE);
        memcpy(f + CODEC_HEADER_SIZE, ref + CODEC_HEADER_SIZE, len - CODEC_HEADER_SIZE);
        if (codec_frame_seal(&spec, shape, f, len, err, sizeof err) != 0)
            fail_msg("%s: %s", k_specs[k], err);
        assert_memory_equal(f, ref, len);
        assert_int_equal(codec_decode(f, len, y, n, NULL, err, sizeof err), 0);
        /* wrong lengths are refused and leave the frame alone */
        assert_int_equal(codec_frame_seal(&spec, shape, f, len - 1, err, sizeof err), TAH_ESIZE);
        assert_int_equal(codec_frame_seal(&spec, shape, f, len + 1, err, sizeof err), TAH_ESIZE);
        assert_int_equal(codec_frame_seal(&spec, shape, NULL, len, err, sizeof err), TAH_ESIZE);
        assert_memory_equal(f, ref, len);
        /* the checksum covers the payload: resealing after a change differs */
        f[len - 1] ^= 0x01;
        assert_int_equal(codec_frame_seal(&spec, shape, f, len, err, sizeof err), 0);
        assert_memory_not_equal(f + 60, ref + 60, 4);
        free(ref);
        free(f);
        free(y);
    }
    free(x);
}

static void test_seal_rejects_bad_spec_and_shape(void **state)
{
    (void)state;
    uint8_t buf[256] = { 0 };
    char err[CODEC_ERRLEN];
    codec_spec_t spec;
    assert_int_equal(codec_spec_parse("int", &spec, err, sizeof err), 0);
    spec.p.intq.bits = 7;
    assert_int_equal(codec_frame_seal(&spec, (codec_shape_t){ 1, 1, 8 }, buf, sizeof buf, err, sizeof err),
                     TAH_EPARAM);
    assert_int_equal(codec_spec_parse("fp32", &spec, err, sizeof err), 0);
    assert_int_equal(codec_frame_seal(&spec, (codec_shape_t){ 1, 0, 8 }, buf, sizeof buf, err, sizeof err),
                     TAH_ESHAPE);
    /* fp32 (1,1,8): 64 + 32 bytes */
    assert_int_equal(codec_frame_seal(&spec, (codec_shape_t){ 1, 1, 8 }, buf, 96, err, sizeof err), 0);
    codec_frame_info_t info;
    assert_int_equal(codec_frame_info(buf, 96, &info, err, sizeof err), 0);
    assert_int_equal(info.shape.c, 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seal_matches_encode),
        cmocka_unit_test(test_seal_rejects_bad_spec_and_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
