/* test_runtime_hostile.c — a neighbour that authenticated with the job's
 * token and then sends poison (node/guard.h, node/link.c):
 *   the test joins the coordinator as node "rogue" over the real control
 *   protocol, gets stage 0 of a 2-stage job, connects to stage 1 (a real
 *   tah-node) with the token from its assignment and sends one good
 *   activation, then a replay of it, a NaN frame (valid checksums), a frame
 *   with 1e9 x the norm, and a frame of the wrong shape. Each is rejected
 *   and counted; with max_bad_frames = 4 the coordinator evicts the rogue:
 *   the job fails naming it, the honest node is idle again.
 * And a node of an older build (Hello without seed_rules) is kept off a job
 * with a stochastic codec, whose frames it would derive differently: the
 * job waits, saying why, and runs once a node of this build comes.
 * And a node that reports a step of 9e9 ms cannot stretch the job's stall
 * limit: the coordinator counts a node's step time as no more than it saw
 * pass since the node's assignment. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include <cmocka.h>

#include "codec.h"  /* codec_encode, codec_frame_seal */
#include "crc32c.h" /* crc32c_update */
#include "rt_harness.h"

enum { BATCH = 2, SEQ = 16, C = 64 };

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void s_heartbeat(void *c)
{
    Tah__Heartbeat hb = TAH__HEARTBEAT__INIT;
    hb.state = TAH__NODE_STATE__NODE_IDLE;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    assert_int_equal(wire_send_envelope(c, NULL, 0, &env, 0), 0);
}

/* Wait for a control message of this body (heartbeating meanwhile). */
static Tah__Envelope *s_expect(void *c, int body, double timeout)
{
    double t0 = s_now();
    while (s_now() - t0 < timeout) {
        s_heartbeat(c);
        int to = 0;
        char err[256];
        Tah__Envelope *e = wire_recv_envelope(c, 300, &to, err, sizeof err);
        if (e && (int)e->body_case == body)
            return e;
        wire_envelope_free(&e);
    }
    fail_msg("no '%d' message from the coordinator in %.0f s", body, timeout);
    return NULL;
}

/* [DataHeader][payload] from stage 0. */
static void s_send_data(void *d, uint64_t job, uint32_t kind, int step, int mb, uint64_t token,
                        const uint8_t *payload, size_t len, codec_shape_t shape)
{
    Tah__DataHeader h = TAH__DATA_HEADER__INIT;
    h.version = TAH_PROTO_VERSION;
    h.job = job;
    h.kind = kind;
    h.from_stage = 0;
    h.step = step;
    h.mb = mb;
    h.token = token;
    h.codec = CODEC_FP32;
    h.b = shape.b;
    h.t = shape.s;
    h.c = shape.c;
    h.crc = crc32c_update(0, payload, len);
    uint8_t hb[WIRE_MAX_HEADER];
    size_t hl = tah__data_header__pack(&h, hb);
    zmq_send(d, hb, hl, ZMQ_SNDMORE);
    zmq_send(d, payload, len, 0);
}

/* An fp32 frame of x scaled by `scale`, with x[poke] replaced by `poison`
 * when poke >= 0; header and frame checksum valid either way. */
static uint8_t *s_frame(codec_shape_t shape, float scale, int poke, float poison, size_t *len)
{
    codec_spec_t spec;
    codec_spec_default(CODEC_FP32, &spec);
    size_t n = (size_t)shape.b * shape.s * shape.c;
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    uint32_t seed = 12345;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = scale * ((float)(seed >> 8) / (float)(1u << 24) - 0.5f);
    }
    int64_t fs = codec_frame_size(&spec, shape);
    uint8_t *f = malloc((size_t)fs);
    assert_non_null(f);
    assert_int_equal(codec_encode(&spec, shape, x, f, (size_t)fs, len, NULL, 0), 0);
    if (poke >= 0) {
        memcpy(f + CODEC_HEADER_SIZE + 4 * (size_t)poke, &poison, 4);
        assert_int_equal(codec_frame_seal(&spec, shape, f, *len, NULL, 0), 0);
    }
    free(x);
    return f;
}

/* Join the coordinator over the control protocol as `name`, the Hello of
 * a build that does not announce its seed rules; returns the socket once
 * welcomed. */
