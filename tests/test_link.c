/* test_link.c — node/link.c: every rule a received data message must pass,
 * one broken property at a time, on frames built by the real encoders. A
 * valid message passes and decodes bit-exactly (fp32); each corruption is
 * rejected with its specific code. Also the
 * wire layer's unpack of garbage and of foreign versions. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "crc32c.h" /* crc32c_update */
#include "errors.h"
#include "link.h"

enum { B = 2, T = 3, C = 64, VP = 16, NSLOTS = 53 };

static link_expect_t s_expect(int stage)
{
    link_expect_t x;
    memset(&x, 0, sizeof x);
    x.job = 7;
    x.token = 0xfeedULL;
    x.stage = stage;
    x.S = 4;
    x.M = 3;
    x.val_batches = 2;
    x.B = B;
    x.T = T;
    x.C = C;
    x.Vp = VP;
    x.tied = 1;
    codec_spec_parse("fp32", &x.fwd, NULL, 0);
    codec_spec_parse("fixpt:bits=8", &x.bwd, NULL, 0);
    codec_spec_parse("fp32", &x.tied_spec, NULL, 0);
    x.nnorm = NSLOTS;
    return x;
}

typedef struct msg {
    Tah__DataHeader h;
    uint8_t *payload;
    size_t len;
} msg_t;

static void s_fill(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int32_t)(seed >> 8) - (1 << 23)) / (float)(1 << 23);
    }
}

/* A valid tensor message of `kind` from `from` at step 5. */
static msg_t s_tensor(const link_expect_t *x, uint32_t kind, int from, const char *spec_str, codec_shape_t shape,
                      const float *data)
{
    msg_t m;
    codec_spec_t spec;
    assert_int_equal(codec_spec_parse(spec_str, &spec, NULL, 0), 0);
    int64_t fs = codec_frame_size(&spec, shape);
    assert_true(fs > 0);
    m.payload = malloc((size_t)fs);
    assert_non_null(m.payload);
    assert_int_equal(codec_encode(&spec, shape, data, m.payload, (size_t)fs, &m.len, NULL, 0), 0);
    link_expect_t sender = *x;
    sender.stage = from;
    link_header(&m.h, &sender, kind, 5, 1);
    m.h.codec = (uint32_t)spec.id;
    m.h.b = shape.b;
    m.h.t = shape.s;
    m.h.c = shape.c;
    m.h.crc = crc32c_update(0, m.payload, m.len);
    return m;
}

static int s_check(const link_expect_t *x, int from, const msg_t *m, float *out, size_t n)
{
    char err[512] = "";
    int rc = link_check(x, from, 5, &m->h, m->payload, m->len, out, n * sizeof(float), err, sizeof err);
    if (rc)
        assert_true(err[0] != 0); /* every rejection says why */
    return rc;
}

static void s_recrc(msg_t *m)
{
    m->h.crc = crc32c_update(0, m->payload, m->len);
}

