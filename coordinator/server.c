/* server.c — the coordinator daemon (see server.h). */
#include "server.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h> /* access */
#include <zmq.h>

#include "crc32c.h"    /* crc32c_update: checkpoint replicas */
#include "errors.h"
#include "fileio.h"    /* tah_file_write_atomic */
#include "jobfile.h"   /* jobfile_parse, jobfile_resolve */
#include "keys.h"      /* keys_read_secret, keys_set_server */
#include "log.h"
#include "placement.h" /* placement_split */
#include "store.h"
#include "token.h"     /* token_secret_load, token_create, token_verify */
#include "wire.h"

#define S_AGG 1024        /* steps aggregated at once per job: a restarted coordinator gets up to
                             1024 steps of reports from each node in turn (node backlog) */
#define S_HEARTBEAT_S 1.0 /* coordinator -> node heartbeat period */

enum { N_IDLE, N_BUSY, N_LOST };
static const char *s_node_state[] = { "idle", "busy", "lost" };

typedef struct cnode {
    char name[64], endpoint[256], backend[16];
    int threads;
    double gflops, gflops_bf16; /* announced speeds (gflops_bf16 0: as gflops) */
    char device_id[300];   /* a GPU node's GPUs ("": a CPU node); not stored: announced again */
    uint8_t rid[256];
    size_t rid_len;        /* 0: not connected (loaded from the database) */
    int state;
    int64_t job;
    int stage;
    int step;
    int leaving;           /* asked to leave (or left on its own): not placed until it re-announces */
    double last_seen;
    uint64_t rejected;
    long order;            /* announce order: placement prefers older nodes */
    char key[KEYS_Z85_LEN + 1]; /* its connection's CURVE public key (secure mode) */
    uint32_t seed_rules;   /* announced CODEC_SEED_RULES (0: an older build) */
    double report_at;      /* its assignment or adoption, then its latest accepted step report */
} cnode_t;

typedef struct cagg {      /* one step's reports, until every stage sent its own */
    int step, count;
    uint64_t wire, fwd, bwd, fp32, val; /* val: the validation pass's frames, not in the others */
    int has_loss, has_val;
    double loss, val_loss, lr, grad_norm, ms, time_s;
} cagg_t;

typedef struct cupload {   /* a checkpoint replica being received from a stage's node */
    FILE *f;               /* NULL: none in progress */
    int step;
    uint64_t off, total;
    uint32_t crc_want, crc;
    char path[1300];       /* final name; f writes path.part */
} cupload_t;

typedef struct crep {      /* a checkpoint replica held in STATE/jobs/<id>/ckpt */
    int stage, step;
    uint64_t size;
    uint32_t crc;
} crep_t;

typedef struct cjob {
    store_job_t j;         /* persisted (j.ini owned) */
    job_spec_t *spec;      /* parsed ini; NULL for finished jobs loaded at startup */
    char (*nodes)[64];     /* node of each stage (the latest placement) */
    int *l0, *l1;          /* layer range of each stage, fixed for the job's life (checkpoints hold it) */
    int ndone;
    FILE *mf;              /* metrics.jsonl while running */
    cagg_t *agg;           /* S_AGG, while the job is live */
    char link_note[512];   /* the job's in-process link emulation, for status ("" if none) */
    /* recovery (issue 8) */
    int resume_step;       /* the step the latest placement started from */
    char *need;            /* per stage: give it to another node than its last one */
    char (*banned)[64];    /* evicted nodes: never placed on this job again */
    int nbanned;
    int adopting;          /* paused by a coordinator restart: waiting for the nodes to re-announce */
    char *adopted;         /* per stage */
    double adopt_deadline; /* then the stages still missing count as lost */
    int drain_step;        /* > 0: Drain sent (a node leaves), waiting for every stage's DRAINED */
    int *drained;          /* per stage: the step it stopped after, 0 = not yet */
    cupload_t *up;         /* per stage */
    crep_t *reps;
    int nreps, capreps;
    /* stall watchdog: the latest sign of progress (placement, a step report,
     * a checkpoint chunk either way) and the last stage's latest step report
     * (0: none since placement); the slowest step seen is j.slowest_s (stored:
     * a restarted coordinator keeps its measure of a job's slow steps) */
    double progress_at, step_at;
} cjob_t;

/* What status says about a job's link settings: rate, delay and which
 * mechanism applies them ("delay: in-process (no netem)"). */
static void s_link_note(const job_spec_t *spec, char *buf, size_t n)
{
    char r[96], d[96];
    buf[0] = 0;
    if (!linkspec_any(&spec->link_rate) && !linkspec_any(&spec->link_delay))
        return;
    linkspec_format(&spec->link_rate, r, sizeof r);
    linkspec_format(&spec->link_delay, d, sizeof d);
    snprintf(buf, n, "rate %s Mbit/s (in-process token bucket); delay %s ms; delay: %s", r, d,
             !linkspec_any(&spec->link_delay) ? "none"
             : linkspec_netem_available() ? "in-process (netem exists but the job asks for the node's delay)"
                                          : "in-process (no netem)");
}

typedef struct coord {
    void *ctx, *router;
    store_t *store;
    char state_dir[1024];
    double node_timeout;
    cnode_t *nodes;
    int nnodes, capnodes;
    cjob_t **jobs;
    int njobs, capjobs;
    uint64_t rejected;
    long order;
    double last_beat;
    /* secure mode (not --open): CURVE keys, ZAP handler, join tokens */
    int secure;
    void *zap;                           /* REP on inproc://zeromq.zap.01 */
    keys_pair_t key;                     /* the coordinator's long-term pair */
    char admin_pub[KEYS_Z85_LEN + 1];    /* CLI requests must come from this key */
    uint8_t tsecret[TOKEN_SECRET_LEN];
    struct callow { int64_t job; char key[KEYS_Z85_LEN + 1]; } *allow; /* job allowlists */
    int nallow, capallow;
} coord_t;

static volatile sig_atomic_t s_stop = 0;

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int s_mkdirs(const char *path)
{
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* An array of n elements with room for *cap: returns it with room for one
 * more (realloc doubling, from 16; *cap updated), or NULL when out of
 * memory (the array and *cap unchanged). */
static void *s_grow(void *v, int n, int *cap, size_t size)
{
    if (n < *cap)
        return v;
    int ncap = *cap ? 2 * *cap : 16;
    void *nv = realloc(v, (size_t)ncap * size);
    if (nv)
        *cap = ncap;
    return nv;
}

/* ---- lookup ---- */

static cnode_t *s_node_by_rid(coord_t *c, const uint8_t *rid, size_t len)
{
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i].rid_len == len && !memcmp(c->nodes[i].rid, rid, len))
            return &c->nodes[i];
    return NULL;
}

static cnode_t *s_node_by_name(coord_t *c, const char *name)
{
    for (int i = 0; i < c->nnodes; i++)
        if (!strcmp(c->nodes[i].name, name))
            return &c->nodes[i];
    return NULL;
}

static cjob_t *s_job(coord_t *c, int64_t id)
{
    for (int i = 0; i < c->njobs; i++)
        if (c->jobs[i]->j.id == id)
            return c->jobs[i];
    return NULL;
}

static void s_node_save(coord_t *c, const cnode_t *n)
{
    store_node_upsert(c->store, n->name, n->endpoint, n->backend, n->threads, n->gflops, s_node_state[n->state],
                      n->job, n->stage, n->last_seen);
}

static void s_job_save(coord_t *c, cjob_t *j)
{
    char err[256];
    if (store_job_update(c->store, &j->j, err, sizeof err) != 0)
        log_error("job %lld: %s", (long long)j->j.id, err);
}

/* ---- sending ---- */

static void s_send_node(coord_t *c, cnode_t *n, Tah__Envelope *env)
{
    if (!n->rid_len)
        return;
    if (wire_send_envelope(c->router, n->rid, n->rid_len, env, ZMQ_DONTWAIT) != 0)
        log_warn("node %s: send %s failed: %s", n->name, wire_body_name(env), zmq_strerror(errno));
}

static void s_send_ok(coord_t *c, const uint8_t *rid, size_t rl)
{
    Tah__Ok ok = TAH__OK__INIT;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_OK;
    env.ok = &ok;
    wire_send_envelope(c->router, rid, rl, &env, ZMQ_DONTWAIT);
}

/* adopted: the node's running job goes on; step: the last one recorded */
static void s_send_welcome(coord_t *c, cnode_t *n, int adopted, int step)
{
    Tah__Welcome w = TAH__WELCOME__INIT;
    w.name = n->name;
    w.heartbeat_ms = 1000;
    w.adopted = adopted;
    w.step = step;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_WELCOME;
    env.welcome = &w;
    s_send_node(c, n, &env);
}

static void s_send_abort(coord_t *c, cnode_t *n, int64_t job, const char *reason)
{
    Tah__Abort ab = TAH__ABORT__INIT;
    ab.job = (uint64_t)job;
    ab.reason = (char *)reason;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_ABORT;
    env.abort = &ab;
    s_send_node(c, n, &env);
}

/* ---- job life cycle ---- */

static void s_job_finish(coord_t *c, cjob_t *j, const char *state, const char *reason, cnode_t *except)
{
    int was_running = !strcmp(j->j.state, "running") || !strcmp(j->j.state, "paused");
    j->adopting = 0;
    j->drain_step = 0;
    free(j->agg); /* no more reports */
    j->agg = NULL;
    snprintf(j->j.state, sizeof j->j.state, "%s", state);
    snprintf(j->j.reason, sizeof j->j.reason, "%s", reason ? reason : "");
    j->j.finished = s_now();
    s_job_save(c, j);
    if (j->mf) {
        fclose(j->mf);
        j->mf = NULL;
    }
    if (reason && *reason)
        log_info("job %lld: %s: %s", (long long)j->j.id, state, reason);
    else
        log_info("job %lld: %s at step %d", (long long)j->j.id, state, j->j.step);
    if (!was_running)
        return;
    /* stop the stages still working on it; they report ABORTED and go idle */
    for (int i = 0; i < c->nnodes; i++) {
        cnode_t *n = &c->nodes[i];
        if (n != except && n->state == N_BUSY && n->job == j->j.id)
            s_send_abort(c, n, j->j.id, reason ? reason : state);
    }
}

