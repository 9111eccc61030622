/* test_gpt2_file.c — llm.c GPT-2 model files: exact header and parameter
 * layout, round trip through the file and through a split pipeline, llm.c's
 * padded-vocabulary semantics (padding rows never affect the loss), and
 * rejection of bad files with clear messages. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "errors.h"
#include "gpt2.h"
#include "trainer.h"

static const gpt2_config_t s_cfg = { .maxT = 16, .V = 50, .Vp = 64, .L = 3, .NH = 4, .C = 16 };
static char s_path[64], s_bad[64];

static unsigned char *s_slurp(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *b = malloc(*n + 8);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void s_spit(const char *p, const void *b, size_t n)
{
    FILE *f = fopen(p, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

static void test_roundtrip_and_layout(void **state)
{
    (void)state;
    char err[256];
    gpt2_model_t *m = gpt2_model_new(&s_cfg, err, sizeof err);
    gpt2_model_init_random(m, 11);
    assert_int_equal(gpt2_model_write(s_path, m, err, sizeof err), 0);
    size_t n;
    unsigned char *b = s_slurp(s_path, &n);
    assert_int_equal(n, 1024 + 4 * m->nparams);
    int32_t h[256];
    memcpy(h, b, sizeof h);
    int32_t want[8] = { 20240326, 3, 16, 50, 3, 4, 16, 64 };
    assert_memory_equal(h, want, sizeof want);
    for (int i = 8; i < 256; i++)
        assert_int_equal(h[i], 0);
    /* llm.c order: wte (Vp*C) then wpe, ..., lnfb last */
    float f;
    memcpy(&f, b + 1024 + 4 * (size_t)s_cfg.Vp * s_cfg.C, 4);
    assert_true(f == m->t[GPT2_WPE][0]);
    memcpy(&f, b + n - 4, 4);
    assert_true(f == m->t[GPT2_LNFB][s_cfg.C - 1]);
    size_t qkvw_off = 0;
    for (int i = 0; i < GPT2_QKVW; i++)
        qkvw_off += m->sizes[i];
    memcpy(&f, b + 1024 + 4 * (qkvw_off + 3 * 16 * 16), 4); /* layer 1's first qkvw */
    assert_true(f == m->t[GPT2_QKVW][3 * 16 * 16]);
    assert_int_equal(m->nparams, 64 * 16 + 16 * 16 + 3 * (12 * 16 * 16 + 13 * 16) + 2 * 16);
    free(b);

    gpt2_model_t *r = NULL;
    assert_int_equal(gpt2_model_read(s_path, &r, err, sizeof err), 0);
    assert_memory_equal(&r->cfg, &m->cfg, sizeof m->cfg);
    assert_memory_equal(r->params, m->params, m->nparams * sizeof(float));

    /* through a 3-stage pipeline and back */
    trainer_opts_t o = { .cfg = s_cfg, .S = 3, .M = 1, .B = 1, .T = 4, .sched = SCHED_1F1B, .tied = 1 };
    optim_defaults(&o.optim);
    trainer_t *t = trainer_new(&o, r, err, sizeof err);
    assert_non_null(t);
    memset(r->params, 0, r->nparams * sizeof(float));
    assert_int_equal(trainer_export(t, r), 0);
    assert_memory_equal(r->params, m->params, m->nparams * sizeof(float));
    trainer_destroy(&t);
    gpt2_model_destroy(&r);
    gpt2_model_destroy(&m);
}

/* llm.c computes logits over Vp but the softmax and loss over V only. */
static void test_padding_rows_do_not_matter(void **state)
{
    (void)state;
    char err[256];
    gpt2_model_t *m = gpt2_model_new(&s_cfg, err, sizeof err);
    gpt2_model_init_random(m, 12);
    int tok[33];
    uint64_t rs = 3;
    for (int i = 0; i < 33; i++)
        tok[i] = (int)(gpt2_rand_u64(&rs) % 50);
    data_t d = { .tok = tok, .n = 33 };
    double loss[2];
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            for (size_t k = 50 * 16; k < 64 * 16; k++)
                m->t[GPT2_WTE][k] = 100.0f * (float)gpt2_rand_normal(&rs);
        data_loader_t dl;
        data_loader_init(&dl, &d, 2, 16, err, sizeof err);
        trainer_opts_t o = { .cfg = s_cfg, .S = 2, .M = 1, .B = 2, .T = 16, .sched = SCHED_1F1B, .tied = 1 };
        optim_defaults(&o.optim);
        trainer_t *t = trainer_new(&o, m, err, sizeof err);
        assert_int_equal(trainer_eval(t, &dl, 1, &loss[pass], err, sizeof err), 0);
        trainer_destroy(&t);
    }
    assert_true(loss[0] == loss[1]);
    assert_true(fabs(loss[0] - log(50.0)) < 0.5); /* near-uniform at init */
    gpt2_model_destroy(&m);
}

