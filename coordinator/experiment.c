/* experiment.c — `tah-coord experiment` (see experiment.h).
 *
 * Flow: parse and validate the whole experiment (every point's job file
 * is built and parsed before anything runs), then per point: apply the
 * link settings (netlab shape / job keys), submit, poll the status until
 * the job ends, read its metrics.jsonl, and rewrite results.csv and
 * table.md; at the end the plots. SIGINT/SIGTERM cancel the running job,
 * undo the shaping and keep what finished. */
#define _XOPEN_SOURCE 700 /* realpath, sigaction */
#include "experiment.h"

#include <errno.h>
#include <fcntl.h>    /* open */
#include <ini.h>      /* ini_parse_string */
#include <libgen.h>   /* dirname, basename */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> /* mkdir */
#include <sys/wait.h> /* waitpid */
#include <time.h>
#include <unistd.h>   /* fork, execvp */

#include "codec.h"    /* codec_spec_parse */
#include "errors.h"
#include "fileio.h"   /* tah_file_read */
#include "jobfile.h"  /* jobfile_parse, jobfile_check_files */
#include "linkspec.h"

#define X_MAXLIST 32
#define X_MAXKV 128

enum { X_NETLAB, X_INPROCESS, X_NONE };
static const char *s_shaping_name[] = { "netlab", "inprocess", "none" };

typedef struct x_kv {
    char key[64];
    char val[1100];
} x_kv_t;

typedef struct x_res {     /* one finished point */
    int done;              /* 1: metrics read */
    uint64_t job;
    char state[32];
    int n;                 /* steps read */
    double *loss, *time;   /* per step (owned) */
    double tps, loss_tail, val_loss;
    int have_val;
    double wire, fwd, bwd, fp32; /* bytes per step (means) */
    double wall;
    double util_mean, util_max;  /* -1: no shaped link */
} x_res_t;

typedef struct x_exp {
    char file[PATH_MAX], dir[PATH_MAX], stem[256], out[PATH_MAX];
    x_kv_t kv[X_MAXKV];
    int nkv;
    char bw_s[X_MAXLIST][256], dl_s[X_MAXLIST][256];
    linkspec_t bw[X_MAXLIST], dl[X_MAXLIST];
    int nbw, ndl;
    char fwd[X_MAXLIST][256], bwd[X_MAXLIST][256];
    int ncodec;
    int mb[X_MAXLIST], nmb;
    int steps, shaping, warmup, baseline;
    char baseline_s[520], netlab[PATH_MAX];
    char msg[600];         /* first error of the INI handler */
    char section[64];
    int seen_sweep;
    /* points: index = ((di * nmb + mi) * nbw + bi) * ncodec + ci */
    int npts;
    x_res_t *res;
    char (*ini)[16384];
    int netlab_k[64];      /* stage -> netlab node index (netlab shaping) */
    char lab_names[64][64]; /* stage -> the node expected to run it */
    int nlab;
} x_exp_t;

static volatile sig_atomic_t s_stop = 0;
static void s_on_signal(int sig)
{
    s_stop = sig;
}

/* ---- small helpers ---- */

static void s_cpy(char *d, size_t n, const char *src)
{
    size_t l = strlen(src);
    if (l >= n)
        l = n - 1;
    memcpy(d, src, l);
    d[l] = 0;
}

static int s_run(const char *const *argv, char *out, size_t outlen)
{
    int fd[2] = { -1, -1 };
    if (out && pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (out) {
            dup2(fd[1], 1);
            close(fd[0]);
            close(fd[1]);
        } else {
            int devnull = open("/dev/null", O_WRONLY);
            if (devnull >= 0)
                dup2(devnull, 1);
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    if (out) {
        close(fd[1]);
        size_t used = 0;
        ssize_t r;
        while ((r = read(fd[0], out + used, outlen - 1 - used)) > 0 && used + (size_t)r < outlen - 1)
            used += (size_t)r;
        if (r > 0)
            used += (size_t)r;
        out[used < outlen ? used : outlen - 1] = 0;
        close(fd[0]);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static double s_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void s_sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Split s at whitespace (and commas when comma_sep) into out[]; count or -1. */
static int s_split(const char *s, int comma_sep, char out[][256], int max)
{
    int n = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == '\t' || (comma_sep && *p == ','))
            p++;
        if (!*p)
            return n;
        const char *e = p;
        while (*e && *e != ' ' && *e != '\t' && !(comma_sep && *e == ','))
            e++;
        if (n == max || (size_t)(e - p) >= 256)
            return -1;
        memcpy(out[n], p, (size_t)(e - p));
        out[n][e - p] = 0;
        n++;
        p = e;
    }
}

static int s_json_num(const char *line, const char *key, double *v)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p)
        return -1;
    char *end = NULL;
    *v = strtod(p + strlen(pat), &end);
    return end == p + strlen(pat) ? -1 : 0;
}

/* ---- the experiment file ---- */

