/* stage.c — a GPT-2 pipeline stage on the CPU (see stage.h). */
#include "stage.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h" /* blocks_init, blocks_forward, blocks_backward */
#include "errors.h"
#include "layers.h"
#include "stage_backend.h" /* the CUDA backend's table */

#define S_NORM_CHUNK 65536

static const stage_backend_t *s_backend; /* STAGE_CUDA, when registered */

void stage_backend_register(const stage_backend_t *b)
{
    s_backend = b;
}

const stage_backend_t *stage_backend_get(void)
{
    return s_backend;
}

/* ---- size tables ---- */

size_t stage_param_sizes(const stage_opts_t *o, size_t sizes[STAGE_NTENSORS])
{
    size_t total = 0;
    int nl = o->layer1 - o->layer0;
    for (int i = 0; i < STAGE_NTENSORS; i++) {
        size_t n = 0;
        if (i == GPT2_WTE || i == GPT2_WPE)
            n = o->first ? gpt2_tensor_layer_size(&o->cfg, i) : 0;
        else if (gpt2_tensor_per_layer(i))
            n = gpt2_tensor_layer_size(&o->cfg, i) * (size_t)nl;
        else if (i == GPT2_LNFW || i == GPT2_LNFB)
            n = o->last ? gpt2_tensor_layer_size(&o->cfg, i) : 0;
        else if (i == STAGE_HEAD)
            n = o->last ? gpt2_tensor_layer_size(&o->cfg, GPT2_WTE) : 0;
        sizes[i] = n;
        total += n;
    }
    return total;
}

int stage_device(const stage_opts_t *o, int r)
{
    return o->ndevices > 0 ? o->devices[r] : o->device + r;
}

const char *stage_tensor_name(int i)
{
    return i == STAGE_HEAD ? "head" : gpt2_tensor_name(i);
}

enum {
    A_IN, A_LN1, A_LN1_MEAN, A_LN1_RSTD, A_QKV, A_ATTY, A_ATT, A_RES2, A_LN2, A_LN2_MEAN,
    A_LN2_RSTD, A_FCH, A_FCHG, A_RES3, A_LNF, A_LNF_MEAN, A_LNF_RSTD, A_LOGITS, A_LOSSES, A_N
};

static size_t s_act_sizes(const stage_opts_t *o, size_t a[A_N])
{
    size_t B = (size_t)o->B, T = (size_t)o->T, C = (size_t)o->cfg.C, NH = (size_t)o->cfg.NH;
    size_t nl = (size_t)(o->layer1 - o->layer0), BT = B * T;
    size_t lastf = o->last ? 1 : 0;
    a[A_IN] = BT * C;
    a[A_LN1] = nl * BT * C;
    a[A_LN1_MEAN] = a[A_LN1_RSTD] = nl * BT;
    a[A_QKV] = nl * BT * 3 * C;
    a[A_ATTY] = nl * BT * C;
    a[A_ATT] = nl * B * NH * T * T;
    a[A_RES2] = nl * BT * C;
    a[A_LN2] = nl * BT * C;
    a[A_LN2_MEAN] = a[A_LN2_RSTD] = nl * BT;
    a[A_FCH] = a[A_FCHG] = nl * BT * 4 * C;
    a[A_RES3] = nl * BT * C;
    a[A_LNF] = lastf * BT * C;
    a[A_LNF_MEAN] = a[A_LNF_RSTD] = lastf * BT;
    a[A_LOGITS] = lastf * BT * (size_t)o->cfg.Vp;
    a[A_LOSSES] = lastf * BT;
    size_t total = 0;
    for (int i = 0; i < A_N; i++)
        total += a[i];
    return total;
}

/* ---- life cycle ---- */

