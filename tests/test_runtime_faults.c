/* test_runtime_faults.c — the runtime under bad input and failures:
 *   bad job files      rejected at submit with file:line, nothing scheduled
 *   rogue peer         malformed data and control messages rejected and
 *                      counted; the job's losses still equal tah-train's
 *   node killed        with max_recoveries = 0: job "failed: node X lost at
 *                      step N", the other nodes idle again, the coordinator
 *                      still runs jobs (recovery: test_runtime_recovery.c)
 *   coordinator restart  jobs and their history still listed; the running
 *                      job's nodes re-announce with their stage and it goes
 *                      on; a queued job runs after it */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include <cmocka.h>

#include "rt_harness.h"

static const char *s_base =
    "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = %d\nlr = 1e-3\n"
    "stages = %d\nmicro_batches = 2\n";

static void s_sleep(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    nanosleep(&ts, NULL);
}

static int s_job_step(rt_t *r, uint64_t job)
{
    Tah__Envelope *e = rt_status(r, job);
    int step = e && e->status_rep->n_jobs == 1 ? e->status_rep->jobs[0]->step : -1;
    wire_envelope_free(&e);
    return step;
}

/* ---- bad job files ---- */

typedef struct bad_case {
    const char *text;
    const char *expect; /* substring of the error */
} bad_case_t;

static void test_bad_job_files(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_badjob");
    rt_start_coord(&r, 10.0, 0);
    rt_start_nodes(&r, 2);
    static const bad_case_t cases[] = {
        { "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 5\nlr = 1e-3\n"
          "bogus = 1\n",
          "bad0.ini:8: unknown key 'bogus'" },
        { "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = x\n", "bad1.ini:4: batch = 'x'" },
        { "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 5\n",
          "batch, seq, steps and lr are required" },
        { "[job]\nmodel = 4,2,64,32,256\nsave = m.bin\n", "bad3.ini:3: save is not supported" },
        { "[job]\nbatch = 2\nbatch = 3\n", "bad4.ini:3: key 'batch' given twice" },
        { "[job]\nmodel = 4,2,64,32,256\nthis is not ini\nbatch = x\n", "bad5.ini:3: syntax error" },
        { "[job]\nmodel = 4,2,64,32,256\nfwd_codec = tah:bits_hi=99\n", "bad6.ini:3: fwd-codec" },
        { "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 5\nlr = 1e-3\n"
          "stages = 8\n",
          "stages 8 exceeds the model's 4 layers" },
        { "# nothing here\n", "no [job] section" },
        { "lr = 1\n[job]\n", "bad9.ini:1: key 'lr' in section [(none)]" },
        { "[job]\nmodel = 4,2,64,32,256\ntrain_data = missing.txt\nbatch = 2\nseq = 16\nsteps = 5\nlr = 1e-3\n",
          "cannot read" },
        { "[job]\ngrad-clip = 1\n", "bad11.ini:2: unknown key 'grad-clip'; HINT: keys use underscores" },
        { "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 64\nsteps = 5\nlr = 1e-3\n",
          "seq 64 exceeds the model's maxT = 32" },
        { "[job]\nmodel = 4,2,64,32,256\nlr = -1\n", "bad13.ini:3: lr = '-1' is not a number in range" },
        { "[job]\nschedule = zigzag\n", "bad14.ini:2: schedule = 'zigzag' wants 1f1b or gpipe" },
    };
    char out[4096], name[32];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(name, sizeof name, "bad%zu.ini", i);
        const char *path = rt_write(&r, name, cases[i].text);
        uint64_t job = rt_submit(&r, path, out, sizeof out);
        if (job != 0)
            fail_msg("%s was accepted as job %llu", name, (unsigned long long)job);
        if (!strstr(out, cases[i].expect))
            fail_msg("%s: expected '%s' in: %s", name, cases[i].expect, out);
    }
    /* the coordinator validates too (a client that skips the CLI's checks) */
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(s, r.ep);
    Tah__SubmitReq sr = TAH__SUBMIT_REQ__INIT;
    sr.ini = "[job]\nbatch = 0\n";
    sr.base_dir = r.dir;
    sr.file_name = "direct.ini";
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_SUBMIT;
    env.submit = &sr;
    assert_int_equal(wire_send_envelope(s, NULL, 0, &env, 0), 0);
    int to = 0;
    char err[256];
    Tah__Envelope *rep = wire_recv_envelope(s, 10000, &to, err, sizeof err);
    assert_non_null(rep);
    assert_int_equal(rep->body_case, TAH__ENVELOPE__BODY_ERROR);
    assert_non_null(strstr(rep->error->message, "direct.ini:2: batch = '0'"));
    wire_envelope_free(&rep);
    zmq_close(s);
    zmq_ctx_term(ctx);

    /* nothing was scheduled */
    Tah__Envelope *e = rt_status(&r, 0);
    assert_non_null(e);
    assert_int_equal(e->status_rep->n_jobs, 0);
    for (size_t i = 0; i < e->status_rep->n_nodes; i++)
        assert_string_equal(e->status_rep->nodes[i]->state, "idle");
    wire_envelope_free(&e);

    /* usage errors exit 2 */
    char *u1[] = { TAH_COORD_EXE, "frobnicate", NULL };
    assert_int_equal(rt_run(u1, out, sizeof out), 2);
    char *u2[] = { TAH_COORD_EXE, "submit", "--coordinator", r.ep, NULL };
    assert_int_equal(rt_run(u2, out, sizeof out), 2);
    char *u3[] = { TAH_NODE_EXE, "join", NULL };
    assert_int_equal(rt_run(u3, out, sizeof out), 2);
    char *u4[] = { TAH_COORD_EXE, "status", "--coordinator", r.ep, "x1", NULL };
    assert_int_equal(rt_run(u4, out, sizeof out), 2);
    char *u5[] = { TAH_COORD_EXE, "cancel", "--coordinator", r.ep, "99", NULL };
    assert_int_equal(rt_run(u5, out, sizeof out), 1); /* no such job: runtime error */
    assert_int_equal(rt_stop(&r), 0);
}

