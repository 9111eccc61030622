/* main.c — tah-node: a volunteer node.
 *
 *   tah-node join --coordinator HOST:PORT [--name N] [--listen HOST:PORT]
 *                 [--advertise HOST[:PORT]] [--threads N] [--device cpu|cuda:K|cuda:K,L,...] [-v]
 *                 [--pid-file FILE] [--tp N] [--coord-timeout SEC] [--stop-timeout SEC]
 *                 [--coordinator-key FILE|Z85 [--key FILE] [--token T]]
 *   tah-node leave --pid-file FILE [--timeout SEC]
 *   tah-node keygen [--out DIR]
 *
 * Announces itself, runs the stages it is assigned (node.h), and goes back
 * to idle after each job, until SIGINT/SIGTERM. A signal while it runs a
 * stage is a graceful leave: the step in flight finishes, every stage of
 * the job checkpoints, the coordinator moves the stage, then the node
 * exits (a second signal stops at once). `leave` sends that signal to the
 * node of a pid file and waits for it to exit. Exit status: 0 after a
 * signal, 1 runtime error (cannot bind, refused by the coordinator, a stage
 * stuck past --stop-timeout), 2 usage. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h> /* execv, getpid */

#include "fileio.h" /* tah_file_read, tah_file_write_atomic */
#include "keys.h"   /* keys_new, keys_write */
#include "log.h"
#include "node.h"
#include "trainopts.h" /* trainopts_parse_device: the one device-option parser */
#ifdef TAH_HAVE_CUDA_STAGE
#include "cu_stage.h" /* cu_stage_register, cu_stage_device_count, cu_stage_bench */
#endif

static const char *s_usage =
    "usage: tah-node join --coordinator HOST:PORT [--name N] [--listen HOST:PORT]\n"
    "                     [--advertise HOST[:PORT]] [--threads N] [--device cpu|cuda:K|cuda:K,L,...] [-v]\n"
    "                     [--pid-file FILE] [--tp N] [--coordinator-key FILE|Z85 [--key FILE] [--token T]]\n"
    "       tah-node leave --pid-file FILE [--timeout SEC]\n"
    "       tah-node keygen [--out DIR]\n"
    "\n"
    "  leave           make the node of FILE leave gracefully (SIGTERM): it finishes the step,\n"
    "                  its job checkpoints and moves the stage to another node, then it exits;\n"
    "                  waits up to SEC (600) for that\n"
    "  keygen          write a CURVE key pair: DIR/node.key (secret, mode 0600) and\n"
    "                  DIR/node.pub (default DIR: $HOME/.tah)\n"
    "  --coordinator   where `tah-coord serve` listens\n"
    "  --name N        unique node name (default: HOSTNAME-PID)\n"
    "  --listen H:P    data-plane endpoint neighbours connect to (127.0.0.1:0 = a free port)\n"
    "  --advertise H[:P]  host (and port, e.g. behind a port forward) others use to reach\n"
    "                  --listen (default: the --listen host and the bound port)\n"
    "  --pid-file FILE write this process's id to FILE (removed at exit), for `leave`\n"
    "  --tp N          split each stage it runs over N tensor-parallel ranks (CPU worker threads, or\n"
    "                  GPUs with --device; 1..8, must divide the model's heads; default: the job's tp);\n"
    "                  the job's tp_codec compresses the all-reduces. Neighbours see no difference\n"
    "  --threads N     compute threads of the stage (default 1; the job's `threads` if 0)\n"
    "  --device D      cpu (default) or cuda:K: run the assigned stage on GPU K (job option precision =\n"
    "                  fp32|bf16); with tp N on GPUs K..K+N-1, or on a list cuda:K,L,... of N GPUs (--tp N)\n"
    "  --coord-timeout SEC  coordinator silence that stops the current job (30)\n"
    "  --stop-timeout SEC   a stage that has not stopped SEC s after a stop request (and three times its\n"
    "                  slowest step) is stuck, e.g. in a GPU call that never returns: the node tells the\n"
    "                  coordinator, which moves the stage, and exits with status 1 (120; 0: wait forever)\n"
    "  --coordinator-key K  the secure coordinator's public key (its STATE_DIR/coord.pub, or\n"
    "                  the 40 Z85 characters); without it the link is plaintext (`serve --open`)\n"
    "  --key FILE      this node's secret key (tah-node keygen; default: a one-off key)\n"
    "  --token T       join token (`tah-coord token create`); needed until the node's key is on\n"
    "                  a job's allowlist\n"
    "  -v              debug logging\n";

static int s_usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "tah-node: %s%s%s\n%s", what, arg ? " " : "", arg ? arg : "", s_usage);
    return 2;
}

/* Exited, but not yet reaped by its parent. */
static int s_zombie(long pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return p && p[1] == ' ' && p[2] == 'Z';
}