static int s_validate(const stage_opts_t *o, char *err, size_t errlen)
{
    int rc = gpt2_config_validate(&o->cfg, err, errlen);
    if (rc)
        return rc;
    const char *what = NULL;
    if (o->layer0 < 0 || o->layer1 > o->cfg.L || o->layer1 <= o->layer0)
        what = "layer range";
    else if (o->first != (o->layer0 == 0) || o->last != (o->layer1 == o->cfg.L))
        what = "first/last flags (first stage starts at layer 0, last ends at L)";
    else if (o->B < 1 || o->B > (1 << 20))
        what = "micro-batch size B";
    else if (o->T < 1 || o->T > o->cfg.maxT)
        what = "sequence length T (must be 1..maxT)";
    else if (o->nslots < 1 || o->nslots > 4096)
        what = "number of in-flight slots";
    else if (o->backend != STAGE_CPU && o->backend != STAGE_CUDA)
        what = "backend";
    else if (o->precision != STAGE_FP32 && o->precision != STAGE_BF16)
        what = "precision (fp32 or bf16)";
    else if (o->backend == STAGE_CPU && o->precision != STAGE_FP32)
        what = "precision (the cpu backend computes in fp32 only)";
    else if (o->tp < 0 || o->tp > TP_MAX || (o->tp > 1 && o->cfg.NH % o->tp != 0)) {
        if (err)
            snprintf(err, errlen, "bad stage options: tensor-parallel degree tp=%d must be 1..%d and divide the number "
                                  "of heads NH=%d (then it divides C=%d and 4C)", o->tp, TP_MAX, o->cfg.NH, o->cfg.C);
        return TAH_EINVAL;
    }
    if (!what && o->backend == STAGE_CUDA) {
        const int tp = o->tp > 1 ? o->tp : 1;
        const char *dwhy = NULL;
        if (o->ndevices != 0 && o->ndevices != tp)
            dwhy = "the device list must name one GPU per tensor-parallel rank";
        for (int r = 0; r < tp && !dwhy; r++) {
            const int d = stage_device(o, r);
            if (d < 0 || d > 1023)
                dwhy = "GPU indices are 0..1023";
            for (int q = 0; q < r && !dwhy; q++)
                if (stage_device(o, q) == d)
                    dwhy = "a GPU appears twice in the device list (one GPU per rank)";
        }
        if (dwhy) {
            if (err)
                snprintf(err, errlen, "bad stage options: devices: %s (tp=%d, device cuda:%d, %d listed)", dwhy, tp,
                         o->device, o->ndevices);
            return TAH_EINVAL;
        }
    }
    if (what) {
        if (err)
            snprintf(err, errlen, "bad stage options: %s (layers %d..%d of L=%d, B=%d, T=%d, maxT=%d, slots=%d)",
                     what, o->layer0, o->layer1, o->cfg.L, o->B, o->T, o->cfg.maxT, o->nslots);
        return TAH_EINVAL;
    }
    return 0;
}

