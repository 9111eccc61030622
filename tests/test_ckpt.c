/* test_ckpt.c — per-stage checkpoints: save/resume reproduces an
 * uninterrupted run bit for bit (parameters, AdamW moments and step, data
 * position); corrupt, truncated, foreign or mismatched checkpoints are
 * rejected without touching the stage; writes are atomic and leave no
 * temporary files behind, also when they fail. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "ckpt.h"
#include "errors.h"
#include "trainer.h"

static const gpt2_config_t s_cfg = { .maxT = 8, .V = 40, .Vp = 48, .L = 3, .NH = 2, .C = 16 };
static char s_dir[64];
static int *s_tok;
static data_t s_data;

static int s_setup(void **state)
{
    (void)state;
    strcpy(s_dir, "/tmp/tah_ckpt_XXXXXX");
    if (!mkdtemp(s_dir))
        return -1;
    s_tok = malloc(3000 * sizeof(int));
    uint64_t rs = 5;
    for (int i = 0; i < 3000; i++)
        s_tok[i] = (int)(gpt2_rand_u64(&rs) % (uint64_t)s_cfg.V);
    s_data = (data_t){ .tok = s_tok, .n = 3000 };
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    DIR *d = opendir(s_dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", s_dir, e->d_name);
        unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(s_dir);
    free(s_tok);
    return 0;
}

static trainer_t *s_trainer(uint64_t seed)
{
    char err[256];
    gpt2_model_t *init = gpt2_model_new(&s_cfg, err, sizeof err);
    gpt2_model_init_random(init, seed);
    trainer_opts_t o = { .cfg = s_cfg, .S = 2, .M = 2, .B = 2, .T = 8, .sched = SCHED_1F1B, .tied = 1 };
    optim_defaults(&o.optim);
    o.optim.lr = 1e-2f;
    o.optim.weight_decay = 0.1f;
    o.optim.schedule = OPTIM_COSINE;
    o.optim.total_steps = 4;
    trainer_t *t = trainer_new(&o, init, err, sizeof err);
    gpt2_model_destroy(&init);
    assert_non_null(t);
    return t;
}

static int s_count_files(const char *needle)
{
    int n = 0;
    DIR *d = opendir(s_dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strstr(e->d_name, needle) != NULL;
    if (d)
        closedir(d);
    return n;
}

static void test_resume_is_exact(void **state)
{
    (void)state;
    char err[256] = "", prefix[128];
    snprintf(prefix, sizeof prefix, "%s/run", s_dir);
    double lossA[4], lossB[4];
    trainer_stats_t st;
    data_loader_t dl;

    trainer_t *a = s_trainer(1);
    data_loader_init(&dl, &s_data, 2, 8, err, sizeof err);
    for (int s = 0; s < 4; s++) {
        assert_int_equal(trainer_step(a, &dl, &st, err, sizeof err), 0);
        lossA[s] = st.loss;
    }

    trainer_t *b = s_trainer(1);
    data_loader_init(&dl, &s_data, 2, 8, err, sizeof err);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(trainer_step(b, &dl, &st, err, sizeof err), 0);
        lossB[s] = st.loss;
    }
    ckpt_meta_t meta = { .step = b->step, .data_pos = dl.pos, .seed = 1 };
    if (trainer_save_ckpt(b, prefix, &meta, err, sizeof err) != 0)
        fail_msg("save: %s", err);
    trainer_destroy(&b);
    assert_int_equal(s_count_files(".ckpt"), 2);
    assert_int_equal(s_count_files(".tmp."), 0);

    trainer_t *c = s_trainer(999); /* different init: everything must come from the files */
    ckpt_meta_t got;
    if (trainer_load_ckpt(c, prefix, &got, err, sizeof err) != 0)
        fail_msg("load: %s", err);
    assert_int_equal(got.step, 2);
    assert_int_equal(c->step, 2);
    assert_true(got.data_pos == meta.data_pos);
    data_loader_init(&dl, &s_data, 2, 8, err, sizeof err);
    dl.pos = got.data_pos;
    for (int s = 2; s < 4; s++) {
        assert_int_equal(trainer_step(c, &dl, &st, err, sizeof err), 0);
        lossB[s] = st.loss;
    }
    for (int s = 0; s < 4; s++)
        assert_true(lossA[s] == lossB[s]);
    for (int k = 0; k < 2; k++) {
        assert_memory_equal(a->stages[k]->params, c->stages[k]->params, a->stages[k]->nparams * sizeof(float));
        assert_memory_equal(a->stages[k]->moments, c->stages[k]->moments, 2 * a->stages[k]->nparams * sizeof(float));
    }
    trainer_destroy(&a);
    trainer_destroy(&c);
}

