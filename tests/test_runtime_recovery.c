/* test_runtime_recovery.c — volunteers come and go (issue 8), on loopback
 * with the real tah-coord / tah-node binaries and the fp32 codec, checked
 * against an uninterrupted tah-train run of the same job (the runtime is
 * tah-train's computation bit for bit, so every step's loss and gradient
 * norm must match; the tolerance only absorbs metrics.jsonl's 6 decimals):
 *
 *   chaos             4 stages on 5 nodes (one spare). A node of the job is
 *                     SIGKILLed at a random step: the spare takes its stage,
 *                     every stage rolls back to the last complete set of
 *                     checkpoint replicas. Then another node of the job
 *                     leaves (`tah-node leave`): every stage stops after the same
 *                     step, checkpoints, and with no spare left the job
 *                     waits, paused, naming the stage; a new node joins and
 *                     the job goes on from that step (no rollback). The job
 *                     finishes with tah-train's losses at every step, each
 *                     step recorded once, and the coordinator's record
 *                     shows both events with their steps, the loss once
 *                     (a neighbour's report and the heartbeat's verdict
 *                     on the dead node are one loss).
 *   coordinator restart  the coordinator is stopped and restarted mid-job;
 *                     the nodes keep training, re-announce with their
 *                     stage, and the job finishes with every step recorded
 *                     once and tah-train's losses.
 *   slow last checkpoint  2 stages; one node writes its checkpoints 9 s
 *                     slower (TAH_NODE_TEST_CKPT_DELAY_MS: a slow disk), more
 *                     than the peer timeout (node timeout + 5 s = 6.5 s).
 *                     Its neighbour finishes and goes quiet meanwhile: that
 *                     is no loss. The job succeeds with no node_lost event
 *                     and no recovery.
 *   drain while loading  2 stages and a spare; the node of stage 1 takes
 *                     4 s longer to load its stage (TAH_NODE_TEST_LOAD_DELAY_MS)
 *                     and the node of stage 0 leaves meanwhile: the Drain
 *                     reaches a node still in LOADING. Both stages stop
 *                     after the same step (a `leave` event, no node_lost),
 *                     the spare takes stage 0 and the job succeeds.
 *   leave during re-adoption  2 stages and a spare; the coordinator is
 *                     stopped, the node of stage 1 is held (SIGSTOP) so that
 *                     it re-announces last, and the node of stage 0 is told
 *                     to leave while the coordinator is down (its LEAVING is
 *                     lost). The coordinator comes back and re-adopts stage
 *                     0 first; the leaver asks again, and once stage 1 is
 *                     back too the job drains: a `leave` event mid-job, the
 *                     spare takes stage 0, no node_lost, the job succeeds.
 *   signal while loading  the same, but the node told to leave (SIGTERM, as
 *                     Ctrl-C) is the one still loading its stage: it tells
 *                     the coordinator, keeps the Drain, runs up to it once
 *                     loaded and hands over (a `leave`, no node_left). First,
 *                     every thread of both nodes but their signal thread
 *                     must block SIGINT and SIGTERM.
 *   second signal while loading  a second SIGTERM stops that node at once
 *                     (node_left, rollback, the spare takes over) and it
 *                     exits 0: the neighbour's messages waiting in its data
 *                     socket stay unread (it has no guard to check them).
 *   drain / signal while fetching  a node held fetching its replica after a
 *                     resume (TAH_NODE_TEST_FETCH_DELAY_MS): a Drain caused
 *                     by another node's leave, or its own SIGTERM, stops
 *                     every stage after the same step, as above.
 *   lost message      a node does not send one data message (as a reset
 *                     connection loses what was in flight): every stage
 *                     waits while the nodes still ping each other; the
 *                     coordinator's stall watchdog rolls the job back on the
 *                     same nodes and it ends with tah-train's losses.
 *   stuck stage       a node's stage never finishes a step and never looks
 *                     at an abort again (a GPU call that does not return):
 *                     after the stall watchdog's abort and its own
 *                     --stop-timeout the node gives the stage up and exits
 *                     1; the spare takes the stage and the job ends with
 *                     tah-train's losses. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "rt_harness.h"

#define S_STEPS 240

static const char *s_job =
    "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = %d\nlr = 1e-3\n"
    "stages = %d\nmicro_batches = 2\nfwd_codec = fp32\nbwd_codec = fp32\ncheckpoint_every = 5\nseed = 11\n";

static void s_sleep(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    nanosleep(&ts, NULL);
}

static Tah__JobInfo *s_job_info(Tah__Envelope *e)
{
    return e && e->status_rep->n_jobs == 1 ? e->status_rep->jobs[0] : NULL;
}

/* Wait until the job's step reaches `step` (or it ends); returns the step. */
static int s_wait_step(rt_t *r, uint64_t job, int step, double timeout)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        Tah__Envelope *e = rt_status(r, job);
        Tah__JobInfo *j = s_job_info(e);
        int st = j ? j->step : -1;
        int ended = j && strcmp(j->state, "running") && strcmp(j->state, "paused") && strcmp(j->state, "queued");
        wire_envelope_free(&e);
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (st >= step || ended || (double)(t.tv_sec - t0.tv_sec) > timeout)
            return st;
        s_sleep(0.005);
    }
}

/* Wait until the job's record holds `count` events of `kind`. */
static int s_wait_event(rt_t *r, uint64_t job, const char *kind, int count, double timeout)
{
    for (double t = 0; t < timeout; t += 0.05) {
        Tah__Envelope *e = rt_status(r, job);
        Tah__JobInfo *j = s_job_info(e);
        int n = 0;
        for (size_t i = 0; j && i < j->n_events; i++)
            n += !strcmp(j->events[i]->kind, kind);
        wire_envelope_free(&e);
        if (n >= count)
            return 1;
        s_sleep(0.05);
    }
    return 0;
}

