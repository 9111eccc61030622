/* gpt2.c — GPT-2 configuration, parameter layout, init and llm.c model files. */
#include "gpt2.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "fileio.h" /* tah_file_write_atomic */

static const char *const s_names[GPT2_NTENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
};

const char *gpt2_tensor_name(int i)
{
    return (i >= 0 && i < GPT2_NTENSORS) ? s_names[i] : "?";
}

int gpt2_tensor_per_layer(int i)
{
    return i >= GPT2_LN1W && i <= GPT2_FCPROJB;
}

int gpt2_tensor_is_matrix(int i)
{
    return i == GPT2_WTE || i == GPT2_WPE || i == GPT2_QKVW || i == GPT2_ATTPROJW ||
           i == GPT2_FCW || i == GPT2_FCPROJW;
}

size_t gpt2_tensor_layer_size(const gpt2_config_t *cfg, int i)
{
    size_t C = (size_t)cfg->C;
    switch (i) {
    case GPT2_WTE: return (size_t)cfg->Vp * C;
    case GPT2_WPE: return (size_t)cfg->maxT * C;
    case GPT2_LN1W: case GPT2_LN1B: return C;
    case GPT2_QKVW: return 3 * C * C;
    case GPT2_QKVB: return 3 * C;
    case GPT2_ATTPROJW: return C * C;
    case GPT2_ATTPROJB: return C;
    case GPT2_LN2W: case GPT2_LN2B: return C;
    case GPT2_FCW: return 4 * C * C;
    case GPT2_FCB: return 4 * C;
    case GPT2_FCPROJW: return 4 * C * C;
    case GPT2_FCPROJB: return C;
    case GPT2_LNFW: case GPT2_LNFB: return C;
    default: return 0;
    }
}

size_t gpt2_param_sizes(const gpt2_config_t *cfg, size_t sizes[GPT2_NTENSORS])
{
    size_t total = 0;
    for (int i = 0; i < GPT2_NTENSORS; i++) {
        size_t n = gpt2_tensor_layer_size(cfg, i);
        if (gpt2_tensor_per_layer(i))
            n *= (size_t)cfg->L;
        sizes[i] = n;
        total += n;
    }
    return total;
}

int gpt2_padded_vocab(int V)
{
    if (V < 1024)
        return V;
    return (V + 127) / 128 * 128;
}

int gpt2_config_validate(const gpt2_config_t *cfg, char *err, size_t errlen)
{
    struct { const char *name; int v, lo, hi; } f[] = {
        { "maxT", cfg->maxT, 1, 1 << 20 }, { "V", cfg->V, 1, 1 << 24 },
        { "Vp", cfg->Vp, 1, 1 << 24 },     { "L", cfg->L, 1, 4096 },
        { "NH", cfg->NH, 1, 4096 },        { "C", cfg->C, 1, 1 << 16 },
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (f[i].v < f[i].lo || f[i].v > f[i].hi) {
            if (err)
                snprintf(err, errlen, "bad config: %s = %d (must be in %d..%d)", f[i].name, f[i].v,
                         f[i].lo, f[i].hi);
            return TAH_EINVAL;
        }
    }
    if (cfg->C % cfg->NH != 0) {
        if (err)
            snprintf(err, errlen, "bad config: C = %d is not divisible by NH = %d", cfg->C, cfg->NH);
        return TAH_EINVAL;
    }
    if (cfg->Vp < cfg->V) {
        if (err)
            snprintf(err, errlen, "bad config: padded vocabulary Vp = %d < V = %d", cfg->Vp, cfg->V);
        return TAH_EINVAL;
    }
    size_t sizes[GPT2_NTENSORS];
    size_t total = gpt2_param_sizes(cfg, sizes);
    if (total > ((size_t)1 << 34)) {
        if (err)
            snprintf(err, errlen, "bad config: %zu parameters is too many", total);
        return TAH_EINVAL;
    }
    return 0;
}

gpt2_model_t *gpt2_model_new(const gpt2_config_t *cfg, char *err, size_t errlen)
{
    if (gpt2_config_validate(cfg, err, errlen) != 0)
        return NULL;
    gpt2_model_t *m = calloc(1, sizeof *m);
    if (!m)
        goto nomem;
    m->cfg = *cfg;
    m->nparams = gpt2_param_sizes(cfg, m->sizes);
    m->params = calloc(m->nparams, sizeof(float));
    if (!m->params)
        goto nomem;
    float *p = m->params;
    for (int i = 0; i < GPT2_NTENSORS; i++) {
        m->t[i] = p;
        p += m->sizes[i];
    }
    return m;
nomem:
    if (err)
        snprintf(err, errlen, "out of memory allocating the model");
    gpt2_model_destroy(&m);
    return NULL;
}

void gpt2_model_destroy(gpt2_model_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->params);
    free(*self_p);
    *self_p = NULL;
}

