/* spec.c — codec names, defaults, and the one parser of codec spec strings
 * "NAME[:key=value,...]". Keys are described by one table per codec, so
 * parsing, validation messages and formatting cannot drift apart. */
#include "codec_impl.h" /* codec_mix64 */

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { S_U32, S_F32, S_U64 } s_kind_t;

typedef struct s_key {
    const char *name;
    s_kind_t kind;
    size_t offset; /* within codec_spec_t */
} s_key_t;

#define S_TAH(f) offsetof(codec_spec_t, p.tah.f)
#define S_FIX(f) offsetof(codec_spec_t, p.fixpt.f)
#define S_ASH(f) offsetof(codec_spec_t, p.ash.f)
#define S_INT(f) offsetof(codec_spec_t, p.intq.f)

static const s_key_t s_tah_keys[] = {
    { "tile", S_U32, S_TAH(tile) },       { "alloc_tile", S_U32, S_TAH(alloc_tile) },
    { "hi_frac", S_F32, S_TAH(hi_frac) }, { "bits_hi", S_U32, S_TAH(bits_hi) },
    { "bits_lo", S_U32, S_TAH(bits_lo) }, { "tau", S_F32, S_TAH(tau) },
    { "rho", S_F32, S_TAH(rho) },         { "window", S_U32, S_TAH(window) },
    { NULL, S_U32, 0 },
};
static const s_key_t s_fixpt_keys[] = {
    { "bits", S_U32, S_FIX(bits) },       { "scale", S_F32, S_FIX(scale) },
    { "group", S_U32, S_FIX(group) },     { "stochastic", S_U32, S_FIX(stochastic) },
    { "seed", S_U64, S_FIX(seed) },       { NULL, S_U32, 0 },
};
static const s_key_t s_ash_keys[] = {
    { "block", S_U32, S_ASH(block) }, { "tau", S_F32, S_ASH(tau) },
    { "eps", S_F32, S_ASH(eps) },     { NULL, S_U32, 0 },
};
static const s_key_t s_int_keys[] = {
    { "bits", S_U32, S_INT(bits) },           { "group", S_U32, S_INT(group) },
    { "symmetric", S_U32, S_INT(symmetric) }, { NULL, S_U32, 0 },
};
static const s_key_t s_no_keys[] = { { NULL, S_U32, 0 } };

static const struct {
    codec_id_t id;
    const char *name;
    const s_key_t *keys;
} s_codecs[] = {
    { CODEC_FP32, "fp32", s_no_keys },        { CODEC_FP16, "fp16", s_no_keys },
    { CODEC_BF16, "bf16", s_no_keys },        { CODEC_TAH, "tah", s_tah_keys },
    { CODEC_FIXPT, "fixpt", s_fixpt_keys },   { CODEC_ASH_FP8, "ash-fp8", s_ash_keys },
    { CODEC_INT, "int", s_int_keys },
};
#define S_NCODECS (sizeof s_codecs / sizeof s_codecs[0])

static void s_err(char *err, size_t errlen, const char *fmt, const char *a, const char *b)
{
    if (err && errlen)
        snprintf(err, errlen, fmt, a, b);
}

static const s_key_t *s_keys_of(codec_id_t id)
{
    for (size_t i = 0; i < S_NCODECS; i++)
        if (s_codecs[i].id == id)
            return s_codecs[i].keys;
    return NULL;
}

const char *codec_name(codec_id_t id)
{
    for (size_t i = 0; i < S_NCODECS; i++)
        if (s_codecs[i].id == id)
            return s_codecs[i].name;
    return NULL;
}

int codec_id_from_name(const char *name, codec_id_t *id)
{
    for (size_t i = 0; i < S_NCODECS; i++)
        if (strcmp(s_codecs[i].name, name) == 0) {
            *id = s_codecs[i].id;
            return 0;
        }
    return TAH_ECODEC;
}

int codec_spec_default(codec_id_t id, codec_spec_t *spec)
{
    if (!codec_name(id))
        return TAH_ECODEC;
    memset(spec, 0, sizeof *spec);
    spec->id = id;
    switch (id) {
    case CODEC_TAH:
        spec->p.tah = (codec_tah_params_t){ .tile = 64, .alloc_tile = 64, .hi_frac = 0.8f, .bits_hi = 4,
                                            .bits_lo = 3, .tau = 2.0f, .rho = 1e-6f, .window = 32 };
        break;
    case CODEC_FIXPT:
        spec->p.fixpt = (codec_fixpt_params_t){ .bits = 8, .scale = 1024.0f, .group = 128, .stochastic = 0, .seed = 0 };
        break;
    case CODEC_ASH_FP8:
        spec->p.ash = (codec_ash_params_t){ .block = 256, .tau = 1.0f, .eps = 1e-12f };
        break;
    case CODEC_INT:
        spec->p.intq = (codec_int_params_t){ .bits = 4, .group = 128, .symmetric = 0 };
        break;
    default:
        break;
    }
    return 0;
}

