/* test_runtime_secure.c — a secure coordinator (CURVE + join tokens, no
 * --open) on loopback. Refused, each with its reason logged: a node that
 * talks plaintext or holds a wrong coordinator key (it never gets in), a
 * node with no token, a tampered token, an expired token, a token for a
 * job that was cancelled; client commands without the admin key. Admitted:
 * a node with a token for another job (it stays idle: it is not on this
 * job's allowlist) and three nodes with tokens for the 3-stage job (tied
 * embeddings: stage 0 also links to stage 2), which then trains with every
 * step's loss, gradient norm and LR equal to tah-train's (fp32 codec), all
 * control and data traffic over CURVE. A stranger with its own CURVE key
 * cannot open a data connection to a node (its ZAP handler refuses it). */
#define _XOPEN_SOURCE 700 /* nanosleep */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "keys.h" /* keys_new, keys_read_public, keys_set_client */
#include "rt_harness.h"

static void s_compare(const char *dist, const char *ref, int steps)
{
    static const char *const keys[] = { "loss", "grad_norm", "lr" };
    const char *why = rt_metrics_diff(dist, ref, keys, 3, steps, 1e-5);
    if (why)
        fail_msg("%s", why);
}

static void s_expect_refused(rt_t *r, int i, const char *coord_text)
{
    int rc = rt_node_exit(r, i, 30);
    if (rc != 1)
        fail_msg("node %s: exit status %d, expected 1 (refused)", r->names[i], rc);
    char log[64];
    snprintf(log, sizeof log, "%s.log", r->names[i]);
    assert_true(rt_log_has(r, log, "the coordinator refused this node"));
    char line[256];
    snprintf(line, sizeof line, "node %s refused: %s", r->names[i], coord_text);
    if (!rt_log_has(r, "coord.log", line))
        fail_msg("coord.log lacks '%s'", line);
}

static int s_listed(rt_t *r, const char *name, const char *state)
{
    Tah__Envelope *e = rt_status(r, 0);
    assert_non_null(e);
    int found = 0;
    for (size_t i = 0; i < e->status_rep->n_nodes; i++)
        if (!strcmp(e->status_rep->nodes[i]->name, name) && (!state || !strcmp(e->status_rep->nodes[i]->state, state)))
            found = 1;
    wire_envelope_free(&e);
    return found;
}

static rt_t r; /* static: the teardown stops the children when an assertion fails */

static int s_teardown(void **state)
{
    (void)state;
    rt_stop(&r);
    return 0;
}