/* tah-node leave --pid-file FILE [--timeout SEC] */
static int s_leave(int argc, char **argv)
{
    const char *pidfile = NULL;
    double timeout = 600.0;
    for (int i = 2; i < argc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(s_usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--pid-file") && i + 1 < argc) {
            pidfile = argv[++i];
        } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
            timeout = strtod(argv[++i], &end);
            if (*end || end == argv[i] || !isfinite(timeout) || timeout <= 0)
                return s_usage_error("leave: --timeout wants seconds > 0, got", argv[i]);
        } else {
            return s_usage_error("leave: unknown argument", argv[i]);
        }
    }
    if (!pidfile)
        return s_usage_error("leave: --pid-file FILE is required (the one given to `join`)", NULL);
    uint8_t *buf = NULL;
    size_t len = 0;
    char err[1024], text[32] = "";
    if (tah_file_read(pidfile, 31, &buf, &len, err, sizeof err) != 0) {
        fprintf(stderr, "tah-node: leave: %s\n", err);
        return 1;
    }
    memcpy(text, buf, len);
    free(buf);
    char *end = NULL;
    long pid = strtol(text, &end, 10);
    if (end == text || (*end && *end != '\n') || pid <= 1) {
        fprintf(stderr, "tah-node: leave: %s does not hold a process id\n", pidfile);
        return 1;
    }
    /* the pid must still be a tah-node (pids are reused) */
    char path[64], cmd[256] = "";
    snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(cmd, 1, sizeof cmd - 1, f) : 0;
    if (f)
        fclose(f);
    cmd[n] = 0;
    if (!f || !strstr(cmd, "tah-node")) {
        fprintf(stderr, "tah-node: leave: process %ld (from %s) is not a running tah-node\n", pid, pidfile);
        return 1;
    }
    if (kill((pid_t)pid, SIGTERM) != 0) {
        fprintf(stderr, "tah-node: leave: cannot signal process %ld: %s\n", pid, strerror(errno));
        return 1;
    }
    printf("node %ld: leaving (finishing its step, handing its stage over)\n", pid);
    fflush(stdout);
    struct timespec t0, now, pause = { 0, 100 * 1000000L };
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if ((kill((pid_t)pid, 0) != 0 && errno == ESRCH) || s_zombie(pid)) {
            printf("node %ld: left\n", pid);
            return 0;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec) > timeout) {
            fprintf(stderr, "tah-node: leave: node %ld still runs after %.0f s; HINT: its log says why; "
                            "a second `leave` (or SIGTERM) stops it at once\n",
                    pid, timeout);
            return 1;
        }
        nanosleep(&pause, NULL);
    }
}

static int s_keygen(int argc, char **argv)
{
    char dir[1024];
    const char *home = getenv("HOME");
    snprintf(dir, sizeof dir, "%s/.tah", home && home[0] ? home : ".");
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            snprintf(dir, sizeof dir, "%s", argv[++i]);
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(s_usage, stdout);
            return 0;
        } else
            return s_usage_error("keygen: unknown argument", argv[i]);
    }
    keys_pair_t kp;
    char err[1024];
    if (keys_new(&kp, err, sizeof err) != 0 || keys_write(dir, "node", &kp, err, sizeof err) != 0) {
        fprintf(stderr, "tah-node: keygen: %s\n", err);
        return 1;
    }
    printf("%s/node.key\n%s/node.pub %s\n", dir, dir, kp.pub);
    return 0;
}

/* See pipeline/train_main.c: OpenBLAS must not start its own thread pool
 * next to our OpenMP threads; the variable must be set before it loads. */
