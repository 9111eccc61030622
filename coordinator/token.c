/* token.c — see token.h. */
#define _XOPEN_SOURCE 700
#include "token.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/crypto.h> /* CRYPTO_memcmp */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "errors.h"
#include "fileio.h"

#define NONCE_LEN 16
#define MAC_LEN 32

static void s_hex(const uint8_t *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = 0;
}

static int s_nib(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Exactly 2n lower-case hex characters -> n bytes. */
static int s_unhex(const char *s, size_t slen, uint8_t *out, size_t n)
{
    if (slen != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = s_nib(s[2 * i]), lo = s_nib(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

int token_secret_load(const char *state_dir, uint8_t secret[TOKEN_SECRET_LEN], char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/token.secret", state_dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno != ENOENT) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return TAH_EIO;
        }
        if (RAND_bytes(secret, TOKEN_SECRET_LEN) != 1) {
            snprintf(err, errlen, "%s: RAND_bytes failed", path);
            return TAH_EIO;
        }
        char line[2 * TOKEN_SECRET_LEN + 2];
        s_hex(secret, TOKEN_SECRET_LEN, line);
        strcat(line, "\n");
        const void *parts[1] = { line };
        size_t sizes[1] = { 2 * TOKEN_SECRET_LEN + 1 };
        return tah_file_write_atomic_mode(path, parts, sizes, 1, 0600, err, errlen);
    }
    if (st.st_mode & 077) {
        snprintf(err, errlen, "%s: token secret is readable by others (mode %04o); HINT: chmod 600 %s", path,
                 (unsigned)(st.st_mode & 07777), path);
        return TAH_EINVAL;
    }
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = tah_file_read(path, 1024, &data, &len, err, errlen);
    if (rc != 0)
        return rc;
    while (len && (data[len - 1] == '\n' || data[len - 1] == '\r'))
        len--;
    rc = s_unhex((const char *)data, len, secret, TOKEN_SECRET_LEN);
    free(data);
    if (rc != 0) {
        snprintf(err, errlen, "%s: not %d hex bytes; HINT: delete it to make a new one (old tokens stop working)",
                 path, TOKEN_SECRET_LEN);
        return TAH_EINVAL;
    }
    return 0;
}

static int s_mac(const uint8_t secret[TOKEN_SECRET_LEN], uint64_t job, int64_t expires, const char *nonce_hex,
                 uint8_t mac[MAC_LEN])
{
    char msg[128];
    int n = snprintf(msg, sizeof msg, "tah-join-v1|%" PRIu64 "|%" PRId64 "|%s", job, expires, nonce_hex);
    unsigned int ml = 0;
    if (!HMAC(EVP_sha256(), secret, TOKEN_SECRET_LEN, (const unsigned char *)msg, (size_t)n, mac, &ml) ||
        ml != MAC_LEN)
        return TAH_EIO;
    return 0;
}

int token_create(const uint8_t secret[TOKEN_SECRET_LEN], uint64_t job, int64_t expires, char *out, size_t outlen)
{
    uint8_t nonce[NONCE_LEN], mac[MAC_LEN];
    char nh[2 * NONCE_LEN + 1], mh[2 * MAC_LEN + 1];
    if (RAND_bytes(nonce, NONCE_LEN) != 1)
        return TAH_EIO;
    s_hex(nonce, NONCE_LEN, nh);
    if (s_mac(secret, job, expires, nh, mac) != 0)
        return TAH_EIO;
    s_hex(mac, MAC_LEN, mh);
    if ((size_t)snprintf(out, outlen, "tah1.%" PRIu64 ".%" PRId64 ".%s.%s", job, expires, nh, mh) >= outlen)
        return TAH_EINVAL;
    return 0;
}

/* A decimal field of at most 19 digits, no sign, no leading zero. */
static int s_dec(const char *s, size_t n, uint64_t *v)
{
    if (n == 0 || n > 19 || (n > 1 && s[0] == '0'))
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        x = x * 10 + (uint64_t)(s[i] - '0');
    }
    *v = x;
    return 0;
}

int token_verify(const uint8_t secret[TOKEN_SECRET_LEN], const char *token, int64_t now, uint64_t *job,
                 int64_t *expires, char *why, size_t whylen)
{
    const char *f[5];
    size_t fl[5];
    size_t len = strnlen(token, TOKEN_MAX_LEN + 1);
    if (len > TOKEN_MAX_LEN || strncmp(token, "tah1.", 5) != 0) {
        snprintf(why, whylen, "malformed join token (expected tah1.JOB.EXPIRY.NONCE.MAC)");
        return TAH_EINVAL;
    }
    const char *p = token;
    for (int i = 0; i < 5; i++) {
        const char *dot = strchr(p, '.');
        if ((i < 4) != (dot != NULL)) {
            snprintf(why, whylen, "malformed join token (expected 5 dot-separated fields)");
            return TAH_EINVAL;
        }
        f[i] = p;
        fl[i] = dot ? (size_t)(dot - p) : strlen(p);
        p = dot ? dot + 1 : p + fl[i];
    }
    uint64_t j = 0, e = 0;
    uint8_t nonce[NONCE_LEN], given[MAC_LEN], mac[MAC_LEN];
    if (s_dec(f[1], fl[1], &j) != 0 || j == 0 || s_dec(f[2], fl[2], &e) != 0 || e > INT64_MAX ||
        s_unhex(f[3], fl[3], nonce, NONCE_LEN) != 0 || s_unhex(f[4], fl[4], given, MAC_LEN) != 0) {
        snprintf(why, whylen, "malformed join token (bad job, expiry, nonce or MAC field)");
        return TAH_EINVAL;
    }
    char nh[2 * NONCE_LEN + 1];
    memcpy(nh, f[3], 2 * NONCE_LEN);
    nh[2 * NONCE_LEN] = 0;
    if (s_mac(secret, j, (int64_t)e, nh, mac) != 0) {
        snprintf(why, whylen, "HMAC failed");
        return TAH_EIO;
    }
    if (CRYPTO_memcmp(mac, given, MAC_LEN) != 0) {
        snprintf(why, whylen, "join token signature does not verify (tampered, or made by another coordinator)");
        return TAH_EINVAL;
    }
    if ((int64_t)e <= now) {
        snprintf(why, whylen, "join token for job %" PRIu64 " expired %" PRId64 " s ago; HINT: tah-coord token create",
                 j, now - (int64_t)e);
        return TAH_EINVAL;
    }
    *job = j;
    *expires = (int64_t)e;
    return 0;
}

int64_t token_parse_duration(const char *s)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v <= 0 || s[0] == '-' || s[0] == '+')
        return -1;
    long long mul = 1;
    if (*end == 's')
        end++;
    else if (*end == 'm')
        mul = 60, end++;
    else if (*end == 'h')
        mul = 3600, end++;
    else if (*end == 'd')
        mul = 86400, end++;
    if (*end || v > 10LL * 365 * 86400 / mul)
        return -1;
    return (int64_t)(v * mul);
}
