/* test_store.c — the coordinator's job records (coordinator/store.h) keep
 * what a restarted coordinator needs: the stall watchdog's slowest step
 * (slowest_s) written by store_job_update reads back after the database is
 * closed and opened again, and a database of the first release (its jobs
 * table without the columns added since) opens, gains them with their
 * defaults, and keeps the new values too. */
#define _XOPEN_SOURCE 700 /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "store.h"

static char s_dir[256];

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_dir, sizeof s_dir, "store.XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

typedef struct s_seen {
    int n;
    store_job_t last; /* ini not kept */
} s_seen_t;

static void s_collect(void *arg, store_job_t *j)
{
    s_seen_t *s = arg;
    s->n++;
    s->last = *j;
    s->last.ini = NULL;
}

static s_seen_t s_read(const char *path)
{
    char err[512];
    s_seen_t seen = { 0 };
    store_t *st = store_open(path, err, sizeof err);
    if (!st)
        fail_msg("store_open %s: %s", path, err);
    assert_int_equal(store_jobs_each(st, s_collect, &seen, err, sizeof err), 0);
    store_destroy(&st);
    return seen;
}

static void s_update(const char *path, store_job_t *j)
{
    char err[512];
    store_t *st = store_open(path, err, sizeof err);
    if (!st)
        fail_msg("store_open %s: %s", path, err);
    if (store_job_update(st, j, err, sizeof err) != 0)
        fail_msg("store_job_update: %s", err);
    store_destroy(&st);
}

static void test_slowest_survives_reopen(void **state)
{
    (void)state;
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/fresh.db", s_dir);
    store_t *st = store_open(path, err, sizeof err);
    assert_non_null(st);
    store_job_t j = { 0 };
    snprintf(j.name, sizeof j.name, "job.ini");
    j.ini = "[job]\n";
    j.stages = 2;
    j.steps = 10;
    snprintf(j.state, sizeof j.state, "running");
    assert_int_equal(store_job_insert(st, &j, err, sizeof err), 0);
    store_destroy(&st);
    s_seen_t seen = s_read(path);
    assert_int_equal(seen.n, 1);
    assert_true(seen.last.slowest_s == 0.0); /* a new job has seen no step */
    j.slowest_s = 12.5;
    j.recoveries = 3;
    s_update(path, &j);
    seen = s_read(path);
    assert_int_equal(seen.n, 1);
    assert_true(seen.last.slowest_s == 12.5);
    assert_int_equal(seen.last.recoveries, 3);
    assert_string_equal(seen.last.state, "running");
}

/* The jobs table as the first release created it, one job in it. */
static void s_old_database(const char *path)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    const char *sql =
        "CREATE TABLE jobs(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, ini TEXT NOT NULL,"
        " base_dir TEXT, stages INTEGER, steps INTEGER, state TEXT, reason TEXT, step INTEGER, loss REAL,"
        " has_loss INTEGER, tokens_per_s REAL, metrics_path TEXT, submitted REAL, started REAL, finished REAL);"
        "INSERT INTO jobs(name, ini, stages, steps, state, step) VALUES('old.ini', '[job]', 4, 100, 'running', 42);";
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("old schema: %s", msg ? msg : "?");
    sqlite3_close(db);
}

static void test_old_database_upgrades(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/old.db", s_dir);
    s_old_database(path);
    s_seen_t seen = s_read(path);
    assert_int_equal(seen.n, 1);
    assert_string_equal(seen.last.name, "old.ini");
    assert_int_equal(seen.last.step, 42);
    assert_int_equal(seen.last.recoveries, 0); /* the added columns' defaults */
    assert_true(seen.last.slowest_s == 0.0);
    store_job_t j = seen.last;
    j.slowest_s = 0.75;
    s_update(path, &j);
    seen = s_read(path);
    assert_true(seen.last.slowest_s == 0.75);
    assert_int_equal(seen.last.step, 42);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slowest_survives_reopen),
        cmocka_unit_test(test_old_database_upgrades),
    };
    return cmocka_run_group_tests(tests, s_setup, NULL);
}
