/* store.c — SQLite persistence of the coordinator (see store.h). */
#include "store.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "log.h"

struct store {
    sqlite3 *db;
};

static const char *s_schema =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS jobs(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, ini TEXT NOT NULL,"
    " base_dir TEXT, stages INTEGER, steps INTEGER, state TEXT, reason TEXT, step INTEGER, loss REAL,"
    " has_loss INTEGER, tokens_per_s REAL, metrics_path TEXT, submitted REAL, started REAL, finished REAL);"
    "CREATE TABLE IF NOT EXISTS nodes(name TEXT PRIMARY KEY, endpoint TEXT, backend TEXT, threads INTEGER,"
    " gflops REAL, state TEXT, job INTEGER, stage INTEGER, last_seen REAL);"
    "CREATE TABLE IF NOT EXISTS assignments(job INTEGER, stage INTEGER, node TEXT, layer0 INTEGER,"
    " layer1 INTEGER, endpoint TEXT, PRIMARY KEY(job, stage));"
    "CREATE TABLE IF NOT EXISTS metrics(job INTEGER, step INTEGER, loss REAL, val_loss REAL, lr REAL,"
    " grad_norm REAL, tokens_per_s REAL, ms REAL, time_s REAL, wire_bytes INTEGER, fp32_bytes INTEGER,"
    " PRIMARY KEY(job, step));"
    "CREATE TABLE IF NOT EXISTS links(job INTEGER, src INTEGER, dst INTEGER, bytes INTEGER, fp32_bytes INTEGER,"
    " seconds REAL, PRIMARY KEY(job, src, dst));"
    "CREATE TABLE IF NOT EXISTS allow(job INTEGER, key TEXT, node TEXT, added REAL, PRIMARY KEY(job, key));"
    "CREATE TABLE IF NOT EXISTS events(seq INTEGER PRIMARY KEY AUTOINCREMENT, job INTEGER, time REAL, kind TEXT,"
    " node TEXT, stage INTEGER, step INTEGER, detail TEXT);"
    "CREATE TABLE IF NOT EXISTS ckpts(job INTEGER, stage INTEGER, step INTEGER, size INTEGER, crc INTEGER,"
    " PRIMARY KEY(job, stage, step));";

/* Columns added after the first release: ALTER TABLE on databases that
 * lack them ("duplicate column" otherwise, which is fine). */
static const char *const s_added_columns[] = {
    "ALTER TABLE jobs ADD COLUMN ckpt_step INTEGER DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN epoch INTEGER DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN recoveries INTEGER DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN slowest_s REAL DEFAULT 0",
};

store_t *store_open(const char *path, char *err, size_t errlen)
{
    store_t *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    char *msg = NULL;
    if (sqlite3_open(path, &s->db) != SQLITE_OK) {
        snprintf(err, errlen, "%s: cannot open database: %s", path, s->db ? sqlite3_errmsg(s->db) : "no memory");
        goto fail;
    }
    sqlite3_busy_timeout(s->db, 5000);
    if (sqlite3_exec(s->db, s_schema, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "%s: cannot create tables: %s; HINT: is it a tah-coord state database?", path,
                 msg ? msg : "?");
        sqlite3_free(msg);
        goto fail;
    }
    for (size_t i = 0; i < sizeof s_added_columns / sizeof s_added_columns[0]; i++) {
        if (sqlite3_exec(s->db, s_added_columns[i], NULL, NULL, &msg) != SQLITE_OK) {
            int dup = msg && strstr(msg, "duplicate column");
            if (!dup)
                snprintf(err, errlen, "%s: cannot upgrade the schema: %s", path, msg ? msg : "?");
            sqlite3_free(msg);
            msg = NULL;
            if (!dup)
                goto fail;
        }
    }
    return s;
fail:
    store_destroy(&s);
    return NULL;
}

void store_destroy(store_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    sqlite3_close((*self_p)->db);
    free(*self_p);
    *self_p = NULL;
}

static int s_fail(store_t *s, const char *what, char *err, size_t errlen)
{
    if (err)
        snprintf(err, errlen, "sqlite %s: %s", what, sqlite3_errmsg(s->db));
    else
        log_error("sqlite %s: %s", what, sqlite3_errmsg(s->db));
    return TAH_EIO;
}

int store_begin(store_t *s)
{
    return sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL) == SQLITE_OK ? 0 : s_fail(s, "begin", NULL, 0);
}

int store_commit(store_t *s)
{
    return sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK ? 0 : s_fail(s, "commit", NULL, 0);
}

