/* wire.c — versioned pack/unpack and ZeroMQ helpers (see wire.h). */
#include "wire.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "errors.h"

/* protobuf-c accepts field number 0 (invalid in protobuf) when its tag is
 * a non-canonical varint, keeps it as an unknown field and re-packs it in a
 * form it then refuses (fuzz_wire). Reject it anywhere in the message tree.
 * Unknown fields with a valid number stay allowed (fields are only ever
 * added). Depth is bounded by the schema (no recursive messages). */
static int s_field0(const ProtobufCMessage *m)
{
    if (!m)
        return 0;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return 1;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        const char *base = (const char *)m;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t k = 0; k < n; k++)
                if (s_field0(v[k]))
                    return 1;
            continue;
        }
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && *(const uint32_t *)(base + f->quantifier_offset) != f->id)
            continue;
        if (s_field0(*(ProtobufCMessage *const *)(base + f->offset)))
            return 1;
    }
    return 0;
}

Tah__Envelope *wire_envelope_unpack(const void *buf, size_t len, char *err, size_t errlen)
{
    if (len > WIRE_MAX_CONTROL) {
        snprintf(err, errlen, "control message of %zu bytes exceeds the %u-byte limit", len, WIRE_MAX_CONTROL);
        return NULL;
    }
    Tah__Envelope *e = tah__envelope__unpack(NULL, len, buf);
    if (!e) {
        snprintf(err, errlen, "undecodable control message (%zu bytes; not a tah.Envelope)", len);
        return NULL;
    }
    if (e->version != TAH_PROTO_VERSION) {
        snprintf(err, errlen, "protocol version %u (expected %u); HINT: peer runs a different tah release",
                 e->version, TAH_PROTO_VERSION);
        tah__envelope__free_unpacked(e, NULL);
        return NULL;
    }
    if (e->body_case == TAH__ENVELOPE__BODY__NOT_SET) {
        snprintf(err, errlen, "control message without a body");
        tah__envelope__free_unpacked(e, NULL);
        return NULL;
    }
    if (s_field0(&e->base)) {
        snprintf(err, errlen, "control message with a field numbered 0");
        tah__envelope__free_unpacked(e, NULL);
        return NULL;
    }
    return e;
}

void wire_envelope_free(Tah__Envelope **e)
{
    if (e && *e) {
        tah__envelope__free_unpacked(*e, NULL);
        *e = NULL;
    }
}

const char *wire_body_name(const Tah__Envelope *e)
{
    switch (e->body_case) {
    case TAH__ENVELOPE__BODY_HELLO: return "hello";
    case TAH__ENVELOPE__BODY_WELCOME: return "welcome";
    case TAH__ENVELOPE__BODY_HEARTBEAT: return "heartbeat";
    case TAH__ENVELOPE__BODY_ASSIGN: return "assign";
    case TAH__ENVELOPE__BODY_JOB_EVENT: return "job_event";
    case TAH__ENVELOPE__BODY_STEP_REPORT: return "step_report";
    case TAH__ENVELOPE__BODY_ABORT: return "abort";
    case TAH__ENVELOPE__BODY_PEER_REPORT: return "peer_report";
    case TAH__ENVELOPE__BODY_CKPT_PUT: return "ckpt_put";
    case TAH__ENVELOPE__BODY_CKPT_GET: return "ckpt_get";
    case TAH__ENVELOPE__BODY_CKPT_CHUNK: return "ckpt_chunk";
    case TAH__ENVELOPE__BODY_DRAIN: return "drain";
    case TAH__ENVELOPE__BODY_SUBMIT: return "submit";
    case TAH__ENVELOPE__BODY_SUBMIT_REP: return "submit_rep";
    case TAH__ENVELOPE__BODY_STATUS: return "status";
    case TAH__ENVELOPE__BODY_STATUS_REP: return "status_rep";
    case TAH__ENVELOPE__BODY_CANCEL: return "cancel";
    case TAH__ENVELOPE__BODY_TOKEN_REQ: return "token_req";
    case TAH__ENVELOPE__BODY_TOKEN_REP: return "token_rep";
    case TAH__ENVELOPE__BODY_ERROR: return "error";
    case TAH__ENVELOPE__BODY_OK: return "ok";
    default: return "unknown";
    }
}