/* The job's node of a stage, as an index into r->names. */
static int s_node_of_stage(rt_t *r, uint64_t job, int stage)
{
    Tah__Envelope *e = rt_status(r, job);
    Tah__JobInfo *j = s_job_info(e);
    int idx = -1;
    for (int i = 0; j && (size_t)stage < j->n_nodes && i < r->nn; i++)
        if (!strcmp(r->names[i], j->nodes[stage]))
            idx = i;
    wire_envelope_free(&e);
    return idx;
}

static const char *const s_none[] = { NULL }; /* rt_spawn_node: no extra options */

/* Spawn node `name` with the options `extra` (rt_spawn_node) and the
 * fault-injection setting var=value in its environment alone; returns its
 * index into r->names. */
static int s_spawn_opts(rt_t *r, const char *name, const char *var, const char *value, const char *const extra[])
{
    setenv(var, value, 1);
    const int k = rt_spawn_node(r, name, extra);
    unsetenv(var);
    return k;
}

/* The same with no extra options. */
static int s_spawn_with(rt_t *r, const char *name, const char *var, const char *value)
{
    return s_spawn_opts(r, name, var, value, s_none);
}

/* Every step 1..steps once, in order (tah-train's lines are 1..steps), with
 * tah-train's loss, norm and LR. */
static void s_compare(const char *dist, const char *ref, int steps)
{
    static const char *const keys[] = { "step", "loss", "grad_norm", "lr" };
    const char *why = rt_metrics_diff(dist, ref, keys, 4, steps, 1e-6);
    if (why)
        fail_msg("after recovery vs uninterrupted: %s", why);
}

static void s_reference(rt_t *r, int stages, const char *ref)
{
    char train[700], out[4096], st[16], steps[16];
    snprintf(train, sizeof train, "%s/train.txt", r->dir);
    snprintf(st, sizeof st, "%d", stages);
    snprintf(steps, sizeof steps, "%d", S_STEPS);
    char *argv[] = { TAH_TRAIN_EXE, "--model", "4,2,64,32,256", "--train-data", train, "--batch", "2", "--seq", "16",
                     "--steps", steps, "--lr", "1e-3", "--stages", st, "--micro-batches", "2", "--seed", "11",
                     "--threads", "1", "--metrics", (char *)ref, "--quiet", NULL };
    int rc = rt_run(argv, out, sizeof out);
    if (rc != 0)
        fail_msg("tah-train failed (%d): %s", rc, out);
}

static void test_chaos_kill_and_leave(void **state)
{
    (void)state;
    const char *seed_env = getenv("TAH_CHAOS_SEED"); /* replays a run: the seed is printed below */
    unsigned seed = seed_env ? (unsigned)strtoul(seed_env, NULL, 10) : (unsigned)time(NULL);
    srand(seed);
    const int kill_at = 10 + rand() % 60, kill_stage = rand() % 4;
    printf("chaos: seed %u: SIGKILL the node of stage %d at step %d\n", seed, kill_stage, kill_at);
    rt_t r;
    rt_init(&r, "rt_chaos");
    rt_start_coord(&r, 1.5, 0);
    rt_start_nodes(&r, 5);
    char ini[1024], out[4096], st[64], reason[512];
    snprintf(ini, sizeof ini, s_job, S_STEPS, 4);
    uint64_t job = rt_submit(&r, rt_write(&r, "chaos.ini", ini), out, sizeof out);
    assert_true(job > 0);

    /* 1. SIGKILL */
    assert_true(s_wait_step(&r, job, kill_at, 60) >= kill_at);
    int victim = s_node_of_stage(&r, job, kill_stage);
    assert_true(victim >= 0);
    rt_kill_node(&r, victim, SIGKILL);
    if (!s_wait_event(&r, job, "resumed", 1, 30))
        fail_msg("no recovery after node %s was killed", r.names[victim]);

    /* 2. graceful leave of another node of the job, with no spare left */
    Tah__Envelope *e = rt_status(&r, job);
    int resumed_at = s_job_info(e)->step;
    wire_envelope_free(&e);
    assert_true(s_wait_step(&r, job, resumed_at + 20, 60) >= resumed_at + 20);
    const int leave_stage = (kill_stage + 1 + rand() % 3) % 4;
    int leaver = s_node_of_stage(&r, job, leave_stage);
    assert_true(leaver >= 0 && leaver != victim);
    char pidfile[700];
    snprintf(pidfile, sizeof pidfile, "%s/%s.pid", r.dir, r.names[leaver]);
    char *leave_argv[] = { TAH_NODE_EXE, "leave", "--pid-file", pidfile, "--timeout", "60", NULL };
    int lrc = rt_run(leave_argv, out, sizeof out);
    if (lrc != 0 || !strstr(out, "left"))
        fail_msg("tah-node leave: %d: %s", lrc, out);
    assert_int_equal(rt_node_exit(&r, leaver, 30), 0); /* it handed the stage over, then exited 0 */
    /* paused, naming the stage it waits for */
    char want[64];
    snprintf(want, sizeof want, "waiting for a node for stage %d", leave_stage);
    int waited = 0;
    char last[300] = "no status"; /* what the job said last, for the failure message */
    for (int i = 0; i < 200 && !waited; i++) {
        e = rt_status(&r, job);
        Tah__JobInfo *j = s_job_info(e);
        waited = j && !strcmp(j->state, "paused") && strstr(j->reason, want);
        if (j)
            snprintf(last, sizeof last, "state %s, reason \"%s\", step %d", j->state, j->reason, j->step);
        wire_envelope_free(&e);
        if (!waited)
            s_sleep(0.05);
    }
    if (!waited)
        fail_msg("the job does not wait for a node for stage %d after 10 s (last: %s)", leave_stage, last);
    rt_spawn_node(&r, "spare", s_none);

    /* 3. the job finishes as if nothing happened */
    assert_true(rt_wait_job(&r, job, 240, st, sizeof st, reason, sizeof reason));
    if (strcmp(st, "succeeded") != 0)
        fail_msg("job: %s: %s", st, reason);
    e = rt_status(&r, job);
    Tah__JobInfo *j = s_job_info(e);
    assert_non_null(j);
    char metrics[1200];
    snprintf(metrics, sizeof metrics, "%s", j->metrics_path);
    assert_int_equal(j->recoveries, 2);
    int lost_step = -1, leave_step = -1, resumed = 0, lost_events = 0;
    for (size_t i = 0; i < j->n_events; i++) {
        const Tah__EventInfo *ev = j->events[i];
        printf("event %s step %d node %s stage %d: %s\n", ev->kind, ev->step, ev->node, ev->stage, ev->detail);
        if (!strcmp(ev->kind, "node_lost") && !strcmp(ev->node, r.names[victim]) && ev->stage == kill_stage) {
            lost_step = ev->step;
            lost_events++;
        }
        if (!strcmp(ev->kind, "leave") && !strcmp(ev->node, r.names[leaver]) && ev->stage == leave_stage)
            leave_step = ev->step;
        resumed += !strcmp(ev->kind, "resumed");
    }
    wire_envelope_free(&e);
    /* one loss, one event: a neighbour's report and the heartbeat's verdict on the same node
     * (the resume waits for the latter) are not two losses */
    if (lost_events != 1)
        fail_msg("%d node_lost events for %s (stage %d), want 1", lost_events, r.names[victim], kill_stage);
    if (lost_step < kill_at || lost_step > S_STEPS)
        fail_msg("the record has no node_lost event for %s (stage %d) at step >= %d", r.names[victim], kill_stage,
                 kill_at);
    if (leave_step <= lost_step - 5 || leave_step > S_STEPS)
        fail_msg("the record has no leave event for %s (stage %d) with its step", r.names[leaver], leave_stage);
    assert_int_equal(resumed, 2);
    char ref[700];
    snprintf(ref, sizeof ref, "%s/chaos.ref.jsonl", r.dir);
    s_reference(&r, 4, ref);
    s_compare(metrics, ref, S_STEPS);
    assert_true(rt_log_has(&r, "spare.log", "from its checkpoint replica") ||
                rt_log_has(&r, "spare.log", "resuming stage"));
    assert_int_equal(rt_stop(&r), 0);
}