/* copy src to dst, then let edit() change the bytes */
static void s_mutate(const char *src, const char *dst, long trunc_to, long flip_at, uint32_t magic)
{
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    static unsigned char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (trunc_to >= 0)
        n = (size_t)trunc_to;
    if (flip_at >= 0)
        buf[flip_at] ^= 0x10;
    if (magic)
        memcpy(buf, &magic, 4);
    f = fopen(dst, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
}

static void test_corrupt_rejected(void **state)
{
    (void)state;
    char err[512], good[128], bad[128];
    snprintf(good, sizeof good, "%s/good.ckpt", s_dir);
    snprintf(bad, sizeof bad, "%s/bad.ckpt", s_dir);
    trainer_t *t = s_trainer(3);
    stage_t *s0 = t->stages[0], *s1 = t->stages[1];
    s0->t = 17;
    ckpt_meta_t meta = { .step = 5, .data_pos = 64, .seed = 3 };
    assert_int_equal(ckpt_save(s0, good, &meta, err, sizeof err), 0);
    long size = (long)(CKPT_HEADER_SIZE + 12 * s0->nparams);

    float *before = malloc(s0->nparams * sizeof(float));
    memcpy(before, s0->params, s0->nparams * sizeof(float));
    s0->params[0] += 1.0f; /* make a failed load detectable */
    memcpy(before, s0->params, s0->nparams * sizeof(float));

    struct { long trunc, flip; uint32_t magic; int want; const char *msg; } cases[] = {
        { -1, size - 3, 0, TAH_ECHECKSUM, "checksum mismatch" },   /* payload bit flip */
        { -1, 70, 0, TAH_ECHECKSUM, "checksum mismatch" },         /* header (step) bit flip */
        { size - 4, -1, 0, TAH_ETRUNC, "truncated" },
        { 100, -1, 0, TAH_ETRUNC, "truncated" },
        { -1, -1, 0x12345678u, TAH_EMAGIC, "bad magic 0x12345678" },
        { -1, 4, 0, TAH_EVERSION, "version" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        s_mutate(good, bad, cases[i].trunc, cases[i].flip, cases[i].magic);
        err[0] = 0;
        int rc = ckpt_load(s0, bad, NULL, err, sizeof err);
        if (rc != cases[i].want || !strstr(err, cases[i].msg))
            fail_msg("case %zu: rc %d (want %d), message '%s'", i, rc, cases[i].want, err);
        assert_memory_equal(before, s0->params, s0->nparams * sizeof(float));
        assert_int_equal(s0->t, 17);
    }
    /* a valid checkpoint of another stage */
    err[0] = 0;
    assert_int_equal(ckpt_load(s1, good, NULL, err, sizeof err), TAH_EINVAL);
    assert_non_null(strstr(err, "layers 0..0"));
    /* missing file */
    assert_int_equal(ckpt_load(s0, "/nonexistent/x.ckpt", NULL, err, sizeof err), TAH_EIO);
    /* the good one still loads and restores everything */
    ckpt_meta_t got;
    s0->t = 0;
    assert_int_equal(ckpt_load(s0, good, &got, err, sizeof err), 0);
    assert_int_equal(s0->t, 17);
    assert_int_equal(got.step, 5);
    assert_true(got.data_pos == 64);
    assert_true(s0->params[0] != before[0]);
    unlink(bad);
    free(before);
    trainer_destroy(&t);
}

static void test_failed_write_leaves_nothing(void **state)
{
    (void)state;
    char err[512] = "", path[128];
    trainer_t *t = s_trainer(4);
    /* into a missing directory: fails cleanly */
    snprintf(path, sizeof path, "%s/missing/dir.ckpt", s_dir);
    ckpt_meta_t meta = { 0, 0, 0 };
    assert_int_equal(ckpt_save(t->stages[0], path, &meta, err, sizeof err), TAH_EIO);
    assert_non_null(strstr(err, "missing"));
    /* overwriting is atomic: the old file is replaced, no temporaries remain */
    snprintf(path, sizeof path, "%s/over.ckpt", s_dir);
    assert_int_equal(ckpt_save(t->stages[1], path, &meta, err, sizeof err), 0);
    meta.step = 9;
    assert_int_equal(ckpt_save(t->stages[1], path, &meta, err, sizeof err), 0);
    ckpt_meta_t got;
    assert_int_equal(ckpt_load(t->stages[1], path, &got, err, sizeof err), 0);
    assert_int_equal(got.step, 9);
    assert_int_equal(s_count_files(".tmp."), 0);
    unlink(path);
    trainer_destroy(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_is_exact),
        cmocka_unit_test(test_corrupt_rejected),
        cmocka_unit_test(test_failed_write_leaves_nothing),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
