/* test_codecs_other.c — FP8 conversions, ASH-FP8, scaled fixed-point and
 * grouped INT codecs, each checked against a float64 reference written here
 * (independent of the codec's float arithmetic), through the public
 * codec_spec_parse / codec_encode / codec_decode API, plus the decoders'
 * rejection of corrupt payloads (through the codec ops directly, and once
 * through the frame API with a recomputed checksum). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "codec_impl.h" /* codec_*_ops, codec_get_/put_ helpers */
#include "crc32c.h"     /* crc32c_update: re-seal tampered frames */
#include "fp8.h"

/* ------------------------------------------------------------------ */
/* helpers                                                            */
/* ------------------------------------------------------------------ */

static uint64_t s_rng_state;

static uint64_t s_rng_u64(void)
{
    uint64_t z = (s_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double s_rng_uniform(void) { return (double)(s_rng_u64() >> 11) * 0x1p-53; }

static double s_rng_normal(void)
{
    double u = s_rng_uniform(), v = s_rng_uniform();
    return sqrt(-2.0 * log(u + 0x1p-60)) * cos(6.283185307179586 * v);
}

static float *s_alloc_f(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static void s_fill_normal(float *x, size_t n, double sd)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(s_rng_normal() * sd);
}

static uint32_t s_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Encode x through the public API; returns the frame (caller frees) or
 * NULL with *rc set. */
static uint8_t *s_encode(const char *spec_str, codec_shape_t shape, const float *x, size_t *len, int *rc)
{
    codec_spec_t spec;
    char err[CODEC_ERRLEN];
    int r = codec_spec_parse(spec_str, &spec, err, sizeof err);
    if (r != 0) {
        print_error("spec '%s': %s\n", spec_str, err);
        fail();
    }
    int64_t fs = codec_frame_size(&spec, shape);
    assert_true(fs > 0);
    uint8_t *frame = malloc((size_t)fs);
    assert_non_null(frame);
    r = codec_encode(&spec, shape, x, frame, (size_t)fs, len, err, sizeof err);
    *rc = r;
    if (r != 0) {
        free(frame);
        return NULL;
    }
    assert_int_equal(*len, (size_t)fs);
    return frame;
}

/* Encode + decode; fails the test on any error. Returns the frame. */
static uint8_t *s_roundtrip(const char *spec_str, codec_shape_t shape, const float *x, float *out, size_t *len)
{
    int rc = 0;
    uint8_t *frame = s_encode(spec_str, shape, x, len, &rc);
    if (!frame) {
        print_error("encode '%s' failed: %s\n", spec_str, tah_strerror(rc));
        fail();
    }
    char err[CODEC_ERRLEN];
    codec_frame_info_t info;
    rc = codec_decode(frame, *len, out, codec_shape_elems(shape), &info, err, sizeof err);
    if (rc != 0) {
        print_error("decode '%s' failed: %s\n", spec_str, err);
        fail();
    }
    assert_int_equal(info.nelems, codec_shape_elems(shape));
    return frame;
}

/* Recompute the frame checksum after tampering with the payload. */
static void s_reseal(uint8_t *frame, size_t len)
{
    uint32_t crc = crc32c_update(0, frame, 60);
    crc = crc32c_update(crc, frame + CODEC_HEADER_SIZE, len - CODEC_HEADER_SIZE);
    codec_put_u32(frame + 60, crc);
}

static codec_shape_t s_shape(uint32_t b, uint32_t s, uint32_t c)
{
    codec_shape_t sh = { b, s, c };
    return sh;
}

/* ---- independent fp16 reference (value table by formula, searched) ---- */

static double s_h16_val[0x7c00]; /* positive finite codes 0..0x7bff, increasing */

static void s_h16_init(void)
{
    for (uint32_t h = 0; h < 0x7c00; h++) {
        uint32_t e = h >> 10, m = h & 1023u;
        s_h16_val[h] = e == 0 ? ldexp((double)m, -24) : ldexp(1.0 + m / 1024.0, (int)e - 15);
    }
}

static double s_h16_decode(uint16_t h)
{
    double v = s_h16_val[h & 0x7fffu];
    return (h & 0x8000u) ? -v : v;
}

/* smallest fp16 value >= v (v >= 0, v <= 65504) */
static double s_h16_up(double v)
{
    uint32_t lo = 0, hi = 0x7bff;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (s_h16_val[mid] >= v)
            hi = mid;
        else
            lo = mid + 1;
    }
    return s_h16_val[lo];
}

/* largest fp16 value <= v, any sign, |v| <= 65504 */
static double s_h16_down(double v)
{
    if (v < 0)
        return -s_h16_up(-v);
    uint32_t lo = 0, hi = 0x7bff;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (s_h16_val[mid] <= v)
            lo = mid;
        else
            hi = mid - 1;
    }
    return s_h16_val[lo];
}

/* ---- independent FP8 references ---- */

/* value of an E4M3 code by the format's definition; NaN for S.1111.111 */
static double s_e4m3_ref(uint32_t c)
{
    uint32_t e = (c >> 3) & 15u, m = c & 7u;
    double v;
    if (e == 15 && m == 7)
        return NAN;
    v = e == 0 ? (m / 8.0) * ldexp(1.0, -6) : (1.0 + m / 8.0) * ldexp(1.0, (int)e - 7);
    return (c & 0x80u) ? -v : v;
}

static double s_e5m2_ref(uint32_t c)
{
    uint32_t e = (c >> 2) & 31u, m = c & 3u;
    double v;
    if (e == 31)
        v = m == 0 ? INFINITY : NAN;
    else
        v = e == 0 ? (m / 4.0) * ldexp(1.0, -14) : (1.0 + m / 4.0) * ldexp(1.0, (int)e - 15);
    return (c & 0x80u) ? -v : v;
}

/* Round v (finite double) to the nearest of the `count` non-negative codes
 * 0..count-1 of table val (increasing), ties to the even code, saturating
 * at the last code; sign applied as bit 7. */
static uint8_t s_fp8_round_ref(double v, const double *val, uint32_t count)
{
    uint8_t sign = (v < 0 || (v == 0 && signbit(v))) ? 0x80 : 0;
    double a = fabs(v);
    if (a >= val[count - 1])
        return (uint8_t)(sign | (count - 1));
    uint32_t c = 0;
    while (c + 1 < count && val[c + 1] <= a)
        c++;
    /* val[c] <= a < val[c+1] */
    double lo = a - val[c], hi = val[c + 1] - a;
    uint32_t r = lo < hi ? c : (hi < lo ? c + 1 : ((c & 1u) ? c + 1 : c));
    return (uint8_t)(sign | r);
}

static double s_e4m3_tab[127]; /* codes 0..126: 0 .. 448 */
static double s_e5m2_tab[124]; /* codes 0..123: 0 .. 57344 */

static void s_fp8_tabs_init(void)
{
    for (uint32_t c = 0; c < 127; c++)
        s_e4m3_tab[c] = s_e4m3_ref(c);
    for (uint32_t c = 0; c < 124; c++)
        s_e5m2_tab[c] = s_e5m2_ref(c);
}

/* E4M3 round to nearest even, saturating (the codec's quantiser), in double */
static uint8_t s_e4m3_enc_ref(double v) { return s_fp8_round_ref(v, s_e4m3_tab, 127); }

static int s_setup(void **state)
{
    (void)state;
    s_h16_init();
    s_fp8_tabs_init();
    return 0;
}

/* ------------------------------------------------------------------ */
/* FP8                                                                */
/* ------------------------------------------------------------------ */