static void test_coordinator_restart_mid_job(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_restart_mid");
    rt_start_coord(&r, 5.0, 0);
    rt_start_nodes(&r, 2);
    char ini[1024], out[4096], st[64], reason[512];
    snprintf(ini, sizeof ini, s_job, S_STEPS, 2);
    uint64_t job = rt_submit(&r, rt_write(&r, "mid.ini", ini), out, sizeof out);
    assert_true(job > 0);
    int before = s_wait_step(&r, job, 40, 60);
    assert_true(before >= 40 && before < S_STEPS);
    int port = atoi(strrchr(r.ep, ':') + 1);
    assert_int_equal(rt_stop_coord(&r), 0);
    s_sleep(0.3); /* the nodes train on meanwhile */
    rt_start_coord(&r, 5.0, port);
    assert_true(rt_wait_job(&r, job, 240, st, sizeof st, reason, sizeof reason));
    if (strcmp(st, "succeeded") != 0)
        fail_msg("job after the restart: %s: %s", st, reason);
    Tah__Envelope *e = rt_status(&r, job);
    Tah__JobInfo *j = s_job_info(e);
    assert_non_null(j);
    char metrics[1200];
    snprintf(metrics, sizeof metrics, "%s", j->metrics_path);
    int restarts = 0, adopted = 0;
    for (size_t i = 0; i < j->n_events; i++) {
        restarts += !strcmp(j->events[i]->kind, "coordinator_restart");
        adopted += !strcmp(j->events[i]->kind, "adopted");
    }
    assert_int_equal(j->recoveries, 0); /* nothing rolled back */
    wire_envelope_free(&e);
    assert_int_equal(restarts, 1);
    assert_int_equal(adopted, 2);
    char ref[700];
    snprintf(ref, sizeof ref, "%s/mid.ref.jsonl", r.dir);
    s_reference(&r, 2, ref);
    s_compare(metrics, ref, S_STEPS);
    assert_int_equal(rt_stop(&r), 0);
}

static void test_slow_last_checkpoint(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_slow_ckpt");
    rt_start_coord(&r, 1.5, 0); /* the nodes' peer timeout: 1.5 + 5 s */
    rt_start_nodes(&r, 1);
    s_spawn_with(&r, "slow", "TAH_NODE_TEST_CKPT_DELAY_MS", "9000");
    assert_true(rt_wait_nodes(&r, "idle", 2, 30));
    /* one checkpoint, after the last step */
    char ini[1024], out[4096], st[64], reason[600];
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 30\n"
             "lr = 1e-3\nstages = 2\nmicro_batches = 2\nfwd_codec = fp32\nbwd_codec = fp32\n"
             "checkpoint_every = 30\nseed = 11\n");
    uint64_t job = rt_submit(&r, rt_write(&r, "slow.ini", ini), out, sizeof out);
    assert_true(job > 0);
    /* until it ends or records a loss (a wrong verdict leaves it paused, waiting for a node) */
    int lost = 0, recoveries = 0;
    snprintf(st, sizeof st, "no status");
    reason[0] = 0;
    for (double t = 0; t < 60 && !lost; t += 0.1) {
        Tah__Envelope *e = rt_status(&r, job);
        Tah__JobInfo *j = s_job_info(e);
        for (size_t i = 0; j && i < j->n_events; i++) {
            if (strcmp(j->events[i]->kind, "node_lost") == 0) {
                lost++;
                snprintf(reason, sizeof reason, "%.500s", j->events[i]->detail);
            }
        }
        if (j) {
            snprintf(st, sizeof st, "%s", j->state);
            recoveries = (int)j->recoveries;
        }
        int ended = j && strcmp(j->state, "running") && strcmp(j->state, "paused") && strcmp(j->state, "queued");
        if (ended && !lost)
            snprintf(reason, sizeof reason, "%.500s", j->reason);
        wire_envelope_free(&e);
        if (ended)
            break;
        s_sleep(0.1);
    }
    /* the premise: the slow node ran a stage (its runner logs the delay) */
    assert_true(rt_log_has(&r, "slow.log", "each checkpoint write takes 9000 ms longer"));
    if (strcmp(st, "succeeded") != 0 || lost || recoveries)
        fail_msg("a stage whose last checkpoint outlasted the peer timeout: job %s, %d node_lost events (%s), "
                 "%d recoveries (want succeeded, none)",
                 st, lost, reason, recoveries);
    assert_int_equal(rt_stop(&r), 0);
}