static int s_cmp_order(const void *a, const void *b)
{
    const cnode_t *x = *(cnode_t *const *)a, *y = *(cnode_t *const *)b;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Start the oldest queued job when enough nodes are idle. */
/* Whether key is on job's allowlist (job 0: on any). */
static int s_allowed(const coord_t *c, int64_t job, const char *key)
{
    for (int i = 0; i < c->nallow; i++)
        if ((job == 0 || c->allow[i].job == job) && !strcmp(c->allow[i].key, key))
            return 1;
    return 0;
}

static void s_allow_load(void *arg, int64_t job, const char *key)
{
    coord_t *c = arg;
    if (strlen(key) != KEYS_Z85_LEN || s_allowed(c, job, key))
        return;
    struct callow *na = s_grow(c->allow, c->nallow, &c->capallow, sizeof *na);
    if (!na)
        return;
    c->allow = na;
    c->allow[c->nallow].job = job;
    memcpy(c->allow[c->nallow].key, key, KEYS_Z85_LEN + 1);
    c->nallow++;
}

/* ---- per-stage job state ---- */

static int s_job_stages_alloc(cjob_t *j)
{
    const size_t S = (size_t)j->j.stages;
    if (j->need)
        return 0;
    j->nodes = j->nodes ? j->nodes : calloc(S, sizeof *j->nodes);
    j->l0 = calloc(S, sizeof *j->l0);
    j->l1 = calloc(S, sizeof *j->l1);
    j->need = calloc(S, 1);
    j->adopted = calloc(S, 1);
    j->drained = calloc(S, sizeof *j->drained);
    j->up = calloc(S, sizeof *j->up);
    j->agg = calloc(S_AGG, sizeof *j->agg);
    if (!j->nodes || !j->l0 || !j->l1 || !j->need || !j->adopted || !j->drained || !j->up || !j->agg)
        return TAH_ENOMEM;
    for (size_t k = 0; k < S; k++)
        j->l0[k] = j->l1[k] = -1;
    return 0;
}

static void s_job_free(cjob_t *j)
{
    if (j->mf)
        fclose(j->mf);
    for (int k = 0; j->up && k < j->j.stages; k++)
        if (j->up[k].f)
            fclose(j->up[k].f);
    free(j->j.ini);
    free(j->spec);
    free(j->nodes);
    free(j->l0);
    free(j->l1);
    free(j->need);
    free(j->adopted);
    free(j->drained);
    free(j->up);
    free(j->agg);
    free(j->banned);
    free(j->reps);
    free(j);
}

static void s_agg_reset(cjob_t *j)
{
    for (int a = 0; j->agg && a < S_AGG; a++)
        j->agg[a].step = -1;
}

static int s_banned(const cjob_t *j, const char *name)
{
    for (int i = 0; i < j->nbanned; i++)
        if (!strcmp(j->banned[i], name))
            return 1;
    return 0;
}

static void s_ban(cjob_t *j, const char *name)
{
    if (s_banned(j, name))
        return;
    char(*nb)[64] = realloc(j->banned, (size_t)(j->nbanned + 1) * sizeof *nb);
    if (!nb)
        return;
    j->banned = nb;
    snprintf(j->banned[j->nbanned++], 64, "%s", name);
}

/* A job event for the record (SQLite events table, `status`). */
static void s_event(coord_t *c, cjob_t *j, const char *kind, const char *node, int stage, int step,
                    const char *detail)
{
    store_event_t e;
    memset(&e, 0, sizeof e);
    e.job = j->j.id;
    e.time = s_now();
    snprintf(e.kind, sizeof e.kind, "%s", kind);
    snprintf(e.node, sizeof e.node, "%s", node ? node : "");
    e.stage = stage;
    e.step = step;
    snprintf(e.detail, sizeof e.detail, "%s", detail ? detail : "");
    store_event_add(c->store, &e);
    log_info("job %lld: event %s at step %d%s%s: %s", (long long)j->j.id, kind, step, node && *node ? ", node " : "",
             node ? node : "", e.detail);
}

/* ---- checkpoint replicas ---- */

static void s_ckpt_path(const coord_t *c, const cjob_t *j, int stage, int step, char *buf, size_t n)
{
    snprintf(buf, n, "%s/jobs/%lld/ckpt/stage%d.step%d.ckpt", c->state_dir, (long long)j->j.id, stage, step);
}

static const crep_t *s_rep_find(const cjob_t *j, int stage, int step)
{
    for (int i = 0; i < j->nreps; i++)
        if (j->reps[i].stage == stage && j->reps[i].step == step)
            return &j->reps[i];
    return NULL;
}

static void s_rep_add(cjob_t *j, int stage, int step, uint64_t size, uint32_t crc)
{
    crep_t *r = (crep_t *)s_rep_find(j, stage, step);
    if (!r) {
        crep_t *nr = s_grow(j->reps, j->nreps, &j->capreps, sizeof *nr);
        if (!nr)
            return;
        j->reps = nr;
        r = &j->reps[j->nreps++];
    }
    *r = (crep_t){ stage, step, size, crc };
}

static void s_rep_load(void *arg, int stage, int step, uint64_t size, uint32_t crc)
{
    cjob_t *j = arg;
    if (stage >= 0 && stage < j->j.stages && step > 0)
        s_rep_add(j, stage, step, size, crc);
}

/* The newest step every stage has a replica of becomes the job's
 * ckpt_step; older replicas are deleted (files and rows). */
static void s_rep_complete(coord_t *c, cjob_t *j)
{
    int best = j->j.ckpt_step;
    for (int i = 0; i < j->nreps; i++) {
        int step = j->reps[i].step, all = 1;
        if (step <= best)
            continue;
        for (int k = 0; k < j->j.stages && all; k++)
            all = s_rep_find(j, k, step) != NULL;
        if (all)
            best = step;
    }
    if (best == j->j.ckpt_step)
        return;
    j->j.ckpt_step = best;
    int kept = 0;
    for (int i = 0; i < j->nreps; i++) {
        if (j->reps[i].step >= best) {
            j->reps[kept++] = j->reps[i];
            continue;
        }
        char path[1300];
        s_ckpt_path(c, j, j->reps[i].stage, j->reps[i].step, path, sizeof path);
        unlink(path);
    }
    j->nreps = kept;
    store_ckpt_delete_before(c->store, j->j.id, best);
    s_job_save(c, j);
    log_info("job %lld: every stage has a checkpoint replica of step %d", (long long)j->j.id, best);
}

/* ---- placement ---- */

static uint64_t s_random64(void)
{
    uint64_t v = 0;
    FILE *ur = fopen("/dev/urandom", "rb");
    if (!ur || fread(&v, sizeof v, 1, ur) != 1)
        v = (uint64_t)(s_now() * 1e6) ^ ((uint64_t)getpid() << 32);
    if (ur)
        fclose(ur);
    return v;
}

/* metrics.jsonl keeps the steps <= step (a rollback replays the rest) and
 * is reopened for appending; the metrics table likewise. */
static void s_metrics_reopen(coord_t *c, cjob_t *j, int step)
{
    if (j->mf) {
        fclose(j->mf);
        j->mf = NULL;
    }
    store_metrics_truncate(c->store, j->j.id, step);
    uint8_t *buf = NULL;
    size_t len = 0;
    char err[512];
    if (tah_file_read(j->j.metrics_path, 64u << 20, &buf, &len, err, sizeof err) == 0) {
        size_t keep = 0;
        for (size_t pos = 0; pos < len;) {
            const uint8_t *nl = memchr(buf + pos, '\n', len - pos);
            size_t end = nl ? (size_t)(nl - buf) + 1 : len;
            int st = 0;
            if (sscanf((const char *)buf + pos, "{\"step\":%d", &st) != 1 || st > step)
                break;
            keep = end;
            pos = end;
        }
        if (keep < len) {
            const void *parts[1] = { buf };
            size_t sizes[1] = { keep };
            if (tah_file_write_atomic(j->j.metrics_path, parts, sizes, 1, err, sizeof err) != 0)
                log_warn("job %lld: %s", (long long)j->j.id, err);
        }
        free(buf);
    }
    j->mf = fopen(j->j.metrics_path, "a");
    if (!j->mf)
        log_warn("job %lld: cannot append to %s: %s", (long long)j->j.id, j->j.metrics_path, strerror(errno));
}

/* 1 if one of the job's link codecs rounds stochastically: its frames
 * carry seeds derived by the rules of CODEC_SEED_RULES (the tensor-parallel
 * all-reduce stays inside a node) */
static int s_job_stochastic(const cjob_t *j)
{
    const char *specs[3] = { j->spec->t.fwd_codec, j->spec->t.bwd_codec, j->spec->t.tied_codec };
    for (int k = 0; k < 3; k++) {
        codec_spec_t s;
        if (codec_spec_parse(specs[k], &s, NULL, 0) == 0 && s.id == CODEC_FIXPT && s.p.fixpt.stochastic)
            return 1;
    }
    return 0;
}

/* A node of another CODEC_SEED_RULES cannot share a stochastic job: the
 * frames it sends would be rejected, and it evicted, as a bad sender. */
static int s_seed_rules_ok(const cjob_t *j, const cnode_t *n)
{
    return n->seed_rules == CODEC_SEED_RULES || !s_job_stochastic(j);
}

/* idle, connected, staying, admitted to the job, not banned from it */
static int s_free_for(const coord_t *c, const cjob_t *j, const cnode_t *n)
{
    return n->state == N_IDLE && n->rid_len && !n->leaving && !s_banned(j, n->name) &&
           (!c->secure || s_allowed(c, j->j.id, n->key));
}

static int s_placeable(const coord_t *c, const cjob_t *j, const cnode_t *n)
{
    return s_free_for(c, j, n) && s_seed_rules_ok(j, n);
}

/* Send Assign to the S chosen nodes (placement number j.epoch, a new data
 * token, resume from j->resume_step's replicas when > 0). */
static void s_assign(coord_t *c, cjob_t *j, cnode_t **chosen)
{
    const int S = j->j.stages;
    char *eps[S], *names[S], *keys[S];
    char prefix[2200];
    if (j->spec->t.save_ckpt[0])
        jobfile_resolve(j->j.base_dir, j->spec->t.save_ckpt, prefix, sizeof prefix);
    else
        snprintf(prefix, sizeof prefix, "%s/job%lld", j->j.base_dir, (long long)j->j.id);
    uint64_t token = s_random64();
    j->j.epoch++;
    store_begin(c->store);
    for (int k = 0; k < S; k++) {
        keys[k] = chosen[k]->key;
        snprintf(j->nodes[k], sizeof j->nodes[k], "%s", chosen[k]->name);
        eps[k] = chosen[k]->endpoint;
        names[k] = chosen[k]->name;
        store_assignment_insert(c->store, j->j.id, k, chosen[k]->name, j->l0[k], j->l1[k], chosen[k]->endpoint);
    }
    for (int k = 0; k < S; k++) {
        Tah__Assign as = TAH__ASSIGN__INIT;
        as.job = (uint64_t)j->j.id;
        as.stage = (uint32_t)k;
        as.stages = (uint32_t)S;
        as.layer0 = j->l0[k];
        as.layer1 = j->l1[k];
        as.n_endpoints = (size_t)S;
        as.endpoints = eps;
        as.n_nodes = (size_t)S;
        as.nodes = names;
        as.n_keys = c->secure ? (size_t)S : 0;
        as.keys = keys;
        as.ini = j->j.ini;
        as.base_dir = j->j.base_dir;
        as.token = token;
        as.peer_timeout_ms = (uint32_t)(c->node_timeout * 1000.0 + 5000.0);
        as.ckpt_prefix = prefix;
        as.epoch = (uint32_t)j->j.epoch;
        const crep_t *rp = j->resume_step > 0 ? s_rep_find(j, k, j->resume_step) : NULL;
        if (rp) {
            as.resume_step = j->resume_step;
            as.ckpt_size = rp->size;
            as.ckpt_crc = rp->crc;
        }
        Tah__Envelope env = TAH__ENVELOPE__INIT;
        env.body_case = TAH__ENVELOPE__BODY_ASSIGN;
        env.assign = &as;
        s_send_node(c, chosen[k], &env);
        chosen[k]->state = N_BUSY;
        chosen[k]->job = j->j.id;
        chosen[k]->stage = k;
        chosen[k]->step = j->resume_step;
        chosen[k]->report_at = s_now();
        s_node_save(c, chosen[k]);
        if (j->l0[k] >= 0)
            log_info("job %lld: stage %d (layers %d..%d) -> node %s at %s%s", (long long)j->j.id, k, j->l0[k],
                     j->l1[k] - 1, chosen[k]->name, chosen[k]->endpoint, rp ? " (from its checkpoint replica)" : "");
        else
            log_info("job %lld: stage %d -> node %s at %s", (long long)j->j.id, k, chosen[k]->name,
                     chosen[k]->endpoint);
    }
    snprintf(j->j.state, sizeof j->j.state, "running");
    j->j.reason[0] = 0;
    j->ndone = 0;
    j->drain_step = 0;
    j->progress_at = s_now();
    j->step_at = 0;
    for (int k = 0; k < S; k++) {
        j->need[k] = 0;
        j->drained[k] = 0;
    }
    s_agg_reset(j);
    s_job_save(c, j);
    store_commit(c->store);
}

/* A paused job goes on when every stage has a node: its previous one when
 * that is idle and not to be replaced, else a spare (idle, admitted to the
 * job, not banned from it), oldest first. */
static void s_try_resume(coord_t *c, cjob_t *j)
{
    const int S = j->j.stages;
    if (j->adopting || !j->spec)
        return;
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i].state == N_BUSY && c->nodes[i].job == j->j.id)
            return; /* still stopping its old run */
    cnode_t *chosen[S];
    char used[c->nnodes > 0 ? c->nnodes : 1];
    memset(used, 0, sizeof used);
    for (int k = 0; k < S; k++) {
        chosen[k] = NULL;
        cnode_t *prev = j->nodes[k][0] ? s_node_by_name(c, j->nodes[k]) : NULL;
        if (!j->need[k] && prev && s_placeable(c, j, prev)) {
            chosen[k] = prev;
            used[prev - c->nodes] = 1;
        }
    }
    for (int k = 0; k < S; k++) {
        if (chosen[k])
            continue;
        cnode_t *best = NULL;
        for (int i = 0; i < c->nnodes; i++) {
            cnode_t *n = &c->nodes[i];
            if (used[i] || !s_placeable(c, j, n) || (j->need[k] && !strcmp(n->name, j->nodes[k])))
                continue;
            if (!best || n->order < best->order)
                best = n;
        }
        if (!best) {
            char why[512];
            snprintf(why, sizeof why, "waiting for a node for stage %d (was %s); resumes from step %d", k,
                     j->nodes[k], j->resume_step);
            if (strcmp(j->j.reason, why) != 0) {
                snprintf(j->j.reason, sizeof j->j.reason, "%s", why);
                s_job_save(c, j);
                log_info("job %lld: %s", (long long)j->j.id, why);
            }
            return;
        }
        chosen[k] = best;
        used[best - c->nodes] = 1;
    }
    char detail[512] = "";
    size_t dl = 0;
    for (int k = 0; k < S; k++)
        if (strcmp(chosen[k]->name, j->nodes[k]) != 0 && dl < sizeof detail)
            dl += (size_t)snprintf(detail + dl, sizeof detail - dl, "%sstage %d: %s -> %s", dl ? ", " : "", k,
                                   j->nodes[k], chosen[k]->name);
    s_metrics_reopen(c, j, j->resume_step);
    s_event(c, j, "resumed", "", -1, j->resume_step, detail[0] ? detail : "same nodes");
    s_assign(c, j, chosen);
}