stage_t *stage_new(const stage_opts_t *o, char *err, size_t errlen)
{
    if (s_validate(o, err, errlen) != 0)
        return NULL;
    stage_t *s = calloc(1, sizeof *s);
    if (!s)
        goto nomem;
    s->o = *o;
    s->nl = o->layer1 - o->layer0;
    s->nparams = stage_param_sizes(o, s->sizes);
    s->params = calloc(s->nparams, sizeof(float));
    s->grads = calloc(s->nparams, sizeof(float));
    s->moments = calloc(2 * s->nparams, sizeof(float));
    if (!s->params || !s->grads || !s->moments)
        goto nomem;
    size_t off = 0;
    for (int i = 0; i < STAGE_NTENSORS; i++) {
        s->p[i] = s->sizes[i] ? s->params + off : NULL;
        s->g[i] = s->sizes[i] ? s->grads + off : NULL;
        s->m[i] = s->sizes[i] ? s->moments + off : NULL;
        s->v[i] = s->sizes[i] ? s->moments + s->nparams + off : NULL;
        off += s->sizes[i];
    }
    if (o->backend == STAGE_CUDA) {
        if (!s_backend) {
            if (err)
                snprintf(err, errlen, "cuda:%d: this program was built without the CUDA backend "
                         "(TAH_CUDA=OFF or no nvcc); HINT: --device cpu", o->device);
            stage_destroy(&s);
            return NULL;
        }
        s->cu = s_backend->create(s, err, errlen);
        if (!s->cu) {
            stage_destroy(&s);
            return NULL;
        }
        return s;
    }

    /* activations: nslots x size table */
    size_t asz[A_N];
    size_t per_slot = s_act_sizes(o, asz);
    size_t BT = (size_t)o->B * o->T;
    s->acts = malloc((size_t)o->nslots * per_slot * sizeof(float));
    s->acts_i = malloc((size_t)o->nslots * 2 * BT * sizeof(int));
    s->slots = calloc((size_t)o->nslots, sizeof *s->slots);
    if (!s->acts || !s->acts_i || !s->slots)
        goto nomem;
    for (int k = 0; k < o->nslots; k++) {
        stage_slot_t *sl = &s->slots[k];
        float *ptrs[A_N];
        float *a = s->acts + (size_t)k * per_slot;
        for (int i = 0; i < A_N; i++) {
            ptrs[i] = asz[i] ? a : NULL;
            a += asz[i];
        }
        sl->mb = -1;
        sl->tokens = s->acts_i + (size_t)k * 2 * BT;
        sl->targets = sl->tokens + BT;
        sl->in = ptrs[A_IN];
        sl->ln1 = ptrs[A_LN1];
        sl->ln1_mean = ptrs[A_LN1_MEAN];
        sl->ln1_rstd = ptrs[A_LN1_RSTD];
        sl->qkv = ptrs[A_QKV];
        sl->atty = ptrs[A_ATTY];
        sl->att = ptrs[A_ATT];
        sl->res2 = ptrs[A_RES2];
        sl->ln2 = ptrs[A_LN2];
        sl->ln2_mean = ptrs[A_LN2_MEAN];
        sl->ln2_rstd = ptrs[A_LN2_RSTD];
        sl->fch = ptrs[A_FCH];
        sl->fchg = ptrs[A_FCHG];
        sl->res3 = ptrs[A_RES3];
        sl->lnf = ptrs[A_LNF];
        sl->lnf_mean = ptrs[A_LNF_MEAN];
        sl->lnf_rstd = ptrs[A_LNF_RSTD];
        sl->logits = ptrs[A_LOGITS];
        sl->losses = ptrs[A_LOSSES];
    }

    /* backward scratch: dres, dbuf (B,T,C); dqkv (B,T,3C); dbig (B,T,4C),
     * the last two split rank-major between tensor-parallel ranks */
    size_t C = (size_t)o->cfg.C;
    s->scratch = malloc((BT * C * 2 + BT * 3 * C + BT * 4 * C) * sizeof(float));
    if (!s->scratch)
        goto nomem;
    s->dres = s->scratch;
    s->dbuf = s->dres + BT * C;
    s->dqkv = s->dbuf + BT * C;
    s->dbig = s->dqkv + BT * 3 * C;
    s->tp = o->tp > 1 ? o->tp : 1;
    if (blocks_init(s, err, errlen) != 0) {
        stage_destroy(&s);
        return NULL;
    }

    size_t maxslice = 0;
    for (int i = 0; i < STAGE_NTENSORS; i++) {
        size_t n = gpt2_tensor_per_layer(i) ? gpt2_tensor_layer_size(&o->cfg, i) : s->sizes[i];
        if (n > maxslice)
            maxslice = n;
    }
    s->npartials = maxslice / S_NORM_CHUNK + 1;
    s->partials = malloc(s->npartials * sizeof(double));
    if (!s->partials)
        goto nomem;
    return s;
nomem:
    if (err)
        snprintf(err, errlen, "out of memory allocating stage (layers %d..%d, B=%d, T=%d, %d slots)",
                 o->layer0, o->layer1, o->B, o->T, o->nslots);
    stage_destroy(&s);
    return NULL;
}

void stage_destroy(stage_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    stage_t *s = *self_p;
    if (s->cu)
        s_backend->destroy(s);
    free(s->params);
    free(s->grads);
    free(s->moments);
    free(s->acts);
    free(s->acts_i);
    free(s->slots);
    free(s->scratch);
    blocks_free(s);
    free(s->partials);
    free(s);
    *self_p = NULL;
}

static int s_same_config(const gpt2_config_t *a, const gpt2_config_t *b)
{
    return a->maxT == b->maxT && a->V == b->V && a->Vp == b->Vp && a->L == b->L &&
           a->NH == b->NH && a->C == b->C;
}