/* Events of the job by kind, and its state: until it records a leave or a
 * loss, then until it ends. */
typedef struct s_outcome {
    int leave, lost, left, leave_step, recoveries;
    char state[64], lost_detail[512], left_detail[512];
} s_outcome_t;

static s_outcome_t s_watch(rt_t *r, uint64_t job, double timeout)
{
    s_outcome_t o = { .leave_step = -1 };
    snprintf(o.state, sizeof o.state, "no status");
    for (double t = 0; t < timeout; t += 0.1) {
        Tah__Envelope *e = rt_status(r, job);
        Tah__JobInfo *j = s_job_info(e);
        o.leave = o.lost = o.left = 0;
        for (size_t i = 0; j && i < j->n_events; i++) {
            const Tah__EventInfo *ev = j->events[i];
            if (!strcmp(ev->kind, "leave")) {
                o.leave++;
                o.leave_step = ev->step;
            }
            if (!strcmp(ev->kind, "node_lost")) {
                o.lost++;
                snprintf(o.lost_detail, sizeof o.lost_detail, "%.500s", ev->detail);
            }
            if (!strcmp(ev->kind, "node_left")) { /* stopped without draining */
                o.left++;
                snprintf(o.left_detail, sizeof o.left_detail, "%.500s", ev->detail);
            }
        }
        int ended = 0;
        if (j) {
            snprintf(o.state, sizeof o.state, "%s", j->state);
            o.recoveries = (int)j->recoveries;
            ended = strcmp(j->state, "running") && strcmp(j->state, "paused") && strcmp(j->state, "queued");
        }
        wire_envelope_free(&e);
        if (ended || o.lost)
            break;
        s_sleep(0.1);
    }
    return o;
}

static void test_drain_while_loading(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_drain_load");
    rt_start_coord(&r, 1.5, 0); /* the nodes' peer timeout: 1.5 + 5 s */
    rt_start_nodes(&r, 1);      /* n0: stage 0, the leaver */
    s_spawn_with(&r, "slow", "TAH_NODE_TEST_LOAD_DELAY_MS", "4000"); /* stage 1 */
    assert_true(rt_wait_nodes(&r, "idle", 2, 30));
    rt_spawn_node(&r, "spare", s_none); /* joins last: not placed first */
    assert_true(rt_wait_nodes(&r, "idle", 3, 30));
    char ini[1024], out[4096];
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 20\n"
             "lr = 1e-3\nstages = 2\nmicro_batches = 2\nfwd_codec = fp32\nbwd_codec = fp32\n"
             "checkpoint_every = 5\nseed = 11\n");
    uint64_t job = rt_submit(&r, rt_write(&r, "load.ini", ini), out, sizeof out);
    assert_true(job > 0);
    /* n0 runs stage 0 (waiting in step 1 for stage 1); slow is loading */
    int ready = 0;
    for (int i = 0; i < 300 && !ready; i++) {
        ready = rt_log_has(&r, "n0.log", "stage 0 running") &&
                rt_log_has(&r, "slow.log", "loading stage 1 takes 4000 ms longer");
        if (!ready)
            s_sleep(0.05);
    }
    assert_true(ready);
    rt_kill_node(&r, 0, SIGTERM); /* graceful leave */
    int drained = 0;
    for (int i = 0; i < 100 && !drained; i++) {
        drained = rt_log_has(&r, "coord.log", "draining at the end of step 1");
        if (!drained)
            s_sleep(0.02);
    }
    /* the premise: the coordinator sent Drain(1) while slow was still loading */
    assert_true(drained);
    assert_false(rt_log_has(&r, "slow.log", "stage 1 running"));
    s_outcome_t o = s_watch(&r, job, 60);
    if (o.lost || o.leave != 1 || o.leave_step != 1)
        fail_msg("a leave while a stage loads: %d node_lost events (%s), %d leave events (step %d), job %s "
                 "(want 1 leave after step 1, no node_lost)",
                 o.lost, o.lost_detail, o.leave, o.leave_step, o.state);
    assert_int_equal(rt_node_exit(&r, 0, 30), 0); /* n0 handed its stage over, then exited 0 */
    char st[64], reason[512];
    assert_true(rt_wait_job(&r, job, 60, st, sizeof st, reason, sizeof reason));
    if (strcmp(st, "succeeded") != 0)
        fail_msg("job after the leave: %s: %s", st, reason);
    assert_true(rt_log_has(&r, "spare.log", "resuming stage 0"));
    assert_int_equal(rt_stop(&r), 0);
}