/* Start queued jobs when enough nodes are idle (oldest job first), and
 * resume paused ones. */
static void s_try_place(coord_t *c)
{
    for (int q = 0; q < c->njobs; q++) {
        cjob_t *j = c->jobs[q];
        if (!strcmp(j->j.state, "paused"))
            s_try_resume(c, j);
        if (strcmp(j->j.state, "queued") != 0 || !j->spec)
            continue;
        const int S = j->j.stages;
        cnode_t *idle[c->nnodes > 0 ? c->nnodes : 1];
        int nidle = 0, nold = 0;
        for (int i = 0; i < c->nnodes; i++) {
            if (s_placeable(c, j, &c->nodes[i]))
                idle[nidle++] = &c->nodes[i];
            else if (s_free_for(c, j, &c->nodes[i]))
                nold++; /* placeable but for its build */
        }
        if (nidle < S) {
            /* say why the job waits while nodes of another build are idle; stop once none is */
            char why[256] = "";
            if (nold > 0)
                snprintf(why, sizeof why,
                         "waiting for nodes: %d idle node%s of another build cannot take a stochastic codec's "
                         "frames (codec seed rules %u here); HINT: update them",
                         nold, nold == 1 ? "" : "s", CODEC_SEED_RULES);
            if (strcmp(j->j.reason, why) != 0 && (nold > 0 || strstr(j->j.reason, " of another build "))) {
                snprintf(j->j.reason, sizeof j->j.reason, "%s", why);
                s_job_save(c, j);
                if (nold > 0)
                    log_warn("job %lld: %s", (long long)j->j.id, why);
            }
            if (c->secure)
                continue; /* a job waits for nodes admitted to it; others may start */
            return;   /* jobs start in submission order */
        }
        qsort(idle, (size_t)nidle, sizeof idle[0], s_cmp_order);
        if (s_job_stages_alloc(j) != 0) {
            log_error("job %lld: out of memory placing", (long long)j->j.id);
            return;
        }
        double speed[S], f32[S], bf16[S];
        const char *dev[S];
        for (int k = 0; k < S; k++) {
            f32[k] = idle[k]->gflops;
            bf16[k] = idle[k]->gflops_bf16;
            dev[k] = idle[k]->device_id;
        }
        placement_speeds(S, f32, bf16, dev, j->spec->t.precision == 1, speed);
        int L = j->spec->t.model[0] ? j->spec->t.mcfg.L : -1;
        /* init_from: the layer count is in the model file, which the nodes
         * read; they split it by tah-train's rule (sent as -1) */
        if (L >= 0 && placement_split(L, S, speed, j->l0, j->l1) != 0) {
            s_job_finish(c, j, "failed", "cannot place: stages exceed layers", NULL);
            continue;
        }
        char metrics_dir[1200];
        snprintf(metrics_dir, sizeof metrics_dir, "%s", j->j.metrics_path);
        char *slash = strrchr(metrics_dir, '/');
        if (slash)
            *slash = 0;
        if (s_mkdirs(metrics_dir) != 0 || !(j->mf = fopen(j->j.metrics_path, "w"))) {
            char reason[1400];
            snprintf(reason, sizeof reason, "cannot write metrics %s: %s", j->j.metrics_path, strerror(errno));
            s_job_finish(c, j, "failed", reason, NULL);
            continue;
        }
        j->j.started = s_now();
        j->resume_step = 0;
        s_assign(c, j, idle);
    }
}

/* Something took a stage away from a running job (node lost, evicted,
 * left without draining, or missing after a coordinator restart): record
 * it, stop the other stages, roll back to the last complete set of
 * checkpoint replicas, and pause until every stage has a node (stage k
 * moves to another node). Past max_recoveries the job fails instead. */
static void s_job_pause(coord_t *c, cjob_t *j, const char *kind, const char *node, int stage, int step,
                        const char *detail)
{
    int running = !strcmp(j->j.state, "running"), paused = !strcmp(j->j.state, "paused");
    if (!running && !paused)
        return;
    /* One loss, one event: a node reported by a neighbour is still busy until its heartbeat
     * runs out (the job resumes only then), and that second verdict came with the rolled-back
     * step (the chaos test's record: node_lost at step 30 from the neighbour, then at step 26). */
    if (paused && !j->adopting && !strcmp(kind, "node_lost") && stage >= 0 && stage < j->j.stages && j->need &&
        j->need[stage] && j->nodes && node && !strcmp(node, j->nodes[stage]))
        return;
    s_event(c, j, kind, node, stage, step, detail);
    if (stage >= 0 && stage < j->j.stages && j->need)
        j->need[stage] = 1;
    if (paused && !j->adopting)
        return; /* already stopped; this stage will get another node too */
    int limit = j->spec ? j->spec->max_recoveries : 0;
    if (j->j.recoveries >= limit || !j->need) {
        char reason[1024];
        if (limit > 0)
            snprintf(reason, sizeof reason, "%.700s (gave up after %d recoveries: max_recoveries)", detail, limit);
        else
            snprintf(reason, sizeof reason, "%.700s", detail);
        s_job_finish(c, j, "failed", reason, NULL);
        return;
    }
    j->j.recoveries++;
    j->adopting = 0;
    j->drain_step = 0;
    j->resume_step = j->j.ckpt_step;
    snprintf(j->j.state, sizeof j->j.state, "paused");
    snprintf(j->j.reason, sizeof j->j.reason, "%.400s; rolling back to step %d", detail, j->resume_step);
    for (int i = 0; i < c->nnodes; i++) {
        cnode_t *n = &c->nodes[i];
        if (n->state == N_BUSY && n->job == j->j.id)
            s_send_abort(c, n, j->j.id, j->j.reason);
    }
    j->j.step = j->resume_step;
    s_metrics_reopen(c, j, j->resume_step);
    s_agg_reset(j);
    s_job_save(c, j);
    log_warn("job %lld: paused: %s", (long long)j->j.id, j->j.reason);
}

static void s_node_lost(coord_t *c, cnode_t *n, const char *why)
{
    log_warn("node %s: lost (%s)", n->name, why);
    int was_busy = n->state == N_BUSY;
    n->state = N_LOST;
    n->rid_len = 0;
    s_node_save(c, n);
    if (was_busy) {
        cjob_t *j = s_job(c, n->job);
        if (j) {
            char reason[512];
            snprintf(reason, sizeof reason, "node %s lost at step %d (%s)", n->name, j->j.step + 1, why);
            s_job_pause(c, j, "node_lost", n->name, n->stage, j->j.step + 1, reason);
        }
        s_try_place(c);
    }
}

/* ---- metrics ---- */

static void s_step_report(coord_t *c, cnode_t *n, const Tah__StepReport *r)
{
    cjob_t *j = s_job(c, (int64_t)r->job);
    if (!j || n->state != N_BUSY || n->job != (int64_t)r->job || (int)r->stage != n->stage ||
        (strcmp(j->j.state, "running") != 0 && !j->adopting) || r->step <= j->resume_step ||
        r->step <= n->step || r->step > j->j.steps) {
        c->rejected++;
        log_warn("node %s: step report for job %llu stage %u step %d does not match its assignment (node %s, job "
                 "%lld stage %d, last step %d; job %s from step %d); ignored",
                 n->name, (unsigned long long)r->job, r->stage, r->step, s_node_state[n->state], (long long)n->job,
                 n->stage, n->step, j ? j->j.state : "unknown", j ? j->resume_step : -1);
        return;
    }
    const int S = j->j.stages, k = n->stage;
    n->step = r->step;
    n->rejected = r->rejected;
    /* the stall watchdog's measure of a step: the node's own with its validation pass
     * (a placement's first step too), and for the last stage the time since its
     * previous report (with the checkpoint write). A node's own figure counts for no
     * more than the time since its assignment or previous report: a node cannot make
     * the limit longer than what the coordinator saw pass. */
    j->progress_at = s_now();
    const double ms = r->ms + r->val_ms; /* older nodes send no val_ms (0) */
    double took = isfinite(ms) && ms > 0 && ms < 1e10 ? ms / 1e3 : 0.0;
    if (took > j->progress_at - n->report_at)
        took = j->progress_at - n->report_at;
    n->report_at = j->progress_at;
    if (k == S - 1) {
        if (j->step_at > 0 && j->progress_at - j->step_at > took)
            took = j->progress_at - j->step_at;
        j->step_at = j->progress_at;
    }
    if (took > j->j.slowest_s) {
        j->j.slowest_s = took;
        s_job_save(c, j);
    }
    if (!j->agg)
        return;
    cagg_t *a = &j->agg[r->step % S_AGG];
    if (a->step != r->step) {
        memset(a, 0, sizeof *a);
        a->step = r->step;
    }
    a->count++;
    a->fwd += r->fwd_bytes;
    a->bwd += r->bwd_bytes;
    a->wire += r->fwd_bytes + r->bwd_bytes + r->tied_bytes;
    a->fp32 += r->fwd_fp32_bytes + r->bwd_fp32_bytes;
    a->val += r->val_bytes;
    double sec = r->ms / 1e3;
    store_begin(c->store);
    if (k < S - 1 && (r->fwd_bytes || r->val_bytes)) /* the link's totals: validation frames too */
        store_link_add(c->store, j->j.id, k, k + 1, r->fwd_bytes + r->val_bytes,
                       r->fwd_fp32_bytes + r->val_fp32_bytes, sec);
    if (k > 0 && r->bwd_bytes)
        store_link_add(c->store, j->j.id, k, k - 1, r->bwd_bytes, r->bwd_fp32_bytes, sec);
    if (r->tied_bytes)
        store_link_add(c->store, j->j.id, k, k == 0 ? S - 1 : 0, r->tied_bytes, r->tied_bytes, sec);
    if (k == S - 1) {
        a->has_loss = r->has_loss;
        a->loss = r->loss;
        a->has_val = r->has_val_loss;
        a->val_loss = r->val_loss;
        a->lr = r->lr;
        a->grad_norm = r->grad_norm;
        a->ms = r->ms;
        a->time_s = r->time_s;
    }
    if (a->count == S) {
        const trainopts_t *t = &j->spec->t;
        double tokens = (double)t->micro_batches * t->batch * t->seq;
        double tps = a->ms > 0 ? tokens / (a->ms / 1e3) : 0.0;
        double comp = (a->fwd + a->bwd) ? (double)a->fp32 / (double)(a->fwd + a->bwd) : 1.0;
        if (j->mf) {
            fprintf(j->mf,
                    "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,\"tokens_per_s\":%.1f,\"ms\":%.3f",
                    a->step, a->loss, a->lr, a->grad_norm, tps, a->ms);
            if (a->has_val)
                fprintf(j->mf, ",\"val_loss\":%.6f", a->val_loss);
            if (a->val)
                fprintf(j->mf, ",\"val_bytes\":%llu", (unsigned long long)a->val);
            fprintf(j->mf,
                    ",\"time_s\":%.3f,\"wire_bytes\":%llu,\"fwd_bytes\":%llu,\"bwd_bytes\":%llu,"
                    "\"fp32_bytes\":%llu,\"compression\":%.3f}\n",
                    a->time_s, (unsigned long long)a->wire, (unsigned long long)a->fwd,
                    (unsigned long long)a->bwd, (unsigned long long)a->fp32, comp);
            fflush(j->mf);
        }
        store_metric_t m = { .job = j->j.id, .step = a->step, .loss = a->loss, .lr = a->lr,
                             .grad_norm = a->grad_norm, .tokens_per_s = tps, .ms = a->ms, .time_s = a->time_s,
                             .has_val = a->has_val, .val_loss = a->val_loss, .wire_bytes = a->wire,
                             .fp32_bytes = a->fp32 };
        store_metric_insert(c->store, &m);
        if (a->step > j->j.step) {
            j->j.step = a->step;
            j->j.has_loss = a->has_loss;
            j->j.loss = a->loss;
            j->j.tokens_per_s = tps;
            s_job_save(c, j);
        }
        log_debug("job %lld step %d: loss %.4f, %.0f tok/s, %llu bytes on the wire", (long long)j->j.id, a->step,
                  a->loss, tps, (unsigned long long)a->wire);
        a->step = -1;
    }
    store_commit(c->store);
}