int stage_load_params(stage_t *s, const gpt2_model_t *model)
{
    if (!s_same_config(&s->o.cfg, &model->cfg))
        return TAH_EINVAL;
    for (int i = 0; i < GPT2_NTENSORS; i++) {
        if (!s->sizes[i])
            continue;
        size_t off = gpt2_tensor_per_layer(i) ? gpt2_tensor_layer_size(&model->cfg, i) * (size_t)s->o.layer0 : 0;
        memcpy(s->p[i], model->t[i] + off, s->sizes[i] * sizeof(float));
    }
    if (s->sizes[STAGE_HEAD])
        memcpy(s->p[STAGE_HEAD], model->t[GPT2_WTE], s->sizes[STAGE_HEAD] * sizeof(float));
    return stage_sync_to_device(s, STAGE_SYNC_PARAMS);
}

int stage_store_params(const stage_t *s, gpt2_model_t *model)
{
    if (!s_same_config(&s->o.cfg, &model->cfg))
        return TAH_EINVAL;
    int rc = stage_sync_to_host(s, STAGE_SYNC_PARAMS);
    if (rc)
        return rc;
    for (int i = 0; i < GPT2_NTENSORS; i++) {
        if (!s->sizes[i])
            continue;
        size_t off = gpt2_tensor_per_layer(i) ? gpt2_tensor_layer_size(&model->cfg, i) * (size_t)s->o.layer0 : 0;
        memcpy(model->t[i] + off, s->p[i], s->sizes[i] * sizeof(float));
    }
    return 0;
}

/* ---- forward / backward ---- */

static stage_slot_t *s_find(stage_t *s, int mb)
{
    for (int k = 0; k < s->o.nslots; k++)
        if (s->slots[k].mb == mb)
            return &s->slots[k];
    return NULL;
}

int stage_inflight(const stage_t *s)
{
    if (s->cu)
        return s_backend->inflight(s);
    int n = 0;
    for (int k = 0; k < s->o.nslots; k++)
        n += s->slots[k].mb >= 0;
    return n;
}

int stage_forward(stage_t *s, int mb, const int *tokens, const float *in, const int *targets,
                  float *out, float *loss)
{
    if (s->cu)
        return s_backend->forward(s, mb, tokens, in, targets, out, loss);
    s->err[0] = 0;
    if (mb < 0 || s_find(s, mb))
        return TAH_EINVAL;
    stage_slot_t *sl = s_find(s, -1);
    if (!sl)
        return TAH_EINVAL;
    const int B = s->o.B, T = s->o.T, C = s->o.cfg.C;
    const int BT = B * T;
    const size_t BTC = (size_t)BT * C;

    if (s->o.first) {
        memcpy(sl->tokens, tokens, (size_t)BT * sizeof(int));
        encoder_forward(sl->in, sl->tokens, s->p[GPT2_WTE], s->p[GPT2_WPE], B, T, C);
    } else {
        memcpy(sl->in, in, BTC * sizeof(float));
    }
    if (s->o.last)
        memcpy(sl->targets, targets, (size_t)BT * sizeof(int));

    int rc = blocks_forward(s, sl);
    if (rc)
        return rc;
    const float *x = sl->res3 + (size_t)(s->nl - 1) * BTC;
    if (s->o.last) {
        const int V = s->o.cfg.V, Vp = s->o.cfg.Vp;
        layernorm_forward(sl->lnf, sl->lnf_mean, sl->lnf_rstd, x, s->p[GPT2_LNFW], s->p[GPT2_LNFB],
                          BT, C);
        matmul_forward(sl->logits, sl->lnf, s->p[STAGE_HEAD], NULL, BT, C, Vp);
        softmax_crossentropy_forward(sl->logits, sl->losses, sl->targets, BT, V, Vp);
        double sum = 0.0;
        for (int i = 0; i < BT; i++)
            sum += sl->losses[i];
        if (loss)
            *loss = (float)(sum / BT);
    } else if (out) {
        memcpy(out, x, BTC * sizeof(float));
    }
    sl->mb = mb;
    return 0;
}