/* Whether every thread of process pid but "tah-signals" blocks SIGINT and
 * SIGTERM (its /proc status's SigBlk); *n: how many threads it has.
 * tah-node takes them in that one thread's sigwait (which unblocks them
 * while it waits), so that no signal ends a ZeroMQ call in another (EINTR
 * in the middle of a multi-part message lost the message). */
static int s_threads_block_signals(pid_t pid, int *n)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%ld/task", (long)pid);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int all = 1;
    *n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[384], line[256], name[64] = "";
        snprintf(path, sizeof path, "%s/%s/status", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* the thread ended meanwhile */
        unsigned long long blk = 0;
        int found = 0;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "SigBlk: %llx", &blk) == 1)
                found = 1;
            sscanf(line, "Name: %63s", name);
        }
        fclose(f);
        (*n)++;
        if (!strcmp(name, "tah-signals"))
            continue;
        const unsigned long long want = (1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1));
        if (!found || (blk & want) != want) {
            fprintf(stderr, "thread %s (%s) of pid %ld: SigBlk %llx\n", e->d_name, name, (long)pid, blk);
            all = 0;
        }
    }
    closedir(d);
    return all;
}

/* SIGTERM (Ctrl-C) to a node that is still loading its stage: the same
 * graceful leave as in a running stage. The leaver itself is in LOADING
 * (TAH_NODE_TEST_LOAD_DELAY_MS holds it there); it tells the coordinator,
 * takes the Drain in, runs step 1 with its neighbour once loaded, drains,
 * and the spare takes its stage: a `leave` event, no node_left (a stop
 * without draining, which rolls back) and no node_lost. */
static void test_signal_while_loading(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_sig_load");
    rt_start_coord(&r, 3.0, 0); /* peer timeout 8 s: stage 0 waits in step 1 for the 4 s load */
    setenv("OPENBLAS_NUM_THREADS", "1", 1); /* no pool started before main, whose threads take signals */
    rt_start_nodes(&r, 1);                  /* n0: stage 0 */
    int slow = s_spawn_with(&r, "slow", "TAH_NODE_TEST_LOAD_DELAY_MS", "4000"); /* stage 1, the leaver */
    unsetenv("OPENBLAS_NUM_THREADS");
    assert_true(rt_wait_nodes(&r, "idle", 2, 30));
    rt_spawn_node(&r, "spare", s_none); /* joins last: not placed first */
    assert_true(rt_wait_nodes(&r, "idle", 3, 30));
    char ini[1024], out[4096];
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 20\n"
             "lr = 1e-3\nstages = 2\nmicro_batches = 2\nfwd_codec = fp32\nbwd_codec = fp32\n"
             "checkpoint_every = 5\nseed = 11\n");
    uint64_t job = rt_submit(&r, rt_write(&r, "sigload.ini", ini), out, sizeof out);
    assert_true(job > 0);
    int loading = 0;
    for (int i = 0; i < 300 && !loading; i++) {
        loading = rt_log_has(&r, "slow.log", "loading stage 1 takes 4000 ms longer");
        if (!loading)
            s_sleep(0.05);
    }
    assert_true(loading);
    for (int i = 0; i < 2; i++) { /* n0 runs stage 0, slow loads stage 1: each has its runner thread */
        int nt = 0;
        if (!s_threads_block_signals(r.nodes[i == 0 ? 0 : slow], &nt) || nt < 4)
            fail_msg("node %d: a thread that can take SIGINT or SIGTERM in a handler (%d threads; want >= 4: "
                     "main, signals, runner, ZeroMQ's)", i, nt);
    }
    rt_kill_node(&r, slow, SIGTERM); /* Ctrl-C while it loads */
    int handled = 0;
    for (int i = 0; i < 100 && !handled; i++) {
        handled = rt_log_has(&r, "slow.log", "signal 15");
        if (!handled)
            s_sleep(0.02);
    }
    /* the premise: the agent took the signal while its stage was still loading */
    assert_true(handled);
    assert_false(rt_log_has(&r, "slow.log", "stage 1 running"));
    s_outcome_t o = s_watch(&r, job, 60);
    if (o.lost || o.left || o.leave != 1 || o.leave_step != 1 || strcmp(o.state, "succeeded") != 0 ||
        o.recoveries != 1)
        fail_msg("SIGTERM while loading: %d leave events (step %d), %d node_left (%s), %d node_lost (%s), "
                 "%d recoveries, job %s (want 1 leave after step 1, no node_left or node_lost, 1 recovery, "
                 "succeeded)",
                 o.leave, o.leave_step, o.left, o.left_detail, o.lost, o.lost_detail, o.recoveries, o.state);
    assert_int_equal(rt_node_exit(&r, slow, 30), 0); /* it handed its stage over, then exited 0 */
    assert_true(rt_log_has(&r, "spare.log", "resuming stage 1"));
    assert_int_equal(rt_stop(&r), 0);
}

