/* trainer.c — single-process pipeline driver (see trainer.h). */
#include "trainer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

void trainer_split(int L, int S, int k, int *layer0, int *layer1)
{
    *layer0 = (int)((long long)k * L / S);
    *layer1 = (int)((long long)(k + 1) * L / S);
}

trainer_t *trainer_new(const trainer_opts_t *o, const gpt2_model_t *init, char *err, size_t errlen)
{
    trainer_t *t = NULL;
    if (gpt2_config_validate(&o->cfg, err, errlen) != 0)
        return NULL;
    if (o->S < 1 || o->S > o->cfg.L || o->M < 1 || o->M > 65536) {
        if (err)
            snprintf(err, errlen, "bad pipeline: stages S = %d must be 1..L (%d), micro-batches M = %d must be >= 1",
                     o->S, o->cfg.L, o->M);
        return NULL;
    }
    t = calloc(1, sizeof *t);
    if (!t)
        goto nomem;
    t->o = *o;
    t->o.fwd_codec = t->o.bwd_codec = t->o.tied_codec = NULL; /* not owned; parsed below */
    const int S = o->S, M = o->M;
    const size_t BT = (size_t)o->B * o->T, BTC = BT * o->cfg.C;
    if (o->fwd_codec) {
        if (codec_spec_parse(o->fwd_codec, &t->fwd, err, errlen) != 0)
            goto fail;
        t->use_fwd = 1;
    }
    if (o->bwd_codec) {
        if (codec_spec_parse(o->bwd_codec, &t->bwd, err, errlen) != 0)
            goto fail;
        t->use_bwd = 1;
    }
    codec_spec_default(CODEC_FP32, &t->tied);
    if (o->tied_codec && codec_spec_parse(o->tied_codec, &t->tied, err, errlen) != 0)
        goto fail;
    if (t->tied.id != CODEC_FP32 && o->tied && S > 1 &&
        (!(t->rowmask = malloc((size_t)o->cfg.Vp)) || !(t->rows = malloc((size_t)o->cfg.Vp * sizeof(int)))))
        goto nomem;
    codec_shape_t shape = { (uint32_t)o->B, (uint32_t)o->T, (uint32_t)o->cfg.C };
    for (int dir = 0; dir < 2; dir++) {
        if (!(dir ? t->use_bwd : t->use_fwd))
            continue;
        int64_t fs = codec_frame_size(dir ? &t->bwd : &t->fwd, shape);
        if (fs < 0) {
            if (err)
                snprintf(err, errlen, "%s codec cannot encode a (%d,%d,%d) tensor: %s",
                         dir ? "backward" : "forward", o->B, o->T, o->cfg.C, tah_strerror((int)fs));
            goto fail;
        }
        if ((size_t)fs > t->frame_cap)
            t->frame_cap = (size_t)fs;
    }
    if (t->frame_cap && !(t->frame = malloc(t->frame_cap)))
        goto nomem;

    t->stages = calloc((size_t)S, sizeof *t->stages);
    t->acts = calloc((size_t)S, sizeof *t->acts);
    if (!t->stages || !t->acts)
        goto nomem;
    for (int k = 0; k < S; k++) {
        stage_opts_t so = { .cfg = o->cfg, .B = o->B, .T = o->T, .tied = o->tied, .backend = o->backend,
                            .device = o->device, .ndevices = o->ndevices, .precision = o->precision,
                            .tp = o->tp, .tp_rs = o->tp_rs, .tp_ag = o->tp_ag };
        memcpy(so.devices, o->devices, sizeof so.devices);
        trainer_split(o->cfg.L, S, k, &so.layer0, &so.layer1);
        so.first = k == 0;
        so.last = k == S - 1;
        so.nslots = sched_max_inflight(o->sched, S, M, k);
        t->stages[k] = stage_new(&so, err, errlen);
        if (!t->stages[k])
            goto fail;
        if (stage_load_params(t->stages[k], init) != 0) {
            if (err)
                snprintf(err, errlen, "initial model config does not match the trainer's");
            goto fail;
        }
        t->acts[k] = malloc(2 * (size_t)M * sizeof(sched_action_t));
        if (!t->acts[k])
            goto nomem;
        if (sched_build(o->sched, S, M, k, t->acts[k]) != 0) {
            if (err)
                snprintf(err, errlen, "unknown schedule");
            goto fail;
        }
    }
    size_t nb = (size_t)(S - 1) * M * BTC;
    t->bnd_fwd = malloc((nb ? nb : 1) * sizeof(float));
    t->bnd_bwd = malloc((nb ? nb : 1) * sizeof(float));
    t->tmp = malloc(BTC * sizeof(float));
    t->inputs = malloc((size_t)M * BT * sizeof(int));
    t->targets = malloc((size_t)M * BT * sizeof(int));
    t->losses = malloc((size_t)M * sizeof(float));
    t->nnorm = stage_norm_nslots(&o->cfg);
    t->norm_slots = malloc(t->nnorm * sizeof(double));
    t->done = malloc(2 * (size_t)S * M);
    if (!t->bnd_fwd || !t->bnd_bwd || !t->tmp || !t->inputs || !t->targets || !t->losses ||
        !t->norm_slots || !t->done)
        goto nomem;
    return t;
nomem:
    if (err)
        snprintf(err, errlen, "out of memory building the pipeline (S=%d, M=%d, B=%d, T=%d)", o->S,
                 o->M, o->B, o->T);
fail:
    trainer_destroy(&t);
    return NULL;
}