static void *s_join(void *ctx, const char *ep, const char *name)
{
    void *c = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(c, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_connect(c, ep), 0);
    Tah__Hello hello = TAH__HELLO__INIT;
    hello.name = (char *)name;
    hello.endpoint = "tcp://127.0.0.1:1";
    hello.backend = "cpu";
    hello.threads = 1;
    hello.gflops = 1.0;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_HELLO;
    env.hello = &hello;
    assert_int_equal(wire_send_envelope(c, NULL, 0, &env, 0), 0);
    Tah__Envelope *e = s_expect(c, TAH__ENVELOPE__BODY_WELCOME, 10);
    wire_envelope_free(&e);
    return c;
}

/* A coordinator in DIR = NAME.XXXXXX, `joiner` joined first (s_join), then
 * one real node n0; returns once both are idle, the joiner's socket. */
static void *s_start(rt_t *r, const char *name, void *ctx, const char *joiner)
{
    rt_init(r, name);
    rt_start_coord(r, 10.0, 0);
    void *c = s_join(ctx, r->ep, joiner);
    rt_start_nodes(r, 1); /* returns once one node is idle: maybe only the joiner so far */
    s_heartbeat(c);
    assert_true(rt_wait_nodes(r, "idle", 2, 20));
    return c;
}

/* Heartbeat once and read (and drop) the coordinator's messages for 0.2 s. */
static void s_pump(void *c)
{
    s_heartbeat(c);
    int to = 0;
    char err[256];
    Tah__Envelope *e = wire_recv_envelope(c, 200, &to, err, sizeof err);
    wire_envelope_free(&e);
}

/* Submit `ini` as job.ini; the joiner on socket c must be assigned its
 * stage 0. Returns the job's id and (*assign) the Assign envelope. */
static uint64_t s_submit_stage0(rt_t *r, void *c, const char *ini, Tah__Envelope **assign)
{
    char out[4096];
    uint64_t job = rt_submit(r, rt_write(r, "job.ini", ini), out, sizeof out);
    if (job == 0)
        fail_msg("submit: %s", out);
    Tah__Envelope *e = s_expect(c, TAH__ENVELOPE__BODY_ASSIGN, 20);
    assert_int_equal(e->assign->job, job);
    assert_int_equal(e->assign->stage, 0);
    *assign = e;
    return job;
}

/* Heartbeat once and read the coordinator's messages for 0.2 s: an
 * assignment fails the test (an older build on a stochastic job). */
static void s_expect_no_assign(void *c)
{
    s_heartbeat(c);
    int to = 0;
    char err[256];
    Tah__Envelope *e = wire_recv_envelope(c, 200, &to, err, sizeof err);
    if (e && e->body_case == TAH__ENVELOPE__BODY_ASSIGN)
        fail_msg("the older build was assigned stage %u of a stochastic job", e->assign->stage);
    wire_envelope_free(&e);
}

