/* tpcomm.c — two-shot compressed all-reduce and the shared-memory
 * transport (see tpcomm.h). */
#include "tpcomm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

/* ---- shared-memory transport: threads of one process ----
 *
 * Zero-copy publish, one barrier per collective: a rank publishes pointers
 * to its send buffer in slot[call & 1][rank], waits at the barrier, then
 * copies what peers published for it. Slots alternate between consecutive
 * calls; a rank rewrites a slot two calls later, after the barrier of the
 * call in between, which every peer reaches only once it has finished
 * reading. The same holds for the send buffers (hence the contract). */

typedef struct s_pub {
    const uint8_t *send;
    const size_t *slen; /* alltoall: per destination */
    size_t len;         /* allgather: one length */
    int rc;             /* agree */
} s_pub_t;

typedef struct s_shm {
    tp_transport_t base;
    pthread_barrier_t bar;
    s_pub_t slot[2][TP_MAX];
    struct {
        unsigned calls; /* this rank's collectives so far */
        char pad[60];   /* one cache line per rank */
    } rk[TP_MAX];
} s_shm_t;

/* this call's parity: the slot row to publish in and read from */
static unsigned s_parity(s_shm_t *s, int rank)
{
    return s->rk[rank].calls++ & 1u;
}

static int s_shm_alltoall(tp_transport_t *t, int rank, const uint8_t *send, const size_t *slen,
                          uint8_t *recv, size_t *rlen, size_t cap)
{
    s_shm_t *s = (s_shm_t *)t;
    unsigned k = s_parity(s, rank);
    s_pub_t *me = &s->slot[k][rank];
    me->send = send;
    me->slen = slen;
    pthread_barrier_wait(&s->bar);
    const s_pub_t *row = s->slot[k];
    int rc = 0;
    for (int j = 0; j < t->tp; j++) {
        size_t l = row[j].slen[rank];
        if (l > cap) {
            rc = TAH_ESIZE;
            l = 0;
        }
        if (l)
            memcpy(recv + (size_t)j * cap, row[j].send + (size_t)rank * cap, l);
        rlen[j] = l;
    }
    return rc;
}

static int s_shm_allgather(tp_transport_t *t, int rank, const uint8_t *send, size_t slen, uint8_t *recv,
                           size_t *rlen, size_t cap)
{
    s_shm_t *s = (s_shm_t *)t;
    unsigned k = s_parity(s, rank);
    s_pub_t *me = &s->slot[k][rank];
    me->send = send;
    me->len = slen;
    pthread_barrier_wait(&s->bar);
    const s_pub_t *row = s->slot[k];
    int rc = 0;
    for (int j = 0; j < t->tp; j++) {
        size_t l = row[j].len;
        if (l > cap) {
            rc = TAH_ESIZE;
            l = 0;
        }
        if (l)
            memcpy(recv + (size_t)j * cap, row[j].send, l);
        rlen[j] = l;
    }
    return rc;
}

static int s_shm_agree(tp_transport_t *t, int rank, int rc)
{
    s_shm_t *s = (s_shm_t *)t;
    unsigned k = s_parity(s, rank);
    s_pub_t *me = &s->slot[k][rank];
    me->rc = rc;
    pthread_barrier_wait(&s->bar);
    const s_pub_t *row = s->slot[k];
    for (int j = 0; j < t->tp; j++)
        if (row[j].rc)
            return row[j].rc;
    return 0;
}

static void s_shm_destroy(tp_transport_t *t)
{
    s_shm_t *s = (s_shm_t *)t;
    pthread_barrier_destroy(&s->bar);
    free(s);
}

static const tp_transport_ops_t s_shm_ops = {
    .alltoall = s_shm_alltoall,
    .allgather = s_shm_allgather,
    .agree = s_shm_agree,
    .destroy = s_shm_destroy,
};

tp_transport_t *tp_shm_new(int tp, char *err, size_t errlen)
{
    if (tp < 1 || tp > TP_MAX) {
        if (err)
            snprintf(err, errlen, "tensor-parallel degree %d (must be 1..%d)", tp, TP_MAX);
        return NULL;
    }
    s_shm_t *s = calloc(1, sizeof *s);
    if (!s) {
        if (err)
            snprintf(err, errlen, "out of memory creating a tensor-parallel transport");
        return NULL;
    }
    s->base.ops = &s_shm_ops;
    s->base.tp = tp;
    pthread_barrier_init(&s->bar, NULL, (unsigned)tp);
    return &s->base;
}