static int s_sweep_key(x_exp_t *x, const char *name, const char *value)
{
    char tok[X_MAXLIST][256];
    char err[400];
    if (!strcmp(name, "bandwidths") || !strcmp(name, "delays")) {
        int bw = name[0] == 'b';
        int n = s_split(value, 0, tok, X_MAXLIST);
        if (n <= 0) {
            snprintf(x->msg, sizeof x->msg, "%s wants 1..%d points separated by spaces", name, X_MAXLIST);
            return 0;
        }
        for (int i = 0; i < n; i++) {
            linkspec_t *ls = bw ? &x->bw[i] : &x->dl[i];
            if (linkspec_parse(tok[i], bw ? 1e5 : 6e4, ls, err, sizeof err) != 0) {
                snprintf(x->msg, sizeof x->msg, "%s: point %d %s", name, i + 1, err);
                return 0;
            }
            s_cpy(bw ? x->bw_s[i] : x->dl_s[i], 256, tok[i]);
        }
        *(bw ? &x->nbw : &x->ndl) = n;
        return 1;
    }
    if (!strcmp(name, "codecs") || !strcmp(name, "baseline")) {
        int base = name[0] == 'b';
        int n = s_split(value, 0, tok, X_MAXLIST);
        if (n <= 0 || (base && n != 1)) {
            snprintf(x->msg, sizeof x->msg, "%s wants %s FWD/BWD codec pairs, e.g. tah/fixpt:bits=8", name,
                     base ? "one" : "1..32");
            return 0;
        }
        for (int i = 0; i < n; i++) {
            char *slash = strchr(tok[i], '/');
            if (!slash || strchr(slash + 1, '/')) {
                snprintf(x->msg, sizeof x->msg, "%s: '%.300s' is not FWD/BWD (two codec specs joined by '/')", name,
                         tok[i]);
                return 0;
            }
            *slash = 0;
            const char *spec[2] = { tok[i], slash + 1 };
            for (int k = 0; k < 2; k++) {
                codec_spec_t cs;
                char cerr[256] = "";
                if (codec_spec_parse(spec[k], &cs, cerr, sizeof cerr) != 0) {
                    snprintf(x->msg, sizeof x->msg, "%s: %s codec '%.200s': %.300s", name, k ? "backward" : "forward",
                             spec[k], cerr);
                    return 0;
                }
            }
            if (base) {
                snprintf(x->baseline_s, sizeof x->baseline_s, "%.255s/%.255s", spec[0], spec[1]);
            } else {
                s_cpy(x->fwd[i], 256, spec[0]);
                s_cpy(x->bwd[i], 256, spec[1]);
            }
        }
        if (!base)
            x->ncodec = n;
        return 1;
    }
    if (!strcmp(name, "micro_batches")) {
        int n = s_split(value, 1, tok, X_MAXLIST);
        for (int i = 0; i < n; i++) {
            char *end = NULL;
            long v = strtol(tok[i], &end, 10);
            if (*end || end == tok[i] || v < 1 || v > 65536)
                n = -1;
            else
                x->mb[i] = (int)v;
            if (n < 0)
                break;
        }
        if (n <= 0) {
            snprintf(x->msg, sizeof x->msg, "micro_batches wants a list of integers in 1..65536, got '%s'", value);
            return 0;
        }
        x->nmb = n;
        return 1;
    }
    if (!strcmp(name, "steps") || !strcmp(name, "warmup_steps")) {
        char *end = NULL;
        long v = strtol(value, &end, 10);
        int st = name[0] == 's';
        if (*end || end == value || v < (st ? 1 : 0) || v > (1L << 30)) {
            snprintf(x->msg, sizeof x->msg, "%s = '%s' is not an integer in range %d..1073741824", name, value,
                     st ? 1 : 0);
            return 0;
        }
        *(st ? &x->steps : &x->warmup) = (int)v;
        return 1;
    }
    if (!strcmp(name, "shaping")) {
        for (int i = 0; i < 3; i++) {
            if (!strcmp(value, s_shaping_name[i])) {
                x->shaping = i;
                return 1;
            }
        }
        snprintf(x->msg, sizeof x->msg, "shaping = '%s' wants netlab, inprocess or none", value);
        return 0;
    }
    if (!strcmp(name, "netlab") || !strcmp(name, "output")) {
        char *dst = name[0] == 'n' ? x->netlab : x->out;
        if (!*value || strlen(value) + strlen(x->dir) + 2 >= PATH_MAX) {
            snprintf(x->msg, sizeof x->msg, "%s wants a path", name);
            return 0;
        }
        jobfile_resolve(x->dir, value, dst, PATH_MAX);
        return 1;
    }
    snprintf(x->msg, sizeof x->msg,
             "unknown [sweep] key '%s'; HINT: bandwidths, delays, codecs, micro_batches, steps, shaping, netlab, "
             "baseline, warmup_steps, output",
             name);
    return 0;
}

static int s_handler(void *user, const char *section, const char *name, const char *value)
{
    x_exp_t *x = user;
    if (x->msg[0])
        return 1;
    if (!name)
        return 1;
    if (!strcmp(section, "job")) {
        if (!strcmp(name, "link_rate_mbps") || !strcmp(name, "link_delay_ms")) {
            snprintf(x->msg, sizeof x->msg, "%s in [job]; HINT: an experiment sets links per point: [sweep] "
                                             "bandwidths and delays", name);
            return 0;
        }
        if (x->nkv == X_MAXKV || strlen(name) >= sizeof x->kv[0].key || strlen(value) >= sizeof x->kv[0].val) {
            snprintf(x->msg, sizeof x->msg, "too many or too long [job] keys");
            return 0;
        }
        snprintf(x->kv[x->nkv].key, sizeof x->kv[0].key, "%s", name);
        snprintf(x->kv[x->nkv].val, sizeof x->kv[0].val, "%s", value);
        x->nkv++;
        return 1; /* checked by jobfile_parse on the [job] lines */
    }
    if (!strcmp(section, "sweep")) {
        return s_sweep_key(x, name, value);
    }
    snprintf(x->msg, sizeof x->msg, "key '%s' in section [%s]; an experiment has [job] and [sweep]", name,
             section[0] ? section : "(none)");
    return 0;
}

/* The text with every line outside [job] blanked: jobfile_parse then
 * reports errors at the experiment file's own line numbers. *has_sweep:
 * a [sweep] header exists (possibly with no keys). */
static char *s_job_lines(const char *text, int *has_sweep)
{
    size_t n = strlen(text);
    char *t = malloc(n + 1);
    if (!t)
        return NULL;
    memcpy(t, text, n + 1);
    int in_job = 0;
    for (char *line = t; line && *line;) {
        char *nl = strchr(line, '\n');
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '[') {
            in_job = !strncmp(p, "[job]", 5);
            *has_sweep |= !strncmp(p, "[sweep]", 7);
        }
        else if (!in_job)
            for (char *q = line; q < (nl ? nl : line + strlen(line)); q++)
                *q = ' ';
        line = nl ? nl + 1 : NULL;
    }
    return t;
}