static void test_act_rules(void **state)
{
    (void)state;
    const link_expect_t x = s_expect(1);
    const size_t n = (size_t)B * T * C;
    float in[B * T * C], out[B * T * C], sentinel[B * T * C];
    s_fill(in, n, 1);
    codec_shape_t shape = { B, T, C };
    msg_t m = s_tensor(&x, TAH__DATA_KIND__DATA_ACT, 0, "fp32", shape, in);

    assert_int_equal(s_check(&x, 0, &m, out, n), 0);
    assert_memory_equal(out, in, sizeof in); /* fp32 round trip is exact */

    for (size_t i = 0; i < n; i++)
        sentinel[i] = out[i] = -777.0f;
    msg_t bad = m;
    bad.h.job = 8;
    assert_int_equal(s_check(&x, 0, &bad, out, n), TAH_EINVAL);
    bad = m;
    assert_int_equal(s_check(&x, 2, &bad, out, n), TAH_EINVAL); /* header says stage 0, link is stage 2's */
    bad = m;
    bad.h.from_stage = 2;
    assert_int_equal(s_check(&x, 2, &bad, out, n), TAH_EINVAL); /* ACT from downstream */
    bad = m;
    bad.h.step = 4;
    assert_int_equal(s_check(&x, 0, &bad, out, n), TAH_ERANGE); /* stale step */
    bad.h.step = 7;
    assert_int_equal(s_check(&x, 0, &bad, out, n), TAH_ERANGE); /* two steps ahead */
    bad = m;
    bad.h.mb = 3;
    assert_int_equal(s_check(&x, 0, &bad, out, n), TAH_ERANGE);
    bad.h.mb = -1;
    assert_int_equal(s_check(&x, 0, &bad, out, n), TAH_ERANGE);
    bad = m;
    bad.h.crc ^= 1;
    assert_int_equal(s_check(&x, 0, &bad, out, n), TAH_ECHECKSUM);
    bad = m;
    bad.h.c = C / 2;
    assert_int_equal(s_check(&x, 0, &bad, out, n), TAH_ESHAPE);
    bad = m;
    bad.h.codec = CODEC_FP16;
    assert_int_equal(s_check(&x, 0, &bad, out, n), TAH_ESHAPE);
    /* truncated frame, CRC of what was sent */
    bad = m;
    bad.len = m.len - 1;
    s_recrc(&bad);
    assert_true(s_check(&x, 0, &bad, out, n) < 0);
    /* nothing was written by the header-level rejections above */
    assert_memory_equal(out, sentinel, sizeof out);
    /* a NaN inside a frame whose checksums are both right */
    uint8_t *copy = malloc(m.len);
    memcpy(copy, m.payload, m.len);
    float nan = NAN;
    memcpy(copy + CODEC_HEADER_SIZE + 4 * 5, &nan, 4);
    uint32_t fcrc = crc32c_update(0, copy, 60);
    fcrc = crc32c_update(fcrc, copy + CODEC_HEADER_SIZE, m.len - CODEC_HEADER_SIZE);
    memcpy(copy + 60, &fcrc, 4);
    bad = m;
    bad.payload = copy;
    s_recrc(&bad);
    assert_int_equal(s_check(&x, 0, &bad, out, n), TAH_ENONFINITE);
    /* flipped payload bit with a matching header CRC: the frame's own CRC catches it */
    memcpy(copy, m.payload, m.len);
    copy[CODEC_HEADER_SIZE + 3] ^= 0x10;
    s_recrc(&bad);
    assert_int_equal(s_check(&x, 0, &bad, out, n), TAH_ECHECKSUM);
    /* a frame of another shape behind a header that claims the right one */
    float small[B * T * (C / 2)];
    s_fill(small, sizeof small / sizeof small[0], 3);
    msg_t other = s_tensor(&x, TAH__DATA_KIND__DATA_ACT, 0, "fp32", (codec_shape_t){ B, T, C / 2 }, small);
    other.h.c = C;
    assert_int_equal(s_check(&x, 0, &other, out, n), TAH_ESHAPE);
    /* out NULL (a receiver that decodes on its GPU): checked up to the decode */
    char err[256];
    assert_int_equal(link_check(&x, 0, 5, &m.h, m.payload, m.len, NULL, 0, err, sizeof err), 0);
    assert_int_equal(link_check(&x, 0, 5, &other.h, other.payload, other.len, NULL, 0, err, sizeof err), TAH_ESHAPE);
    bad = m;
    bad.payload = copy; /* the flipped payload bit */
    s_recrc(&bad);
    assert_int_equal(link_check(&x, 0, 5, &bad.h, bad.payload, bad.len, NULL, 0, err, sizeof err), TAH_ECHECKSUM);
    free(other.payload);
    free(copy);
    free(m.payload);
}

