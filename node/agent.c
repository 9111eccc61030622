/* agent.c — tah-node's I/O thread: one zmq_poll loop over the coordinator
 * link, the data-plane sockets and the pipe to the runner (see node.h).
 *
 * Node state machine (state, event -> action, next state):
 *   ANNOUNCING  welcome                -> log                          IDLE
 *               (every 2 s)            -> send hello again             ANNOUNCING
 *   IDLE        assign                 -> start runner                 LOADING
 *               assign(resume_step)    -> CkptGet(0)                   FETCHING
 *               error(reannounce)      -> send hello                   ANNOUNCING
 *   FETCHING    ckpt_chunk             -> store; CkptGet(next) or, with the whole
 *                                         replica, start runner         LOADING
 *               drain(D)               -> runner will stop after D     FETCHING
 *               SIGINT, SIGTERM        -> job event LEAVING, as RUNNING FETCHING
 *   LOADING     pipe 'Y'               -> connect neighbours, hello    RUNNING
 *               drain(D)               -> runner will stop after D     LOADING
 *               SIGINT, SIGTERM        -> job event LEAVING, as RUNNING LOADING
 *               pipe 'X'               -> job event failed             IDLE
 *   RUNNING     data message           -> validate; 'D' to runner or reject + count
 *               pipe 'S' / 'R'         -> send to neighbour / coordinator
 *               pipe 'X'               -> job event done/failed        IDLE
 *               pipe 'C'               -> replicate the checkpoint (CkptPut chunks)
 *               drain(D)               -> runner stops after step D    RUNNING
 *               SIGINT, SIGTERM        -> job event LEAVING (the coordinator
 *                                         answers with drain)           RUNNING
 *               pipe 'X' (drained)     -> once replicated: DRAINED     IDLE (or exit if leaving)
 *               error(reannounce)      -> hello naming the job: a restarted
 *                                         coordinator re-adopts it      RUNNING
 *               welcome(adopted)       -> resend the reports it missed, and
 *                                         LEAVING again if leaving      RUNNING
 *               abort / peer silent /
 *               coordinator silent /
 *               second signal          -> 'A' to runner                STOPPING
 *   STOPPING    pipe 'X'               -> job event aborted/failed     IDLE (or exit)
 * A second signal while FETCHING, LOADING or RUNNING stops at once (as
 * the coordinator's Abort does: FETCHING -> IDLE, else STOPPING).
 * A neighbour is "silent" (no message for the job's peer timeout) only
 * while the runner is in its step loop: after it, only our last checkpoint
 * is left to write and replicate, and finished neighbours go quiet.
 * The data ROUTER is read only while RUNNING, and while STOPPING a stage
 * that got that far (its links and guard exist): a neighbour's hello that
 * arrives before this node has its assignment waits in ZeroMQ's queue
 * instead of being rejected, and a stage stopped while still loading
 * leaves its neighbours' messages unread (it has no guard to check them).
 *
 * Outgoing links (shape.h): every data message goes through its link's
 * FIFO and leaves it without blocking (s_flush): on a shaped link (job keys
 * link_rate_mbps, link_delay_ms) at its release time, which the poll
 * timeout wakes the loop for; at once otherwise, unless the neighbour's
 * socket queue is full (then tried again every 2 ms, and the job fails
 * after S_SEND_TIMEOUT_MS) or the neighbour has not connected yet (then it
 * waits; the peer timeout bounds that). While a FIFO is full the pipe is
 * not read, so the runner blocks (back-pressure). A runner that finishes while
 * messages still wait ('X') is handled once they are out: its neighbours
 * need them. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "crc32c.h"  /* crc32c_update: checkpoint replicas */
#include "errors.h"
#include "fileio.h"  /* tah_file_read, tah_file_write_atomic */
#include "guard.h"   /* guard_admit: replays, norm bound */
#include "jobfile.h" /* jobfile_parse: the job's link settings */
#include "keys.h"    /* keys_read_public, keys_read_secret, keys_set_client */
#include "linkspec.h"
#include "log.h"
#include "node.h"
#include "shape.h" /* shape_link_*, shape_queue_* */
#include "wire.h"

enum { A_ANNOUNCING, A_IDLE, A_FETCHING, A_LOADING, A_RUNNING, A_STOPPING };
static const char *s_state_name[] = { "announcing", "idle", "fetching", "loading", "running", "stopping" };

#define S_CKPT_CHUNK (512u << 10) /* CkptPut / CkptChunk payload */
#define S_UPLOADS 4               /* checkpoints waiting to be replicated */
#define S_BACKLOG 1024            /* step reports kept for a restarted coordinator */
#define S_FETCH_TIMEOUT_S 30.0

#define S_MAX_PEERS 4
/* A send that cannot enter a neighbour's queue this long fails the job
 * (the neighbour stopped reading). Sends never block (s_flush), so our
 * heartbeats flow meanwhile. */
#define S_SEND_TIMEOUT_MS 3000
#define S_HELD_RETRY_S 0.002 /* how often a refused send is tried again */

typedef struct s_peer {     /* a neighbour that connected to our ROUTER */
    int stage;
    uint8_t rid[256];
    size_t rid_len;
} s_peer_t;

typedef struct agent {
    const node_opts_t *o;
    void *ctx, *coord, *router, *pipe;
    void *down, *tied;      /* DEALERs to stage k+1 and (first stage) to the last */
    char endpoint[300];
    char name[64];
    int state;
    double gflops;
    double last_coord, last_hello, last_beat, last_ping;
    node_job_t *job;
    pthread_t thread;
    int thread_started;
    s_peer_t peers[S_MAX_PEERS];
    int npeers;
    double heard[3];              /* last message from: [0] upstream [1] downstream [2] tied partner */
    int stop_kind;          /* NODE_ABORTED or NODE_FAILED while STOPPING */
    double stop_at;         /* when STOPPING began */
    double runner_mark;     /* the runner's start or its latest step report */
    double runner_gap;      /* the longest time between those in this job (s_tick: a stuck runner) */
    int lost_stage;
    char stop_reason[512];
    atomic_ullong rejected;
    char last_reject[512];
    int exiting;
    int hello_after_stop;   /* the coordinator forgot us: announce once the job is stopped */
    int unanswered;         /* hellos without an answer since the last welcome */
    int secure;             /* CURVE: coordinator link, data ROUTER (server), neighbour DEALERs */
    keys_pair_t kp;         /* this node's key pair when secure */
    void *zap;              /* ROUTER on inproc://zeromq.zap.01: admits the data ROUTER's peers */
    struct s_zap_wait {     /* ZAP requests waiting for an assignment that names their key */
        uint8_t rid[64], reqid[64];
        size_t rid_len, reqid_len;
        char key[KEYS_Z85_LEN + 1];
        double since;
    } zapq[16];
    int nzap;
    shape_link_t shp[4];    /* per NODE_DEST_*: in-process rate and delay */
    shape_queue_t *q[4];    /* messages waiting for their release time (NULL: link not shaped) */
    int exit_pending;       /* the runner sent 'X' while messages still waited */
    unsigned pipe_gen;      /* the runner pipe of job n is inproc://runner-n */
    char pipe_ep[64];
    guard_t *guard;         /* replay window and norm bound of the running job */
    uint64_t bad[3];        /* rejected messages per neighbour, indexed like heard[] */
    double last_report[3];  /* when the latest PeerReport about it went out */
    struct s_upload {       /* a checkpoint being replicated to the coordinator */
        uint8_t *buf;
        size_t len, off;
        uint32_t crc;
        uint64_t job;
        int stage, step;
        double progress;    /* last chunk sent */
    } up[S_UPLOADS];
    int nup;
    struct s_fetch {        /* the replica an Assign resumes from */
        uint8_t *buf;
        size_t len, off;
        uint32_t crc;
        int step;
        double progress;
        double start_at;    /* > 0: the first CkptGet waits until then (TAH_NODE_TEST_FETCH_DELAY_MS) */
    } fetch;
    long fetch_delay_ms;    /* TAH_NODE_TEST_FETCH_DELAY_MS: fault injection for tests (a slow control link) */
    int leaving;            /* SIGTERM with a stage (fetching, loading or running): LEAVING sent,
                               waiting for Drain */
    int readopt;            /* hello naming our running job sent to a restarted coordinator */
    double leave_wait;      /* > 0: DRAINED sent while leaving; waiting for the coordinator's Ok */
    struct s_backlog {      /* the latest step reports (packed Envelopes) */
        int step;
        uint8_t *buf;
        size_t len;
    } backlog[S_BACKLOG];
    int nbacklog;
} agent_t;

/* SIGINT and SIGTERM ask the node to leave. node_agent_run blocks them
 * before it starts any thread (ZeroMQ's, the runner, OpenMP's team), so
 * every thread inherits the block, and one thread takes them in sigwait. A
 * signal handled by a thread inside a ZeroMQ call ends that call with EINTR:
 * a multi-part message cut there was lost, and the runner waiting for it
 * waited for ever while both agents still pinged. The handler stays for
 * threads a library started earlier (OpenBLAS's pool): a signal delivered
 * there only sets the flag too. */
static atomic_int s_signal;
static sigset_t s_sigset; /* SIGINT, SIGTERM */

static void s_on_signal(int sig)
{
    atomic_store(&s_signal, sig);
}

static void *s_signal_main(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "tah-signals"); /* while it waits, its SigBlk in /proc lacks the two */
    for (;;) { /* sigwait is a cancellation point: node_agent_run cancels us */
        int sig;
        if (sigwait(&s_sigset, &sig) == 0)
            atomic_store(&s_signal, sig);
    }
    return NULL;
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- coordinator link ---- */