static void s_point_index(const x_exp_t *x, int p, int *di, int *mi, int *bi, int *ci)
{
    *ci = p % x->ncodec;
    p /= x->ncodec;
    *bi = p % x->nbw;
    p /= x->nbw;
    *mi = p % x->nmb;
    *di = p / x->nmb;
}

static int s_pt(const x_exp_t *x, int di, int mi, int bi, int ci)
{
    return ((di * x->nmb + mi) * x->nbw + bi) * x->ncodec + ci;
}

/* The job file of point p. */
static int s_point_ini(const x_exp_t *x, int p, char *buf, size_t n)
{
    int di, mi, bi, ci;
    s_point_index(x, p, &di, &mi, &bi, &ci);
    size_t used = 0;
#define PUT(...)                                                                    \
    do {                                                                            \
        int w_ = snprintf(buf + used, n - used, __VA_ARGS__);                       \
        if (w_ < 0 || (size_t)w_ >= n - used)                                       \
            return TAH_ESPACE;                                                      \
        used += (size_t)w_;                                                         \
    } while (0)
    PUT("# %s point %d (written by tah-coord experiment)\n[job]\n", x->stem, p);
    for (int i = 0; i < x->nkv; i++) {
        const char *k = x->kv[i].key;
        if (!strcmp(k, "name") || !strcmp(k, "metrics") || !strcmp(k, "fwd_codec") || !strcmp(k, "bwd_codec") ||
            !strcmp(k, "micro_batches") || !strcmp(k, "steps"))
            continue;
        PUT("%s = %s\n", k, x->kv[i].val);
    }
    PUT("name = %s-p%d\nfwd_codec = %s\nbwd_codec = %s\nmicro_batches = %d\nsteps = %d\n", x->stem, p, x->fwd[ci],
        x->bwd[ci], x->mb[mi], x->steps);
    if (x->shaping == X_INPROCESS && linkspec_any(&x->bw[bi]))
        PUT("link_rate_mbps = %s\n", x->bw_s[bi]);
    if (linkspec_any(&x->dl[di]))
        PUT("link_delay_ms = %s\n", x->dl_s[di]);
#undef PUT
    return 0;
}

static int s_load(x_exp_t *x, const char *file, const char *out_dir)
{
    uint8_t *text = NULL;
    size_t len = 0;
    char err[1024];
    char copy[PATH_MAX];
    int rc = 2;
    char *jobtext = NULL;
    job_spec_t *spec = malloc(sizeof *spec);
    if (!spec)
        return 1;
    snprintf(x->file, sizeof x->file, "%s", file);
    snprintf(copy, sizeof copy, "%s", file);
    if (!realpath(dirname(copy), x->dir)) {
        fprintf(stderr, "tah-coord: %s: cannot resolve its directory: %s\n", file, strerror(errno));
        goto out;
    }
    snprintf(copy, sizeof copy, "%s", file);
    snprintf(x->stem, sizeof x->stem, "%s", basename(copy));
    char *dot = strrchr(x->stem, '.');
    if (dot && dot != x->stem)
        *dot = 0;
    if (tah_file_read(file, 1 << 20, &text, &len, err, sizeof err) != 0) {
        fprintf(stderr, "tah-coord: %s\n", err);
        goto out;
    }
    char *ini = realloc(text, len + 1);
    if (!ini)
        goto out;
    text = (uint8_t *)ini;
    ini[len] = 0;
    if (strlen(ini) != len) {
        fprintf(stderr, "tah-coord: %s: contains a NUL byte; not an experiment file\n", file);
        goto out;
    }
    x->shaping = X_INPROCESS;
    x->warmup = 1;
    x->baseline = -1;
    const char *env = getenv("TAH_NETLAB");
    snprintf(x->netlab, sizeof x->netlab, "%s", env && *env ? env : "scripts/netlab");
    int line = ini_parse_string(ini, s_handler, x);
    if (line != 0) {
        if (line < 0)
            fprintf(stderr, "tah-coord: %s: cannot parse (inih error %d)\n", file, line);
        else if (x->msg[0])
            fprintf(stderr, "tah-coord: %s:%d: %s\n", file, line, x->msg);
        else
            fprintf(stderr, "tah-coord: %s:%d: syntax error (expected [job], [sweep] or key = value)\n", file,
                    line);
        goto out;
    }
    jobtext = s_job_lines(ini, &x->seen_sweep);
    if (!jobtext || jobfile_parse(jobtext, file, spec, err, sizeof err) != 0) {
        fprintf(stderr, "tah-coord: %s\n", jobtext ? err : "out of memory");
        goto out;
    }
    if (!x->seen_sweep) {
        fprintf(stderr, "tah-coord: %s: no [sweep] section; HINT: a plain job is run with `tah-coord submit`\n",
                file);
        goto out;
    }
    if (jobfile_check_files(spec, x->dir, err, sizeof err) != 0) {
        fprintf(stderr, "tah-coord: %s: %s\n", file, err);
        goto out;
    }
    /* defaults from the job */
    if (!x->nbw) {
        x->nbw = 1;
        snprintf(x->bw_s[0], 256, "none");
    }
    if (!x->ndl) {
        x->ndl = 1;
        snprintf(x->dl_s[0], 256, "none");
    }
    if (!x->ncodec) {
        x->ncodec = 1;
        snprintf(x->fwd[0], 256, "%s", spec->t.fwd_codec);
        snprintf(x->bwd[0], 256, "%s", spec->t.bwd_codec);
    }
    if (!x->nmb) {
        x->nmb = 1;
        x->mb[0] = spec->t.micro_batches;
    }
    if (!x->steps)
        x->steps = spec->t.steps;
    if (x->shaping == X_NONE) {
        for (int i = 0; i < x->nbw; i++) {
            if (linkspec_any(&x->bw[i])) {
                fprintf(stderr, "tah-coord: %s: shaping = none but bandwidth point '%s' limits links; HINT: "
                                "shaping = netlab or inprocess\n", file, x->bw_s[i]);
                goto out;
            }
        }
    }
    /* baseline: as given, else fp32/fp32 when swept, else the first pair */
    for (int i = 0; i < x->ncodec; i++) {
        char pair[520];
        snprintf(pair, sizeof pair, "%s/%s", x->fwd[i], x->bwd[i]);
        if (x->baseline < 0 && x->baseline_s[0] && !strcmp(pair, x->baseline_s))
            x->baseline = i;
        if (!x->baseline_s[0] && x->baseline < 0 && !strcmp(pair, "fp32/fp32"))
            x->baseline = i;
    }
    if (x->baseline < 0) {
        if (x->baseline_s[0]) {
            fprintf(stderr, "tah-coord: %s: baseline %s is not one of the swept codecs\n", file, x->baseline_s);
            goto out;
        }
        x->baseline = 0;
    }
    if (out_dir)
        snprintf(x->out, sizeof x->out, "%s", out_dir);
    else if (!x->out[0])
        if (snprintf(x->out, sizeof x->out, "%.3800s/%.200s.out", x->dir, x->stem) >= (int)sizeof x->out)
            x->out[0] = 0;
    /* every point's job file, checked before anything runs */
    x->npts = x->ndl * x->nmb * x->nbw * x->ncodec;
    if (x->npts > 1024) {
        fprintf(stderr, "tah-coord: %s: %d points; at most 1024 per experiment\n", file, x->npts);
        goto out;
    }
    x->res = calloc((size_t)x->npts, sizeof *x->res);
    x->ini = calloc((size_t)x->npts, sizeof *x->ini);
    if (!x->res || !x->ini) {
        rc = 1;
        goto out;
    }
    for (int p = 0; p < x->npts; p++) {
        if (s_point_ini(x, p, x->ini[p], sizeof x->ini[p]) != 0 ||
            jobfile_parse(x->ini[p], "point", spec, err, sizeof err) != 0) {
            int di, mi, bi, ci;
            s_point_index(x, p, &di, &mi, &bi, &ci);
            fprintf(stderr, "tah-coord: %s: point %d (%s/%s, bandwidth %s, delay %s, M=%d): %s\n", file, p,
                    x->fwd[ci], x->bwd[ci], x->bw_s[bi], x->dl_s[di], x->mb[mi], err);
            goto out;
        }
        if (x->shaping == X_NETLAB && spec->t.stages > 64) {
            fprintf(stderr, "tah-coord: %s: netlab shaping handles up to 64 stages\n", file);
            goto out;
        }
        if (linkspec_max_stage(&x->bw[0]) >= spec->t.stages) {
            fprintf(stderr, "tah-coord: %s: bandwidth point '%s' names a stage the job does not have (0..%d)\n",
                    file, x->bw_s[0], spec->t.stages - 1);
            goto out;
        }
    }
    for (int i = 0; i < x->nbw; i++) {
        if (linkspec_max_stage(&x->bw[i]) >= spec->t.stages) {
            fprintf(stderr, "tah-coord: %s: bandwidth point '%s' names a stage the job does not have (0..%d)\n",
                    file, x->bw_s[i], spec->t.stages - 1);
            goto out;
        }
    }
    rc = 0;
out:
    free(jobtext);
    free(text);
    free(spec);
    return rc;
}

