/* test_codec_primitives.c — the pieces every codec shares: fp16/bf16
 * conversion, CRC-32C, the Walsh–Hadamard transform, bit packing and the
 * codec spec parser. References are computed here in double or by
 * definition. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bitpack.h"
#include "codec.h"
#include "crc32c.h"
#include "fwht.h"
#include "half.h"
#include "synth.h" /* codec_synth_u64, codec_synth_normal */

/* fp16 value of a code by the IEEE definition */
static double ref_half(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : (e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25));
    return s ? -v : v;
}

static void test_half_all_codes(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        double ref = ref_half((uint16_t)h);
        float f = half_to_f32((uint16_t)h);
        if (isnan(ref)) {
            assert_true(isnan(f));
            continue;
        }
        assert_true((double)f == ref);
        assert_int_equal(half_from_f32(f), h); /* round trip, -0 included */
        assert_int_equal(half_from_f32_down(f), h);
        assert_int_equal(half_from_f32_up(f), h);
    }
}

static void test_half_rounding(void **state)
{
    (void)state;
    /* ties go to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 */
    assert_int_equal(half_from_f32(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(half_from_f32(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(half_from_f32(65504.0f), 0x7bff);
    assert_int_equal(half_from_f32(65519.99f), 0x7bff);
    assert_int_equal(half_from_f32(65520.0f), 0x7c00); /* rounds past the largest: Inf */
    assert_int_equal(half_from_f32(0x1p-25f), 0x0000);   /* tie to even (zero) */
    assert_int_equal(half_from_f32(0x1p-25f * 3), 0x0002);
    assert_int_equal(half_from_f32(-0x1p-24f), 0x8001);
    assert_true(isnan(half_to_f32(half_from_f32(NAN))));
    /* random values: RNE result is the nearest code; directed ones bracket */
    for (uint64_t i = 0; i < 200000; i++) {
        float x = (float)(codec_synth_normal(1, i) * ldexp(1.0, (int)(codec_synth_u64(2, i) % 40) - 26));
        uint16_t h = half_from_f32(x), d = half_from_f32_down(x), u = half_from_f32_up(x);
        double hv = ref_half(h), dv = ref_half(d), uv = ref_half(u);
        assert_true(dv <= x && x <= uv);
        assert_true(fabs(hv - x) <= fabs(dv - x) && fabs(hv - x) <= fabs(uv - x));
        if (dv != uv) /* adjacent codes */
            assert_true(uv - dv <= ldexp(fabs(x) + 0x1p-14, -10) * 1.0000001);
    }
    /* the bulk forms equal the scalar ones */
    float src[1003], back[1003];
    uint16_t a[1003];
    for (int i = 0; i < 1003; i++)
        src[i] = (float)(codec_synth_normal(3, (uint64_t)i) * 1000.0);
    half_from_f32_n(a, src, 1003);
    half_to_f32_n(back, a, 1003);
    for (int i = 0; i < 1003; i++) {
        assert_int_equal(a[i], half_from_f32(src[i]));
        assert_true(back[i] == half_to_f32(a[i]));
    }
}

static void test_bf16(void **state)
{
    (void)state;
    for (uint64_t i = 0; i < 200000; i++) {
        float x = (float)(codec_synth_normal(4, i) * ldexp(1.0, (int)(codec_synth_u64(5, i) % 200) - 100));
        float r = bf16_to_f32(bf16_from_f32(x));
        /* RNE to 8 significant bits: error <= half an ulp <= 2^-8 |x|, or
         * half the smallest bf16 subnormal step (2^-134) below 2^-126 */
        assert_true(fabs((double)r - x) <= ldexp(fabs(x), -8) + 0x1p-134);
    }
    assert_int_equal(bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);           /* tie to even */
    assert_int_equal(bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82);       /* tie to even, upward */
    assert_true(isnan(bf16_to_f32(bf16_from_f32(NAN))));
}

static void test_crc32c(void **state)
{
    (void)state;
    /* the standard check value of CRC-32C */
    assert_int_equal(crc32c_update(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(crc32c_update(0, "", 0), 0u);
    uint8_t buf[1000];
    for (int i = 0; i < 1000; i++)
        buf[i] = (uint8_t)codec_synth_u64(6, (uint64_t)i);
    uint32_t whole = crc32c_update(0, buf, 1000);
    for (size_t cut = 0; cut <= 1000; cut += 37)
        assert_int_equal(crc32c_update(crc32c_update(0, buf, cut), buf + cut, 1000 - cut), whole);
}

static void test_fwht(void **state)
{
    (void)state;
    for (size_t n = 1; n <= 4096; n *= 2) {
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        double norm = 0.0;
        for (size_t i = 0; i < n; i++) {
            x[i] = y[i] = (float)codec_synth_normal(7, i);
            norm += (double)x[i] * x[i];
        }
        fwht_f32(y, n);
        /* against H[i][j] = (-1)^popcount(i&j)/sqrt(n) for small n; float32
         * butterflies accumulate log2(n) roundings of values ~sqrt(n)*|x| */
        if (n <= 512) {
            for (size_t i = 0; i < n; i++) {
                double s = 0.0;
                for (size_t j = 0; j < n; j++)
                    s += (__builtin_popcount((unsigned)(i & j)) & 1) ? -(double)x[j] : (double)x[j];
                s /= sqrt((double)n);
                assert_true(fabs(s - y[i]) <= 1e-6 * sqrt(norm) + 1e-6);
            }
        }
        /* self-inverse */
        fwht_f32(y, n);
        for (size_t i = 0; i < n; i++)
            assert_true(fabs((double)y[i] - x[i]) <= 1e-5 * sqrt(norm / (double)n) + 1e-6);
        free(x);
        free(y);
    }
}

static void test_bitpack(void **state)
{
    (void)state;
    uint16_t codes[300], back[300];
    uint8_t buf[700];
    for (unsigned bits = 1; bits <= 16; bits++) {
        for (size_t n = 0; n <= 300; n += (n < 20 ? 1 : 41)) {
            for (size_t i = 0; i < n; i++)
                codes[i] = (uint16_t)(codec_synth_u64(bits, i) & ((1u << bits) - 1u));
            memset(buf, 0xAA, sizeof buf);
            bitpack_pack(buf, codes, n, bits);
            size_t nb = bitpack_bytes(n, bits);
            assert_int_equal(buf[nb], 0xAA); /* nothing written past the end */
            if ((n * bits) % 8)              /* unused high bits are zero */
                assert_int_equal(buf[nb - 1] >> ((n * bits) % 8), 0);
            /* bit k of the stream is bit k%8 of byte k/8 */
            for (size_t i = 0; i < n; i++)
                for (unsigned k = 0; k < bits; k++) {
                    size_t bit = i * bits + k;
                    assert_int_equal((buf[bit / 8] >> (bit % 8)) & 1u, (codes[i] >> k) & 1u);
                }
            bitpack_unpack(back, buf, n, bits);
            assert_memory_equal(back, codes, n * sizeof *codes);
        }
    }
}

static void test_spec_parser(void **state)
{
    (void)state;
    codec_spec_t s;
    char err[CODEC_ERRLEN], buf[512];
    assert_int_equal(codec_spec_parse("tah", &s, err, sizeof err), 0);
    assert_int_equal(s.id, CODEC_TAH);
    assert_int_equal(s.p.tah.tile, 64);
    assert_int_equal(s.p.tah.alloc_tile, 64);
    assert_float_equal(s.p.tah.hi_frac, 0.8f, 0.0f);
    assert_int_equal(s.p.tah.bits_hi, 4);
    assert_int_equal(s.p.tah.bits_lo, 3);
    assert_float_equal(s.p.tah.tau, 2.0f, 0.0f);
    assert_int_equal(codec_spec_parse("tah:hi_frac=0.5,tile=32", &s, err, sizeof err), 0);
    assert_float_equal(s.p.tah.hi_frac, 0.5f, 0.0f);
    assert_int_equal(s.p.tah.tile, 32);
    assert_int_equal(codec_spec_parse("fixpt:bits=8,scale=1024,stochastic=1", &s, err, sizeof err), 0);
    assert_int_equal(s.p.fixpt.stochastic, 1);
    assert_int_equal(codec_spec_parse("ash-fp8:block=256", &s, err, sizeof err), 0);
    assert_int_equal(codec_spec_parse("int:bits=4,group=128", &s, err, sizeof err), 0);
    assert_int_equal(codec_spec_parse("fp32", &s, err, sizeof err), 0);
    /* errors name the problem */
    assert_int_equal(codec_spec_parse("zip", &s, err, sizeof err), TAH_ECODEC);
    assert_non_null(strstr(err, "zip"));
    assert_int_equal(codec_spec_parse("tah:size=3", &s, err, sizeof err), TAH_EPARAM);
    assert_non_null(strstr(err, "size"));
    const char *bad[] = { "tah:", "tah:tile", "tah:tile=", "tah:tile=63", "tah:tile=-64", "tah:tile=64x",
                          "tah:hi_frac=1.5", "tah:hi_frac=nan", "tah:bits_hi=9", "tah:bits_lo=5",
                          "tah:alloc_tile=96", "fixpt:bits=1", "fixpt:bits=17", "fixpt:scale=0",
                          "fixpt:stochastic=2", "ash-fp8:block=100", "int:bits=7", "int:group=0",
                          "fp32:bits=8", "tah:tile=99999999999", "tah:window=1025", "tah:window=-1", "" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (codec_spec_parse(bad[i], &s, err, sizeof err) == 0)
            fail_msg("spec '%s' accepted", bad[i]);
    /* format -> parse is the identity */
    const char *good[] = { "tah:tile=16,alloc_tile=32,hi_frac=0.25,tau=1.5", "tah:window=0", "fixpt:bits=6,seed=99",
                           "ash-fp8:block=64,tau=2", "int:bits=3,group=32,symmetric=1", "bf16" };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        codec_spec_t t;
        assert_int_equal(codec_spec_parse(good[i], &s, err, sizeof err), 0);
        assert_int_equal(codec_spec_format(&s, buf, sizeof buf), 0);
        assert_int_equal(codec_spec_parse(buf, &t, err, sizeof err), 0);
        assert_memory_equal(&s, &t, sizeof s);
    }
    /* tah's window: 32 by default, 0 (per sample) kept through format and parse */
    assert_int_equal(codec_spec_parse("tah", &s, err, sizeof err), 0);
    assert_int_equal(s.p.tah.window, 32);
    assert_int_equal(codec_spec_format(&s, buf, sizeof buf), 0);
    assert_non_null(strstr(buf, ",window=32"));
    assert_int_equal(codec_spec_parse("tah:window=0", &s, err, sizeof err), 0);
    assert_int_equal(codec_spec_format(&s, buf, sizeof buf), 0);
    assert_non_null(strstr(buf, ",window=0"));
}

/* codec_spec_derive / codec_spec_for_tensor: a stochastic fixpt spec gets a
 * seed of its own per id (the same id: the same seed; every field of a
 * tensor's identity changes it); every other spec is copied unchanged. */
static void test_spec_derive(void **state)
{
    (void)state;
    codec_spec_t base, a, b;
    const char *same[] = { "fixpt", "fixpt:seed=5", "tah", "int:bits=4", "ash-fp8", "fp16" };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        assert_int_equal(codec_spec_parse(same[i], &base, NULL, 0), 0);
        codec_spec_for_tensor(&base, CODEC_STREAM_BWD, 2, 17, 3, &a);
        assert_memory_equal(&a, &base, sizeof base);
    }
    assert_int_equal(codec_spec_parse("fixpt:stochastic=1,seed=5", &base, NULL, 0), 0);
    codec_spec_derive(&base, 9, &a);
    codec_spec_derive(&base, 9, &b);
    assert_memory_equal(&a, &b, sizeof a);
    assert_true(a.p.fixpt.seed != base.p.fixpt.seed);
    a.p.fixpt.seed = base.p.fixpt.seed; /* only the seed differs */
    assert_memory_equal(&a, &base, sizeof a);
    enum { N = 5 };
    const int f[N][4] = { { 0, 1, 1, 0 }, { 1, 1, 1, 0 }, { 0, 2, 1, 0 }, { 0, 1, 2, 0 }, { 0, 1, 1, 1 } };
    uint64_t seeds[N];
    for (int i = 0; i < N; i++) {
        codec_spec_for_tensor(&base, f[i][0], f[i][1], f[i][2], f[i][3], &a);
        seeds[i] = a.p.fixpt.seed;
        for (int j = 0; j < i; j++)
            assert_true(seeds[i] != seeds[j]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_all_codes), cmocka_unit_test(test_half_rounding),
        cmocka_unit_test(test_bf16),           cmocka_unit_test(test_crc32c),
        cmocka_unit_test(test_fwht),           cmocka_unit_test(test_bitpack),
        cmocka_unit_test(test_spec_parser),
        cmocka_unit_test(test_spec_derive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