uint64_t gpt2_rand_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double gpt2_rand_normal(uint64_t *state)
{
    /* 53-bit uniforms in (0,1] and [0,1) */
    double u1 = ((double)(gpt2_rand_u64(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(gpt2_rand_u64(state) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void gpt2_model_init_random(gpt2_model_t *m, uint64_t seed)
{
    const gpt2_config_t *c = &m->cfg;
    uint64_t st = seed ^ 0x7461682d67707432ull; /* "tah-gpt2" */
    double resid_std = 0.02 / sqrt(2.0 * c->L);
    for (int i = 0; i < GPT2_NTENSORS; i++) {
        float *t = m->t[i];
        size_t n = m->sizes[i];
        if (i == GPT2_LN1W || i == GPT2_LN2W || i == GPT2_LNFW) {
            for (size_t k = 0; k < n; k++)
                t[k] = 1.0f;
        } else if (gpt2_tensor_is_matrix(i)) {
            double sd = (i == GPT2_ATTPROJW || i == GPT2_FCPROJW) ? resid_std : 0.02;
            size_t used = (i == GPT2_WTE) ? (size_t)c->V * c->C : n;
            for (size_t k = 0; k < used; k++)
                t[k] = (float)(sd * gpt2_rand_normal(&st));
            for (size_t k = used; k < n; k++)
                t[k] = 0.0f;
        } else {
            memset(t, 0, n * sizeof(float));
        }
    }
}

static uint32_t s_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

int gpt2_model_read(const char *path, gpt2_model_t **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = 0;
    gpt2_model_t *m = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (err)
            snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return TAH_EIO;
    }
    long fsz = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        fsz = ftell(f);
    rewind(f);
    unsigned char hb[GPT2_HEADER_INTS * 4];
    size_t got = fread(hb, 1, sizeof hb, f);
    if (got >= 4 && s_le32(hb) != GPT2_MODEL_MAGIC) {
        if (err)
            snprintf(err, errlen, "%s: bad magic 0x%08x (expected %d, an llm.c GPT-2 model file)",
                     path, s_le32(hb), GPT2_MODEL_MAGIC);
        rc = TAH_EMAGIC;
        goto out;
    }
    if (fsz < (long)sizeof hb || got != sizeof hb) {
        if (err)
            snprintf(err, errlen, "%s: truncated: %ld bytes, shorter than the %zu-byte llm.c header",
                     path, fsz, sizeof hb);
        rc = TAH_ETRUNC;
        goto out;
    }
    uint32_t magic = s_le32(hb), version = s_le32(hb + 4);
    if (magic != GPT2_MODEL_MAGIC) {
        if (err)
            snprintf(err, errlen, "%s: bad magic 0x%08x (expected %d, an llm.c GPT-2 model file)",
                     path, magic, GPT2_MODEL_MAGIC);
        rc = TAH_EMAGIC;
        goto out;
    }
    if (version != GPT2_MODEL_VERSION) {
        if (err)
            snprintf(err, errlen,
                     "%s: model file version %u not supported (expected %d, padded vocabulary); "
                     "HINT: re-export with llm.c's train_gpt2.py",
                     path, version, GPT2_MODEL_VERSION);
        rc = TAH_EVERSION;
        goto out;
    }
    gpt2_config_t cfg = {
        .maxT = (int)s_le32(hb + 8), .V = (int)s_le32(hb + 12), .L = (int)s_le32(hb + 16),
        .NH = (int)s_le32(hb + 20), .C = (int)s_le32(hb + 24), .Vp = (int)s_le32(hb + 28),
    };
    char cerr[200];
    if (gpt2_config_validate(&cfg, cerr, sizeof cerr) != 0) {
        if (err)
            snprintf(err, errlen, "%s: header has a %s", path, cerr);
        rc = TAH_EINVAL;
        goto out;
    }
    m = gpt2_model_new(&cfg, err, errlen);
    if (!m) {
        rc = TAH_ENOMEM;
        goto out;
    }
    unsigned long long want = (unsigned long long)sizeof hb + 4ull * m->nparams;
    if ((unsigned long long)fsz != want) {
        if (err)
            snprintf(err, errlen, "%s: %s: file has %ld bytes, header (L=%d C=%d Vp=%d maxT=%d) implies %llu",
                     path, (unsigned long long)fsz < want ? "truncated" : "trailing bytes", fsz,
                     cfg.L, cfg.C, cfg.Vp, cfg.maxT, want);
        rc = (unsigned long long)fsz < want ? TAH_ETRUNC : TAH_ESIZE;
        goto out;
    }
    if (fread(m->params, sizeof(float), m->nparams, f) != m->nparams) {
        if (err)
            snprintf(err, errlen, "%s: read failed", path);
        rc = TAH_EIO;
        goto out;
    }
    for (size_t i = 0; i < m->nparams; i++) {
        if (!isfinite(m->params[i])) {
            if (err)
                snprintf(err, errlen, "%s: parameter %zu is not finite", path, i);
            rc = TAH_ENONFINITE;
            goto out;
        }
    }
    *out = m;
    m = NULL;
out:
    fclose(f);
    gpt2_model_destroy(&m);
    return rc;
}

int gpt2_model_write(const char *path, const gpt2_model_t *m, char *err, size_t errlen)
{
    int32_t header[GPT2_HEADER_INTS];
    memset(header, 0, sizeof header);
    header[0] = GPT2_MODEL_MAGIC;
    header[1] = GPT2_MODEL_VERSION;
    header[2] = m->cfg.maxT;
    header[3] = m->cfg.V;
    header[4] = m->cfg.L;
    header[5] = m->cfg.NH;
    header[6] = m->cfg.C;
    header[7] = m->cfg.Vp;
    char lerr[256];
    const void *parts[2] = { header, m->params };
    size_t sizes[2] = { sizeof header, m->nparams * sizeof(float) };
    int rc = tah_file_write_atomic(path, parts, sizes, 2, err ? err : lerr, err ? errlen : sizeof lerr);
    return rc;
}