/* ---- netlab ---- */

/* Map the next job's stages to netlab nodes: the coordinator places stage
 * k on the k-th idle node in joining order (status lists them so), and a
 * node in netlab namespace K advertises netlab's address of K. */
static int s_netlab_map(x_exp_t *x, const coord_client_opts_t *o, int S)
{
    char a0[128] = "";
    const char *argv[] = { x->netlab, "addr", "0", NULL };
    if (s_run(argv, a0, sizeof a0) != 0) {
        fprintf(stderr, "tah-coord: '%s addr 0' failed; HINT: set [sweep] netlab = PATH of scripts/netlab\n",
                x->netlab);
        return TAH_EIO;
    }
    a0[strcspn(a0, "\n")] = 0;
    char *dot = strrchr(a0, '.');
    if (!dot) {
        fprintf(stderr, "tah-coord: netlab addr 0 printed '%s'\n", a0);
        return TAH_EIO;
    }
    int base = atoi(dot + 1);
    dot[1] = 0; /* a0 = "10.77.0." */
    Tah__Envelope *rep = coord_status_get(o, 0);
    if (!rep)
        return TAH_EIO;
    const Tah__StatusRep *r = rep->status_rep;
    int n = 0, rc = 0;
    for (size_t i = 0; i < r->n_nodes && n < S; i++) {
        const Tah__NodeInfo *nd = r->nodes[i];
        if (strcmp(nd->state, "idle") != 0)
            continue;
        const char *h = strncmp(nd->endpoint, "tcp://", 6) ? nd->endpoint : nd->endpoint + 6;
        const char *colon = strrchr(h, ':');
        size_t pl = strlen(a0);
        if (!colon || strncmp(h, a0, pl) != 0 || atoi(h + pl) < base || atoi(h + pl) - base >= 64) {
            fprintf(stderr, "tah-coord: node %s (%s) is not in a netlab namespace; HINT: start nodes with "
                            "`netlab exec K tah-node join --listen $(netlab addr K):0 ...`\n", nd->name, nd->endpoint);
            rc = TAH_EINVAL;
            break;
        }
        snprintf(x->lab_names[n], sizeof x->lab_names[n], "%s", nd->name);
        x->netlab_k[n++] = atoi(h + pl) - base;
    }
    if (!rc && n < S) {
        fprintf(stderr, "tah-coord: %d idle nodes, the job needs %d\n", n, S);
        rc = TAH_EINVAL;
    }
    if (!rc)
        x->nlab = S;
    wire_envelope_free(&rep);
    return rc;
}

static void s_netlab_unshape(const x_exp_t *x)
{
    for (int i = 0; i < x->nlab; i++) {
        char k[16];
        snprintf(k, sizeof k, "%d", x->netlab_k[i]);
        const char *argv[] = { x->netlab, "unshape", k, NULL };
        s_run(argv, NULL, 0);
    }
}