/* ---- rogue peer ---- */

static void s_send_parts(void *s, int n, const void *const *data, const size_t *len)
{
    for (int i = 0; i < n; i++)
        zmq_send(s, data[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0);
}

static size_t s_pack_header(uint8_t *buf, uint64_t job, uint32_t kind, uint32_t from, uint64_t token)
{
    Tah__DataHeader h = TAH__DATA_HEADER__INIT;
    h.version = TAH_PROTO_VERSION;
    h.job = job;
    h.kind = kind;
    h.from_stage = from;
    h.token = token;
    h.step = 1;
    return tah__data_header__pack(&h, buf);
}

static void test_rogue_peer(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_rogue");
    rt_start_coord(&r, 10.0, 0);
    rt_start_nodes(&r, 4);
    const int steps = 300;
    char ini[1024], out[4096], st[64], reason[512];
    /* M = 6 micro-batches of 4: long enough steps that the attack lands mid-job */
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 4\nseq = 16\nsteps = %d\n"
             "lr = 1e-3\nstages = 4\nmicro_batches = 6\n",
             steps);
    uint64_t job = rt_submit(&r, rt_write(&r, "job.ini", ini), out, sizeof out);
    assert_true(job > 0);
    while (s_job_step(&r, job) < 2)
        s_sleep(0.01);

    /* data plane: connect to stage 1's endpoint like a rogue neighbour */
    Tah__Envelope *e = rt_status(&r, job);
    assert_non_null(e);
    char victim[64], vep[256];
    snprintf(victim, sizeof victim, "%s", e->status_rep->jobs[0]->nodes[1]);
    vep[0] = 0;
    for (size_t i = 0; i < e->status_rep->n_nodes; i++)
        if (!strcmp(e->status_rep->nodes[i]->name, victim))
            snprintf(vep, sizeof vep, "%s", e->status_rep->nodes[i]->endpoint);
    wire_envelope_free(&e);
    assert_true(vep[0] != 0);
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, linger = 5000; /* deliver everything queued before the close */
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_connect(d, vep), 0);
    uint8_t hb[256];
    static const uint8_t junk[] = { 0xff, 0x13, 0x37, 0x00, 0x42, 0x99 };
    size_t hl;
    {
        const void *p[] = { junk };
        size_t l[] = { sizeof junk };
        s_send_parts(d, 1, p, l); /* one part */
    }
    {
        const void *p[] = { junk, junk };
        size_t l[] = { sizeof junk, sizeof junk };
        s_send_parts(d, 2, p, l); /* undecodable header */
    }
    hl = s_pack_header(hb, job, TAH__DATA_KIND__DATA_HELLO, 0, 12345); /* wrong token */
    {
        const void *p[] = { hb, "" };
        size_t l[] = { hl, 0 };
        s_send_parts(d, 2, p, l);
    }
    hl = s_pack_header(hb, job, TAH__DATA_KIND__DATA_ACT, 0, 0); /* data without hello */
    {
        const void *p[] = { hb, junk };
        size_t l[] = { hl, sizeof junk };
        s_send_parts(d, 2, p, l);
    }
    hl = s_pack_header(hb, job + 100, TAH__DATA_KIND__DATA_HELLO, 0, 0); /* another job */
    {
        const void *p[] = { hb, "" };
        size_t l[] = { hl, 0 };
        s_send_parts(d, 2, p, l);
    }

    /* control plane */
    void *c = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(c, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_connect(c, r.ep), 0);
    int to = 0;
    char err[256];
    Tah__Envelope *rep;
    zmq_send(c, junk, sizeof junk, 0);
    rep = wire_recv_envelope(c, 10000, &to, err, sizeof err);
    assert_non_null(rep);
    assert_int_equal(rep->body_case, TAH__ENVELOPE__BODY_ERROR);
    wire_envelope_free(&rep);
    {
        Tah__Ok ok = TAH__OK__INIT;
        Tah__Envelope env = TAH__ENVELOPE__INIT;
        env.body_case = TAH__ENVELOPE__BODY_OK;
        env.ok = &ok;
        env.version = 99;
        uint8_t buf[64];
        size_t n = tah__envelope__pack(&env, buf);
        zmq_send(c, buf, n, 0); /* wrong version */
        rep = wire_recv_envelope(c, 10000, &to, err, sizeof err);
        assert_non_null(rep);
        assert_int_equal(rep->body_case, TAH__ENVELOPE__BODY_ERROR);
        assert_non_null(strstr(rep->error->message, "version 99"));
        wire_envelope_free(&rep);
        Tah__Welcome w = TAH__WELCOME__INIT;
        w.name = "evil";
        env.body_case = TAH__ENVELOPE__BODY_WELCOME;
        env.welcome = &w;
        wire_send_envelope(c, NULL, 0, &env, 0); /* a message only the coordinator sends */
        rep = wire_recv_envelope(c, 10000, &to, err, sizeof err);
        assert_non_null(rep);
        assert_int_equal(rep->body_case, TAH__ENVELOPE__BODY_ERROR);
        wire_envelope_free(&rep);
        Tah__Hello h = TAH__HELLO__INIT;
        h.name = "bad name!";
        h.endpoint = "nowhere";
        h.threads = 1;
        env.body_case = TAH__ENVELOPE__BODY_HELLO;
        env.hello = &h;
        wire_send_envelope(c, NULL, 0, &env, 0); /* invalid hello */
        rep = wire_recv_envelope(c, 10000, &to, err, sizeof err);
        assert_non_null(rep);
        assert_int_equal(rep->body_case, TAH__ENVELOPE__BODY_ERROR);
        wire_envelope_free(&rep);
        h.name = (char *)victim; /* hijack a live node's name */
        h.endpoint = "tcp://127.0.0.1:1";
        wire_send_envelope(c, NULL, 0, &env, 0);
        rep = wire_recv_envelope(c, 10000, &to, err, sizeof err);
        assert_non_null(rep);
        assert_int_equal(rep->body_case, TAH__ENVELOPE__BODY_ERROR);
        assert_non_null(strstr(rep->error->message, "in use"));
        wire_envelope_free(&rep);
    }
    zmq_close(c);
    zmq_close(d);
    zmq_ctx_term(ctx);
    assert_true(s_job_step(&r, job) < steps); /* the attack happened while it trained */

    assert_true(rt_wait_job(&r, job, 240, st, sizeof st, reason, sizeof reason));
    if (strcmp(st, "succeeded") != 0)
        fail_msg("job %s: %s", st, reason);
    /* training unaffected: same losses as tah-train */
    char train[700], ref[700], metrics[1200];
    snprintf(train, sizeof train, "%s/train.txt", r.dir);
    snprintf(ref, sizeof ref, "%s/ref.jsonl", r.dir);
    char *targv[] = { TAH_TRAIN_EXE, "--model", "4,2,64,32,256", "--train-data", train, "--batch", "4", "--seq",
                      "16", "--steps", "300", "--lr", "1e-3", "--stages", "4", "--micro-batches", "6",
                      "--threads", "1", "--metrics", ref, "--quiet", NULL };
    assert_int_equal(rt_run(targv, out, sizeof out), 0);
    e = rt_status(&r, job);
    snprintf(metrics, sizeof metrics, "%s", e->status_rep->jobs[0]->metrics_path);
    wire_envelope_free(&e);
    static double a[400], b[400];
    assert_int_equal(rt_metrics(metrics, "loss", a, 400), steps);
    assert_int_equal(rt_metrics(ref, "loss", b, 400), steps);
    for (int i = 0; i < steps; i++)
        if (fabs(a[i] - b[i]) > 1e-5 * (1 + fabs(b[i])))
            fail_msg("step %d: loss %.6f vs tah-train %.6f", i + 1, a[i], b[i]);
    /* rejected and counted (node counts arrive with heartbeats, 1/s) */
    uint64_t node_rej = 0, coord_rej = 0;
    for (int tries = 0; tries < 50 && node_rej < 5; tries++) {
        e = rt_status(&r, 0);
        coord_rej = e->status_rep->rejected;
        for (size_t i = 0; i < e->status_rep->n_nodes; i++)
            if (!strcmp(e->status_rep->nodes[i]->name, victim))
                node_rej = e->status_rep->nodes[i]->rejected;
        wire_envelope_free(&e);
        s_sleep(0.1);
    }
    if (node_rej < 5)
        fail_msg("node %s counted %llu rejected messages (expected >= 5)", victim, (unsigned long long)node_rej);
    if (coord_rej < 5)
        fail_msg("coordinator counted %llu rejected messages (expected >= 5)", (unsigned long long)coord_rej);
    assert_int_equal(rt_stop(&r), 0);
}