int store_job_insert(store_t *s, store_job_t *j, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    const char *sql = "INSERT INTO jobs(name, ini, base_dir, stages, steps, state, reason, step, loss, has_loss,"
                      " tokens_per_s, metrics_path, submitted, started, finished)"
                      " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare insert job", err, errlen);
    sqlite3_bind_text(st, 1, j->name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, j->ini, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, j->base_dir, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 4, j->stages);
    sqlite3_bind_int(st, 5, j->steps);
    sqlite3_bind_text(st, 6, j->state, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 7, j->reason, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 8, j->step);
    sqlite3_bind_double(st, 9, j->loss);
    sqlite3_bind_int(st, 10, j->has_loss);
    sqlite3_bind_double(st, 11, j->tokens_per_s);
    sqlite3_bind_text(st, 12, j->metrics_path, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 13, j->submitted);
    sqlite3_bind_double(st, 14, j->started);
    sqlite3_bind_double(st, 15, j->finished);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return s_fail(s, "insert job", err, errlen);
    j->id = sqlite3_last_insert_rowid(s->db);
    return 0;
}

int store_job_update(store_t *s, const store_job_t *j, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    const char *sql = "UPDATE jobs SET state=?, reason=?, step=?, loss=?, has_loss=?, tokens_per_s=?,"
                      " metrics_path=?, started=?, finished=?, ckpt_step=?, epoch=?, recoveries=?, slowest_s=?"
                      " WHERE id=?";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare update job", err, errlen);
    sqlite3_bind_text(st, 1, j->state, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, j->reason, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 3, j->step);
    sqlite3_bind_double(st, 4, j->loss);
    sqlite3_bind_int(st, 5, j->has_loss);
    sqlite3_bind_double(st, 6, j->tokens_per_s);
    sqlite3_bind_text(st, 7, j->metrics_path, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 8, j->started);
    sqlite3_bind_double(st, 9, j->finished);
    sqlite3_bind_int(st, 10, j->ckpt_step);
    sqlite3_bind_int(st, 11, j->epoch);
    sqlite3_bind_int(st, 12, j->recoveries);
    sqlite3_bind_double(st, 13, j->slowest_s);
    sqlite3_bind_int64(st, 14, j->id);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : s_fail(s, "update job", err, errlen);
}

static void s_text(char *dst, size_t n, sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    snprintf(dst, n, "%s", t ? (const char *)t : "");
}

int store_jobs_each(store_t *s, void (*fn)(void *arg, store_job_t *j), void *arg, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    const char *sql = "SELECT id, name, ini, base_dir, stages, steps, state, reason, step, loss, has_loss,"
                      " tokens_per_s, metrics_path, submitted, started, finished, ckpt_step, epoch, recoveries, slowest_s"
                      " FROM jobs"
                      " ORDER BY id";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare select jobs", err, errlen);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        store_job_t j;
        memset(&j, 0, sizeof j);
        j.id = sqlite3_column_int64(st, 0);
        s_text(j.name, sizeof j.name, st, 1);
        const unsigned char *ini = sqlite3_column_text(st, 2);
        j.ini = strdup(ini ? (const char *)ini : "");
        s_text(j.base_dir, sizeof j.base_dir, st, 3);
        j.stages = sqlite3_column_int(st, 4);
        j.steps = sqlite3_column_int(st, 5);
        s_text(j.state, sizeof j.state, st, 6);
        s_text(j.reason, sizeof j.reason, st, 7);
        j.step = sqlite3_column_int(st, 8);
        j.loss = sqlite3_column_double(st, 9);
        j.has_loss = sqlite3_column_int(st, 10);
        j.tokens_per_s = sqlite3_column_double(st, 11);
        s_text(j.metrics_path, sizeof j.metrics_path, st, 12);
        j.submitted = sqlite3_column_double(st, 13);
        j.started = sqlite3_column_double(st, 14);
        j.finished = sqlite3_column_double(st, 15);
        j.ckpt_step = sqlite3_column_int(st, 16);
        j.epoch = sqlite3_column_int(st, 17);
        j.recoveries = sqlite3_column_int(st, 18);
        j.slowest_s = sqlite3_column_double(st, 19);
        fn(arg, &j);
        free(j.ini);
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : s_fail(s, "select jobs", err, errlen);
}

int store_node_upsert(store_t *s, const char *name, const char *endpoint, const char *backend, int threads,
                      double gflops, const char *state, int64_t job, int stage, double last_seen)
{
    sqlite3_stmt *st = NULL;
    const char *sql = "INSERT OR REPLACE INTO nodes(name, endpoint, backend, threads, gflops, state, job, stage,"
                      " last_seen) VALUES(?,?,?,?,?,?,?,?,?)";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare upsert node", NULL, 0);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, endpoint, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, backend, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 4, threads);
    sqlite3_bind_double(st, 5, gflops);
    sqlite3_bind_text(st, 6, state, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 7, job);
    sqlite3_bind_int(st, 8, stage);
    sqlite3_bind_double(st, 9, last_seen);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : s_fail(s, "upsert node", NULL, 0);
}