static void test_codec_params_must_match(void **state)
{
    (void)state;
    link_expect_t x = s_expect(1);
    codec_spec_parse("tah", &x.fwd, NULL, 0);
    const size_t n = (size_t)B * T * C;
    float in[B * T * C], out[B * T * C];
    s_fill(in, n, 5);
    codec_shape_t shape = { B, T, C };
    msg_t ok = s_tensor(&x, TAH__DATA_KIND__DATA_ACT, 0, "tah", shape, in);
    assert_int_equal(s_check(&x, 0, &ok, out, n), 0);
    msg_t other = s_tensor(&x, TAH__DATA_KIND__DATA_ACT, 0, "tah:hi_frac=0.5", shape, in);
    assert_int_equal(s_check(&x, 0, &other, out, n), TAH_ESHAPE);
    /* gradients use the backward codec */
    msg_t g = s_tensor(&x, TAH__DATA_KIND__DATA_GRAD, 2, "fixpt:bits=8", shape, in);
    assert_int_equal(s_check(&x, 2, &g, out, n), 0);
    msg_t g4 = s_tensor(&x, TAH__DATA_KIND__DATA_GRAD, 2, "fixpt:bits=4", shape, in);
    assert_int_equal(s_check(&x, 2, &g4, out, n), TAH_ESHAPE);
    msg_t gup = s_tensor(&x, TAH__DATA_KIND__DATA_GRAD, 0, "fixpt:bits=8", shape, in);
    assert_int_equal(s_check(&x, 0, &gup, out, n), TAH_EINVAL); /* gradients only come from downstream */
    free(ok.payload);
    free(other.payload);
    free(g.payload);
    free(g4.payload);
    free(gup.payload);
}

/* Stochastic fixpt: each message's frame carries link_spec's seed for its
 * (kind, stage, step, micro-batch); a frame with the job's own seed, or one
 * replayed under another micro-batch or step, is rejected. */
static void test_stochastic_seed_per_message(void **state)
{
    (void)state;
    link_expect_t x = s_expect(1);
    codec_spec_parse("fixpt:stochastic=1,seed=3", &x.bwd, NULL, 0);
    const size_t n = (size_t)B * T * C;
    float in[B * T * C], out[B * T * C];
    s_fill(in, n, 6);
    codec_shape_t shape = { B, T, C };
    codec_spec_t ms; /* the message's spec: GRAD from stage 2 at step 5, micro-batch 1 (s_tensor's) */
    link_spec(&x.bwd, TAH__DATA_KIND__DATA_GRAD, 2, 5, 1, &ms);
    assert_true(ms.p.fixpt.seed != x.bwd.p.fixpt.seed);
    char str[256];
    assert_int_equal(codec_spec_format(&ms, str, sizeof str), 0);
    msg_t g = s_tensor(&x, TAH__DATA_KIND__DATA_GRAD, 2, str, shape, in);
    assert_int_equal(s_check(&x, 2, &g, out, n), 0);
    msg_t job_seed = s_tensor(&x, TAH__DATA_KIND__DATA_GRAD, 2, "fixpt:stochastic=1,seed=3", shape, in);
    assert_int_equal(s_check(&x, 2, &job_seed, out, n), TAH_ESHAPE);
    g.h.mb = 2; /* the same frame as micro-batch 2 */
    assert_int_equal(s_check(&x, 2, &g, out, n), TAH_ESHAPE);
    g.h.mb = 1;
    g.h.step = 4;
    char err[512] = "";
    assert_int_equal(link_check(&x, 2, 4, &g.h, g.payload, g.len, out, n * sizeof(float), err, sizeof err), TAH_ESHAPE);
    /* nearest rounding and the other codecs: the job's spec itself */
    codec_spec_parse("fixpt:seed=3", &x.bwd, NULL, 0);
    link_spec(&x.bwd, TAH__DATA_KIND__DATA_GRAD, 2, 5, 1, &ms);
    assert_memory_equal(&ms, &x.bwd, sizeof ms);
    free(g.payload);
    free(job_seed.payload);
}