/* ---- a node dies mid-step ---- */

static void test_node_killed(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_kill");
    rt_start_coord(&r, 1.5, 0);
    rt_start_nodes(&r, 4);
    char ini[1024], out[4096], st[64], reason[512];
    snprintf(ini, sizeof ini, "%s%s", s_base, "max_recoveries = 0\n");
    char ini2[1024];
    snprintf(ini2, sizeof ini2, ini, 1000000, 4);
    uint64_t job = rt_submit(&r, rt_write(&r, "long.ini", ini2), out, sizeof out);
    assert_true(job > 0);
    while (s_job_step(&r, job) < 3)
        s_sleep(0.01);
    Tah__Envelope *e = rt_status(&r, job);
    char victim[64];
    snprintf(victim, sizeof victim, "%s", e->status_rep->jobs[0]->nodes[1]);
    wire_envelope_free(&e);
    int vi = atoi(victim + 1);
    rt_kill_node(&r, vi, SIGKILL);
    assert_true(rt_wait_job(&r, job, 60, st, sizeof st, reason, sizeof reason));
    assert_string_equal(st, "failed");
    char expect[128];
    snprintf(expect, sizeof expect, "node %s lost at step ", victim);
    if (!strstr(reason, expect))
        fail_msg("reason '%s' does not name %s", reason, victim);
    /* the survivors go back to idle, the dead one is listed lost */
    assert_true(rt_wait_nodes(&r, "idle", 3, 30));
    assert_true(rt_wait_nodes(&r, "lost", 1, 5));
    /* the coordinator still serves: a 3-stage job runs on the survivors */
    snprintf(ini, sizeof ini, s_base, 5, 3);
    job = rt_submit(&r, rt_write(&r, "three.ini", ini), out, sizeof out);
    assert_true(job > 0);
    assert_true(rt_wait_job(&r, job, 120, st, sizeof st, reason, sizeof reason));
    if (strcmp(st, "succeeded") != 0)
        fail_msg("job after the failure: %s: %s", st, reason);
    assert_int_equal(rt_stop(&r), 0);
}