static void test_secure_admission_and_training(void **state)
{
    (void)state;
    rt_init(&r, "rt_secure");
    r.secure = 1;
    rt_start_coord(&r, 10.0, 0);
    struct stat st;
    char p[800];
    snprintf(p, sizeof p, "%s/state/coord.key", r.dir);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 077, 0);
    snprintf(p, sizeof p, "%s/state/token.secret", r.dir);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 077, 0);

    char out[4096], train[700];
    snprintf(train, sizeof train, "%s/train.txt", r.dir);
    const char *ini_j = rt_write(&r, "j.ini",
                                 "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\n"
                                 "steps = 6\nlr = 1e-3\nstages = 3\nmicro_batches = 2\nschedule = gpipe\n"
                                 "fwd_codec = fp32\nbwd_codec = fp32\n");
    uint64_t job = rt_submit(&r, ini_j, out, sizeof out);
    if (!job)
        fail_msg("submit with the admin key failed: %s", out);
    const char *ini_k = rt_write(&r, "k.ini",
                                 "[job]\nmodel = 4,2,64,32,256\ntrain_data = train.txt\nbatch = 2\nseq = 16\n"
                                 "steps = 2\nlr = 1e-3\nstages = 2\n");
    uint64_t other_job = rt_submit(&r, ini_k, out, sizeof out);
    uint64_t dead_job = rt_submit(&r, ini_k, out, sizeof out);
    assert_true(other_job && dead_job);

    /* client commands: plaintext gets no answer; a non-admin key is refused */
    const char *k_cli = rt_keygen(&r, "cli");
    char *c1[] = { TAH_COORD_EXE, "status", "--coordinator", r.ep, "--timeout", "1000", NULL };
    assert_int_equal(rt_run(c1, out, sizeof out), 1);
    assert_non_null(strstr(out, "no answer"));
    char *c2[] = { TAH_COORD_EXE, "status", "--coordinator", r.ep, "--coordinator-key", r.coord_pub, "--key",
                   (char *)k_cli, NULL };
    assert_int_equal(rt_run(c2, out, sizeof out), 1);
    assert_non_null(strstr(out, "only the admin key"));
    char *c3[] = { TAH_COORD_EXE, "token", "create", "--coordinator", r.ep, "--job", "99", "--expires", "1h",
                   "--coordinator-key", r.coord_pub, "--key", r.admin_key, NULL };
    assert_int_equal(rt_run(c3, out, sizeof out), 1);
    assert_non_null(strstr(out, "no queued, running or paused job 99"));

    const char *tok = rt_token(&r, job, "10m", out, sizeof out);
    if (!tok)
        fail_msg("token create failed: %s", out);
    const char *tok_other = rt_token(&r, other_job, "10m", out, sizeof out);
    const char *tok_dead = rt_token(&r, dead_job, "10m", out, sizeof out);
    const char *tok_short = rt_token(&r, job, "1s", out, sizeof out);
    assert_true(tok_other && tok_dead && tok_short);
    char tampered[256];
    snprintf(tampered, sizeof tampered, "%s", tok);
    {   /* one bit of the MAC (the last hex digit's nibble ^ 1, still hex) */
        static const char hx[] = "0123456789abcdef";
        char *last = &tampered[strlen(tampered) - 1];
        *last = hx[(strchr(hx, *last) - hx) ^ 1];
    }
    char *cancel[] = { TAH_COORD_EXE, "cancel", "--coordinator", r.ep, "--coordinator-key", r.coord_pub, "--key",
                       r.admin_key, (char[32]){ 0 }, NULL };
    snprintf(cancel[8], 32, "%llu", (unsigned long long)dead_job);
    assert_int_equal(rt_run(cancel, out, sizeof out), 0);

    /* refused nodes */
    char bogus_pub[700];
    snprintf(bogus_pub, sizeof bogus_pub, "%s/keys-bogus/node.pub", r.dir);
    rt_keygen(&r, "bogus");
    int plain = rt_spawn_node(&r, "plain", (const char *const[]){ NULL });
    int wrongkey = rt_spawn_node(&r, "wrongkey", (const char *const[]){ "--coordinator-key", bogus_pub, "--key",
                                                                        rt_keygen(&r, "wrongkey"), "--token", tok,
                                                                        NULL });
    int notoken = rt_spawn_node(&r, "notoken", (const char *const[]){ "--coordinator-key", r.coord_pub, "--key",
                                                                      rt_keygen(&r, "notoken"), NULL });
    s_expect_refused(&r, notoken, "no join token");
    int bad = rt_spawn_node(&r, "tampered", (const char *const[]){ "--coordinator-key", r.coord_pub, "--key",
                                                                   rt_keygen(&r, "tampered"), "--token", tampered,
                                                                   NULL });
    s_expect_refused(&r, bad, "join token signature does not verify");
    sleep(2); /* tok_short (1 s) has expired */
    int expired = rt_spawn_node(&r, "expired", (const char *const[]){ "--coordinator-key", r.coord_pub, "--key",
                                                                      rt_keygen(&r, "expired"), "--token",
                                                                      tok_short, NULL });
    s_expect_refused(&r, expired, "join token for job");
    assert_true(rt_log_has(&r, "coord.log", "expired"));
    int dead = rt_spawn_node(&r, "wrongjob", (const char *const[]){ "--coordinator-key", r.coord_pub, "--key",
                                                                    rt_keygen(&r, "wrongjob"), "--token", tok_dead,
                                                                    NULL });
    s_expect_refused(&r, dead, "join token is for job");
    assert_true(rt_log_has(&r, "coord.log", "which is cancelled"));

    /* a node admitted to another job stays idle; the job waits for its own */
    int other = rt_spawn_node(&r, "other", (const char *const[]){ "--coordinator-key", r.coord_pub, "--key",
                                                                  rt_keygen(&r, "other"), "--token", tok_other,
                                                                  NULL });
    assert_true(rt_wait_nodes(&r, "idle", 1, 30));
    int n0 = rt_spawn_node(&r, "n0", (const char *const[]){ "--coordinator-key", r.coord_pub, "--key",
                                                            rt_keygen(&r, "n0"), "--token", tok, NULL });
    assert_true(rt_wait_nodes(&r, "idle", 2, 30));
    sleep(1);
    assert_true(s_listed(&r, "other", "idle"));
    assert_true(s_listed(&r, "n0", "idle")); /* 2 idle nodes, a 2-stage job, still queued */

    /* data plane: a stranger with a CURVE key of its own (and n0's public
     * key) cannot open a data connection to n0: its ZAP handler admits
     * only the neighbours named in n0's assignment */
    {
        char n0ep[300] = "", n0pub_path[700], kerr[512], n0pub[KEYS_Z85_LEN + 1];
        Tah__Envelope *se = rt_status(&r, 0);
        assert_non_null(se);
        for (size_t i = 0; i < se->status_rep->n_nodes; i++)
            if (!strcmp(se->status_rep->nodes[i]->name, "n0"))
                snprintf(n0ep, sizeof n0ep, "%s", se->status_rep->nodes[i]->endpoint);
        wire_envelope_free(&se);
        assert_true(n0ep[0] != 0);
        snprintf(n0pub_path, sizeof n0pub_path, "%s/keys-n0/node.pub", r.dir);
        keys_pair_t me;
        assert_int_equal(keys_read_public(n0pub_path, n0pub, kerr, sizeof kerr), 0);
        assert_int_equal(keys_new(&me, kerr, sizeof kerr), 0);
        void *zctx = zmq_ctx_new();
        void *zs = zmq_socket(zctx, ZMQ_DEALER);
        int zero = 0;
        zmq_setsockopt(zs, ZMQ_LINGER, &zero, sizeof zero);
        assert_int_equal(keys_set_client(zs, n0pub, &me, kerr, sizeof kerr), 0);
        assert_int_equal(zmq_connect(zs, n0ep), 0);
        zmq_send(zs, "x", 1, ZMQ_DONTWAIT);
        char line[128];
        snprintf(line, sizeof line, "data plane: refused a connection from key %.8s", me.pub);
        int refused = 0;
        for (int t = 0; t < 150 && !refused; t++) {
            refused = rt_log_has(&r, "n0.log", line);
            nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
        }
        zmq_close(zs);
        zmq_ctx_term(zctx);
        if (!refused)
            fail_msg("n0.log lacks '%s'", line);
    }
    int n1 = rt_spawn_node(&r, "n1", (const char *const[]){ "--coordinator-key", r.coord_pub, "--key",
                                                            rt_keygen(&r, "n1"), "--token", tok, NULL });
    assert_true(rt_wait_nodes(&r, "idle", 3, 30));
    sleep(1);
    assert_true(s_listed(&r, "n1", "idle")); /* 3 idle nodes, a 3-stage job, 2 of them on its allowlist */
    int n2 = rt_spawn_node(&r, "n2", (const char *const[]){ "--coordinator-key", r.coord_pub, "--key",
                                                            rt_keygen(&r, "n2"), "--token", tok, NULL });
    (void)n0;
    (void)n1;
    (void)n2;
    char jstate[64], reason[512];
    assert_true(rt_wait_job(&r, job, 240, jstate, sizeof jstate, reason, sizeof reason));
    if (strcmp(jstate, "succeeded") != 0)
        fail_msg("job: %s: %s", jstate, reason);
    Tah__Envelope *e = rt_status(&r, job);
    assert_non_null(e);
    const Tah__JobInfo *ji = e->status_rep->jobs[0];
    assert_int_equal(ji->n_nodes, 3);
    assert_string_equal(ji->nodes[0], "n0");
    assert_string_equal(ji->nodes[1], "n1");
    assert_string_equal(ji->nodes[2], "n2");
    char metrics[1200];
    snprintf(metrics, sizeof metrics, "%s", ji->metrics_path);
    wire_envelope_free(&e);
    assert_true(s_listed(&r, "other", "idle"));
    assert_false(s_listed(&r, "plain", NULL));
    assert_false(s_listed(&r, "wrongkey", NULL));
    assert_int_equal(rt_node_exit(&r, plain, 0.1), -1); /* still knocking, never admitted */
    assert_int_equal(rt_node_exit(&r, wrongkey, 0.1), -1);
    assert_true(rt_log_has(&r, "wrongkey.log", "no answer from the coordinator"));
    assert_true(rt_log_has(&r, "plain.log", "no answer from the coordinator"));
    (void)other;

    char ref[700];
    snprintf(ref, sizeof ref, "%s/j.ref.jsonl", r.dir);
    char *ta[] = { TAH_TRAIN_EXE, "--model", "4,2,64,32,256", "--train-data", train, "--batch", "2", "--seq", "16",
                   "--steps", "6", "--lr", "1e-3", "--stages", "3", "--micro-batches", "2", "--schedule", "gpipe",
                   "--threads", "1", "--metrics", ref, "--quiet", NULL };
    int rc = rt_run(ta, out, sizeof out);
    if (rc != 0)
        fail_msg("tah-train failed (%d): %s", rc, out);
    s_compare(metrics, ref, 6);
    assert_int_equal(rt_stop(&r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_secure_admission_and_training, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