/* Strict number parsing: the whole string, no sign on unsigned values. */
static int s_parse_value(const s_key_t *k, const char *v, codec_spec_t *spec)
{
    char *end = NULL;
    unsigned char *dst = (unsigned char *)spec + k->offset;
    if (*v == '\0')
        return TAH_EINVAL;
    errno = 0;
    if (k->kind == S_F32) {
        float f = strtof(v, &end);
        if (*end != '\0' || errno != 0 || !isfinite(f))
            return TAH_EINVAL;
        memcpy(dst, &f, sizeof f);
        return 0;
    }
    if (*v == '-' || *v == '+' || *v == ' ')
        return TAH_EINVAL;
    unsigned long long u = strtoull(v, &end, 0);
    if (*end != '\0' || errno != 0)
        return TAH_EINVAL;
    if (k->kind == S_U32) {
        if (u > UINT32_MAX)
            return TAH_EINVAL;
        uint32_t u32 = (uint32_t)u;
        memcpy(dst, &u32, sizeof u32);
    } else {
        uint64_t u64 = u;
        memcpy(dst, &u64, sizeof u64);
    }
    return 0;
}

int codec_spec_set(codec_spec_t *spec, const char *key, const char *value, char *err, size_t errlen)
{
    const s_key_t *keys = s_keys_of(spec->id);
    if (!keys) {
        s_err(err, errlen, "unknown codec id%s%s", "", "");
        return TAH_ECODEC;
    }
    for (const s_key_t *k = keys; k->name; k++) {
        if (strcmp(k->name, key) != 0)
            continue;
        if (s_parse_value(k, value, spec) != 0) {
            s_err(err, errlen, "bad value '%s' for key '%s'", value, key);
            return TAH_EPARAM;
        }
        return 0;
    }
    s_err(err, errlen, "codec '%s' has no key '%s'", codec_name(spec->id), key);
    return TAH_EPARAM;
}