static void test_rogue_stage_evicted(void **state)
{
    (void)state;
    /* the rogue joins first, so it gets stage 0 (an older build's Hello:
     * the job's codecs round to nearest, so it is placed) */
    rt_t r;
    void *ctx = zmq_ctx_new();
    void *c = s_start(&r, "rt_hostile", ctx, "rogue");
    Tah__Envelope *e;

    char ini[1024], st[64], reason[1024];
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 4,2,%d,32,256\ntrain_data = train.txt\nbatch = %d\nseq = %d\nsteps = 50\n"
             "lr = 1e-3\nstages = 2\nmicro_batches = 4\nfwd_codec = fp32\nmax_norm_ratio = 1000\n"
             "max_bad_frames = 4\n",
             C, BATCH, SEQ);
    uint64_t job = s_submit_stage0(&r, c, ini, &e);
    assert_int_equal(e->assign->n_endpoints, 2);
    uint64_t token = e->assign->token;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", e->assign->endpoints[1]);
    wire_envelope_free(&e);

    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 5000;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_connect(d, ep), 0);
    const codec_shape_t shape = { BATCH, SEQ, C };
    s_send_data(d, job, TAH__DATA_KIND__DATA_HELLO, 0, 0, token, NULL, 0, shape);
    size_t len = 0, blen = 0, hlen = 0, wlen = 0;
    uint8_t *good = s_frame(shape, 1.0f, -1, 0.0f, &len);
    uint8_t *nan = s_frame(shape, 1.0f, 17, NAN, &blen);
    uint8_t *huge = s_frame(shape, 1e9f, -1, 0.0f, &hlen);
    const codec_shape_t narrow = { BATCH, SEQ, C / 2 };
    uint8_t *wrong = s_frame(narrow, 1.0f, -1, 0.0f, &wlen);
    s_send_data(d, job, TAH__DATA_KIND__DATA_ACT, 1, 0, 0, good, len, shape);   /* accepted */
    s_send_data(d, job, TAH__DATA_KIND__DATA_ACT, 1, 0, 0, good, len, shape);   /* 1: replay */
    s_send_data(d, job, TAH__DATA_KIND__DATA_ACT, 1, 1, 0, nan, blen, shape);   /* 2: NaN */
    s_send_data(d, job, TAH__DATA_KIND__DATA_ACT, 1, 2, 0, huge, hlen, shape);  /* 3: norm */
    s_send_data(d, job, TAH__DATA_KIND__DATA_ACT, 1, 3, 0, wrong, wlen, narrow); /* 4: shape */

    /* keep the rogue alive on the control plane until the verdict */
    double t0 = s_now();
    st[0] = 0;
    while (s_now() - t0 < 30) {
        s_pump(c);
        Tah__Envelope *s = rt_status(&r, job);
        if (s && s->status_rep->n_jobs == 1 && strcmp(s->status_rep->jobs[0]->state, "running") != 0) {
            snprintf(st, sizeof st, "%s", s->status_rep->jobs[0]->state);
            snprintf(reason, sizeof reason, "%s", s->status_rep->jobs[0]->reason);
            wire_envelope_free(&s);
            break;
        }
        wire_envelope_free(&s);
    }
    /* evicted: the job pauses until another node takes stage 0 (the rogue
     * is banned from it); the record names the rogue and why */
    assert_string_equal(st, "paused");
    Tah__Envelope *sr = rt_status(&r, job);
    const Tah__EventInfo *ev = NULL;
    for (size_t i = 0; sr && i < sr->status_rep->jobs[0]->n_events; i++)
        if (!strcmp(sr->status_rep->jobs[0]->events[i]->kind, "evicted"))
            ev = sr->status_rep->jobs[0]->events[i];
    if (!ev)
        fail_msg("no eviction in the job's record (reason: %s)", reason);
    assert_string_equal(ev->node, "rogue");
    assert_int_equal(ev->stage, 0);
    if (!strstr(ev->detail, "node rogue (stage 0) evicted at step 1: 4 bad data messages rejected by node n0"))
        fail_msg("eviction: %s", ev->detail);
    /* the latest: the shape; with TAH_RT_NODE_DEVICE (GPU nodes decode on the device, after the
     * agent's checks) the NaN or the norm frame, checked a moment after the shape */
    const int gpu = getenv("TAH_RT_NODE_DEVICE") != NULL;
    if (!strstr(ev->detail, "wrong") && !strstr(ev->detail, "expected") &&
        !(gpu && (strstr(ev->detail, "max_norm_ratio") || strstr(ev->detail, "non-finite"))))
        fail_msg("latest rejection not named: %s", ev->detail);
    wire_envelope_free(&sr);
    /* the honest node: idle again, its count (heartbeats) includes the four */
    assert_true(rt_wait_nodes(&r, "idle", 1, 20));
    uint64_t rej = 0;
    for (int tries = 0; tries < 50 && rej < 4; tries++) {
        Tah__Envelope *s = rt_status(&r, 0);
        for (size_t i = 0; s && i < s->status_rep->n_nodes; i++)
            if (!strcmp(s->status_rep->nodes[i]->name, "n0"))
                rej = s->status_rep->nodes[i]->rejected;
        wire_envelope_free(&s);
        struct timespec ts = { 0, 100000000 };
        nanosleep(&ts, NULL);
    }
    if (rej < 4)
        fail_msg("node n0 counted %llu rejected messages (expected >= 4)", (unsigned long long)rej);
    free(good);
    free(nan);
    free(huge);
    free(wrong);
    zmq_close(d);
    zmq_close(c);
    zmq_ctx_term(ctx);
    assert_int_equal(rt_stop(&r), 0);
}

