/* data.c — llm.c token files, byte-level text, batch loader (see data.h). */
#include "data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "fileio.h" /* tah_file_read, tah_file_write_atomic */

#define DATA_MAX_BYTES ((uint64_t)1 << 40)

static uint32_t s_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static int s_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int data_load(const char *path, int V, data_t **out, char *err, size_t errlen)
{
    *out = NULL;
    unsigned char *buf = NULL;
    size_t len = 0;
    data_t *d = NULL;
    char lerr[256];
    int rc = tah_file_read(path, DATA_MAX_BYTES, &buf, &len, err ? err : lerr, err ? errlen : sizeof lerr);
    if (rc)
        return rc;
    d = calloc(1, sizeof *d);
    if (!d) {
        rc = TAH_ENOMEM;
        goto out;
    }
    int is_tokens = (len >= 4 && s_le32(buf) == DATA_MAGIC) || s_ends_with(path, ".bin");
    if (is_tokens) {
        const size_t hsz = DATA_HEADER_INTS * 4;
        if (len >= 4 && s_le32(buf) != DATA_MAGIC) {
            if (err)
                snprintf(err, errlen, "%s: bad magic 0x%08x (expected %d, an llm.c token file)", path,
                         s_le32(buf), DATA_MAGIC);
            rc = TAH_EMAGIC;
            goto out;
        }
        if (len < hsz) {
            if (err)
                snprintf(err, errlen, "%s: truncated: %zu bytes, shorter than the %zu-byte llm.c token header",
                         path, len, hsz);
            rc = TAH_ETRUNC;
            goto out;
        }
        uint32_t magic = s_le32(buf), version = s_le32(buf + 4), ntok = s_le32(buf + 8);
        if (magic != DATA_MAGIC) {
            if (err)
                snprintf(err, errlen, "%s: bad magic 0x%08x (expected %d, an llm.c token file)", path,
                         magic, DATA_MAGIC);
            rc = TAH_EMAGIC;
            goto out;
        }
        if (version != DATA_VERSION) {
            if (err)
                snprintf(err, errlen, "%s: token file version %u not supported (expected %d, uint16 tokens)",
                         path, version, DATA_VERSION);
            rc = TAH_EVERSION;
            goto out;
        }
        size_t want = hsz + 2 * (size_t)ntok;
        if (len != want) {
            if (err)
                snprintf(err, errlen, "%s: %s: %zu bytes, header says %u tokens = %zu bytes", path,
                         len < want ? "truncated" : "trailing bytes", len, ntok, want);
            rc = len < want ? TAH_ETRUNC : TAH_ESIZE;
            goto out;
        }
        d->n = ntok;
    } else {
        d->n = len;
        d->is_text = 1;
    }
    if (d->n == 0) {
        if (err)
            snprintf(err, errlen, "%s: no tokens", path);
        rc = TAH_ESIZE;
        goto out;
    }
    d->tok = malloc(d->n * sizeof(int));
    if (!d->tok) {
        rc = TAH_ENOMEM;
        goto out;
    }
    const unsigned char *p = is_tokens ? buf + DATA_HEADER_INTS * 4 : buf;
    for (size_t i = 0; i < d->n; i++) {
        int t = is_tokens ? (int)(p[2 * i] | (p[2 * i + 1] << 8)) : (int)p[i];
        if (t >= V) {
            if (err)
                snprintf(err, errlen, "%s: %s %d at position %zu >= vocabulary size V = %d", path,
                         is_tokens ? "token" : "byte", t, i, V);
            rc = TAH_ERANGE;
            goto out;
        }
        d->tok[i] = t;
    }
    *out = d;
    d = NULL;
out:
    if (rc == TAH_ENOMEM && err)
        snprintf(err, errlen, "%s: out of memory", path);
    free(buf);
    data_destroy(&d);
    return rc;
}

void data_destroy(data_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->tok);
    free(*self_p);
    *self_p = NULL;
}

int data_write_tokens(const char *path, const int *tok, size_t n, char *err, size_t errlen)
{
    if (n > UINT32_MAX)
        return TAH_EINVAL;
    unsigned char header[DATA_HEADER_INTS * 4];
    memset(header, 0, sizeof header);
    uint32_t h[3] = { DATA_MAGIC, DATA_VERSION, (uint32_t)n };
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < 4; b++)
            header[4 * k + b] = (unsigned char)(h[k] >> (8 * b));
    unsigned char *body = malloc(2 * n + 1);
    if (!body)
        return TAH_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (tok[i] < 0 || tok[i] > 65535) {
            free(body);
            if (err)
                snprintf(err, errlen, "%s: token %d at position %zu does not fit uint16", path, tok[i], i);
            return TAH_ERANGE;
        }
        body[2 * i] = (unsigned char)tok[i];
        body[2 * i + 1] = (unsigned char)(tok[i] >> 8);
    }
    char lerr[256];
    const void *parts[2] = { header, body };
    size_t sizes[2] = { sizeof header, 2 * n };
    int rc = tah_file_write_atomic(path, parts, sizes, 2, err ? err : lerr, err ? errlen : sizeof lerr);
    free(body);
    return rc;
}

int data_loader_init(data_loader_t *dl, const data_t *d, int B, int T, char *err, size_t errlen)
{
    size_t need = (size_t)B * T + 1;
    if (d->n < need) {
        if (err)
            snprintf(err, errlen, "%zu tokens is too few for one batch of B=%d x T=%d (need %zu)",
                     d->n, B, T, need);
        return TAH_EINVAL;
    }
    dl->d = d;
    dl->B = B;
    dl->T = T;
    dl->pos = 0;
    return 0;
}

void data_next_batch(data_loader_t *dl, int *inputs, int *targets)
{
    size_t bt = (size_t)dl->B * dl->T;
    if (dl->pos + bt + 1 > dl->d->n)
        dl->pos = 0;
    const int *src = dl->d->tok + dl->pos;
    memcpy(inputs, src, bt * sizeof(int));
    memcpy(targets, src + 1, bt * sizeof(int));
    dl->pos += bt;
    if (dl->pos + bt + 1 > dl->d->n)
        dl->pos = 0;
}
