/* linkprobe.c — measure what a (shaped) link really carries, over TCP.
 *
 *   linkprobe serve --listen ADDR:PORT     accept one connection, read to EOF,
 *                                          print "received N bytes in T s: R Mbit/s"
 *   linkprobe send --to ADDR:PORT --bytes N
 *
 * The receiver times from its first byte to EOF, so socket buffers on the
 * sending side do not inflate the rate. Used by the network lab's tests and
 * to calibrate links before an experiment. Exit 0 ok, 1 runtime, 2 usage. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int s_usage(void)
{
    fprintf(stderr, "usage: linkprobe serve --listen ADDR:PORT\n"
                    "       linkprobe send --to ADDR:PORT --bytes N\n");
    return 2;
}

static int s_parse_addr(const char *s, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (!colon || (size_t)(colon - s) >= sizeof host)
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535)
        return -1;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int s_serve(const struct sockaddr_in *sa)
{
    int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(ls, (const struct sockaddr *)sa, sizeof *sa) != 0 || listen(ls, 1) != 0) {
        fprintf(stderr, "linkprobe: listen: %s\n", strerror(errno));
        return 1;
    }
    printf("listening\n");
    fflush(stdout);
    int c = accept(ls, NULL, NULL);
    if (c < 0) {
        fprintf(stderr, "linkprobe: accept: %s\n", strerror(errno));
        return 1;
    }
    static char buf[1 << 16];
    uint64_t total = 0;
    double t0 = 0.0;
    for (;;) {
        ssize_t r = read(c, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            fprintf(stderr, "linkprobe: read: %s\n", strerror(errno));
            return 1;
        }
        if (r == 0)
            break;
        if (total == 0)
            t0 = s_now();
        total += (uint64_t)r;
    }
    double dt = s_now() - t0;
    printf("received %llu bytes in %.3f s: %.2f Mbit/s\n", (unsigned long long)total, dt,
           dt > 0 ? 8e-6 * (double)total / dt : 0.0);
    close(c);
    close(ls);
    return 0;
}

static int s_send(const struct sockaddr_in *sa, uint64_t bytes)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (const struct sockaddr *)sa, sizeof *sa) != 0) {
        fprintf(stderr, "linkprobe: connect: %s\n", strerror(errno));
        return 1;
    }
    static char buf[1 << 16];
    memset(buf, 0xA5, sizeof buf);
    while (bytes > 0) {
        size_t n = bytes < sizeof buf ? (size_t)bytes : sizeof buf;
        ssize_t w = write(s, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            fprintf(stderr, "linkprobe: write: %s\n", strerror(errno));
            return 1;
        }
        bytes -= (uint64_t)w;
    }
    close(s);
    return 0;
}

int main(int argc, char **argv)
{
    struct sockaddr_in sa;
    const char *addr = NULL;
    uint64_t bytes = 0;
    if (argc < 2)
        return s_usage();
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--listen") || !strcmp(argv[i], "--to"))
            addr = argv[i + 1];
        else if (!strcmp(argv[i], "--bytes"))
            bytes = strtoull(argv[i + 1], NULL, 10);
        else
            return s_usage();
    }
    if (argc % 2 != 0 || !addr || s_parse_addr(addr, &sa) != 0)
        return s_usage();
    if (!strcmp(argv[1], "serve"))
        return s_serve(&sa);
    if (!strcmp(argv[1], "send") && bytes > 0)
        return s_send(&sa, bytes);
    return s_usage();
}