int stage_backward(stage_t *s, int mb, const float *dout, float dloss, float *dinp)
{
    if (s->cu)
        return s_backend->backward(s, mb, dout, dloss, dinp);
    s->err[0] = 0;
    stage_slot_t *sl = mb >= 0 ? s_find(s, mb) : NULL;
    if (!sl)
        return TAH_EINVAL;
    const int B = s->o.B, T = s->o.T, C = s->o.cfg.C;
    const int BT = B * T;
    const size_t BTC = (size_t)BT * C;

    if (s->o.last) {
        const int V = s->o.cfg.V, Vp = s->o.cfg.Vp;
        const float *xlast = sl->res3 + (size_t)(s->nl - 1) * BTC;
        softmax_crossentropy_backward(sl->logits, sl->targets, dloss, BT, V, Vp);
        memset(s->dbuf, 0, BTC * sizeof(float));
        matmul_backward(s->dbuf, s->g[STAGE_HEAD], NULL, sl->logits, sl->lnf, s->p[STAGE_HEAD], BT,
                        C, Vp);
        memset(s->dres, 0, BTC * sizeof(float));
        layernorm_backward(s->dres, s->g[GPT2_LNFW], s->g[GPT2_LNFB], s->dbuf, xlast,
                           s->p[GPT2_LNFW], sl->lnf_mean, sl->lnf_rstd, BT, C);
    } else {
        memcpy(s->dres, dout, BTC * sizeof(float));
    }

    int rc = blocks_backward(s, sl);
    if (rc) {
        sl->mb = -1;
        return rc;
    }
    if (s->o.first)
        encoder_backward(s->g[GPT2_WTE], s->g[GPT2_WPE], s->dres, sl->tokens, B, T, C);
    else if (dinp)
        memcpy(dinp, s->dres, BTC * sizeof(float));
    sl->mb = -1;
    return 0;
}

const char *stage_error(const stage_t *s)
{
    /* a device stage's own error first; else what stage.c found before handing a call over */
    const char *e = s->cu ? s_backend->error(s) : NULL;
    return e && *e ? e : s->err;
}

void stage_discard(stage_t *s, int mb)
{
    if (s->cu) {
        s_backend->discard(s, mb);
        return;
    }
    stage_slot_t *sl = mb >= 0 ? s_find(s, mb) : NULL;
    if (sl)
        sl->mb = -1;
}

void stage_zero_grad(stage_t *s)
{
    if (s->cu) {
        s_backend->zero_grad(s);
        return;
    }
    memset(s->grads, 0, s->nparams * sizeof(float));
}

size_t stage_tied_rows(const int *tokens, size_t n, int Vp, uint8_t *mask, int *rows)
{
    memset(mask, 0, (size_t)Vp);
    for (size_t i = 0; i < n; i++)
        mask[tokens[i]] = 1;
    size_t nrows = 0;
    for (int v = 0; v < Vp; v++)
        if (mask[v])
            rows[nrows++] = v;
    return nrows;
}

int stage_tied_codec(const codec_spec_t *spec, float *g, int Vp, int C, const int *rows, size_t nrows,
                     float *scratch, uint8_t *frame, size_t cap, char *err, size_t errlen)
{
    const int lossy = spec->id != CODEC_FP32;
    if (!frame && !lossy)
        return 0;
    size_t R = rows ? nrows : (size_t)Vp, n = R * (size_t)C;
    codec_shape_t shape = { 1, (uint32_t)R, (uint32_t)C };
    int64_t fs = codec_frame_size(spec, shape);
    if (fs < 0 || (frame && cap < (size_t)fs)) {
        snprintf(err, errlen, "tied codec: no frame of shape (1,%zu,%d) in %zu bytes", R, C, frame ? cap : 0);
        return fs < 0 ? (int)fs : TAH_ESPACE;
    }
    float *x = !rows ? g : scratch ? scratch : malloc(n * sizeof(float));
    uint8_t *f = frame ? frame : malloc((size_t)fs);
    int rc = x && f ? 0 : TAH_ENOMEM;
    if (rc)
        snprintf(err, errlen, "tied codec: out of memory");
    for (size_t i = 0; !rc && rows && i < R; i++)
        memcpy(x + i * C, g + (size_t)rows[i] * C, (size_t)C * sizeof(float));
    if (!rc)
        rc = codec_encode(spec, shape, x, f, (size_t)fs, NULL, err, errlen);
    if (!rc && lossy)
        rc = codec_decode(f, (size_t)fs, x, n, NULL, err, errlen);
    for (size_t i = 0; !rc && lossy && rows && i < R; i++)
        memcpy(g + (size_t)rows[i] * C, x + i * C, (size_t)C * sizeof(float));
    if (rows && !scratch)
        free(x);
    if (!frame)
        free(f);
    return rc;
}