static void s_expect_bad(const unsigned char *b, size_t n, int want_rc, const char *want_msg)
{
    char err[512] = "";
    s_spit(s_bad, b, n);
    gpt2_model_t *r = NULL;
    int rc = gpt2_model_read(s_bad, &r, err, sizeof err);
    if (rc != want_rc || !strstr(err, want_msg) || !strstr(err, s_bad))
        fail_msg("rc %d (want %d), message '%s' (want '%s')", rc, want_rc, err, want_msg);
    assert_null(r);
}

static void test_bad_files(void **state)
{
    (void)state;
    char err[256];
    gpt2_model_t *m = gpt2_model_new(&s_cfg, err, sizeof err);
    gpt2_model_init_random(m, 13);
    assert_int_equal(gpt2_model_write(s_path, m, err, sizeof err), 0);
    size_t n;
    unsigned char *b = s_slurp(s_path, &n);
    unsigned char *c = malloc(n + 8);
    int32_t v;

    memcpy(c, b, n);
    v = 20240520; /* a token file */
    memcpy(c, &v, 4);
    s_expect_bad(c, n, TAH_EMAGIC, "bad magic 0x0134d888 (expected 20240326");
    memcpy(c, b, n);
    v = 2;
    memcpy(c + 4, &v, 4);
    s_expect_bad(c, n, TAH_EVERSION, "version 2 not supported");
    s_expect_bad(b, n - 4, TAH_ETRUNC, "truncated");
    s_expect_bad(b, 100, TAH_ETRUNC, "truncated");
    memcpy(c, b, n);
    c[n] = 0;
    s_expect_bad(c, n + 1, TAH_ESIZE, "trailing bytes");
    memcpy(c, b, n);
    v = 5; /* NH = 5 does not divide C = 16 */
    memcpy(c + 20, &v, 4);
    s_expect_bad(c, n, TAH_EINVAL, "C = 16 is not divisible by NH = 5");
    memcpy(c, b, n);
    v = 40; /* Vp < V */
    memcpy(c + 28, &v, 4);
    s_expect_bad(c, n, TAH_EINVAL, "Vp = 40 < V = 50");
    memcpy(c, b, n);
    float nan = NAN;
    memcpy(c + 1024 + 8, &nan, 4);
    s_expect_bad(c, n, TAH_ENONFINITE, "parameter 2 is not finite");

    gpt2_model_t *r = NULL;
    assert_int_equal(gpt2_model_read("/nonexistent/model.bin", &r, err, sizeof err), TAH_EIO);
    /* writing into a missing directory fails and leaves nothing */
    assert_int_equal(gpt2_model_write("/nonexistent/dir/model.bin", m, err, sizeof err), TAH_EIO);
    free(b);
    free(c);
    gpt2_model_destroy(&m);
}

static void test_config_validation(void **state)
{
    (void)state;
    char err[256];
    gpt2_config_t c = s_cfg;
    assert_int_equal(gpt2_config_validate(&c, err, sizeof err), 0);
    c.L = 0;
    assert_int_equal(gpt2_config_validate(&c, err, sizeof err), TAH_EINVAL);
    assert_non_null(strstr(err, "L = 0"));
    c = s_cfg;
    c.C = 18;
    assert_int_equal(gpt2_config_validate(&c, err, sizeof err), TAH_EINVAL);
    assert_null(gpt2_model_new(&c, err, sizeof err));
    assert_int_equal(gpt2_padded_vocab(50257), 50304);
    assert_int_equal(gpt2_padded_vocab(256), 256);
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_path, sizeof s_path, "/tmp/tah_gpt2_%d.bin", (int)getpid());
    snprintf(s_bad, sizeof s_bad, "/tmp/tah_gpt2_bad_%d.bin", (int)getpid());
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    unlink(s_path);
    unlink(s_bad);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_and_layout),
        cmocka_unit_test(test_padding_rows_do_not_matter),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_config_validation),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