static void test_leave_during_readoption(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_leave_readopt");
    /* node timeout 3 s (peer timeout 8 s, re-adoption deadline 11 s). Until sends stopped
     * blocking (node/shape.h), stage 1's agent could block up to 3 s on a send to the leaving
     * stage 0 right after its drain, without heartbeats, and was declared lost here once in
     * five CI runs (round 32) */
    rt_start_coord(&r, 3.0, 0);
    rt_start_nodes(&r, 3); /* n0, n1 run the job; n2 is the spare */
    char ini[1024], out[4096];
    snprintf(ini, sizeof ini, s_job, S_STEPS, 2);
    uint64_t job = rt_submit(&r, rt_write(&r, "readopt.ini", ini), out, sizeof out);
    assert_true(job > 0);
    assert_true(s_wait_step(&r, job, 20, 60) >= 20);
    int port = atoi(strrchr(r.ep, ':') + 1);
    assert_int_equal(rt_stop_coord(&r), 0);
    rt_kill_node(&r, 1, SIGSTOP); /* stage 1 re-announces only after SIGCONT (< 8 s: its neighbour's patience) */
    rt_kill_node(&r, 0, SIGTERM); /* graceful leave, asked while the coordinator is down */
    int asked = 0;
    for (int i = 0; i < 100 && !asked; i++) {
        asked = rt_log_has(&r, "n0.log", "leaving after the coordinator moves stage 0");
        if (!asked)
            s_sleep(0.02);
    }
    assert_true(asked);
    rt_start_coord(&r, 3.0, port);
    /* stage 0 re-adopted, stage 1 not yet: the job is still re-adopting */
    int adopted = s_wait_event(&r, job, "adopted", 1, 10);
    Tah__Envelope *e = rt_status(&r, job);
    Tah__JobInfo *j = s_job_info(e);
    int paused = j && !strcmp(j->state, "paused");
    wire_envelope_free(&e);
    for (int i = 0; i < 60 && !rt_log_has(&r, "coord.log", "n0 asks to leave"); i++)
        s_sleep(0.05); /* its LEAVING again, with the fix; without it, none comes */
    rt_kill_node(&r, 1, SIGCONT);
    assert_true(adopted);
    assert_true(paused);
    s_outcome_t o = s_watch(&r, job, 120);
    if (o.lost || o.leave != 1 || o.leave_step <= 20 || o.leave_step >= S_STEPS || strcmp(o.state, "succeeded"))
        fail_msg("a leave during re-adoption: %d leave events (step %d), %d node_lost events (%s), job %s "
                 "(want 1 leave mid-job, no node_lost, succeeded)",
                 o.leave, o.leave_step, o.lost, o.lost_detail, o.state);
    assert_int_equal(rt_node_exit(&r, 0, 30), 0); /* n0 handed its stage over, then exited 0 */
    assert_true(rt_log_has(&r, "n2.log", "resuming stage 0"));
    assert_int_equal(rt_stop(&r), 0);
}

/* Wait until DIR/name contains text (polling every 20 ms). */
static int s_wait_log(rt_t *r, const char *name, const char *text, double timeout)
{
    for (double t = 0; t < timeout; t += 0.02) {
        if (rt_log_has(r, name, text))
            return 1;
        s_sleep(0.02);
    }
    return 0;
}

/* A node held in FETCHING: "slow" runs stage 0 and starts fetching each
 * checkpoint replica 3 s late (TAH_NODE_TEST_FETCH_DELAY_MS); n1 (stage 1)
 * leaves early in the job, so the job resumes from the drained step: the
 * spare sp1 takes stage 1 and slow, kept for stage 0, fetches its replica.
 * Returns with slow in that wait and sp1 running (waiting for stage 0 in
 * the next step; its peer timeout, 3 + 5 s, outlasts the wait). sp2 is a
 * second spare. */
static uint64_t s_fetch_setup(rt_t *r, const char *name)
{
    rt_init(r, name);
    rt_start_coord(r, 3.0, 0);
    s_spawn_with(r, "slow", "TAH_NODE_TEST_FETCH_DELAY_MS", "3000"); /* index 0, stage 0 */
    assert_true(rt_wait_nodes(r, "idle", 1, 30));
    rt_spawn_node(r, "n1", s_none); /* index 1, stage 1 */
    assert_true(rt_wait_nodes(r, "idle", 2, 30));
    rt_spawn_node(r, "sp1", s_none); /* index 2 */
    assert_true(rt_wait_nodes(r, "idle", 3, 30));
    rt_spawn_node(r, "sp2", s_none); /* index 3 */
    assert_true(rt_wait_nodes(r, "idle", 4, 30));
    char ini[1024], out[4096];
    snprintf(ini, sizeof ini, s_job, S_STEPS, 2);
    uint64_t job = rt_submit(r, rt_write(r, "fetch.ini", ini), out, sizeof out);
    assert_true(job > 0);
    assert_true(s_wait_step(r, job, 3, 60) >= 3);
    rt_kill_node(r, 1, SIGTERM); /* n1 leaves while running: the job resumes from the drained step */
    if (!s_wait_log(r, "slow.log", "fetching the replica of stage 0 starts 3000 ms late", 30))
        fail_msg("the node of stage 0 did not start fetching a replica after n1 left");
    if (!s_wait_log(r, "sp1.log", "stage 1 running", 10))
        fail_msg("the spare did not take stage 1 after n1 left");
    assert_int_equal(rt_node_exit(r, 1, 30), 0); /* n1 handed its stage over, then exited 0 */
    return job;
}

/* A Drain that reaches a node still fetching its replica (the fetching
 * half of test_drain_while_loading): sp1, running stage 1, leaves while
 * slow waits to fetch. slow keeps the Drain for its runner, so both stop
 * after the same step: a second `leave`, no node_lost, sp2 takes stage 1. */
static void test_drain_while_fetching(void **state)
{
    (void)state;
    rt_t r;
    uint64_t job = s_fetch_setup(&r, "rt_drain_fetch");
    rt_kill_node(&r, 2, SIGTERM); /* sp1 leaves */
    /* the premise: the coordinator sent the Drain while slow was still fetching */
    assert_true(s_wait_log(&r, "coord.log", "node sp1 (stage 1) leaves", 10));
    assert_false(rt_log_has(&r, "slow.log", "resuming stage 0 from"));
    s_outcome_t o = s_watch(&r, job, 120);
    if (o.lost || o.left || o.leave != 2 || strcmp(o.state, "succeeded") != 0)
        fail_msg("a Drain while a stage is fetched: %d leave events (last at step %d), %d node_lost (%s), "
                 "%d node_left (%s), job %s (want 2 leaves, no node_lost or node_left, succeeded)",
                 o.leave, o.leave_step, o.lost, o.lost_detail, o.left, o.left_detail, o.state);
    assert_true(rt_log_has(&r, "slow.log", "(stage 0 still fetching)"));
    assert_int_equal(rt_node_exit(&r, 2, 30), 0); /* sp1 handed its stage over, then exited 0 */
    assert_true(rt_log_has(&r, "sp2.log", "resuming stage 1"));
    assert_int_equal(rt_stop(&r), 0);
}

