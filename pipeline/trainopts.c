/* trainopts.c — tah-train's option table (see trainopts.h). */
#include "trainopts.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"  /* codec_spec_parse */
#include "errors.h"
#include "tpcomm.h" /* tp_codec_parse, TP_MAX */

typedef enum { O_PATH, O_SPEC, O_TPSPEC, O_MODEL, O_INT, O_FLOAT, O_FLAG, O_SCHED, O_LRSCHED, O_DEVICE, O_PRECISION } s_kind_t;

typedef struct s_opt {
    const char *name; /* with dashes, as on tah-train's command line */
    s_kind_t kind;
    size_t off;       /* offset in trainopts_t */
    double lo, hi;    /* accepted range (ints: inclusive; floats: see open flags) */
    int lo_open, hi_open;
} s_opt_t;

#define F(field) offsetof(trainopts_t, field)
#define OPT(field) (offsetof(trainopts_t, optim) + offsetof(optim_opts_t, field))

static const s_opt_t s_opts[] = {
    { "init-from", O_PATH, F(init_from), 0, 0, 0, 0 },
    { "model", O_MODEL, F(model), 0, 0, 0, 0 },
    { "train-data", O_PATH, F(train_data), 0, 0, 0, 0 },
    { "val-data", O_PATH, F(val_data), 0, 0, 0, 0 },
    { "batch", O_INT, F(batch), 1, 1 << 20, 0, 0 },
    { "seq", O_INT, F(seq), 1, 1 << 20, 0, 0 },
    { "steps", O_INT, F(steps), 1, 1 << 30, 0, 0 },
    { "lr", O_FLOAT, OPT(lr), 0, INFINITY, 0, 1 },
    { "lr-schedule", O_LRSCHED, OPT(schedule), 0, 0, 0, 0 },
    { "warmup", O_INT, OPT(warmup), 0, 1 << 30, 0, 0 },
    { "weight-decay", O_FLOAT, OPT(weight_decay), 0, INFINITY, 0, 1 },
    { "beta1", O_FLOAT, OPT(beta1), 0, 1, 0, 1 },
    { "beta2", O_FLOAT, OPT(beta2), 0, 1, 0, 1 },
    { "eps", O_FLOAT, OPT(eps), 0, INFINITY, 1, 1 },
    { "grad-clip", O_FLOAT, OPT(grad_clip), 0, INFINITY, 0, 1 },
    { "lr-min-frac", O_FLOAT, OPT(lr_min_frac), 0, 1, 0, 0 },
    { "stages", O_INT, F(stages), 1, 4096, 0, 0 },
    { "micro-batches", O_INT, F(micro_batches), 1, 65536, 0, 0 },
    { "schedule", O_SCHED, F(schedule), 0, 0, 0, 0 },
    { "fwd-codec", O_SPEC, F(fwd_codec), 0, 0, 0, 0 },
    { "bwd-codec", O_SPEC, F(bwd_codec), 0, 0, 0, 0 },
    { "tp", O_INT, F(tp), 1, TP_MAX, 0, 0 },
    { "tp-codec", O_TPSPEC, F(tp_codec), 0, 0, 0, 0 },
    { "tp-codec-ag", O_TPSPEC, F(tp_codec_ag), 0, 0, 0, 0 },
    { "tied-codec", O_SPEC, F(tied_codec), 0, 0, 0, 0 },
    { "threads", O_INT, F(threads), 1, 1024, 0, 0 },
    { "seed", O_INT, F(seed), 0, 2147483647.0, 0, 0 },
    { "metrics", O_PATH, F(metrics), 0, 0, 0, 0 },
    { "save", O_PATH, F(save), 0, 0, 0, 0 },
    { "val-every", O_INT, F(val_every), 1, 1 << 30, 0, 0 },
    { "val-batches", O_INT, F(val_batches), 1, 1 << 20, 0, 0 },
    { "untied", O_FLAG, F(untied), 0, 0, 0, 0 },
    { "save-ckpt", O_PATH, F(save_ckpt), 0, 0, 0, 0 },
    { "ckpt-every", O_INT, F(ckpt_every), 1, 1 << 30, 0, 0 },
    { "resume", O_PATH, F(resume), 0, 0, 0, 0 },
    { "quiet", O_FLAG, F(quiet), 0, 0, 0, 0 },
    { "device", O_DEVICE, F(device), 0, 0, 0, 0 },
    { "precision", O_PRECISION, F(precision), 0, 0, 0, 0 },
};
#define S_NOPTS (sizeof s_opts / sizeof s_opts[0])

void trainopts_defaults(trainopts_t *o)
{
    memset(o, 0, sizeof *o);
    snprintf(o->fwd_codec, sizeof o->fwd_codec, "fp32");
    snprintf(o->bwd_codec, sizeof o->bwd_codec, "fp32");
    o->stages = 1;
    o->micro_batches = 1;
    o->tp = 1;
    snprintf(o->tp_codec, sizeof o->tp_codec, "none");
    snprintf(o->tied_codec, sizeof o->tied_codec, "fp32");
    o->schedule = SCHED_1F1B;
    o->seed = 1337;
    o->val_every = 50;
    o->val_batches = 8;
    o->device = -1;
    optim_defaults(&o->optim);
}

