/* rt_harness.c — see rt_harness.h. */
#define _XOPEN_SOURCE 700 /* mkdtemp, realpath */
#include "rt_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "fileio.h" /* tah_file_read */
#include "keys.h"   /* keys_read_public, keys_read_secret, keys_set_client */

/* rt_run's limit per command (ctest gives a whole test 600 s) */
#define RT_RUN_LIMIT_S 300

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void s_sleep(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    nanosleep(&ts, NULL);
}

static void s_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rt_harness: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* Deterministic text with some structure to learn and enough variety that
 * a tiny model does not memorise it in 200 steps: 300 words of 1-3
 * syllables, Zipf-like word frequencies (square of a uniform), an LCG. */
static uint32_t s_lcg(uint32_t *x)
{
    *x = *x * 1664525u + 1013904223u;
    return *x >> 16;
}

static void s_corpus(const char *path, size_t bytes, uint32_t seed)
{
    static const char *syl[] = { "ka", "to", "ri", "en", "sa", "lo", "mu", "de", "ni", "pa",
                                 "th", "er", "an", "is", "on", "ve", "ga", "bu", "ch", "ol" };
    char words[300][8];
    uint32_t x = 1;
    for (int i = 0; i < 300; i++) {
        int n = 1 + (int)(s_lcg(&x) % 3);
        words[i][0] = 0;
        for (int k = 0; k < n; k++)
            strcat(words[i], syl[s_lcg(&x) % 20]);
    }
    x = seed;
    FILE *f = fopen(path, "w");
    if (!f)
        s_die("cannot write %s", path);
    size_t n = 0;
    while (n < bytes) {
        int len = 5 + (int)(s_lcg(&x) % 10);
        for (int i = 0; i < len; i++) {
            double u = (double)(s_lcg(&x) % 1000) / 1000.0;
            n += (size_t)fprintf(f, "%s%s", i ? " " : "", words[(int)(u * u * 300)]);
        }
        n += (size_t)fprintf(f, ".\n");
    }
    fclose(f);
}

void rt_init(rt_t *r, const char *name)
{
    memset(r, 0, sizeof *r);
    char tmpl[256];
    snprintf(tmpl, sizeof tmpl, "%s.XXXXXX", name);
    if (!mkdtemp(tmpl))
        s_die("mkdtemp: %s", strerror(errno));
    if (!realpath(tmpl, r->dir))
        s_die("realpath: %s", strerror(errno));
    char p[700];
    snprintf(p, sizeof p, "%s/train.txt", r->dir);
    s_corpus(p, 60000, 1);
    snprintf(p, sizeof p, "%s/val.txt", r->dir);
    s_corpus(p, 8000, 2);
}

static pid_t s_spawn(char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid < 0)
        s_die("fork: %s", strerror(errno));
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

void rt_start_coord(rt_t *r, double node_timeout, int port)
{
    char listen[64], state[600], log[600], ept[700], to[32];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(state, sizeof state, "%s/state", r->dir);
    snprintf(log, sizeof log, "%s/coord.log", r->dir);
    snprintf(ept, sizeof ept, "%s/endpoint", state);
    snprintf(to, sizeof to, "%g", node_timeout);
    unlink(ept);
    r->node_timeout = node_timeout;
    snprintf(r->coord_pub, sizeof r->coord_pub, "%s/coord.pub", state);
    snprintf(r->admin_key, sizeof r->admin_key, "%s/admin.key", state);
    char *argv[] = { TAH_COORD_EXE, "serve", "--listen", listen, "--state", state, "--node-timeout", to, "-v",
                     r->secure ? NULL : "--open", NULL };
    r->coord = s_spawn(argv, log);
    double t0 = s_now();
    while (s_now() - t0 < 20) {
        FILE *f = fopen(ept, "r");
        if (f) {
            char line[128] = "";
            if (fgets(line, sizeof line, f)) {
                line[strcspn(line, "\n")] = 0;
                snprintf(r->ep, sizeof r->ep, "%s", line);
            }
            fclose(f);
            if (r->ep[0])
                return;
        }
        s_sleep(0.05);
    }
    s_die("coordinator did not start (see %s)", log);
}

