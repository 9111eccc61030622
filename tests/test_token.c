/* test_token.c — join tokens (coordinator/token.h): a fresh token
 * verifies; an expired one, one signed with another secret, one with any
 * single bit flipped, and one whose job field was changed do not; the
 * secret file is 0600 and refused when others may read it; the MAC is
 * compared with CRYPTO_memcmp. */
#define _XOPEN_SOURCE 700 /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h>

#include "errors.h"
#include "fileio.h"
#include "token.h"

static char s_dir[256];

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_dir, sizeof s_dir, "token.XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

static void test_secret_file(void **state)
{
    (void)state;
    uint8_t a[TOKEN_SECRET_LEN], b[TOKEN_SECRET_LEN];
    char err[1024], path[512];
    assert_int_equal(token_secret_load(s_dir, a, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/token.secret", s_dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(token_secret_load(s_dir, b, err, sizeof err), 0);
    assert_memory_equal(a, b, TOKEN_SECRET_LEN); /* kept, not regenerated */
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(token_secret_load(s_dir, b, err, sizeof err), TAH_EINVAL);
    assert_non_null(strstr(err, "readable by others"));
    assert_int_equal(chmod(path, 0600), 0);
}

static void test_verify(void **state)
{
    (void)state;
    uint8_t sec[TOKEN_SECRET_LEN], other[TOKEN_SECRET_LEN];
    for (int i = 0; i < TOKEN_SECRET_LEN; i++) {
        sec[i] = (uint8_t)(i * 7 + 1);
        other[i] = sec[i];
    }
    other[5] ^= 1;
    int64_t now = (int64_t)time(NULL);
    char tok[TOKEN_MAX_LEN + 1], why[512];
    assert_int_equal(token_create(sec, 42, now + 60, tok, sizeof tok), 0);
    uint64_t job = 0;
    int64_t exp = 0;
    assert_int_equal(token_verify(sec, tok, now, &job, &exp, why, sizeof why), 0);
    assert_int_equal(job, 42);
    assert_int_equal(exp, now + 60);
    /* two tokens for the same job differ (nonce) */
    char tok2[TOKEN_MAX_LEN + 1];
    assert_int_equal(token_create(sec, 42, now + 60, tok2, sizeof tok2), 0);
    assert_string_not_equal(tok, tok2);

    /* expired: at its expiry and after */
    assert_int_equal(token_verify(sec, tok, now + 60, &job, &exp, why, sizeof why), TAH_EINVAL);
    assert_non_null(strstr(why, "expired"));
    assert_int_equal(token_verify(sec, tok, now + 3600, &job, &exp, why, sizeof why), TAH_EINVAL);

    /* another coordinator's secret */
    assert_int_equal(token_verify(other, tok, now, &job, &exp, why, sizeof why), TAH_EINVAL);
    assert_non_null(strstr(why, "does not verify"));

    /* every single-bit flip anywhere is refused */
    size_t n = strlen(tok);
    for (size_t i = 0; i < n; i++) {
        for (int bit = 0; bit < 8; bit++) {
            char t[TOKEN_MAX_LEN + 1];
            memcpy(t, tok, n + 1);
            t[i] = (char)(t[i] ^ (1 << bit));
            if (t[i] == 0)
                continue; /* would only shorten the string: covered by truncation below */
            if (token_verify(sec, t, now, &job, &exp, why, sizeof why) == 0)
                fail_msg("bit %d of char %zu flipped: '%s' still verifies", bit, i, t);
        }
    }
    /* truncated, extended */
    for (size_t k = 0; k < n; k++) {
        char t[TOKEN_MAX_LEN + 1];
        memcpy(t, tok, k);
        t[k] = 0;
        assert_int_not_equal(token_verify(sec, t, now, &job, &exp, why, sizeof why), 0);
    }
    char ext[TOKEN_MAX_LEN + 8];
    snprintf(ext, sizeof ext, "%s0", tok);
    assert_int_not_equal(token_verify(sec, ext, now, &job, &exp, why, sizeof why), 0);

    /* the job field re-written (token for job 42 presented as job 43) */
    char t[TOKEN_MAX_LEN + 8];
    snprintf(t, sizeof t, "tah1.43%s", tok + strlen("tah1.42"));
    assert_int_equal(token_verify(sec, t, now, &job, &exp, why, sizeof why), TAH_EINVAL);
    assert_non_null(strstr(why, "does not verify"));
    /* a leading zero would keep the MAC's number but is not canonical */
    snprintf(t, sizeof t, "tah1.042%s", tok + strlen("tah1.42"));
    assert_int_equal(token_verify(sec, t, now, &job, &exp, why, sizeof why), TAH_EINVAL);
    assert_int_equal(token_verify(sec, "", now, &job, &exp, why, sizeof why), TAH_EINVAL);
    assert_int_equal(token_verify(sec, "tah1....", now, &job, &exp, why, sizeof why), TAH_EINVAL);
}

/* The MAC comparison must be constant-time: the verifier uses
 * CRYPTO_memcmp and no plain memcmp/strcmp on the MAC. */
static void test_constant_time_compare(void **state)
{
    (void)state;
    uint8_t *src = NULL;
    size_t len = 0;
    char err[512];
    assert_int_equal(tah_file_read(TAH_TOKEN_SRC, 1 << 20, &src, &len, err, sizeof err), 0);
    char *s = calloc(len + 1, 1);
    assert_non_null(s);
    memcpy(s, src, len);
    free(src);
    const char *v = strstr(s, "int token_verify(");
    assert_non_null(v);
    assert_non_null(strstr(v, "CRYPTO_memcmp(mac, given, MAC_LEN)"));
    assert_null(strstr(v, " memcmp("));
    assert_null(strstr(v, "strcmp(mac"));
    free(s);
}

static void test_duration(void **state)
{
    (void)state;
    assert_int_equal(token_parse_duration("90"), 90);
    assert_int_equal(token_parse_duration("90s"), 90);
    assert_int_equal(token_parse_duration("30m"), 1800);
    assert_int_equal(token_parse_duration("12h"), 43200);
    assert_int_equal(token_parse_duration("7d"), 7 * 86400);
    assert_int_equal(token_parse_duration("0"), -1);
    assert_int_equal(token_parse_duration("-5m"), -1);
    assert_int_equal(token_parse_duration("5x"), -1);
    assert_int_equal(token_parse_duration(""), -1);
    assert_int_equal(token_parse_duration("99999d"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_secret_file),
        cmocka_unit_test(test_verify),
        cmocka_unit_test(test_constant_time_compare),
        cmocka_unit_test(test_duration),
    };
    return cmocka_run_group_tests(tests, s_setup, NULL);
}
