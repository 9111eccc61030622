/* fuzz_wire.c — libFuzzer target for everything a peer's bytes reach
 * before the runtime acts on them: proto/wire.c's unpack of control
 * envelopes and data headers, and node/link.c + node/guard.c's checks of a
 * data message against a job.
 *
 * Input: first byte selects the path.
 *   even  control: the rest is one Envelope frame. A message wire_envelope_unpack
 *         accepts must re-pack canonically: pack(unpack(x)) unpacks again and
 *         packs to the same bytes (no field the decoder accepted is lost or
 *         invented).
 *   odd   data: bytes 1..2 are the header length (little-endian), then the
 *         header, then the payload. A header wire_header_unpack accepts is
 *         checked by link_check_hello / link_check against a fixed 3-stage
 *         job as stage 1 (bit 1 of the first byte picks step 1 or 2), and
 *         what passes goes through guard_admit; a tensor that passes must
 *         be finite.
 * ASan/UBSan catch the rest.
 *
 * TAH_FUZZ_SEEDS=DIR: write seed inputs (one valid message of every kind)
 * into DIR and exit, instead of fuzzing. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"  /* codec_encode */
#include "crc32c.h" /* crc32c_update */
#include "guard.h"  /* guard_admit */
#include "link.h"   /* link_check, link_check_hello */
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

enum { B = 1, T = 2, C = 8, VP = 16, NNORM = 5, M = 2, NVAL = 1 };

static link_expect_t s_job(void)
{
    link_expect_t x;
    memset(&x, 0, sizeof x);
    x.job = 42;
    x.token = 0x5eedULL;
    x.stage = 1;
    x.S = 3;
    x.M = M;
    x.val_batches = NVAL;
    x.B = B;
    x.T = T;
    x.C = C;
    x.Vp = VP;
    x.tied = 1;
    codec_spec_parse("fp32", &x.fwd, NULL, 0);
    codec_spec_parse("fixpt:bits=8", &x.bwd, NULL, 0);
    codec_spec_parse("fp32", &x.tied_spec, NULL, 0);
    x.nnorm = NNORM;
    x.max_norm_ratio = 1000.0;
    x.max_bad_frames = 10;
    return x;
}

static void s_control(const uint8_t *data, size_t size)
{
    Tah__Envelope *e = wire_envelope_unpack(data, size, NULL, 0);
    if (!e)
        return;
    (void)wire_body_name(e);
    size_t n1 = tah__envelope__get_packed_size(e);
    uint8_t *p1 = malloc(n1 ? n1 : 1);
    if (!p1)
        abort();
    tah__envelope__pack(e, p1);
    Tah__Envelope *e2 = wire_envelope_unpack(p1, n1, NULL, 0);
    if (!e2 || e2->body_case != e->body_case)
        abort(); /* a message we accepted does not survive a round trip */
    size_t n2 = tah__envelope__get_packed_size(e2);
    uint8_t *p2 = malloc(n2 ? n2 : 1);
    if (!p2)
        abort();
    tah__envelope__pack(e2, p2);
    if (n1 != n2 || memcmp(p1, p2, n1) != 0)
        abort(); /* re-packing is not canonical */
    free(p1);
    free(p2);
    wire_envelope_free(&e2);
    wire_envelope_free(&e);
}

