/* test_node_drain.c — the runner's side of Drain (node/runner.c): the real
 * compute thread on a one-stage job of a tiny model (real stage, real
 * checkpoints), driven through its pipe the way the agent drives it
 * (node.h): 'Y', 'R', 'C', 'X' read, drain_step stored and cur_step then
 * loaded, 'A' if the runner is already past the drained step. Periodic
 * checkpoints are slowed by TAH_NODE_TEST_CKPT_DELAY_MS so that a Drain
 * lands at a known point.
 *
 *   drain after the check  Drain(D) arrives once the runner has finished
 *                          step D and passed its end-of-step check, while
 *                          it writes step D's checkpoint. The agent sees D
 *                          as the current step and, as for a stage still
 *                          inside D, does not abort. The runner must stop
 *                          after D all the same: in a pipeline every other
 *                          stage does, and its step D+1 would wait for them
 *                          until the silence watchdog blamed a neighbour
 *                          (the chaos test's flake under load: node_lost
 *                          instead of the leave).
 *   drain ahead            Drain(D) with D two steps ahead: the runner
 *                          goes on to D, stops after it, not before.
 *   stopped after the last step  the agent stops the runner ('A', abort:
 *                          a neighbour's silence, the coordinator's Abort,
 *                          a second signal) once it has finished its last
 *                          step, while it writes its last checkpoint. Its
 *                          stage is complete (NODE_DONE), and the step it
 *                          stopped in is the last one: the agent's event
 *                          (node_lost "at step N" for a silence verdict)
 *                          names it, not step 0. */
#define _XOPEN_SOURCE 700 /* mkdtemp, realpath, setenv */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "node.h" /* node_job_t, node_runner_main */
#include "wire.h" /* wire_envelope_unpack: the runner's step reports */

#define S_CKPT_EVERY 5
#define S_STEPS 12 /* the job's steps (s_ini) */
#define S_DELAY_MS 1000 /* the checkpoint write the Drain lands in; the driver acts 300 ms into it */

static const char *s_ini =
    "[job]\nmodel = 2,2,32,16,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 12\nlr = 1e-3\n"
    "stages = 1\nmicro_batches = 2\nfwd_codec = fp32\nbwd_codec = fp32\ncheckpoint_every = 5\nseed = 3\n";

static void s_sleep(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    nanosleep(&ts, NULL);
}

typedef struct run {
    int result, drained_step;
    int last_report; /* the last step the runner reported */
    int cur_at_drain; /* cur_step when the Drain was stored */
    int aborted;     /* the driver sent 'A' (the runner was past D) */
    int fail_step;   /* the step the runner says it stopped in */
} run_t;

/* One job: the Drain(drain) (drain > 0) is delivered 300 ms after the
 * report of step S_CKPT_EVERY, i.e. while that step's (slowed) checkpoint
 * is written; the agent's stop (stop_at > 0) 300 ms after the report of
 * step stop_at. */