Tah__Envelope *rt_status(rt_t *r, uint64_t job)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (r->secure) {
        char pub[KEYS_Z85_LEN + 1], kerr[1024];
        keys_pair_t kp;
        if (keys_read_public(r->coord_pub, pub, kerr, sizeof kerr) != 0 ||
            keys_read_secret(r->admin_key, &kp, kerr, sizeof kerr) != 0 || keys_set_client(s, pub, &kp, kerr, sizeof kerr))
            s_die("%s", kerr);
    }
    zmq_connect(s, r->ep);
    Tah__StatusReq sr = TAH__STATUS_REQ__INIT;
    sr.job = job;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_STATUS;
    env.status = &sr;
    wire_send_envelope(s, NULL, 0, &env, 0);
    int to = 0;
    char err[256];
    Tah__Envelope *rep = wire_recv_envelope(s, 10000, &to, err, sizeof err);
    if (rep && rep->body_case != TAH__ENVELOPE__BODY_STATUS_REP)
        wire_envelope_free(&rep);
    zmq_close(s);
    zmq_ctx_term(ctx);
    return rep;
}

int rt_wait_nodes(rt_t *r, const char *state, int count, double timeout)
{
    double t0 = s_now();
    while (s_now() - t0 < timeout) {
        Tah__Envelope *e = rt_status(r, 0);
        int n = 0;
        for (size_t i = 0; e && i < e->status_rep->n_nodes; i++)
            n += !strcmp(e->status_rep->nodes[i]->state, state);
        wire_envelope_free(&e);
        if (n == count)
            return 1;
        s_sleep(0.1);
    }
    return 0;
}

void rt_start_nodes(rt_t *r, int n)
{
    for (int i = 0; i < n && r->nn < RT_MAX_NODES; i++) {
        int k = r->nn;
        snprintf(r->names[k], sizeof r->names[k], "n%d", k);
        char log[600], pid[600];
        snprintf(log, sizeof log, "%s/%s.log", r->dir, r->names[k]);
        snprintf(pid, sizeof pid, "%s/%s.pid", r->dir, r->names[k]);
        char coord[160];
        snprintf(coord, sizeof coord, "%s", r->ep);
        /* TAH_RT_NODE_DEVICE=cuda:K: the nodes run their stages on that GPU (a GPU machine's
         * run of the runtime tests that do not compare with tah-train bit for bit) */
        const char *dev = getenv("TAH_RT_NODE_DEVICE");
        char *argv[] = { TAH_NODE_EXE, "join", "--coordinator", coord, "--name", r->names[k], "--threads", "1",
                         "--listen", "127.0.0.1:0", "--pid-file", pid, "-v", dev ? "--device" : NULL, (char *)dev,
                         NULL };
        r->nodes[k] = s_spawn(argv, log);
        r->nn++;
        if (!rt_wait_nodes(r, "idle", r->nn, 30))
            s_die("node %s did not join (see %s)", r->names[k], log);
    }
}

const char *rt_write(rt_t *r, const char *name, const char *text)
{
    static char paths[8][700];
    static int slot = 0;
    char *p = paths[slot++ % 8];
    snprintf(p, 700, "%s/%s", r->dir, name);
    FILE *f = fopen(p, "w");
    if (!f)
        s_die("cannot write %s", p);
    fputs(text, f);
    fclose(f);
    return p;
}

