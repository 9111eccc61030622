/* ckpt.c — per-stage checkpoints (see ckpt.h). */
#include "ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h" /* crc32c_update */
#include "errors.h"
#include "fileio.h" /* tah_file_read, tah_file_write_atomic */

static void s_put32(unsigned char *p, uint32_t v)
{
    for (int b = 0; b < 4; b++)
        p[b] = (unsigned char)(v >> (8 * b));
}
static void s_put64(unsigned char *p, uint64_t v)
{
    s_put32(p, (uint32_t)v);
    s_put32(p + 4, (uint32_t)(v >> 32));
}
static uint32_t s_get32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t s_get64(const unsigned char *p)
{
    return (uint64_t)s_get32(p) | ((uint64_t)s_get32(p + 4) << 32);
}

static void s_header(const stage_t *s, const ckpt_meta_t *meta, unsigned char h[CKPT_HEADER_SIZE])
{
    const stage_opts_t *o = &s->o;
    memset(h, 0, CKPT_HEADER_SIZE);
    s_put32(h, CKPT_MAGIC);
    s_put32(h + 4, CKPT_VERSION);
    int32_t ints[12] = { o->cfg.maxT, o->cfg.V, o->cfg.Vp, o->cfg.L, o->cfg.NH, o->cfg.C,
                         o->layer0, o->layer1, o->first, o->last, o->tied, 0 };
    for (int i = 0; i < 12; i++)
        s_put32(h + 8 + 4 * i, (uint32_t)ints[i]);
    s_put64(h + 56, s->nparams);
    s_put64(h + 64, (uint64_t)s->t);
    s_put64(h + 72, (uint64_t)meta->step);
    s_put64(h + 80, meta->data_pos);
    s_put64(h + 88, meta->seed);
}

int ckpt_save(const stage_t *s, const char *path, const ckpt_meta_t *meta, char *err, size_t errlen)
{
    unsigned char h[CKPT_HEADER_SIZE];
    if (stage_sync_to_host(s, STAGE_SYNC_PARAMS | STAGE_SYNC_MOMENTS) != 0) {
        if (err)
            snprintf(err, errlen, "%s: copying the stage from the GPU failed: %s", path, stage_error(s));
        return TAH_EDEVICE;
    }
    s_header(s, meta, h);
    size_t nb = s->nparams * sizeof(float);
    uint32_t crc = crc32c_update(0, h, 124);
    crc = crc32c_update(crc, s->params, nb);
    crc = crc32c_update(crc, s->moments, 2 * nb);
    s_put32(h + 124, crc);
    char lerr[256];
    const void *parts[3] = { h, s->params, s->moments };
    size_t sizes[3] = { sizeof h, nb, 2 * nb };
    int rc = tah_file_write_atomic(path, parts, sizes, 3, err ? err : lerr, err ? errlen : sizeof lerr);
    return rc;
}

int ckpt_load(stage_t *s, const char *path, ckpt_meta_t *meta, char *err, size_t errlen)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    char lerr[256];
    int rc = tah_file_read(path, (uint64_t)1 << 40, &buf, &len, err ? err : lerr, err ? errlen : sizeof lerr);
    if (rc)
        return rc;
    size_t nb = s->nparams * sizeof(float);
    if (len < CKPT_HEADER_SIZE) {
        if (err)
            snprintf(err, errlen, "%s: truncated: %zu bytes, shorter than the %u-byte checkpoint header",
                     path, len, CKPT_HEADER_SIZE);
        rc = TAH_ETRUNC;
        goto out;
    }
    if (s_get32(buf) != CKPT_MAGIC) {
        if (err)
            snprintf(err, errlen, "%s: bad magic 0x%08x (expected 0x%08x, a tah stage checkpoint)", path,
                     s_get32(buf), CKPT_MAGIC);
        rc = TAH_EMAGIC;
        goto out;
    }
    if (s_get32(buf + 4) != CKPT_VERSION) {
        if (err)
            snprintf(err, errlen, "%s: checkpoint version %u not supported (expected %u); HINT: written by a newer tah?",
                     path, s_get32(buf + 4), CKPT_VERSION);
        rc = TAH_EVERSION;
        goto out;
    }
    uint64_t np = s_get64(buf + 56);
    if (np > (SIZE_MAX - CKPT_HEADER_SIZE) / 12 || len != CKPT_HEADER_SIZE + 12 * np) {
        if (err)
            snprintf(err, errlen, "%s: %s: %zu bytes, header says %llu parameters", path,
                     len < CKPT_HEADER_SIZE + 12 * np ? "truncated" : "size mismatch", len,
                     (unsigned long long)np);
        rc = len < CKPT_HEADER_SIZE + 12 * np ? TAH_ETRUNC : TAH_ESIZE;
        goto out;
    }
    uint32_t crc = crc32c_update(0, buf, 124);
    crc = crc32c_update(crc, buf + CKPT_HEADER_SIZE, 12 * np);
    if (crc != s_get32(buf + 124)) {
        if (err)
            snprintf(err, errlen, "%s: checksum mismatch (stored 0x%08x, computed 0x%08x): file is corrupt",
                     path, s_get32(buf + 124), crc);
        rc = TAH_ECHECKSUM;
        goto out;
    }
    unsigned char want[CKPT_HEADER_SIZE];
    ckpt_meta_t dummy = { 0, 0, 0 };
    s_header(s, &dummy, want);
    if (memcmp(buf + 8, want + 8, 48) != 0 || np != s->nparams) {
        const unsigned char *q = buf + 8;
        if (err)
            snprintf(err, errlen,
                     "%s: checkpoint is for maxT=%d V=%d Vp=%d L=%d NH=%d C=%d layers %d..%d tied=%d; "
                     "this stage is maxT=%d V=%d Vp=%d L=%d NH=%d C=%d layers %d..%d tied=%d",
                     path, (int)s_get32(q), (int)s_get32(q + 4), (int)s_get32(q + 8), (int)s_get32(q + 12),
                     (int)s_get32(q + 16), (int)s_get32(q + 20), (int)s_get32(q + 24),
                     (int)s_get32(q + 28) - 1, (int)s_get32(q + 40), s->o.cfg.maxT, s->o.cfg.V,
                     s->o.cfg.Vp, s->o.cfg.L, s->o.cfg.NH, s->o.cfg.C, s->o.layer0, s->o.layer1 - 1,
                     s->o.tied);
        rc = TAH_EINVAL;
        goto out;
    }
    memcpy(s->params, buf + CKPT_HEADER_SIZE, nb);
    memcpy(s->moments, buf + CKPT_HEADER_SIZE + nb, 2 * nb);
    s->t = (long long)s_get64(buf + 64);
    if (stage_sync_to_device(s, STAGE_SYNC_PARAMS | STAGE_SYNC_MOMENTS) != 0) {
        if (err)
            snprintf(err, errlen, "%s: copying the checkpoint to the GPU failed: %s", path, stage_error(s));
        rc = TAH_EDEVICE;
        goto out;
    }
    if (meta) {
        meta->step = (long long)s_get64(buf + 72);
        meta->data_pos = s_get64(buf + 80);
        meta->seed = s_get64(buf + 88);
    }
out:
    free(buf);
    return rc;
}