static void test_e4m3_every_code(void **state)
{
    (void)state;
    uint8_t codes[256];
    float bulk[256], scaled[256];
    for (uint32_t c = 0; c < 256; c++)
        codes[c] = (uint8_t)c;
    fp8_e4m3_to_f32_n(bulk, codes, 256);
    fp8_e4m3_to_f32_scaled_n(scaled, codes, -0.75f, 256);
    for (uint32_t c = 0; c < 256; c++) {
        double ref = s_e4m3_ref(c);
        float got = fp8_e4m3_to_f32((uint8_t)c);
        assert_int_equal(s_bits(got), s_bits(bulk[c]));
        assert_int_equal(s_bits(got * -0.75f), s_bits(scaled[c]));
        if (isnan(ref)) {
            assert_true(isnan(got));
            assert_int_equal(fp8_e4m3_from_f32(got) & 0x7f, 0x7f);
            continue;
        }
        /* exact value, and the sign of zero */
        assert_true((double)got == ref);
        assert_int_equal(signbit(got) != 0, (c & 0x80u) != 0);
        assert_int_equal(fp8_e4m3_from_f32(got), c);
    }
    assert_true(fp8_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(fp8_e4m3_to_f32(0x08) == 0x1p-6f);
    assert_true(fp8_e4m3_to_f32(0x01) == 0x1p-9f);
}

static void test_e5m2_every_code(void **state)
{
    (void)state;
    for (uint32_t c = 0; c < 256; c++) {
        double ref = s_e5m2_ref(c);
        float got = fp8_e5m2_to_f32((uint8_t)c);
        if (isnan(ref)) {
            assert_true(isnan(got));
            uint8_t back = fp8_e5m2_from_f32(got);
            assert_true((back & 0x7c) == 0x7c && (back & 3) != 0);
            continue;
        }
        assert_true((double)got == ref);
        assert_int_equal(signbit(got) != 0, (c & 0x80u) != 0);
        assert_int_equal(fp8_e5m2_from_f32(got), c);
    }
    assert_true(fp8_e5m2_to_f32(0x7b) == 57344.0f);
    assert_true(fp8_e5m2_to_f32(0x01) == 0x1p-16f);
}

/* Ties: the midpoint of two adjacent codes (exact in float: at most 5
 * significant bits) goes to the even code; one float ulp either side goes
 * to the nearer code. Covers the subnormal range (0..8) and the
 * subnormal/normal boundary. */
static void s_check_ties(uint8_t (*enc)(float), double (*ref)(uint32_t), uint32_t last)
{
    for (uint32_t c = 0; c < last; c++) {
        for (uint32_t sgn = 0; sgn <= 0x80; sgn += 0x80) {
            double a = ref(c | sgn), b = ref((c + 1) | sgn);
            float mid = (float)((a + b) / 2);
            assert_true((double)mid == (a + b) / 2);
            uint32_t even = (c & 1u) ? c + 1 : c;
            assert_int_equal(enc(mid), even | sgn);
            float toward_a = nextafterf(mid, (float)a), toward_b = nextafterf(mid, (float)b);
            if (c == 0 && sgn)
                assert_int_equal(enc(toward_a), 0x80); /* -0 */
            else
                assert_int_equal(enc(toward_a), c | sgn);
            assert_int_equal(enc(toward_b), (c + 1) | sgn);
        }
    }
}

static double s_e4m3_ref_code(uint32_t c) { return s_e4m3_ref(c); }
static double s_e5m2_ref_code(uint32_t c) { return s_e5m2_ref(c); }

static void test_fp8_ties_saturation_subnormals(void **state)
{
    (void)state;
    s_check_ties(fp8_e4m3_from_f32, s_e4m3_ref_code, 0x7e);
    s_check_ties(fp8_e5m2_from_f32, s_e5m2_ref_code, 0x7b);

    /* E4M3 saturates finite values and Inf to +-448, keeps NaN */
    const float big4[] = { 448.0f, 449.0f, 463.99f, 464.0f, 480.0f, 1e6f, FLT_MAX, INFINITY };
    for (size_t i = 0; i < sizeof big4 / sizeof big4[0]; i++) {
        assert_int_equal(fp8_e4m3_from_f32(big4[i]), 0x7e);
        assert_int_equal(fp8_e4m3_from_f32(-big4[i]), 0xfe);
    }
    assert_int_equal(fp8_e4m3_from_f32(NAN) & 0x7f, 0x7f);
    assert_int_equal(fp8_e4m3_from_f32(416.0f), 0x7d); /* 416 = 1.625 * 2^8, exact */
    assert_int_equal(fp8_e4m3_from_f32(432.0f), 0x7e); /* tie 416|448 -> even 0x7e */

    /* E5M2 saturates finite values to +-57344; Inf stays Inf; NaN stays NaN */
    const float big5[] = { 57344.0f, 61439.0f, 61440.0f, 65536.0f, 1e9f, FLT_MAX };
    for (size_t i = 0; i < sizeof big5 / sizeof big5[0]; i++) {
        assert_int_equal(fp8_e5m2_from_f32(big5[i]), 0x7b);
        assert_int_equal(fp8_e5m2_from_f32(-big5[i]), 0xfb);
    }
    assert_int_equal(fp8_e5m2_from_f32(INFINITY), 0x7c);
    assert_int_equal(fp8_e5m2_from_f32(-INFINITY), 0xfc);
    uint8_t n5 = fp8_e5m2_from_f32(NAN);
    assert_true((n5 & 0x7c) == 0x7c && (n5 & 3) != 0);

    /* subnormals and underflow */
    assert_int_equal(fp8_e4m3_from_f32(0x1p-10f), 0x00);       /* tie 0|1 -> 0 */
    assert_int_equal(fp8_e4m3_from_f32(0x1.000002p-10f), 0x01); /* just above the tie */
    assert_int_equal(fp8_e4m3_from_f32(0x3p-10f), 0x02);       /* tie 1|2 -> 2 */
    assert_int_equal(fp8_e4m3_from_f32(0x1.ep-7f), 0x08);      /* 15*2^-10 tie 7|8 -> 8 (min normal) */
    assert_int_equal(fp8_e4m3_from_f32(1e-30f), 0x00);
    assert_int_equal(fp8_e4m3_from_f32(-1e-30f), 0x80);
    assert_int_equal(fp8_e4m3_from_f32(1e-45f), 0x00); /* float subnormal input */
    assert_int_equal(fp8_e5m2_from_f32(0x1p-17f), 0x00);
    assert_int_equal(fp8_e5m2_from_f32(0x3p-17f), 0x02);
    assert_int_equal(fp8_e5m2_from_f32(-0.0f), 0x80);
}

/* Every encoder result against the double reference on random floats
 * spread over (and beyond) each format's range, plus the bulk forms. */
static void test_fp8_random_vs_reference(void **state)
{
    (void)state;
    enum { N = 200000 };
    float *x = s_alloc_f(N);
    uint8_t *bulk = malloc(N), *scaled = malloc(N);
    assert_non_null(bulk);
    assert_non_null(scaled);
    s_rng_state = 11;
    for (size_t i = 0; i < N; i++) {
        /* random sign/mantissa, exponent in [-24, 20) */
        uint32_t u = (uint32_t)s_rng_u64();
        int e = (int)(s_rng_u64() % 44) - 24;
        x[i] = ldexpf(1.0f + (float)(u & 0x7fffffu) * 0x1p-23f, e) * ((u >> 31) ? -1.0f : 1.0f);
    }
    fp8_e4m3_from_f32_n(bulk, x, N);
    fp8_e4m3_from_f32_scaled_n(scaled, x, 0.5f, N);
    for (size_t i = 0; i < N; i++) {
        uint8_t r4 = s_e4m3_enc_ref(x[i]);
        uint8_t g4 = fp8_e4m3_from_f32(x[i]);
        if (g4 != r4) {
            print_error("e4m3(%a) = 0x%02x, reference 0x%02x\n", (double)x[i], g4, r4);
            fail();
        }
        assert_int_equal(bulk[i], g4);
        assert_int_equal(scaled[i], fp8_e4m3_from_f32(x[i] * 0.5f)); /* x/2 is exact here */
        uint8_t r5 = s_fp8_round_ref(x[i], s_e5m2_tab, 124);
        uint8_t g5 = fp8_e5m2_from_f32(x[i]);
        if (g5 != r5) {
            print_error("e5m2(%a) = 0x%02x, reference 0x%02x\n", (double)x[i], g5, r5);
            fail();
        }
    }
    free(x);
    free(bulk);
    free(scaled);
}

/* ------------------------------------------------------------------ */
/* ASH-FP8                                                            */
/* ------------------------------------------------------------------ */

/* orthonormal Walsh-Hadamard in double (Sylvester order) */
static void s_fwht_ref(double *v, uint32_t n)
{
    for (uint32_t h = 1; h < n; h *= 2)
        for (uint32_t i = 0; i < n; i += 2 * h)
            for (uint32_t j = i; j < i + h; j++) {
                double a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
    double norm = 1.0 / sqrt((double)n);
    for (uint32_t i = 0; i < n; i++)
        v[i] *= norm;
}

/* ash.c's S by its definition (its header), recursively: the pairwise sum
 * (adjacent halves) in float of the squares of x * sc over the block padded
 * with zeros to n. */
static float s_ash_tree(const float *x, uint32_t m, uint32_t a, uint32_t w, float sc)
{
    if (w == 1) {
        float u = a < m ? x[a] * sc : 0.0f;
        return u * u;
    }
    return s_ash_tree(x, m, a, w / 2, sc) + s_ash_tree(x, m, a + w / 2, w / 2, sc);
}

/* alpha as ash.c defines it, to the bit */
static float s_ash_alpha(const float *x, uint32_t m, uint32_t n, double tau, double eps)
{
    double S = s_ash_tree(x, m, 0, n, 1.0f);
    if (S < 0x1p-64)
        S = (double)s_ash_tree(x, m, 0, n, 0x1p80f) * 0x1p-160;
    else if (!(S <= FLT_MAX))
        S = (double)s_ash_tree(x, m, 0, n, 0x1p-80f) * 0x1p160;
    double sigma = sqrt(S / n) + eps;
    double alpha = sigma > 0 ? tau / sigma : (double)FLT_MAX;
    return (float)fmin(fmax(alpha, (double)FLT_MIN), 0x1p127);
}

/* Check an ASH-FP8 frame of x against a float64 model of the method.
 *
 * Per block (reference in double, padded length n):
 *   sigma = sqrt(sum x^2 / n) + eps, alpha = tau / sigma (clamped to
 *   [FLT_MIN, 2^127] like the codec), z = H(alpha x), s = max|z| / 448.
 * Tolerances:
 *   alpha: the codec's sum of squares is a pairwise float sum (relative
 *          error below (log2 n + 1) 2^-24) and its alpha is rounded to
 *          float: relative 2^-20; and to the bit s_ash_alpha, ash.c's
 *          definition written out.
 *   z:     the codec's float z differs from the double z by at most
 *          Ez = (log2 n + 3) 2^-24 * sum|alpha x| / sqrt(n) (one rounding
 *          of alpha*x, one per butterfly stage, one for the 1/sqrt(n)
 *          scale; each stage's partial sums are bounded by sum|alpha x|).
 *   code:  RNE to 3 mantissa bits has relative error <= 2^-4 (half an ulp
 *          of a value >= 2^E whose ulp is 2^(E-3)); below 2^-6 the
 *          subnormal step is 2^-9, half of it 2^-10, times s. The codec
 *          quantises z_codec * fl(1/s) (relative 2^-22 off z/s). So
 *          |fp8(q) s - z| <= (|z| + Ez) 2^-4 + s 2^-10 + Ez + |z| 2^-20.
 *   x:     H is orthonormal, so ||x^ - x||_2 <= ||bound_z||_2 / alpha, plus
 *          the decoder's own float error, checked elementwise against a
 *          double decode of the frame's own codes, clamp(H(fp8(q) s)/alpha,
 *          +-FLT_MAX): Ed = (log2 n + 4) 2^-24 sum|w| / sqrt(n) (one
 *          rounding for fp8(q)*s, one per stage, the 1/sqrt(n) scale and
 *          the two for the fold normalisation and 1/alpha; each may
 *          instead lose up to 2^-150 where the output is a float subnormal). */
static void s_check_ash(const char *spec_str, codec_shape_t shape, const float *x)
{
    codec_spec_t spec;
    assert_int_equal(codec_spec_parse(spec_str, &spec, NULL, 0), 0);
    const uint32_t n = spec.p.ash.block;
    const double tau = spec.p.ash.tau, eps = spec.p.ash.eps;
    const uint64_t N = codec_shape_elems(shape);
    float *out = s_alloc_f(N);
    size_t len = 0;
    uint8_t *frame = s_roundtrip(spec_str, shape, x, out, &len);
    const uint64_t nb = (N + n - 1) / n;
    assert_int_equal(len, CODEC_HEADER_SIZE + nb * (8 + n));
    double *v = malloc(n * sizeof *v), *w = malloc(n * sizeof *w);
    assert_non_null(v);
    assert_non_null(w);
    const double logn = log2((double)n);
    for (uint64_t b = 0; b < nb; b++) {
        const uint8_t *blk = frame + CODEC_HEADER_SIZE + b * (8 + n);
        const float alpha_c = codec_get_f32(blk), s_c = codec_get_f32(blk + 4);
        const uint8_t *q = blk + 8;
        const uint64_t off = b * n;
        const uint32_t m = (uint32_t)(N - off < n ? N - off : n);
        double ss = 0, l1 = 0;
        for (uint32_t j = 0; j < m; j++)
            ss += (double)x[off + j] * x[off + j];
        double sigma = sqrt(ss / n) + eps;
        double alpha = sigma > 0 ? tau / sigma : (double)FLT_MAX;
        alpha = fmin(fmax(alpha, (double)FLT_MIN), 0x1p127);
        for (uint32_t j = 0; j < n; j++) {
            v[j] = j < m ? alpha * x[off + j] : 0.0;
            l1 += fabs(v[j]);
        }
        s_fwht_ref(v, n);
        double amax = 0;
        for (uint32_t j = 0; j < n; j++)
            amax = fmax(amax, fabs(v[j]));
        if (amax == 0) { /* all-zero block: alpha = s = 0, codes 0, decodes to 0 */
            assert_true(alpha_c == 0.0f && s_c == 0.0f);
            for (uint32_t j = 0; j < n; j++)
                assert_int_equal(q[j], 0);
            for (uint32_t j = 0; j < m; j++)
                assert_true(out[off + j] == 0.0f);
            continue;
        }
        const double Ez = (logn + 3) * 0x1p-24 * l1 / sqrt((double)n);
        const double s = amax / 448.0;
        assert_true(fabs(alpha_c - alpha) <= 0x1p-20 * alpha);
        assert_true(alpha_c == s_ash_alpha(x + off, m, n, tau, eps));
        assert_true(fabs(s_c - s) <= (Ez / 448.0) + 0x1p-22 * s);
        /* z-domain error per element, and its L2 norm */
        double bound2 = 0, werr = 0, wsum = 0;
        for (uint32_t j = 0; j < n; j++) {
            double zq = s_e4m3_ref(q[j]) * s_c;
            double bound = (fabs(v[j]) + Ez) * 0x1p-4 + s * 0x1p-10 + Ez + fabs(v[j]) * 0x1p-20;
            if (!(fabs(zq - v[j]) <= bound)) {
                print_error("%s block %llu elem %u: z %.9g decoded %.9g (code 0x%02x) bound %.3g\n", spec_str,
                            (unsigned long long)b, j, v[j], zq, q[j], bound);
                fail();
            }
            /* the codec's code is the reference RNE code of z/s, or a
             * neighbour when z/s sits within the float error of a tie */
            uint8_t r = s_e4m3_enc_ref(v[j] / s);
            if (r != q[j]) {
                double ydiff = fabs(s_e4m3_ref(r) - s_e4m3_ref(q[j]));
                assert_true(ydiff <= 2 * ((fabs(v[j]) + Ez) * 0x1p-4 + s * 0x1p-10 + Ez) / s);
            }
            bound2 += bound * bound;
            w[j] = zq / alpha_c;
            wsum += fabs(w[j]);
        }
        /* decoder arithmetic: double decode of the frame's own codes */
        s_fwht_ref(w, n);
        const double Ed = (logn + 4) * (0x1p-24 * wsum / sqrt((double)n) + 0x1p-149);
        double e2 = 0;
        for (uint32_t j = 0; j < m; j++) {
            double d = out[off + j] - fmin(fmax(w[j], -FLT_MAX), FLT_MAX);
            if (!(fabs(d) <= Ed)) {
                print_error("%s block %llu elem %u: decoded %.9g, double decode %.9g, bound %.3g\n", spec_str,
                            (unsigned long long)b, j, (double)out[off + j], w[j], Ed);
                fail();
            }
            double ex = out[off + j] - (double)x[off + j];
            e2 += ex * ex;
            werr = fmax(werr, fabs(ex));
        }
        /* round trip: ||x^ - x||_2 <= ||bound_z||_2 / alpha + sqrt(m) Ed */
        const double l2bound = sqrt(bound2) / alpha * (1 + 1e-6) + sqrt((double)m) * Ed;
        if (!(sqrt(e2) <= l2bound)) {
            print_error("%s block %llu: ||x^-x|| %.6g > bound %.6g (max elem err %.3g)\n", spec_str,
                        (unsigned long long)b, sqrt(e2), l2bound, werr);
            fail();
        }
    }
    free(v);
    free(w);
    free(frame);
    free(out);
}

static void test_ash_random(void **state)
{
    (void)state;
    s_rng_state = 21;
    codec_shape_t sh = s_shape(2, 16, 96); /* 3072 = 12 blocks of 256 */
    float *x = s_alloc_f(codec_shape_elems(sh));
    s_fill_normal(x, codec_shape_elems(sh), 0.7);
    s_check_ash("ash-fp8", sh, x);
    s_check_ash("ash-fp8:block=64", sh, x);
    s_check_ash("ash-fp8:block=16", sh, x);
    s_check_ash("ash-fp8:block=1024,tau=3.5,eps=1e-6", sh, x);
    s_check_ash("ash-fp8:block=4096", sh, x); /* one padded block */
    /* a mean RMS error sanity figure: E4M3 keeps ~2.5 % relative L2 */
    float *out = s_alloc_f(codec_shape_elems(sh));
    size_t len;
    free(s_roundtrip("ash-fp8", sh, x, out, &len));
    double e2 = 0, x2 = 0;
    for (uint64_t i = 0; i < codec_shape_elems(sh); i++) {
        e2 += ((double)out[i] - x[i]) * ((double)out[i] - x[i]);
        x2 += (double)x[i] * x[i];
    }
    assert_true(sqrt(e2 / x2) < 0.04);
    free(out);
    free(x);
}

/* Every partial-block length 1..n (fold decoder paths: m a power of two,
 * m just above one, tensors smaller than one block), with and without a
 * leading full block. */
static void test_ash_partial_blocks(void **state)
{
    (void)state;
    s_rng_state = 22;
    float *x = s_alloc_f(128);
    s_fill_normal(x, 128, 1.0);
    for (uint32_t len = 1; len <= 128; len++)
        s_check_ash("ash-fp8:block=64", s_shape(1, 1, len), x);
    free(x);
    /* largest block, tensor not a multiple of it */
    uint32_t big = 65536 + 40000;
    x = s_alloc_f(big);
    s_fill_normal(x, big, 2.0);
    s_check_ash("ash-fp8:block=65536", s_shape(1, 1, big), x);
    s_check_ash("ash-fp8:block=65536", s_shape(1, 1, 40001), x);
    free(x);
}

static void test_ash_edges(void **state)
{
    (void)state;
    s_rng_state = 23;
    enum { N = 1000 };
    float *x = s_alloc_f(N);
    /* zeros (eps default, and eps = 0: alpha would be infinite) */
    s_check_ash("ash-fp8:block=64", s_shape(1, 1, N), x);
    s_check_ash("ash-fp8:block=64,eps=0", s_shape(1, 1, N), x);
    /* one spike among zeros: the Hadamard spreads it over its block */
    x[517] = 1234.5f;
    s_check_ash("ash-fp8:block=64", s_shape(1, 1, N), x);
    s_check_ash("ash-fp8:block=256,eps=0", s_shape(1, 1, N), x);
    /* one spike among noise */
    s_fill_normal(x, N, 0.01);
    x[3] = -80.0f;
    s_check_ash("ash-fp8:block=128", s_shape(1, 1, N), x);
    /* very small magnitudes (down to float subnormals) and very large */
    const double scales[] = { 1e-30, 1e-40, 1e-12, 1e12, 1e30, 1e36 };
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        s_fill_normal(x, N, scales[k]);
        s_check_ash("ash-fp8:block=64", s_shape(1, 1, N), x);
        s_check_ash("ash-fp8:block=256,eps=0", s_shape(1, 1, N), x);
    }
    /* near FLT_MAX: sum of squares in double, alpha clamped at FLT_MIN */
    for (size_t i = 0; i < N; i++)
        x[i] = (i % 3 == 0) ? 3e38f : -1e38f;
    s_check_ash("ash-fp8:block=64", s_shape(1, 1, N), x);
    free(x);
}

static void test_ash_rejects_corrupt(void **state)
{
    (void)state;
    s_rng_state = 24;
    codec_spec_t spec;
    assert_int_equal(codec_spec_parse("ash-fp8:block=16", &spec, NULL, 0), 0);
    codec_shape_t sh = s_shape(1, 2, 20); /* 40 = 2 blocks + 8 */
    float x[40], out[40];
    s_fill_normal(x, 40, 1.0);
    uint64_t ps = codec_ash_ops.payload_size(&spec, sh);
    assert_int_equal(ps, 3 * (8 + 16));
    uint8_t good[72], bad[72];
    assert_int_equal(codec_ash_ops.encode(&spec, sh, x, good), 0);
    assert_int_equal(codec_ash_ops.decode(&spec, sh, good, out), 0);
    const struct { size_t off; uint32_t val; } f32s[] = {
        { 0, 0x7fc00000u },            /* alpha NaN */
        { 0, 0x7f800000u },            /* alpha Inf */
        { 4, 0xff800000u },            /* s -Inf */
        { 4, 0xbf800000u },            /* s = -1 */
        { 24, 0x80000000u },           /* alpha = -0 */
        { 24, 0x00000000u },           /* alpha = 0 with s > 0 */
        { 48, 0x00000001u },           /* alpha subnormal (below 2^-126) */
        { 48, 0x7f000000u },           /* alpha 2^127 ... */
        { 48, 0x7f000001u },           /* ... is the largest allowed */
    };
    for (size_t k = 0; k < sizeof f32s / sizeof f32s[0]; k++) {
        memcpy(bad, good, ps);
        codec_put_u32(bad + f32s[k].off, f32s[k].val);
        int want = f32s[k].val == 0x7f000000u ? 0 : TAH_ECORRUPT;
        assert_int_equal(codec_ash_ops.decode(&spec, sh, bad, out), want);
    }
    /* NaN codes */
    const size_t code_at[] = { 8, 8 + 15, 24 + 8 + 3, 48 + 8 + 15 /* padding code of the last block */ };
    for (size_t k = 0; k < sizeof code_at / sizeof code_at[0]; k++)
        for (int sgn = 0; sgn < 2; sgn++) {
            memcpy(bad, good, ps);
            bad[code_at[k]] = sgn ? 0xff : 0x7f;
            assert_int_equal(codec_ash_ops.decode(&spec, sh, bad, out), TAH_ECORRUPT);
        }
    /* s = 0 decodes to zeros whatever alpha >= 0 says */
    memcpy(bad, good, ps);
    codec_put_u32(bad + 4, 0);
    assert_int_equal(codec_ash_ops.decode(&spec, sh, bad, out), 0);
    for (int j = 0; j < 16; j++)
        assert_true(out[j] == 0.0f);
    /* through the frame API (checksum re-sealed): the same error */
    size_t len = 0;
    int rc = 0;
    uint8_t *frame = s_encode("ash-fp8:block=16", sh, x, &len, &rc);
    assert_non_null(frame);
    codec_put_u32(frame + CODEC_HEADER_SIZE + 4, 0xbf800000u);
    s_reseal(frame, len);
    char err[CODEC_ERRLEN];
    assert_int_equal(codec_decode(frame, len, out, 40, NULL, err, sizeof err), TAH_ECORRUPT);
    free(frame);
}

/* ------------------------------------------------------------------ */
/* scaled fixed-point                                                 */
/* ------------------------------------------------------------------ */

static uint64_t s_splitmix_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* the documented stochastic-rounding uniform of element i (fixpt.c's top) */
static double s_fixpt_u(uint64_t seed, uint64_t i)
{
    uint32_t k = (uint32_t)(s_splitmix_mix(s_splitmix_mix(seed) + 0x9e3779b97f4a7c15ull) >> 32);
    uint32_t h = (uint32_t)i ^ k;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return (double)(h >> 9) * 0x1p-23;
}

/* Check a fixpt frame against a double model.
 *   d:    the smallest fp16 with qmax*d >= fl(c * max|g|) (the float product
 *         the codec sees; fl is monotonic so max|fl(c g)| = fl(c max|g|)):
 *         asserted exactly.
 *   code: nearest: the double RNE of t = y/d, unless t is within
 *         win = 4*2^-24 |t| + 2^-20 of a tie (the codec's y = fl(c g) and
 *         fl(1/d) move t by <= 3*2^-24 |t|); stochastic: floor(t) + (u <
 *         frac(t)) with the documented u, unless u is within win of frac(t)
 *         or t within win of an integer.
 *   error: nearest |g - g^| <= d/(2c) + 2^-21 (|g| + d/c), stochastic
 *         |g - g^| <= d/c + 2^-21 (|g| + d/c): half (one) step, plus the
 *         float rounding of y, t and of the decoder's (code-qmax) * fl(d/c).
 * Returns the frame (caller frees) for further checks. */
static uint8_t *s_check_fixpt(const char *spec_str, codec_shape_t shape, const float *x, float *out)
{
    codec_spec_t spec;
    assert_int_equal(codec_spec_parse(spec_str, &spec, NULL, 0), 0);
    const codec_fixpt_params_t *p = &spec.p.fixpt;
    const uint64_t N = codec_shape_elems(shape), G = p->group, ng = (N + G - 1) / G;
    const int32_t qmax = (1 << (p->bits - 1)) - 1;
    const double c = p->scale;
    size_t len = 0;
    uint8_t *frame = s_roundtrip(spec_str, shape, x, out, &len);
    const uint8_t *pay = frame + CODEC_HEADER_SIZE;
    uint64_t code_off = 2 * ng;
    for (uint64_t g = 0; g < ng; g++) {
        const uint64_t off = g * G;
        const uint32_t m = (uint32_t)(N - off < G ? N - off : G);
        float gmax = 0;
        for (uint32_t j = 0; j < m; j++)
            gmax = fmaxf(gmax, fabsf(x[off + j]));
        const double ymax = (double)(float)(p->scale * gmax);
        const double d_ref = s_h16_up(ymax / qmax);
        const double d = s_h16_decode(codec_get_u16(pay + 2 * g));
        if (d != d_ref) {
            print_error("%s group %llu: step %.9g, reference %.9g\n", spec_str, (unsigned long long)g, d, d_ref);
            fail();
        }
        for (uint32_t j = 0; j < m; j++) {
            /* the code, read back from the packed stream (LSB first) */
            uint64_t bit = (uint64_t)j * p->bits;
            uint32_t code = 0;
            for (uint32_t k = 0; k < p->bits; k++, bit++)
                code |= (uint32_t)((pay[code_off + bit / 8] >> (bit % 8)) & 1u) << k;
            assert_true(code <= 2u * (uint32_t)qmax);
            const int32_t q = (int32_t)code - qmax;
            const double gv = x[off + j];
            if (d > 0) {
                double t = fmin(fmax(c * gv / d, -qmax), qmax);
                double fl = floor(t), frac = t - fl;
                double win = 4 * 0x1p-24 * fabs(t) + 0x1p-20;
                if (p->stochastic) {
                    double u = s_fixpt_u(p->seed, off + j);
                    if (fabs(u - frac) > win && frac > win && frac < 1 - win)
                        assert_int_equal(q, (int32_t)fl + (u < frac));
                } else if (fabs(frac - 0.5) > win) {
                    assert_int_equal(q, (int32_t)(frac < 0.5 ? fl : fl + 1));
                }
            } else {
                assert_int_equal(q, 0);
            }
            double tol = (p->stochastic ? d / c : d / (2 * c)) + 0x1p-21 * (fabs(gv) + d / c);
            double err = fabs((double)out[off + j] - gv);
            if (!(err <= tol)) {
                print_error("%s elem %llu: g %.9g decoded %.9g, |err| %.3g > %.3g (d=%g)\n", spec_str,
                            (unsigned long long)(off + j), gv, (double)out[off + j], err, tol, d);
                fail();
            }
        }
        code_off += (uint64_t)(m * p->bits + 7) / 8;
    }
    assert_int_equal(CODEC_HEADER_SIZE + code_off, len);
    return frame;
}

static void test_fixpt_nearest(void **state)
{
    (void)state;
    s_rng_state = 31;
    enum { N = 5000 };
    float *x = s_alloc_f(N), *out = s_alloc_f(N);
    s_fill_normal(x, N, 1e-3); /* activation-gradient-like magnitudes */
    const char *specs[] = { "fixpt", "fixpt:bits=2", "fixpt:bits=3,group=7", "fixpt:bits=4,group=100",
                            "fixpt:bits=12,group=1000", "fixpt:bits=16,scale=1", "fixpt:group=1",
                            "fixpt:bits=5,group=65536,scale=3.5" };
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        free(s_check_fixpt(specs[k], s_shape(1, 1, N), x, out));
        free(s_check_fixpt(specs[k], s_shape(3, 7, 11), x, out)); /* 231: groups do not divide */
    }
    free(x);
    free(out);
}

/* exact ties with c = 1 and max 127: d = 1, codes are round-half-even */
static void test_fixpt_ties_even(void **state)
{
    (void)state;
    const float x[8] = { 127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -2.5f, -3.5f, 126.5f };
    const int32_t want[8] = { 127, 0, 2, 2, 0, -2, -4, 126 };
    float out[8];
    size_t len;
    uint8_t *frame = s_roundtrip("fixpt:scale=1,group=8", s_shape(1, 1, 8), x, out, &len);
    assert_int_equal(codec_get_u16(frame + CODEC_HEADER_SIZE), 0x3c00); /* d = 1.0 */
    for (int i = 0; i < 8; i++)
        assert_true(out[i] == (float)want[i]);
    free(frame);
}

static void test_fixpt_stochastic(void **state)
{
    (void)state;
    s_rng_state = 32;
    enum { N = 300, TRIALS = 2000 };
    float *x = s_alloc_f(N), *out = s_alloc_f(N);
    double *sum = calloc(N, sizeof *sum);
    assert_non_null(sum);
    s_fill_normal(x, N, 2e-3);
    x[7] = 0.0f;
    /* per-element checks on a few seeds (documented hash, bounds) */
    const char *checked[] = { "fixpt:stochastic=1", "fixpt:stochastic=1,seed=77,bits=4,group=33",
                              "fixpt:stochastic=1,seed=18446744073709551615,bits=16,group=1" };
    for (size_t k = 0; k < sizeof checked / sizeof checked[0]; k++)
        free(s_check_fixpt(checked[k], s_shape(1, 1, N), x, out));

    /* unbiased: over TRIALS seeds, each element's mean decoded value is
     * within 5 standard errors of g. One trial decodes to floor or ceil of
     * t (a step d/c apart), so its variance is <= (d/c)^2/4 and the mean's
     * standard error <= (d/c) / (2 sqrt(TRIALS)); the u grid (2^-23) and
     * float rounding add a bias below 2^-20 d/c. Bits = 4 so steps are
     * coarse and a biased rounding would show. */
    double dmax = 0;
    char spec[128];
    for (int t = 0; t < TRIALS; t++) {
        snprintf(spec, sizeof spec, "fixpt:stochastic=1,bits=4,group=100,scale=1024,seed=%d", t * 7919 + 1);
        size_t len;
        uint8_t *frame = s_roundtrip(spec, s_shape(1, 1, N), x, out, &len);
        for (int g = 0; g < 3; g++)
            dmax = fmax(dmax, s_h16_decode(codec_get_u16(frame + CODEC_HEADER_SIZE + 2 * g)));
        free(frame);
        for (int i = 0; i < N; i++)
            sum[i] += out[i];
    }
    const double step = dmax / 1024.0;
    const double se = step / (2 * sqrt((double)TRIALS));
    double total_bias = 0;
    for (int i = 0; i < N; i++) {
        double mean = sum[i] / TRIALS;
        if (!(fabs(mean - x[i]) <= 5 * se + 0x1p-20 * step)) {
            print_error("elem %d: g %.9g mean of %d stochastic decodes %.9g (5 se = %.3g)\n", i, (double)x[i],
                        TRIALS, mean, 5 * se);
            fail();
        }
        total_bias += mean - x[i];
    }
    /* the average bias over all N elements: standard error se / sqrt(N) */
    assert_true(fabs(total_bias / N) <= 5 * se / sqrt((double)N));
    free(sum);
    free(x);
    free(out);
}

static void test_fixpt_reproducible(void **state)
{
    (void)state;
    s_rng_state = 33;
    enum { N = 4096 };
    float *x = s_alloc_f(N);
    s_fill_normal(x, N, 1e-3);
    size_t l1, l2, l3;
    int rc;
    uint8_t *a = s_encode("fixpt:stochastic=1,seed=5", s_shape(1, 1, N), x, &l1, &rc);
    uint8_t *b = s_encode("fixpt:stochastic=1,seed=5", s_shape(1, 1, N), x, &l2, &rc);
    uint8_t *c = s_encode("fixpt:stochastic=1,seed=6", s_shape(1, 1, N), x, &l3, &rc);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal(l1, l2);
    assert_memory_equal(a, b, l1);
    assert_memory_not_equal(a + CODEC_HEADER_SIZE, c + CODEC_HEADER_SIZE, l1 - CODEC_HEADER_SIZE);
    /* that the codes follow the documented counter hash of (seed, element
     * index) is checked element by element in s_check_fixpt */
    free(a);
    free(b);
    free(c);
    free(x);
}

/* Stochastic rounding draws independent uniforms: for neighbouring elements of
 * one frame and for one element under two seeds (the runtime gives every step
 * and micro-batch its own seed). Groups of 128 whose first element is 127
 * (scale 1: step d = 1) and whose others are 10.3f (t = 10.3f, frac p ~ 0.3):
 * each code rounds up with probability p, and a pair of roundings both up
 * with p^2 when the pair is independent. N elements: standard errors
 * sqrt(p (1 - p) / N) and sqrt(p^2 (1 - p^2) / N); asserted within 6 of them. */
static void test_fixpt_stochastic_independent(void **state)
{
    (void)state;
    enum { G = 128, NG = 8192, N = G * NG };
    float *x = s_alloc_f(N), *out = s_alloc_f(N), *out2 = s_alloc_f(N);
    for (uint32_t i = 0; i < N; i++)
        x[i] = i % G == 0 ? 127.0f : 10.3f;
    const double p = (double)(10.3f - 10.0f);
    size_t len;
    free(s_roundtrip("fixpt:scale=1,stochastic=1,seed=11", s_shape(1, 1, N), x, out, &len));
    free(s_roundtrip("fixpt:scale=1,stochastic=1,seed=12", s_shape(1, 1, N), x, out2, &len));
    uint64_t n = 0, up = 0, up_next = 0, pairs = 0, up_both = 0;
    for (uint32_t i = 0; i < N; i++) {
        if (i % G == 0)
            continue;
        assert_true(out[i] == 10.0f || out[i] == 11.0f);
        const int a = out[i] == 11.0f, b = out2[i] == 11.0f;
        n++;
        up += (uint64_t)a;
        up_both += (uint64_t)(a && b);
        if ((i + 1) % G != 0) {
            pairs++;
            up_next += (uint64_t)(a && out[i + 1] == 11.0f);
        }
    }
    const double f = (double)up / n, fn = (double)up_next / pairs, fb = (double)up_both / n;
    const double se1 = sqrt(p * (1 - p) / n), se2 = sqrt(p * p * (1 - p * p) / pairs);
    if (!(fabs(f - p) <= 6 * se1 && fabs(fn - p * p) <= 6 * se2 && fabs(fb - p * p) <= 6 * se2)) {
        print_error("rounded up %.5f (p %.5f), neighbours both up %.5f, both seeds up %.5f (p^2 %.5f)\n", f, p, fn,
                    fb, p * p);
        fail();
    }
    free(x);
    free(out);
    free(out2);
}

static void test_fixpt_edges(void **state)
{
    (void)state;
    s_rng_state = 34;
    enum { N = 777 };
    float *x = s_alloc_f(N), *out = s_alloc_f(N);
    /* zeros: d = 0, all codes qmax, decodes to exact zeros */
    uint8_t *f = s_check_fixpt("fixpt", s_shape(1, 1, N), x, out);
    for (int i = 0; i < N; i++)
        assert_true(out[i] == 0.0f);
    free(f);
    /* one spike: only its group gets a large step */
    x[300] = 0.05f;
    f = s_check_fixpt("fixpt", s_shape(1, 1, N), x, out);
    assert_int_equal(codec_get_u16(f + CODEC_HEADER_SIZE + 2 * 0), 0);
    assert_true(codec_get_u16(f + CODEC_HEADER_SIZE + 2 * 2) != 0);
    free(f);
    /* very small gradients: the scale lifts them into fp16's range */
    s_fill_normal(x, N, 1e-9);
    free(s_check_fixpt("fixpt:scale=65536", s_shape(1, 1, N), x, out));
    free(s_check_fixpt("fixpt", s_shape(1, 1, N), x, out)); /* fp16 subnormal steps: still within d/2c */
    s_fill_normal(x, N, 1e-30);
    free(s_check_fixpt("fixpt", s_shape(1, 1, N), x, out)); /* d = 2^-24, values flush to 0 within bound */
    /* large: fits at the edge of fp16 (d <= 65504), else TAH_ERANGE */
    s_fill_normal(x, N, 1.0);
    x[5] = 65504.0f * 127 / 1024.0f; /* d exactly 65504 */
    free(s_check_fixpt("fixpt", s_shape(1, 1, N), x, out));
    x[5] = 65520.0f * 127 / 1024.0f;
    size_t len;
    int rc = 0;
    uint8_t *none = s_encode("fixpt", s_shape(1, 1, N), x, &len, &rc);
    assert_null(none);
    assert_int_equal(rc, TAH_ERANGE);
    x[5] = 3e38f; /* c*g overflows float */
    none = s_encode("fixpt:scale=4", s_shape(1, 1, N), x, &len, &rc);
    assert_null(none);
    assert_int_equal(rc, TAH_ERANGE);
    free(x);
    free(out);
}

static void test_fixpt_rejects_corrupt(void **state)
{
    (void)state;
    s_rng_state = 35;
    codec_spec_t spec;
    assert_int_equal(codec_spec_parse("fixpt:bits=3,group=5", &spec, NULL, 0), 0);
    codec_shape_t sh = s_shape(1, 1, 13); /* groups 5,5,3: 15,15,9 bits -> 2,2,2 bytes */
    float x[13], out[13];
    s_fill_normal(x, 13, 1e-3);
    uint64_t ps = codec_fixpt_ops.payload_size(&spec, sh);
    assert_int_equal(ps, 3 * 2 + 2 + 2 + 2);
    uint8_t good[12], bad[12];
    assert_int_equal(codec_fixpt_ops.encode(&spec, sh, x, good), 0);
    assert_int_equal(codec_fixpt_ops.decode(&spec, sh, good, out), 0);
    const uint16_t steps[] = { 0x7c00, 0xfc00, 0x7e00, 0x8001, 0xbc00 }; /* Inf, -Inf, NaN, -tiny, -1 */
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        memcpy(bad, good, ps);
        codec_put_u16(bad + 2, steps[k]);
        assert_int_equal(codec_fixpt_ops.decode(&spec, sh, bad, out), TAH_ECORRUPT);
    }
    /* code 7 (= 2^3 - 1 > 2*qmax = 6) in each position of group 1 */
    for (int j = 0; j < 5; j++) {
        memcpy(bad, good, ps);
        uint16_t v = (uint16_t)(bad[8] | bad[9] << 8);
        v = (uint16_t)(v | (7u << (3 * j)));
        bad[8] = (uint8_t)v;
        bad[9] = (uint8_t)(v >> 8);
        assert_int_equal(codec_fixpt_ops.decode(&spec, sh, bad, out), TAH_ECORRUPT);
    }
    /* padding bit of group 0 (bit 15) */
    memcpy(bad, good, ps);
    bad[7] |= 0x80;
    assert_int_equal(codec_fixpt_ops.decode(&spec, sh, bad, out), TAH_ECORRUPT);
    /* frame API, re-sealed */
    size_t len = 0;
    int rc = 0;
    uint8_t *frame = s_encode("fixpt:bits=3,group=5", sh, x, &len, &rc);
    assert_non_null(frame);
    codec_put_u16(frame + CODEC_HEADER_SIZE, 0x7c00);
    s_reseal(frame, len);
    char err[CODEC_ERRLEN];
    assert_int_equal(codec_decode(frame, len, out, 13, NULL, err, sizeof err), TAH_ECORRUPT);
    free(frame);
}