/* SIGTERM (Ctrl-C) to a node that is still fetching its replica: the
 * graceful leave of a running stage (test_signal_while_loading's fetching
 * half). slow tells the coordinator, keeps the Drain for its runner, then
 * fetches, loads, runs the drain step with sp1 and hands stage 0 to sp2. */
static void test_signal_while_fetching(void **state)
{
    (void)state;
    rt_t r;
    uint64_t job = s_fetch_setup(&r, "rt_sig_fetch");
    rt_kill_node(&r, 0, SIGTERM); /* slow: Ctrl-C while it fetches */
    /* the premise: the agent took the signal before the replica was in */
    assert_true(s_wait_log(&r, "slow.log", "signal 15", 10));
    assert_false(rt_log_has(&r, "slow.log", "resuming stage 0 from"));
    s_outcome_t o = s_watch(&r, job, 120);
    if (o.lost || o.left || o.leave != 2 || strcmp(o.state, "succeeded") != 0)
        fail_msg("SIGTERM while fetching: %d leave events (last at step %d), %d node_left (%s), %d node_lost (%s), "
                 "job %s (want 2 leaves, no node_left or node_lost, succeeded)",
                 o.leave, o.leave_step, o.left, o.left_detail, o.lost, o.lost_detail, o.state);
    assert_int_equal(rt_node_exit(&r, 0, 30), 0); /* slow handed its stage over, then exited 0 */
    assert_true(rt_log_has(&r, "sp2.log", "resuming stage 0"));
    assert_int_equal(rt_stop(&r), 0);
}

/* Submit the 2-stage job with stall_timeout = 3 s as `file` and wait for it
 * to succeed; returns its id. */
static uint64_t s_run_stall_job(rt_t *r, const char *file)
{
    char ini[1024], out[4096], st[64], reason[512];
    int n = snprintf(ini, sizeof ini, s_job, S_STEPS, 2);
    snprintf(ini + n, sizeof ini - (size_t)n, "stall_timeout = 3\n");
    uint64_t job = rt_submit(r, rt_write(r, file, ini), out, sizeof out);
    assert_true(job > 0);
    assert_true(rt_wait_job(r, job, 120, st, sizeof st, reason, sizeof reason));
    if (strcmp(st, "succeeded") != 0)
        fail_msg("job: %s: %s", st, reason);
    return job;
}

/* The job's metrics.jsonl against an uninterrupted 2-stage tah-train run
 * (written as DIR/ref). */
static void s_same_losses(rt_t *r, uint64_t job, const char *ref)
{
    Tah__Envelope *e = rt_status(r, job);
    Tah__JobInfo *j = s_job_info(e);
    assert_non_null(j);
    char metrics[1200], path[700];
    snprintf(metrics, sizeof metrics, "%s", j->metrics_path);
    wire_envelope_free(&e);
    snprintf(path, sizeof path, "%s/%s", r->dir, ref);
    s_reference(r, 2, path);
    s_compare(metrics, path, S_STEPS);
}

/* A data message lost between stages (TAH_NODE_TEST_DROP_STEP: the node of
 * stage 1 does not send its first message of step 8) leaves both stages
 * waiting while their agents still ping each other. The coordinator's stall
 * watchdog (stall_timeout = 3 s) rolls the job back to the last checkpoint
 * set on the same nodes, and the job ends with tah-train's losses. */
static void test_lost_message_stall(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_stall");
    rt_start_coord(&r, 3.0, 0);
    rt_start_nodes(&r, 1); /* n0: stage 0 */
    s_spawn_with(&r, "lossy", "TAH_NODE_TEST_DROP_STEP", "8"); /* stage 1 */
    assert_true(rt_wait_nodes(&r, "idle", 2, 30));
    uint64_t job = s_run_stall_job(&r, "stall.ini");
    assert_true(rt_log_has(&r, "lossy.log", "TAH_NODE_TEST_DROP_STEP"));
    Tah__Envelope *e = rt_status(&r, job);
    Tah__JobInfo *j = s_job_info(e);
    assert_non_null(j);
    int stalled = 0, lost = 0, resumed = 0;
    for (size_t i = 0; i < j->n_events; i++) {
        const Tah__EventInfo *ev = j->events[i];
        printf("event %s step %d node %s stage %d: %s\n", ev->kind, ev->step, ev->node, ev->stage, ev->detail);
        stalled += !strcmp(ev->kind, "stalled") && ev->step == 8 && strstr(ev->detail, "stalled in step 8");
        lost += !strcmp(ev->kind, "node_lost") || !strcmp(ev->kind, "node_left");
        resumed += !strcmp(ev->kind, "resumed") && strstr(ev->detail, "same nodes") != NULL;
    }
    wire_envelope_free(&e);
    if (stalled != 1 || lost || resumed < 1)
        fail_msg("%d stalled events at step 8, %d lost nodes, %d resumes on the same nodes (want 1, 0, >= 1)",
                 stalled, lost, resumed);
    s_same_losses(&r, job, "stall.ref.jsonl");
    assert_int_equal(rt_stop(&r), 0);
}

/* A stage stuck for good (TAH_NODE_TEST_HANG_STEP: the node of stage 1
 * never finishes step 8 and never looks at an abort again, as in a GPU call
 * that does not return). The coordinator's stall watchdog (stall_timeout =
 * 3 s) aborts both stages; the stuck node's agent waits out its
 * --stop-timeout (2 s), tells the coordinator that it gives stage 1 up and
 * exits with status 1. The coordinator does not place it again: the spare
 * takes stage 1 in the rollback, and the job ends with tah-train's losses. */