static void test_tied_and_norm(void **state)
{
    (void)state;
    const link_expect_t last = s_expect(3), mid = s_expect(2);
    const size_t n = (size_t)VP * C;
    float g[VP * C], out[VP * C];
    s_fill(g, n, 9);
    msg_t t = s_tensor(&last, TAH__DATA_KIND__DATA_TIED, 0, "fp32", (codec_shape_t){ 1, VP, C }, g);
    t.h.mb = 0;
    assert_int_equal(s_check(&last, 0, &t, out, n), 0);
    assert_memory_equal(out, g, sizeof g);
    assert_int_equal(s_check(&mid, 0, &t, out, n), TAH_EINVAL); /* stage 0 is not stage 2's tied partner */
    free(t.payload);

    /* rows either way, 1 <= R <= Vp: the first stage's gradient rows to the
     * last stage, the last stage's weight rows to the first */
    const link_expect_t first = s_expect(0);
    msg_t rows = s_tensor(&last, TAH__DATA_KIND__DATA_TIED, 0, "fp32", (codec_shape_t){ 1, 3, C }, g);
    rows.h.mb = 0;
    assert_int_equal(link_payload_elems(&last, &rows.h), (size_t)3 * C);
    assert_int_equal(s_check(&last, 0, &rows, out, n), 0);
    assert_memory_equal(out, g, (size_t)3 * C * sizeof(float));
    free(rows.payload);
    rows = s_tensor(&first, TAH__DATA_KIND__DATA_TIED, 3, "fp32", (codec_shape_t){ 1, 3, C }, g);
    rows.h.mb = 0;
    assert_int_equal(link_payload_elems(&first, &rows.h), (size_t)3 * C);
    assert_int_equal(s_check(&first, 3, &rows, out, n), 0);
    assert_memory_equal(out, g, (size_t)3 * C * sizeof(float));
    free(rows.payload);
    t = s_tensor(&first, TAH__DATA_KIND__DATA_TIED, 3, "fp32", (codec_shape_t){ 1, VP, C }, g);
    t.h.mb = 0;
    assert_int_equal(s_check(&first, 3, &t, out, n), 0);
    free(t.payload);
    float big[(VP + 1) * C];
    s_fill(big, (VP + 1) * (size_t)C, 4);
    rows = s_tensor(&last, TAH__DATA_KIND__DATA_TIED, 0, "fp32", (codec_shape_t){ 1, VP + 1, C }, big);
    rows.h.mb = 0;
    assert_int_equal(link_payload_elems(&last, &rows.h), n);
    assert_int_equal(s_check(&last, 0, &rows, out, n), TAH_ESHAPE); /* more rows than the vocabulary */
    free(rows.payload);
    rows = s_tensor(&first, TAH__DATA_KIND__DATA_TIED, 3, "fp32", (codec_shape_t){ 1, VP + 1, C }, big);
    rows.h.mb = 0;
    assert_int_equal(s_check(&first, 3, &rows, out, n), TAH_ESHAPE);
    free(rows.payload);
    /* the tied codec is the job's: fixpt rows pass a fixpt job, not an fp32 one */
    link_expect_t last8 = last;
    codec_spec_parse("fixpt:bits=8", &last8.tied_spec, NULL, 0);
    rows = s_tensor(&last8, TAH__DATA_KIND__DATA_TIED, 0, "fixpt:bits=8", (codec_shape_t){ 1, 5, C }, g);
    rows.h.mb = 0;
    assert_int_equal(s_check(&last8, 0, &rows, out, n), 0);
    assert_int_equal(s_check(&last, 0, &rows, out, n), TAH_ESHAPE);
    free(rows.payload);
    /* ... and only the gradient's: the weight rows are fp32 whatever the tied codec */
    link_expect_t first8 = first;
    first8.tied_spec = last8.tied_spec;
    rows = s_tensor(&first8, TAH__DATA_KIND__DATA_TIED, 3, "fixpt:bits=8", (codec_shape_t){ 1, 5, C }, g);
    rows.h.mb = 0;
    assert_int_equal(s_check(&first8, 3, &rows, out, n), TAH_ESHAPE);
    free(rows.payload);
    rows = s_tensor(&first8, TAH__DATA_KIND__DATA_TIED, 3, "fp32", (codec_shape_t){ 1, 5, C }, g);
    rows.h.mb = 0;
    assert_int_equal(s_check(&first8, 3, &rows, out, n), 0);
    free(rows.payload);

    /* norm partials: exactly nnorm finite non-negative doubles */
    double slots[NSLOTS], got[NSLOTS];
    for (int i = 0; i < NSLOTS; i++)
        slots[i] = 0.25 * i;
    Tah__DataHeader h;
    link_expect_t up = mid;
    up.stage = 1;
    link_header(&h, &up, TAH__DATA_KIND__DATA_NORM_PARTIAL, 5, 0);
    h.crc = crc32c_update(0, slots, sizeof slots);
    char err[256];
    assert_int_equal(link_check(&mid, 1, 5, &h, (const uint8_t *)slots, sizeof slots, got, sizeof got, err, sizeof err), 0);
    assert_memory_equal(got, slots, sizeof slots);
    slots[7] = -1.0;
    h.crc = crc32c_update(0, slots, sizeof slots);
    assert_int_equal(link_check(&mid, 1, 5, &h, (const uint8_t *)slots, sizeof slots, got, sizeof got, err, sizeof err),
                     TAH_ENONFINITE);
    slots[7] = INFINITY;
    h.crc = crc32c_update(0, slots, sizeof slots);
    assert_int_equal(link_check(&mid, 1, 5, &h, (const uint8_t *)slots, sizeof slots, got, sizeof got, err, sizeof err),
                     TAH_ENONFINITE);
    h.crc = crc32c_update(0, slots, sizeof slots - 8);
    assert_int_equal(link_check(&mid, 1, 5, &h, (const uint8_t *)slots, sizeof slots - 8, got, sizeof got, err,
                                sizeof err),
                     TAH_ESIZE);
    /* the norm itself comes back from downstream, finite and >= 0 */
    link_expect_t down = mid;
    down.stage = 3;
    link_header(&h, &down, TAH__DATA_KIND__DATA_NORM, 5, 0);
    h.value = 1.5;
    assert_int_equal(link_check(&mid, 3, 5, &h, NULL, 0, got, sizeof got, err, sizeof err), 0);
    h.value = NAN;
    assert_int_equal(link_check(&mid, 3, 5, &h, NULL, 0, got, sizeof got, err, sizeof err), TAH_ENONFINITE);
    /* pings carry nothing */
    link_header(&h, &down, TAH__DATA_KIND__DATA_PING, 0, 0);
    assert_int_equal(link_check(&mid, 3, 5, &h, NULL, 0, got, sizeof got, err, sizeof err), 0);
    assert_int_equal(link_check(&mid, 3, 5, &h, (const uint8_t *)"x", 1, got, sizeof got, err, sizeof err), TAH_ESIZE);
}