int store_assignment_insert(store_t *s, int64_t job, int stage, const char *node, int layer0, int layer1,
                            const char *endpoint)
{
    sqlite3_stmt *st = NULL;
    const char *sql = "INSERT OR REPLACE INTO assignments(job, stage, node, layer0, layer1, endpoint)"
                      " VALUES(?,?,?,?,?,?)";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare insert assignment", NULL, 0);
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, stage);
    sqlite3_bind_text(st, 3, node, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 4, layer0);
    sqlite3_bind_int(st, 5, layer1);
    sqlite3_bind_text(st, 6, endpoint, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : s_fail(s, "insert assignment", NULL, 0);
}

int store_metric_insert(store_t *s, const store_metric_t *m)
{
    sqlite3_stmt *st = NULL;
    const char *sql = "INSERT OR REPLACE INTO metrics(job, step, loss, val_loss, lr, grad_norm, tokens_per_s, ms,"
                      " time_s, wire_bytes, fp32_bytes) VALUES(?,?,?,?,?,?,?,?,?,?,?)";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare insert metric", NULL, 0);
    sqlite3_bind_int64(st, 1, m->job);
    sqlite3_bind_int(st, 2, m->step);
    sqlite3_bind_double(st, 3, m->loss);
    if (m->has_val)
        sqlite3_bind_double(st, 4, m->val_loss);
    else
        sqlite3_bind_null(st, 4);
    sqlite3_bind_double(st, 5, m->lr);
    sqlite3_bind_double(st, 6, m->grad_norm);
    sqlite3_bind_double(st, 7, m->tokens_per_s);
    sqlite3_bind_double(st, 8, m->ms);
    sqlite3_bind_double(st, 9, m->time_s);
    sqlite3_bind_int64(st, 10, (sqlite3_int64)m->wire_bytes);
    sqlite3_bind_int64(st, 11, (sqlite3_int64)m->fp32_bytes);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : s_fail(s, "insert metric", NULL, 0);
}

int store_link_add(store_t *s, int64_t job, int src, int dst, uint64_t bytes, uint64_t fp32, double seconds)
{
    sqlite3_stmt *st = NULL;
    const char *sql = "INSERT INTO links(job, src, dst, bytes, fp32_bytes, seconds) VALUES(?,?,?,?,?,?)"
                      " ON CONFLICT(job, src, dst) DO UPDATE SET bytes = bytes + excluded.bytes,"
                      " fp32_bytes = fp32_bytes + excluded.fp32_bytes, seconds = seconds + excluded.seconds";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare link", NULL, 0);
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, src);
    sqlite3_bind_int(st, 3, dst);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)bytes);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)fp32);
    sqlite3_bind_double(st, 6, seconds);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : s_fail(s, "link", NULL, 0);
}

int store_links_each(store_t *s, int64_t job,
                     void (*fn)(void *arg, int src, int dst, uint64_t bytes, uint64_t fp32, double seconds),
                     void *arg)
{
    sqlite3_stmt *st = NULL;
    const char *sql = "SELECT src, dst, bytes, fp32_bytes, seconds FROM links WHERE job=? ORDER BY src, dst";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare links", NULL, 0);
    sqlite3_bind_int64(st, 1, job);
    while (sqlite3_step(st) == SQLITE_ROW)
        fn(arg, sqlite3_column_int(st, 0), sqlite3_column_int(st, 1), (uint64_t)sqlite3_column_int64(st, 2),
           (uint64_t)sqlite3_column_int64(st, 3), sqlite3_column_double(st, 4));
    sqlite3_finalize(st);
    return 0;
}

int store_assignment_nodes(store_t *s, int64_t job, void (*fn)(void *arg, int stage, const char *node), void *arg)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT stage, node FROM assignments WHERE job=? ORDER BY stage", -1, &st,
                           NULL) != SQLITE_OK)
        return s_fail(s, "prepare assignments", NULL, 0);
    sqlite3_bind_int64(st, 1, job);
    while (sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *n = sqlite3_column_text(st, 1);
        fn(arg, sqlite3_column_int(st, 0), n ? (const char *)n : "");
    }
    sqlite3_finalize(st);
    return 0;
}

int store_nodes_each(store_t *s,
                     void (*fn)(void *arg, const char *name, const char *endpoint, const char *backend, int threads,
                                double gflops, double last_seen),
                     void *arg)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT name, endpoint, backend, threads, gflops, last_seen FROM nodes ORDER BY name",
                           -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare nodes", NULL, 0);
    while (sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *n = sqlite3_column_text(st, 0), *e = sqlite3_column_text(st, 1),
                            *b = sqlite3_column_text(st, 2);
        fn(arg, n ? (const char *)n : "", e ? (const char *)e : "", b ? (const char *)b : "",
           sqlite3_column_int(st, 3), sqlite3_column_double(st, 4), sqlite3_column_double(st, 5));
    }
    sqlite3_finalize(st);
    return 0;
}