Tah__DataHeader *wire_header_unpack(const void *buf, size_t len, char *err, size_t errlen)
{
    if (len > WIRE_MAX_HEADER) {
        snprintf(err, errlen, "data header of %zu bytes exceeds the %u-byte limit", len, WIRE_MAX_HEADER);
        return NULL;
    }
    Tah__DataHeader *h = tah__data_header__unpack(NULL, len, buf);
    if (!h) {
        snprintf(err, errlen, "undecodable data header (%zu bytes)", len);
        return NULL;
    }
    if (h->version != TAH_PROTO_VERSION) {
        snprintf(err, errlen, "data header version %u (expected %u)", h->version, TAH_PROTO_VERSION);
        tah__data_header__free_unpacked(h, NULL);
        return NULL;
    }
    if (s_field0(&h->base)) {
        snprintf(err, errlen, "data header with a field numbered 0");
        tah__data_header__free_unpacked(h, NULL);
        return NULL;
    }
    if (h->kind == TAH__DATA_KIND__DATA_UNKNOWN || h->kind > TAH__DATA_KIND__DATA_PING) {
        snprintf(err, errlen, "unknown data message kind %u", h->kind);
        tah__data_header__free_unpacked(h, NULL);
        return NULL;
    }
    return h;
}

void wire_header_free(Tah__DataHeader **h)
{
    if (h && *h) {
        tah__data_header__free_unpacked(*h, NULL);
        *h = NULL;
    }
}

const char *wire_data_kind_name(uint32_t kind)
{
    static const char *names[] = { "unknown", "hello", "act", "grad", "eval", "tied", "norm_partial", "norm", "ping" };
    return kind < sizeof names / sizeof names[0] ? names[kind] : "unknown";
}

int wire_send_envelope(void *sock, const void *rid, size_t rid_len, Tah__Envelope *env, int flags)
{
    env->version = TAH_PROTO_VERSION;
    size_t n = tah__envelope__get_packed_size(env);
    zmq_msg_t msg;
    if (zmq_msg_init_size(&msg, n) != 0)
        return TAH_ENOMEM;
    tah__envelope__pack(env, zmq_msg_data(&msg));
    if (rid && zmq_send(sock, rid, rid_len, ZMQ_SNDMORE | flags) < 0) {
        zmq_msg_close(&msg);
        return TAH_EIO;
    }
    if (zmq_msg_send(&msg, sock, flags) < 0) {
        zmq_msg_close(&msg);
        return TAH_EIO;
    }
    return 0;
}

int wire_send_error(void *sock, const void *rid, size_t rid_len, int code, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    Tah__Error er = TAH__ERROR__INIT;
    er.code = code;
    er.message = text;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_ERROR;
    env.error = &er;
    return wire_send_envelope(sock, rid, rid_len, &env, ZMQ_DONTWAIT);
}

Tah__Envelope *wire_recv_envelope(void *sock, int timeout_ms, int *timed_out, char *err, size_t errlen)
{
    *timed_out = 0;
    zmq_pollitem_t it = { sock, 0, ZMQ_POLLIN, 0 };
    int rc = zmq_poll(&it, 1, timeout_ms);
    if (rc <= 0) {
        *timed_out = rc == 0;
        snprintf(err, errlen, rc == 0 ? "no answer within %d ms" : "poll failed", timeout_ms);
        return NULL;
    }
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, sock, 0) < 0) {
        snprintf(err, errlen, "receive failed: %s", zmq_strerror(errno));
        zmq_msg_close(&msg);
        return NULL;
    }
    Tah__Envelope *e = wire_envelope_unpack(zmq_msg_data(&msg), zmq_msg_size(&msg), err, errlen);
    /* drain any further parts of a multipart message */
    while (zmq_msg_more(&msg)) {
        zmq_msg_close(&msg);
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, sock, 0) < 0)
            break;
    }
    zmq_msg_close(&msg);
    return e;
}

int wire_recv_parts(void *sock, zmq_msg_t *parts, int nmax, int *nparts)
{
    int n = 0, more = 1, total = 0;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        int got;
        while ((got = zmq_msg_recv(&m, sock, ZMQ_DONTWAIT)) < 0 && errno == EINTR)
            ; /* a signal: retry, or the rest of the message would be read as the next one */
        if (got < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        total++;
        if (n < nmax)
            parts[n++] = m;
        else
            zmq_msg_close(&m);
    }
    *nparts = n;
    return total;
}

int wire_endpoint(const char *hostport, char *out, size_t outlen, char *err, size_t errlen)
{
    if (!strncmp(hostport, "tcp://", 6) || !strncmp(hostport, "ipc://", 6) || !strncmp(hostport, "inproc://", 9)) {
        snprintf(out, outlen, "%s", hostport);
        return 0;
    }
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || !colon[1]) {
        snprintf(err, errlen, "'%s' is not HOST:PORT", hostport);
        return TAH_EINVAL;
    }
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535) {
        snprintf(err, errlen, "'%s': port must be 0..65535", hostport);
        return TAH_EINVAL;
    }
    int hl = (int)(colon - hostport);
    if (port == 0)
        snprintf(out, outlen, "tcp://%.*s:*", hl, hostport);
    else
        snprintf(out, outlen, "tcp://%.*s:%ld", hl, hostport, port);
    return 0;
}
