/* test_keys.c — CURVE key files (proto/keys.h): keygen writes a 0600
 * secret and a 0644 public key whatever the umask, the pair round-trips,
 * a group/world-readable or malformed secret is refused, and the keys
 * really do CURVE: a client with the server's public key talks to it, one
 * with another key does not. */
#define _XOPEN_SOURCE 700 /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "errors.h"
#include "keys.h"

static char s_dir[256];

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_dir, sizeof s_dir, "keys.XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

static unsigned s_mode(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (unsigned)(st.st_mode & 07777);
}

static void test_write_modes_and_roundtrip(void **state)
{
    (void)state;
    char err[1024], path[512], dir[300];
    assert_int_equal(keys_curve_available(err, sizeof err), 0);
    snprintf(dir, sizeof dir, "%s/a", s_dir);
    mode_t old = umask(0); /* the modes must not depend on it */
    keys_pair_t kp;
    assert_int_equal(keys_new(&kp, err, sizeof err), 0);
    assert_int_equal(keys_write(dir, "node", &kp, err, sizeof err), 0);
    umask(old);
    assert_int_equal(s_mode(dir), 0700);
    snprintf(path, sizeof path, "%s/node.key", dir);
    assert_int_equal(s_mode(path), 0600);
    keys_pair_t back;
    assert_int_equal(keys_read_secret(path, &back, err, sizeof err), 0);
    assert_string_equal(back.sec, kp.sec);
    assert_string_equal(back.pub, kp.pub); /* derived from the secret */
    snprintf(path, sizeof path, "%s/node.pub", dir);
    assert_int_equal(s_mode(path), 0644);
    char pub[KEYS_Z85_LEN + 1];
    assert_int_equal(keys_read_public(path, pub, err, sizeof err), 0);
    assert_string_equal(pub, kp.pub);
    assert_int_equal(keys_read_public(kp.pub, pub, err, sizeof err), 0); /* inline Z85 */
    assert_string_equal(pub, kp.pub);
    /* a rewrite replaces the pair and keeps 0600 */
    keys_pair_t kp2;
    assert_int_equal(keys_new(&kp2, err, sizeof err), 0);
    assert_string_not_equal(kp2.sec, kp.sec);
    assert_int_equal(keys_write(dir, "node", &kp2, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/node.key", dir);
    assert_int_equal(s_mode(path), 0600);
    assert_int_equal(keys_read_secret(path, &back, err, sizeof err), 0);
    assert_string_equal(back.pub, kp2.pub);
}

static void test_readable_secret_refused(void **state)
{
    (void)state;
    char err[1024], path[512], dir[300];
    snprintf(dir, sizeof dir, "%s/b", s_dir);
    keys_pair_t kp, back;
    assert_int_equal(keys_new(&kp, err, sizeof err), 0);
    assert_int_equal(keys_write(dir, "node", &kp, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/node.key", dir);
    static const unsigned bad[] = { 0644, 0640, 0604, 0660, 0606 };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(chmod(path, bad[i]), 0);
        err[0] = 0;
        assert_int_equal(keys_read_secret(path, &back, err, sizeof err), TAH_EINVAL);
        assert_non_null(strstr(err, "readable by others"));
        assert_non_null(strstr(err, "chmod 600"));
    }
    assert_int_equal(chmod(path, 0400), 0);
    assert_int_equal(keys_read_secret(path, &back, err, sizeof err), 0);
    /* missing file, garbage, a short line */
    snprintf(path, sizeof path, "%s/missing.key", dir);
    assert_int_not_equal(keys_read_secret(path, &back, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/garbage.key", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("this is not a Z85 key at all, nope!!!!!\n", f); /* 40 chars, ' ' is not Z85 */
    fclose(f);
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(keys_read_secret(path, &back, err, sizeof err), TAH_EINVAL);
    char pub[KEYS_Z85_LEN + 1];
    assert_int_not_equal(keys_read_public("short", pub, err, sizeof err), 0);
    assert_int_not_equal(keys_read_public(path, pub, err, sizeof err), 0);
}

/* One request over CURVE: 1 if the server got it within 1 s. */
static int s_talk(const keys_pair_t *server, const char *server_pub_for_client)
{
    char err[1024];
    void *ctx = zmq_ctx_new();
    void *srv = zmq_socket(ctx, ZMQ_ROUTER), *cli = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, to = 1000;
    zmq_setsockopt(srv, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(cli, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(srv, ZMQ_RCVTIMEO, &to, sizeof to);
    assert_int_equal(keys_set_server(srv, server, err, sizeof err), 0);
    assert_int_equal(zmq_bind(srv, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t el = sizeof ep;
    zmq_getsockopt(srv, ZMQ_LAST_ENDPOINT, ep, &el);
    keys_pair_t me;
    assert_int_equal(keys_new(&me, err, sizeof err), 0);
    assert_int_equal(keys_set_client(cli, server_pub_for_client, &me, err, sizeof err), 0);
    assert_int_equal(zmq_connect(cli, ep), 0);
    zmq_send(cli, "hi", 2, ZMQ_DONTWAIT);
    char rid[256], buf[16];
    int got = 0;
    if (zmq_recv(srv, rid, sizeof rid, 0) > 0 && zmq_recv(srv, buf, sizeof buf, 0) == 2 && !memcmp(buf, "hi", 2))
        got = 1;
    zmq_close(cli);
    zmq_close(srv);
    zmq_ctx_term(ctx);
    return got;
}

static void test_curve_handshake(void **state)
{
    (void)state;
    char err[1024];
    keys_pair_t server, other;
    assert_int_equal(keys_new(&server, err, sizeof err), 0);
    assert_int_equal(keys_new(&other, err, sizeof err), 0);
    assert_true(s_talk(&server, server.pub));
    assert_false(s_talk(&server, other.pub)); /* wrong server key: the handshake fails, nothing arrives */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_modes_and_roundtrip),
        cmocka_unit_test(test_readable_secret_refused),
        cmocka_unit_test(test_curve_handshake),
    };
    return cmocka_run_group_tests(tests, s_setup, NULL);
}
