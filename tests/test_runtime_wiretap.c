/* test_runtime_wiretap.c — a man in the middle on the data link from stage
 * 0 to stage 1. Stage 1's node advertises the port of a relay (join
 * --advertise HOST:PORT, as behind a port forward); the relay passes every
 * byte both ways and keeps a copy, like a router on the path would.
 *   secure coordinator: every link is CURVE; the job trains through the
 *     relay, and the copy holds none of its plaintext (no codec frame: the
 *     "TAHF" magic that starts each one never appears; no job token);
 *   serve --open: the same relay's copy holds every frame — the check sees
 *     plaintext when it is there.
 * The relay cannot do more than read and drop: CURVE authenticates every
 * message, and the data-plane ZAP handler admits only the assigned
 * neighbour's key (test_runtime_secure.c). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "rt_harness.h"

#define S_CAP (16u << 20)

typedef struct relay {
    int lfd;                 /* listening */
    int upstream_port;       /* the real node */
    int port;                /* what stage 1 advertises */
    volatile int stop;
    uint8_t *buf;            /* both directions, as they pass */
    size_t len;
    pthread_t th;
} relay_t;

static int s_listen_any(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) != 0)
        fail_msg("relay: cannot listen");
    *port = ntohs(a.sin_port);
    return fd;
}

static int s_free_port(void)
{
    int port = 0, fd = s_listen_any(&port);
    close(fd);
    return port;
}

static void s_keep(relay_t *rl, const uint8_t *p, size_t n)
{
    if (rl->len + n <= S_CAP) {
        memcpy(rl->buf + rl->len, p, n);
        rl->len += n;
    }
}

/* Accept connections; pass bytes between each and the upstream node. */
static void *s_relay_main(void *arg)
{
    relay_t *rl = arg;
    enum { MAXC = 8 };
    int down[MAXC], up[MAXC], nc = 0;
    uint8_t chunk[65536];
    while (!rl->stop) {
        struct pollfd pf[1 + 2 * MAXC];
        int np = 0;
        pf[np++] = (struct pollfd){ rl->lfd, POLLIN, 0 };
        for (int i = 0; i < nc; i++) {
            pf[np++] = (struct pollfd){ down[i], POLLIN, 0 };
            pf[np++] = (struct pollfd){ up[i], POLLIN, 0 };
        }
        if (poll(pf, (nfds_t)np, 50) <= 0)
            continue;
        if ((pf[0].revents & POLLIN) && nc < MAXC) {
            int c = accept(rl->lfd, NULL, NULL);
            int u = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)rl->upstream_port),
                                     .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
            if (c >= 0 && u >= 0 && connect(u, (struct sockaddr *)&a, sizeof a) == 0) {
                down[nc] = c;
                up[nc++] = u;
            } else {
                if (c >= 0)
                    close(c);
                if (u >= 0)
                    close(u);
            }
        }
        for (int i = 0; i < nc; i++) {
            for (int d = 0; d < 2; d++) {
                int from = d ? up[i] : down[i], to = d ? down[i] : up[i];
                if (!(pf[1 + 2 * i + d].revents & (POLLIN | POLLHUP | POLLERR)))
                    continue;
                ssize_t n = read(from, chunk, sizeof chunk);
                if (n <= 0) { /* one side closed: close the pair */
                    close(down[i]);
                    close(up[i]);
                    down[i] = down[nc - 1];
                    up[i] = up[nc - 1];
                    nc--;
                    i = nc; /* the pollfd indices moved: poll again */
                    break;
                }
                s_keep(rl, chunk, (size_t)n);
                for (ssize_t off = 0; off < n;) {
                    ssize_t w = write(to, chunk + off, (size_t)(n - off));
                    if (w <= 0)
                        break;
                    off += w;
                }
            }
        }
    }
    for (int i = 0; i < nc; i++) {
        close(down[i]);
        close(up[i]);
    }
    return NULL;
}

static void s_relay_start(relay_t *rl)
{
    memset(rl, 0, sizeof *rl);
    rl->buf = malloc(S_CAP);
    assert_non_null(rl->buf);
    rl->upstream_port = s_free_port();
    rl->lfd = s_listen_any(&rl->port);
    assert_int_equal(pthread_create(&rl->th, NULL, s_relay_main, rl), 0);
}

static void s_relay_stop(relay_t *rl)
{
    rl->stop = 1;
    pthread_join(rl->th, NULL);
    close(rl->lfd);
}