static void test_stuck_stage(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_stuck");
    rt_start_coord(&r, 3.0, 0);
    rt_start_nodes(&r, 1); /* n0: stage 0 */
    static const char *const stop2[] = { "--stop-timeout", "2", NULL };
    const int stuck = s_spawn_opts(&r, "stuck", "TAH_NODE_TEST_HANG_STEP", "8", stop2); /* stage 1 */
    assert_true(rt_wait_nodes(&r, "idle", 2, 30));
    rt_spawn_node(&r, "spare", s_none);
    assert_true(rt_wait_nodes(&r, "idle", 3, 30));
    uint64_t job = s_run_stall_job(&r, "stuck.ini");
    int rc = rt_node_exit(&r, stuck, 30);
    if (rc != 1)
        fail_msg("the stuck node exited with %d (want 1: it gave its stage up)", rc);
    assert_true(rt_log_has(&r, "stuck.log", "TAH_NODE_TEST_HANG_STEP: stage 1 hangs"));
    assert_true(rt_log_has(&r, "stuck.log", "stage 1 stuck in step 8: no stop 2 s after the request"));
    assert_true(rt_log_has(&r, "coord.log", "node stuck gives up stage 1 and exits"));
    Tah__Envelope *e = rt_status(&r, job);
    Tah__JobInfo *j = s_job_info(e);
    assert_non_null(j);
    int stalled = 0, moved = 0;
    for (size_t i = 0; i < j->n_events; i++) {
        const Tah__EventInfo *ev = j->events[i];
        printf("event %s step %d node %s stage %d: %s\n", ev->kind, ev->step, ev->node, ev->stage, ev->detail);
        stalled += !strcmp(ev->kind, "stalled") && ev->step == 8;
        moved += !strcmp(ev->kind, "resumed") && strstr(ev->detail, "stage 1: stuck -> spare") != NULL;
    }
    wire_envelope_free(&e);
    if (stalled != 1 || moved != 1)
        fail_msg("%d stalled events at step 8, %d resumes moving stage 1 to the spare (want 1, 1)", stalled, moved);
    s_same_losses(&r, job, "stuck.ref.jsonl");
    assert_int_equal(rt_stop(&r), 0);
}

/* A second signal is a hard stop, also while the stage loads: the node
 * stops at once (event node_left, the job rolls back and the spare takes
 * the stage), and exits 0. Its neighbour's messages already wait in its
 * data socket; a stage stopped before its links were up must leave them
 * unread (it has no guard to check them with). */
static void test_second_signal_while_loading(void **state)
{
    (void)state;
    rt_t r;
    rt_init(&r, "rt_sig2_load");
    rt_start_coord(&r, 3.0, 0);
    rt_start_nodes(&r, 1); /* n0: stage 0 */
    int slow = s_spawn_with(&r, "slow", "TAH_NODE_TEST_LOAD_DELAY_MS", "4000"); /* stage 1 */
    assert_true(rt_wait_nodes(&r, "idle", 2, 30));
    rt_spawn_node(&r, "spare", s_none);
    assert_true(rt_wait_nodes(&r, "idle", 3, 30));
    char ini[1024], out[4096];
    snprintf(ini, sizeof ini,
             "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 20\n"
             "lr = 1e-3\nstages = 2\nmicro_batches = 2\nfwd_codec = fp32\nbwd_codec = fp32\n"
             "checkpoint_every = 5\nseed = 11\n");
    uint64_t job = rt_submit(&r, rt_write(&r, "sig2.ini", ini), out, sizeof out);
    assert_true(job > 0);
    /* n0 runs step 1 and sends its activations towards slow, which loads */
    assert_true(s_wait_log(&r, "n0.log", "stage 0 running", 15));
    assert_true(s_wait_log(&r, "slow.log", "loading stage 1 takes 4000 ms longer", 15));
    rt_kill_node(&r, slow, SIGTERM);
    assert_true(s_wait_log(&r, "slow.log", "signal 15", 10));
    rt_kill_node(&r, slow, SIGTERM); /* again: stop now */
    int rc = rt_node_exit(&r, slow, 30);
    if (rc != 0)
        fail_msg("a second SIGTERM while loading: the node exited with %d (want 0; 139 = SIGSEGV)", rc);
    assert_false(rt_log_has(&r, "slow.log", "stage 1 running")); /* premise: it never got past loading */
    s_outcome_t o = s_watch(&r, job, 60);
    if (o.lost || o.left != 1 || o.leave || strcmp(o.state, "succeeded") != 0)
        fail_msg("a second SIGTERM while loading: %d node_left, %d leave, %d node_lost (%s), job %s (want 1 "
                 "node_left, succeeded)",
                 o.left, o.leave, o.lost, o.lost_detail, o.state);
    assert_true(rt_log_has(&r, "spare.log", "assigned stage 1"));
    assert_int_equal(rt_stop(&r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chaos_kill_and_leave),
        cmocka_unit_test(test_coordinator_restart_mid_job),
        cmocka_unit_test(test_slow_last_checkpoint),
        cmocka_unit_test(test_drain_while_loading),
        cmocka_unit_test(test_leave_during_readoption),
        cmocka_unit_test(test_signal_while_loading),
        cmocka_unit_test(test_second_signal_while_loading),
        cmocka_unit_test(test_drain_while_fetching),
        cmocka_unit_test(test_signal_while_fetching),
        cmocka_unit_test(test_lost_message_stall),
        cmocka_unit_test(test_stuck_stage),
    };
    const char *only = getenv("TAH_TEST_FILTER"); /* one test by name (a glob), e.g. test_drain_while_loading */
    if (only)
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