void trainer_destroy(trainer_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    trainer_t *t = *self_p;
    for (int k = 0; t->stages && k < t->o.S; k++)
        stage_destroy(&t->stages[k]);
    for (int k = 0; t->acts && k < t->o.S; k++)
        free(t->acts[k]);
    free(t->stages);
    free(t->acts);
    free(t->frame);
    free(t->bnd_fwd);
    free(t->bnd_bwd);
    free(t->tmp);
    free(t->inputs);
    free(t->targets);
    free(t->rowmask);
    free(t->rows);
    free(t->losses);
    free(t->norm_slots);
    free(t->done);
    free(t);
    *self_p = NULL;
}

/* What crosses a stage boundary from stage `from`: codec frame round trip
 * (micro-batch mb of this step, with tah-node's per-tensor spec:
 * codec_spec_for_tensor), or a copy. */
static int s_transfer(trainer_t *t, int backward, int from, int mb, const float *src, float *dst, char *err,
                      size_t errlen)
{
    size_t n = (size_t)t->o.B * t->o.T * t->o.cfg.C;
    int use = backward ? t->use_bwd : t->use_fwd;
    if (!use) {
        memcpy(dst, src, n * sizeof(float));
        return 0;
    }
    codec_spec_t spec_m;
    codec_spec_for_tensor(backward ? &t->bwd : &t->fwd, backward ? CODEC_STREAM_BWD : CODEC_STREAM_FWD, from, t->step + 1,
                          mb, &spec_m);
    const codec_spec_t *spec = &spec_m;
    codec_shape_t shape = { (uint32_t)t->o.B, (uint32_t)t->o.T, (uint32_t)t->o.cfg.C };
    size_t written = 0;
    char cerr[CODEC_ERRLEN] = "";
    int rc = codec_encode(spec, shape, src, t->frame, t->frame_cap, &written, cerr, sizeof cerr);
    if (!rc)
        rc = codec_decode(t->frame, written, dst, n, NULL, cerr, sizeof cerr);
    if (rc && err)
        snprintf(err, errlen, "step %d: %s codec at a stage boundary failed: %s (%s)", t->step + 1,
                 backward ? "backward" : "forward", cerr, tah_strerror(rc));
    return rc;
}

