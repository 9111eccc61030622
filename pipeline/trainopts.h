/* trainopts.h — tah-train's options as one struct and one table, so that a
 * command line and a distributed job file (INI, keys = long options with
 * dashes turned into underscores) describe the same run.
 *
 * trainopts_set(o, "grad-clip" or "grad_clip", "1.0") parses and range-checks
 * one option exactly as tah-train does (same ranges, same defaults);
 * trainopts_check verifies the required ones and the cross-option rules
 * that need no files (exactly one of init_from/model, codecs parse,
 * stages <= L, seq <= maxT and tp dividing NH for --model). tp codecs are
 * "none" or a codec spec (tpcomm.h, tp_codec_parse). Flags (untied, quiet) take
 * true/false/yes/no/1/0.
 *
 * Memory: strings are copied into the struct (fixed-size fields); nothing
 * to free. */
#ifndef TAH_TRAINOPTS_H
#define TAH_TRAINOPTS_H

#include <stddef.h>

#include "codec.h"    /* codec_spec_t */
#include "gpt2.h"     /* gpt2_config_t */
#include "optim.h"    /* optim_opts_t */
#include "schedule.h" /* sched_kind_t */
#include "tpcomm.h"   /* TP_MAX */

#define TRAINOPTS_PATH 1024
#define TRAINOPTS_SPEC 256

typedef struct trainopts {
    char init_from[TRAINOPTS_PATH];
    char model[128];          /* "L,NH,C,maxT,V[,Vp]" as given */
    gpt2_config_t mcfg;       /* parsed model (when model is set) */
    char train_data[TRAINOPTS_PATH], val_data[TRAINOPTS_PATH];
    char metrics[TRAINOPTS_PATH], save[TRAINOPTS_PATH];
    char save_ckpt[TRAINOPTS_PATH], resume[TRAINOPTS_PATH];
    char fwd_codec[TRAINOPTS_SPEC], bwd_codec[TRAINOPTS_SPEC];
    int tp;                   /* tensor-parallel degree of every stage (1) */
    char tp_codec[TRAINOPTS_SPEC];    /* its all-reduce codec, reduce-scatter shot ("none") */
    char tp_codec_ag[TRAINOPTS_SPEC]; /* all-gather shot; "" = the same as tp_codec */
    char tied_codec[TRAINOPTS_SPEC];  /* tied-embedding gradient exchange between first and last stage ("fp32") */
    int batch, seq, steps;    /* required */
    int have_lr;
    int stages, micro_batches;
    sched_kind_t schedule;
    int threads;              /* 0 = all cores */
    int seed;
    int val_every, val_batches;
    int untied, quiet;
    int ckpt_every;           /* 0 = only at the end (with save_ckpt) */
    int device;               /* "cpu" = -1 (default), "cuda:K" = K, "cuda:K,L,..." = K (the first) */
    int ndevices;             /* "cuda:K,L,...": the list's length (2..TP_MAX), else 0 */
    int devices[TP_MAX];      /* the list: one GPU per tensor-parallel rank */
    int precision;            /* STAGE_FP32 (0, "fp32") or STAGE_BF16 ("bf16"; cuda only: tah-train refuses it
                                 on the cpu, a job file's applies to its GPU nodes, CPU nodes run fp32) */
    optim_opts_t optim;       /* lr, schedule, warmup, ... */
} trainopts_t;

/* tah-train's defaults. */
void trainopts_defaults(trainopts_t *o);
/* 1 if name (dashes or underscores) is one of tah-train's options. */
int trainopts_known(const char *name);
/* 1 if it is a flag (no value on tah-train's command line). */
int trainopts_is_flag(const char *name);
/* Every option name (dashes), NULL-terminated. */
const char *const *trainopts_names(void);
/* Parse one option. 0, or TAH_EINVAL with a message naming the value and
 * the accepted range (err may be NULL). */
int trainopts_set(trainopts_t *o, const char *name, const char *value, char *err, size_t errlen);
/* Required options and cross-option rules; 0 or TAH_EINVAL with a message. */
int trainopts_check(const trainopts_t *o, char *err, size_t errlen);
/* The one parser of a device option (tah-train --device, tah-node join
 * --device, a job file's device): "cpu" (device -1), "cuda:K" (K; its
 * tensor-parallel ranks on K, K+1, ...), or "cuda:K,L,..." (2..TP_MAX
 * distinct GPUs, one per rank: *ndevices = the count, devices[] the list,
 * *device = the first). GPU indices 0..1023. 0, or TAH_EINVAL with why
 * (err, may be NULL) filled. */
int trainopts_parse_device(const char *value, int *device, int *ndevices, int devices[TP_MAX], char *err,
                           size_t errlen);
/* The two all-reduce codecs (the all-gather one defaults to tp_codec). */
int trainopts_tp_codecs(const trainopts_t *o, codec_spec_t *rs, codec_spec_t *ag, char *err, size_t errlen);

#endif