int codec_spec_parse(const char *str, codec_spec_t *spec, char *err, size_t errlen)
{
    char buf[512];
    if (!str || strlen(str) >= sizeof buf) {
        s_err(err, errlen, "codec spec missing or longer than 511 characters%s%s", "", "");
        return TAH_EINVAL;
    }
    strcpy(buf, str);
    char *params = strchr(buf, ':');
    if (params)
        *params++ = '\0';
    codec_id_t id;
    if (codec_id_from_name(buf, &id) != 0) {
        s_err(err, errlen, "unknown codec '%s'%s (known: fp32, fp16, bf16, tah, fixpt, ash-fp8, int)", buf, "");
        return TAH_ECODEC;
    }
    codec_spec_t tmp;
    codec_spec_default(id, &tmp);
    if (params) {
        char *save = NULL;
        if (*params == '\0') {
            s_err(err, errlen, "empty parameter list after '%s:'%s", buf, "");
            return TAH_EPARAM;
        }
        for (char *kv = strtok_r(params, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(kv, '=');
            if (!eq) {
                s_err(err, errlen, "expected key=value, got '%s'%s", kv, "");
                return TAH_EPARAM;
            }
            *eq = '\0';
            int rc = codec_spec_set(&tmp, kv, eq + 1, err, errlen);
            if (rc != 0)
                return rc;
        }
    }
    int rc = codec_spec_validate(&tmp, err, errlen);
    if (rc != 0)
        return rc;
    *spec = tmp;
    return 0;
}

static int s_is_pow2(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

#define S_CHECK(cond, ...)                                  \
    do {                                                    \
        if (!(cond)) {                                      \
            if (err && errlen)                              \
                snprintf(err, errlen, __VA_ARGS__);         \
            return TAH_EPARAM;                              \
        }                                                   \
    } while (0)

int codec_spec_validate(const codec_spec_t *spec, char *err, size_t errlen)
{
    switch (spec->id) {
    case CODEC_FP32:
    case CODEC_FP16:
    case CODEC_BF16:
        return 0;
    case CODEC_TAH: {
        const codec_tah_params_t *t = &spec->p.tah;
        S_CHECK(s_is_pow2(t->tile) && t->tile >= 8 && t->tile <= 4096,
                "tah: tile=%u must be a power of two in 8..4096", t->tile);
        S_CHECK(t->alloc_tile >= t->tile && t->alloc_tile % t->tile == 0 && t->alloc_tile <= 65536,
                "tah: alloc_tile=%u must be a multiple of tile=%u, at most 65536", t->alloc_tile, t->tile);
        S_CHECK(isfinite(t->hi_frac) && t->hi_frac >= 0.0f && t->hi_frac <= 1.0f,
                "tah: hi_frac=%g must be in [0,1]", (double)t->hi_frac);
        S_CHECK(t->bits_hi >= 2 && t->bits_hi <= 8, "tah: bits_hi=%u must be in 2..8", t->bits_hi);
        S_CHECK(t->bits_lo >= 2 && t->bits_lo <= t->bits_hi, "tah: bits_lo=%u must be in 2..bits_hi (%u)",
                t->bits_lo, t->bits_hi);
        S_CHECK(isfinite(t->tau) && t->tau >= 0.0f, "tah: tau=%g must be finite and >= 0", (double)t->tau);
        S_CHECK(isfinite(t->rho) && t->rho >= 0.0f, "tah: rho=%g must be finite and >= 0", (double)t->rho);
        S_CHECK(t->window <= CODEC_TAH_WINDOW_MAX, "tah: window=%u must be 0 (per sample) or in 1..%u", t->window,
                CODEC_TAH_WINDOW_MAX);
        return 0;
    }
    case CODEC_FIXPT: {
        const codec_fixpt_params_t *f = &spec->p.fixpt;
        S_CHECK(f->bits >= 2 && f->bits <= 16, "fixpt: bits=%u must be in 2..16", f->bits);
        S_CHECK(isfinite(f->scale) && f->scale > 0.0f, "fixpt: scale=%g must be finite and > 0", (double)f->scale);
        S_CHECK(f->group >= 1 && f->group <= 65536, "fixpt: group=%u must be in 1..65536", f->group);
        S_CHECK(f->stochastic <= 1, "fixpt: stochastic=%u must be 0 or 1", f->stochastic);
        return 0;
    }
    case CODEC_ASH_FP8: {
        const codec_ash_params_t *a = &spec->p.ash;
        S_CHECK(s_is_pow2(a->block) && a->block >= 16 && a->block <= 65536,
                "ash-fp8: block=%u must be a power of two in 16..65536", a->block);
        S_CHECK(isfinite(a->tau) && a->tau > 0.0f, "ash-fp8: tau=%g must be finite and > 0", (double)a->tau);
        S_CHECK(isfinite(a->eps) && a->eps >= 0.0f, "ash-fp8: eps=%g must be finite and >= 0", (double)a->eps);
        return 0;
    }
    case CODEC_INT: {
        const codec_int_params_t *q = &spec->p.intq;
        S_CHECK(q->bits >= 2 && q->bits <= 8 && q->bits != 7, "int: bits=%u must be one of 2,3,4,5,6,8", q->bits);
        S_CHECK(q->group >= 1 && q->group <= 65536, "int: group=%u must be in 1..65536", q->group);
        S_CHECK(q->symmetric <= 1, "int: symmetric=%u must be 0 or 1", q->symmetric);
        return 0;
    }
    }
    if (err && errlen)
        snprintf(err, errlen, "unknown codec id %d", (int)spec->id);
    return TAH_ECODEC;
}

int codec_spec_format(const codec_spec_t *spec, char *buf, size_t buflen)
{
    const s_key_t *keys = s_keys_of(spec->id);
    if (!keys || buflen == 0)
        return TAH_EINVAL;
    size_t used = (size_t)snprintf(buf, buflen, "%s", codec_name(spec->id));
    for (const s_key_t *k = keys; k->name && used < buflen; k++) {
        const unsigned char *src = (const unsigned char *)spec + k->offset;
        char sep = (k == keys) ? ':' : ',';
        if (k->kind == S_F32) {
            float f;
            memcpy(&f, src, sizeof f);
            used += (size_t)snprintf(buf + used, buflen - used, "%c%s=%.9g", sep, k->name, (double)f);
        } else if (k->kind == S_U32) {
            uint32_t u;
            memcpy(&u, src, sizeof u);
            used += (size_t)snprintf(buf + used, buflen - used, "%c%s=%u", sep, k->name, u);
        } else {
            uint64_t u;
            memcpy(&u, src, sizeof u);
            used += (size_t)snprintf(buf + used, buflen - used, "%c%s=%llu", sep, k->name, (unsigned long long)u);
        }
    }
    return used < buflen ? 0 : TAH_ESPACE;
}

void codec_spec_derive(const codec_spec_t *base, uint64_t id, codec_spec_t *out)
{
    *out = *base;
    if (base->id == CODEC_FIXPT && base->p.fixpt.stochastic)
        out->p.fixpt.seed = codec_mix64(base->p.fixpt.seed ^ codec_mix64(id));
}

void codec_spec_for_tensor(const codec_spec_t *base, int stream, int stage, int step, int mb, codec_spec_t *out)
{
    codec_spec_t k;
    codec_spec_derive(base, ((uint64_t)(uint32_t)stream << 32) | (uint32_t)stage, &k);
    codec_spec_derive(&k, ((uint64_t)(uint32_t)step << 32) | (uint32_t)mb, out);
}