static run_t s_run(const char *dir, int drain, int stop_at)
{
    run_t out = { 0 };
    void *ctx = zmq_ctx_new();
    void *pipe = zmq_socket(ctx, ZMQ_PAIR);
    int zero = 0, hwm = 1000, to = 20000;
    zmq_setsockopt(pipe, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(pipe, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(pipe, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(pipe, ZMQ_RCVTIMEO, &to, sizeof to);
    node_job_t *j = calloc(1, sizeof *j);
    atomic_ullong rejected;
    atomic_init(&rejected, 0);
    assert_non_null(j);
    j->id = 1;
    j->token = 42;
    j->stage = 0;
    j->S = 1;
    j->layer0 = j->layer1 = -1;
    j->ini = strdup(s_ini);
    snprintf(j->base_dir, sizeof j->base_dir, "%s", dir);
    snprintf(j->ckpt_prefix, sizeof j->ckpt_prefix, "%s/job1", dir);
    j->threads = 1;
    j->peer_timeout_ms = 15000;
    j->ctx = ctx;
    j->rejected = &rejected;
    snprintf(j->pipe_ep, sizeof j->pipe_ep, "inproc://runner-drain-test");
    assert_int_equal(zmq_bind(pipe, j->pipe_ep), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, node_runner_main, j), 0);
    int done = 0, drained_sent = 0;
    while (!done) {
        zmq_msg_t parts[3];
        int n = 0, more = 1;
        while (more && n < 3) {
            zmq_msg_init(&parts[n]);
            if (zmq_msg_recv(&parts[n], pipe, 0) < 0)
                fail_msg("no message from the runner in 20 s (%s)", zmq_strerror(errno));
            more = zmq_msg_more(&parts[n]);
            n++;
        }
        char cmd = zmq_msg_size(&parts[0]) == 1 ? *(char *)zmq_msg_data(&parts[0]) : 0;
        if (cmd == 'X') {
            done = 1;
        } else if (cmd == 'R' && n == 2) {
            char err[256];
            Tah__Envelope *e = wire_envelope_unpack(zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), err, sizeof err);
            assert_non_null(e);
            assert_int_equal(e->body_case, TAH__ENVELOPE__BODY_STEP_REPORT);
            out.last_report = e->step_report->step;
            wire_envelope_free(&e);
            if (stop_at > 0 && out.last_report == stop_at) {
                /* the runner has finished the step and sleeps in its checkpoint */
                s_sleep(0.3);
                atomic_store(&j->abort, 1); /* s_abort's order: the flag, then 'A' */
                char a = 'A';
                zmq_send(pipe, &a, 1, ZMQ_SNDMORE);
                const char *why = "stage 1 (node x) silent for 6.5 s";
                zmq_send(pipe, why, strlen(why), 0);
                out.aborted = 1;
            }
            if (drain > 0 && out.last_report == S_CKPT_EVERY && !drained_sent) {
                /* the runner has passed step 5's check and sleeps in its checkpoint */
                s_sleep(0.3);
                atomic_store(&j->drain_step, drain); /* the agent's Drain, in its order */
                out.cur_at_drain = atomic_load(&j->cur_step);
                if (out.cur_at_drain > drain) {
                    char a = 'A';
                    zmq_send(pipe, &a, 1, ZMQ_SNDMORE);
                    zmq_send(pipe, "drain", 5, 0);
                    out.aborted = 1;
                }
                drained_sent = 1;
            }
        }
        for (int i = 0; i < n; i++)
            zmq_msg_close(&parts[i]);
    }
    pthread_join(th, NULL);
    out.result = j->result;
    out.drained_step = j->drained_step;
    out.fail_step = j->fail_step;
    free(j->ini);
    free(j);
    zmq_close(pipe);
    zmq_ctx_term(ctx);
    return out;
}

static char s_dir[512];

static int s_setup(void **state)
{
    (void)state;
    char tmpl[] = "node_drain.XXXXXX";
    if (!mkdtemp(tmpl))
        return -1;
    if (!realpath(tmpl, s_dir))
        return -1;
    char p[700];
    snprintf(p, sizeof p, "%s/train.txt", s_dir);
    FILE *f = fopen(p, "w");
    if (!f)
        return -1;
    uint32_t x = 7;
    for (int i = 0; i < 4000; i++) { /* ~20 kB of lower-case words */
        x = x * 1664525u + 1013904223u;
        int len = 2 + (int)(x >> 28);
        for (int k = 0; k < len; k++) {
            x = x * 1664525u + 1013904223u;
            fputc('a' + (int)((x >> 16) % 26), f);
        }
        fputc(i % 11 == 10 ? '\n' : ' ', f);
    }
    fclose(f);
    char ms[32];
    snprintf(ms, sizeof ms, "%d", S_DELAY_MS);
    setenv("TAH_NODE_TEST_CKPT_DELAY_MS", ms, 1);
    return 0;
}

static void test_drain_after_the_check(void **state)
{
    (void)state;
    run_t r = s_run(s_dir, S_CKPT_EVERY, 0);
    /* the premise: the Drain came while step 5 was still the runner's current step */
    assert_int_equal(r.cur_at_drain, S_CKPT_EVERY);
    assert_int_equal(r.aborted, 0);
    if (r.result != NODE_DRAINED || r.drained_step != S_CKPT_EVERY)
        fail_msg("Drain(%d) after the runner's check: result %d, drained after step %d, last report %d "
                 "(want NODE_DRAINED after step %d, nothing past it)",
                 S_CKPT_EVERY, r.result, r.drained_step, r.last_report, S_CKPT_EVERY);
    assert_int_equal(r.last_report, S_CKPT_EVERY);
}

static void test_drain_ahead(void **state)
{
    (void)state;
    const int D = S_CKPT_EVERY + 2;
    run_t r = s_run(s_dir, D, 0);
    assert_int_equal(r.cur_at_drain, S_CKPT_EVERY);
    assert_int_equal(r.aborted, 0);
    if (r.result != NODE_DRAINED || r.drained_step != D)
        fail_msg("Drain(%d) two steps ahead: result %d, drained after step %d, last report %d", D, r.result,
                 r.drained_step, r.last_report);
    assert_int_equal(r.last_report, D);
}

static void test_stopped_after_the_last_step(void **state)
{
    (void)state;
    run_t r = s_run(s_dir, 0, S_STEPS);
    /* the premise: the stop came after the last step's report */
    assert_int_equal(r.aborted, 1);
    assert_int_equal(r.last_report, S_STEPS);
    assert_int_equal(r.result, NODE_DONE); /* its stage is complete all the same */
    if (r.fail_step != S_STEPS)
        fail_msg("stopped while writing its last checkpoint: the runner says it stopped in step %d (want %d, "
                 "the step the agent's event names)",
                 r.fail_step, S_STEPS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drain_after_the_check),
        cmocka_unit_test(test_drain_ahead),
        cmocka_unit_test(test_stopped_after_the_last_step),
    };
    return cmocka_run_group_tests(tests, s_setup, NULL);
}
