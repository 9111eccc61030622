/* trainer.h — single-process pipeline driver: all S stages of one model in
 * one process, executing a schedule (schedule.h) over M micro-batches per step.
 * It is the reference the distributed runtime must match.
 *
 * Every stage-boundary activation is passed through the forward codec and
 * every boundary gradient through the backward codec (encode, then decode:
 * the exact bytes that would cross the wire); a NULL spec means a plain copy.
 * One step = zero grads, run every stage's action list under the
 * cross-stage dependencies, tied-embedding sync, global norm over all
 * stages, clip, AdamW on each stage. The step loss is the mean of the M
 * micro-batch losses; each micro-batch is B sequences of T tokens taken in
 * order from the data loader.
 *
 * Layer split: stage k holds layers [k*L/S, (k+1)*L/S) (trainer_split). */
#ifndef TAH_TRAINER_H
#define TAH_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"  /* ckpt_meta_t */
#include "codec.h" /* codec_spec_t */
#include "data.h"  /* data_loader_t */
#include "gpt2.h"
#include "schedule.h"
#include "stage.h"

typedef struct trainer_opts {
    gpt2_config_t cfg;
    int S;                 /* stages, 1..L */
    int M;                 /* micro-batches per step */
    int B, T;              /* micro-batch shape */
    sched_kind_t sched;
    int tied;              /* tied embeddings (1) or independent LM head (0) */
    const char *fwd_codec; /* codec spec for activations, NULL = plain copy */
    const char *bwd_codec; /* codec spec for gradients, NULL = plain copy */
    const char *tied_codec; /* tied exchange between first and last stage (S > 1), NULL = fp32 (exact) */
    int tp;                /* tensor-parallel degree of every stage (0/1 = none) */
    codec_spec_t tp_rs, tp_ag; /* its all-reduce codecs (tpcomm.h; id 0 = none) */
    optim_opts_t optim;
    int backend;           /* STAGE_CPU (0) or STAGE_CUDA: every stage */
    int device;            /* STAGE_CUDA: cuda:device (all stages share it; tp > 1: ranks on device+r ...) */
    int ndevices;          /* ... unless this is tp: rank r on devices[r] */
    int devices[TP_MAX];
    int precision;         /* STAGE_FP32 (0) or STAGE_BF16 */
} trainer_opts_t;

typedef struct trainer_stats {
    double loss;      /* mean forward loss of the step, before its update */
    float lr;
    double grad_norm; /* global norm before clipping */
} trainer_stats_t;

typedef struct trainer {
    trainer_opts_t o;
    stage_t **stages;
    sched_action_t **acts;     /* per stage, 2M actions */
    codec_spec_t fwd, bwd, tied; /* tied.id != CODEC_FP32: emulate the runtime's lossy tied exchange */
    uint8_t *rowmask;          /* (Vp) */
    int *rows;                 /* (Vp): the wte rows the step touched */
    int use_fwd, use_bwd;
    uint8_t *frame;
    size_t frame_cap;
    float *bnd_fwd, *bnd_bwd;  /* (S-1, M, B,T,C) each */
    float *tmp;                /* (B,T,C) */
    int *inputs, *targets;     /* (M, B,T) */
    float *losses;             /* (M) */
    double *norm_slots;
    size_t nnorm;
    char *done;                /* (2, S, M) schedule bookkeeping */
    int step;                  /* steps taken */
} trainer_t;

void trainer_split(int L, int S, int k, int *layer0, int *layer1);

/* init: the initial full model (copied into the stages). */
trainer_t *trainer_new(const trainer_opts_t *o, const gpt2_model_t *init, char *err, size_t errlen);
void trainer_destroy(trainer_t **self_p);

/* Forward + backward of one step's M micro-batches and the tied sync;
 * gradients are left in the stages. *loss = mean loss. */
int trainer_accumulate(trainer_t *t, data_loader_t *dl, double *loss, char *err, size_t errlen);
/* Global norm, clip, AdamW with the schedule's LR for this step. */
void trainer_apply(trainer_t *t, trainer_stats_t *st);
/* trainer_accumulate + trainer_apply. */
int trainer_step(trainer_t *t, data_loader_t *dl, trainer_stats_t *st, char *err, size_t errlen);
/* Mean loss over nbatches batches (forward only, codecs applied). */
int trainer_eval(trainer_t *t, data_loader_t *dl, int nbatches, double *loss, char *err, size_t errlen);
/* Copy the current parameters into a full model (llm.c layout). */
int trainer_export(const trainer_t *t, gpt2_model_t *m);
/* Per-stage checkpoints PREFIX.stage<k>.ckpt. */
int trainer_save_ckpt(trainer_t *t, const char *prefix, const ckpt_meta_t *meta, char *err, size_t errlen);
int trainer_load_ckpt(trainer_t *t, const char *prefix, ckpt_meta_t *meta, char *err, size_t errlen);

#endif
