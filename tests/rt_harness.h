/* rt_harness.h — multi-process runtime tests on loopback: a coordinator
 * and nodes as child processes (the real tah-coord / tah-node binaries),
 * ephemeral ports, a private directory per test, status queries over the
 * real control protocol. Every child is stopped (SIGTERM, then SIGKILL)
 * by rt_stop; rt_stop reports whether each exited cleanly. */
#ifndef TAH_RT_HARNESS_H
#define TAH_RT_HARNESS_H

#include <stdint.h>
#include <sys/types.h>

#include "wire.h" /* Tah__StatusRep */

#define RT_MAX_NODES 12

typedef struct rt {
    char dir[512];          /* private directory (absolute) */
    char ep[128];           /* coordinator endpoint tcp://127.0.0.1:PORT */
    pid_t coord;
    pid_t nodes[RT_MAX_NODES];
    char names[RT_MAX_NODES][32];
    int nn;
    double node_timeout;
    int secure;             /* set before rt_start_coord: CURVE + tokens (no --open) */
    char coord_pub[700];    /* secure: DIR/state/coord.pub */
    char admin_key[700];    /* secure: DIR/state/admin.key */
} rt_t;

/* Directory DIR = ./NAME.XXXXXX with a generated text corpus DIR/train.txt
 * and DIR/val.txt (deterministic, no network). */
void rt_init(rt_t *r, const char *name);
/* port 0: ephemeral. Waits until the endpoint file appears. Open mode
 * (serve --open) unless r->secure; client calls below use the admin key
 * when secure. */
void rt_start_coord(rt_t *r, double node_timeout, int port);
/* Nodes write their pid to DIR/NAME.pid (join --pid-file, for `tah-node leave`).
 * Starts nodes n0..n(n-1) one after another (each joins before the next
 * starts, so their speed measurements do not overlap) and waits until the
 * coordinator lists them idle. */
void rt_start_nodes(rt_t *r, int n);
/* Waits (up to timeout s) until `count` nodes are listed with this state. */
int rt_wait_nodes(rt_t *r, const char *state, int count, double timeout);

/* Status over the control protocol; NULL if no answer. Free with wire_envelope_free. */
Tah__Envelope *rt_status(rt_t *r, uint64_t job);
/* Write DIR/NAME with text; returns the path in a static buffer slot. */
const char *rt_write(rt_t *r, const char *name, const char *text);
/* Run a command, capture stdout+stderr into out; returns the exit status, or 124
 * after killing a command still running after 300 s (RT_RUN_LIMIT_S). */
int rt_run(char *const argv[], char *out, size_t outlen);
/* tah-coord submit; returns the job id (0 on failure, output in out). */
uint64_t rt_submit(rt_t *r, const char *job_file, char *out, size_t outlen);
/* Poll until the job leaves queued/running; copies its state and reason. */
int rt_wait_job(rt_t *r, uint64_t job, double timeout, char *state, size_t slen, char *reason, size_t rlen);
/* Per-step values of a metrics.jsonl ("loss", "grad_norm", "val_loss");
 * entries without the key are NAN. Returns the number of lines. */
int rt_metrics(const char *path, const char *key, double *v, int max);

/* Two metrics.jsonl files agree: both have `steps` lines and, for each
 * key, every step's value is within rtol * (1 + |ref|) of ref's (val_loss,
 * which only validation steps carry, may be absent from both). NULL, or
 * what differs (a static buffer). */
const char *rt_metrics_diff(const char *dist, const char *ref, const char *const keys[], int nkeys, int steps,
                            double rtol);

void rt_kill_node(rt_t *r, int i, int sig);

/* Secure mode. A join token for job (tah-coord token create), or NULL
 * with the command's output in out. */
const char *rt_token(rt_t *r, uint64_t job, const char *expires, char *out, size_t outlen);
/* tah-node keygen --out DIR/keys-NAME; returns the secret key path. */
const char *rt_keygen(rt_t *r, const char *name);
/* Start node NAME with `join --coordinator EP --name NAME --threads 1
 * --listen 127.0.0.1:0 -v` plus extra (NULL-terminated); does not wait.
 * Returns its index; its log is DIR/NAME.log. */
int rt_spawn_node(rt_t *r, const char *name, const char *const extra[]);
/* Wait up to timeout s for node i to exit: its exit status, or -1. */
int rt_node_exit(rt_t *r, int i, double timeout);
/* Whether the file DIR/NAME contains text. */
int rt_log_has(rt_t *r, const char *name, const char *text);
/* SIGTERM everything; 0 if every child exited with status 0 within 20 s. */
int rt_stop(rt_t *r);
int rt_stop_coord(rt_t *r);

#endif