int trainer_accumulate(trainer_t *t, data_loader_t *dl, double *loss, char *err, size_t errlen)
{
    const int S = t->o.S, M = t->o.M;
    const size_t BT = (size_t)t->o.B * t->o.T, BTC = BT * t->o.cfg.C;
    const float dloss = 1.0f / (float)((double)BT * M);
    for (int m = 0; m < M; m++)
        data_next_batch(dl, t->inputs + m * BT, t->targets + m * BT);
    for (int k = 0; k < S; k++)
        stage_zero_grad(t->stages[k]);
    char *fdone = t->done, *bdone = t->done + (size_t)S * M;
    memset(t->done, 0, 2 * (size_t)S * M);
    int pos[S > 0 ? S : 1];
    memset(pos, 0, sizeof pos);
    int remaining = 2 * S * M;
    while (remaining > 0) {
        int progress = 0;
        for (int k = 0; k < S; k++) {
            while (pos[k] < 2 * M) {
                sched_action_t a = t->acts[k][pos[k]];
                int m = a.mb, rc;
                stage_t *st = t->stages[k];
                if (a.op == SCHED_F) {
                    if (k > 0 && !fdone[(k - 1) * M + m])
                        break;
                    const float *in = k > 0 ? t->bnd_fwd + ((size_t)(k - 1) * M + m) * BTC : NULL;
                    rc = stage_forward(st, m, t->inputs + m * BT, in, t->targets + m * BT,
                                       k < S - 1 ? t->tmp : NULL, &t->losses[m]);
                    if (!rc && k < S - 1)
                        rc = s_transfer(t, 0, k, m, t->tmp, t->bnd_fwd + ((size_t)k * M + m) * BTC, err, errlen);
                    fdone[k * M + m] = 1;
                } else {
                    if (k < S - 1 ? !bdone[(k + 1) * M + m] : !fdone[k * M + m])
                        break;
                    const float *dout = k < S - 1 ? t->bnd_bwd + ((size_t)k * M + m) * BTC : NULL;
                    rc = stage_backward(st, m, dout, dloss, k > 0 ? t->tmp : NULL);
                    if (!rc && k > 0)
                        rc = s_transfer(t, 1, k, m, t->tmp, t->bnd_bwd + ((size_t)(k - 1) * M + m) * BTC, err, errlen);
                    bdone[k * M + m] = 1;
                }
                if (rc) {
                    if (err && *stage_error(st))
                        snprintf(err, errlen, "step %d: stage %d, micro-batch %d: %s", t->step + 1, k, m,
                                 stage_error(st));
                    else if (err && rc == TAH_EINVAL)
                        snprintf(err, errlen, "schedule error: stage %d cannot run %c%d", k,
                                 a.op == SCHED_F ? 'F' : 'B', m);
                    return rc;
                }
                pos[k]++;
                remaining--;
                progress = 1;
            }
        }
        if (!progress) {
            if (err)
                snprintf(err, errlen, "schedule %s deadlocked with S=%d, M=%d", sched_name(t->o.sched), S, M);
            return TAH_EINVAL;
        }
    }
    if (t->o.tied && S > 1 && t->tied.id != CODEC_FP32) {
        /* as tah-node: the first stage's touched rows cross the link through
         * the tied codec (the last stage's gradient stays where it is) */
        stage_t *f = t->stages[0];
        size_t nrows = stage_tied_rows(t->inputs, (size_t)M * BT, t->o.cfg.Vp, t->rowmask, t->rows);
        char cerr[256] = "";
        codec_spec_t tspec;
        codec_spec_for_tensor(&t->tied, CODEC_STREAM_TIED, 0, t->step + 1, 0, &tspec);
        int rc = stage_sync_to_host(f, STAGE_SYNC_TIED) ? TAH_EDEVICE : 0;
        if (!rc)
            rc = stage_tied_codec(&tspec, f->g[GPT2_WTE], t->o.cfg.Vp, t->o.cfg.C, t->rows, nrows, NULL, NULL, 0,
                                  cerr, sizeof cerr);
        if (!rc && stage_sync_to_device(f, STAGE_SYNC_TIED))
            rc = TAH_EDEVICE;
        if (rc) {
            if (err)
                snprintf(err, errlen, "step %d: tied-embedding codec failed: %s (%s)", t->step + 1,
                         rc == TAH_EDEVICE ? stage_error(f) : cerr, tah_strerror(rc));
            return rc;
        }
    }
    if (t->o.tied)
        stage_tied_sync(t->stages[0], t->stages[S - 1]);
    double sum = 0.0;
    for (int m = 0; m < M; m++)
        sum += t->losses[m];
    *loss = sum / M;
    return 0;
}