static void s_single_thread_blas(char **argv)
{
    if (getenv("OPENBLAS_NUM_THREADS"))
        return;
    if (setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0)
        return;
    execv("/proc/self/exe", argv);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        fputs(s_usage, stdout);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "keygen"))
        return s_keygen(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "leave"))
        return s_leave(argc, argv);
    if (argc < 2 || strcmp(argv[1], "join") != 0)
        return s_usage_error("the command is `join`, `leave` or `keygen`", NULL);
    s_single_thread_blas(argv);
    node_opts_t o = { .listen = "127.0.0.1:0", .threads = 1, .coord_timeout = 30.0, .stop_timeout = 120.0 };
    const char *device = "cpu", *pidfile = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(s_usage, stdout);
            return 0;
        }
        if (!strcmp(a, "-v")) {
            tah_log_verbose();
            continue;
        }
        if (strncmp(a, "--", 2) != 0)
            return s_usage_error("unexpected argument", a);
        if (i + 1 >= argc)
            return s_usage_error("option needs a value:", a);
        const char *v = argv[++i];
        char *end = NULL;
        if (!strcmp(a, "--coordinator"))
            o.coordinator = v;
        else if (!strcmp(a, "--name"))
            o.name = v;
        else if (!strcmp(a, "--listen"))
            o.listen = v;
        else if (!strcmp(a, "--advertise"))
            o.advertise = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--coordinator-key"))
            o.coordinator_key = v;
        else if (!strcmp(a, "--key"))
            o.key_file = v;
        else if (!strcmp(a, "--token"))
            o.token = v;
        else if (!strcmp(a, "--pid-file"))
            pidfile = v;
        else if (!strcmp(a, "--threads")) {
            long t = strtol(v, &end, 10);
            if (*end || end == v || t < 0 || t > 1024)
                return s_usage_error("--threads wants 0..1024, got", v);
            o.threads = (int)t;
        } else if (!strcmp(a, "--tp")) {
            long t = strtol(v, &end, 10);
            if (*end || end == v || t < 1 || t > 8)
                return s_usage_error("--tp wants 1..8, got", v);
            o.tp = (int)t;
        } else if (!strcmp(a, "--coord-timeout")) {
            o.coord_timeout = strtod(v, &end);
            if (*end || end == v || !isfinite(o.coord_timeout) || o.coord_timeout < 1)
                return s_usage_error("--coord-timeout wants seconds >= 1, got", v);
        } else if (!strcmp(a, "--stop-timeout")) {
            o.stop_timeout = strtod(v, &end);
            if (*end || end == v || !isfinite(o.stop_timeout) || o.stop_timeout < 0 || o.stop_timeout > 1e7)
                return s_usage_error("--stop-timeout wants seconds, 0..1e7, got", v);
        } else
            return s_usage_error("unknown option", a);
    }
    if (!o.coordinator)
        return s_usage_error("--coordinator HOST:PORT is required", NULL);
    if ((o.key_file || o.token) && !o.coordinator_key)
        return s_usage_error("--key and --token need --coordinator-key (a secure coordinator's public key)", NULL);
    if (o.name && (strlen(o.name) == 0 || strlen(o.name) > 63))
        return s_usage_error("--name must be 1..63 characters, got", o.name);
    if (o.advertise) {
        const char *colon = strchr(o.advertise, ':');
        long port = colon ? strtol(colon + 1, NULL, 10) : 1;
        if (!o.advertise[0] || colon == o.advertise || strlen(o.advertise) > 200 || port < 1 || port > 65535 ||
            (colon && strspn(colon + 1, "0123456789") != strlen(colon + 1)))
            return s_usage_error("--advertise wants HOST or HOST:PORT (1..65535), got", o.advertise);
    }
    tah_log_init("tah-node", o.name);
    if (strcmp(device, "cpu") != 0) {
        int k = -1;
        char why[160];
        if (trainopts_parse_device(device, &k, &o.ndevices, o.devices, why, sizeof why) != 0) {
            char what[200];
            snprintf(what, sizeof what, "--device %s, got", why);
            return s_usage_error(what, device);
        }
        if (o.ndevices > 0 && o.tp != o.ndevices)
            return s_usage_error("--device with a list of GPUs needs --tp equal to its length (one GPU per "
                                 "tensor-parallel rank), got", device);
#ifdef TAH_HAVE_CUDA_STAGE
        int ndev = cu_stage_device_count(), devs[TP_MAX];
        const int nd = o.tp > 1 ? o.tp : 1;
        for (int r = 0; r < nd; r++) {
            devs[r] = o.ndevices ? o.devices[r] : k + r;
            if (devs[r] >= ndev) {
                log_error("--device %s: no such device cuda:%d%s (%d CUDA devices visible); HINT: --device cpu",
                          device, devs[r], o.tp > 1 ? " (a tensor-parallel rank's GPU)" : "", ndev);
                return 1;
            }
        }
        cu_stage_register();
        o.cuda = 1;
        o.device = k;
        char berr[512];
        if (cu_stage_bench(devs, nd, &o.gpu_gflops[0], &o.gpu_gflops[1], o.device_id, sizeof o.device_id, berr,
                           sizeof berr) != 0) {
            log_error("--device %s: %s", device, berr);
            return 1;
        }
#else
        log_error("--device %s: this build has no CUDA backend (TAH_CUDA=OFF or no nvcc); HINT: --device cpu",
                  device);
        return 1;
#endif
    }
    if (pidfile) {
        char line[32], err[1024];
        int n = snprintf(line, sizeof line, "%ld\n", (long)getpid());
        const void *parts[1] = { line };
        size_t sizes[1] = { (size_t)n };
        if (tah_file_write_atomic(pidfile, parts, sizes, 1, err, sizeof err) != 0) {
            log_error("--pid-file: %s", err);
            return 1;
        }
    }
    o.pid_file = pidfile;
    int rc = node_agent_run(&o);
    if (pidfile)
        unlink(pidfile);
    return rc;
}