/* ---- codec specs ---- */

int tp_codec_parse(const char *str, codec_spec_t *spec, char *err, size_t errlen)
{
    if (!strcmp(str, "none")) {
        memset(spec, 0, sizeof *spec);
        return 0;
    }
    int rc = codec_spec_parse(str, spec, err, errlen);
    if (rc)
        return rc;
    if (spec->id == CODEC_TAH) {
        if (err)
            snprintf(err, errlen, "codec tah is for (B,T,C) stage-boundary activations, not the tensor-parallel "
                                  "all-reduce; use none, fp32, fp16, bf16, fixpt, ash-fp8 or int");
        return TAH_ECODEC;
    }
    return 0;
}

int tp_codec_format(const codec_spec_t *spec, char *buf, size_t buflen)
{
    if (spec->id == 0) {
        if (buflen < 5)
            return TAH_ESPACE;
        snprintf(buf, buflen, "none");
        return 0;
    }
    return codec_spec_format(spec, buf, buflen);
}

/* ---- the all-reduce ---- */

typedef struct s_rank {
    uint8_t *send, *recv;     /* tp * cap_rs each */
    size_t slen[TP_MAX], rlen[TP_MAX];
    uint8_t *agsend, *agrecv; /* cap_ag, tp * cap_ag */
    size_t aglen[TP_MAX];
    float *acc, *tmp;         /* chunk floats each */
} s_rank_t;

struct tp_comm {
    tp_transport_t *t;
    int tp;
    codec_spec_t rs, ag;
    size_t max_n, unit, cap_rs, cap_ag;
    s_rank_t r[TP_MAX];
};

/* chunk j of an n-float all-reduce: [*off, *off + *len) */
static void s_chunk(const tp_comm_t *c, size_t n, int j, size_t *off, size_t *len)
{
    size_t k = (n + (size_t)c->tp - 1) / (size_t)c->tp;
    k = (k + c->unit - 1) / c->unit * c->unit;
    size_t lo = (size_t)j * k < n ? (size_t)j * k : n;
    size_t hi = lo + k < n ? lo + k : n;
    *off = lo;
    *len = hi - lo;
}