/* ---- handlers ---- */

static int s_valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
              ch == '_' || ch == '.'))
            return 0;
    }
    return 1;
}

/* Secure mode: may this connection (CURVE key uid) announce itself as a
 * node? A valid join token puts the key on its job's allowlist; a key
 * already on an allowlist needs none. 0, or -1 after refusing it. */
static int s_admit(coord_t *c, const uint8_t *rid, size_t rl, const Tah__Hello *h, const char *uid)
{
    char why[512] = "";
    if (strlen(uid) != KEYS_Z85_LEN) {
        snprintf(why, sizeof why, "connection has no CURVE key");
    } else if (h->token[0]) {
        uint64_t tj = 0;
        int64_t texp = 0;
        if (token_verify(c->tsecret, h->token, (int64_t)time(NULL), &tj, &texp, why, sizeof why) == 0) {
            cjob_t *j = s_job(c, (int64_t)tj);
            if (!j || (strcmp(j->j.state, "queued") != 0 && strcmp(j->j.state, "running") != 0 &&
                       strcmp(j->j.state, "paused") != 0)) {
                snprintf(why, sizeof why, "join token is for job %llu, which is %s", (unsigned long long)tj,
                         j ? j->j.state : "unknown");
            } else {
                if (!s_allowed(c, (int64_t)tj, uid)) {
                    s_allow_load(c, (int64_t)tj, uid);
                    store_allow_add(c->store, (int64_t)tj, uid, h->name, s_now());
                }
                log_info("node %s: key %.8s... admitted to job %llu by join token", h->name, uid,
                         (unsigned long long)tj);
                return 0;
            }
        }
        if (s_allowed(c, 0, uid)) {
            log_warn("node %s: join token refused (%s); admitted because its key is already on an allowlist",
                     h->name, why);
            return 0;
        }
    } else if (s_allowed(c, 0, uid)) {
        return 0;
    } else {
        snprintf(why, sizeof why,
                 "no join token, and key %.8s... is on no job's allowlist; HINT: tah-node join --token T with T "
                 "from `tah-coord token create --job J --expires 1h`",
                 uid);
    }
    c->rejected++;
    log_warn("node %s refused: %s", h->name, why);
    wire_send_error(c->router, rid, rl, TAH_EINVAL, "node %s refused: %s", h->name, why);
    return -1;
}

static void s_on_leaving(coord_t *c, cnode_t *n, cjob_t *j);

static void s_on_hello(coord_t *c, const uint8_t *rid, size_t rl, const Tah__Hello *h, const char *uid)
{
    if (!s_valid_name(h->name) || strncmp(h->endpoint, "tcp://", 6) != 0 || strlen(h->endpoint) >= 256 ||
        strlen(h->backend) >= 16 || !isfinite(h->gflops) || h->gflops < 0 || !isfinite(h->gflops_bf16) ||
        h->gflops_bf16 < 0 || strlen(h->device_id) >= sizeof c->nodes[0].device_id ||
        strspn(h->device_id, "0123456789abcdef,") != strlen(h->device_id) || h->threads < 1 || h->threads > 4096) {
        c->rejected++;
        wire_send_error(c->router, rid, rl, TAH_EINVAL,
                        "bad hello: name must be 1..63 of [A-Za-z0-9._-], endpoint tcp://HOST:PORT, threads >= 1, "
                        "speeds finite and >= 0, device id < 300 of [0-9a-f,]");
        log_warn("rejected hello (name '%.64s', endpoint '%.64s')", h->name, h->endpoint);
        return;
    }
    if (c->secure && s_admit(c, rid, rl, h, uid) != 0)
        return;
    double now = s_now();
    cnode_t *n = s_node_by_name(c, h->name);
    if (n && n->rid_len && (n->rid_len != rl || memcmp(n->rid, rid, rl)) && n->state != N_LOST &&
        now - n->last_seen < c->node_timeout) {
        c->rejected++;
        wire_send_error(c->router, rid, rl, TAH_EINVAL, "node name '%s' is in use by a live node; HINT: --name",
                        h->name);
        log_warn("node %s: second hello from another connection rejected (name in use)", h->name);
        return;
    }
    if (n && h->job && n->state == N_BUSY && n->job == (int64_t)h->job && n->stage == (int)h->stage &&
        n->rid_len == rl && !memcmp(n->rid, rid, rl)) {
        /* a second hello for a stage we already re-adopted (its reports
         * crossed our welcome): the same answer */
        n->last_seen = now;
        s_send_welcome(c, n, 1, n->step);
        return;
    }
    cnode_t *other = s_node_by_rid(c, rid, rl);
    if (other && other != n)
        other->rid_len = 0;
    if (!n) {
        cnode_t *nn = s_grow(c->nodes, c->nnodes, &c->capnodes, sizeof *nn);
        if (!nn)
            return;
        c->nodes = nn;
        n = &c->nodes[c->nnodes++];
        memset(n, 0, sizeof *n);
        snprintf(n->name, sizeof n->name, "%s", h->name);
    }
    /* a coordinator restart: the node still runs a stage of a job we
     * paused at startup; it goes on if that is the stage we gave it */
    cjob_t *aj = h->job ? s_job(c, (int64_t)h->job) : NULL;
    int adopt = aj && aj->adopting && aj->nodes && h->stage < (uint32_t)aj->j.stages &&
                !strcmp(aj->nodes[h->stage], h->name) && !aj->adopted[h->stage];
    if (n->state == N_BUSY && !(adopt && n->job == aj->j.id)) {
        /* it restarted while we thought it was working */
        cjob_t *j = s_job(c, n->job);
        if (j) {
            char reason[512];
            snprintf(reason, sizeof reason, "node %s lost at step %d (it re-announced itself)", n->name,
                     j->j.step + 1);
            n->state = N_IDLE;
            s_job_pause(c, j, "node_lost", n->name, n->stage, j->j.step + 1, reason);
        }
    }
    memcpy(n->rid, rid, rl);
    n->rid_len = rl;
    snprintf(n->key, sizeof n->key, "%s", c->secure ? uid : "");
    snprintf(n->endpoint, sizeof n->endpoint, "%s", h->endpoint);
    snprintf(n->backend, sizeof n->backend, "%s", h->backend[0] ? h->backend : "cpu");
    n->threads = (int)h->threads;
    n->gflops = h->gflops;
    n->gflops_bf16 = h->gflops_bf16;
    snprintf(n->device_id, sizeof n->device_id, "%s", h->device_id);
    n->seed_rules = h->seed_rules;
    n->state = N_IDLE;
    n->job = 0;
    n->stage = -1;
    n->step = 0;
    n->leaving = 0;
    n->last_seen = now;
    n->order = ++c->order;
    if (adopt) {
        n->state = N_BUSY;
        n->job = aj->j.id;
        n->stage = (int)h->stage;
        n->step = aj->j.step;
        n->report_at = s_now();
        aj->adopted[h->stage] = 1;
        int all = 1;
        for (int k = 0; k < aj->j.stages; k++)
            all &= aj->adopted[k];
        char d[128];
        snprintf(d, sizeof d, "stage %u at step %d re-adopted after the coordinator restart", h->stage, h->step);
        s_event(c, aj, "adopted", n->name, (int)h->stage, h->step, d);
        if (all) {
            aj->adopting = 0;
            snprintf(aj->j.state, sizeof aj->j.state, "running");
            aj->j.reason[0] = 0;
            aj->progress_at = s_now();
            aj->step_at = 0;
            s_job_save(c, aj);
            log_info("job %lld: every stage re-adopted; running", (long long)aj->j.id);
        }
    } else if (h->job) {
        log_info("node %s: still runs job %llu stage %u, which is not ours to continue; it will stop", h->name,
                 (unsigned long long)h->job, h->stage);
    }
    s_node_save(c, n);
    log_info("node %s: joined from %s (%s, %d threads, %.1f GFLOP/s)%s", n->name, n->endpoint, n->backend,
             n->threads, n->gflops, adopt ? ", running its stage" : "");
    s_send_welcome(c, n, adopt, adopt ? aj->j.step : 0);
    if (adopt && !strcmp(aj->j.state, "running")) {
        /* every stage is back: a node that asked to leave while the job
         * waited for the others gets its Drain now (else it would run on to
         * the job's end) */
        for (int k = 0; k < aj->j.stages; k++) {
            cnode_t *m = s_node_by_name(c, aj->nodes[k]);
            if (m && m->leaving && m->state == N_BUSY && m->job == aj->j.id)
                s_on_leaving(c, m, aj);
        }
    }
    s_try_place(c);
}

/* A node asks to leave (SIGTERM, tah-node leave) while running a stage:
 * every stage of its job finishes step D (the step after the newest one
 * reported), checkpoints, and reports DRAINED; then the stage moves to a
 * spare and the job goes on from D, with no rollback. */