int stage_norm_skips(const stage_opts_t *o, int i)
{
    if (!o->tied)
        return 0;
    if (o->tied_link && !(o->first && o->last))
        return i == GPT2_WTE && o->first;
    return i == STAGE_HEAD;
}

int stage_norm_tensor(const stage_opts_t *o, int i)
{
    return i == STAGE_HEAD && o->tied ? GPT2_WTE : i;
}

int stage_step_skips(const stage_opts_t *o, int i)
{
    return o->tied && o->tied_link && o->first && !o->last && i == GPT2_WTE;
}

static int s_tied_rows(stage_t *s, int put, int grad, const int *rows, size_t R, float *buf)
{
    s->err[0] = 0;
    if (!s->o.tied || (!s->o.first && !s->o.last) || (R && (!rows || !buf))) {
        snprintf(s->err, sizeof s->err, "tied rows: not a tied first or last stage, or NULL rows");
        return TAH_EINVAL;
    }
    const int Vp = s->o.cfg.Vp;
    for (size_t i = 0; i < R; i++)
        if (rows[i] < 0 || rows[i] >= Vp) {
            snprintf(s->err, sizeof s->err, "tied rows: row %d outside 0..%d", rows[i], Vp - 1);
            return TAH_EINVAL;
        }
    if (s->cu)
        return s_backend->tied_rows(s, put, grad, rows, R, buf);
    const int t = s->o.first ? GPT2_WTE : STAGE_HEAD;
    float *m = grad ? s->g[t] : s->p[t];
    const size_t C = (size_t)s->o.cfg.C;
    for (size_t i = 0; i < R; i++) {
        float *row = m + (size_t)rows[i] * C, *b = buf + i * C;
        if (!put)
            memcpy(b, row, C * sizeof(float));
        else if (!grad)
            memcpy(row, b, C * sizeof(float));
        else
            for (size_t j = 0; j < C; j++) /* first + last, as stage_tied_sync */
                row[j] = b[j] + row[j];
    }
    return 0;
}

int stage_tied_rows_get(stage_t *s, int grad, const int *rows, size_t R, float *buf)
{
    return s_tied_rows(s, 0, grad, rows, R, buf);
}

int stage_tied_rows_put(stage_t *s, int grad, const int *rows, size_t R, const float *buf)
{
    return s_tied_rows(s, 1, grad, rows, R, (float *)buf);
}

void stage_tied_reduce(float *mine, const float *peer, size_t n, int mine_is_first)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        mine[i] = mine_is_first ? mine[i] + peer[i] : peer[i] + mine[i];
}

void stage_tied_sync(stage_t *first, stage_t *last)
{
    if (!first->o.tied || !last->o.tied)
        return;
    if (first == last && first->cu) {
        s_backend->tied_sync_self(first);
        return;
    }
    /* a device stage among them: sum the host mirrors, then copy back */
    if ((first->cu || last->cu) &&
        (stage_sync_to_host(first, STAGE_SYNC_TIED) || stage_sync_to_host(last, STAGE_SYNC_TIED)))
        return; /* the error stays in stage_error */
    float *a = first->g[GPT2_WTE], *b = last->g[STAGE_HEAD];
    size_t n = first->sizes[GPT2_WTE];
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float sum = a[i] + b[i];
        a[i] = sum;
        b[i] = sum;
    }
    stage_sync_to_device(first, STAGE_SYNC_TIED);
    if (last != first)
        stage_sync_to_device(last, STAGE_SYNC_TIED);
}

/* ---- norm and update ---- */

size_t stage_norm_nslots(const gpt2_config_t *cfg)
{
    return 5 + 12 * (size_t)cfg->L;
}

