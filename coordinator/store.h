/* store.h — the coordinator's persistent state in SQLite (DIR/coord.db).
 *
 * Tables (created on first open; WAL journal, so a crash keeps every
 * committed row):
 *   jobs(id, name, ini, base_dir, stages, steps, state, reason, step, loss,
 *        has_loss, tokens_per_s, metrics_path, submitted, started, finished)
 *   nodes(name, endpoint, backend, threads, gflops, state, job, stage, last_seen)
 *   assignments(job, stage, node, layer0, layer1, endpoint)
 *   metrics(job, step, loss, val_loss, lr, grad_norm, tokens_per_s, ms,
 *           time_s, wire_bytes, fp32_bytes)           -- one row per step
 *   links(job, src, dst, bytes, fp32_bytes, seconds)  -- running totals
 *   events(seq, job, time, kind, node, stage, step, detail) -- losses, leaves,
 *        evictions, recoveries, coordinator restarts (issue 8)
 *   ckpts(job, stage, step, size, crc)  -- checkpoint replicas the coordinator holds
 * Every function returns 0 or TAH_EIO with SQLite's message in err. */
#ifndef TAH_COORD_STORE_H
#define TAH_COORD_STORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct store store_t;

typedef struct store_job {
    int64_t id;
    char name[128];
    char *ini;                 /* owned (malloc) */
    char base_dir[1024];
    int stages, steps;
    char state[16];            /* queued running succeeded failed cancelled */
    char reason[512];
    int step;
    int has_loss;
    double loss, tokens_per_s;
    char metrics_path[1100];
    double submitted, started, finished;
    int ckpt_step;             /* last step for which every stage has a replicated checkpoint */
    int epoch;                 /* placements so far (1 = first); Assign carries it */
    int recoveries;            /* re-placements after a loss, leave or eviction */
    double slowest_s;          /* the stall watchdog's slowest step so far (s), kept over restarts */
} store_job_t;

typedef struct store_event {
    int64_t job;
    double time;               /* unix seconds */
    char kind[24];             /* node_lost, evicted, leave, resumed, coordinator_restart, ... */
    char node[64];
    int stage, step;
    char detail[512];
} store_event_t;

typedef struct store_metric {
    int64_t job;
    int step;
    double loss, lr, grad_norm, tokens_per_s, ms, time_s;
    int has_val;
    double val_loss;
    uint64_t wire_bytes, fp32_bytes;
} store_metric_t;

store_t *store_open(const char *path, char *err, size_t errlen);
void store_destroy(store_t **self_p);

/* Inserts; j->id gets the new id. */
int store_job_insert(store_t *s, store_job_t *j, char *err, size_t errlen);
/* Writes every mutable column of j. */
int store_job_update(store_t *s, const store_job_t *j, char *err, size_t errlen);
/* Calls fn for every job, in id order (j is only valid during the call). */
int store_jobs_each(store_t *s, void (*fn)(void *arg, store_job_t *j), void *arg, char *err, size_t errlen);

int store_node_upsert(store_t *s, const char *name, const char *endpoint, const char *backend, int threads,
                      double gflops, const char *state, int64_t job, int stage, double last_seen);
int store_assignment_insert(store_t *s, int64_t job, int stage, const char *node, int layer0, int layer1,
                            const char *endpoint);
int store_metric_insert(store_t *s, const store_metric_t *m);
/* links += (bytes, fp32, seconds) */
int store_link_add(store_t *s, int64_t job, int src, int dst, uint64_t bytes, uint64_t fp32, double seconds);
/* Calls fn for each link row of a job. */
int store_links_each(store_t *s, int64_t job,
                     void (*fn)(void *arg, int src, int dst, uint64_t bytes, uint64_t fp32, double seconds),
                     void *arg);
/* Nodes of a job's assignment in stage order. */
int store_assignment_nodes(store_t *s, int64_t job, void (*fn)(void *arg, int stage, const char *node), void *arg);
/* Every stage's assignment of a job: node and layer range. */
int store_assignments_each(store_t *s, int64_t job,
                           void (*fn)(void *arg, int stage, const char *node, int layer0, int layer1), void *arg);
/* Every node ever seen (name, backend, threads, gflops, endpoint). */
int store_nodes_each(store_t *s,
                     void (*fn)(void *arg, const char *name, const char *endpoint, const char *backend, int threads,
                                double gflops, double last_seen),
                     void *arg);

/* DELETE metrics rows of job with step > after_step (a rollback). */
int store_metrics_truncate(store_t *s, int64_t job, int after_step);
int store_event_add(store_t *s, const store_event_t *e);
int store_events_each(store_t *s, int64_t job, void (*fn)(void *arg, const store_event_t *e), void *arg);
/* Replicated checkpoints: one row per (job, stage, step). */
int store_ckpt_add(store_t *s, int64_t job, int stage, int step, uint64_t size, uint32_t crc);
int store_ckpt_delete_before(store_t *s, int64_t job, int step);
int store_ckpts_each(store_t *s, int64_t job,
                     void (*fn)(void *arg, int stage, int step, uint64_t size, uint32_t crc), void *arg);

int store_begin(store_t *s);
int store_commit(store_t *s);

/* The job allowlist (secure mode): CURVE public keys (Z85) admitted to a
 * job by a join token, with the node name that presented it. */
int store_allow_add(store_t *s, int64_t job, const char *key, const char *node, double added);
int store_allow_each(store_t *s, void (*fn)(void *arg, int64_t job, const char *key), void *arg);

#endif
