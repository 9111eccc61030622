/* test_data.c — llm.c token files and byte-level text: round trip, exact
 * header, the batch walk (targets shifted by one, wrap-around), and
 * rejection of truncated files, wrong magic or version, trailing bytes,
 * tokens >= V and data too short for one batch, with clear messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "data.h"
#include "errors.h"

static char s_bin[64], s_txt[64];

static void s_spit(const char *p, const void *b, size_t n)
{
    FILE *f = fopen(p, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

static void test_token_file_roundtrip(void **state)
{
    (void)state;
    char err[256];
    int tok[1000];
    for (int i = 0; i < 1000; i++)
        tok[i] = (i * 7919) % 50257;
    assert_int_equal(data_write_tokens(s_bin, tok, 1000, err, sizeof err), 0);
    FILE *f = fopen(s_bin, "rb");
    int32_t h[256];
    assert_int_equal(fread(h, 4, 256, f), 256);
    fseek(f, 0, SEEK_END);
    assert_int_equal(ftell(f), 1024 + 2000);
    fclose(f);
    assert_int_equal(h[0], 20240520);
    assert_int_equal(h[1], 1);
    assert_int_equal(h[2], 1000);
    data_t *d = NULL;
    assert_int_equal(data_load(s_bin, 50257, &d, err, sizeof err), 0);
    assert_int_equal(d->n, 1000);
    assert_false(d->is_text);
    assert_memory_equal(d->tok, tok, sizeof tok);
    data_destroy(&d);
    /* a token >= V */
    err[0] = 0;
    assert_int_equal(data_load(s_bin, 1000, &d, err, sizeof err), TAH_ERANGE);
    assert_non_null(strstr(err, "token 7919 at position 1 >= vocabulary size V = 1000"));
    assert_null(d);
}

static void test_bad_token_files(void **state)
{
    (void)state;
    char err[256];
    int tok[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
    assert_int_equal(data_write_tokens(s_bin, tok, 10, err, sizeof err), 0);
    unsigned char b[1024 + 20 + 4];
    FILE *f = fopen(s_bin, "rb");
    assert_int_equal(fread(b, 1, 1044, f), 1044);
    fclose(f);
    data_t *d = NULL;
    struct { size_t n; int at; int32_t val; int rc; const char *msg; } cases[] = {
        { 1043, -1, 0, TAH_ETRUNC, "truncated: 1043 bytes, header says 10 tokens = 1044 bytes" },
        { 500, -1, 0, TAH_ETRUNC, "truncated: 500 bytes" },
        { 1044, 0, 20240326, TAH_EMAGIC, "bad magic 0x0134d7c6 (expected 20240520" },
        { 1044, 1, 2, TAH_EVERSION, "version 2" },
        { 1044, 2, 0, TAH_ESIZE, "trailing bytes" },
        { 1044, 2, 11, TAH_ETRUNC, "truncated" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char c[sizeof b];
        memcpy(c, b, sizeof b);
        if (cases[i].at >= 0)
            memcpy(c + 4 * cases[i].at, &cases[i].val, 4);
        s_spit(s_bin, c, cases[i].n);
        err[0] = 0;
        int rc = data_load(s_bin, 256, &d, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].msg) || !strstr(err, s_bin))
            fail_msg("case %zu: rc %d (want %d) '%s'", i, rc, cases[i].rc, err);
        assert_null(d);
    }
    assert_int_equal(data_load("/nonexistent.bin", 256, &d, err, sizeof err), TAH_EIO);
}

static void test_text_and_loader(void **state)
{
    (void)state;
    char err[256];
    const char *text = "The jury said caf\xc3\xa9 \xe2\x80\x94 ok.\n"; /* UTF-8: bytes >= 128 */
    size_t n = strlen(text);
    s_spit(s_txt, text, n);
    data_t *d = NULL;
    assert_int_equal(data_load(s_txt, 256, &d, err, sizeof err), 0);
    assert_true(d->is_text);
    assert_int_equal(d->n, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(d->tok[i], (unsigned char)text[i]);
    /* loader: B=2, T=3 takes 7 tokens at 0, 6, 12, ... and wraps */
    data_loader_t dl;
    assert_int_equal(data_loader_init(&dl, d, 2, 3, err, sizeof err), 0);
    int in[6], tg[6];
    size_t starts[8];
    for (int k = 0; k < 8; k++) {
        starts[k] = dl.pos;
        data_next_batch(&dl, in, tg);
        for (int i = 0; i < 6; i++) {
            assert_int_equal(in[i], d->tok[starts[k] + (size_t)i]);
            assert_int_equal(tg[i], d->tok[starts[k] + (size_t)i + 1]);
        }
    }
    assert_int_equal(starts[1], 6);
    /* n = 31: batches at 0, 6, 12, 18 (needs 25 <= 31), then 24 would need 31 > 30 -> wrap */
    assert_int_equal(starts[4], 0);
    /* too few tokens for a batch */
    assert_int_equal(data_loader_init(&dl, d, 4, 8, err, sizeof err), TAH_EINVAL);
    assert_non_null(strstr(err, "need 33"));
    data_destroy(&d);
    /* bytes >= V for a small vocabulary */
    assert_int_equal(data_load(s_txt, 128, &d, err, sizeof err), TAH_ERANGE);
    assert_non_null(strstr(err, "byte 195 at position 17 >= vocabulary size V = 128"));
    /* empty file */
    s_spit(s_txt, "", 0);
    assert_int_equal(data_load(s_txt, 256, &d, err, sizeof err), TAH_ESIZE);
    assert_non_null(strstr(err, "no tokens"));
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_bin, sizeof s_bin, "/tmp/tah_data_%d.bin", (int)getpid());
    snprintf(s_txt, sizeof s_txt, "/tmp/tah_data_%d.txt", (int)getpid());
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    unlink(s_bin);
    unlink(s_txt);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_file_roundtrip),
        cmocka_unit_test(test_bad_token_files),
        cmocka_unit_test(test_text_and_loader),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