static int s_netlab_apply(const x_exp_t *x, const linkspec_t *bw)
{
    s_netlab_unshape(x);
    for (int i = 0; i < x->nlab; i++) {
        for (int j = 0; j < x->nlab; j++) {
            double rate = i == j ? 0 : linkspec_value(bw, i, j);
            if (rate <= 0)
                continue;
            char ki[16], kj[16], r[32];
            snprintf(ki, sizeof ki, "%d", x->netlab_k[i]);
            snprintf(kj, sizeof kj, "%d", x->netlab_k[j]);
            snprintf(r, sizeof r, "%g", rate);
            const char *argv[] = { x->netlab, "shape", ki, kj, r, NULL };
            if (s_run(argv, NULL, 0) != 0) {
                fprintf(stderr, "tah-coord: '%s shape %s %s %s' failed\n", x->netlab, ki, kj, r);
                return TAH_EIO;
            }
        }
    }
    return 0;
}

/* ---- one point ---- */

static int s_read_metrics(const x_exp_t *x, const char *path, x_res_t *res)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "tah-coord: cannot read metrics %s: %s; HINT: run the experiment where the coordinator's "
                        "state directory is visible\n", path, strerror(errno));
        return TAH_EIO;
    }
    size_t cap = (size_t)x->steps + 1;
    res->loss = calloc(cap, sizeof *res->loss);
    res->time = calloc(cap, sizeof *res->time);
    if (!res->loss || !res->time) {
        fclose(f);
        return TAH_ENOMEM;
    }
    char line[4096];
    double tok = 0, ms = 0, wire = 0, fwd = 0, bwd = 0, fp32 = 0, tok_all = 0, ms_all = 0;
    while (fgets(line, sizeof line, f) && (size_t)res->n < cap) {
        double step, loss, t, tps, m, v;
        if (s_json_num(line, "step", &step) || s_json_num(line, "loss", &loss) || s_json_num(line, "time_s", &t) ||
            s_json_num(line, "tokens_per_s", &tps) || s_json_num(line, "ms", &m))
            continue;
        res->loss[res->n] = loss;
        res->time[res->n] = t;
        res->n++;
        if (!s_json_num(line, "wire_bytes", &v))
            wire += v;
        if (!s_json_num(line, "fwd_bytes", &v))
            fwd += v;
        if (!s_json_num(line, "bwd_bytes", &v))
            bwd += v;
        if (!s_json_num(line, "fp32_bytes", &v))
            fp32 += v;
        tok_all += tps * m / 1e3;
        ms_all += m;
        if (!s_json_num(line, "val_loss", &v)) {
            res->val_loss = v;
            res->have_val = 1;
            continue; /* a validation step: not a throughput sample */
        }
        if (step <= x->warmup)
            continue;
        tok += tps * m / 1e3;
        ms += m;
    }
    fclose(f);
    if (!res->n)
        return TAH_EIO;
    res->tps = ms > 0 ? tok / (ms / 1e3) : ms_all > 0 ? tok_all / (ms_all / 1e3) : 0;
    res->wire = wire / res->n;
    res->fwd = fwd / res->n;
    res->bwd = bwd / res->n;
    res->fp32 = fp32 / res->n;
    int k = res->n < 5 ? res->n : 5;
    double s = 0;
    for (int i = res->n - k; i < res->n; i++)
        s += res->loss[i];
    res->loss_tail = s / k;
    res->wall = res->time[res->n - 1];
    return 0;
}