/* "grad_clip" and "grad-clip" name the same option. */
static const s_opt_t *s_find(const char *name)
{
    for (size_t i = 0; i < S_NOPTS; i++) {
        const char *a = s_opts[i].name, *b = name;
        while (*a && (*a == *b || (*a == '-' && *b == '_'))) {
            a++;
            b++;
        }
        if (!*a && !*b)
            return &s_opts[i];
    }
    return NULL;
}

int trainopts_known(const char *name)
{
    return s_find(name) != NULL;
}

int trainopts_is_flag(const char *name)
{
    const s_opt_t *d = s_find(name);
    return d && d->kind == O_FLAG;
}

const char *const *trainopts_names(void)
{
    static const char *names[S_NOPTS + 1];
    for (size_t i = 0; i < S_NOPTS; i++)
        names[i] = s_opts[i].name;
    names[S_NOPTS] = NULL;
    return names;
}

static int s_parse_model(const char *s, gpt2_config_t *cfg)
{
    int f[6] = { 0 }, nf = 0;
    const char *p = s;
    while (*p && nf < 6) {
        char *end = NULL;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 1 || x > (1L << 24))
            break;
        f[nf++] = (int)x;
        p = end;
        if (*p == ',')
            p++;
        else
            break;
    }
    if (*p || (nf != 5 && nf != 6))
        return -1;
    *cfg = (gpt2_config_t){ .L = f[0], .NH = f[1], .C = f[2], .maxT = f[3], .V = f[4],
                            .Vp = nf == 6 ? f[5] : gpt2_padded_vocab(f[4]) };
    return 0;
}

int trainopts_set(trainopts_t *o, const char *name, const char *value, char *err, size_t errlen)
{
    const s_opt_t *d = s_find(name);
    char *base = (char *)o;
    if (!d) {
        if (err)
            snprintf(err, errlen, "unknown option '%s'", name);
        return TAH_EINVAL;
    }
    const char *why = NULL;
    char range[128] = "", dwhy[160] = "";
    switch (d->kind) {
    case O_PATH:
    case O_SPEC:
    case O_TPSPEC: {
        size_t cap = d->kind == O_PATH ? TRAINOPTS_PATH : TRAINOPTS_SPEC;
        if (!*value)
            why = "must not be empty";
        else if (strlen(value) >= cap)
            why = "is too long";
        else if (d->kind != O_PATH) {
            codec_spec_t cs;
            char cerr[256] = "";
            int bad = d->kind == O_SPEC ? codec_spec_parse(value, &cs, cerr, sizeof cerr)
                                        : tp_codec_parse(value, &cs, cerr, sizeof cerr);
            if (bad == 0 && cs.id == CODEC_TAH && d->off == F(tied_codec)) {
                bad = TAH_EINVAL;
                snprintf(cerr, sizeof cerr, "TAH-Quant is for (B,T,C) activations; use fp32, fp16, bf16, fixpt, "
                         "ash-fp8 or int");
            }
            if (bad != 0) {
                if (err)
                    snprintf(err, errlen, "%s = '%s': %s", d->name, value, cerr);
                return TAH_EINVAL;
            }
        }
        if (!why)
            snprintf(base + d->off, cap, "%s", value);
        break;
    }
    case O_MODEL:
        if (strlen(value) >= sizeof o->model || s_parse_model(value, &o->mcfg) != 0)
            why = "wants L,NH,C,maxT,V[,Vp] (positive integers)";
        else
            snprintf(o->model, sizeof o->model, "%s", value);
        break;
    case O_INT: {
        char *end = NULL;
        errno = 0;
        long v = strtol(value, &end, 10);
        if (errno || end == value || *end || v < (long)d->lo || v > (long)d->hi) {
            why = "is not an integer in range";
            snprintf(range, sizeof range, " %ld..%ld", (long)d->lo, (long)d->hi);
        } else {
            *(int *)(base + d->off) = (int)v;
        }
        break;
    }
    case O_FLOAT: {
        char *end = NULL;
        errno = 0;
        double v = strtod(value, &end);
        int bad = errno || end == value || *end || !isfinite(v);
        if (!bad)
            bad = d->lo_open ? !(v > d->lo) : !(v >= d->lo);
        if (!bad && isfinite(d->hi))
            bad = d->hi_open ? !(v < d->hi) : !(v <= d->hi);
        if (bad) {
            why = "is not a number in range";
            snprintf(range, sizeof range, " %s%g, %g%s", d->lo_open ? "(" : "[", d->lo, d->hi, d->hi_open ? ")" : "]");
        } else {
            *(float *)(base + d->off) = (float)v;
            if (d->off == OPT(lr))
                o->have_lr = 1;
        }
        break;
    }
    case O_FLAG:
        if (!strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "yes") || !strcmp(value, "on"))
            *(int *)(base + d->off) = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false") || !strcmp(value, "no") || !strcmp(value, "off"))
            *(int *)(base + d->off) = 0;
        else
            why = "wants true or false";
        break;
    case O_SCHED:
        if (sched_parse(value, &o->schedule) != 0)
            why = "wants 1f1b or gpipe";
        break;
    case O_DEVICE: {
        if (trainopts_parse_device(value, &o->device, &o->ndevices, o->devices, dwhy, sizeof dwhy) != 0)
            why = dwhy;
        break;
    }
    case O_PRECISION:
        if (!strcmp(value, "fp32"))
            o->precision = 0;
        else if (!strcmp(value, "bf16"))
            o->precision = 1;
        else
            why = "wants fp32 or bf16";
        break;
    case O_LRSCHED:
        if (!strcmp(value, "constant"))
            o->optim.schedule = OPTIM_CONSTANT;
        else if (!strcmp(value, "cosine"))
            o->optim.schedule = OPTIM_COSINE;
        else
            why = "wants constant or cosine";
        break;
    }
    if (why) {
        if (err)
            snprintf(err, errlen, "%s = '%s' %s%s", d->name, value, why, range);
        return TAH_EINVAL;
    }
    return 0;
}