/* ---- coordinator restart ---- */

static void test_coordinator_restart(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_restart");
    rt_start_coord(&r, 10.0, 0);
    rt_start_nodes(&r, 2);
    char ini[1024], out[4096], st[64], reason[512];
    snprintf(ini, sizeof ini, s_base, 6, 2);
    uint64_t j1 = rt_submit(&r, rt_write(&r, "short.ini", ini), out, sizeof out);
    assert_true(j1 > 0);
    assert_true(rt_wait_job(&r, j1, 60, st, sizeof st, reason, sizeof reason));
    assert_string_equal(st, "succeeded");
    assert_true(rt_wait_nodes(&r, "idle", 2, 20));
    snprintf(ini, sizeof ini, s_base, 1000000, 2);
    uint64_t j2 = rt_submit(&r, rt_write(&r, "long.ini", ini), out, sizeof out);
    while (s_job_step(&r, j2) < 2)
        s_sleep(0.01);
    snprintf(ini, sizeof ini, s_base, 4, 2);
    uint64_t j3 = rt_submit(&r, rt_write(&r, "queued.ini", ini), out, sizeof out);
    assert_true(j2 > 0 && j3 > 0);

    int port = atoi(strrchr(r.ep, ':') + 1);
    assert_int_equal(rt_stop_coord(&r), 0);
    rt_start_coord(&r, 10.0, port);

    /* every job is still listed; the one that was running waits for its nodes */
    Tah__Envelope *e = rt_status(&r, 0);
    assert_non_null(e);
    assert_int_equal(e->status_rep->n_jobs, 3);
    assert_string_equal(e->status_rep->jobs[0]->state, "succeeded");
    assert_int_equal(e->status_rep->jobs[0]->step, 6);
    assert_true(e->status_rep->jobs[0]->n_links > 0);
    const char *st1 = e->status_rep->jobs[1]->state;
    if (strcmp(st1, "running") != 0 &&
        !(strcmp(st1, "paused") == 0 && strstr(e->status_rep->jobs[1]->reason, "coordinator restarted")))
        fail_msg("running job after the restart: %s: %s", st1, e->status_rep->jobs[1]->reason);
    int at_restart = e->status_rep->jobs[1]->step;
    assert_string_equal(e->status_rep->jobs[2]->state, "queued");
    wire_envelope_free(&e);
    /* its nodes re-announce with their stages and it goes on */
    while (s_job_step(&r, j2) < at_restart + 3)
        s_sleep(0.01);
    e = rt_status(&r, j2);
    assert_string_equal(e->status_rep->jobs[0]->state, "running");
    wire_envelope_free(&e);
    char coord[160], js[32];
    snprintf(coord, sizeof coord, "%s", r.ep);
    snprintf(js, sizeof js, "%llu", (unsigned long long)j2);
    char *cancel_argv[] = { TAH_COORD_EXE, "cancel", "--coordinator", coord, js, NULL };
    assert_int_equal(rt_run(cancel_argv, out, sizeof out), 0);
    /* then the queued job runs */
    assert_true(rt_wait_job(&r, j3, 120, st, sizeof st, reason, sizeof reason));
    if (strcmp(st, "succeeded") != 0)
        fail_msg("queued job after restart: %s: %s", st, reason);
    assert_int_equal(rt_stop(&r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_job_files),
        cmocka_unit_test(test_rogue_peer),
        cmocka_unit_test(test_node_killed),
        cmocka_unit_test(test_coordinator_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