/* ------------------------------------------------------------------ */
/* grouped INT                                                        */
/* ------------------------------------------------------------------ */

/* e = smallest exponent with absmax * 2^-e <= 2^14, clamped to [-126, 114] */
static int32_t s_int_exp_ref(const float *x, uint64_t n)
{
    double amax = 0;
    for (uint64_t i = 0; i < n; i++)
        amax = fmax(amax, fabs((double)x[i]));
    if (amax == 0)
        return 0;
    int32_t e = -200;
    while (ldexp(amax, -e) > 16384.0)
        e++;
    return e < -126 ? -126 : (e > 114 ? 114 : e);
}

/* Check an int frame against a double model.
 *   e, mn, step: asserted exactly: mn = largest fp16 <= min * 2^-e,
 *     step = smallest fp16 >= (max*2^-e - mn) / L (asymmetric), or
 *     >= max|x| 2^-e / qmax (symmetric).
 *   code: the double RNE of t = (xs - mn)/step unless t is within
 *     win = 4*2^-24 (|xs| + |mn|)/step + 2^-20 of a tie (the codec's float
 *     xs - mn and fl(1/step) move t by <= 3*2^-24 (|xs| + |mn|)/step).
 *   error: |x - x^| <= step 2^e / 2 + 2^-21 (|x| + |mn| 2^e) + 2^-149:
 *     half a step, plus the float rounding of xs - mn, of the reciprocal,
 *     and of the decoder's mn + q*step (each <= 2^-24 of those magnitudes),
 *     plus one float subnormal for frames down there. */