int rt_run(char *const argv[], char *out, size_t outlen)
{
    int fds[2];
    if (pipe(fds) != 0)
        s_die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t k;
    char buf[4096];
    const double t0 = s_now();
    int killed = 0;
    for (;;) {
        /* a client that hangs (e.g. in zmq_ctx_term) fails its test here, naming the command */
        const double left = RT_RUN_LIMIT_S - (s_now() - t0);
        struct pollfd pf = { .fd = fds[0], .events = POLLIN };
        const int pr = left > 0 ? poll(&pf, 1, (int)(left * 1000) + 1) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0) {
            fprintf(stderr, "rt_harness: `%s %s` still running after %d s; killed\n", argv[0],
                    argv[1] ? argv[1] : "", RT_RUN_LIMIT_S);
            kill(pid, SIGKILL);
            killed = 1;
            break;
        }
        if ((k = read(fds[0], buf, sizeof buf)) <= 0)
            break;
        size_t take = (size_t)k;
        if (out && n + take >= outlen)
            take = outlen - 1 - n;
        if (out && take) {
            memcpy(out + n, buf, take);
            n += take;
        }
    }
    if (out)
        out[n] = 0;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (killed)
        return 124;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

uint64_t rt_submit(rt_t *r, const char *job_file, char *out, size_t outlen)
{
    char coord[160];
    snprintf(coord, sizeof coord, "%s", r->ep);
    char *argv[] = { TAH_COORD_EXE, "submit", "--coordinator", coord, (char *)job_file,
                     r->secure ? "--coordinator-key" : NULL, r->coord_pub, "--key", r->admin_key, NULL };
    int rc = rt_run(argv, out, outlen);
    if (rc != 0)
        return 0;
    return strtoull(out, NULL, 10);
}

int rt_wait_job(rt_t *r, uint64_t job, double timeout, char *state, size_t slen, char *reason, size_t rlen)
{
    double t0 = s_now();
    while (s_now() - t0 < timeout) {
        Tah__Envelope *e = rt_status(r, job);
        if (e && e->status_rep->n_jobs == 1) {
            const Tah__JobInfo *j = e->status_rep->jobs[0];
            if (strcmp(j->state, "queued") && strcmp(j->state, "running") && strcmp(j->state, "paused")) {
                snprintf(state, slen, "%s", j->state);
                snprintf(reason, rlen, "%s", j->reason);
                wire_envelope_free(&e);
                return 1;
            }
        }
        wire_envelope_free(&e);
        s_sleep(0.2);
    }
    snprintf(state, slen, "timeout");
    reason[0] = 0;
    return 0;
}

int rt_metrics(const char *path, const char *key, double *v, int max)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[2048], pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, pat);
        v[n++] = p ? strtod(p + strlen(pat), NULL) : NAN;
    }
    fclose(f);
    return n;
}

const char *rt_metrics_diff(const char *dist, const char *ref, const char *const keys[], int nkeys, int steps,
                            double rtol)
{
    static char why[512];
    double *a = calloc((size_t)steps + 8, sizeof *a), *b = calloc((size_t)steps + 8, sizeof *b);
    why[0] = 0;
    for (int k = 0; a && b && k < nkeys && !why[0]; k++) {
        int na = rt_metrics(dist, keys[k], a, steps + 8), nb = rt_metrics(ref, keys[k], b, steps + 8);
        if (na != steps || nb != steps) {
            snprintf(why, sizeof why, "%s: %d lines in the job's metrics, %d in tah-train's (want %d)", keys[k], na,
                     nb, steps);
            break;
        }
        for (int i = 0; i < steps && !why[0]; i++) {
            if (!strcmp(keys[k], "val_loss") && isnan(a[i]) && isnan(b[i]))
                continue;
            if (!(fabs(a[i] - b[i]) <= rtol * (1.0 + fabs(b[i]))))
                snprintf(why, sizeof why, "step %d: %s %.6f distributed vs %.6f tah-train", i + 1, keys[k], a[i],
                         b[i]);
        }
    }
    if (!a || !b)
        snprintf(why, sizeof why, "out of memory");
    free(a);
    free(b);
    return why[0] ? why : NULL;
}

void rt_kill_node(rt_t *r, int i, int sig)
{
    if (r->nodes[i] > 0) {
        kill(r->nodes[i], sig);
        if (sig == SIGKILL) {
            waitpid(r->nodes[i], NULL, 0);
            r->nodes[i] = 0;
        }
    }
}

