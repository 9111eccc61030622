/* main.c — tah-coord: the coordinator daemon and its command line.
 *
 *   tah-coord serve  --listen HOST:PORT --state DIR [--node-timeout SEC] [--open] [-v]
 *   tah-coord keygen --state DIR
 *   tah-coord token create --coordinator HOST:PORT --job JOB --expires DURATION
 *   tah-coord submit --coordinator HOST:PORT JOB.ini
 *   tah-coord status --coordinator HOST:PORT [JOB] [--json]
 *   tah-coord cancel --coordinator HOST:PORT JOB
 *   tah-coord wait   --coordinator HOST:PORT JOB
 *   tah-coord experiment --coordinator HOST:PORT EXPERIMENT.ini [--out DIR]
 * Client commands of a secure coordinator also take
 *   --coordinator-key FILE|Z85 --key FILE
 *
 * Exit status: 0 ok, 1 runtime error (or, for wait, a job that did not
 * succeed), 2 usage. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h" /* coord_submit, coord_status, coord_cancel, coord_wait */
#include "experiment.h" /* coord_experiment */
#include "log.h"
#include "server.h" /* coord_serve, coord_keygen */
#include "token.h"  /* token_parse_duration */

static const char *s_usage =
    "usage: tah-coord serve  --listen HOST:PORT --state DIR [--node-timeout SEC] [--open] [-v]\n"
    "       tah-coord keygen --state DIR\n"
    "       tah-coord token create --coordinator HOST:PORT --job JOB --expires DURATION\n"
    "       tah-coord submit --coordinator HOST:PORT JOB.ini\n"
    "       tah-coord status --coordinator HOST:PORT [JOB] [--json]\n"
    "       tah-coord cancel --coordinator HOST:PORT JOB\n"
    "       tah-coord wait   --coordinator HOST:PORT JOB\n"
    "       tah-coord experiment --coordinator HOST:PORT EXPERIMENT.ini [--out DIR]\n"
    "\n"
    "  serve          run the coordinator; state (jobs, nodes, metrics) in DIR/coord.db,\n"
    "                 the bound endpoint in DIR/endpoint (PORT 0 picks a free port)\n"
    "  --node-timeout a node silent this long (10 s) is lost; its job fails\n"
    "  --open         no CURVE, no tokens: plaintext, any node admitted (trusted networks,\n"
    "                 local demos); without it the coordinator is secure (docs/runtime.md#security)\n"
    "  keygen         create what is missing of DIR/coord.{key,pub} (coordinator CURVE pair),\n"
    "                 DIR/admin.{key,pub} (the key client commands use) and DIR/token.secret;\n"
    "                 secrets mode 0600. `serve` does the same on its first start\n"
    "  token create   print a join token admitting one node key to JOB, valid for DURATION\n"
    "                 (90, 90s, 30m, 12h, 7d); give it to `tah-node join --token`\n"
    "  submit         validate JOB.ini (a [job] section of tah-train options with\n"
    "                 underscores) and queue it; prints the job id\n"
    "  status         jobs (state, step, loss, tokens/s, links) and nodes; --json for scripts\n"
    "  cancel         stop a queued or running job\n"
    "  wait           block until the job ends; exit 0 when it succeeded; prints the\n"
    "                 path of its metrics.jsonl\n"
    "  experiment     run a [job] over a [sweep] of link bandwidths, delays, codec pairs and\n"
    "                 micro-batch sizes (links shaped by scripts/netlab or in-process);\n"
    "                 writes results.csv, table.md, throughput.png, loss.png to --out DIR\n"
    "                 (default EXPERIMENT.out); see docs/netlab.md\n"
    "  --timeout MS   how long a command waits for the coordinator's answer (10000)\n"
    "  --coordinator-key FILE|Z85  a secure coordinator's public key (DIR/coord.pub)\n"
    "  --key FILE     with --coordinator-key: the admin secret key (DIR/admin.key)\n";

static int s_usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "tah-coord: %s%s%s\n%s", what, arg ? " " : "", arg ? arg : "", s_usage);
    return 2;
}