void trainer_apply(trainer_t *t, trainer_stats_t *st)
{
    memset(t->norm_slots, 0, t->nnorm * sizeof(double));
    for (int k = 0; k < t->o.S; k++)
        stage_grad_sumsq(t->stages[k], t->norm_slots);
    double norm = stage_norm_total(t->norm_slots, t->nnorm);
    float scale = optim_clip_scale(norm, t->o.optim.grad_clip);
    float lr = optim_lr(&t->o.optim, t->step);
    for (int k = 0; k < t->o.S; k++)
        stage_step(t->stages[k], &t->o.optim, lr, scale);
    t->step++;
    st->lr = lr;
    st->grad_norm = norm;
}

int trainer_step(trainer_t *t, data_loader_t *dl, trainer_stats_t *st, char *err, size_t errlen)
{
    double loss = 0.0;
    int rc = trainer_accumulate(t, dl, &loss, err, errlen);
    if (rc)
        return rc;
    trainer_apply(t, st);
    st->loss = loss;
    return 0;
}

int trainer_eval(trainer_t *t, data_loader_t *dl, int nbatches, double *loss, char *err, size_t errlen)
{
    const int S = t->o.S;
    double sum = 0.0;
    float *a = t->tmp, *b = t->bnd_fwd; /* bnd_fwd is free between steps */
    float *other = S > 1 ? b : a;
    for (int i = 0; i < nbatches; i++) {
        data_next_batch(dl, t->inputs, t->targets);
        for (int k = 0; k < S; k++) {
            float l = 0.0f;
            int rc = stage_forward(t->stages[k], 0, t->inputs, other, t->targets, a, &l);
            stage_discard(t->stages[k], 0);
            if (rc && err && *stage_error(t->stages[k]))
                snprintf(err, errlen, "evaluation: stage %d: %s", k, stage_error(t->stages[k]));
            if (!rc && k < S - 1)
                rc = s_transfer(t, 0, k, i, a, other, err, errlen);
            if (rc)
                return rc;
            if (k == S - 1)
                sum += l;
        }
    }
    *loss = nbatches > 0 ? sum / nbatches : 0.0;
    return 0;
}

int trainer_export(const trainer_t *t, gpt2_model_t *m)
{
    for (int k = 0; k < t->o.S; k++) {
        int rc = stage_store_params(t->stages[k], m);
        if (rc)
            return rc;
    }
    return 0;
}

static void s_ckpt_path(char *buf, size_t n, const char *prefix, int k)
{
    snprintf(buf, n, "%s.stage%d.ckpt", prefix, k);
}

int trainer_save_ckpt(trainer_t *t, const char *prefix, const ckpt_meta_t *meta, char *err, size_t errlen)
{
    char path[4096];
    for (int k = 0; k < t->o.S; k++) {
        s_ckpt_path(path, sizeof path, prefix, k);
        int rc = ckpt_save(t->stages[k], path, meta, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

int trainer_load_ckpt(trainer_t *t, const char *prefix, ckpt_meta_t *meta, char *err, size_t errlen)
{
    char path[4096];
    for (int k = 0; k < t->o.S; k++) {
        s_ckpt_path(path, sizeof path, prefix, k);
        ckpt_meta_t mk;
        int rc = ckpt_load(t->stages[k], path, &mk, err, errlen);
        if (rc)
            return rc;
        if (k == 0 && meta)
            *meta = mk;
        if (k == 0)
            t->step = (int)mk.step;
    }
    return 0;
}