static void s_on_leaving(coord_t *c, cnode_t *n, cjob_t *j)
{
    n->leaving = 1;
    if (strcmp(j->j.state, "running") != 0 || j->drain_step > 0) {
        log_info("job %lld: node %s asks to leave (job %s%s)", (long long)j->j.id, n->name, j->j.state,
                 j->drain_step > 0 ? ", already draining"
                 : j->adopting    ? "; it drains once every stage is re-adopted"
                                  : "");
        return;
    }
    int D = 0;
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i].state == N_BUSY && c->nodes[i].job == j->j.id && c->nodes[i].step > D)
            D = c->nodes[i].step;
    D++;
    if (D >= j->j.steps) {
        log_info("job %lld: node %s asks to leave; the job ends at step %d, it leaves then", (long long)j->j.id,
                 n->name, j->j.steps);
        return;
    }
    j->drain_step = D;
    snprintf(j->j.reason, sizeof j->j.reason, "draining at the end of step %d: node %s (stage %d) leaves", D,
             n->name, n->stage);
    s_job_save(c, j);
    log_info("job %lld: %s", (long long)j->j.id, j->j.reason);
    for (int i = 0; i < c->nnodes; i++) {
        cnode_t *m = &c->nodes[i];
        if (m->state != N_BUSY || m->job != j->j.id)
            continue;
        Tah__Drain d = TAH__DRAIN__INIT;
        d.job = (uint64_t)j->j.id;
        d.step = D;
        d.reason = j->j.reason;
        Tah__Envelope env = TAH__ENVELOPE__INIT;
        env.body_case = TAH__ENVELOPE__BODY_DRAIN;
        env.drain = &d;
        s_send_node(c, m, &env);
    }
}

/* Stage k stopped after step e->step (its checkpoint replica came first).
 * Once every stage has: the leavers' stages need other nodes, and the job
 * resumes from the drained step if all stopped there and the replicas of
 * that step are complete (else from the last complete set). */
static void s_on_drained(coord_t *c, cjob_t *j, int stage, int step)
{
    if (strcmp(j->j.state, "running") != 0 || j->drain_step <= 0 || stage < 0 || stage >= j->j.stages)
        return;
    j->drained[stage] = step > 0 ? step : -1;
    for (int k = 0; k < j->j.stages; k++)
        if (!j->drained[k])
            return;
    int same = 1;
    for (int k = 1; k < j->j.stages; k++)
        same &= j->drained[k] == j->drained[0];
    int D = j->drained[0];
    j->resume_step = same && D > 0 && j->j.ckpt_step == D ? D : j->j.ckpt_step;
    for (int k = 0; k < j->j.stages; k++) {
        cnode_t *m = s_node_by_name(c, j->nodes[k]);
        if (!m || !m->leaving)
            continue;
        j->need[k] = 1;
        char d[256];
        if (j->resume_step == D)
            snprintf(d, sizeof d, "node %s left after step %d; its stage moves on from there (no rollback)", m->name,
                     D);
        else
            snprintf(d, sizeof d, "node %s left after step %d; stages stopped at different steps, rolling back to %d",
                     m->name, D, j->resume_step);
        s_event(c, j, "leave", m->name, k, D, d);
    }
    j->drain_step = 0;
    j->j.recoveries++;
    snprintf(j->j.state, sizeof j->j.state, "paused");
    snprintf(j->j.reason, sizeof j->j.reason, "a node left after step %d; moving its stage", D);
    j->j.step = j->resume_step;
    s_job_save(c, j);
    s_try_place(c);
}

static void s_on_job_event(coord_t *c, cnode_t *n, const Tah__JobEvent *e)
{
    cjob_t *j = s_job(c, (int64_t)e->job);
    if (n->state != N_BUSY || n->job != (int64_t)e->job || !j) {
        log_info("node %s: event %u for job %llu it is not running; ignored", n->name, e->kind,
                 (unsigned long long)e->job);
        if (n->state == N_BUSY && !j)
            n->state = N_IDLE;
        return;
    }
    if (e->kind == TAH__JOB_EVENT_KIND__EVENT_LEAVING) {
        s_on_leaving(c, n, j);
        return;
    }
    int running = !strcmp(j->j.state, "running");
    const int stage = n->stage;
    n->state = N_IDLE;
    n->job = 0;
    n->stage = -1;
    s_node_save(c, n);
    char reason[1024];
    switch (e->kind) {
    case TAH__JOB_EVENT_KIND__EVENT_DONE:
        log_info("job %lld: node %s finished its stage", (long long)j->j.id, n->name);
        if (n->leaving) /* it asked to leave when the job was about to end: it may go now */
            s_send_ok(c, n->rid, n->rid_len);
        if (running && ++j->ndone == j->j.stages)
            s_job_finish(c, j, "succeeded", "", NULL);
        break;
    case TAH__JOB_EVENT_KIND__EVENT_DRAINED:
        log_info("job %lld: node %s stopped stage %d after step %d", (long long)j->j.id, n->name, stage, e->step);
        s_send_ok(c, n->rid, n->rid_len); /* a leaving node waits for this before it exits */
        s_on_drained(c, j, stage, e->step);
        break;
    case TAH__JOB_EVENT_KIND__EVENT_FAILED:
        if (!running)
            break;
        if (e->lost_stage >= 0 && e->lost_stage < j->j.stages && j->nodes) {
            /* a neighbour went silent or broke the link: its stage moves */
            snprintf(reason, sizeof reason, "node %s lost at step %d (reported by node %s: %.300s)",
                     j->nodes[e->lost_stage], e->step, n->name, e->reason);
            s_job_pause(c, j, "node_lost", j->nodes[e->lost_stage], e->lost_stage, e->step, reason);
        } else {
            /* the node's own computation failed: it would fail again */
            snprintf(reason, sizeof reason, "node %s at step %d: %.400s", n->name, e->step, e->reason);
            s_job_finish(c, j, "failed", reason, n);
        }
        break;
    default: /* aborted: on our request while paused, else it left without draining */
        log_info("job %lld: node %s stopped (%.200s)", (long long)j->j.id, n->name, e->reason);
        if (stage >= 0 && e->lost_stage == stage) {
            /* naming its own stage: its stage was stuck and the node exits (tah-node
             * --stop-timeout); not placed again until it announces itself anew */
            log_warn("job %lld: node %s gives up stage %d and exits: %.300s", (long long)j->j.id, n->name, stage,
                     e->reason);
            n->leaving = 1;
        }
        if (running) {
            n->leaving = 1;
            snprintf(reason, sizeof reason, "node %s left at step %d (%.300s)", n->name, e->step, e->reason);
            s_job_pause(c, j, "node_left", n->name, stage, e->step, reason);
        }
        break;
    }
    s_try_place(c);
}

/* A node rejected data messages from a neighbour of its job: log it, and
 * evict the sender once the count reaches the job's max_bad_frames: it is
 * banned from the job and its stage moves to another node (rollback to the
 * last complete checkpoint set). The count is the reporter's own; a report
 * about a stage the reporter does not share the job with is ignored. */
static void s_on_peer_report(coord_t *c, cnode_t *n, const Tah__PeerReport *r)
{
    cjob_t *j = s_job(c, (int64_t)r->job);
    if (n->state != N_BUSY || n->job != (int64_t)r->job || !j || strcmp(j->j.state, "running") != 0 || !j->spec ||
        !j->nodes || r->stage >= (uint32_t)j->j.stages || (int)r->stage == n->stage) {
        log_info("node %s: report about stage %u of job %llu it is not running with; ignored", n->name, r->stage,
                 (unsigned long long)r->job);
        return;
    }
    const char *bad = j->nodes[r->stage];
    log_warn("job %lld step %d: node %s rejected %llu data message%s from stage %u (node %s): %.300s",
             (long long)j->j.id, r->step, n->name, (unsigned long long)r->count, r->count == 1 ? "" : "s", r->stage,
             bad, r->reason);
    int limit = j->spec->max_bad_frames;
    if (limit > 0 && r->count >= (uint64_t)limit) {
        char reason[1024], name[64];
        snprintf(name, sizeof name, "%s", bad);
        snprintf(reason, sizeof reason,
                 "node %s (stage %u) evicted at step %d: %llu bad data messages rejected by node %s "
                 "(max_bad_frames %d; latest: %.300s)",
                 name, r->stage, r->step, (unsigned long long)r->count, n->name, limit, r->reason);
        s_ban(j, name);
        s_job_pause(c, j, "evicted", name, (int)r->stage, r->step, reason);
        s_try_place(c);
    }
}

/* ---- checkpoint replication ---- */

static void s_upload_drop(cupload_t *u, const char *why, const cjob_t *j, int stage)
{
    if (u->f) {
        fclose(u->f);
        char part[1400];
        snprintf(part, sizeof part, "%s.part", u->path);
        unlink(part);
        if (why)
            log_warn("job %lld: checkpoint replica of stage %d step %d dropped: %s", (long long)j->j.id, stage,
                     u->step, why);
    }
    memset(u, 0, sizeof *u);
}

#define S_CKPT_CHUNK (512u << 10)
#define S_CKPT_MAX (64ull << 30)

static void s_on_ckpt_put(coord_t *c, cnode_t *n, const Tah__CkptPut *p)
{
    cjob_t *j = s_job(c, (int64_t)p->job);
    if (!j || !j->up || n->state != N_BUSY || n->job != (int64_t)p->job || (int)p->stage != n->stage ||
        p->step < 1 || p->step > j->j.steps || p->total == 0 || p->total > S_CKPT_MAX ||
        p->data.len > S_CKPT_CHUNK || p->offset + p->data.len > p->total) {
        c->rejected++;
        log_warn("node %s: checkpoint chunk for job %llu stage %u step %d does not match its assignment or is "
                 "malformed; ignored",
                 n->name, (unsigned long long)p->job, p->stage, p->step);
        return;
    }
    cupload_t *u = &j->up[p->stage];
    char part[1400];
    if (p->offset == 0) {
        s_upload_drop(u, u->f ? "a newer one started" : NULL, j, (int)p->stage);
        s_ckpt_path(c, j, (int)p->stage, p->step, u->path, sizeof u->path);
        char dir[1300];
        snprintf(dir, sizeof dir, "%s", u->path);
        *strrchr(dir, '/') = 0;
        snprintf(part, sizeof part, "%s.part", u->path);
        if (s_mkdirs(dir) != 0 || !(u->f = fopen(part, "wb"))) {
            log_warn("job %lld: cannot write %s: %s", (long long)j->j.id, part, strerror(errno));
            memset(u, 0, sizeof *u);
            return;
        }
        u->step = p->step;
        u->total = p->total;
        u->crc_want = p->crc;
    } else if (!u->f || u->step != p->step || u->off != p->offset || u->total != p->total) {
        c->rejected++;
        log_warn("node %s: checkpoint chunk at offset %llu of stage %u step %d out of order; ignored", n->name,
                 (unsigned long long)p->offset, p->stage, p->step);
        return;
    }
    if (p->data.len && fwrite(p->data.data, 1, p->data.len, u->f) != p->data.len) {
        s_upload_drop(u, strerror(errno), j, (int)p->stage);
        return;
    }
    u->crc = crc32c_update(u->crc, p->data.data, p->data.len);
    u->off += p->data.len;
    j->progress_at = s_now(); /* a drained stage replicates its checkpoint before it reports */
    if (u->off < u->total)
        return;
    snprintf(part, sizeof part, "%s.part", u->path);
    if (u->crc != u->crc_want) {
        s_upload_drop(u, "CRC-32C mismatch", j, (int)p->stage);
        return;
    }
    if (fflush(u->f) != 0 || fsync(fileno(u->f)) != 0 || fclose(u->f) != 0) {
        u->f = NULL;
        unlink(part);
        log_warn("job %lld: writing %s failed: %s", (long long)j->j.id, part, strerror(errno));
        memset(u, 0, sizeof *u);
        return;
    }
    u->f = NULL;
    if (rename(part, u->path) != 0) {
        log_warn("job %lld: rename %s: %s", (long long)j->j.id, part, strerror(errno));
        unlink(part);
        memset(u, 0, sizeof *u);
        return;
    }
    store_ckpt_add(c->store, j->j.id, (int)p->stage, u->step, u->total, u->crc);
    s_rep_add(j, (int)p->stage, u->step, u->total, u->crc);
    log_debug("job %lld: checkpoint replica of stage %u step %d (%llu bytes)", (long long)j->j.id, p->stage, u->step,
              (unsigned long long)u->total);
    memset(u, 0, sizeof *u);
    s_rep_complete(c, j);
}

