/* link.c — data-plane message rules and validation (see link.h). */
#include "link.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "crc32c.h" /* crc32c_update */
#include "errors.h"

int link_roles(const link_expect_t *x, int from)
{
    int r = 0;
    if (from < 0 || from >= x->S || from == x->stage)
        return 0;
    if (from == x->stage - 1)
        r |= LINK_UP;
    if (from == x->stage + 1)
        r |= LINK_DOWN;
    if (x->tied && x->S > 1 &&
        ((x->stage == 0 && from == x->S - 1) || (x->stage == x->S - 1 && from == 0)))
        r |= LINK_TIED;
    return r;
}

/* Rows of a TIED frame: R (1..Vp) either way between the first and the last
 * stage (the receiver checks R against its own tokens), else Vp. */
static uint32_t s_tied_rows(const link_expect_t *x, const Tah__DataHeader *h)
{
    if (x->S > 1 && h->t >= 1 && h->t <= (uint32_t)x->Vp)
        return h->t;
    return (uint32_t)x->Vp;
}

size_t link_payload_elems(const link_expect_t *x, const Tah__DataHeader *h)
{
    switch (h->kind) {
    case TAH__DATA_KIND__DATA_ACT:
    case TAH__DATA_KIND__DATA_GRAD:
    case TAH__DATA_KIND__DATA_EVAL:
        return (size_t)x->B * x->T * x->C;
    case TAH__DATA_KIND__DATA_TIED:
        return (size_t)s_tied_rows(x, h) * x->C;
    case TAH__DATA_KIND__DATA_NORM_PARTIAL:
        return x->nnorm;
    default:
        return 0;
    }
}

/* Which role a sender needs to send this kind. */
static int s_role_for(uint32_t kind)
{
    switch (kind) {
    case TAH__DATA_KIND__DATA_ACT:
    case TAH__DATA_KIND__DATA_EVAL:
    case TAH__DATA_KIND__DATA_NORM_PARTIAL:
        return LINK_UP;
    case TAH__DATA_KIND__DATA_GRAD:
    case TAH__DATA_KIND__DATA_NORM:
        return LINK_DOWN;
    case TAH__DATA_KIND__DATA_TIED:
        return LINK_TIED;
    default:
        return LINK_UP | LINK_DOWN | LINK_TIED; /* HELLO, PING: any neighbour */
    }
}

int link_check_hello(const link_expect_t *x, const Tah__DataHeader *h, char *err, size_t errlen)
{
    if (h->kind != TAH__DATA_KIND__DATA_HELLO) {
        snprintf(err, errlen, "expected hello, got %s", wire_data_kind_name(h->kind));
        return TAH_EINVAL;
    }
    if (h->job != x->job) {
        snprintf(err, errlen, "hello for job %llu (running %llu)", (unsigned long long)h->job,
                 (unsigned long long)x->job);
        return TAH_EINVAL;
    }
    if (h->token != x->token) {
        snprintf(err, errlen, "hello with a wrong job token from a peer claiming stage %u", h->from_stage);
        return TAH_EINVAL;
    }
    int r = link_roles(x, (int)h->from_stage);
    /* only upstream neighbours and the first stage (tied) connect to us */
    if (!(r & LINK_UP) && !((r & LINK_TIED) && h->from_stage == 0)) {
        snprintf(err, errlen, "hello from stage %u, which does not connect to stage %d", h->from_stage, x->stage);
        return TAH_EINVAL;
    }
    return 0;
}

static int s_codec_matches(const codec_spec_t *want, const codec_frame_info_t *got)
{
    char a[512], b[512];
    if (want->id != got->spec.id)
        return 0;
    if (codec_spec_format(want, a, sizeof a) != 0 || codec_spec_format(&got->spec, b, sizeof b) != 0)
        return 0;
    return !strcmp(a, b);
}

void link_spec(const codec_spec_t *base, uint32_t kind, int from, int step, int mb, codec_spec_t *out)
{
    const int stream = kind == TAH__DATA_KIND__DATA_GRAD   ? CODEC_STREAM_BWD
                       : kind == TAH__DATA_KIND__DATA_TIED ? CODEC_STREAM_TIED
                                                           : CODEC_STREAM_FWD;
    codec_spec_for_tensor(base, stream, from, step, mb, out);
}