static size_t s_gcd(size_t a, size_t b)
{
    while (b) {
        size_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

static int64_t s_frame_size(const codec_spec_t *spec, size_t len)
{
    if (len == 0)
        return 0;
    if (spec->id == 0)
        return (int64_t)(len * sizeof(float));
    codec_shape_t shape = { 1, 1, (uint32_t)len };
    return codec_frame_size(spec, shape);
}

static int s_encode(const codec_spec_t *spec, const float *x, size_t len, uint8_t *out, size_t cap,
                    size_t *written, char *err, size_t errlen)
{
    *written = 0;
    if (len == 0)
        return 0;
    if (spec->id == 0) {
        memcpy(out, x, len * sizeof(float));
        *written = len * sizeof(float);
        return 0;
    }
    codec_shape_t shape = { 1, 1, (uint32_t)len };
    return codec_encode(spec, shape, x, out, cap, written, err, errlen);
}

static int s_decode(const codec_spec_t *spec, const uint8_t *in, size_t inlen, float *out, size_t len,
                    char *err, size_t errlen)
{
    if (spec->id == 0) {
        if (inlen != len * sizeof(float)) {
            snprintf(err, errlen, "raw chunk of %zu bytes, expected %zu", inlen, len * sizeof(float));
            return TAH_ESIZE;
        }
        memcpy(out, in, inlen);
        return 0;
    }
    if (len == 0) {
        if (inlen) {
            snprintf(err, errlen, "%zu bytes for an empty chunk", inlen);
            return TAH_ESIZE;
        }
        return 0;
    }
    codec_frame_info_t info;
    int rc = codec_decode(in, inlen, out, len, &info, err, errlen);
    if (!rc && (info.nelems != len || info.spec.id != spec->id)) {
        snprintf(err, errlen, "%s frame of %llu elements, expected %s of %zu", codec_name(info.spec.id),
                 (unsigned long long)info.nelems, codec_name(spec->id), len);
        rc = TAH_ESHAPE;
    }
    return rc;
}

tp_comm_t *tp_comm_new(tp_transport_t *transport, const codec_spec_t *rs, const codec_spec_t *ag,
                       size_t max_n, char *err, size_t errlen)
{
    tp_comm_t *c = NULL;
    char cerr[CODEC_ERRLEN] = "";
    if (!transport)
        return NULL;
    const codec_spec_t *specs[2] = { rs, ag };
    for (int k = 0; k < 2; k++) {
        if (specs[k]->id == CODEC_TAH ||
            (specs[k]->id != 0 && codec_spec_validate(specs[k], cerr, sizeof cerr) != 0)) {
            if (err)
                snprintf(err, errlen, "tensor-parallel %s codec: %s", k ? "all-gather" : "reduce-scatter",
                         specs[k]->id == CODEC_TAH ? "tah is not supported" : cerr);
            goto fail;
        }
    }
    if (max_n < 1 || max_n > CODEC_MAX_ELEMS) {
        if (err)
            snprintf(err, errlen, "tensor-parallel all-reduce of %zu floats (must be 1..2^31)", max_n);
        goto fail;
    }
    c = calloc(1, sizeof *c);
    if (!c)
        goto nomem;
    c->t = transport;
    c->tp = transport->tp;
    c->rs = *rs;
    c->ag = *ag;
    c->max_n = max_n;
    size_t u1 = tp_codec_unit(rs), u2 = tp_codec_unit(ag);
    size_t l = u1 / s_gcd(u1, u2) * u2;
    c->unit = l <= ((size_t)1 << 20) ? l : (u1 > u2 ? u1 : u2);
    size_t off, k;
    s_chunk(c, max_n, 0, &off, &k);
    int64_t f1 = s_frame_size(rs, k), f2 = s_frame_size(ag, k);
    if (f1 < 0 || f2 < 0) {
        if (err)
            snprintf(err, errlen, "tensor-parallel codec cannot encode a chunk of %zu floats: %s", k,
                     tah_strerror((int)(f1 < 0 ? f1 : f2)));
        goto fail;
    }
    c->cap_rs = ((size_t)f1 + 63) / 64 * 64;
    c->cap_ag = ((size_t)f2 + 63) / 64 * 64;
    for (int r = 0; r < c->tp; r++) {
        s_rank_t *R = &c->r[r];
        R->send = malloc((size_t)c->tp * c->cap_rs);
        R->recv = malloc((size_t)c->tp * c->cap_rs);
        R->agsend = malloc(c->cap_ag);
        R->agrecv = malloc((size_t)c->tp * c->cap_ag);
        R->acc = malloc(k * sizeof(float));
        R->tmp = malloc(k * sizeof(float));
        if (!R->send || !R->recv || !R->agsend || !R->agrecv || !R->acc || !R->tmp)
            goto nomem;
    }
    return c;
nomem:
    if (err)
        snprintf(err, errlen, "out of memory for a tensor-parallel all-reduce of %zu floats (tp %d)", max_n,
                 transport->tp);
fail:
    if (c) {
        tp_comm_destroy(&c);
    } else {
        transport->ops->destroy(transport);
    }
    return NULL;
}

void tp_comm_destroy(tp_comm_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    tp_comm_t *c = *self_p;
    for (int r = 0; r < TP_MAX; r++) {
        s_rank_t *R = &c->r[r];
        free(R->send);
        free(R->recv);
        free(R->agsend);
        free(R->agrecv);
        free(R->acc);
        free(R->tmp);
    }
    if (c->t)
        c->t->ops->destroy(c->t);
    free(c);
    *self_p = NULL;
}

int tp_comm_size(const tp_comm_t *c)
{
    return c->tp;
}

size_t tp_comm_wire_bytes(const tp_comm_t *c, size_t n)
{
    size_t total = 0, off, len;
    for (int j = 1; j < c->tp; j++) {
        s_chunk(c, n, j, &off, &len);
        total += (size_t)s_frame_size(&c->rs, len);
    }
    s_chunk(c, n, 0, &off, &len);
    return total + (size_t)(c->tp - 1) * (size_t)s_frame_size(&c->ag, len);
}

/* first local failure wins the message */
static int s_fail(int rc, int new_rc, char *err, size_t errlen, const char *what, int j, const char *why)
{
    if (rc || !new_rc)
        return rc;
    if (err)
        snprintf(err, errlen, "tensor-parallel all-reduce: %s chunk %d: %s (%s)", what, j, why,
                 tah_strerror(new_rc));
    return new_rc;
}

int tp_allreduce(tp_comm_t *c, int rank, float *buf, size_t n, uint64_t id, char *err, size_t errlen)
{
    const int tp = c->tp;
    s_rank_t *R = &c->r[rank];
    char cerr[CODEC_ERRLEN] = "";
    int rc = 0, peer_failed = 0;
    size_t off, len;
    if (err && errlen)
        err[0] = 0;
    if (n > c->max_n)
        rc = s_fail(rc, TAH_EINVAL, err, errlen, "size", 0, "more floats than the group was built for");
    if (tp == 1 || rc)
        return c->t->ops->agree(c->t, rank, rc);

    /* 1. reduce-scatter: one frame per chunk, all-to-all */
    codec_spec_t spec;
    for (int j = 0; j < tp; j++) {
        s_chunk(c, n, j, &off, &len);
        tp_chunk_spec(&c->rs, id, 0, rank, j, &spec);
        int e = s_encode(&spec, buf + off, len, R->send + (size_t)j * c->cap_rs, c->cap_rs, &R->slen[j], cerr,
                         sizeof cerr);
        if (e)
            R->slen[j] = 0; /* the receiver sees the gap and waits for the agreed code */
        rc = s_fail(rc, e, err, errlen, "encoding", j, cerr);
    }
    int e = c->t->ops->alltoall(c->t, rank, R->send, R->slen, R->recv, R->rlen, c->cap_rs);
    rc = s_fail(rc, e, err, errlen, "all-to-all", rank, "transport failed");

    /* 2. sum my chunk in rank order */
    s_chunk(c, n, rank, &off, &len);
    for (int j = 0; j < tp && len; j++) {
        if (R->rlen[j] == 0) {
            peer_failed = 1;
            continue;
        }
        float *dst = j == 0 ? R->acc : R->tmp;
        e = s_decode(&c->rs, R->recv + (size_t)j * c->cap_rs, R->rlen[j], dst, len, cerr, sizeof cerr);
        rc = s_fail(rc, e, err, errlen, "decoding rank's", j, cerr);
        if (j > 0)
            for (size_t i = 0; i < len; i++)
                R->acc[i] += R->tmp[i];
    }

    /* 3. all-gather the re-compressed sum; decode every frame, mine too */
    size_t aglen = 0;
    if (!rc && !peer_failed) {
        tp_chunk_spec(&c->ag, id, 1, rank, rank, &spec);
        e = s_encode(&spec, R->acc, len, R->agsend, c->cap_ag, &aglen, cerr, sizeof cerr);
        if (e)
            aglen = 0;
        rc = s_fail(rc, e, err, errlen, "encoding the sum of", rank, cerr);
    }
    e = c->t->ops->allgather(c->t, rank, R->agsend, aglen, R->agrecv, R->aglen, c->cap_ag);
    rc = s_fail(rc, e, err, errlen, "all-gather", rank, "transport failed");
    for (int j = 0; j < tp && !rc; j++) {
        s_chunk(c, n, j, &off, &len);
        if (len && R->aglen[j] == 0) {
            peer_failed = 1;
            continue;
        }
        e = s_decode(&c->ag, R->agrecv + (size_t)j * c->cap_ag, R->aglen[j], buf + off, len, cerr, sizeof cerr);
        rc = s_fail(rc, e, err, errlen, "decoding the sum of", j, cerr);
    }
    int agreed = c->t->ops->agree(c->t, rank, rc);
    if (agreed && !rc && err && errlen)
        err[0] = 0; /* another rank failed: its err has the reason */
    return agreed;
}