static void s_on_ckpt_get(coord_t *c, cnode_t *n, const Tah__CkptGet *g)
{
    cjob_t *j = s_job(c, (int64_t)g->job);
    Tah__CkptChunk ch = TAH__CKPT_CHUNK__INIT;
    ch.job = g->job;
    ch.stage = g->stage;
    ch.step = g->step;
    ch.offset = g->offset;
    uint8_t *buf = NULL;
    const crep_t *rp = NULL;
    if (j && n->state == N_BUSY && n->job == (int64_t)g->job && (int)g->stage == n->stage &&
        g->step == j->resume_step)
        rp = s_rep_find(j, (int)g->stage, g->step);
    if (!rp || g->offset >= rp->size) {
        c->rejected += !rp;
        log_warn("node %s: asked for checkpoint replica of job %llu stage %u step %d at %llu, which we %s",
                 n->name, (unsigned long long)g->job, g->stage, g->step, (unsigned long long)g->offset,
                 rp ? "hold but not that far" : "do not hold for it");
    } else {
        char path[1300];
        s_ckpt_path(c, j, (int)g->stage, g->step, path, sizeof path);
        size_t want = rp->size - g->offset < S_CKPT_CHUNK ? (size_t)(rp->size - g->offset) : S_CKPT_CHUNK;
        FILE *f = fopen(path, "rb");
        buf = malloc(want);
        if (f && buf && fseeko(f, (off_t)g->offset, SEEK_SET) == 0 && fread(buf, 1, want, f) == want) {
            ch.total = rp->size;
            ch.data.data = buf;
            ch.data.len = want;
            j->progress_at = s_now(); /* a resumed stage fetches its replica before its first step */
        } else {
            log_error("job %lld: cannot read %s: %s", (long long)j->j.id, path, strerror(errno));
        }
        if (f)
            fclose(f);
    }
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_CKPT_CHUNK;
    env.ckpt_chunk = &ch;
    s_send_node(c, n, &env);
    free(buf);
}

static void s_on_submit(coord_t *c, const uint8_t *rid, size_t rl, const Tah__SubmitReq *r)
{
    char err[1024];
    job_spec_t *spec = malloc(sizeof *spec);
    cjob_t *j = calloc(1, sizeof *j);
    if (!spec || !j) {
        free(spec);
        free(j);
        wire_send_error(c->router, rid, rl, TAH_ENOMEM, "out of memory");
        return;
    }
    const char *fname = r->file_name[0] ? r->file_name : "job.ini";
    if (jobfile_parse(r->ini, fname, spec, err, sizeof err) != 0 || r->base_dir[0] != '/' ||
        strlen(r->base_dir) >= sizeof j->j.base_dir) {
        if (r->base_dir[0] != '/')
            snprintf(err, sizeof err, "base_dir '%.200s' must be an absolute path", r->base_dir);
        log_info("submit of %.200s rejected: %s", fname, err);
        wire_send_error(c->router, rid, rl, TAH_EINVAL, "%s", err);
        free(spec);
        free(j);
        return;
    }
    cjob_t **nj = s_grow(c->jobs, c->njobs, &c->capjobs, sizeof *nj);
    if (!nj) {
        free(spec);
        free(j);
        wire_send_error(c->router, rid, rl, TAH_ENOMEM, "out of memory");
        return;
    }
    c->jobs = nj;
    j->spec = spec;
    s_link_note(spec, j->link_note, sizeof j->link_note);
    j->j.ini = strdup(r->ini);
    snprintf(j->j.name, sizeof j->j.name, "%s", spec->name);
    snprintf(j->j.base_dir, sizeof j->j.base_dir, "%s", r->base_dir);
    j->j.stages = spec->t.stages;
    j->j.steps = spec->t.steps;
    snprintf(j->j.state, sizeof j->j.state, "queued");
    j->j.submitted = s_now();
    if (!j->j.ini || store_job_insert(c->store, &j->j, err, sizeof err) != 0) {
        wire_send_error(c->router, rid, rl, TAH_EIO, "cannot store the job: %s", err);
        free(j->j.ini);
        free(spec);
        free(j);
        return;
    }
    if (spec->t.metrics[0])
        jobfile_resolve(r->base_dir, spec->t.metrics, j->j.metrics_path, sizeof j->j.metrics_path);
    else
        snprintf(j->j.metrics_path, sizeof j->j.metrics_path, "%s/jobs/%lld/metrics.jsonl", c->state_dir,
                 (long long)j->j.id);
    s_job_save(c, j);
    c->jobs[c->njobs++] = j;
    log_info("job %lld: submitted '%s' (%d stages, %d steps, codecs %s / %s)", (long long)j->j.id, j->j.name,
             j->j.stages, j->j.steps, spec->t.fwd_codec, spec->t.bwd_codec);
    Tah__SubmitRep rep = TAH__SUBMIT_REP__INIT;
    rep.job = (uint64_t)j->j.id;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_SUBMIT_REP;
    env.submit_rep = &rep;
    wire_send_envelope(c->router, rid, rl, &env, ZMQ_DONTWAIT);
    s_try_place(c);
}

static void s_on_cancel(coord_t *c, const uint8_t *rid, size_t rl, const Tah__CancelReq *r)
{
    cjob_t *j = s_job(c, (int64_t)r->job);
    if (!j) {
        wire_send_error(c->router, rid, rl, TAH_EINVAL, "no job %llu", (unsigned long long)r->job);
        return;
    }
    if (strcmp(j->j.state, "queued") != 0 && strcmp(j->j.state, "running") != 0 &&
        strcmp(j->j.state, "paused") != 0) {
        wire_send_error(c->router, rid, rl, TAH_EINVAL, "job %lld already ended (%s)", (long long)j->j.id,
                        j->j.state);
        return;
    }
    s_job_finish(c, j, "cancelled", "cancelled by user", NULL);
    s_send_ok(c, rid, rl);
}

static void s_on_token_req(coord_t *c, const uint8_t *rid, size_t rl, const Tah__TokenReq *r)
{
    if (!c->secure) {
        wire_send_error(c->router, rid, rl, TAH_EINVAL,
                        "this coordinator runs with --open: it admits any node, join tokens are not used");
        return;
    }
    cjob_t *j = s_job(c, (int64_t)r->job);
    if (!j || (strcmp(j->j.state, "queued") != 0 && strcmp(j->j.state, "running") != 0 &&
               strcmp(j->j.state, "paused") != 0)) {
        wire_send_error(c->router, rid, rl, TAH_EINVAL, "no queued, running or paused job %llu%s%s",
                        (unsigned long long)r->job, j ? ": it is " : "", j ? j->j.state : "");
        return;
    }
    if (r->expires_s <= 0 || r->expires_s > 10LL * 365 * 86400) {
        wire_send_error(c->router, rid, rl, TAH_EINVAL, "token lifetime %lld s out of range (1 s .. 10 years)",
                        (long long)r->expires_s);
        return;
    }
    char tok[TOKEN_MAX_LEN + 1];
    int64_t expires = (int64_t)time(NULL) + r->expires_s;
    if (token_create(c->tsecret, r->job, expires, tok, sizeof tok) != 0) {
        wire_send_error(c->router, rid, rl, TAH_EIO, "cannot make a token (RAND_bytes/HMAC failed)");
        return;
    }
    log_info("job %lld: join token issued, expires in %lld s", (long long)j->j.id, (long long)r->expires_s);
    Tah__TokenRep rep = TAH__TOKEN_REP__INIT;
    rep.token = tok;
    rep.expires = expires;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_TOKEN_REP;
    env.token_rep = &rep;
    wire_send_envelope(c->router, rid, rl, &env, ZMQ_DONTWAIT);
}

/* status reply: collectors for the store callbacks */
typedef struct s_links {
    Tah__LinkInfo **v;
    size_t n, cap;
} s_links_t;

static void s_collect_link(void *arg, int src, int dst, uint64_t bytes, uint64_t fp32, double seconds)
{
    s_links_t *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        Tah__LinkInfo **nv = realloc(l->v, cap * sizeof *nv);
        if (!nv)
            return;
        l->v = nv;
        l->cap = cap;
    }
    Tah__LinkInfo *li = malloc(sizeof *li);
    if (!li)
        return;
    tah__link_info__init(li);
    li->src_stage = (uint32_t)src;
    li->dst_stage = (uint32_t)dst;
    li->bytes = bytes;
    li->fp32_bytes = fp32;
    li->seconds = seconds;
    l->v[l->n++] = li;
}

typedef struct s_names {
    char **v;
    size_t n;
} s_names_t;

static void s_collect_name(void *arg, int stage, const char *node)
{
    s_names_t *l = arg;
    (void)stage;
    char **nv = realloc(l->v, (l->n + 1) * sizeof *nv);
    if (!nv)
        return;
    l->v = nv;
    l->v[l->n] = strdup(node);
    if (l->v[l->n])
        l->n++;
}

/* The newest S_EVENTS events of a job (status stays one small message). */
#define S_EVENTS 64
typedef struct s_events {
    Tah__EventInfo **v;
    size_t n;
} s_events_t;

static void s_collect_event(void *arg, const store_event_t *e)
{
    s_events_t *l = arg;
    if (!l->v && !(l->v = calloc(S_EVENTS, sizeof *l->v)))
        return;
    if (l->n == S_EVENTS) {
        free(l->v[0]);
        memmove(l->v, l->v + 1, (S_EVENTS - 1) * sizeof *l->v);
        l->n--;
    }
    /* one allocation: the message, then its strings */
    size_t kl = strlen(e->kind) + 1, nl = strlen(e->node) + 1, dl = strlen(e->detail) + 1;
    Tah__EventInfo *x = malloc(sizeof *x + kl + nl + dl);
    if (!x)
        return;
    tah__event_info__init(x);
    char *p = (char *)(x + 1);
    x->kind = memcpy(p, e->kind, kl);
    x->node = memcpy(p + kl, e->node, nl);
    x->detail = memcpy(p + kl + nl, e->detail, dl);
    x->time = e->time;
    x->stage = e->stage;
    x->step = e->step;
    l->v[l->n++] = x;
}