static void s_check_int(const char *spec_str, codec_shape_t shape, const float *x)
{
    codec_spec_t spec;
    assert_int_equal(codec_spec_parse(spec_str, &spec, NULL, 0), 0);
    const codec_int_params_t *p = &spec.p.intq;
    const uint64_t N = codec_shape_elems(shape), G = p->group, ng = (N + G - 1) / G;
    const uint32_t L = (1u << p->bits) - 1u, mb = p->symmetric ? 2 : 4;
    const int32_t qmax = (1 << (p->bits - 1)) - 1;
    float *out = s_alloc_f(N);
    size_t len = 0;
    uint8_t *frame = s_roundtrip(spec_str, shape, x, out, &len);
    const uint8_t *pay = frame + CODEC_HEADER_SIZE;
    const uint64_t nblk = (ng + 63) / 64, eb = (nblk + 3) / 4 * 4;
    for (uint64_t k = nblk; k < eb; k++)
        assert_int_equal(pay[k], 0);
    uint64_t code_off = eb + mb * ng;
    for (uint64_t g = 0; g < ng; g++) {
        const uint64_t off = g * G;
        const uint32_t m = (uint32_t)(N - off < G ? N - off : G);
        const int32_t e = (int8_t)pay[g / 64];
        if (g % 64 == 0) {
            const uint64_t b0 = g * G, b1 = (g + 64) * G < N ? (g + 64) * G : N;
            assert_int_equal(e, s_int_exp_ref(x + b0, b1 - b0));
        }
        double lo = INFINITY, hi = -INFINITY;
        for (uint32_t j = 0; j < m; j++) {
            lo = fmin(lo, ldexp(x[off + j], -e));
            hi = fmax(hi, ldexp(x[off + j], -e));
        }
        double mn = 0, step;
        if (p->symmetric) {
            step = s_h16_decode(codec_get_u16(pay + eb + 2 * g));
            assert_true(step == s_h16_up(fmax(fabs(lo), fabs(hi)) / qmax));
        } else {
            mn = s_h16_decode(codec_get_u16(pay + eb + 4 * g));
            step = s_h16_decode(codec_get_u16(pay + eb + 4 * g + 2));
            assert_true(mn == s_h16_down(lo));
            assert_true(step == s_h16_up((hi - mn) / L));
            assert_true(mn <= lo && mn + L * step >= hi); /* covers the group */
        }
        for (uint32_t j = 0; j < m; j++) {
            uint64_t bit = (uint64_t)j * p->bits;
            uint32_t code = 0;
            for (uint32_t k = 0; k < p->bits; k++, bit++)
                code |= (uint32_t)((pay[code_off + bit / 8] >> (bit % 8)) & 1u) << k;
            const double xs = ldexp(x[off + j], -e);
            if (step > 0) {
                double t = p->symmetric ? fmin(fmax(xs / step, -qmax), qmax) : fmin(fmax((xs - mn) / step, 0), L);
                double fl = floor(t), frac = t - fl;
                int32_t want = (int32_t)(frac < 0.5 ? fl : fl + 1);
                double win = 4 * 0x1p-24 * (fabs(xs) + fabs(mn)) / step + 0x1p-20;
                if (fabs(frac - 0.5) > win)
                    assert_int_equal((int32_t)code - (p->symmetric ? qmax : 0), want);
            }
            double tol = ldexp(step, e) / 2 + 0x1p-21 * (fabs(x[off + j]) + ldexp(fabs(mn), e)) + 0x1p-149;
            double err = fabs((double)out[off + j] - x[off + j]);
            if (!(err <= tol)) {
                print_error("%s elem %llu: x %.9g decoded %.9g |err| %.3g > %.3g (e=%d mn=%g step=%g)\n", spec_str,
                            (unsigned long long)(off + j), (double)x[off + j], (double)out[off + j], err, tol, e, mn,
                            step);
                fail();
            }
        }
        code_off += (uint64_t)(m * p->bits + 7) / 8;
    }
    assert_int_equal(CODEC_HEADER_SIZE + code_off, len);
    free(frame);
    free(out);
}