size_t stage_norm_slot(const gpt2_config_t *cfg, int i, int layer)
{
    if (i == GPT2_WTE || i == GPT2_WPE)
        return (size_t)i;
    if (gpt2_tensor_per_layer(i))
        return 2 + (size_t)(i - GPT2_LN1W) * cfg->L + (size_t)layer;
    if (i == GPT2_LNFW || i == GPT2_LNFB)
        return 2 + 12 * (size_t)cfg->L + (size_t)(i - GPT2_LNFW);
    return 4 + 12 * (size_t)cfg->L; /* head */
}

static double s_sumsq(const float *x, size_t n, double *partials)
{
    size_t nch = (n + S_NORM_CHUNK - 1) / S_NORM_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nch; c++) {
        size_t lo = c * S_NORM_CHUNK, hi = lo + S_NORM_CHUNK < n ? lo + S_NORM_CHUNK : n;
        double acc = 0.0;
        for (size_t i = lo; i < hi; i++)
            acc += (double)x[i] * (double)x[i];
        partials[c] = acc;
    }
    double total = 0.0;
    for (size_t c = 0; c < nch; c++)
        total += partials[c];
    return total;
}

void stage_grad_sumsq(stage_t *s, double *slots)
{
    if (s->cu) {
        s_backend->grad_sumsq(s, slots);
        return;
    }
    for (int i = 0; i < STAGE_NTENSORS; i++) {
        if (!s->sizes[i] || stage_norm_skips(&s->o, i))
            continue;
        if (gpt2_tensor_per_layer(i)) {
            size_t per = gpt2_tensor_layer_size(&s->o.cfg, i);
            for (int l = 0; l < s->nl; l++)
                slots[stage_norm_slot(&s->o.cfg, i, s->o.layer0 + l)] +=
                    s_sumsq(s->g[i] + (size_t)l * per, per, s->partials);
        } else {
            slots[stage_norm_slot(&s->o.cfg, stage_norm_tensor(&s->o, i), 0)] +=
                s_sumsq(s->g[i], s->sizes[i], s->partials);
        }
    }
}

double stage_norm_total(const double *slots, size_t n)
{
    double total = 0.0;
    for (size_t k = 0; k < n; k++)
        total += slots[k];
    return sqrt(total);
}

uint64_t stage_tp_call_id(stage_t *s, int r)
{
    if (s->tp_call_t[r] != s->t) {
        s->tp_call_t[r] = s->t;
        s->tp_calls[r] = 0;
    }
    return ((uint64_t)s->t << 32) | s->tp_calls[r]++;
}

void stage_step(stage_t *s, const optim_opts_t *o, float lr, float grad_scale)
{
    s->t++;
    if (s->cu) {
        s_backend->step(s, o, lr, grad_scale);
        return;
    }
    for (int i = 0; i < STAGE_NTENSORS; i++) {
        if (!s->sizes[i] || stage_step_skips(&s->o, i))
            continue;
        int matrix = i == STAGE_HEAD || gpt2_tensor_is_matrix(i);
        float wd = matrix ? o->weight_decay : 0.0f;
        optim_adamw(s->p[i], s->m[i], s->v[i], s->g[i], s->sizes[i], o, lr, wd, grad_scale, s->t);
    }
}

int stage_sync_to_host(const stage_t *s, int what)
{
    return s->cu ? s_backend->to_host(s, what) : 0;
}

int stage_sync_to_device(stage_t *s, int what)
{
    return s->cu ? s_backend->to_device(s, what) : 0;
}

int stage_encodes_on_device(const stage_t *s)
{
    return s->cu != NULL && s_backend->encode != NULL;
}