static int s_run_point(x_exp_t *x, const coord_client_opts_t *o, int p)
{
    int di, mi, bi, ci;
    s_point_index(x, p, &di, &mi, &bi, &ci);
    x_res_t *res = &x->res[p];
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/points/p%d.ini", x->out, p);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(x->ini[p], f);
        fclose(f);
    }
    printf("point %d/%d: %s / %s, bandwidth %s%s, delay %s ms, M=%d, %d steps\n", p + 1, x->npts, x->fwd[ci],
           x->bwd[ci], x->bw_s[bi], linkspec_any(&x->bw[bi]) ? " Mbit/s" : "", x->dl_s[di], x->mb[mi], x->steps);
    fflush(stdout);
    if (x->shaping == X_NETLAB) {
        job_spec_t *spec = malloc(sizeof *spec);
        char err[512];
        int S = spec && jobfile_parse(x->ini[p], "point", spec, err, sizeof err) == 0 ? spec->t.stages : -1;
        free(spec);
        if (S < 1 || s_netlab_map(x, o, S) != 0 || s_netlab_apply(x, &x->bw[bi]) != 0)
            return TAH_EIO;
    }
    char fname[PATH_MAX + 32];
    snprintf(fname, sizeof fname, "%s[p%d]", x->file, p);
    if (coord_submit_ini(o, x->ini[p], x->dir, fname, &res->job) != 0)
        return TAH_EIO;
    double t0 = s_wall(), last_print = t0;
    int checked_nodes = 0, rc = 0;
    for (;;) {
        if (s_stop) {
            coord_client_opts_t q = *o;
            q.json = 0;
            coord_cancel(&q, res->job);
            snprintf(res->state, sizeof res->state, "cancelled");
            return TAH_EIO;
        }
        Tah__Envelope *rep = coord_status_get(o, res->job);
        if (!rep)
            return TAH_EIO;
        const Tah__JobInfo *j = rep->status_rep->n_jobs == 1 ? rep->status_rep->jobs[0] : NULL;
        if (!j) {
            wire_envelope_free(&rep);
            return TAH_EIO;
        }
        snprintf(res->state, sizeof res->state, "%s", j->state);
        if (x->shaping == X_NETLAB && !checked_nodes && j->n_nodes == (size_t)x->nlab) {
            /* the placement must be the one the links were shaped for */
            for (size_t s = 0; s < j->n_nodes; s++) {
                if (strcmp(j->nodes[s], x->lab_names[s]) != 0) {
                    fprintf(stderr, "tah-coord: stage %zu went to node %s, not to %s (netlab node %d) as shaped\n", s,
                            j->nodes[s], x->lab_names[s], x->netlab_k[s]);
                    rc = TAH_EINVAL;
                }
            }
            checked_nodes = 1;
        }
        int running = !strcmp(j->state, "queued") || !strcmp(j->state, "running") || !strcmp(j->state, "paused");
        if (!running) {
            double utils = 0, umax = -1;
            int nu = 0;
            for (size_t k = 0; k < j->n_links; k++) {
                const Tah__LinkInfo *l = j->links[k];
                double rate = linkspec_value(&x->bw[bi], (int)l->src_stage, (int)l->dst_stage);
                if (rate <= 0 || l->seconds <= 0)
                    continue;
                double u = 8.0 * (double)l->bytes / l->seconds / (rate * 1e6);
                utils += u;
                nu++;
                if (u > umax)
                    umax = u;
            }
            res->util_mean = nu ? utils / nu : -1;
            res->util_max = nu ? umax : -1;
            if (strcmp(j->state, "succeeded") != 0) {
                fprintf(stderr, "tah-coord: point %d: job %llu %s: %s\n", p, (unsigned long long)res->job, j->state,
                        j->reason);
                rc = TAH_EIO;
            } else if (s_read_metrics(x, j->metrics_path, res) == 0) {
                res->done = 1;
            } else {
                rc = TAH_EIO;
            }
            wire_envelope_free(&rep);
            break;
        }
        if (s_wall() - last_print > 10.0) {
            printf("  job %llu: step %d/%d", (unsigned long long)res->job, j->step, j->steps);
            if (j->has_loss)
                printf(", loss %.4f, %.0f tokens/s", j->loss, j->tokens_per_s);
            printf("\n");
            fflush(stdout);
            last_print = s_wall();
        }
        wire_envelope_free(&rep);
        if (rc)
            return rc;
        s_sleep_ms(250);
    }
    if (res->done) {
        snprintf(path, sizeof path, "%s/curves/p%d.dat", x->out, p);
        f = fopen(path, "w");
        if (f) {
            fprintf(f, "# step loss time_s   (%s / %s, bandwidth %s, delay %s, M=%d)\n", x->fwd[ci], x->bwd[ci],
                    x->bw_s[bi], x->dl_s[di], x->mb[mi]);
            for (int i = 0; i < res->n; i++)
                fprintf(f, "%d %.6f %.4f\n", i + 1, res->loss[i], res->time[i]);
            fclose(f);
        }
        printf("  -> %.0f tokens/s, loss %.4f, %.3f MB/step on the wire (fwd+bwd %.3f MB)", res->tps,
               res->loss_tail, res->wire / 1e6, (res->fwd + res->bwd) / 1e6);
        if (res->util_mean >= 0)
            printf(", link utilisation %.0f %% (max %.0f %%)", 100 * res->util_mean, 100 * res->util_max);
        printf(", %.0f s\n", s_wall() - t0);
        fflush(stdout);
    }
    return rc;
}

/* ---- outputs ---- */

static const char *s_delay_mech(const x_exp_t *x, int di)
{
    (void)x;
    if (!linkspec_any(&x->dl[di]))
        return "none";
    return linkspec_netem_available() ? "in-process (netem not used)" : "in-process (no netem)";
}

/* Largest and tail-mean relative gap of point p's loss curve to the
 * baseline's at the same steps (tail: last 10 %, at least 5 steps). */
static int s_loss_gap(const x_exp_t *x, int p, double *gmax, double *gtail)
{
    int di, mi, bi, ci;
    s_point_index(x, p, &di, &mi, &bi, &ci);
    const x_res_t *a = &x->res[p], *b = NULL;
    for (int bj = 0; bj < x->nbw && !b; bj++) { /* any bandwidth: the computation does not depend on it */
        const x_res_t *c = &x->res[s_pt(x, di, mi, bj, x->baseline)];
        if (c->done)
            b = c;
    }
    if (!a->done || !b)
        return -1;
    int n = a->n < b->n ? a->n : b->n;
    int tail = n / 10 > 5 ? n / 10 : (n < 5 ? n : 5);
    double mx = 0, sa = 0, sb = 0;
    for (int i = 0; i < n; i++) {
        double g = fabs(a->loss[i] - b->loss[i]) / fabs(b->loss[i]);
        if (g > mx)
            mx = g;
        if (i >= n - tail) {
            sa += a->loss[i];
            sb += b->loss[i];
        }
    }
    *gmax = mx;
    *gtail = fabs(sa - sb) / fabs(sb);
    return 0;
}

static double s_share_unthrottled(const x_exp_t *x, int p)
{
    int di, mi, bi, ci;
    s_point_index(x, p, &di, &mi, &bi, &ci);
    for (int bj = 0; bj < x->nbw; bj++) {
        const x_res_t *c = &x->res[s_pt(x, di, mi, bj, ci)];
        if (!linkspec_any(&x->bw[bj]) && c->done && c->tps > 0)
            return x->res[p].tps / c->tps;
    }
    return -1;
}

static double s_speedup(const x_exp_t *x, int p)
{
    int di, mi, bi, ci;
    s_point_index(x, p, &di, &mi, &bi, &ci);
    const x_res_t *b = &x->res[s_pt(x, di, mi, bi, x->baseline)];
    return b->done && b->tps > 0 && x->res[p].done ? x->res[p].tps / b->tps : -1;
}

static double s_bytes_ratio(const x_exp_t *x, int p)
{
    int di, mi, bi, ci;
    s_point_index(x, p, &di, &mi, &bi, &ci);
    const x_res_t *b = &x->res[s_pt(x, di, mi, bi, x->baseline)], *a = &x->res[p];
    return a->done && b->done && a->fwd + a->bwd > 0 ? (b->fwd + b->bwd) / (a->fwd + a->bwd) : -1;
}