static void test_int_random(void **state)
{
    (void)state;
    s_rng_state = 41;
    enum { N = 5000 };
    float *x = s_alloc_f(N);
    s_fill_normal(x, N, 0.3);
    for (int i = 0; i < N; i += 3)
        x[i] += 0.5f; /* asymmetric groups */
    const uint32_t bits[] = { 2, 3, 4, 5, 6, 8 };
    char spec[96];
    for (size_t k = 0; k < 6; k++)
        for (int sym = 0; sym < 2; sym++) {
            snprintf(spec, sizeof spec, "int:bits=%u,symmetric=%d", bits[k], sym);
            s_check_int(spec, s_shape(1, 1, N), x);
            snprintf(spec, sizeof spec, "int:bits=%u,symmetric=%d,group=37", bits[k], sym);
            s_check_int(spec, s_shape(5, 1, 999), x);
        }
    s_check_int("int:group=1", s_shape(1, 1, 100), x);
    s_check_int("int:group=1,symmetric=1,bits=8", s_shape(1, 1, 100), x);
    s_check_int("int:group=65536,bits=3", s_shape(1, 1, N), x);
    free(x);
}

static void test_int_edges(void **state)
{
    (void)state;
    s_rng_state = 42;
    enum { N = 1000 };
    float *x = s_alloc_f(N);
    s_check_int("int", s_shape(1, 1, N), x); /* zeros: e = 0, step 0 */
    s_check_int("int:symmetric=1", s_shape(1, 1, N), x);
    for (int i = 0; i < N; i++)
        x[i] = 0.25f; /* constant group: step 0, exact */
    s_check_int("int", s_shape(1, 1, N), x);
    x[123] = -40.0f; /* one spike */
    s_check_int("int", s_shape(1, 1, N), x);
    s_check_int("int:symmetric=1,bits=8", s_shape(1, 1, N), x);
    /* magnitudes fp16 metadata alone could not carry */
    const double scales[] = { 1e-42, 1e-38, 1e-30, 1e-8, 1e5, 1e12, 1e30, 1e37 };
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        s_fill_normal(x, N, scales[k]);
        s_check_int("int", s_shape(1, 1, N), x);
        s_check_int("int:bits=8,symmetric=1,group=64", s_shape(1, 1, N), x);
    }
    /* blocks of 64 groups far apart in magnitude: each keeps its own exponent, so the small
       block's error is relative to its own values (one exponent for the frame would flush it) */
    for (int i = 0; i < N; i++)
        x[i] = (float)s_rng_normal() * (i < 512 ? 1e-30f : 1e30f);
    s_check_int("int:group=8", s_shape(1, 1, N), x);           /* 125 groups: blocks of 512 and 488 */
    s_check_int("int:group=8,symmetric=1", s_shape(1, 1, N), x);
    for (int i = 0; i < N; i++)
        x[i] = (float)s_rng_normal() * (i >= 512 ? 1e-30f : 1e30f);
    s_check_int("int:group=8", s_shape(1, 1, N), x);
    /* the extremes of float32 */
    for (int i = 0; i < N; i++) /* normals clamped to +-3: 3e38 < FLT_MAX */
        x[i] = (i % 4 == 0) ? FLT_MAX
                            : (i % 4 == 1 ? -FLT_MAX : fmaxf(-3.0f, fminf(3.0f, (float)s_rng_normal())) * 1e38f);
    x[N - 1] = FLT_TRUE_MIN;
    s_check_int("int", s_shape(1, 1, N), x);
    s_check_int("int:bits=2,symmetric=1", s_shape(1, 1, N), x);
    free(x);
}