/* The checks both device-encoding calls make; the frame's size or an error. */
static int64_t s_wire_check(const stage_t *s, int what, const codec_spec_t *spec, size_t cap, char *err,
                            size_t errlen)
{
    if (!stage_encodes_on_device(s)) {
        snprintf(err, errlen, "this stage encodes on the host (cpu backend)");
        return TAH_EINVAL;
    }
    if ((what == STAGE_WIRE_OUT && s->o.last) || (what == STAGE_WIRE_DINP && s->o.first) ||
        (what != STAGE_WIRE_OUT && what != STAGE_WIRE_DINP)) {
        snprintf(err, errlen, "stage (layers %d..%d) has no %s boundary tensor", s->o.layer0, s->o.layer1 - 1,
                 what == STAGE_WIRE_OUT ? "output" : what == STAGE_WIRE_DINP ? "input-gradient" : "such");
        return TAH_EINVAL;
    }
    codec_shape_t shape = { (uint32_t)s->o.B, (uint32_t)s->o.T, (uint32_t)s->o.cfg.C };
    int64_t fs = codec_frame_size(spec, shape);
    if (fs < 0) {
        snprintf(err, errlen, "codec frame size: %s", tah_strerror((int)fs));
        return fs;
    }
    if ((size_t)fs > cap) {
        snprintf(err, errlen, "frame buffer of %zu bytes, the frame needs %lld", cap, (long long)fs);
        return TAH_ESPACE;
    }
    return fs;
}

int stage_encode_boundary(stage_t *s, int what, int mb, const codec_spec_t *spec, uint8_t *frame, size_t cap,
                          size_t *written, char *err, size_t errlen)
{
    int64_t fs = s_wire_check(s, what, spec, cap, err, errlen);
    if (fs < 0)
        return (int)fs;
    int rc = s_backend->encode(s, what, mb, spec, frame, (size_t)fs, err, errlen);
    if (rc == 0 && written)
        *written = (size_t)fs;
    return rc;
}

int stage_decodes_on_device(const stage_t *s)
{
    return s->cu != NULL && s_backend->decode != NULL;
}

int stage_decode_boundary(stage_t *s, int what, int mb, const uint8_t *frame, size_t len, double *norm, char *err,
                          size_t errlen)
{
    if (!stage_decodes_on_device(s) || !frame || !norm || mb < 0 ||
        !((what == STAGE_WIRE_IN && !s->o.first) || (what == STAGE_WIRE_DOUT && !s->o.last))) {
        snprintf(err, errlen, "this stage does not decode %s frames on its device",
                 what == STAGE_WIRE_IN ? "input" : "gradient");
        return TAH_EINVAL;
    }
    return s_backend->decode(s, what, mb, frame, len, norm, err, errlen);
}

int stage_backward_encode(stage_t *s, int mb, const float *dout, float dloss, const codec_spec_t *spec,
                          uint8_t *frame, size_t cap, size_t *written, char *err, size_t errlen)
{
    int64_t fs = s_wire_check(s, STAGE_WIRE_DINP, spec, cap, err, errlen);
    if (fs < 0)
        return (int)fs;
    int rc = s_backend->backward_encode(s, mb, dout, dloss, spec, frame, (size_t)fs, err, errlen);
    if (rc == 0 && written)
        *written = (size_t)fs;
    return rc;
}

void *stage_host_alloc(const stage_t *s, size_t bytes)
{
    return s->cu && s_backend->host_alloc ? s_backend->host_alloc(bytes) : malloc(bytes ? bytes : 1);
}

void stage_host_free(const stage_t *s, void *p)
{
    if (!p)
        return;
    if (s->cu && s_backend->host_free)
        s_backend->host_free(p);
    else
        free(p);
}

void stage_describe(const stage_t *s, char *buf, size_t buflen)
{
    if (s->cu) {
        s_backend->describe(s, buf, buflen);
        return;
    }
    int n = snprintf(buf, buflen, "layers %d..%d%s%s, %zu params, cpu backend (OpenBLAS sgemm + OpenMP, %d threads)",
                     s->o.layer0, s->o.layer1 - 1, s->o.first ? ", embeddings" : "",
                     s->o.last ? (s->o.tied ? ", lnf + tied head + loss" : ", lnf + untied head + loss") : "",
                     s->nparams, layers_max_threads());
    if (s->tp > 1 && n > 0 && (size_t)n < buflen) {
        char rs[128], ag[128];
        tp_codec_format(&s->o.tp_rs, rs, sizeof rs);
        tp_codec_format(&s->o.tp_ag, ag, sizeof ag);
        snprintf(buf + n, buflen - (size_t)n, ", tensor parallel tp=%d (%d thread%s per rank, all-reduce %s / %s)",
                 s->tp, s->rank_threads, s->rank_threads > 1 ? "s" : "", rs, ag);
    }
}