static void test_hello(void **state)
{
    (void)state;
    const link_expect_t x = s_expect(3); /* last stage: stage 2 and stage 0 (tied) connect */
    Tah__DataHeader h;
    char err[256];
    link_expect_t from = x;
    from.stage = 2;
    link_header(&h, &from, TAH__DATA_KIND__DATA_HELLO, 0, 0);
    h.token = x.token;
    assert_int_equal(link_check_hello(&x, &h, err, sizeof err), 0);
    h.from_stage = 0;
    assert_int_equal(link_check_hello(&x, &h, err, sizeof err), 0);
    h.from_stage = 1;
    assert_int_equal(link_check_hello(&x, &h, err, sizeof err), TAH_EINVAL);
    h.from_stage = 2;
    h.token ^= 1;
    assert_int_equal(link_check_hello(&x, &h, err, sizeof err), TAH_EINVAL);
    h.token = x.token;
    h.job = 9;
    assert_int_equal(link_check_hello(&x, &h, err, sizeof err), TAH_EINVAL);
    link_expect_t untied = x;
    untied.tied = 0;
    h.job = x.job;
    h.from_stage = 0;
    assert_int_equal(link_check_hello(&untied, &h, err, sizeof err), TAH_EINVAL);
}

static void test_wire_unpack(void **state)
{
    (void)state;
    char err[256];
    static const uint8_t junk[] = { 0xff, 0xff, 0xff, 0xff, 0x0f };
    assert_null(wire_header_unpack(junk, sizeof junk, err, sizeof err));
    assert_null(wire_envelope_unpack(junk, sizeof junk, err, sizeof err));
    Tah__DataHeader h = TAH__DATA_HEADER__INIT;
    h.version = TAH_PROTO_VERSION + 1;
    h.kind = TAH__DATA_KIND__DATA_PING;
    uint8_t buf[128];
    size_t n = tah__data_header__pack(&h, buf);
    assert_null(wire_header_unpack(buf, n, err, sizeof err));
    char want[32];
    snprintf(want, sizeof want, "version %u", TAH_PROTO_VERSION + 1);
    assert_non_null(strstr(err, want));
    h.version = TAH_PROTO_VERSION;
    h.kind = 99;
    n = tah__data_header__pack(&h, buf);
    assert_null(wire_header_unpack(buf, n, err, sizeof err));
    h.kind = TAH__DATA_KIND__DATA_PING;
    n = tah__data_header__pack(&h, buf);
    Tah__DataHeader *ok = wire_header_unpack(buf, n, err, sizeof err);
    assert_non_null(ok);
    wire_header_free(&ok);
    assert_null(ok);
    Tah__Envelope e = TAH__ENVELOPE__INIT;
    e.version = TAH_PROTO_VERSION;
    n = tah__envelope__pack(&e, buf);
    assert_null(wire_envelope_unpack(buf, n, err, sizeof err)); /* no body */
    /* field number 0 behind a non-canonical tag varint (0x82 0x00): protobuf-c
     * keeps it and re-packs it as a tag it then refuses (fuzz_wire finding) */
    static const uint8_t field0[] = { 0x08, (uint8_t)TAH_PROTO_VERSION, 0x82, 0x01, 0x00, 0x82, 0x00, 0x00 };
    assert_null(wire_envelope_unpack(field0, sizeof field0, err, sizeof err));
    assert_non_null(strstr(err, "numbered 0"));
    static const uint8_t nested0[] = { 0x08, (uint8_t)TAH_PROTO_VERSION, 0x82, 0x01, 0x02, 0x82, 0x00 }; /* inside the Abort */
    assert_null(wire_envelope_unpack(nested0, sizeof nested0, err, sizeof err));
    static const uint8_t abort_ok[] = { 0x08, (uint8_t)TAH_PROTO_VERSION, 0x82, 0x01, 0x00 };
    Tah__Envelope *ae = wire_envelope_unpack(abort_ok, sizeof abort_ok, err, sizeof err);
    assert_non_null(ae);
    wire_envelope_free(&ae);
    static const uint8_t hdr0[] = { 0x08, (uint8_t)TAH_PROTO_VERSION, 0x18, 0x08, 0x82, 0x00 }; /* ping + field 0 */
    assert_null(wire_header_unpack(hdr0, sizeof hdr0, err, sizeof err));
    static const uint8_t hdr_ok[] = { 0x08, (uint8_t)TAH_PROTO_VERSION, 0x18, 0x08 };
    ok = wire_header_unpack(hdr_ok, sizeof hdr_ok, err, sizeof err);
    assert_non_null(ok);
    wire_header_free(&ok);
    uint8_t *big = calloc(1, WIRE_MAX_CONTROL + 1);
    assert_null(wire_envelope_unpack(big, WIRE_MAX_CONTROL + 1, err, sizeof err));
    free(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_act_rules),
        cmocka_unit_test(test_codec_params_must_match),
        cmocka_unit_test(test_stochastic_seed_per_message),
        cmocka_unit_test(test_tied_and_norm),
        cmocka_unit_test(test_hello),
        cmocka_unit_test(test_wire_unpack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