static void test_int_rejects_corrupt(void **state)
{
    (void)state;
    s_rng_state = 43;
    codec_spec_t spec;
    assert_int_equal(codec_spec_parse("int:bits=3,group=5", &spec, NULL, 0), 0);
    codec_shape_t sh = s_shape(1, 1, 13);
    float x[13], out[13];
    s_fill_normal(x, 13, 1.0);
    uint64_t ps = codec_int_ops.payload_size(&spec, sh);
    assert_int_equal(ps, 4 + 3 * 4 + 2 + 2 + 2);
    uint8_t good[32], bad[32];
    assert_int_equal(codec_int_ops.encode(&spec, sh, x, good), 0);
    assert_int_equal(codec_int_ops.decode(&spec, sh, good, out), 0);
    const int8_t exps[] = { -127, -128, 115, 127 }; /* the block exponent, i8 at byte 0 */
    for (size_t k = 0; k < 4; k++) {
        memcpy(bad, good, ps);
        bad[0] = (uint8_t)exps[k];
        assert_int_equal(codec_int_ops.decode(&spec, sh, bad, out), TAH_ECORRUPT);
    }
    for (size_t k = 1; k < 4; k++) { /* the zero bytes after the exponents */
        memcpy(bad, good, ps);
        bad[k] = 1;
        assert_int_equal(codec_int_ops.decode(&spec, sh, bad, out), TAH_ECORRUPT);
    }
    memcpy(bad, good, ps); /* any exponent in range decodes */
    bad[0] = (uint8_t)(int8_t)-126;
    assert_int_equal(codec_int_ops.decode(&spec, sh, bad, out), 0);
    const struct { size_t off; uint16_t v; } metas[] = {
        { 4, 0x7c00 }, { 4, 0xfe00 }, /* min Inf / NaN */
        { 10, 0x7c00 }, { 10, 0x8001 }, { 10, 0xbc00 }, /* step Inf / negative */
    };
    for (size_t k = 0; k < sizeof metas / sizeof metas[0]; k++) {
        memcpy(bad, good, ps);
        codec_put_u16(bad + metas[k].off, metas[k].v);
        assert_int_equal(codec_int_ops.decode(&spec, sh, bad, out), TAH_ECORRUPT);
    }
    memcpy(bad, good, ps); /* a negative minimum is fine */
    codec_put_u16(bad + 4, 0xbc00);
    assert_int_equal(codec_int_ops.decode(&spec, sh, bad, out), 0);
    memcpy(bad, good, ps); /* padding bit of group 0 */
    bad[16 + 1] |= 0x80;
    assert_int_equal(codec_int_ops.decode(&spec, sh, bad, out), TAH_ECORRUPT);
    /* symmetric: code 2^b - 1 is invalid */
    assert_int_equal(codec_spec_parse("int:bits=3,group=5,symmetric=1", &spec, NULL, 0), 0);
    ps = codec_int_ops.payload_size(&spec, sh);
    assert_int_equal(ps, 4 + 3 * 2 + 2 + 2 + 2);
    assert_int_equal(codec_int_ops.encode(&spec, sh, x, good), 0);
    memcpy(bad, good, ps);
    bad[10] |= 0x07; /* first code of group 0 -> 7 */
    assert_int_equal(codec_int_ops.decode(&spec, sh, bad, out), TAH_ECORRUPT);
    /* frame API, re-sealed */
    size_t len = 0;
    int rc = 0;
    uint8_t *frame = s_encode("int:bits=3,group=5", sh, x, &len, &rc);
    assert_non_null(frame);
    frame[CODEC_HEADER_SIZE] = 120; /* exponent out of range */
    s_reseal(frame, len);
    char err[CODEC_ERRLEN];
    assert_int_equal(codec_decode(frame, len, out, 13, NULL, err, sizeof err), TAH_ECORRUPT);
    free(frame);
}