static void s_on_status(coord_t *c, const uint8_t *rid, size_t rl, const Tah__StatusReq *r)
{
    if (r->job && !s_job(c, (int64_t)r->job)) {
        wire_send_error(c->router, rid, rl, TAH_EINVAL, "no job %llu", (unsigned long long)r->job);
        return;
    }
    Tah__StatusRep rep = TAH__STATUS_REP__INIT;
    Tah__JobInfo *ji = calloc((size_t)c->njobs + 1, sizeof *ji);
    Tah__JobInfo **jp = calloc((size_t)c->njobs + 1, sizeof *jp);
    Tah__NodeInfo *ni = calloc((size_t)c->nnodes + 1, sizeof *ni);
    Tah__NodeInfo **np = calloc((size_t)c->nnodes + 1, sizeof *np);
    s_links_t *links = calloc((size_t)c->njobs + 1, sizeof *links);
    s_names_t *names = calloc((size_t)c->njobs + 1, sizeof *names);
    s_events_t *events = calloc((size_t)c->njobs + 1, sizeof *events);
    if (!ji || !jp || !ni || !np || !links || !names || !events) {
        wire_send_error(c->router, rid, rl, TAH_ENOMEM, "out of memory");
        goto out;
    }
    double now = s_now();
    for (int i = 0; i < c->njobs; i++) {
        const cjob_t *j = c->jobs[i];
        if (r->job && j->j.id != (int64_t)r->job)
            continue;
        Tah__JobInfo *x = &ji[rep.n_jobs];
        tah__job_info__init(x);
        x->id = (uint64_t)j->j.id;
        x->name = (char *)j->j.name;
        x->state = (char *)j->j.state;
        x->reason = (char *)j->j.reason;
        x->step = j->j.step;
        x->steps = j->j.steps;
        x->stages = (uint32_t)j->j.stages;
        x->has_loss = j->j.has_loss;
        x->loss = j->j.loss;
        x->tokens_per_s = j->j.tokens_per_s;
        x->metrics_path = (char *)j->j.metrics_path;
        x->link_shaping = (char *)j->link_note;
        x->submitted = j->j.submitted;
        x->finished = j->j.finished;
        x->ckpt_step = j->j.ckpt_step;
        x->recoveries = (uint32_t)j->j.recoveries;
        store_events_each(c->store, j->j.id, s_collect_event, &events[rep.n_jobs]);
        x->n_events = events[rep.n_jobs].n;
        x->events = events[rep.n_jobs].v;
        store_links_each(c->store, j->j.id, s_collect_link, &links[rep.n_jobs]);
        x->n_links = links[rep.n_jobs].n;
        x->links = links[rep.n_jobs].v;
        store_assignment_nodes(c->store, j->j.id, s_collect_name, &names[rep.n_jobs]);
        x->n_nodes = names[rep.n_jobs].n;
        x->nodes = names[rep.n_jobs].v;
        jp[rep.n_jobs++] = x;
    }
    for (int i = 0; i < c->nnodes; i++) {
        const cnode_t *n = &c->nodes[i];
        Tah__NodeInfo *x = &ni[rep.n_nodes];
        tah__node_info__init(x);
        x->name = (char *)n->name;
        x->state = (char *)s_node_state[n->state];
        x->job = n->state == N_BUSY ? (uint64_t)n->job : 0;
        x->stage = n->state == N_BUSY ? n->stage : -1;
        x->backend = (char *)n->backend;
        x->threads = (uint32_t)n->threads;
        x->gflops = n->gflops;
        x->gflops_bf16 = n->gflops_bf16;
        x->device_id = (char *)n->device_id;
        x->seed_rules = n->seed_rules;
        x->last_heartbeat = n->last_seen > 0 ? now - n->last_seen : -1.0;
        x->endpoint = (char *)n->endpoint;
        x->rejected = n->rejected;
        np[rep.n_nodes++] = x;
    }
    rep.jobs = jp;
    rep.nodes = np;
    rep.rejected = c->rejected;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_STATUS_REP;
    env.status_rep = &rep;
    wire_send_envelope(c->router, rid, rl, &env, ZMQ_DONTWAIT);
out:
    for (int i = 0; events && i <= c->njobs; i++) {
        for (size_t k = 0; k < events[i].n; k++)
            free(events[i].v[k]);
        free(events[i].v);
    }
    free(events);
    for (int i = 0; links && names && i <= c->njobs; i++) {
        for (size_t k = 0; k < links[i].n; k++)
            free(links[i].v[k]);
        free(links[i].v);
        for (size_t k = 0; k < names[i].n; k++)
            free(names[i].v[k]);
        free(names[i].v);
    }
    free(links);
    free(names);
    free(ji);
    free(jp);
    free(ni);
    free(np);
}

/* One message from the ROUTER: [routing id][envelope]. */
static void s_on_message(coord_t *c)
{
    zmq_msg_t part[3];
    int nparts = 0;
    wire_recv_parts(c->router, part, 3, &nparts);
    if (nparts == 0)
        return;
    const uint8_t *rid = zmq_msg_data(&part[0]);
    size_t rl = zmq_msg_size(&part[0]);
    char err[256];
    Tah__Envelope *e = NULL;
    if (rl > sizeof(((cnode_t *)0)->rid)) {
        c->rejected++;
        goto done;
    }
    if (nparts != 2) {
        c->rejected++;
        log_warn("rejected a %d-part control message (expected 1 part)", nparts - 1);
        wire_send_error(c->router, rid, rl, TAH_EINVAL, "control messages are one frame");
        goto done;
    }
    e = wire_envelope_unpack(zmq_msg_data(&part[1]), zmq_msg_size(&part[1]), err, sizeof err);
    if (!e) {
        c->rejected++;
        log_warn("rejected a control message: %s", err);
        wire_send_error(c->router, rid, rl, TAH_EINVAL, "%s", err);
        goto done;
    }
    cnode_t *n = s_node_by_rid(c, rid, rl);
    /* secure mode: the CURVE key the ZAP handler saw (Z85) */
    const char *uid = c->secure ? zmq_msg_gets(&part[1], "User-Id") : NULL;
    if (!uid)
        uid = "";
    if (c->secure && strcmp(uid, c->admin_pub) != 0 &&
        (e->body_case == TAH__ENVELOPE__BODY_SUBMIT || e->body_case == TAH__ENVELOPE__BODY_STATUS ||
         e->body_case == TAH__ENVELOPE__BODY_CANCEL || e->body_case == TAH__ENVELOPE__BODY_TOKEN_REQ)) {
        c->rejected++;
        log_warn("refused '%s' from key %.8s...: not the admin key", wire_body_name(e), uid);
        wire_send_error(c->router, rid, rl, TAH_EINVAL,
                        "'%s' refused: only the admin key may do that; HINT: --key STATE_DIR/admin.key",
                        wire_body_name(e));
        goto done;
    }
    switch (e->body_case) {
    case TAH__ENVELOPE__BODY_HELLO:
        s_on_hello(c, rid, rl, e->hello, uid);
        break;
    case TAH__ENVELOPE__BODY_TOKEN_REQ:
        s_on_token_req(c, rid, rl, e->token_req);
        break;
    case TAH__ENVELOPE__BODY_SUBMIT:
        s_on_submit(c, rid, rl, e->submit);
        break;
    case TAH__ENVELOPE__BODY_STATUS:
        s_on_status(c, rid, rl, e->status);
        break;
    case TAH__ENVELOPE__BODY_CANCEL:
        s_on_cancel(c, rid, rl, e->cancel);
        break;
    case TAH__ENVELOPE__BODY_HEARTBEAT:
    case TAH__ENVELOPE__BODY_JOB_EVENT:
    case TAH__ENVELOPE__BODY_STEP_REPORT:
    case TAH__ENVELOPE__BODY_PEER_REPORT:
    case TAH__ENVELOPE__BODY_CKPT_PUT:
    case TAH__ENVELOPE__BODY_CKPT_GET:
        if (!n || n->state == N_LOST) {
            Tah__Error er = TAH__ERROR__INIT;
            er.code = TAH_EINVAL;
            er.message = "unknown node; announce yourself again";
            er.reannounce = 1;
            Tah__Envelope env = TAH__ENVELOPE__INIT;
            env.body_case = TAH__ENVELOPE__BODY_ERROR;
            env.error = &er;
            wire_send_envelope(c->router, rid, rl, &env, ZMQ_DONTWAIT);
            break;
        }
        n->last_seen = s_now();
        if (e->body_case == TAH__ENVELOPE__BODY_HEARTBEAT) {
            n->rejected = e->heartbeat->rejected;
            if (e->heartbeat->last_reject[0])
                log_debug("node %s: %llu data messages rejected, latest: %.200s", n->name,
                          (unsigned long long)n->rejected, e->heartbeat->last_reject);
        } else if (e->body_case == TAH__ENVELOPE__BODY_JOB_EVENT) {
            s_on_job_event(c, n, e->job_event);
        } else if (e->body_case == TAH__ENVELOPE__BODY_PEER_REPORT) {
            s_on_peer_report(c, n, e->peer_report);
        } else if (e->body_case == TAH__ENVELOPE__BODY_CKPT_PUT) {
            s_on_ckpt_put(c, n, e->ckpt_put);
        } else if (e->body_case == TAH__ENVELOPE__BODY_CKPT_GET) {
            s_on_ckpt_get(c, n, e->ckpt_get);
        } else {
            s_step_report(c, n, e->step_report);
        }
        break;
    default:
        c->rejected++;
        log_warn("rejected unexpected '%s' message from %s", wire_body_name(e), n ? n->name : "a client");
        wire_send_error(c->router, rid, rl, TAH_EINVAL, "unexpected message '%s'", wire_body_name(e));
        break;
    }
done:
    wire_envelope_free(&e);
    for (int i = 0; i < nparts; i++)
        zmq_msg_close(&part[i]);
}

/* A running job with no progress for its stall limit: a data message lost
 * on the way (a connection reset drops what was in flight) leaves every
 * stage waiting for ever, while each node still answers heartbeats and
 * pings its neighbours. Roll back to the last complete checkpoint set on
 * the same nodes (a recovery, event `stalled`). The limit:
 * jobfile_stall_limit (auto: 300 s until the placement's first step report,
 * which may wait for replicas to be fetched and stages loaded, then 60 s; or
 * 20 times the slowest step seen if that is more). */
static void s_check_stall(coord_t *c, cjob_t *j, double now)
{
    if (!j->spec || j->adopting || strcmp(j->j.state, "running") != 0)
        return;
    const double limit = jobfile_stall_limit(j->spec->stall_timeout, j->step_at > 0, j->j.slowest_s);
    if (limit == 0 || now - j->progress_at <= limit)
        return;
    char detail[512];
    snprintf(detail, sizeof detail,
             "stalled in step %d: no step report or checkpoint chunk for %.0f s (stall limit %.0f s: a data message "
             "lost between stages, or a stage stuck?)",
             j->j.step + 1, now - j->progress_at, limit);
    s_job_pause(c, j, "stalled", "", -1, j->j.step + 1, detail);
    s_try_place(c);
}

static void s_tick(coord_t *c)
{
    double now = s_now();
    for (int q = 0; q < c->njobs; q++)
        s_check_stall(c, c->jobs[q], now);
    for (int q = 0; q < c->njobs; q++) {
        cjob_t *j = c->jobs[q];
        if (!j->adopting || now < j->adopt_deadline)
            continue;
        /* a coordinator restart: the stages whose nodes did not come back are lost */
        for (int k = 0; k < j->j.stages; k++) {
            if (j->adopted[k])
                continue;
            char reason[512];
            snprintf(reason, sizeof reason, "node %s lost at step %d (did not come back after the coordinator restart)",
                     j->nodes[k], j->j.step + 1);
            s_job_pause(c, j, "node_lost", j->nodes[k], k, j->j.step + 1, reason);
        }
        for (int k = 0; k < j->j.stages; k++)
            if (!j->adopted[k])
                j->need[k] = 1;
        s_try_place(c);
    }
    for (int i = 0; i < c->nnodes; i++) {
        cnode_t *n = &c->nodes[i];
        if (n->rid_len && n->state != N_LOST && now - n->last_seen > c->node_timeout) {
            char why[64];
            snprintf(why, sizeof why, "no heartbeat for %.1f s", now - n->last_seen);
            s_node_lost(c, n, why);
        }
    }
    if (now - c->last_beat >= S_HEARTBEAT_S) {
        c->last_beat = now;
        for (int i = 0; i < c->nnodes; i++) {
            cnode_t *n = &c->nodes[i];
            if (!n->rid_len || n->state == N_LOST)
                continue;
            Tah__Heartbeat hb = TAH__HEARTBEAT__INIT;
            Tah__Envelope env = TAH__ENVELOPE__INIT;
            env.body_case = TAH__ENVELOPE__BODY_HEARTBEAT;
            env.heartbeat = &hb;
            s_send_node(c, n, &env);
        }
    }
}

/* ---- startup ---- */

static void s_assignment_load(void *arg, int stage, const char *node, int layer0, int layer1)
{
    cjob_t *j = arg;
    if (stage < 0 || stage >= j->j.stages)
        return;
    snprintf(j->nodes[stage], sizeof j->nodes[stage], "%s", node);
    j->l0[stage] = layer0;
    j->l1[stage] = layer1;
}