int link_check(const link_expect_t *x, int from, int cur_step, const Tah__DataHeader *h, const uint8_t *payload,
               size_t len, void *out, size_t out_bytes, char *err, size_t errlen)
{
    const char *kn = wire_data_kind_name(h->kind);
    if (h->job != x->job) {
        snprintf(err, errlen, "%s for job %llu (running %llu)", kn, (unsigned long long)h->job,
                 (unsigned long long)x->job);
        return TAH_EINVAL;
    }
    if ((int)h->from_stage != from) {
        snprintf(err, errlen, "%s claims stage %u but the link belongs to stage %d", kn, h->from_stage, from);
        return TAH_EINVAL;
    }
    if (!(link_roles(x, from) & s_role_for(h->kind))) {
        snprintf(err, errlen, "%s from stage %d, which may not send it to stage %d", kn, from, x->stage);
        return TAH_EINVAL;
    }
    if (h->kind == TAH__DATA_KIND__DATA_HELLO || h->kind == TAH__DATA_KIND__DATA_PING) {
        if (len != 0) {
            snprintf(err, errlen, "%s with a %zu-byte payload (expected none)", kn, len);
            return TAH_ESIZE;
        }
        return 0;
    }
    if (h->step < cur_step || h->step > cur_step + 1) {
        snprintf(err, errlen, "%s for step %d while at step %d", kn, h->step, cur_step);
        return TAH_ERANGE;
    }
    int mb_max = h->kind == TAH__DATA_KIND__DATA_ACT || h->kind == TAH__DATA_KIND__DATA_GRAD ? x->M
                 : h->kind == TAH__DATA_KIND__DATA_EVAL                                        ? x->val_batches
                                                                                               : 1;
    if (h->mb < 0 || h->mb >= mb_max) {
        snprintf(err, errlen, "%s micro-batch %d outside 0..%d", kn, h->mb, mb_max - 1);
        return TAH_ERANGE;
    }
    if (h->kind == TAH__DATA_KIND__DATA_NORM) {
        if (len != 0 || !isfinite(h->value) || h->value < 0) {
            snprintf(err, errlen, "norm %g with a %zu-byte payload (expected a finite value >= 0, no payload)",
                     h->value, len);
            return TAH_ENONFINITE;
        }
        return 0;
    }
    uint32_t crc = crc32c_update(0, payload, len);
    if (crc != h->crc) {
        snprintf(err, errlen, "%s step %d mb %d: payload CRC-32C 0x%08x, header says 0x%08x", kn, h->step, h->mb,
                 crc, h->crc);
        return TAH_ECHECKSUM;
    }
    size_t n = link_payload_elems(x, h);
    if (h->kind == TAH__DATA_KIND__DATA_NORM_PARTIAL) {
        if (len != n * sizeof(double) || out_bytes < len) {
            snprintf(err, errlen, "norm partials of %zu bytes (expected %zu)", len, n * sizeof(double));
            return TAH_ESIZE;
        }
        for (size_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, payload + i * sizeof v, sizeof v);
            if (!isfinite(v) || v < 0) {
                snprintf(err, errlen, "norm partial %zu is %g (expected finite >= 0)", i, v);
                return TAH_ENONFINITE;
            }
        }
        memcpy(out, payload, len);
        return 0;
    }
    /* tensor kinds: codec frame. TIED: the first stage's gradient rows through
     * the tied codec, the last stage's weight rows in fp32 (docs/runtime.md) */
    codec_spec_t fp32;
    codec_spec_default(CODEC_FP32, &fp32);
    const codec_spec_t *base = h->kind == TAH__DATA_KIND__DATA_GRAD   ? &x->bwd
                               : h->kind == TAH__DATA_KIND__DATA_TIED ? (h->from_stage == 0 ? &x->tied_spec : &fp32)
                                                                      : &x->fwd;
    codec_spec_t wspec; /* this message's (link_spec) */
    link_spec(base, h->kind, (int)h->from_stage, h->step, h->mb, &wspec);
    const codec_spec_t *want = &wspec;
    codec_shape_t shape = h->kind == TAH__DATA_KIND__DATA_TIED
                              ? (codec_shape_t){ 1, s_tied_rows(x, h), (uint32_t)x->C }
                              : (codec_shape_t){ (uint32_t)x->B, (uint32_t)x->T, (uint32_t)x->C };
    if (h->codec != (uint32_t)want->id || h->b != shape.b || h->t != shape.s || h->c != shape.c) {
        snprintf(err, errlen, "%s header says codec %u shape (%u,%u,%u); expected codec %d shape (%u,%u,%u)", kn,
                 h->codec, h->b, h->t, h->c, (int)want->id, shape.b, shape.s, shape.c);
        return TAH_ESHAPE;
    }
    codec_frame_info_t info;
    char cerr[CODEC_ERRLEN] = "";
    int rc = codec_frame_info(payload, len, &info, cerr, sizeof cerr);
    if (rc) {
        snprintf(err, errlen, "%s step %d mb %d: bad frame: %s (%s)", kn, h->step, h->mb, cerr, tah_strerror(rc));
        return rc;
    }
    if (info.shape.b != shape.b || info.shape.s != shape.s || info.shape.c != shape.c ||
        !s_codec_matches(want, &info)) {
        char a[256] = "", b[256] = "";
        codec_spec_format(want, a, sizeof a);
        codec_spec_format(&info.spec, b, sizeof b);
        snprintf(err, errlen, "%s frame is %s (%u,%u,%u); expected %s (%u,%u,%u)", kn, b, info.shape.b,
                 info.shape.s, info.shape.c, a, shape.b, shape.s, shape.c);
        return TAH_ESHAPE;
    }
    if (!out)
        return 0; /* the receiver decodes it (a GPU stage: stage_decode_boundary) */
    if (out_bytes < n * sizeof(float)) {
        snprintf(err, errlen, "internal: output buffer too small");
        return TAH_ESPACE;
    }
    rc = codec_decode(payload, len, out, n, NULL, cerr, sizeof cerr);
    if (rc) {
        snprintf(err, errlen, "%s step %d mb %d: frame rejected: %s (%s)", kn, h->step, h->mb, cerr,
                 tah_strerror(rc));
        return rc;
    }
    return 0;
}

void link_header(Tah__DataHeader *h, const link_expect_t *x, uint32_t kind, int step, int mb)
{
    tah__data_header__init(h);
    h->version = TAH_PROTO_VERSION;
    h->job = x->job;
    h->kind = kind;
    h->from_stage = (uint32_t)x->stage;
    h->step = step;
    h->mb = mb;
}