int trainopts_check(const trainopts_t *o, char *err, size_t errlen)
{
    const char *why = NULL;
    char buf[512];
    if (!!o->init_from[0] == !!o->model[0])
        why = "give exactly one of init_from or model";
    else if (!o->train_data[0])
        why = "train_data is required";
    else if (!o->batch || !o->seq || !o->steps || !o->have_lr)
        why = "batch, seq, steps and lr are required";
    else if (o->model[0]) {
        if (gpt2_config_validate(&o->mcfg, buf, sizeof buf) != 0)
            why = buf;
        else if (o->seq > o->mcfg.maxT) {
            snprintf(buf, sizeof buf, "seq %d exceeds the model's maxT = %d", o->seq, o->mcfg.maxT);
            why = buf;
        } else if (o->stages > o->mcfg.L) {
            snprintf(buf, sizeof buf, "stages %d exceeds the model's %d layers (each stage needs >= 1)", o->stages,
                     o->mcfg.L);
            why = buf;
        } else if (o->tp > 1 && o->mcfg.NH % o->tp != 0) {
            snprintf(buf, sizeof buf, "tp %d must divide the model's NH = %d attention heads", o->tp, o->mcfg.NH);
            why = buf;
        }
    }
    if (!why && o->ndevices > 0 && o->ndevices != o->tp) {
        snprintf(buf, sizeof buf, "device lists %d GPUs but tp is %d: one GPU per tensor-parallel rank (cuda:K "
                 "puts rank r on GPU K+r)", o->ndevices, o->tp);
        why = buf;
    }
    if (why) {
        if (err)
            snprintf(err, errlen, "%s", why);
        return TAH_EINVAL;
    }
    return 0;
}

int trainopts_parse_device(const char *value, int *device, int *ndevices, int devices[TP_MAX], char *err,
                           size_t errlen)
{
    int list[TP_MAX], n = 0;
    const char *why = NULL;
    if (!strcmp(value, "cpu")) {
        *device = -1;
        *ndevices = 0;
        return 0;
    }
    if (strncmp(value, "cuda:", 5) != 0) {
        why = "wants cpu, cuda:K or cuda:K,L,... (K = 0..1023)";
    } else {
        const char *p = value + 5;
        for (;;) {
            char *end = NULL;
            errno = 0;
            long k = strtol(p, &end, 10);
            if (errno || end == p || k < 0 || k > 1023 || (*end && *end != ',') || *p == '-' || *p == '+' ||
                *p == ' ') {
                why = "wants cpu, cuda:K or cuda:K,L,... (K = 0..1023)";
                break;
            }
            if (n == TP_MAX) {
                why = "lists more GPUs than the largest tensor-parallel degree (8)";
                break;
            }
            for (int j = 0; j < n && !why; j++)
                if (list[j] == (int)k)
                    why = "lists a GPU twice (one GPU per tensor-parallel rank)";
            if (why)
                break;
            list[n++] = (int)k;
            if (!*end)
                break;
            p = end + 1;
        }
    }
    if (why) {
        if (err)
            snprintf(err, errlen, "%s", why);
        return TAH_EINVAL;
    }
    *device = list[0];
    *ndevices = n > 1 ? n : 0;
    for (int j = 0; j < TP_MAX; j++)
        devices[j] = j < n ? list[j] : 0;
    return 0;
}

int trainopts_tp_codecs(const trainopts_t *o, codec_spec_t *rs, codec_spec_t *ag, char *err, size_t errlen)
{
    const char *a = o->tp_codec[0] ? o->tp_codec : "none", *b = o->tp_codec_ag[0] ? o->tp_codec_ag : a;
    char cerr[256] = "";
    int rc = tp_codec_parse(a, rs, cerr, sizeof cerr);
    if (!rc)
        rc = tp_codec_parse(b, ag, cerr, sizeof cerr);
    if (rc && err)
        snprintf(err, errlen, "tp codec: %s", cerr);
    return rc;
}