static void s_load_job(void *arg, store_job_t *sj)
{
    coord_t *c = arg;
    cjob_t **nj = s_grow(c->jobs, c->njobs, &c->capjobs, sizeof *nj);
    if (!nj)
        return;
    c->jobs = nj;
    cjob_t *j = calloc(1, sizeof *j);
    if (!j)
        return;
    j->j = *sj;
    j->j.ini = strdup(sj->ini);
    if (!(j->j.slowest_s >= 0.0 && j->j.slowest_s <= 1e7)) /* a damaged record: measure anew */
        j->j.slowest_s = 0.0;
    c->jobs[c->njobs++] = j;
    int live = !strcmp(j->j.state, "running") || !strcmp(j->j.state, "paused");
    if (live) {
        /* the job goes on: its nodes re-announce with the stage they still
         * run (running), or it resumes from its replicas (paused) */
        char err[512];
        j->spec = malloc(sizeof *j->spec);
        if (!j->spec || jobfile_parse(j->j.ini, j->j.name, j->spec, err, sizeof err) != 0 ||
            s_job_stages_alloc(j) != 0) {
            free(j->spec);
            j->spec = NULL;
            snprintf(j->j.state, sizeof j->j.state, "failed");
            snprintf(j->j.reason, sizeof j->j.reason, "coordinator restarted; the stored job no longer loads");
            j->j.finished = s_now();
            s_job_save(c, j);
            return;
        }
        store_assignments_each(c->store, j->j.id, s_assignment_load, j);
        store_ckpts_each(c->store, j->j.id, s_rep_load, j);
        j->resume_step = j->j.ckpt_step;
        j->mf = fopen(j->j.metrics_path, "a");
        s_agg_reset(j);
        if (!strcmp(j->j.state, "running")) {
            snprintf(j->j.state, sizeof j->j.state, "paused");
            snprintf(j->j.reason, sizeof j->j.reason,
                     "coordinator restarted at step %d; waiting for its nodes to reconnect", j->j.step);
            j->adopting = 1;
            j->adopt_deadline = s_now() + 2.0 * c->node_timeout + 5.0;
            j->resume_step = j->j.step; /* reports of later steps are still welcome */
            s_event(c, j, "coordinator_restart", "", -1, j->j.step, "the job's nodes may re-announce and go on");
        }
        s_job_save(c, j);
        log_warn("job %lld: %s", (long long)j->j.id, j->j.reason);
    }
    {
        job_spec_t *sp = malloc(sizeof *sp);
        char err[512];
        if (sp && jobfile_parse(j->j.ini, j->j.name, sp, err, sizeof err) == 0)
            s_link_note(sp, j->link_note, sizeof j->link_note);
        free(sp);
    }
    if (!live && !strcmp(j->j.state, "queued")) {
        char err[512];
        j->spec = malloc(sizeof *j->spec);
        if (!j->spec || jobfile_parse(j->j.ini, j->j.name, j->spec, err, sizeof err) != 0) {
            free(j->spec);
            j->spec = NULL;
            snprintf(j->j.state, sizeof j->j.state, "failed");
            snprintf(j->j.reason, sizeof j->j.reason, "stored job file no longer parses");
            s_job_save(c, j);
        }
    }
}

static void s_load_node(void *arg, const char *name, const char *endpoint, const char *backend, int threads,
                        double gflops, double last_seen)
{
    coord_t *c = arg;
    cnode_t *nn = s_grow(c->nodes, c->nnodes, &c->capnodes, sizeof *nn);
    if (!nn)
        return;
    c->nodes = nn;
    cnode_t *n = &c->nodes[c->nnodes++];
    memset(n, 0, sizeof *n);
    snprintf(n->name, sizeof n->name, "%s", name);
    snprintf(n->endpoint, sizeof n->endpoint, "%s", endpoint);
    snprintf(n->backend, sizeof n->backend, "%s", backend);
    n->threads = threads;
    n->gflops = gflops;
    n->state = N_LOST;
    n->stage = -1;
    n->last_seen = last_seen;
}

/* Create what is missing of STATE_DIR/{coord,admin}.{key,pub} and
 * STATE_DIR/token.secret; existing files are kept. */
int coord_keygen(const char *state_dir, char *err, size_t errlen)
{
    if (s_mkdirs(state_dir) != 0) {
        snprintf(err, errlen, "%s: cannot create directory: %s", state_dir, strerror(errno));
        return TAH_EIO;
    }
    static const char *names[] = { "coord", "admin" };
    for (int i = 0; i < 2; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s.key", state_dir, names[i]);
        if (access(path, F_OK) == 0)
            continue;
        keys_pair_t kp;
        int rc = keys_new(&kp, err, errlen);
        if (rc == 0)
            rc = keys_write(state_dir, names[i], &kp, err, errlen);
        if (rc != 0)
            return rc;
        log_info("new %s key pair in %s/%s.{key,pub}", names[i], state_dir, names[i]);
    }
    uint8_t secret[TOKEN_SECRET_LEN];
    return token_secret_load(state_dir, secret, err, errlen);
}

/* ZAP (RFC 27) for the CURVE ROUTER: every CURVE client may connect (a new
 * node must reach us to present its join token); its public key becomes
 * the User-Id of its messages, which s_on_message checks against the
 * admin key and the job allowlists. Anything but CURVE is denied. */
static void s_on_zap(coord_t *c)
{
    zmq_msg_t f[8];
    int nf = 0;
    wire_recv_parts(c->zap, f, 8, &nf);
    if (nf == 0)
        return;
    const char *status = "400", *text = "only CURVE is accepted";
    char user[KEYS_Z85_LEN + 1] = "";
    if (nf >= 7 && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
        zmq_msg_size(&f[6]) == 32 && zmq_z85_encode(user, zmq_msg_data(&f[6]), 32)) {
        status = "200";
        text = "OK";
    } else {
        c->rejected++;
        log_warn("ZAP: refused a connection (%s)", text);
    }
    const char *reply[6] = { "1.0", NULL, status, text, user, "" };
    for (int i = 0; i < 6; i++) {
        int flags = i < 5 ? ZMQ_SNDMORE : 0;
        if (i == 1)
            zmq_send(c->zap, nf >= 2 ? zmq_msg_data(&f[1]) : "", nf >= 2 ? zmq_msg_size(&f[1]) : 0, flags);
        else
            zmq_send(c->zap, reply[i], strlen(reply[i]), flags);
    }
    for (int i = 0; i < nf; i++)
        zmq_msg_close(&f[i]);
}

int coord_serve(const coord_serve_opts_t *o)
{
    int rc = 1;
    char err[1024], ep[300], dbpath[1200];
    coord_t *c = calloc(1, sizeof *c);
    if (!c)
        return 1;
    snprintf(c->state_dir, sizeof c->state_dir, "%s", o->state_dir);
    c->node_timeout = o->node_timeout;
    if (s_mkdirs(o->state_dir) != 0) {
        log_error("--state %s: cannot create directory: %s", o->state_dir, strerror(errno));
        goto out;
    }
    snprintf(dbpath, sizeof dbpath, "%s/coord.db", o->state_dir);
    c->store = store_open(dbpath, err, sizeof err);
    if (!c->store) {
        log_error("%s", err);
        goto out;
    }
    if (store_jobs_each(c->store, s_load_job, c, err, sizeof err) != 0) {
        log_error("%s", err);
        goto out;
    }
    store_nodes_each(c->store, s_load_node, c);
    if (wire_endpoint(o->listen, ep, sizeof ep, err, sizeof err) != 0) {
        log_error("--listen %s", err);
        goto out;
    }
    c->ctx = zmq_ctx_new();
    c->router = zmq_socket(c->ctx, ZMQ_ROUTER);
    c->secure = !o->open;
    if (c->secure) {
        char kpath[1200];
        snprintf(kpath, sizeof kpath, "%s/coord.key", o->state_dir);
        int krc = coord_keygen(o->state_dir, err, sizeof err);
        if (krc == 0)
            krc = keys_read_secret(kpath, &c->key, err, sizeof err);
        if (krc == 0) {
            keys_pair_t admin;
            snprintf(kpath, sizeof kpath, "%s/admin.key", o->state_dir);
            krc = keys_read_secret(kpath, &admin, err, sizeof err);
            memcpy(c->admin_pub, admin.pub, sizeof c->admin_pub);
        }
        if (krc == 0)
            krc = token_secret_load(o->state_dir, c->tsecret, err, sizeof err);
        if (krc == 0)
            krc = keys_set_server(c->router, &c->key, err, sizeof err);
        if (krc != 0) {
            log_error("%s", err);
            goto out;
        }
        c->zap = zmq_socket(c->ctx, ZMQ_REP);
        int zl = 0;
        zmq_setsockopt(c->zap, ZMQ_LINGER, &zl, sizeof zl);
        if (zmq_bind(c->zap, "inproc://zeromq.zap.01") != 0) {
            log_error("cannot bind the ZAP handler: %s", zmq_strerror(errno));
            goto out;
        }
        store_allow_each(c->store, s_allow_load, c);
    }
    int zero = 0, hwm = 10000;
    zmq_setsockopt(c->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(c->router, ZMQ_RCVHWM, &hwm, sizeof hwm);
    int64_t maxmsg = WIRE_MAX_CONTROL;
    zmq_setsockopt(c->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (zmq_bind(c->router, ep) != 0) {
        log_error("--listen %s: cannot bind %s: %s", o->listen, ep, zmq_strerror(errno));
        goto out;
    }
    char bound[300] = "";
    size_t bl = sizeof bound;
    zmq_getsockopt(c->router, ZMQ_LAST_ENDPOINT, bound, &bl);
    {
        char path[1200];
        snprintf(path, sizeof path, "%s/endpoint", o->state_dir);
        char line[320];
        int ll = snprintf(line, sizeof line, "%s\n", bound);
        const void *parts[1] = { line };
        size_t sizes[1] = { (size_t)ll };
        if (tah_file_write_atomic(path, parts, sizes, 1, err, sizeof err) != 0)
            log_warn("%s", err);
    }
    int nq = 0;
    for (int i = 0; i < c->njobs; i++)
        nq += !strcmp(c->jobs[i]->j.state, "queued");
    log_info("listening on %s, state %s (%d jobs, %d queued), node timeout %.1f s", bound, dbpath, c->njobs, nq,
             c->node_timeout);
    if (c->secure)
        log_info("secure: CURVE key %s (%s/coord.pub), admin key %.8s..., %d allowlisted keys", c->key.pub,
                 o->state_dir, c->admin_pub, c->nallow);
    else
        log_warn("--open: control traffic is plaintext and any node is admitted; use only on a trusted network");

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    while (!s_stop) {
        zmq_pollitem_t its[2] = { { c->router, 0, ZMQ_POLLIN, 0 }, { c->zap, 0, ZMQ_POLLIN, 0 } };
        int n = zmq_poll(its, c->zap ? 2 : 1, 200);
        zmq_pollitem_t it = its[0];
        if (n > 0 && c->zap && (its[1].revents & ZMQ_POLLIN))
            s_on_zap(c);
        if (n < 0 && errno != EINTR) {
            log_error("poll: %s", zmq_strerror(errno));
            break;
        }
        if (n > 0 && (it.revents & ZMQ_POLLIN)) {
            for (int k = 0; k < 64; k++) { /* drain a burst, then tick */
                int ev = 0;
                size_t evl = sizeof ev;
                zmq_getsockopt(c->router, ZMQ_EVENTS, &ev, &evl);
                if (!(ev & ZMQ_POLLIN))
                    break;
                s_on_message(c);
            }
        }
        s_tick(c);
    }
    log_info("shutting down (%d jobs kept in %s)", c->njobs, dbpath);
    rc = 0;
out:
    for (int i = 0; i < c->njobs; i++)
        s_job_free(c->jobs[i]);
    free(c->jobs);
    free(c->nodes);
    free(c->allow);
    if (c->zap)
        zmq_close(c->zap);
    if (c->router)
        zmq_close(c->router);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    store_destroy(&c->store);
    free(c);
    return rc;
}