int store_allow_add(store_t *s, int64_t job, const char *key, const char *node, double added)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "INSERT OR REPLACE INTO allow(job, key, node, added) VALUES(?,?,?,?)", -1, &st,
                           NULL) != SQLITE_OK)
        return s_fail(s, "prepare allow", NULL, 0);
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, node, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 4, added);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : s_fail(s, "insert allow", NULL, 0);
}

int store_allow_each(store_t *s, void (*fn)(void *arg, int64_t job, const char *key), void *arg)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT job, key FROM allow ORDER BY job", -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare allow", NULL, 0);
    while (sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *k = sqlite3_column_text(st, 1);
        fn(arg, sqlite3_column_int64(st, 0), k ? (const char *)k : "");
    }
    sqlite3_finalize(st);
    return 0;
}

int store_metrics_truncate(store_t *s, int64_t job, int after_step)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "DELETE FROM metrics WHERE job=? AND step>?", -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare truncate metrics", NULL, 0);
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, after_step);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : s_fail(s, "truncate metrics", NULL, 0);
}

int store_event_add(store_t *s, const store_event_t *e)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "INSERT INTO events(job, time, kind, node, stage, step, detail) VALUES(?,?,?,?,?,?,?)",
                           -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare event", NULL, 0);
    sqlite3_bind_int64(st, 1, e->job);
    sqlite3_bind_double(st, 2, e->time);
    sqlite3_bind_text(st, 3, e->kind, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, e->node, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 5, e->stage);
    sqlite3_bind_int(st, 6, e->step);
    sqlite3_bind_text(st, 7, e->detail, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : s_fail(s, "insert event", NULL, 0);
}

int store_events_each(store_t *s, int64_t job, void (*fn)(void *arg, const store_event_t *e), void *arg)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT time, kind, node, stage, step, detail FROM events WHERE job=? ORDER BY seq",
                           -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare events", NULL, 0);
    sqlite3_bind_int64(st, 1, job);
    while (sqlite3_step(st) == SQLITE_ROW) {
        store_event_t e;
        memset(&e, 0, sizeof e);
        e.job = job;
        e.time = sqlite3_column_double(st, 0);
        s_text(e.kind, sizeof e.kind, st, 1);
        s_text(e.node, sizeof e.node, st, 2);
        e.stage = sqlite3_column_int(st, 3);
        e.step = sqlite3_column_int(st, 4);
        s_text(e.detail, sizeof e.detail, st, 5);
        fn(arg, &e);
    }
    sqlite3_finalize(st);
    return 0;
}

int store_ckpt_add(store_t *s, int64_t job, int stage, int step, uint64_t size, uint32_t crc)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "INSERT OR REPLACE INTO ckpts(job, stage, step, size, crc) VALUES(?,?,?,?,?)", -1,
                           &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare ckpt", NULL, 0);
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, stage);
    sqlite3_bind_int(st, 3, step);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)size);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)crc);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : s_fail(s, "insert ckpt", NULL, 0);
}

int store_ckpt_delete_before(store_t *s, int64_t job, int step)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "DELETE FROM ckpts WHERE job=? AND step<?", -1, &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare delete ckpts", NULL, 0);
    sqlite3_bind_int64(st, 1, job);
    sqlite3_bind_int(st, 2, step);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : s_fail(s, "delete ckpts", NULL, 0);
}

int store_ckpts_each(store_t *s, int64_t job,
                     void (*fn)(void *arg, int stage, int step, uint64_t size, uint32_t crc), void *arg)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT stage, step, size, crc FROM ckpts WHERE job=? ORDER BY step, stage", -1,
                           &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare ckpts", NULL, 0);
    sqlite3_bind_int64(st, 1, job);
    while (sqlite3_step(st) == SQLITE_ROW)
        fn(arg, sqlite3_column_int(st, 0), sqlite3_column_int(st, 1), (uint64_t)sqlite3_column_int64(st, 2),
           (uint32_t)sqlite3_column_int64(st, 3));
    sqlite3_finalize(st);
    return 0;
}

int store_assignments_each(store_t *s, int64_t job,
                           void (*fn)(void *arg, int stage, const char *node, int layer0, int layer1), void *arg)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT stage, node, layer0, layer1 FROM assignments WHERE job=? ORDER BY stage", -1,
                           &st, NULL) != SQLITE_OK)
        return s_fail(s, "prepare assignments", NULL, 0);
    sqlite3_bind_int64(st, 1, job);
    while (sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *n = sqlite3_column_text(st, 1);
        fn(arg, sqlite3_column_int(st, 0), n ? (const char *)n : "", sqlite3_column_int(st, 2),
           sqlite3_column_int(st, 3));
    }
    sqlite3_finalize(st);
    return 0;
}