static void s_write_csv(const x_exp_t *x)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/results.csv", x->out);
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "point,job,state,fwd_codec,bwd_codec,bandwidth_mbps,delay_ms,micro_batches,steps,shaping,"
               "delay_mechanism,tokens_per_s,speedup_vs_baseline,share_of_unthrottled,loss_final,val_loss,"
               "loss_gap_tail,loss_gap_max,wire_bytes_per_step,fwd_bytes_per_step,bwd_bytes_per_step,"
               "fp32_bytes_per_step,bytes_ratio_vs_baseline,link_util_mean,link_util_max,time_s\n");
    for (int p = 0; p < x->npts; p++) {
        const x_res_t *r = &x->res[p];
        if (!r->job)
            continue;
        int di, mi, bi, ci;
        s_point_index(x, p, &di, &mi, &bi, &ci);
        double gmax = -1, gtail = -1;
        s_loss_gap(x, p, &gmax, &gtail);
        fprintf(f, "%d,%llu,%s,\"%s\",\"%s\",\"%s\",\"%s\",%d,%d,%s,%s,%.1f,%.4f,%.4f,%.6f,%.6f,%.5f,%.5f,%.0f,%.0f,"
                   "%.0f,%.0f,%.4f,%.4f,%.4f,%.2f\n",
                p, (unsigned long long)r->job, r->state, x->fwd[ci], x->bwd[ci], x->bw_s[bi], x->dl_s[di], x->mb[mi],
                x->steps, s_shaping_name[x->shaping], s_delay_mech(x, di), r->tps, s_speedup(x, p),
                s_share_unthrottled(x, p), r->loss_tail, r->have_val ? r->val_loss : NAN, gtail, gmax, r->wire, r->fwd, r->bwd, r->fp32,
                s_bytes_ratio(x, p), r->util_mean, r->util_max, r->wall);
    }
    fclose(f);
}

static void s_bw_label(const x_exp_t *x, int bi, char *buf, size_t n)
{
    if (!linkspec_any(&x->bw[bi]))
        snprintf(buf, n, "unthrottled");
    else
        snprintf(buf, n, "%s Mbit/s", x->bw_s[bi]);
}

static void s_write_table(const x_exp_t *x)
{
    char path[PATH_MAX + 32], lab[300];
    snprintf(path, sizeof path, "%s/table.md", x->out);
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "# %s: tokens/s (speedup vs %s/%s)\n\n", x->stem, x->fwd[x->baseline], x->bwd[x->baseline]);
    fprintf(f, "shaping: %s; %d steps per point; tokens/s leaves out the first %d step(s) and validation steps\n",
            s_shaping_name[x->shaping], x->steps, x->warmup);
    for (int di = 0; di < x->ndl; di++) {
        for (int mi = 0; mi < x->nmb; mi++) {
            fprintf(f, "\n## delay %s ms (%s), %d micro-batches\n\n| codec (fwd / bwd) |", x->dl_s[di],
                    s_delay_mech(x, di), x->mb[mi]);
            for (int bi = 0; bi < x->nbw; bi++) {
                s_bw_label(x, bi, lab, sizeof lab);
                fprintf(f, " %s |", lab);
            }
            fprintf(f, "\n|---|");
            for (int bi = 0; bi < x->nbw; bi++)
                fprintf(f, "---:|");
            fprintf(f, "\n");
            int have_none = 0;
            for (int bi = 0; bi < x->nbw; bi++)
                have_none |= !linkspec_any(&x->bw[bi]);
            for (int ci = 0; ci < x->ncodec; ci++) {
                fprintf(f, "| %s / %s |", x->fwd[ci], x->bwd[ci]);
                for (int bi = 0; bi < x->nbw; bi++) {
                    int p = s_pt(x, di, mi, bi, ci);
                    if (x->res[p].done)
                        fprintf(f, " %.0f (%.2f×) |", x->res[p].tps, s_speedup(x, p));
                    else
                        fprintf(f, " %s |", x->res[p].job ? x->res[p].state : "–");
                }
                fprintf(f, "\n");
            }
            if (have_none) {
                fprintf(f, "\nShare of the unthrottled throughput of the same codecs:\n\n| codec (fwd / bwd) |");
                for (int bi = 0; bi < x->nbw; bi++) {
                    s_bw_label(x, bi, lab, sizeof lab);
                    fprintf(f, " %s |", lab);
                }
                fprintf(f, "\n|---|");
                for (int bi = 0; bi < x->nbw; bi++)
                    fprintf(f, "---:|");
                fprintf(f, "\n");
                for (int ci = 0; ci < x->ncodec; ci++) {
                    fprintf(f, "| %s / %s |", x->fwd[ci], x->bwd[ci]);
                    for (int bi = 0; bi < x->nbw; bi++) {
                        double s = s_share_unthrottled(x, s_pt(x, di, mi, bi, ci));
                        if (s >= 0)
                            fprintf(f, " %.0f %% |", 100 * s);
                        else
                            fprintf(f, " – |");
                    }
                    fprintf(f, "\n");
                }
            }
            fprintf(f, "\n| codec (fwd / bwd) | MB/step fwd+bwd | bytes ratio | loss (last 5) | val loss | "
                       "loss gap vs baseline (tail / max) |\n|---|---:|---:|---:|---:|---:|\n");
            for (int ci = 0; ci < x->ncodec; ci++) {
                int p = -1;
                for (int bi = 0; bi < x->nbw && p < 0; bi++)
                    if (x->res[s_pt(x, di, mi, bi, ci)].done)
                        p = s_pt(x, di, mi, bi, ci);
                if (p < 0)
                    continue;
                const x_res_t *r = &x->res[p];
                double gmax = -1, gtail = -1;
                s_loss_gap(x, p, &gmax, &gtail);
                char val[32] = "–";
                if (r->have_val)
                    snprintf(val, sizeof val, "%.4f", r->val_loss);
                fprintf(f, "| %s / %s | %.3f | %.2f× | %.4f | %s | %.2f %% / %.2f %% |\n", x->fwd[ci], x->bwd[ci],
                        (r->fwd + r->bwd) / 1e6, s_bytes_ratio(x, p), r->loss_tail, val, 100 * gtail, 100 * gmax);
            }
        }
    }
    fclose(f);
}