static void s_data(uint8_t sel, const uint8_t *data, size_t size)
{
    if (size < 2)
        return;
    size_t hl = (size_t)data[0] | (size_t)data[1] << 8;
    data += 2;
    size -= 2;
    if (hl > size)
        return;
    Tah__DataHeader *h = wire_header_unpack(data, hl, NULL, 0);
    if (!h)
        return;
    const uint8_t *payload = data + hl;
    size_t len = size - hl;
    link_expect_t x = s_job();
    char err[512];
    if (h->kind == TAH__DATA_KIND__DATA_HELLO) {
        (void)link_check_hello(&x, h, err, sizeof err);
        wire_header_free(&h);
        return;
    }
    static float out[VP * C > B * T * C ? VP * C : B * T * C];
    int cur = 1 + ((sel >> 1) & 1);
    int rc = link_check(&x, (int)h->from_stage, cur, h, payload, len, out, sizeof out, err, sizeof err);
    if (rc == 0 && h->kind != TAH__DATA_KIND__DATA_PING) {
        int tensor = h->kind != TAH__DATA_KIND__DATA_NORM_PARTIAL && h->kind != TAH__DATA_KIND__DATA_NORM;
        size_t n = link_payload_elems(&x, h);
        if (tensor)
            for (size_t i = 0; i < n; i++)
                if (!isfinite(out[i]))
                    abort(); /* link_check let a non-finite value through */
        guard_t *g = guard_new(x.M, x.val_batches, x.max_norm_ratio);
        if (!g)
            abort();
        if (guard_admit(g, h->kind, h->step, h->mb, tensor ? out : NULL, tensor ? n : 0, err, sizeof err) != 0)
            abort(); /* a fresh guard admits any first message that passed link_check */
        if (guard_admit(g, h->kind, h->step, h->mb, tensor ? out : NULL, tensor ? n : 0, err, sizeof err) == 0)
            abort(); /* ...and never the same one twice */
        guard_destroy(&g);
    }
    wire_header_free(&h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        s_data(data[0], data + 1, size - 1);
    else
        s_control(data + 1, size - 1);
    return 0;
}

/* ---- seeds ---- */

static void s_write(const char *dir, const char *name, const uint8_t *a, size_t na, const uint8_t *b, size_t nb)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(a, 1, na, f) != na || (nb && fwrite(b, 1, nb, f) != nb) || fclose(f) != 0) {
        fprintf(stderr, "fuzz_wire: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

static void s_seed_env(const char *dir, const char *name, Tah__Envelope *env)
{
    env->version = TAH_PROTO_VERSION;
    uint8_t buf[8192];
    buf[0] = 0;
    size_t n = tah__envelope__pack(env, buf + 1);
    s_write(dir, name, buf, n + 1, NULL, 0);
}

static void s_seed_data(const char *dir, const char *name, uint32_t kind, int from, int step, int mb,
                        const char *spec_str, codec_shape_t shape, double value)
{
    link_expect_t x = s_job();
    x.stage = from;
    Tah__DataHeader h;
    link_header(&h, &x, kind, step, mb);
    uint8_t payload[4096];
    size_t len = 0;
    if (spec_str) {
        codec_spec_t spec;
        codec_spec_parse(spec_str, &spec, NULL, 0);
        float v[VP * C];
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
            v[i] = (float)((int)(i * 37 % 17) - 8) / 8.0f;
        codec_encode(&spec, shape, v, payload, sizeof payload, &len, NULL, 0);
        h.codec = (uint32_t)spec.id;
        h.b = shape.b;
        h.t = shape.s;
        h.c = shape.c;
    } else if (kind == TAH__DATA_KIND__DATA_NORM_PARTIAL) {
        for (int i = 0; i < NNORM; i++) {
            double d = 0.5 * i;
            memcpy(payload + len, &d, sizeof d);
            len += sizeof d;
        }
    }
    if (kind == TAH__DATA_KIND__DATA_HELLO)
        h.token = x.token;
    h.value = value;
    h.crc = crc32c_update(0, payload, len);
    uint8_t buf[WIRE_MAX_HEADER + 3];
    size_t hl = tah__data_header__pack(&h, buf + 3);
    buf[0] = 1 | (uint8_t)((step == 2) << 1);
    buf[1] = (uint8_t)(hl & 0xff);
    buf[2] = (uint8_t)(hl >> 8);
    s_write(dir, name, buf, hl + 3, payload, len);
}

static void s_seeds(const char *dir)
{
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    Tah__Hello hello = TAH__HELLO__INIT;
    hello.name = "n0";
    hello.endpoint = "tcp://127.0.0.1:5555";
    hello.backend = "cpu";
    hello.threads = 4;
    hello.gflops = 12.5;
    env.body_case = TAH__ENVELOPE__BODY_HELLO;
    env.hello = &hello;
    s_seed_env(dir, "env_hello", &env);
    Tah__Assign as = TAH__ASSIGN__INIT;
    char *eps[] = { "tcp://a:1", "tcp://b:2", "tcp://c:3" }, *names[] = { "n0", "n1", "n2" };
    as.job = 3;
    as.stage = 1;
    as.stages = 3;
    as.n_endpoints = 3;
    as.endpoints = eps;
    as.n_nodes = 3;
    as.nodes = names;
    as.ini = "[job]\nbatch = 2\n";
    as.base_dir = "/tmp";
    as.token = 77;
    env.body_case = TAH__ENVELOPE__BODY_ASSIGN;
    env.assign = &as;
    s_seed_env(dir, "env_assign", &env);
    Tah__Heartbeat hb = TAH__HEARTBEAT__INIT;
    hb.state = 2;
    hb.job = 3;
    hb.step = 9;
    hb.rejected = 1;
    hb.last_reject = "x";
    env.body_case = TAH__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    s_seed_env(dir, "env_heartbeat", &env);
    Tah__StepReport sr = TAH__STEP_REPORT__INIT;
    sr.job = 3;
    sr.step = 4;
    sr.has_loss = 1;
    sr.loss = 2.5;
    env.body_case = TAH__ENVELOPE__BODY_STEP_REPORT;
    env.step_report = &sr;
    s_seed_env(dir, "env_step_report", &env);
    Tah__PeerReport pr = TAH__PEER_REPORT__INIT;
    pr.job = 3;
    pr.stage = 0;
    pr.count = 2;
    pr.reason = "nan";
    env.body_case = TAH__ENVELOPE__BODY_PEER_REPORT;
    env.peer_report = &pr;
    s_seed_env(dir, "env_peer_report", &env);
    Tah__SubmitReq sub = TAH__SUBMIT_REQ__INIT;
    sub.ini = "[job]\n";
    sub.base_dir = "/";
    sub.file_name = "j.ini";
    env.body_case = TAH__ENVELOPE__BODY_SUBMIT;
    env.submit = &sub;
    s_seed_env(dir, "env_submit", &env);
    Tah__LinkInfo li = TAH__LINK_INFO__INIT, *lis[] = { &li };
    li.bytes = 100;
    Tah__JobInfo ji = TAH__JOB_INFO__INIT, *jis[] = { &ji };
    ji.id = 1;
    ji.state = "running";
    ji.n_links = 1;
    ji.links = lis;
    Tah__StatusRep rep = TAH__STATUS_REP__INIT;
    rep.n_jobs = 1;
    rep.jobs = jis;
    env.body_case = TAH__ENVELOPE__BODY_STATUS_REP;
    env.status_rep = &rep;
    s_seed_env(dir, "env_status_rep", &env);
    Tah__Error er = TAH__ERROR__INIT;
    er.code = -1;
    er.message = "no";
    env.body_case = TAH__ENVELOPE__BODY_ERROR;
    env.error = &er;
    s_seed_env(dir, "env_error", &env);

    const codec_shape_t act = { B, T, C }, tied = { 1, VP, C };
    s_seed_data(dir, "data_hello", TAH__DATA_KIND__DATA_HELLO, 0, 0, 0, NULL, act, 0);
    s_seed_data(dir, "data_ping", TAH__DATA_KIND__DATA_PING, 2, 0, 0, NULL, act, 0);
    s_seed_data(dir, "data_act", TAH__DATA_KIND__DATA_ACT, 0, 1, 1, "fp32", act, 0);
    s_seed_data(dir, "data_eval", TAH__DATA_KIND__DATA_EVAL, 0, 2, 0, "fp32", act, 0);
    s_seed_data(dir, "data_grad", TAH__DATA_KIND__DATA_GRAD, 2, 1, 0, "fixpt:bits=8", act, 0);
    s_seed_data(dir, "data_norm_partial", TAH__DATA_KIND__DATA_NORM_PARTIAL, 0, 1, 0, NULL, act, 0);
    s_seed_data(dir, "data_norm", TAH__DATA_KIND__DATA_NORM, 2, 2, 0, NULL, act, 1.5);
    /* stage 1 of 3 has no tied partner: a TIED frame exercises the role check */
    s_seed_data(dir, "data_tied", TAH__DATA_KIND__DATA_TIED, 0, 1, 0, "fp32", tied, 0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("TAH_FUZZ_SEEDS");
    if (dir && *dir) {
        s_seeds(dir);
        exit(0);
    }
    return 0;
}