static void s_send_coord(agent_t *a, Tah__Envelope *env)
{
    if (wire_send_envelope(a->coord, NULL, 0, env, ZMQ_DONTWAIT) != 0)
        log_debug("send %s to the coordinator failed: %s", wire_body_name(env), zmq_strerror(errno));
}

static void s_send_hello(agent_t *a)
{
    Tah__Hello h = TAH__HELLO__INIT;
    h.name = a->name;
    h.endpoint = a->endpoint;
    char backend[16]; /* the coordinator takes < 16 characters */
    if (a->o->cuda && a->o->ndevices > 0) {
        char list[64];
        int n = snprintf(list, sizeof list, "cuda:%d", a->o->devices[0]);
        for (int r = 1; r < a->o->ndevices && n > 0 && (size_t)n < sizeof list; r++)
            n += snprintf(list + n, sizeof list - (size_t)n, ",%d", a->o->devices[r]);
        if (n > 0 && (size_t)n < sizeof backend) /* "cuda:0,1" */
            memcpy(backend, list, (size_t)n + 1);
        else /* the first GPU and the count: "cuda:0x8" */
            snprintf(backend, sizeof backend, "cuda:%dx%d", a->o->devices[0], a->o->ndevices);
    } else if (a->o->cuda) {
        snprintf(backend, sizeof backend, "cuda:%d", a->o->device);
    } else {
        snprintf(backend, sizeof backend, "cpu");
    }
    h.backend = backend;
    h.threads = (uint32_t)(a->o->threads > 0 ? a->o->threads : 1);
    h.gflops = a->gflops;
    h.gflops_bf16 = a->o->gpu_gflops[1]; /* 0 on a CPU node: the same as gflops (it computes fp32) */
    h.device_id = (char *)a->o->device_id;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    h.memory_mb = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / (1u << 20) : 0;
    h.token = (char *)(a->o->token ? a->o->token : "");
    h.seed_rules = CODEC_SEED_RULES;
    if (a->job && a->state == A_RUNNING) {
        h.job = a->job->id;
        h.stage = (uint32_t)a->job->stage;
        h.step = atomic_load(&a->job->cur_step);
    }
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_HELLO;
    env.hello = &h;
    s_send_coord(a, &env);
    a->last_hello = s_now();
}

static void s_send_heartbeat(agent_t *a)
{
    Tah__Heartbeat hb = TAH__HEARTBEAT__INIT;
    hb.state = a->job ? TAH__NODE_STATE__NODE_BUSY : TAH__NODE_STATE__NODE_IDLE;
    hb.job = a->job ? a->job->id : 0;
    hb.step = a->job ? atomic_load(&a->job->cur_step) : 0;
    hb.rejected = atomic_load(&a->rejected);
    hb.last_reject = a->last_reject;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    s_send_coord(a, &env);
    a->last_beat = s_now();
}

static void s_send_event(agent_t *a, uint32_t kind, int step, const char *reason, int lost_stage)
{
    Tah__JobEvent ev = TAH__JOB_EVENT__INIT;
    ev.job = a->job->id;
    ev.kind = kind;
    ev.step = step;
    ev.reason = (char *)reason;
    ev.lost_stage = lost_stage;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_JOB_EVENT;
    env.job_event = &ev;
    s_send_coord(a, &env);
}

/* ---- rejections ---- */

static void s_reject(agent_t *a, const char *peer, const char *why)
{
    unsigned long long n = atomic_fetch_add(&a->rejected, 1) + 1;
    snprintf(a->last_reject, sizeof a->last_reject, "%.100s: %.400s", peer, why);
    log_warn("job %llu: rejected data message #%llu from %s: %s", a->job ? (unsigned long long)a->job->id : 0ULL,
             n, peer, why);
}

static int s_peer_index(const node_job_t *j, int from)
{
    if (from == j->stage - 1)
        return 0;
    if (from == j->stage + 1)
        return 1;
    return 2;
}

/* A message from the authenticated neighbour `from` was rejected: count it
 * against that neighbour and report it to the coordinator (every time up to
 * max_bad_frames, then at most once a second), which evicts the sender when
 * the count reaches max_bad_frames. */
static void s_strike(agent_t *a, int from, const char *peer, const char *why)
{
    s_reject(a, peer, why);
    node_job_t *j = a->job;
    if (!j || from < 0 || from >= j->S)
        return;
    int i = s_peer_index(j, from);
    uint64_t n = ++a->bad[i];
    double now = s_now();
    if ((j->x.max_bad_frames > 0 && n <= (uint64_t)j->x.max_bad_frames) || now - a->last_report[i] >= 1.0) {
        Tah__PeerReport pr = TAH__PEER_REPORT__INIT;
        pr.job = j->id;
        pr.stage = (uint32_t)from;
        pr.count = n;
        pr.step = atomic_load(&j->cur_step);
        pr.reason = (char *)why;
        Tah__Envelope env = TAH__ENVELOPE__INIT;
        env.body_case = TAH__ENVELOPE__BODY_PEER_REPORT;
        env.peer_report = &pr;
        s_send_coord(a, &env);
        a->last_report[i] = now;
    }
}

/* ---- job life cycle ---- */

static void s_close_links(agent_t *a)
{
    for (int d = 0; d < 4; d++)
        shape_queue_destroy(&a->q[d]);
    memset(a->shp, 0, sizeof a->shp);
    a->exit_pending = 0;
    guard_destroy(&a->guard);
    memset(a->bad, 0, sizeof a->bad);
    memset(a->last_report, 0, sizeof a->last_report);
    if (a->down)
        zmq_close(a->down);
    if (a->tied)
        zmq_close(a->tied);
    a->down = a->tied = NULL;
    a->npeers = 0;
}

static void s_backlog_clear(agent_t *a)
{
    for (int i = 0; i < a->nbacklog; i++)
        free(a->backlog[i].buf);
    a->nbacklog = 0;
}

static void s_free_job(agent_t *a)
{
    s_backlog_clear(a);
    free(a->fetch.buf);
    memset(&a->fetch, 0, sizeof a->fetch);
    a->readopt = 0;
    if (!a->job)
        return;
    free(a->job->ini);
    free(a->job->endpoints);
    free(a->job->names);
    free(a->job->keys);
    free(a->job);
    a->job = NULL;
}