static void s_gp_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++)
        if (*s != '"' && *s != '\\')
            fputc(*s, f);
    fputc('"', f);
}

/* throughput.png (first delay and M) and loss.png (loss vs wall-clock,
 * one panel per bandwidth). */
static void s_plots(const x_exp_t *x)
{
    char path[PATH_MAX + 32], lab[300];
    snprintf(path, sizeof path, "%s/throughput.dat", x->out);
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "bandwidth");
    for (int ci = 0; ci < x->ncodec; ci++) {
        char pair[600];
        snprintf(pair, sizeof pair, "%s / %s", x->fwd[ci], x->bwd[ci]);
        fputc(' ', f);
        s_gp_str(f, pair);
    }
    fputc('\n', f);
    for (int bi = 0; bi < x->nbw; bi++) {
        s_bw_label(x, bi, lab, sizeof lab);
        s_gp_str(f, lab);
        for (int ci = 0; ci < x->ncodec; ci++) {
            const x_res_t *r = &x->res[s_pt(x, 0, 0, bi, ci)];
            if (r->done)
                fprintf(f, " %.1f", r->tps);
            else
                fprintf(f, " NaN");
        }
        fputc('\n', f);
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/plots.gp", x->out);
    f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "set terminal pngcairo size 1000,600 font \",10\"\nset output \"%s/throughput.png\"\n", x->out);
    fprintf(f, "set title \"%s: throughput vs link bandwidth (delay %s ms, M=%d)\"\n", x->stem, x->dl_s[0], x->mb[0]);
    fprintf(f, "set grid\nset key top left\nset ylabel \"tokens/s\"\nset xlabel \"bandwidth per link\"\n"
               "set logscale y\nset datafile missing \"NaN\"\n");
    fprintf(f, "plot for [i=2:%d] \"%s/throughput.dat\" using 0:i:xtic(1) with linespoints lw 2 pt 7 "
               "title columnheader(i)\n", x->ncodec + 1, x->out);
    int panels = x->nbw < 6 ? x->nbw : 6;
    fprintf(f, "set terminal pngcairo size %d,450 font \",10\"\nset output \"%s/loss.png\"\nunset logscale\n",
            panels * 420 + 100, x->out);
    fprintf(f, "set multiplot layout 1,%d title \"%s: training loss vs wall-clock time per codec\"\n", panels,
            x->stem);
    fprintf(f, "set key top right\nset xlabel \"wall-clock time (s)\"\nset ylabel \"loss\"\n");
    for (int bi = 0; bi < panels; bi++) {
        s_bw_label(x, bi, lab, sizeof lab);
        fprintf(f, "set title ");
        s_gp_str(f, lab);
        fprintf(f, "\nplot");
        int first = 1;
        for (int ci = 0; ci < x->ncodec; ci++) {
            int p = s_pt(x, 0, 0, bi, ci);
            if (!x->res[p].done)
                continue;
            char pair[600];
            snprintf(pair, sizeof pair, "%s / %s", x->fwd[ci], x->bwd[ci]);
            fprintf(f, "%s \"%s/curves/p%d.dat\" using 3:2 with lines lw 1.5 title ", first ? "" : ",", x->out, p);
            s_gp_str(f, pair);
            first = 0;
        }
        if (first)
            fprintf(f, " NaN notitle");
        fprintf(f, "\n");
    }
    fprintf(f, "unset multiplot\n");
    fclose(f);
    const char *argv[] = { "gnuplot", path, NULL };
    int rc = s_run(argv, NULL, 0);
    if (rc == 127)
        fprintf(stderr, "tah-coord: gnuplot not found; plots skipped (script: %s)\n", path);
    else if (rc != 0)
        fprintf(stderr, "tah-coord: gnuplot failed (exit %d) on %s\n", rc, path);
}

static int s_mkdir(const char *path)
{
    return mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

int coord_experiment(const coord_client_opts_t *o, const char *file, const char *out_dir)
{
    x_exp_t *x = calloc(1, sizeof *x);
    if (!x)
        return 1;
    int rc = s_load(x, file, out_dir);
    if (rc)
        goto out;
    char sub[PATH_MAX + 16];
    int mk = s_mkdir(x->out);
    snprintf(sub, sizeof sub, "%s/points", x->out);
    mk |= s_mkdir(sub);
    snprintf(sub, sizeof sub, "%s/curves", x->out);
    mk |= s_mkdir(sub);
    if (mk) {
        fprintf(stderr, "tah-coord: cannot create %s: %s\n", x->out, strerror(errno));
        rc = 1;
        goto out;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    printf("experiment %s: %d points (%d delays x %d micro-batch sizes x %d bandwidths x %d codec pairs), "
           "shaping %s, output %s\n",
           x->stem, x->npts, x->ndl, x->nmb, x->nbw, x->ncodec, s_shaping_name[x->shaping], x->out);
    for (int di = 0; di < x->ndl; di++)
        if (linkspec_any(&x->dl[di]))
            printf("delay %s ms: %s\n", x->dl_s[di], s_delay_mech(x, di));
    fflush(stdout);
    int failed = 0;
    for (int p = 0; p < x->npts && !s_stop; p++) {
        if (s_run_point(x, o, p) != 0)
            failed++;
        s_write_csv(x);
        s_write_table(x);
    }
    if (x->shaping == X_NETLAB)
        s_netlab_unshape(x);
    s_plots(x);
    printf("results: %s/results.csv, %s/table.md, %s/throughput.png, %s/loss.png\n", x->out, x->out, x->out, x->out);
    if (s_stop)
        fprintf(stderr, "tah-coord: interrupted; results of the finished points kept\n");
    if (failed)
        fprintf(stderr, "tah-coord: %d of %d points failed\n", failed, x->npts);
    rc = failed || s_stop ? 1 : 0;
out:
    for (int p = 0; x->res && p < x->npts; p++) {
        free(x->res[p].loss);
        free(x->res[p].time);
    }
    free(x->res);
    free(x->ini);
    free(x);
    return rc;
}