static int s_reap(pid_t pid, const char *what)
{
    if (pid <= 0)
        return 0;
    kill(pid, SIGTERM);
    double t0 = s_now();
    int st = 0;
    while (s_now() - t0 < 20) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
                return 0;
            fprintf(stderr, "rt_harness: %s exited with status %d (signal %d)\n", what,
                    WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
            return -1;
        }
        s_sleep(0.05);
    }
    fprintf(stderr, "rt_harness: %s ignored SIGTERM for 20 s; killed\n", what);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

int rt_stop_coord(rt_t *r)
{
    int rc = s_reap(r->coord, "tah-coord");
    r->coord = 0;
    return rc;
}

int rt_stop(rt_t *r)
{
    int rc = 0;
    for (int i = 0; i < r->nn; i++) {
        if (s_reap(r->nodes[i], r->names[i]) != 0)
            rc = -1;
        r->nodes[i] = 0;
    }
    if (rt_stop_coord(r) != 0)
        rc = -1;
    return rc;
}

const char *rt_token(rt_t *r, uint64_t job, const char *expires, char *out, size_t outlen)
{
    static char tok[8][256];
    static int slot = 0;
    char coord[160], js[32];
    snprintf(coord, sizeof coord, "%s", r->ep);
    snprintf(js, sizeof js, "%llu", (unsigned long long)job);
    char *argv[] = { TAH_COORD_EXE, "token", "create", "--coordinator", coord, "--job", js, "--expires",
                     (char *)expires, "--coordinator-key", r->coord_pub, "--key", r->admin_key, NULL };
    if (rt_run(argv, out, outlen) != 0)
        return NULL;
    char *t = tok[slot++ % 8];
    snprintf(t, 256, "%s", out);
    t[strcspn(t, "\n")] = 0;
    return t;
}

const char *rt_keygen(rt_t *r, const char *name)
{
    static char paths[8][700];
    static int slot = 0;
    char dir[650], out[1024];
    snprintf(dir, sizeof dir, "%s/keys-%s", r->dir, name);
    char *argv[] = { TAH_NODE_EXE, "keygen", "--out", dir, NULL };
    if (rt_run(argv, out, sizeof out) != 0)
        s_die("tah-node keygen --out %s failed: %s", dir, out);
    char *p = paths[slot++ % 8];
    snprintf(p, 700, "%s/node.key", dir);
    return p;
}

int rt_spawn_node(rt_t *r, const char *name, const char *const extra[])
{
    if (r->nn >= RT_MAX_NODES)
        s_die("too many nodes");
    int k = r->nn;
    snprintf(r->names[k], sizeof r->names[k], "%s", name);
    char log[600], pid[600], coord[160];
    snprintf(log, sizeof log, "%s/%s.log", r->dir, name);
    snprintf(pid, sizeof pid, "%s/%s.pid", r->dir, name);
    snprintf(coord, sizeof coord, "%s", r->ep);
    char *argv[32] = { TAH_NODE_EXE, "join", "--coordinator", coord, "--name", r->names[k], "--threads", "1",
                       "--listen", "127.0.0.1:0", "--pid-file", pid, "-v" };
    int n = 13;
    for (int i = 0; extra && extra[i] && n < 31; i++)
        argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    r->nodes[k] = s_spawn(argv, log);
    r->nn++;
    return k;
}

int rt_node_exit(rt_t *r, int i, double timeout)
{
    double t0 = s_now();
    while (s_now() - t0 < timeout) {
        int st = 0;
        if (r->nodes[i] > 0 && waitpid(r->nodes[i], &st, WNOHANG) == r->nodes[i]) {
            r->nodes[i] = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        s_sleep(0.05);
    }
    return -1;
}

int rt_log_has(rt_t *r, const char *name, const char *text)
{
    char p[700], err[256];
    snprintf(p, sizeof p, "%s/%s", r->dir, name);
    uint8_t *data = NULL;
    size_t len = 0;
    if (tah_file_read(p, 1u << 28, &data, &len, err, sizeof err) != 0)
        return 0;
    char *t = realloc(data, len + 1);
    if (!t) {
        free(data);
        return 0;
    }
    t[len] = 0;
    int found = strstr(t, text) != NULL;
    free(t);
    return found;
}