static size_t s_count(const relay_t *rl, const void *pat, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i + n <= rl->len; i++)
        c += !memcmp(rl->buf + i, pat, n);
    return c;
}

/* Share of the most frequent byte value: about 1/256 for ciphertext; fp32
 * activations and protobuf headers repeat exponent and zero bytes. */
static double s_top_byte_share(const relay_t *rl)
{
    size_t h[256] = { 0 }, top = 0;
    for (size_t i = 0; i < rl->len; i++)
        h[rl->buf[i]]++;
    for (int b = 0; b < 256; b++)
        top = h[b] > top ? h[b] : top;
    return rl->len ? (double)top / (double)rl->len : 0.0;
}

static const char *s_job = "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\nsteps = 4\n"
                           "lr = 1e-3\nstages = 2\nmicro_batches = 2\nfwd_codec = fp32\nbwd_codec = fp32\n";

/* A 2-stage job whose stage-1 node is reached through the relay; returns
 * the relay's copy (caller frees rl->buf). */
static void s_run(int secure, relay_t *rl)
{
    rt_t r;
    rt_init(&r, secure ? "rt_tap_secure" : "rt_tap_open");
    r.secure = secure;
    rt_start_coord(&r, 10.0, 0);
    s_relay_start(rl);
    char out[4096], st[64], reason[512], listen[64], adv[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", rl->upstream_port);
    snprintf(adv, sizeof adv, "127.0.0.1:%d", rl->port);
    uint64_t job = rt_submit(&r, rt_write(&r, "tap.ini", s_job), out, sizeof out);
    assert_true(job > 0);
    if (secure) {
        const char *tok = rt_token(&r, job, "10m", out, sizeof out);
        assert_non_null(tok);
        rt_spawn_node(&r, "s0", (const char *const[]){ "--coordinator-key", r.coord_pub, "--key",
                                                       rt_keygen(&r, "s0"), "--token", tok, NULL });
        assert_true(rt_wait_nodes(&r, "idle", 1, 30));
        rt_spawn_node(&r, "s1", (const char *const[]){ "--coordinator-key", r.coord_pub, "--key",
                                                       rt_keygen(&r, "s1"), "--token", tok, "--listen", listen,
                                                       "--advertise", adv, NULL });
    } else {
        rt_spawn_node(&r, "s0", (const char *const[]){ NULL });
        assert_true(rt_wait_nodes(&r, "idle", 1, 30));
        rt_spawn_node(&r, "s1", (const char *const[]){ "--listen", listen, "--advertise", adv, NULL });
    }
    assert_true(rt_wait_job(&r, job, 120, st, sizeof st, reason, sizeof reason));
    if (strcmp(st, "succeeded") != 0)
        fail_msg("job through the relay: %s: %s", st, reason);
    Tah__Envelope *e = rt_status(&r, job);
    assert_string_equal(e->status_rep->jobs[0]->nodes[1], "s1");
    wire_envelope_free(&e);
    s_relay_stop(rl);
    assert_int_equal(rt_stop(&r), 0);
}

static void test_wiretap_open_sees_frames(void **state)
{
    (void)state;
    relay_t rl;
    s_run(0, &rl);
    const uint8_t magic[4] = { 'T', 'A', 'H', 'F' };
    size_t frames = s_count(&rl, magic, 4);
    double top = s_top_byte_share(&rl);
    printf("open: the relay passed %zu bytes, %zu codec frames readable, top byte value %.2f %%\n", rl.len, frames,
           100 * top);
    /* 4 steps x 2 micro-batches x (activation + gradient) at least */
    assert_true(frames >= 16);
    assert_true(top > 0.02);
    free(rl.buf);
}

static void test_wiretap_curve_sees_nothing(void **state)
{
    (void)state;
    relay_t rl;
    s_run(1, &rl);
    const uint8_t magic[4] = { 'T', 'A', 'H', 'F' };
    size_t frames = s_count(&rl, magic, 4);
    double top = s_top_byte_share(&rl);
    printf("curve: the relay passed %zu bytes, %zu codec frames readable, top byte value %.2f %%\n", rl.len,
           frames, 100 * top);
    /* the frames went through it (fp32: 8 KiB each, 16 at least)... */
    assert_true(rl.len >= 16u * 8192u);
    /* ...unreadable: no frame, and bytes as uniform as ciphertext (1/256 = 0.39 %) */
    assert_int_equal(frames, 0);
    assert_true(top < 0.01);
    free(rl.buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wiretap_open_sees_frames),
        cmocka_unit_test(test_wiretap_curve_sees_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