static void s_abort(agent_t *a, int kind, int lost_stage, const char *reason)
{
    if (a->state == A_FETCHING) { /* no runner yet */
        log_info("job %llu: stopping stage %d before it started: %s", (unsigned long long)a->job->id,
                 a->job->stage, reason);
        s_send_event(a, kind == NODE_FAILED ? TAH__JOB_EVENT_KIND__EVENT_FAILED : TAH__JOB_EVENT_KIND__EVENT_ABORTED,
                     0, reason, lost_stage);
        s_free_job(a);
        a->state = A_IDLE;
        if (a->leaving) /* asked to leave; the stage is gone without a runner: nothing to hand over */
            a->exiting = 1;
        return;
    }
    if (a->state != A_LOADING && a->state != A_RUNNING)
        return;
    a->stop_kind = kind;
    a->lost_stage = lost_stage;
    snprintf(a->stop_reason, sizeof a->stop_reason, "%s", reason);
    atomic_store(&a->job->abort, 1);
    char cmd = 'A';
    zmq_send(a->pipe, &cmd, 1, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(a->pipe, reason, strlen(reason), ZMQ_DONTWAIT);
    log_info("job %llu: stopping stage %d: %s", (unsigned long long)a->job->id, a->job->stage, reason);
    a->state = A_STOPPING;
    a->stop_at = s_now();
}

/* A fresh runner pipe for each job: a PAIR socket takes one peer, and the
 * previous runner's closed end may not be detached yet when the next job
 * arrives within milliseconds (its 'Y' would then be lost). */
static int s_new_pipe(agent_t *a)
{
    if (a->pipe)
        zmq_close(a->pipe);
    int zero = 0, hwm = 1000;
    a->pipe = zmq_socket(a->ctx, ZMQ_PAIR);
    if (!a->pipe) {
        log_error("internal: cannot create the runner pipe: %s", zmq_strerror(errno));
        return -1;
    }
    zmq_setsockopt(a->pipe, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(a->pipe, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(a->pipe, ZMQ_RCVHWM, &hwm, sizeof hwm);
    snprintf(a->pipe_ep, sizeof a->pipe_ep, "inproc://runner-%u", ++a->pipe_gen);
    if (zmq_bind(a->pipe, a->pipe_ep) != 0) {
        log_error("internal: cannot bind the runner pipe %s: %s", a->pipe_ep, zmq_strerror(errno));
        return -1;
    }
    return 0;
}

static void s_start_runner(agent_t *a)
{
    if (pthread_create(&a->thread, NULL, node_runner_main, a->job) != 0) {
        s_send_event(a, TAH__JOB_EVENT_KIND__EVENT_FAILED, 0, "cannot start the compute thread", -1);
        s_free_job(a);
        a->state = A_IDLE;
        return;
    }
    a->thread_started = 1;
    a->state = A_LOADING;
    a->runner_mark = s_now();
    a->runner_gap = 0.0;
}

/* ---- checkpoint replicas ---- */

static void s_fetch_next(agent_t *a)
{
    Tah__CkptGet g = TAH__CKPT_GET__INIT;
    g.job = a->job->id;
    g.stage = (uint32_t)a->job->stage;
    g.step = a->fetch.step;
    g.offset = a->fetch.off;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_CKPT_GET;
    env.ckpt_get = &g;
    s_send_coord(a, &env);
    a->fetch.progress = s_now();
}

/* A chunk of the replica we asked for: keep it; with the whole file, check
 * size and CRC, store it next to the job's checkpoints and start the runner
 * from it. */
static void s_on_ckpt_chunk(agent_t *a, const Tah__CkptChunk *ch)
{
    node_job_t *j = a->job;
    if (a->state != A_FETCHING || !j || ch->job != j->id || (int)ch->stage != j->stage ||
        ch->step != a->fetch.step || ch->offset != a->fetch.off) {
        log_warn("unexpected checkpoint chunk (job %llu stage %u step %d offset %llu); ignored",
                 (unsigned long long)ch->job, ch->stage, ch->step, (unsigned long long)ch->offset);
        return;
    }
    if (ch->total != a->fetch.len || ch->data.len == 0 || ch->data.len > a->fetch.len - a->fetch.off) {
        s_abort(a, NODE_FAILED, -1, "the coordinator has no usable checkpoint replica for this stage");
        return;
    }
    memcpy(a->fetch.buf + a->fetch.off, ch->data.data, ch->data.len);
    a->fetch.off += ch->data.len;
    if (a->fetch.off < a->fetch.len) {
        s_fetch_next(a);
        return;
    }
    if (crc32c_update(0, a->fetch.buf, a->fetch.len) != a->fetch.crc) {
        s_abort(a, NODE_FAILED, -1, "checkpoint replica CRC-32C mismatch");
        return;
    }
    char err[512];
    snprintf(j->resume_file, sizeof j->resume_file, "%.2200s.stage%d.replica.ckpt", j->ckpt_prefix, j->stage);
    const void *parts[1] = { a->fetch.buf };
    size_t sizes[1] = { a->fetch.len };
    if (tah_file_write_atomic(j->resume_file, parts, sizes, 1, err, sizeof err) != 0) {
        s_abort(a, NODE_FAILED, -1, err);
        return;
    }
    log_info("job %llu: resuming stage %d from %s (step %d)", (unsigned long long)j->id, j->stage, j->resume_file,
             a->fetch.step);
    free(a->fetch.buf);
    memset(&a->fetch, 0, sizeof a->fetch);
    s_start_runner(a);
}

/* The runner wrote a checkpoint ('C' [int32 step][path]): read it and queue
 * it for replication. */
static void s_on_ckpt_written(agent_t *a, zmq_msg_t *msg)
{
    node_job_t *j = a->job;
    size_t n = zmq_msg_size(msg);
    if (!j || n <= sizeof(int32_t) || n - sizeof(int32_t) >= 4096)
        return;
    int32_t step;
    char path[4096];
    memcpy(&step, zmq_msg_data(msg), sizeof step);
    memcpy(path, (char *)zmq_msg_data(msg) + sizeof step, n - sizeof step);
    path[n - sizeof step] = 0;
    if (a->nup == S_UPLOADS) { /* up[0] is being sent; the oldest waiting one is superseded */
        free(a->up[1].buf);
        memmove(&a->up[1], &a->up[2], (S_UPLOADS - 2) * sizeof a->up[0]);
        a->nup--;
    }
    struct s_upload *u = &a->up[a->nup];
    memset(u, 0, sizeof *u);
    char err[512];
    if (tah_file_read(path, 64ull << 30, &u->buf, &u->len, err, sizeof err) != 0 || u->len == 0) {
        log_warn("job %llu: checkpoint of step %d not replicated: %s", (unsigned long long)j->id, step, err);
        free(u->buf);
        return;
    }
    u->crc = crc32c_update(0, u->buf, u->len);
    u->job = j->id;
    u->stage = j->stage;
    u->step = step;
    u->progress = s_now();
    a->nup++;
}

/* Send the next chunks of the oldest queued checkpoint, as far as the
 * coordinator link takes them without blocking. */
static void s_pump_uploads(agent_t *a)
{
    for (int sent = 0; a->nup > 0 && sent < 8; sent++) {
        struct s_upload *u = &a->up[0];
        size_t n = u->len - u->off < S_CKPT_CHUNK ? u->len - u->off : S_CKPT_CHUNK;
        Tah__CkptPut p = TAH__CKPT_PUT__INIT;
        p.job = u->job;
        p.stage = (uint32_t)u->stage;
        p.step = u->step;
        p.offset = u->off;
        p.total = u->len;
        p.crc = u->crc;
        p.data.data = u->buf + u->off;
        p.data.len = n;
        Tah__Envelope env = TAH__ENVELOPE__INIT;
        env.body_case = TAH__ENVELOPE__BODY_CKPT_PUT;
        env.ckpt_put = &p;
        double now = s_now();
        if (wire_send_envelope(a->coord, NULL, 0, &env, ZMQ_DONTWAIT) != 0) {
            if (now - u->progress > S_FETCH_TIMEOUT_S) {
                log_warn("job %llu: checkpoint of step %d not replicated: the coordinator link is stuck",
                         (unsigned long long)u->job, u->step);
                u->off = u->len;
            } else {
                return;
            }
        } else {
            u->off += n;
            u->progress = now;
        }
        if (u->off == u->len) {
            log_debug("job %llu: checkpoint of step %d replicated (%zu bytes)", (unsigned long long)u->job, u->step,
                      u->len);
            free(u->buf);
            memmove(&a->up[0], &a->up[1], (size_t)(a->nup - 1) * sizeof a->up[0]);
            a->nup--;
        }
    }
}

static void s_on_assign(agent_t *a, const Tah__Assign *as)
{
    if (a->state != A_IDLE) {
        log_warn("assignment of job %llu while %s; refused", (unsigned long long)as->job, s_state_name[a->state]);
        return;
    }
    if (as->stages < 1 || as->stages > 4096 || as->stage >= as->stages || as->n_endpoints != as->stages ||
        as->n_nodes != as->stages || (a->secure && as->n_keys != as->stages) ||
        strlen(as->base_dir) >= sizeof a->job->base_dir ||
        strlen(as->ckpt_prefix) >= sizeof a->job->ckpt_prefix) {
        log_warn("malformed assignment of job %llu refused", (unsigned long long)as->job);
        return;
    }
    node_job_t *j = calloc(1, sizeof *j);
    if (!j)
        return;
    a->job = j;
    j->id = as->job;
    j->token = as->token;
    j->stage = (int)as->stage;
    j->S = (int)as->stages;
    j->layer0 = as->layer0;
    j->layer1 = as->layer1;
    j->ini = strdup(as->ini);
    snprintf(j->base_dir, sizeof j->base_dir, "%s", as->base_dir);
    snprintf(j->ckpt_prefix, sizeof j->ckpt_prefix, "%s", as->ckpt_prefix);
    j->endpoints = calloc(as->stages, sizeof *j->endpoints);
    j->names = calloc(as->stages, sizeof *j->names);
    if (a->secure)
        j->keys = calloc(as->stages, sizeof *j->keys);
    j->threads = a->o->threads;
    j->cuda = a->o->cuda;
    j->device = a->o->device;
    j->ndevices = a->o->ndevices;
    memcpy(j->devices, a->o->devices, sizeof j->devices);
    j->tp = a->o->tp;
    j->peer_timeout_ms = as->peer_timeout_ms ? as->peer_timeout_ms : 15000;
    j->ctx = a->ctx;
    j->rejected = &a->rejected;
    if (s_new_pipe(a) != 0) { /* the previous job's runner has exited (state IDLE) */
        s_free_job(a);
        a->exiting = 2; /* internal failure: leave (exit status 1) */
        return;
    }
    snprintf(j->pipe_ep, sizeof j->pipe_ep, "%s", a->pipe_ep);
    if (!j->ini || !j->endpoints || !j->names || (a->secure && !j->keys)) {
        s_free_job(a);
        return;
    }
    for (size_t k = 0; k < as->stages; k++) {
        snprintf(j->endpoints[k], sizeof j->endpoints[k], "%s", as->endpoints[k]);
        snprintf(j->names[k], sizeof j->names[k], "%s", as->nodes[k]);
        if (j->keys)
            snprintf(j->keys[k], sizeof j->keys[k], "%s", as->keys[k]);
    }
    log_info("job %llu: assigned stage %d of %d (layers %d..%d, placement %u)", (unsigned long long)j->id, j->stage,
             j->S, j->layer0, j->layer1 - 1, as->epoch);
    if (as->resume_step > 0) {
        /* the coordinator's replica of our stage's checkpoint comes first */
        if (as->ckpt_size == 0 || as->ckpt_size > (64ull << 30) || !(a->fetch.buf = malloc(as->ckpt_size))) {
            s_send_event(a, TAH__JOB_EVENT_KIND__EVENT_FAILED, 0, "cannot hold the checkpoint replica to resume from",
                         -1);
            s_free_job(a);
            return;
        }
        a->fetch.len = as->ckpt_size;
        a->fetch.crc = as->ckpt_crc;
        a->fetch.step = as->resume_step;
        a->fetch.off = 0;
        a->state = A_FETCHING;
        if (a->fetch_delay_ms > 0) { /* the loop sends the first CkptGet then */
            log_warn("job %llu: TAH_NODE_TEST_FETCH_DELAY_MS: fetching the replica of stage %d starts %ld ms late",
                     (unsigned long long)j->id, j->stage, a->fetch_delay_ms);
            a->fetch.start_at = s_now() + a->fetch_delay_ms / 1e3;
            a->fetch.progress = a->fetch.start_at; /* the fetch timeout counts from then */
        } else {
            s_fetch_next(a);
        }
        log_info("job %llu: fetching the checkpoint replica of stage %d at step %d (%zu bytes)",
                 (unsigned long long)j->id, j->stage, as->resume_step, a->fetch.len);
        return;
    }
    s_start_runner(a);
}

/* ZAP for the data ROUTER (secure mode). A connection is admitted when
 * its CURVE key is a neighbour's in the current assignment: the previous
 * stage's, and for the last stage also the first stage's (tied
 * embeddings). A request for any other key waits (a neighbour may connect
 * before our assignment arrives: a denial is final in libzmq) and is
 * denied after S_ZAP_WAIT_S, so strangers never get a data connection. */
#define S_ZAP_WAIT_S 5.0

static void s_zap_send(agent_t *a, const struct s_zap_wait *w, int ok)
{
    const char *f[4] = { ok ? "200" : "400", ok ? "OK" : "not a neighbour in this node's assignment",
                         ok ? w->key : "", "" };
    zmq_send(a->zap, w->rid, w->rid_len, ZMQ_SNDMORE);
    zmq_send(a->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(a->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(a->zap, w->reqid, w->reqid_len, ZMQ_SNDMORE);
    for (int i = 0; i < 4; i++)
        zmq_send(a->zap, f[i], strlen(f[i]), i < 3 ? ZMQ_SNDMORE : 0);
}

static int s_zap_neighbour(const agent_t *a, const char *key)
{
    const node_job_t *j = a->job;
    if (!j || !j->keys || !key[0])
        return 0;
    if (j->stage > 0 && !strcmp(j->keys[j->stage - 1], key))
        return 1;
    return j->S > 2 && j->stage == j->S - 1 && !strcmp(j->keys[0], key);
}

static void s_zap_resolve(agent_t *a, double now)
{
    int kept = 0;
    for (int i = 0; i < a->nzap; i++) {
        struct s_zap_wait *w = &a->zapq[i];
        if (s_zap_neighbour(a, w->key)) {
            s_zap_send(a, w, 1);
        } else if (!w->key[0] || now - w->since > S_ZAP_WAIT_S) {
            atomic_fetch_add(&a->rejected, 1);
            log_warn("data plane: refused a connection from key %.8s...: not a neighbour in this node's assignment",
                     w->key[0] ? w->key : "(none)");
            s_zap_send(a, w, 0);
        } else {
            a->zapq[kept++] = *w;
        }
    }
    a->nzap = kept;
}

/* [routing id][empty][version][request id][domain][address][identity][mechanism][key] */
static void s_on_zap(agent_t *a)
{
    zmq_msg_t f[10];
    int nf = 0;
    wire_recv_parts(a->zap, f, 10, &nf);
    struct s_zap_wait w;
    memset(&w, 0, sizeof w);
    w.since = s_now();
    if (nf >= 4 && zmq_msg_size(&f[0]) <= sizeof w.rid && zmq_msg_size(&f[3]) <= sizeof w.reqid) {
        w.rid_len = zmq_msg_size(&f[0]);
        memcpy(w.rid, zmq_msg_data(&f[0]), w.rid_len);
        w.reqid_len = zmq_msg_size(&f[3]);
        memcpy(w.reqid, zmq_msg_data(&f[3]), w.reqid_len);
        if (nf == 9 && zmq_msg_size(&f[7]) == 5 && !memcmp(zmq_msg_data(&f[7]), "CURVE", 5) &&
            zmq_msg_size(&f[8]) == 32)
            zmq_z85_encode(w.key, zmq_msg_data(&f[8]), 32);
        if (a->nzap < (int)(sizeof a->zapq / sizeof a->zapq[0]))
            a->zapq[a->nzap++] = w;
        else {
            w.key[0] = 0;
            s_zap_send(a, &w, 0);
        }
    }
    for (int i = 0; i < nf; i++)
        zmq_msg_close(&f[i]);
    s_zap_resolve(a, s_now());
}

static void *s_dealer(agent_t *a, int stage)
{
    const char *ep = a->job->endpoints[stage];
    void *s = zmq_socket(a->ctx, ZMQ_DEALER);
    int zero = 0, hwm = 2 * a->job->x.M + 2 * a->job->x.val_batches + 16, sndto = S_SEND_TIMEOUT_MS;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &sndto, sizeof sndto);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (a->job->keys) {
        char err[512];
        if (keys_set_client(s, a->job->keys[stage], &a->kp, err, sizeof err) != 0) {
            log_error("job %llu: stage %d: %s", (unsigned long long)a->job->id, stage, err);
            zmq_close(s);
            return NULL;
        }
    }
    if (zmq_connect(s, ep) != 0) {
        log_error("job %llu: cannot connect to %s: %s", (unsigned long long)a->job->id, ep, zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    Tah__DataHeader h;
    link_header(&h, &a->job->x, TAH__DATA_KIND__DATA_HELLO, 0, 0);
    h.token = a->job->token;
    uint8_t hb[WIRE_MAX_HEADER];
    size_t hl = tah__data_header__pack(&h, hb);
    zmq_send(s, hb, hl, ZMQ_SNDMORE);
    zmq_send(s, NULL, 0, 0);
    return s;
}

/* 1 when this stage has an outgoing link of kind d (NODE_DEST_*); its peer stage in *to. */
static int s_has_link(const node_job_t *j, int d, int *to)
{
    const int k = j->stage, S = j->S;
    switch (d) {
    case NODE_DEST_DOWN:
        *to = k + 1;
        return k < S - 1;
    case NODE_DEST_UP:
        *to = k - 1;
        return k > 0;
    case NODE_DEST_TIED:
        *to = k == 0 ? S - 1 : 0;
        return j->x.tied && S > 1 && (k == 0 || k == S - 1);
    default:
        return 0;
    }
}

/* A queue for each outgoing link (s_flush sends from them without blocking),
 * and the job's in-process rate and delay where it sets them. -1: out of memory. */
static int s_setup_queues(agent_t *a)
{
    node_job_t *j = a->job;
    const size_t cap = (size_t)(2 * j->x.M + 2 * j->x.val_batches + 16);
    int to;
    for (int d = 1; d < 4; d++) /* a->shp[] is zero (unshaped) until set below: calloc, s_close_links */
        if (s_has_link(j, d, &to) && !(a->q[d] = shape_queue_new(cap)))
            return -1;
    char err[1024];
    job_spec_t *spec = malloc(sizeof *spec);
    if (!spec)
        return -1;
    if (jobfile_parse(j->ini, "job", spec, err, sizeof err) != 0) { /* the runner parsed it already */
        log_warn("job %llu: link settings not applied: %s", (unsigned long long)j->id, err);
        free(spec);
        return 0;
    }
    const int k = j->stage;
    int delayed = 0;
    for (int d = 1; d < 4; d++) {
        if (!s_has_link(j, d, &to))
            continue;
        shape_link_init(&a->shp[d], linkspec_value(&spec->link_rate, k, to), linkspec_value(&spec->link_delay, k, to));
        if (!shape_link_active(&a->shp[d]))
            continue;
        delayed |= a->shp[d].delay_s > 0;
        log_info("job %llu: link %d>%d (%s): rate %s, delay %s", (unsigned long long)j->id, k, to,
                 d == NODE_DEST_DOWN ? "downstream" : d == NODE_DEST_UP ? "upstream" : "tied",
                 a->shp[d].bits_per_s > 0 ? "in-process token bucket" : "unlimited",
                 a->shp[d].delay_s > 0 ? "in-process" : "none");
        log_info("job %llu: link %d>%d: %.6g Mbit/s, %.6g ms one-way", (unsigned long long)j->id, k, to,
                 a->shp[d].bits_per_s / 1e6, a->shp[d].delay_s * 1e3);
    }
    if (delayed)
        log_info("job %llu: delay: in-process (%s)", (unsigned long long)j->id,
                 linkspec_netem_available() ? "netem exists on this machine; the job asks for the node's own delay"
                                            : "no netem");
    free(spec);
    return 0;
}

/* Runner is ready: open the links. */
static void s_on_ready(agent_t *a)
{
    node_job_t *j = a->job;
    const int k = j->stage, S = j->S;
    if (k < S - 1) {
        a->down = s_dealer(a, k + 1);
        if (!a->down) {
            s_abort(a, NODE_FAILED, -1, "cannot connect to the next stage");
            return;
        }
    }
    if (k == 0 && j->x.tied && S > 2) {
        a->tied = s_dealer(a, S - 1);
        if (!a->tied) {
            s_abort(a, NODE_FAILED, -1, "cannot connect to the last stage");
            return;
        }
    }
    a->guard = guard_new(j->x.M, j->x.val_batches, j->x.max_norm_ratio);
    if (!a->guard) {
        s_abort(a, NODE_FAILED, -1, "out of memory for the data-plane guard");
        return;
    }
    if (s_setup_queues(a) != 0) {
        s_abort(a, NODE_FAILED, -1, "out of memory for the link queues");
        return;
    }
    double now = s_now();
    a->heard[0] = a->heard[1] = a->heard[2] = now;
    a->state = A_RUNNING;
    log_info("job %llu: stage %d running; links: %s%s%s", (unsigned long long)j->id, k,
             k > 0 ? "from upstream " : "", k < S - 1 ? "to downstream " : "",
             j->x.tied && S > 2 && (k == 0 || k == S - 1) ? "tied" : "");
}

static void s_on_exit(agent_t *a)
{
    pthread_join(a->thread, NULL);
    a->thread_started = 0;
    node_job_t *j = a->job;
    if (a->state == A_STOPPING) {
        if (a->stop_kind == NODE_FAILED)
            s_send_event(a, TAH__JOB_EVENT_KIND__EVENT_FAILED, j->fail_step, a->stop_reason, a->lost_stage);
        else
            s_send_event(a, TAH__JOB_EVENT_KIND__EVENT_ABORTED, j->fail_step, a->stop_reason, -1);
    } else if (j->result == NODE_DONE) {
        s_send_event(a, TAH__JOB_EVENT_KIND__EVENT_DONE, atomic_load(&j->cur_step), "", -1);
        log_info("job %llu: stage %d finished", (unsigned long long)j->id, j->stage);
    } else if (j->result == NODE_DRAINED) {
        s_send_event(a, TAH__JOB_EVENT_KIND__EVENT_DRAINED, j->drained_step, "", -1);
        log_info("job %llu: stage %d stopped after step %d (checkpoint replicated)", (unsigned long long)j->id,
                 j->stage, j->drained_step);
    } else {
        log_error("job %llu step %d: stage %d failed: %s", (unsigned long long)j->id, j->fail_step, j->stage,
                  j->reason);
        s_send_event(a, TAH__JOB_EVENT_KIND__EVENT_FAILED, j->fail_step, j->reason, -1);
    }
    s_close_links(a);
    s_free_job(a);
    if (a->leaving) {
        /* exit once the coordinator confirms (Ok) it has our DRAINED */
        a->leave_wait = s_now();
        a->state = A_IDLE;
        return;
    }
    if (a->hello_after_stop) {
        a->hello_after_stop = 0;
        a->state = A_ANNOUNCING;
        s_send_hello(a);
    } else {
        a->state = A_IDLE;
        s_send_heartbeat(a);
    }
}

/* ---- messages ---- */

static void s_on_coord(agent_t *a)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, a->coord, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return;
    }
    int more = zmq_msg_more(&m);
    char err[256];
    Tah__Envelope *e = more ? NULL : wire_envelope_unpack(zmq_msg_data(&m), zmq_msg_size(&m), err, sizeof err);
    zmq_msg_close(&m);
    while (more) { /* a multipart message is not ours: drain it */
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, a->coord, 0) < 0)
            break;
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        snprintf(err, sizeof err, "multipart control message");
    }
    if (!e) {
        atomic_fetch_add(&a->rejected, 1);
        log_warn("rejected a message on the coordinator link: %s", err);
        return;
    }
    a->last_coord = s_now();
    switch (e->body_case) {
    case TAH__ENVELOPE__BODY_WELCOME:
        if (a->state == A_ANNOUNCING) {
            a->state = A_IDLE;
            a->unanswered = 0;
            log_info("joined the coordinator as %s", a->name);
        } else if (a->readopt && a->job) {
            a->readopt = 0;
            if (e->welcome->adopted) {
                /* the reports it may have missed, in order */
                int resent = 0;
                for (int i = 0; i < a->nbacklog; i++) {
                    if (a->backlog[i].step <= e->welcome->step)
                        continue;
                    zmq_send(a->coord, a->backlog[i].buf, a->backlog[i].len, ZMQ_DONTWAIT);
                    resent++;
                }
                log_info("job %llu: the restarted coordinator keeps this stage (it has step %d; %d reports resent)",
                         (unsigned long long)a->job->id, e->welcome->step, resent);
                /* a leave asked while it was down or had not re-adopted us
                 * yet went unheard: ask again (a second one is harmless) */
                if (a->leaving && a->state == A_RUNNING) {
                    log_info("job %llu: asking the restarted coordinator again to move stage %d (leaving)",
                             (unsigned long long)a->job->id, a->job->stage);
                    s_send_event(a, TAH__JOB_EVENT_KIND__EVENT_LEAVING, atomic_load(&a->job->cur_step),
                                 "node leaving (signal)", -1);
                }
            } else {
                s_abort(a, NODE_ABORTED, -1, "the restarted coordinator does not continue this job");
            }
        }
        break;
    case TAH__ENVELOPE__BODY_OK:
        if (a->leave_wait > 0) {
            log_info("leaving: the coordinator has the stage back");
            a->exiting = 1;
        }
        break;
    case TAH__ENVELOPE__BODY_CKPT_CHUNK:
        s_on_ckpt_chunk(a, e->ckpt_chunk);
        break;
    case TAH__ENVELOPE__BODY_DRAIN:
        /* also while the stage is still fetched or loaded: its runner takes
         * drain_step in at the start of its first step (and stops there if
         * that step is past D); the other stages stop after D, so a stage
         * that missed the Drain would wait in D+1 until its silence
         * watchdog blamed a neighbour. cur_step is 0 until the runner is
         * about to start its first step. */
        if (a->job && e->drain->job == a->job->id && e->drain->step > 0 &&
            (a->state == A_FETCHING || a->state == A_LOADING || a->state == A_RUNNING)) {
            node_job_t *j = a->job;
            atomic_store(&j->drain_step, e->drain->step);
            int cur = atomic_load(&j->cur_step);
            if (a->state == A_RUNNING)
                log_info("job %llu: drain after step %d (now in step %d): %s", (unsigned long long)j->id,
                         e->drain->step, cur, e->drain->reason);
            else
                log_info("job %llu: drain after step %d (stage %d still %s): %s", (unsigned long long)j->id,
                         e->drain->step, j->stage, s_state_name[a->state], e->drain->reason);
            if (cur > e->drain->step) { /* abandon the step in progress; its update cannot happen */
                atomic_store(&j->abort, 1);
                char cmd = 'A';
                zmq_send(a->pipe, &cmd, 1, ZMQ_SNDMORE | ZMQ_DONTWAIT);
                zmq_send(a->pipe, "drain", 5, ZMQ_DONTWAIT);
            }
        }
        break;
    case TAH__ENVELOPE__BODY_HEARTBEAT:
        break;
    case TAH__ENVELOPE__BODY_ASSIGN:
        s_on_assign(a, e->assign);
        break;
    case TAH__ENVELOPE__BODY_ABORT:
        if (a->job && e->abort->job == a->job->id)
            s_abort(a, NODE_ABORTED, -1, e->abort->reason[0] ? e->abort->reason : "aborted by the coordinator");
        break;
    case TAH__ENVELOPE__BODY_ERROR:
        log_warn("coordinator: %s", e->error->message);
        if (e->error->reannounce) {
            if (a->job && a->state == A_RUNNING) {
                /* a restarted coordinator: name the stage we run, it may keep it */
                if (!a->readopt) {
                    a->readopt = 1;
                    s_send_hello(a);
                }
            } else if (a->job) {
                s_abort(a, NODE_ABORTED, -1, "the coordinator no longer knows this node");
                a->hello_after_stop = 1;
            } else if (a->state != A_ANNOUNCING) {
                a->state = A_ANNOUNCING;
                s_send_hello(a);
            }
        } else if (a->state == A_ANNOUNCING) {
            log_error("the coordinator refused this node: %s", e->error->message);
            a->exiting = 2;
        }
        break;
    default:
        atomic_fetch_add(&a->rejected, 1);
        log_warn("unexpected '%s' from the coordinator; ignored", wire_body_name(e));
        break;
    }
    wire_envelope_free(&e);
}

/* A data message [hdr][payload] from stage `from` (authenticated). */
static void s_deliver(agent_t *a, int from, const char *peer, zmq_msg_t *hdr, zmq_msg_t *payload)
{
    node_job_t *j = a->job;
    char err[512];
    Tah__DataHeader *h = wire_header_unpack(zmq_msg_data(hdr), zmq_msg_size(hdr), err, sizeof err);
    if (!h) {
        s_strike(a, from, peer, err);
        return;
    }
    if (h->kind == TAH__DATA_KIND__DATA_HELLO) {
        s_strike(a, from, peer, "second hello on an established link");
        wire_header_free(&h);
        return;
    }
    /* a stage that decodes on its device gets boundary frames as they came, checked up to the
     * decode; it decodes and checks the tensor itself (runner.c, s_wait_tensor) */
    const int frame = atomic_load(&j->dev_dec) &&
                      (h->kind == TAH__DATA_KIND__DATA_ACT || h->kind == TAH__DATA_KIND__DATA_GRAD ||
                       h->kind == TAH__DATA_KIND__DATA_EVAL);
    size_t nelem = frame ? 0 : link_payload_elems(&j->x, h);
    size_t nbytes = nelem * (h->kind == TAH__DATA_KIND__DATA_NORM_PARTIAL ? sizeof(double) : sizeof(float));
    zmq_msg_t out;
    zmq_msg_init_size(&out, nbytes);
    const double t_rx = s_now();
    int rc = link_check(&j->x, from, atomic_load(&j->cur_step), h, zmq_msg_data(payload), zmq_msg_size(payload),
                        frame ? NULL : zmq_msg_data(&out), nbytes, err, sizeof err);
    if (rc == 0 && h->kind != TAH__DATA_KIND__DATA_PING) {
        int tensor = h->kind != TAH__DATA_KIND__DATA_NORM_PARTIAL && h->kind != TAH__DATA_KIND__DATA_NORM;
        rc = guard_admit(a->guard, h->kind, h->step, h->mb, tensor && !frame ? zmq_msg_data(&out) : NULL,
                         tensor ? nelem : 0, err, sizeof err);
    }
    if (rc == 0 && frame)
        zmq_msg_move(&out, payload);
    atomic_fetch_add(&j->rx_ns, (unsigned long long)((s_now() - t_rx) * 1e9));
    if (rc) {
        s_strike(a, from, peer, err);
        zmq_msg_close(&out);
        wire_header_free(&h);
        return;
    }
    a->heard[s_peer_index(j, from)] = s_now();
    if (from == 0 && j->stage == j->S - 1)
        a->heard[2] = a->heard[s_peer_index(j, from)];
    if (h->kind == TAH__DATA_KIND__DATA_PING) {
        zmq_msg_close(&out);
        wire_header_free(&h);
        return;
    }
    node_meta_t meta = { .kind = h->kind, .step = h->step, .mb = h->mb, .frame = (uint32_t)frame,
                         .data_pos = h->data_pos, .value = h->value };
    char cmd = 'D';
    zmq_send(a->pipe, &cmd, 1, ZMQ_SNDMORE);
    zmq_send(a->pipe, &meta, sizeof meta, ZMQ_SNDMORE);
    zmq_msg_send(&out, a->pipe, 0);
    zmq_msg_close(&out);
    wire_header_free(&h);
}

static void s_on_router(agent_t *a)
{
    zmq_msg_t parts[4];
    int n = 0;
    int total = wire_recv_parts(a->router, parts, 4, &n);
    node_job_t *j = a->job;
    if (n == 0)
        return;
    const uint8_t *rid = zmq_msg_data(&parts[0]);
    size_t rl = zmq_msg_size(&parts[0]);
    s_peer_t *p = NULL;
    for (int i = 0; i < a->npeers; i++)
        if (a->peers[i].rid_len == rl && !memcmp(a->peers[i].rid, rid, rl))
            p = &a->peers[i];
    char peer[96];
    if (p)
        snprintf(peer, sizeof peer, "stage %d (%s)", p->stage, j->names[p->stage]);
    else
        snprintf(peer, sizeof peer, "unauthenticated connection");
    if (total != 3 || n != 3) {
        const char *why = total == 1 ? "empty message" : "data messages are exactly [header][payload]";
        if (p)
            s_strike(a, p->stage, peer, why);
        else
            s_reject(a, peer, why);
        goto out;
    }
    if (!p) {
        char err[256];
        Tah__DataHeader *h = wire_header_unpack(zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), err, sizeof err);
        if (!h) {
            s_reject(a, peer, err);
            goto out;
        }
        int rc = link_check_hello(&j->x, h, err, sizeof err);
        int from = (int)h->from_stage;
        wire_header_free(&h);
        if (rc) {
            s_reject(a, peer, err);
            goto out;
        }
        for (int i = 0; i < a->npeers; i++) {
            if (a->peers[i].stage == from) {
                s_reject(a, peer, "hello for a stage that is already connected");
                goto out;
            }
        }
        if (a->npeers == S_MAX_PEERS || rl > sizeof a->peers[0].rid) {
            s_reject(a, peer, "too many connections");
            goto out;
        }
        p = &a->peers[a->npeers++];
        p->stage = from;
        memcpy(p->rid, rid, rl);
        p->rid_len = rl;
        a->heard[s_peer_index(j, from)] = s_now();
        log_info("job %llu: stage %d (%s) connected", (unsigned long long)j->id, from, j->names[from]);
        if (from == 0 && j->stage == j->S - 1)
            atomic_store(&j->tied_peer, 1);
        goto out;
    }
    s_deliver(a, p->stage, peer, &parts[1], &parts[2]);
out:
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

static void s_on_dealer(agent_t *a, void *sock, int from)
{
    zmq_msg_t parts[2];
    int n = 0;
    int total = wire_recv_parts(sock, parts, 2, &n);
    char peer[96];
    snprintf(peer, sizeof peer, "stage %d (%s)", from, a->job->names[from]);
    if (total != 2 || n != 2)
        s_strike(a, from, peer, "data messages are exactly [header][payload]");
    else
        s_deliver(a, from, peer, &parts[0], &parts[1]);
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

static const s_peer_t *s_peer_of_stage(const agent_t *a, int stage)
{
    for (int i = 0; i < a->npeers; i++)
        if (a->peers[i].stage == stage)
            return &a->peers[i];
    return NULL;
}

/* Runner messages go out through each link's queue (s_setup_queues): a
 * message waits there for its release time when the link is shaped, and
 * for room when the neighbour's socket queue is full. s_flush never blocks,
 * so heartbeats and the other links go on; a head refused for
 * S_SEND_TIMEOUT_MS fails the job. While a queue is full the pipe is not
 * read, which blocks the runner (back-pressure). */
static void s_forward(agent_t *a, zmq_msg_t *parts)
{
    int dest = zmq_msg_size(&parts[0]) == 1 ? *(uint8_t *)zmq_msg_data(&parts[0]) : 0;
    if (dest < NODE_DEST_DOWN || dest > NODE_DEST_TIED || !a->q[dest]) {
        log_error("job %llu: internal: runner message for destination %d, which this stage has no link to",
                  (unsigned long long)a->job->id, dest);
        return;
    }
    size_t bytes = zmq_msg_size(&parts[1]) + zmq_msg_size(&parts[2]);
    double release = shape_link_release(&a->shp[dest], s_now(), bytes);
    if (shape_queue_push(a->q[dest], release, &parts[1], &parts[2]) != 0) /* s_any_full stops the pipe first */
        s_abort(a, NODE_FAILED, -1, "internal: a link queue overflowed");
}

/* The socket (and, on our ROUTER, the peer) of an outgoing link; 0 when
 * the link is not there yet (a neighbour that has not said hello: the
 * upstream one, or the first stage as the last stage's tied partner). */
static int s_link_socket(agent_t *a, int dest, void **sock, const s_peer_t **peer)
{
    node_job_t *j = a->job;
    *sock = NULL;
    *peer = NULL;
    if (dest == NODE_DEST_DOWN)
        *sock = a->down;
    else if (dest == NODE_DEST_UP)
        *peer = s_peer_of_stage(a, j->stage - 1);
    else if (j->stage == 0)
        *sock = a->tied ? a->tied : a->down;
    else
        *peer = s_peer_of_stage(a, 0);
    if (*peer)
        *sock = a->router;
    return *sock != NULL;
}

/* Send every queued message whose time has come, without blocking;
 * seconds until s_flush should run again (-1: nothing waits). */
static double s_flush(agent_t *a)
{
    double now = s_now(), next = -1.0;
    for (int d = 1; d < 4 && a->job; d++) {
        shape_queue_t *q = a->q[d];
        if (!q || q->n == 0)
            continue;
        if (a->state != A_RUNNING) { /* stopping: nobody waits for them */
            shape_queue_clear(q);
            continue;
        }
        void *sock;
        const s_peer_t *p;
        if (!s_link_socket(a, d, &sock, &p))
            continue; /* a neighbour that has not said hello yet: its messages wait (the peer timeout, s_tick) */
        double wait;
        int rc = shape_queue_send(q, sock, p ? p->rid : NULL, p ? p->rid_len : 0, now, &wait);
        if (rc == SHAPE_HELD && now - q->held_since < S_SEND_TIMEOUT_MS * 1e-3)
            wait = S_HELD_RETRY_S;
        else if (rc != SHAPE_SENT) {
            node_job_t *j = a->job;
            int to = 0;
            s_has_link(j, d, &to);
            char reason[256];
            if (rc == SHAPE_FAILED)
                snprintf(reason, sizeof reason, "send to stage %d (node %s) failed: %s", to, j->names[to],
                         zmq_strerror(errno));
            else
                snprintf(reason, sizeof reason, "send to stage %d (node %s) failed: its queue stayed full for %.1f s",
                         to, j->names[to], now - q->held_since);
            s_abort(a, NODE_FAILED, to, reason);
            shape_queue_clear(q);
            continue;
        }
        if (wait >= 0 && (next < 0 || wait < next))
            next = wait;
    }
    return next;
}

static int s_queued(const agent_t *a)
{
    size_t n = 0;
    for (int d = 1; d < 4; d++)
        n += a->q[d] ? a->q[d]->n : 0;
    return n > 0;
}

static int s_any_full(const agent_t *a)
{
    for (int d = 1; d < 4; d++)
        if (a->q[d] && shape_queue_full(a->q[d]))
            return 1;
    return 0;
}

/* Keep a copy of a step report: a restarted coordinator gets the ones it missed. */
static void s_backlog_add(agent_t *a, zmq_msg_t *m)
{
    char err[128];
    Tah__Envelope *e = wire_envelope_unpack(zmq_msg_data(m), zmq_msg_size(m), err, sizeof err);
    if (!e)
        return;
    int step = e->body_case == TAH__ENVELOPE__BODY_STEP_REPORT ? e->step_report->step : -1;
    wire_envelope_free(&e);
    if (step < 0)
        return;
    if (a->nbacklog == S_BACKLOG) {
        free(a->backlog[0].buf);
        memmove(&a->backlog[0], &a->backlog[1], (S_BACKLOG - 1) * sizeof a->backlog[0]);
        a->nbacklog--;
    }
    struct s_backlog *b = &a->backlog[a->nbacklog];
    b->buf = malloc(zmq_msg_size(m));
    if (!b->buf)
        return;
    memcpy(b->buf, zmq_msg_data(m), zmq_msg_size(m));
    b->len = zmq_msg_size(m);
    b->step = step;
    a->nbacklog++;
}

static void s_on_pipe(agent_t *a)
{
    zmq_msg_t parts[4];
    int n = 0;
    wire_recv_parts(a->pipe, parts, 4, &n);
    if (n == 0)
        return;
    char cmd = zmq_msg_size(&parts[0]) == 1 ? *(char *)zmq_msg_data(&parts[0]) : 0;
    switch (cmd) {
    case 'Y':
        if (a->state == A_LOADING)
            s_on_ready(a);
        break;
    case 'S':
        if (a->state == A_RUNNING && n == 4)
            s_forward(a, parts + 1);
        break;
    case 'B': /* the runner rejected a frame it decoded: [stage (int32)][reason] */
        if (n == 3 && a->state == A_RUNNING && a->job && zmq_msg_size(&parts[1]) == sizeof(int32_t)) {
            int32_t from;
            memcpy(&from, zmq_msg_data(&parts[1]), sizeof from);
            char why[512];
            snprintf(why, sizeof why, "%.*s", (int)zmq_msg_size(&parts[2]), (const char *)zmq_msg_data(&parts[2]));
            if (from >= 0 && from < a->job->S) {
                char peer[96];
                snprintf(peer, sizeof peer, "stage %d (%s)", from, a->job->names[from]);
                s_strike(a, from, peer, why);
            }
        }
        break;
    case 'R':
        if (n == 2 && (a->state == A_RUNNING || a->state == A_STOPPING)) {
            const double now = s_now();
            a->runner_gap = fmax(a->runner_gap, now - a->runner_mark);
            a->runner_mark = now;
        }
        if (n == 2 && a->state == A_RUNNING) {
            /* while a restarted coordinator decides whether it keeps our
             * stage, reports wait in the backlog (then go in step order) */
            if (!a->readopt)
                zmq_send(a->coord, zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), ZMQ_DONTWAIT);
            s_backlog_add(a, &parts[1]);
        }
        break;
    case 'C':
        if (n == 2 && a->state == A_RUNNING)
            s_on_ckpt_written(a, &parts[1]);
        break;
    case 'X':
        if ((a->state == A_RUNNING && s_queued(a)) || a->nup > 0)
            a->exit_pending = 1; /* after the queued messages and checkpoints are out */
        else
            s_on_exit(a);
        break;
    default:
        break;
    }
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

static void s_send_ping(agent_t *a)
{
    node_job_t *j = a->job;
    Tah__DataHeader h;
    link_header(&h, &j->x, TAH__DATA_KIND__DATA_PING, 0, 0);
    uint8_t hb[WIRE_MAX_HEADER];
    size_t hl = tah__data_header__pack(&h, hb);
    void *dealers[2] = { a->down, a->tied };
    for (int i = 0; i < 2; i++) {
        if (!dealers[i])
            continue;
        if (zmq_send(dealers[i], hb, hl, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
            zmq_send(dealers[i], NULL, 0, ZMQ_DONTWAIT);
    }
    for (int i = 0; i < a->npeers; i++) {
        if (zmq_send(a->router, a->peers[i].rid, a->peers[i].rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
            continue;
        zmq_send(a->router, hb, hl, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(a->router, NULL, 0, ZMQ_DONTWAIT);
    }
    a->last_ping = s_now();
}

/* The runner has not answered a stop request (Abort, a silent neighbour or
 * coordinator, a second signal) for `waited` s while still in its step
 * loop: it is stuck, as in a device call that never returns (a hung kernel,
 * a collective whose peer died). Its thread cannot be joined or cancelled,
 * and ZeroMQ's context cannot end while its pipe socket is open, so the
 * node tells the coordinator that it is leaving the job (Aborted naming its
 * own stage: the coordinator moves the stage and does not place this node
 * again until it announces itself anew) and exits with status 1 at once. */
static void s_stuck(agent_t *a, double waited)
{
    node_job_t *j = a->job;
    char reason[900];
    snprintf(reason, sizeof reason,
             "stage %d stuck in step %d: no stop %.0f s after the request (%.300s); the node exits", j->stage,
             atomic_load(&j->cur_step), waited, a->stop_reason);
    log_error("job %llu: %s; HINT: a device call that never returns (check the GPU: nvidia-smi), or "
              "--stop-timeout too short for this machine's steps",
              (unsigned long long)j->id, reason);
    s_send_event(a, TAH__JOB_EVENT_KIND__EVENT_ABORTED, atomic_load(&j->cur_step), reason, j->stage);
    nanosleep(&(struct timespec){ 0, 500000000 }, NULL); /* ZeroMQ's I/O thread sends the event */
    if (a->o->pid_file)
        unlink(a->o->pid_file);
    fflush(NULL);
    _exit(1);
}

static void s_tick(agent_t *a)
{
    double now = s_now();
    /* a stop that the runner does not act on: its allowance is the node's
     * --stop-timeout, or three times its slowest step so far if that is
     * more (the runner looks at the request between the parts of a step);
     * once it has left its step loop only its last checkpoint is left to
     * write, which a slow disk may take long over */
    if (a->state == A_STOPPING && a->o->stop_timeout > 0 && a->job && !atomic_load(&a->job->steps_over) &&
        now - a->stop_at > fmax(a->o->stop_timeout, 3.0 * a->runner_gap))
        s_stuck(a, now - a->stop_at);
    if (a->state == A_ANNOUNCING && now - a->last_hello > 2.0) {
        if (++a->unanswered == 5)
            log_warn("no answer from the coordinator to 5 hellos; HINT: is it running? a secure coordinator needs "
                     "--coordinator-key (its coord.pub, the right one); one started with --open needs none");
        s_send_hello(a);
    }
    if (a->state != A_ANNOUNCING && now - a->last_beat >= 1.0)
        s_send_heartbeat(a);
    if ((a->state == A_LOADING || a->state == A_RUNNING) && now - a->last_coord > a->o->coord_timeout)
        s_abort(a, NODE_ABORTED, -1, "the coordinator went silent");
    if (a->state != A_ANNOUNCING && !a->job && now - a->last_coord > a->o->coord_timeout) {
        log_warn("the coordinator went silent for %.0f s; announcing again", now - a->last_coord);
        a->state = A_ANNOUNCING;
        a->last_coord = now;
        s_send_hello(a);
    }
    if (a->state != A_RUNNING)
        return;
    node_job_t *j = a->job;
    if (now - a->last_ping >= 1.0)
        s_send_ping(a);
    /* silence matters only while the runner still exchanges steps with the
     * neighbours: once it has left its step loop (its last checkpoint is
     * being written or replicated, which on a slow disk or link can outlast
     * the peer timeout) a neighbour that finished or drained too may have
     * gone quiet, and one that dies now is the coordinator's to notice */
    if (atomic_load(&j->steps_over))
        return;
    double limit = j->peer_timeout_ms / 1e3;
    int expect[3] = { j->stage > 0 ? j->stage - 1 : -1, j->stage < j->S - 1 ? j->stage + 1 : -1, -1 };
    if (j->x.tied && j->S > 2 && j->stage == 0)
        expect[2] = j->S - 1;
    if (j->x.tied && j->S > 2 && j->stage == j->S - 1)
        expect[2] = 0;
    for (int i = 0; i < 3; i++) {
        if (expect[i] < 0 || now - a->heard[i] <= limit)
            continue;
        char reason[256];
        snprintf(reason, sizeof reason, "stage %d (node %s) silent for %.1f s", expect[i], j->names[expect[i]],
                 now - a->heard[i]);
        s_abort(a, NODE_FAILED, expect[i], reason);
        return;
    }
}

/* TAH_NODE_TEST_GFLOPS=X (tests): announce X GFLOP/s instead of a
 * measurement, so that nodes count as equally fast (placement then splits
 * layers as tah-train does) however loaded the machine is while they
 * measure. *g = 0 when unset; a value outside (0, 1e9] is an error. */
static int s_test_gflops(double *g, char *err, size_t errlen)
{
    *g = 0.0;
    const char *v = getenv("TAH_NODE_TEST_GFLOPS");
    if (!v)
        return 0;
    char *end = NULL;
    double x = strtod(v, &end);
    if (end == v || *end || !(x > 0.0 && x <= 1e9)) {
        snprintf(err, errlen, "TAH_NODE_TEST_GFLOPS wants GFLOP/s in (0, 1e9], got '%.64s'", v);
        return TAH_EINVAL;
    }
    *g = x;
    return 0;
}

int node_agent_run(const node_opts_t *o)
{
    int rc = 1;
    sigset_t mask0;
    sigemptyset(&s_sigset);
    sigaddset(&s_sigset, SIGINT);
    sigaddset(&s_sigset, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &s_sigset, &mask0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    pthread_t sig_thread;
    if (pthread_create(&sig_thread, NULL, s_signal_main, NULL) != 0) {
        log_error("cannot start the signal thread");
        pthread_sigmask(SIG_SETMASK, &mask0, NULL);
        return 1;
    }
    agent_t *a = calloc(1, sizeof *a);
    if (!a)
        goto out_signals;
    a->o = o;
    atomic_init(&a->rejected, 0);
    char ep[300], err[256];
    if (o->name)
        snprintf(a->name, sizeof a->name, "%s", o->name);
    else {
        char host[64] = "node";
        gethostname(host, sizeof host);
        host[sizeof host - 1] = 0;
        snprintf(a->name, sizeof a->name, "%.40s-%ld", host, (long)getpid());
    }
    tah_log_set_tag(a->name);
    if (s_test_gflops(&a->gflops, err, sizeof err) != 0) {
        log_error("%s", err);
        free(a);
        goto out_signals;
    }
    if (a->gflops > 0.0)
        log_warn("TAH_NODE_TEST_GFLOPS: announcing %.1f GFLOP/s instead of a measurement", a->gflops);
    else
        a->gflops = o->cuda && o->gpu_gflops[0] > 0.0 ? o->gpu_gflops[0]
                                                       : node_bench_gflops(o->threads > 0 ? o->threads : 1);

    a->ctx = zmq_ctx_new();
    a->router = zmq_socket(a->ctx, ZMQ_ROUTER);
    int zero = 0, one = 1, hwm = 1000, sndto = S_SEND_TIMEOUT_MS;
    int64_t maxmsg = 1LL << 31;
    zmq_setsockopt(a->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(a->router, ZMQ_SNDTIMEO, &sndto, sizeof sndto);
    zmq_setsockopt(a->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(a->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(a->router, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(a->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    char spub[KEYS_Z85_LEN + 1] = "";
    if (o->coordinator_key) {
        /* secure: CURVE with our long-term key (or a one-off one) to the
         * coordinator, and as the server of our data socket, whose ZAP
         * handler admits only the neighbours' keys */
        char kerr[1024];
        int krc = keys_read_public(o->coordinator_key, spub, kerr, sizeof kerr);
        if (krc == 0 && o->key_file)
            krc = keys_read_secret(o->key_file, &a->kp, kerr, sizeof kerr);
        else if (krc == 0) {
            krc = keys_new(&a->kp, kerr, sizeof kerr);
            if (krc == 0)
                log_warn("no --key: using a one-off CURVE key %.8s... (a restarted node needs a new join token; "
                         "HINT: tah-node keygen, then --key DIR/node.key)",
                         a->kp.pub);
        }
        if (krc == 0)
            krc = keys_set_server(a->router, &a->kp, kerr, sizeof kerr);
        if (krc != 0) {
            log_error("%s", kerr);
            goto out;
        }
        a->secure = 1;
        a->zap = zmq_socket(a->ctx, ZMQ_ROUTER);
        zmq_setsockopt(a->zap, ZMQ_LINGER, &zero, sizeof zero);
        if (zmq_bind(a->zap, "inproc://zeromq.zap.01") != 0) {
            log_error("cannot bind the ZAP handler: %s", zmq_strerror(errno));
            goto out;
        }
    }
    if (wire_endpoint(o->listen, ep, sizeof ep, err, sizeof err) != 0) {
        log_error("--listen %s", err);
        goto out;
    }
    if (zmq_bind(a->router, ep) != 0) {
        log_error("--listen %s: cannot bind %s: %s", o->listen, ep, zmq_strerror(errno));
        goto out;
    }
    size_t el = sizeof a->endpoint;
    zmq_getsockopt(a->router, ZMQ_LAST_ENDPOINT, a->endpoint, &el);
    if (o->advertise) {
        const char *port = strrchr(a->endpoint, ':');
        char adv[300];
        if (strchr(o->advertise, ':')) /* HOST:PORT (a port forward) */
            snprintf(adv, sizeof adv, "tcp://%s", o->advertise);
        else
            snprintf(adv, sizeof adv, "tcp://%s%s", o->advertise, port ? port : "");
        snprintf(a->endpoint, sizeof a->endpoint, "%s", adv);
    }
    if (s_new_pipe(a) != 0)
        goto out;
    if (wire_endpoint(o->coordinator, ep, sizeof ep, err, sizeof err) != 0) {
        log_error("--coordinator %s", err);
        goto out;
    }
    a->coord = zmq_socket(a->ctx, ZMQ_DEALER);
    int ivl = 200;
    zmq_setsockopt(a->coord, ZMQ_LINGER, &zero, sizeof zero);
    /* queue nothing while disconnected: a restarted coordinator must not
     * receive a burst of stale hellos and heartbeats */
    zmq_setsockopt(a->coord, ZMQ_IMMEDIATE, &one, sizeof one);
    zmq_setsockopt(a->coord, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    int64_t cmax = WIRE_MAX_CONTROL;
    zmq_setsockopt(a->coord, ZMQ_MAXMSGSIZE, &cmax, sizeof cmax);
    if (a->secure) {
        char kerr[512];
        if (keys_set_client(a->coord, spub, &a->kp, kerr, sizeof kerr) != 0) {
            log_error("%s", kerr);
            goto out;
        }
        log_info("CURVE to the coordinator %.8s..., node key %s", spub, a->kp.pub);
    }
    if (zmq_connect(a->coord, ep) != 0) {
        log_error("--coordinator %s: cannot connect: %s", ep, zmq_strerror(errno));
        goto out;
    }
    if (o->cuda)
        log_info("data endpoint %s, coordinator %s, GPU speed %.0f GFLOP/s fp32, %.0f GFLOP/s bf16 (GPUs %s)",
                 a->endpoint, ep, a->gflops, o->gpu_gflops[1], o->device_id);
    else
        log_info("data endpoint %s, coordinator %s, %.1f GFLOP/s (%d threads)", a->endpoint, ep, a->gflops,
                 o->threads > 0 ? o->threads : 1);

    /* TAH_NODE_TEST_FETCH_DELAY_MS=N: fetching a checkpoint replica starts
     * N ms after the Assign (fault injection for tests: a slow control link;
     * the agent stays in FETCHING meanwhile) */
    if (node_test_setting("TAH_NODE_TEST_FETCH_DELAY_MS", &a->fetch_delay_ms, err, sizeof err) != 0) {
        log_error("%s", err);
        goto out;
    }
    a->state = A_ANNOUNCING;
    a->last_coord = s_now();
    s_send_hello(a);
    for (;;) {
        int sig = a->exiting ? 0 : atomic_exchange(&s_signal, 0);
        if (sig) {
            if (a->job && (a->state == A_FETCHING || a->state == A_LOADING || a->state == A_RUNNING) &&
                !a->leaving && !a->exit_pending) {
                /* graceful: finish the step, checkpoint, hand the stage over. Also
                 * while the stage is still fetched or loaded (Ctrl-C during start-up):
                 * the coordinator's Drain is kept for the runner (see drain(D)), which
                 * then runs with the others up to D; cur_step is 0 until it starts */
                log_info("signal %d: leaving after the coordinator moves stage %d (signal again: stop now)", sig,
                         a->job->stage);
                a->leaving = 1;
                s_send_event(a, TAH__JOB_EVENT_KIND__EVENT_LEAVING, atomic_load(&a->job->cur_step),
                             "node leaving (signal)", -1);
            } else {
                log_info("signal %d: leaving", sig);
                a->exiting = 1;
                if (a->job)
                    s_abort(a, NODE_ABORTED, -1, "node shutting down (signal)");
            }
        }
        if (a->leave_wait > 0 && !a->exiting && s_now() - a->leave_wait > 10.0) {
            log_warn("leaving: no confirmation from the coordinator in 10 s; leaving anyway");
            a->exiting = 1;
        }
        if (a->exiting && !a->job)
            break;
        s_pump_uploads(a);
        if (a->state == A_FETCHING && a->fetch.start_at > 0 && s_now() >= a->fetch.start_at) {
            a->fetch.start_at = 0;
            s_fetch_next(a);
        }
        if (a->state == A_FETCHING && s_now() - a->fetch.progress > S_FETCH_TIMEOUT_S)
            s_abort(a, NODE_FAILED, -1, "no answer from the coordinator while fetching the checkpoint replica");
        double next = a->job ? s_flush(a) : -1.0;
        if (a->exit_pending && (!s_queued(a) || a->state != A_RUNNING) && a->nup == 0) {
            s_on_exit(a);
            next = -1.0;
        }
        if (a->exiting && !a->job)
            break;
        int timeout = 100;
        if (next >= 0 && next * 1e3 < timeout)
            timeout = (int)ceil(next * 1e3);
        zmq_pollitem_t it[6];
        int ni = 0;
        it[ni++] = (zmq_pollitem_t){ a->coord, 0, ZMQ_POLLIN, 0 };
        /* a full link queue stops the runner (back-pressure); so does a finished runner's */
        it[ni++] = (zmq_pollitem_t){ a->pipe, 0, (short)(s_any_full(a) || a->exit_pending ? 0 : ZMQ_POLLIN), 0 };
        int i_router = -1, i_down = -1, i_tied = -1, i_zap = -1;
        if (a->zap) {
            i_zap = ni;
            it[ni++] = (zmq_pollitem_t){ a->zap, 0, ZMQ_POLLIN, 0 };
        }
        /* a->guard: s_on_ready opened the links (a stage stopped while
         * loading has none, and no guard to check a message with) */
        if ((a->state == A_RUNNING || a->state == A_STOPPING) && a->guard) {
            i_router = ni;
            it[ni++] = (zmq_pollitem_t){ a->router, 0, ZMQ_POLLIN, 0 };
            if (a->down) {
                i_down = ni;
                it[ni++] = (zmq_pollitem_t){ a->down, 0, ZMQ_POLLIN, 0 };
            }
            if (a->tied) {
                i_tied = ni;
                it[ni++] = (zmq_pollitem_t){ a->tied, 0, ZMQ_POLLIN, 0 };
            }
        }
        int n = zmq_poll(it, ni, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            log_error("poll: %s", zmq_strerror(errno));
            break;
        }
        if (it[0].revents & ZMQ_POLLIN)
            s_on_coord(a);
        if (it[1].revents & ZMQ_POLLIN)
            s_on_pipe(a);
        if (i_zap >= 0 && (it[i_zap].revents & ZMQ_POLLIN))
            s_on_zap(a);
        if (a->nzap)
            s_zap_resolve(a, s_now()); /* an assignment may have arrived, or a wait ended */
        if (a->job && (a->state == A_RUNNING || a->state == A_STOPPING)) {
            if (i_router >= 0 && (it[i_router].revents & ZMQ_POLLIN))
                s_on_router(a);
            if (a->job && i_down >= 0 && a->down && (it[i_down].revents & ZMQ_POLLIN))
                s_on_dealer(a, a->down, a->job->stage + 1);
            if (a->job && i_tied >= 0 && a->tied && (it[i_tied].revents & ZMQ_POLLIN))
                s_on_dealer(a, a->tied, a->job->S - 1);
        }
        s_tick(a);
        if (a->exiting == 2)
            break;
    }
    rc = a->exiting == 2 ? 1 : 0;
out:
    if (a->thread_started) {
        atomic_store(&a->job->abort, 1);
        pthread_join(a->thread, NULL);
    }
    s_close_links(a);
    s_free_job(a);
    for (int i = 0; i < a->nup; i++)
        free(a->up[i].buf);
    if (a->coord) { /* let the last events (DRAINED, ABORTED) reach the coordinator */
        int linger = 2000;
        zmq_setsockopt(a->coord, ZMQ_LINGER, &linger, sizeof linger);
    }
    if (a->pipe)
        zmq_close(a->pipe);
    if (a->coord)
        zmq_close(a->coord);
    if (a->router)
        zmq_close(a->router);
    if (a->zap)
        zmq_close(a->zap);
    if (a->ctx)
        zmq_ctx_term(a->ctx);
    free(a);
out_signals:
    pthread_cancel(sig_thread);
    pthread_join(sig_thread, NULL);
    pthread_sigmask(SIG_SETMASK, &mask0, NULL);
    return rc;
}