static int s_parse_job(const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v == 0 || s[0] == '-')
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return s_usage_error("missing command", NULL);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        fputs(s_usage, stdout);
        return 0;
    }
    const char *listen = NULL, *state = NULL, *coordinator = NULL, *positional = NULL, *out_dir = NULL;
    const char *coord_key = NULL, *key = NULL, *expires = NULL;
    double node_timeout = 10.0;
    int json = 0, timeout_ms = 10000, open_mode = 0;
    uint64_t token_job = 0;
    int first = 2;
    if (!strcmp(cmd, "token")) {
        if (argc < 3 || strcmp(argv[2], "create") != 0)
            return s_usage_error("token: the subcommand is `create`", NULL);
        first = 3;
    }
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(s_usage, stdout);
            return 0;
        }
        if (!strcmp(a, "-v")) {
            tah_log_verbose();
            continue;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--open") && !strcmp(cmd, "serve")) {
            open_mode = 1;
            continue;
        }
        if (!strncmp(a, "--", 2)) {
            if (i + 1 >= argc)
                return s_usage_error("option needs a value:", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--listen"))
                listen = v;
            else if (!strcmp(a, "--state"))
                state = v;
            else if (!strcmp(a, "--coordinator"))
                coordinator = v;
            else if (!strcmp(a, "--out") && !strcmp(cmd, "experiment"))
                out_dir = v;
            else if (!strcmp(a, "--coordinator-key"))
                coord_key = v;
            else if (!strcmp(a, "--key"))
                key = v;
            else if (!strcmp(a, "--job") && !strcmp(cmd, "token")) {
                if (s_parse_job(v, &token_job) != 0)
                    return s_usage_error("--job wants a job id (a positive integer), got", v);
            } else if (!strcmp(a, "--expires") && !strcmp(cmd, "token"))
                expires = v;
            else if (!strcmp(a, "--node-timeout")) {
                char *end = NULL;
                node_timeout = strtod(v, &end);
                if (*end || end == v || !isfinite(node_timeout) || node_timeout < 0.2 || node_timeout > 86400)
                    return s_usage_error("--node-timeout wants seconds in 0.2..86400, got", v);
            } else if (!strcmp(a, "--timeout")) {
                char *end = NULL;
                long t = strtol(v, &end, 10);
                if (*end || end == v || t < 1 || t > 3600000)
                    return s_usage_error("--timeout wants milliseconds in 1..3600000, got", v);
                timeout_ms = (int)t;
            } else
                return s_usage_error("unknown option", a);
            continue;
        }
        if (positional)
            return s_usage_error("unexpected argument", a);
        positional = a;
    }
    if (!strcmp(cmd, "serve")) {
        if (!listen || !state || positional)
            return s_usage_error("serve needs --listen HOST:PORT and --state DIR", NULL);
        tah_log_init("tah-coord", NULL);
        coord_serve_opts_t o = { .listen = listen, .state_dir = state, .node_timeout = node_timeout,
                                 .open = open_mode };
        return coord_serve(&o);
    }
    if (!strcmp(cmd, "keygen")) {
        if (!state || positional)
            return s_usage_error("keygen needs --state DIR", NULL);
        tah_log_init("tah-coord", NULL);
        char err[1024];
        if (coord_keygen(state, err, sizeof err) != 0) {
            fprintf(stderr, "tah-coord: %s\n", err);
            return 1;
        }
        printf("%s/coord.pub\n", state);
        return 0;
    }
    if (strcmp(cmd, "submit") && strcmp(cmd, "status") && strcmp(cmd, "cancel") && strcmp(cmd, "wait") &&
        strcmp(cmd, "experiment") && strcmp(cmd, "token"))
        return s_usage_error("unknown command", cmd);
    if (!coordinator)
        return s_usage_error(cmd, "needs --coordinator HOST:PORT");
    coord_client_opts_t o = { .coordinator = coordinator, .coordinator_key = coord_key, .key = key,
                              .timeout_ms = timeout_ms, .json = json };
    if (!strcmp(cmd, "token")) {
        if (!token_job || !expires || positional)
            return s_usage_error("token create needs --job JOB --expires DURATION", NULL);
        int64_t secs = token_parse_duration(expires);
        if (secs <= 0)
            return s_usage_error("--expires wants a duration like 90s, 30m, 12h, 7d (up to 10 years), got", expires);
        return coord_token_create(&o, token_job, secs);
    }
    if (!strcmp(cmd, "experiment")) {
        if (!positional)
            return s_usage_error("experiment needs an experiment file", NULL);
        return coord_experiment(&o, positional, out_dir);
    }
    if (!strcmp(cmd, "submit")) {
        if (!positional)
            return s_usage_error("submit needs a job file", NULL);
        return coord_submit(&o, positional);
    }
    uint64_t job = 0;
    if (positional && s_parse_job(positional, &job) != 0)
        return s_usage_error("JOB must be a job id (a positive integer), got", positional);
    if (!strcmp(cmd, "status"))
        return coord_status(&o, job);
    if (!job)
        return s_usage_error(cmd, "needs a job id");
    if (!strcmp(cmd, "cancel"))
        return coord_cancel(&o, job);
    return coord_wait(&o, job);
}