/* ------------------------------------------------------------------ */
/* frame cost at the (8,256,768) boundary activation shape            */
/* ------------------------------------------------------------------ */

static void test_bits_per_element(void **state)
{
    (void)state;
    const codec_shape_t sh = s_shape(8, 256, 768);
    const double n = 8.0 * 256 * 768; /* 1572864 */
    const struct {
        const char *spec;
        double payload_bits_per_elem; /* codes + per-group/block metadata */
        uint64_t extra_bytes;         /* fixed payload bytes */
    } cases[] = {
        { "ash-fp8", 8.0 + 64.0 / 256, 0 },             /* fp32 alpha + s per 256 */
        { "ash-fp8:block=64", 8.0 + 64.0 / 64, 0 },
        { "ash-fp8:block=4096", 8.0 + 64.0 / 4096, 0 },
        { "fixpt", 8.0 + 16.0 / 128, 0 },               /* fp16 step per 128 */
        { "fixpt:bits=4,stochastic=1", 4.0 + 16.0 / 128, 0 },
        { "int", 4.0 + 32.0 / 128, 192 },               /* fp16 min + step per 128, i8 exponent per 64 groups */
        { "int:bits=4,symmetric=1", 4.0 + 16.0 / 128, 192 }, /* 12288 groups: 192 blocks */
        { "int:bits=8", 8.0 + 32.0 / 128, 192 },
        { "int:bits=3,group=64", 3.0 + 32.0 / 64, 384 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        codec_spec_t spec;
        assert_int_equal(codec_spec_parse(cases[k].spec, &spec, NULL, 0), 0);
        int64_t fs = codec_frame_size(&spec, sh);
        int64_t want = CODEC_HEADER_SIZE + (int64_t)cases[k].extra_bytes +
                       (int64_t)(cases[k].payload_bits_per_elem * n / 8);
        assert_int_equal(fs, want);
        print_message("  %-28s %8.5f bits/element (%lld bytes)\n", cases[k].spec, 8.0 * (double)fs / n,
                      (long long)fs);
    }
    /* one full-size round trip of ash-fp8 through the public API */
    float *x = s_alloc_f((size_t)n), *out = s_alloc_f((size_t)n);
    s_rng_state = 51;
    s_fill_normal(x, (size_t)n, 0.05);
    size_t len;
    uint8_t *frame = s_roundtrip("ash-fp8", sh, x, out, &len);
    codec_frame_info_t info;
    assert_int_equal(codec_frame_info(frame, len, &info, NULL, 0), 0);
    assert_true(fabs(info.bits_per_elem - (8.25 + 512.0 / n)) < 1e-9);
    free(frame);
    free(out);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3_every_code),
        cmocka_unit_test(test_e5m2_every_code),
        cmocka_unit_test(test_fp8_ties_saturation_subnormals),
        cmocka_unit_test(test_fp8_random_vs_reference),
        cmocka_unit_test(test_ash_random),
        cmocka_unit_test(test_ash_partial_blocks),
        cmocka_unit_test(test_ash_edges),
        cmocka_unit_test(test_ash_rejects_corrupt),
        cmocka_unit_test(test_fixpt_nearest),
        cmocka_unit_test(test_fixpt_ties_even),
        cmocka_unit_test(test_fixpt_stochastic),
        cmocka_unit_test(test_fixpt_reproducible),
        cmocka_unit_test(test_fixpt_stochastic_independent),
        cmocka_unit_test(test_fixpt_edges),
        cmocka_unit_test(test_fixpt_rejects_corrupt),
        cmocka_unit_test(test_int_random),
        cmocka_unit_test(test_int_edges),
        cmocka_unit_test(test_int_rejects_corrupt),
        cmocka_unit_test(test_bits_per_element),
    };
    return cmocka_run_group_tests(tests, s_setup, NULL);
}