static void test_old_build_off_stochastic_job(void **state)
{
    (void)state;
    rt_t r;
    void *ctx = zmq_ctx_new();
    void *c = s_start(&r, "rt_seedrules", ctx, "old");

    char ini[1024], out[4096], st[64] = "", reason[1024] = "";
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 2,2,%d,32,256\ntrain_data = train.txt\nbatch = %d\nseq = %d\nsteps = 2\n"
             "lr = 1e-3\nstages = 2\nmicro_batches = 2\nfwd_codec = fp32\n"
             "bwd_codec = fixpt:bits=8,stochastic=1,seed=3\n",
             C, BATCH, SEQ);
    uint64_t job = rt_submit(&r, rt_write(&r, "job.ini", ini), out, sizeof out);
    if (job == 0)
        fail_msg("submit: %s", out);
    /* two idle nodes, but one of them is of the older build: no assignment
     * for it, the job waits and says why */
    double t0 = s_now();
    while (s_now() - t0 < 3.0)
        s_expect_no_assign(c);
    Tah__Envelope *s = rt_status(&r, job);
    assert_non_null(s);
    assert_int_equal(s->status_rep->n_jobs, 1);
    assert_string_equal(s->status_rep->jobs[0]->state, "queued");
    if (!strstr(s->status_rep->jobs[0]->reason, "1 idle node of another build cannot take a stochastic codec"))
        fail_msg("queued job's reason: %s", s->status_rep->jobs[0]->reason);
    /* status shows each node's seed rules */
    assert_int_equal(s->status_rep->n_nodes, 2);
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(s->status_rep->nodes[i]->seed_rules,
                         strcmp(s->status_rep->nodes[i]->name, "old") ? CODEC_SEED_RULES : 0u);
    wire_envelope_free(&s);
    /* a node of this build: the job runs on n0 and n1 and finishes */
    rt_spawn_node(&r, "n1", NULL);
    t0 = s_now();
    while (s_now() - t0 < 60 && strcmp(st, "succeeded") != 0 && strcmp(st, "failed") != 0) {
        s_expect_no_assign(c);
        s = rt_status(&r, job);
        if (s && s->status_rep->n_jobs == 1) {
            snprintf(st, sizeof st, "%s", s->status_rep->jobs[0]->state);
            snprintf(reason, sizeof reason, "%s", s->status_rep->jobs[0]->reason);
        }
        wire_envelope_free(&s);
    }
    if (strcmp(st, "succeeded") != 0)
        fail_msg("job %s: %s", st, reason);
    zmq_close(c);
    zmq_ctx_term(ctx);
    assert_int_equal(rt_stop(&r), 0);
}

/* The rogue takes stage 0 of a job with stall_timeout = 2, reports step 1
 * as taking 9e9 ms (2.5 hours after a few milliseconds), then sends nothing
 * downstream. The stall limit is 20 times the slowest step seen, so a
 * believed report would move it to 5.7 years; the coordinator counts the
 * report as the time since the assignment, and the job stalls within
 * seconds (at 2 s unless the report took over 0.1 s to arrive). */
static void test_inflated_step_time(void **state)
{
    (void)state;
    rt_t r;
    void *ctx = zmq_ctx_new();
    void *c = s_start(&r, "rt_inflated", ctx, "rogue");

    char ini[1024], detail[1024] = "";
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 2,2,%d,32,256\ntrain_data = train.txt\nbatch = %d\nseq = %d\nsteps = 50\n"
             "lr = 1e-3\nstages = 2\nmicro_batches = 2\nfwd_codec = fp32\nstall_timeout = 2\n",
             C, BATCH, SEQ);
    Tah__Envelope *e;
    uint64_t job = s_submit_stage0(&r, c, ini, &e);
    wire_envelope_free(&e);
    Tah__StepReport rep = TAH__STEP_REPORT__INIT;
    rep.job = job;
    rep.stage = 0;
    rep.step = 1;
    rep.ms = 9e9;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_STEP_REPORT;
    env.step_report = &rep;
    assert_int_equal(wire_send_envelope(c, NULL, 0, &env, 0), 0);
    const double t0 = s_now();
    while (s_now() - t0 < 40 && !detail[0]) {
        s_pump(c);
        Tah__Envelope *s = rt_status(&r, job);
        for (size_t i = 0; s && s->status_rep->n_jobs == 1 && i < s->status_rep->jobs[0]->n_events; i++)
            if (!strcmp(s->status_rep->jobs[0]->events[i]->kind, "stalled"))
                snprintf(detail, sizeof detail, "%s", s->status_rep->jobs[0]->events[i]->detail);
        wire_envelope_free(&s);
    }
    if (!detail[0])
        fail_msg("no stall in %.0f s after a report of a 9e9 ms step", s_now() - t0);
    /* the limit: 2 s, or 20 times the time between the assignment and the
     * report if a loaded machine made that more than 0.1 s; never the report's */
    const char *lim = strstr(detail, "(stall limit ");
    double limit = lim ? atof(lim + strlen("(stall limit ")) : -1;
    printf("stall after %.1f s: %s\n", s_now() - t0, detail);
    if (!strstr(detail, "stalled in step 1:") || limit < 2 || limit > 40)
        fail_msg("stall: %s", detail);
    zmq_close(c);
    zmq_ctx_term(ctx);
    assert_int_equal(rt_stop(&r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rogue_stage_evicted),
        cmocka_unit_test(test_old_build_off_stochastic_job),
        cmocka_unit_test(test_inflated_step_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
