// cu_stage.cu — the CUDA stage (cu_stage.h): device memory of every rank,
// slot bookkeeping, the tensor-parallel shard table, gradient bookkeeping
// (zero, tied sum, the norm's sums of squares), AdamW, the host syncs and
// the stage_backend_t table. The forward and backward are in
// cu_stage_pass.cu; the state both share in cu_stage_impl.cuh.
//
// Tensor parallelism (tp > 1): every rank holds the full tensors; rank r
// computes with and updates only its shard of the sharded weights
// (cs_shard), and every rank computes and updates every replicated tensor
// (LayerNorms, the row-parallel layers' biases, embeddings, lnf, the head)
// from bit-identical inputs, so the replicas stay identical. The one
// exception is the embedding gradient: rank 0 alone computes it (it alone
// has the positions grouped by token) and s_settle_embed broadcasts it
// before the tied sum or AdamW read it. The norm counts each rank's shards
// and the replicated tensors once (rank 0); to_host gathers each rank's
// shards (replicated tensors from rank 0) into the full host mirrors, and
// to_device copies the host values to every rank: checkpoints and the host
// view do not depend on tp.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu_stage.h"
#include "cu_stage_impl.cuh" // first: its extern "C" block declares codec.h's functions with C linkage
#include "cu_codec.h"        // cu_codec_encode: boundary tensors encoded on the device
#ifdef TAH_HAVE_NCCL
#include "cu_tpcomm.h" // cu_tp_new, cu_tp_broadcast, cu_tp_destroy, CU_TP_MAX
static_assert(TP_MAX <= CU_TP_MAX, "the NCCL group holds every tensor-parallel rank");
#endif

static const char *const k_phase_name[P_N] = { "layernorm",   "matmul fwd", "attn fwd",   "gelu",
                                               "head fwd",    "ce fwd",     "ce bwd",     "head bwd",
                                               "matmul dx",   "matmul dw",  "bias bwd",   "gelu bwd",
                                               "attn bwd",    "ln bwd",     "encoder",    "copies",
                                               "tp all-reduce" };

// 1: activation type X (fp32 or bf16), 0: always fp32
static const int k_act_is_x[A_N] = { 1, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 0, 0 };

// ---- errors: the first one is kept, printed once, and sticks ----

int cs_fail(cs_dev *c, const stage_t *s, const char *what, const char *why, const char *file, int line)
{
    if (!c->failed) {
        snprintf(c->err, sizeof c->err, "cuda:%s stage (layers %d..%d): %s:%d: %s failed: %s", c->devlist,
                 s->o.layer0, s->o.layer1 - 1, file, line, what, why);
        fprintf(stderr, "tah: %s\n", c->err);
        c->failed = 1;
    }
    return TAH_EDEVICE;
}

// ---- the shards (cu_stage_impl.cuh) ----

int cs_shard(const stage_opts_t *o, int i, int r, int tp, int nl, size_t *off, size_t *n, size_t *rows,
             size_t *stride)
{
    if (tp <= 1)
        return 0;
    const size_t C = (size_t)o->cfg.C, Cr = C / (size_t)tp, L = (size_t)nl, R = (size_t)r;
    switch (i) {
    case GPT2_QKVW: // (L, 3, C, C): rows R*Cr.. of each of the 3L blocks
        *off = R * Cr * C, *n = Cr * C, *rows = 3 * L, *stride = C * C;
        return 1;
    case GPT2_QKVB: // (L, 3, C)
        *off = R * Cr, *n = Cr, *rows = 3 * L, *stride = C;
        return 1;
    case GPT2_ATTPROJW: // (L, C, C): columns R*Cr.. of its L*C rows
        *off = R * Cr, *n = Cr, *rows = L * C, *stride = C;
        return 1;
    case GPT2_FCW: // (L, 4C, C): rows R*4Cr..
        *off = R * 4 * Cr * C, *n = 4 * Cr * C, *rows = L, *stride = 4 * C * C;
        return 1;
    case GPT2_FCB: // (L, 4C)
        *off = R * 4 * Cr, *n = 4 * Cr, *rows = L, *stride = 4 * C;
        return 1;
    case GPT2_FCPROJW: // (L, C, 4C): columns R*4Cr.. of its L*C rows
        *off = R * 4 * Cr, *n = 4 * Cr, *rows = L * C, *stride = 4 * C;
        return 1;
    }
    return 0;
}

// ---- sizes ----

static void s_act_sizes(const stage_opts_t *o, int tp, size_t a[A_N])
{
    size_t B = (size_t)o->B, T = (size_t)o->T, C = (size_t)o->cfg.C, NH = (size_t)o->cfg.NH, P = (size_t)tp;
    size_t nl = (size_t)(o->layer1 - o->layer0), BT = B * T, lastf = o->last ? 1 : 0;
    a[A_IN] = BT * C;
    a[A_LN1] = nl * BT * C;
    a[A_LN1_MEAN] = a[A_LN1_RSTD] = nl * BT;
    a[A_QKV] = nl * BT * 3 * C / P;
    a[A_ATTY] = nl * BT * C / P;
    a[A_LSE] = nl * B * NH / P * T;
    a[A_RES2] = nl * BT * C;
    a[A_LN2] = nl * BT * C;
    a[A_LN2_MEAN] = a[A_LN2_RSTD] = nl * BT;
    a[A_FCH] = a[A_FCHG] = nl * BT * 4 * C / P;
    a[A_RES3] = nl * BT * C;
    a[A_LNF] = lastf * BT * C;
    a[A_LNF_MEAN] = a[A_LNF_RSTD] = lastf * BT;
    a[A_LOGITS] = lastf * BT * (size_t)o->cfg.Vp;
    a[A_LOSSES] = a[A_ROWLSE] = lastf * BT;
}

static size_t s_round(size_t bytes)
{
    return (bytes + CS_ALIGN - 1) / CS_ALIGN * CS_ALIGN;
}

// ---- the backend table: forward / backward / slots ----

static cs_slot *s_find(cs_dev *c, const stage_t *s, int mb)
{
    for (int k = 0; k < s->o.nslots; k++)
        if (c->slots[k].mb == mb)
            return &c->slots[k];
    return NULL;
}

// A forward without `in` (backward without `dout`) takes the tensor stage_decode_boundary
// decoded for its micro-batch: c->dsrc for the call's s_upload, consumed by it.
static int s_take_decoded(cs_dev *c, int w, int mb)
{
    if (c->dec_mb[w] != mb || !c->dec[w])
        return TAH_EINVAL;
    c->dsrc = c->dec[w];
    c->dec_mb[w] = -1;
    return 0;
}

static int b_forward(stage_t *s, int mb, const int *tokens, const float *in, const int *targets, float *out,
                     float *loss)
{
    cs_dev *c = CS(s);
    if (c->failed)
        return TAH_EDEVICE;
    c->lasterr[0] = 0;
    if (mb < 0 || s_find(c, s, mb))
        return TAH_EINVAL;
    cs_slot *sl = s_find(c, s, -1);
    if (!sl || (!s->o.first && !in && s_take_decoded(c, 0, mb) != 0))
        return TAH_EINVAL;
    int rc = cs_forward(s, sl, tokens, in, targets, out, loss);
    c->dsrc = NULL;
    if (rc == 0)
        sl->mb = mb;
    return rc;
}

static int b_backward(stage_t *s, int mb, const float *dout, float dloss, float *dinp)
{
    cs_dev *c = CS(s);
    if (c->failed)
        return TAH_EDEVICE;
    c->lasterr[0] = 0;
    cs_slot *sl = mb >= 0 ? s_find(c, s, mb) : NULL;
    if (!sl || (!s->o.last && !dout && s_take_decoded(c, 1, mb) != 0))
        return TAH_EINVAL;
    int rc = cs_backward(s, sl, dout, dloss, dinp);
    c->dsrc = NULL;
    c->dinp_mb = rc == 0 && !s->o.first ? mb : -1;
    sl->mb = -1;
    return rc;
}

static void b_discard(stage_t *s, int mb)
{
    cs_dev *c = CS(s);
    cs_slot *sl = mb >= 0 ? s_find(c, s, mb) : NULL;
    if (sl)
        sl->mb = -1;
}

static int b_inflight(const stage_t *s)
{
    cs_dev *c = CS(s);
    int n = 0;
    for (int k = 0; k < s->o.nslots; k++)
        n += c->slots[k].mb >= 0;
    return n;
}

// ---- gradients, norm, AdamW ----

static int s_sync_all(cs_dev *c, const stage_t *s)
{
    for (int r = 0; r < c->tp; r++) {
        CK(cudaSetDevice(c->g[r].dev));
        CK(cudaStreamSynchronize(c->g[r].st));
    }
    return 0;
}

static int s_zero_grad(stage_t *s)
{
    cs_dev *c = CS(s);
    if (c->failed)
        return TAH_EDEVICE;
    for (int r = 0; r < c->tp; r++) {
        CK(cudaSetDevice(c->g[r].dev));
        CK(cudaMemsetAsync(c->g[r].grads, 0, s->nparams * sizeof(float), c->g[r].st));
    }
    c->embed_dirty = 0;
    return s_sync_all(c, s);
}

static void b_zero_grad(stage_t *s)
{
    (void)s_zero_grad(s);
}

// tp > 1: every rank's wte and wpe gradients = rank 0's (it alone ran the
// encoder backward), before anything else reads them
static int s_settle_embed(stage_t *s)
{
    cs_dev *c = CS(s);
    if (!c->embed_dirty)
        return 0;
#ifdef TAH_HAVE_NCCL
    float *bufs[TP_MAX];
    for (int r = 0; r < c->tp; r++)
        bufs[r] = cs_g(c, &c->g[r], GPT2_WTE, 0);
    // wte then wpe: adjacent in the allocation (tensor order), one broadcast
    const size_t n = s->sizes[GPT2_WTE] + s->sizes[GPT2_WPE];
    char why[512];
    int rc = cu_tp_broadcast((cu_tp_t *)c->tpc, bufs, n, 0, c->streams, why, sizeof why);
    if (rc)
        return cs_fail(c, s, "broadcast of the embedding gradients from rank 0", why, __FILE__, __LINE__);
#endif
    c->embed_dirty = 0;
    return 0;
}

static int s_tied_sync_self(stage_t *s)
{
    cs_dev *c = CS(s);
    if (c->failed)
        return TAH_EDEVICE;
    int rc = s_settle_embed(s);
    if (rc)
        return rc;
    for (int r = 0; r < c->tp; r++) {
        cs_rank *g = &c->g[r];
        CK(cudaSetDevice(g->dev));
        CK(cl_tied_sum(cs_g(c, g, GPT2_WTE, 0), cs_g(c, g, STAGE_HEAD, 0), s->sizes[GPT2_WTE], g->st));
    }
    return s_sync_all(c, s);
}

static void b_tied_sync_self(stage_t *s)
{
    (void)s_tied_sync_self(s);
}

static int s_grad_sumsq(stage_t *s, double *slots)
{
    cs_dev *c = CS(s);
    if (c->failed)
        return TAH_EDEVICE;
    for (int r = 0; r < c->tp; r++) {
        cs_rank *g = &c->g[r];
        CK(cudaSetDevice(g->dev));
        CK(cl_sumsq(g->partials, g->grads, g->segs, g->nseg, g->st));
        CK(cudaMemcpyAsync(g->h_partials, g->partials, (size_t)g->nseg * CL_SUMSQ_BLOCKS * sizeof(double),
                           cudaMemcpyDeviceToHost, g->st));
    }
    for (int r = 0; r < c->tp; r++) { // rank order: the sum does not depend on timing
        cs_rank *g = &c->g[r];
        CK(cudaSetDevice(g->dev));
        CK(cudaStreamSynchronize(g->st));
        for (int k = 0; k < g->nseg; k++) {
            double acc = 0.0;
            for (int j = 0; j < CL_SUMSQ_BLOCKS; j++)
                acc += g->h_partials[(size_t)k * CL_SUMSQ_BLOCKS + j];
            slots[g->seg_slot[k]] += acc;
        }
    }
    return 0;
}

static void b_grad_sumsq(stage_t *s, double *slots)
{
    (void)s_grad_sumsq(s, slots);
}

static int s_step(stage_t *s, const optim_opts_t *o, float lr, float grad_scale)
{
    cs_dev *c = CS(s);
    if (c->failed)
        return TAH_EDEVICE;
    int rc = s_settle_embed(s);
    if (rc)
        return rc;
    // the bias corrections exactly as optim_adamw computes them
    const float bc1 = (float)(1.0 - pow((double)o->beta1, (double)s->t));
    const float bc2 = (float)(1.0 - pow((double)o->beta2, (double)s->t));
    for (int r = 0; r < c->tp; r++) {
        cs_rank *g = &c->g[r];
        cl_adamw_tensors t;
        memset(&t, 0, sizeof t);
        for (int i = 0; i < STAGE_NTENSORS; i++) {
            if (!s->sizes[i] || stage_step_skips(&s->o, i))
                continue;
            int matrix = i == STAGE_HEAD || gpt2_tensor_is_matrix(i);
            size_t off = 0, n = s->sizes[i], rows = 1, stride = 0;
            cs_shard(&s->o, i, r, c->tp, s->nl, &off, &n, &rows, &stride); // replicated: the whole tensor
            t.off[t.count] = c->off[i] + off;
            t.n[t.count] = n;
            t.rows[t.count] = rows;
            t.stride[t.count] = stride;
            t.wd[t.count] = matrix ? o->weight_decay : 0.0f;
            t.count++;
        }
        CK(cudaSetDevice(g->dev));
        CK(cl_adamw(g->params, g->p16, g->moments, g->moments + s->nparams, g->grads, &t, lr, o->beta1, o->beta2,
                    o->eps, bc1, bc2, grad_scale, g->st));
    }
    return s_sync_all(c, s);
}

static void b_step(stage_t *s, const optim_opts_t *o, float lr, float grad_scale)
{
    (void)s_step(s, o, lr, grad_scale);
}

// ---- host mirrors ----

// One full tensor set of every rank (which: 0 params, 1 grads, 2 m, 3 v)
// -> host (the matching host mirror, stage.c's carving): rank r's shards of
// the sharded tensors, rank 0's replicated ones.
static int s_gather(stage_t *s, float *host, int which)
{
    cs_dev *c = CS(s);
    if (c->tp == 1) { // one rank: one copy
        cs_rank *g = &c->g[0];
        const float *dev = which == 0 ? g->params : which == 1 ? g->grads : g->moments + (which == 3 ? s->nparams : 0);
        CK(cudaSetDevice(g->dev));
        CK(cudaMemcpy(host, dev, s->nparams * sizeof(float), cudaMemcpyDeviceToHost));
        return 0;
    }
    for (int r = 0; r < c->tp; r++) {
        cs_rank *g = &c->g[r];
        const float *dev = which == 0 ? g->params : which == 1 ? g->grads : g->moments + (which == 3 ? s->nparams : 0);
        CK(cudaSetDevice(g->dev));
        for (int i = 0; i < STAGE_NTENSORS; i++) {
            if (!s->sizes[i])
                continue;
            size_t off = 0, n = s->sizes[i], rows = 1, stride = 0;
            if (!cs_shard(&s->o, i, r, c->tp, s->nl, &off, &n, &rows, &stride) && r != 0)
                continue; // replicated: rank 0's
            const size_t o0 = c->off[i] + off, pitch = (stride > n ? stride : n) * sizeof(float);
            CK(cudaMemcpy2D(host + o0, pitch, dev + o0, pitch, n * sizeof(float), rows, cudaMemcpyDeviceToHost));
        }
    }
    return 0;
}

static int b_to_host(const stage_t *cs, int what)
{
    stage_t *s = (stage_t *)cs; // the host mirrors are a cache of the device state
    cs_dev *c = CS(s);
    if (c->failed)
        return TAH_EDEVICE;
    int rc = s_sync_all(c, s);
    if (rc)
        return rc;
    if ((what & STAGE_SYNC_PARAMS) && (rc = s_gather(s, s->params, 0)) != 0)
        return rc;
    if ((what & STAGE_SYNC_MOMENTS) &&
        ((rc = s_gather(s, s->moments, 2)) != 0 || (rc = s_gather(s, s->moments + s->nparams, 3)) != 0))
        return rc;
    if ((what & STAGE_SYNC_GRADS) && (rc = s_gather(s, s->grads, 1)) != 0)
        return rc;
    if (what & STAGE_SYNC_TIED) { // replicated: rank 0's (it holds the settled embedding gradient)
        cs_rank *g = &c->g[0];
        CK(cudaSetDevice(g->dev));
        for (int i = 0; i < STAGE_NTENSORS; i++)
            if ((i == GPT2_WTE || i == STAGE_HEAD) && s->sizes[i])
                CK(cudaMemcpy(s->g[i], cs_g(c, g, i, 0), s->sizes[i] * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return 0;
}

static int b_to_device(stage_t *s, int what)
{
    cs_dev *c = CS(s);
    if (c->failed)
        return TAH_EDEVICE;
    int rc = s_sync_all(c, s);
    if (rc)
        return rc;
    // Every copy on the rank's stream, which its kernels (the bf16 copy of the parameters below,
    // then every forward and backward) run on: a plain cudaMemcpy from pageable memory may return
    // before its DMA has landed, and the legacy stream it runs on does not order the rank's
    // non-blocking stream. (It did not: a fresh bf16 stage's first forward sometimes converted
    // parameters still zero, and a bf16 head of zeros gave the loss ln V.)
    for (int r = 0; r < c->tp; r++) {
        cs_rank *g = &c->g[r];
        CK(cudaSetDevice(g->dev));
        if (what & STAGE_SYNC_PARAMS) {
            CK(cudaMemcpyAsync(g->params, s->params, s->nparams * sizeof(float), cudaMemcpyHostToDevice, g->st));
            if (g->p16)
                CK(cl_from_f32<cu_bf16>(g->p16, g->params, s->nparams, g->st));
        }
        if (what & STAGE_SYNC_MOMENTS)
            CK(cudaMemcpyAsync(g->moments, s->moments, 2 * s->nparams * sizeof(float), cudaMemcpyHostToDevice,
                               g->st));
        if (what & STAGE_SYNC_GRADS)
            CK(cudaMemcpyAsync(g->grads, s->grads, s->nparams * sizeof(float), cudaMemcpyHostToDevice, g->st));
        if (what & STAGE_SYNC_TIED) {
            for (int i = 0; i < STAGE_NTENSORS; i++)
                if ((i == GPT2_WTE || i == STAGE_HEAD) && s->sizes[i])
                    CK(cudaMemcpyAsync(cs_g(c, g, i, 0), s->g[i], s->sizes[i] * sizeof(float),
                                       cudaMemcpyHostToDevice, g->st));
        }
        CK(cudaStreamSynchronize(g->st));
    }
    if (what & STAGE_SYNC_GRADS) // every gradient now the host's on every rank
        c->embed_dirty = 0;
    return 0;
}

// stage_tied_rows_get / _put: rows in chunks of CS_ROWS through each rank's
// row buffer (allocated at first use). get reads rank 0's tensor (the ranks'
// replicas are identical once the embedding gradient is settled); put writes
// every rank's, and the parameters' bf16 copy.
#define CS_ROWS 4096
static int b_tied_rows(stage_t *s, int put, int grad, const int *rows, size_t R, float *buf)
{
    cs_dev *c = CS(s);
    if (c->failed)
        return TAH_EDEVICE;
    int rc = s_settle_embed(s);
    if (rc)
        return rc;
    const int t = s->o.first ? (int)GPT2_WTE : (int)STAGE_HEAD, C = s->o.cfg.C;
    for (int r = 0; r < (put ? c->tp : 1); r++) {
        cs_rank *g = &c->g[r];
        CK(cudaSetDevice(g->dev));
        CK(cudaStreamSynchronize(g->st));
        if (!g->rowbuf) {
            CK(cudaMalloc((void **)&g->rowbuf, (size_t)CS_ROWS * C * sizeof(float)));
            CK(cudaMalloc((void **)&g->rowidx, CS_ROWS * sizeof(int)));
        }
        float *m = grad ? cs_g(c, g, t, 0) : cs_p(c, g, t, 0);
        cu_bf16 *m16 = !grad && put && g->p16 ? g->p16 + c->off[t] : NULL;
        for (size_t i0 = 0; i0 < R; i0 += CS_ROWS) {
            const size_t n = R - i0 < CS_ROWS ? R - i0 : CS_ROWS, bytes = n * (size_t)C * sizeof(float);
            CK(cudaMemcpyAsync(g->rowidx, rows + i0, n * sizeof(int), cudaMemcpyHostToDevice, g->st));
            if (put)
                CK(cudaMemcpyAsync(g->rowbuf, buf + i0 * C, bytes, cudaMemcpyHostToDevice, g->st));
            CK(cl_rows(m, m16, g->rowbuf, g->rowidx, n, C, put ? (grad ? CL_ROWS_ADD : CL_ROWS_SET) : CL_ROWS_GET,
                       g->st));
            if (!put)
                CK(cudaMemcpyAsync(buf + i0 * C, g->rowbuf, bytes, cudaMemcpyDeviceToHost, g->st));
            CK(cudaStreamSynchronize(g->st)); // the chunk's buffers are reused
        }
    }
    return 0;
}

static void b_describe(const stage_t *s, char *buf, size_t buflen)
{
    cs_dev *c = CS(s);
    char gpus[160];
    if (c->tp > 1)
        snprintf(gpus, sizeof gpus, "cuda:%s: %d x %s", c->devlist, c->tp, c->devname);
    else
        snprintf(gpus, sizeof gpus, "cuda:%s %s", c->devlist, c->devname);
    int n = snprintf(buf, buflen, "layers %d..%d%s%s, %zu params, cuda backend (%s, %s, cuBLASLt", s->o.layer0,
                     s->o.layer1 - 1, s->o.first ? ", embeddings" : "",
                     s->o.last ? (s->o.tied ? ", lnf + tied head + loss" : ", lnf + untied head + loss") : "",
                     s->nparams, gpus, c->bf16 ? "bf16 activations, fp32 master weights" : "fp32");
    if (n < 0 || (size_t)n >= buflen)
        return;
    if (c->tp > 1) {
        char rs[128], ag[128];
        tp_codec_format(&s->o.tp_rs, rs, sizeof rs);
        tp_codec_format(&s->o.tp_ag, ag, sizeof ag);
        snprintf(buf + n, buflen - (size_t)n, ", tensor parallel tp=%d over NCCL, all-reduce %s / %s)", c->tp, rs, ag);
    } else {
        snprintf(buf + n, buflen - (size_t)n, ")");
    }
}

static const char *b_error(const stage_t *s)
{
    cs_dev *c = CS(s);
    return c->failed ? c->err : c->lasterr[0] ? c->lasterr : NULL;
}

// ---- life cycle ----

static void b_destroy(stage_t *s)
{
    cs_dev *c = CS(s);
    if (!c)
        return;
#ifdef TAH_HAVE_NCCL
    cu_tp_t *tpc = (cu_tp_t *)c->tpc;
    cu_tp_destroy(&tpc);
#endif
    for (int r = 0; r < c->tp; r++) {
        cs_rank *g = &c->g[r];
        if (!g->st) // not created (device missing or creation stopped earlier)
            continue;
        cudaSetDevice(g->dev);
        cudaStreamSynchronize(g->st);
        cudaFree(g->rowbuf);
        cudaFree(g->rowidx);
        cudaFree(g->params);
        cudaFree(g->grads);
        cudaFree(g->moments);
        cudaFree(g->p16);
        cudaFree(g->acts);
        cudaFree(g->toks);
        cudaFree(g->scratch);
        cudaFree(g->ws);
        cudaFree(g->colpart);
        cudaFree(g->segs);
        cudaFree(g->partials);
        free(g->h_partials);
        free(g->seg_slot);
        if (g->lt)
            cublasLtDestroy(g->lt);
        if (g->decev)
            cudaEventDestroy(g->decev);
        cudaStreamDestroy(g->st);
    }
    if (c->g[0].st) { // the wire stream's buffers live on rank 0's device
        cudaSetDevice(c->g[0].dev);
        cudaFree(c->wscr);
        cudaFree(c->wpay);
        cudaFree(c->dpay);
        cudaFree(c->dscr);
        cudaFree(c->dec[0]);
        cudaFree(c->dec[1]);
        cudaFree(c->dseg);
        cudaFree(c->dpart);
        cudaFreeHost(c->h_dpart);
        if (c->wst)
            cudaStreamDestroy(c->wst);
        if (c->wev)
            cudaEventDestroy(c->wev);
    }
    if (c->prof)
        for (int k = 0; k < CS_NPEV; k++)
            cudaEventDestroy(c->pev[k]);
    cudaFreeHost(c->h_losses);
    cudaFreeHost(c->h_rows);
    free(c->h_cnt);
    free(c->slots);
    free(c);
    s->cu = NULL;
    (void)cudaGetLastError(); // a failed creation must not leave its error to the next stage's launch check
}

static int s_alloc(cs_dev *c, const stage_t *s, int r, void **p, size_t bytes, const char *what)
{
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    // TAH_CU_POISON=N (0..255): every new buffer filled with byte N (finding reads of memory
    // nothing wrote: a run whose results change with N has one)
    const char *poison = getenv("TAH_CU_POISON");
    if (e == cudaSuccess && poison && *poison) {
        e = cudaMemset(*p, (int)(strtol(poison, NULL, 0) & 255), bytes ? bytes : 1);
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
    }
    if (e != cudaSuccess) {
        char why[300];
        snprintf(why, sizeof why, "%s (%.2f GiB for %s on cuda:%d; B=%d, T=%d, %d slots; HINT: a smaller "
                 "micro-batch or fewer layers per stage)", cudaGetErrorString(e), (double)bytes / (1u << 30), what,
                 c->g[r].dev, s->o.B, s->o.T, s->o.nslots);
        return cs_fail(c, s, "cudaMalloc", why, __FILE__, __LINE__);
    }
    return 0;
}

// rank r's norm segments: one per (tensor, layer) it counts, in
// stage_grad_sumsq's order: its shards, and the replicated tensors on rank 0
static int s_norm_segments(cs_dev *c, stage_t *s, int r)
{
    cs_rank *g = &c->g[r];
    const stage_opts_t *o = &s->o;
    int nseg = 0, rc = 0;
    for (int pass = 0; pass < 2; pass++) { // count, then fill
        unsigned long long *hsegs = NULL;
        if (pass == 1) {
            hsegs = (unsigned long long *)calloc((size_t)(nseg ? nseg : 1) * 4, sizeof *hsegs);
            g->seg_slot = (size_t *)calloc((size_t)(nseg ? nseg : 1), sizeof *g->seg_slot);
            g->h_partials = (double *)calloc((size_t)(nseg ? nseg : 1) * CL_SUMSQ_BLOCKS, sizeof(double));
            if (!hsegs || !g->seg_slot || !g->h_partials) {
                free(hsegs);
                return cs_fail(c, s, "calloc", "out of host memory", __FILE__, __LINE__);
            }
        }
        int k = 0;
        for (int i = 0; i < STAGE_NTENSORS; i++) {
            if (!s->sizes[i] || stage_norm_skips(o, i))
                continue;
            size_t off = 0, n = 0, rows = 1, stride = 0;
            const int sharded = cs_shard(o, i, r, c->tp, 1, &off, &n, &rows, &stride);
            if (!sharded && r != 0)
                continue;
            const int per_layer = gpt2_tensor_per_layer(i);
            const size_t per = per_layer ? gpt2_tensor_layer_size(&o->cfg, i) : s->sizes[i];
            for (int l = 0; l < (per_layer ? s->nl : 1); l++, k++) {
                if (pass == 0)
                    continue;
                hsegs[4 * k] = c->off[i] + (size_t)l * per + (sharded ? off : 0);
                hsegs[4 * k + 1] = sharded ? n : per;
                hsegs[4 * k + 2] = sharded ? rows : 1;
                hsegs[4 * k + 3] = sharded ? stride : 0;
                g->seg_slot[k] = stage_norm_slot(&o->cfg, stage_norm_tensor(o, i), o->layer0 + l);
            }
        }
        nseg = k;
        if (pass == 1) {
            g->nseg = nseg;
            rc = s_alloc(c, s, r, (void **)&g->segs, (size_t)(nseg ? nseg : 1) * 4 * sizeof *hsegs, "norm segments");
            if (!rc)
                rc = s_alloc(c, s, r, (void **)&g->partials,
                             (size_t)(nseg ? nseg : 1) * CL_SUMSQ_BLOCKS * sizeof(double), "norm partials");
            if (!rc) {
                cudaError_t ce = cudaMemcpyAsync(g->segs, hsegs, (size_t)nseg * 4 * sizeof *hsegs,
                                                 cudaMemcpyHostToDevice, g->st);
                if (ce == cudaSuccess) // hsegs is freed below
                    ce = cudaStreamSynchronize(g->st);
                if (ce != cudaSuccess)
                    rc = cs_fail(c, s, "cudaMemcpy(segs)", cudaGetErrorString(ce), __FILE__, __LINE__);
            }
            free(hsegs);
        }
    }
    return rc;
}

// rank r's device, stream, handles and memory
static int s_create_rank(cs_dev *c, stage_t *s, int r)
{
    const stage_opts_t *o = &s->o;
    cs_rank *g = &c->g[r];
    const int tp = c->tp;
    int rc;
    CK(cudaSetDevice(g->dev));
    CK(cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking));
    c->streams[r] = g->st;
    CKB(cublasLtCreate(&g->lt));
    if ((rc = s_alloc(c, s, r, &g->ws, CS_WORKSPACE, "the cuBLASLt workspace")) != 0)
        return rc;
    if ((rc = s_alloc(c, s, r, (void **)&g->colpart,
                      CL_COLPART_FLOATS(o->cfg.C, 4 * (size_t)o->cfg.C) * sizeof(float), "the column partial sums")) != 0)
        return rc;

    // parameters, gradients, moments: one allocation each, stage.c's carving, whole on every rank
    const size_t np = s->nparams;
    if ((rc = s_alloc(c, s, r, (void **)&g->params, np * sizeof(float), "parameters")) ||
        (rc = s_alloc(c, s, r, (void **)&g->grads, np * sizeof(float), "gradients")) ||
        (rc = s_alloc(c, s, r, (void **)&g->moments, 2 * np * sizeof(float), "AdamW moments")))
        return rc;
    // on the rank's stream (b_to_device says why), as everything that touches these later
    CK(cudaMemsetAsync(g->params, 0, np * sizeof(float), g->st));
    CK(cudaMemsetAsync(g->grads, 0, np * sizeof(float), g->st));
    CK(cudaMemsetAsync(g->moments, 0, 2 * np * sizeof(float), g->st));
    if (c->bf16) {
        if ((rc = s_alloc(c, s, r, (void **)&g->p16, np * sizeof(cu_bf16), "bf16 parameter copy")) != 0)
            return rc;
        CK(cudaMemsetAsync(g->p16, 0, np * sizeof(cu_bf16), g->st));
    }

    // activations: nslots x the size table, every tensor 256-byte aligned
    size_t asz[A_N], per_slot = 0;
    s_act_sizes(o, tp, asz);
    for (int i = 0; i < A_N; i++)
        per_slot += s_round(asz[i] * (k_act_is_x[i] ? c->xs : sizeof(float)));
    const size_t BT = (size_t)o->B * o->T, BTC = BT * o->cfg.C, BTCr = BTC / (size_t)tp;
    if ((rc = s_alloc(c, s, r, (void **)&g->acts, (size_t)o->nslots * per_slot, "activations")) ||
        (rc = s_alloc(c, s, r, (void **)&g->toks, (size_t)o->nslots * (5 * BT + 1) * sizeof(int), "tokens")))
        return rc;
    for (int k = 0; k < o->nslots; k++) {
        cs_slot *sl = &c->slots[k];
        char *a = g->acts + (size_t)k * per_slot;
        sl->tok[r] = g->toks + (size_t)k * (5 * BT + 1);
        sl->tgt[r] = sl->tok[r] + BT;
        if (r == 0)
            sl->rows = sl->tok[r] + 2 * BT;
        for (int i = 0; i < A_N; i++) {
            size_t b = s_round(asz[i] * (k_act_is_x[i] ? c->xs : sizeof(float)));
            sl->a[r][i] = asz[i] ? a : NULL;
            a += b;
        }
    }

    // backward scratch: dres, dbuf (B,T,C); dqkv (B,T,3C/tp); dbig (B,T,4C/tp) in X;
    // dsum (B,NH/tp,T) and the fp32 staging buffer (B,T,C)
    size_t sz[6] = { s_round(BTC * c->xs), s_round(BTC * c->xs), s_round(3 * BTCr * c->xs),
                     s_round(4 * BTCr * c->xs), s_round((size_t)o->B * (o->cfg.NH / tp) * o->T * sizeof(float)),
                     s_round(BTC * sizeof(float)) };
    size_t tot = 0;
    for (int i = 0; i < 6; i++)
        tot += sz[i];
    if ((rc = s_alloc(c, s, r, (void **)&g->scratch, tot, "backward scratch")) != 0)
        return rc;
    g->dres = g->scratch;
    g->dbuf = g->dres + sz[0];
    g->dqkv = g->dbuf + sz[1];
    g->dbig = g->dqkv + sz[2];
    g->dsum = (float *)(g->dbig + sz[3]);
    g->stage_f = (float *)((char *)g->dsum + sz[4]);
    return s_norm_segments(c, s, r);
}

static int s_create(stage_t *s, cs_dev *c)
{
    const stage_opts_t *o = &s->o;
    int ndev = 0, rc;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    for (int r = 0; r < c->tp; r++) {
        if (e != cudaSuccess || c->g[r].dev < 0 || c->g[r].dev >= ndev) {
            char why[200];
            snprintf(why, sizeof why, "no such device: cuda:%d%s (%d CUDA devices visible%s%s)", c->g[r].dev,
                     c->tp > 1 ? " (a tensor-parallel rank's GPU)" : "", e == cudaSuccess ? ndev : 0,
                     e == cudaSuccess ? "" : "; ", e == cudaSuccess ? "" : cudaGetErrorString(e));
            return cs_fail(c, s, "selecting the device", why, __FILE__, __LINE__);
        }
    }
#ifndef TAH_HAVE_NCCL
    if (c->tp > 1) {
        char why[200];
        snprintf(why, sizeof why, "tp=%d needs NCCL for the all-reduce, and this program was built without NCCL "
                 "(CMake did not find it); HINT: install NCCL (or set NCCL_HOME) and rebuild, or run tp=1", c->tp);
        return cs_fail(c, s, "tensor parallelism", why, __FILE__, __LINE__);
    }
#endif
    const int hs = o->cfg.C / o->cfg.NH;
    if (!cl_attention_supports(hs)) {
        char why[128];
        snprintf(why, sizeof why, "head size C/NH = %d not supported by the attention kernels (16, 32, 64, 128)", hs);
        return cs_fail(c, s, "checking the model", why, __FILE__, __LINE__);
    }
    CK(cudaSetDevice(c->g[0].dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, c->g[0].dev));
    snprintf(c->devname, sizeof c->devname, "%.63s", prop.name);
    {
        const char *pe = getenv("TAH_CU_PROFILE");
        if (pe && !strcmp(pe, "1")) {
            for (int k = 0; k < CS_NPEV; k++)
                CK(cudaEventCreate(&c->pev[k]));
            c->prof = 1;
        }
    }
    const size_t BT = (size_t)o->B * o->T;
    CK(cudaMallocHost((void **)&c->h_losses, (BT ? BT : 1) * sizeof(float)));
    if (o->first) {
        CK(cudaMallocHost((void **)&c->h_rows, (3 * BT + 1) * sizeof(int)));
        if (!(c->h_cnt = (int *)malloc((size_t)o->cfg.Vp * sizeof(int))))
            return cs_fail(c, s, "malloc", "out of host memory", __FILE__, __LINE__);
    }
    c->slots = (cs_slot *)calloc((size_t)o->nslots, sizeof *c->slots);
    if (!c->slots)
        return cs_fail(c, s, "calloc", "out of host memory", __FILE__, __LINE__);
    for (int k = 0; k < o->nslots; k++)
        c->slots[k].mb = -1;
    size_t off = 0;
    for (int i = 0; i < STAGE_NTENSORS; i++) {
        c->off[i] = off;
        off += s->sizes[i];
    }
    for (int r = 0; r < c->tp; r++)
        if ((rc = s_create_rank(c, s, r)) != 0)
            return rc;
#ifdef TAH_HAVE_NCCL
    if (c->tp > 1) {
        int devs[TP_MAX];
        for (int r = 0; r < c->tp; r++)
            devs[r] = c->g[r].dev;
        char why[512];
        cu_tp_t *tpc = cu_tp_new(c->tp, devs, &o->tp_rs, &o->tp_ag, BT * (size_t)o->cfg.C, why, sizeof why);
        if (!tpc)
            return cs_fail(c, s, "cu_tp_new (the NCCL group)", why, __FILE__, __LINE__);
        c->tpc = tpc;
        c->compressed = cu_tp_compressed(tpc);
    }
#endif
    return 0;
}

// ---- boundary tensors encoded on the device (stage_encode_boundary) ----
// Rank 0's tensor (every rank holds the same output; the input gradient is
// rank 0's). The codec runs on the stage's wire stream once the compute
// stream has produced the tensor (an event), bf16 activations read as bf16
// by the encoder (cu_codec_encode_x: the frame of the widened floats), then
// only the payload is copied to the host frame (page-locked when it comes
// from b_host_alloc). The call returns when the frame is sealed: the next
// forward / backward may reuse dres.

static int s_grow(cs_dev *c, const stage_t *s, void **p, size_t *have, size_t need, const char *what)
{
    if (need <= *have)
        return 0;
    cudaFree(*p);
    *p = NULL;
    *have = 0;
    int rc = s_alloc(c, s, 0, p, need, what);
    if (rc == 0)
        *have = need;
    return rc;
}

// stage_decode_boundary: on rank 0's device; a tensor-parallel stage's other ranks copy the
// decoded tensor from there when their forward / backward uploads it (s_upload)
static int s_decode(stage_t *s, int w, int mb, const uint8_t *frame, size_t len, double *norm, char *err,
                    size_t errlen)
{
    cs_dev *c = CS(s);
    codec_frame_info_t info;
    int rc = codec_frame_info(frame, len, &info, err, errlen);
    if (rc)
        return rc;
    const codec_shape_t shape = { (uint32_t)s->o.B, (uint32_t)s->o.T, (uint32_t)s->o.cfg.C };
    if (info.shape.b != shape.b || info.shape.s != shape.s || info.shape.c != shape.c) {
        snprintf(err, errlen, "frame of shape (%u,%u,%u), the stage's is (%u,%u,%u)", info.shape.b, info.shape.s,
                 info.shape.c, shape.b, shape.s, shape.c);
        return TAH_ESHAPE;
    }
    const size_t BTC = (size_t)shape.b * shape.s * shape.c, pay = len - CODEC_HEADER_SIZE;
    cs_rank *g = &c->g[0];
    CK(cudaSetDevice(g->dev));
    if (!c->dseg) {
        const unsigned long long seg[4] = { 0, BTC, 1, 0 };
        if ((rc = s_alloc(c, s, 0, (void **)&c->dseg, sizeof seg, "norm segment")) != 0 ||
            (rc = s_alloc(c, s, 0, (void **)&c->dpart, CL_SUMSQ_BLOCKS * sizeof(double), "norm partials")) != 0)
            return rc;
        CK(cudaMemcpyAsync(c->dseg, seg, sizeof seg, cudaMemcpyHostToDevice, g->st));
        CK(cudaStreamSynchronize(g->st));
        CK(cudaMallocHost((void **)&c->h_dpart, CL_SUMSQ_BLOCKS * sizeof(double)));
    }
    if ((rc = s_grow(c, s, &c->dscr, &c->dscr_n, cu_codec_scratch_bytes(&info.spec, shape), "codec scratch")) ||
        (rc = s_grow(c, s, (void **)&c->dpay, &c->dpay_n, pay ? pay : 1, "received payload")) ||
        (rc = s_grow(c, s, (void **)&c->dec[w], &c->dec_n[w], BTC * sizeof(float), "decoded tensor")))
        return rc;
    for (int r = 1; r < c->tp; r++) // rank r's copy of the tensor this decode overwrites
        if (c->g[r].decev)
            CK(cudaStreamWaitEvent(g->st, c->g[r].decev, 0));
    CK(cudaMemcpyAsync(c->dpay, frame + CODEC_HEADER_SIZE, pay, cudaMemcpyHostToDevice, g->st));
    if ((rc = cu_codec_decode(&info.spec, shape, c->dpay, c->dec[w], c->dscr, g->st, err, errlen)) != 0 ||
        (rc = cu_codec_status(c->dscr, g->st, err, errlen)) != 0)
        return rc == TAH_EDEVICE ? cs_fail(c, s, "cu_codec_decode", err, __FILE__, __LINE__) : rc;
    CK(cl_sumsq(c->dpart, c->dec[w], c->dseg, 1, g->st));
    CK(cudaMemcpyAsync(c->h_dpart, c->dpart, CL_SUMSQ_BLOCKS * sizeof(double), cudaMemcpyDeviceToHost, g->st));
    CK(cudaStreamSynchronize(g->st));
    double ss = 0.0;
    for (int j = 0; j < CL_SUMSQ_BLOCKS; j++)
        ss += c->h_dpart[j];
    *norm = sqrt(ss);
    c->dec_mb[w] = mb;
    return 0;
}

static int b_decode(stage_t *s, int what, int mb, const uint8_t *frame, size_t len, double *norm, char *err,
                    size_t errlen)
{
    cs_dev *c = CS(s);
    const int w = what == STAGE_WIRE_IN ? 0 : 1;
    c->dec_mb[w] = -1;
    int rc = c->failed ? TAH_EDEVICE : s_decode(s, w, mb, frame, len, norm, err, errlen);
    if (rc == TAH_EDEVICE)
        snprintf(err, errlen, "%s", c->err);
    return rc;
}

// Check the request (spec, frame of len bytes) and get the wire stream,
// codec scratch and payload buffer ready; then set it as c's request.
static int s_wire_prepare(stage_t *s, const codec_spec_t *spec, uint8_t *frame, size_t len, char *err, size_t errlen)
{
    cs_dev *c = CS(s);
    cs_rank *g = &c->g[0];
    const codec_shape_t shape = { (uint32_t)s->o.B, (uint32_t)s->o.T, (uint32_t)s->o.cfg.C };
    const size_t scr = cu_codec_scratch_bytes_x(spec, shape, c->bf16 ? CU_BF16 : CU_F32);
    if (!scr || len <= CODEC_HEADER_SIZE) {
        snprintf(err, errlen, "codec spec or shape (%u,%u,%u) not encodable on the device", shape.b, shape.s, shape.c);
        return TAH_EINVAL;
    }
    CK(cudaSetDevice(g->dev));
    if (!c->wst) {
        CK(cudaStreamCreateWithFlags(&c->wst, cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&c->wev, cudaEventDisableTiming));
    }
    int rc;
    if ((rc = s_grow(c, s, &c->wscr, &c->wscr_n, scr, "codec scratch")) != 0 ||
        (rc = s_grow(c, s, (void **)&c->wpay, &c->wpay_n, len - CODEC_HEADER_SIZE, "codec payload")) != 0)
        return rc;
    c->wspec = spec;
    c->wframe = frame;
    c->wlen = len;
    c->wlaunched = 0;
    return 0;
}

int cs_wire_launch(stage_t *s, const char *src)
{
    cs_dev *c = CS(s);
    cs_rank *g = &c->g[0];
    const codec_shape_t shape = { (uint32_t)s->o.B, (uint32_t)s->o.T, (uint32_t)s->o.cfg.C };
    CK(cudaSetDevice(g->dev));
    CK(cudaEventRecord(c->wev, g->st));
    CK(cudaStreamWaitEvent(c->wst, c->wev, 0));
    // no wait back: until the caller's s_wire_finish the compute streams do not touch src (dres
    // or the slot's output)
    char cerr[256] = "";
    int rc = cu_codec_encode_x(c->wspec, shape, c->bf16 ? CU_BF16 : CU_F32, src, c->wpay, c->wscr, c->wst, cerr,
                               sizeof cerr);
    if (rc) // the spec and shape passed s_wire_prepare: a launch failed
        return cs_fail(c, s, "cu_codec_encode_x", cerr, __FILE__, __LINE__);
    CK(cudaMemcpyAsync(c->wframe + CODEC_HEADER_SIZE, c->wpay, c->wlen - CODEC_HEADER_SIZE, cudaMemcpyDeviceToHost,
                       c->wst));
    c->wlaunched = 1;
    return 0;
}

// Wait for the launched encode, then seal the frame; clears the request.
static int s_wire_finish(stage_t *s, int what, char *err, size_t errlen)
{
    cs_dev *c = CS(s);
    const codec_shape_t shape = { (uint32_t)s->o.B, (uint32_t)s->o.T, (uint32_t)s->o.cfg.C };
    const codec_spec_t *spec = c->wspec;
    c->wspec = NULL;
    char cerr[256] = "";
    int rc = cu_codec_status(c->wscr, c->wst, cerr, sizeof cerr);
    if (rc == TAH_EDEVICE)
        return cs_fail(c, s, "cu_codec_status", cerr, __FILE__, __LINE__);
    if (rc == 0)
        rc = codec_frame_seal(spec, shape, c->wframe, c->wlen, cerr, sizeof cerr);
    if (rc)
        snprintf(err, errlen, "encoding the %s on cuda:%d: %s", what == STAGE_WIRE_OUT ? "output" : "input gradient",
                 c->g[0].dev, cerr);
    return rc;
}

static int s_encode(stage_t *s, int what, int mb, const codec_spec_t *spec, uint8_t *frame, size_t len, char *err,
                    size_t errlen)
{
    cs_dev *c = CS(s);
    const size_t BTC = (size_t)s->o.B * s->o.T * s->o.cfg.C;
    const char *src;
    if (what == STAGE_WIRE_OUT) {
        cs_slot *sl = mb >= 0 ? s_find(c, s, mb) : NULL;
        if (!sl) {
            snprintf(err, errlen, "micro-batch %d is not in flight: no output to encode", mb);
            return TAH_EINVAL;
        }
        src = s->nl ? sl->a[0][A_RES3] + (size_t)(s->nl - 1) * BTC * c->xs : sl->a[0][A_IN];
    } else {
        if (mb < 0 || c->dinp_mb != mb) {
            snprintf(err, errlen, "the last backward was not micro-batch %d: no input gradient to encode", mb);
            return TAH_EINVAL;
        }
        src = c->g[0].dres;
    }
    int rc = s_wire_prepare(s, spec, frame, len, err, errlen);
    if (!rc && (rc = cs_wire_launch(s, src)) != 0)
        c->wspec = NULL;
    return rc ? rc : s_wire_finish(s, what, err, errlen);
}

static int b_encode(stage_t *s, int what, int mb, const codec_spec_t *spec, uint8_t *frame, size_t len, char *err,
                    size_t errlen)
{
    cs_dev *c = CS(s);
    int rc = c->failed ? TAH_EDEVICE : s_encode(s, what, mb, spec, frame, len, err, errlen);
    if (c->failed)
        snprintf(err, errlen, "%s", c->err);
    return rc;
}

// stage_backward_encode: the backward with the request set, so that layer 0
// launches the encode of d(input) before its QKV weight gradients
// (cu_stage_pass.cu), then the wait and the seal.
static int b_backward_encode(stage_t *s, int mb, const float *dout, float dloss, const codec_spec_t *spec,
                             uint8_t *frame, size_t len, char *err, size_t errlen)
{
    cs_dev *c = CS(s);
    cs_slot *sl = mb >= 0 && !c->failed ? s_find(c, s, mb) : NULL;
    int rc = c->failed ? TAH_EDEVICE : !sl ? TAH_EINVAL : 0;
    if (rc == TAH_EINVAL)
        snprintf(err, errlen, "micro-batch %d is not in flight", mb);
    if (!rc && !s->o.last && !dout && s_take_decoded(c, 1, mb) != 0) {
        rc = TAH_EINVAL;
        snprintf(err, errlen, "no output gradient for micro-batch %d (none given, none decoded)", mb);
    }
    c->lasterr[0] = 0;
    if (!rc)
        rc = s_wire_prepare(s, spec, frame, len, err, errlen);
    if (!rc) {
        rc = cs_backward(s, sl, dout, dloss, NULL);
        c->dinp_mb = rc == 0 ? mb : -1;
        sl->mb = -1;
        if (rc == 0 && !c->wlaunched) // no layer deferred its gradients (a stage without layers)
            rc = cs_wire_launch(s, c->g[0].dres);
        if (rc == 0)
            rc = s_wire_finish(s, STAGE_WIRE_DINP, err, errlen);
        else if (!c->failed)
            snprintf(err, errlen, "%s", c->lasterr[0] ? c->lasterr : "backward failed");
        c->wspec = NULL;
        if (c->wst && rc != 0)
            cudaStreamSynchronize(c->wst); // a launched copy must not land in a frame the caller reuses
    }
    if (c->failed)
        snprintf(err, errlen, "%s", c->err);
    return rc;
}

static void *b_host_alloc(size_t bytes)
{
    void *p = NULL;
    return cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) == cudaSuccess ? p : NULL;
}

static void b_host_free(void *p)
{
    cudaFreeHost(p);
}

static void *b_create(stage_t *s, char *err, size_t errlen)
{
    cs_dev *c = (cs_dev *)calloc(1, sizeof *c);
    if (!c) {
        if (err)
            snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    c->tp = s->o.tp > 1 ? s->o.tp : 1;
    c->bf16 = s->o.precision == STAGE_BF16;
    const char *gf = getenv("TAH_CU_GELU_FUSE");
    c->gelu_fuse = c->bf16 && !(gf && !strcmp(gf, "0"));
    c->xs = c->bf16 ? sizeof(cu_bf16) : sizeof(float);
    c->dinp_mb = -1;
    c->dec_mb[0] = c->dec_mb[1] = -1;
    int n = 0;
    for (int r = 0; r < c->tp; r++) {
        c->g[r].dev = stage_device(&s->o, r);
        if (n >= 0 && (size_t)n < sizeof c->devlist)
            n += snprintf(c->devlist + n, sizeof c->devlist - (size_t)n, "%s%d", r ? "," : "", c->g[r].dev);
    }
    s->cu = c;
    if (s_create(s, c) != 0) {
        if (err)
            snprintf(err, errlen, "%s", c->err);
        b_destroy(s);
        return NULL;
    }
    return c;
}

static const stage_backend_t k_backend = {
    "cuda",        b_create,  b_destroy, b_forward,  b_backward,  b_discard, b_inflight, b_zero_grad,
    b_tied_sync_self, b_grad_sumsq, b_step, b_to_host, b_to_device, b_describe, b_error,
    b_encode,      b_backward_encode, b_decode, b_tied_rows, b_host_alloc, b_host_free,
};

extern "C" void cu_stage_register(void)
{
    stage_backend_register(&k_backend);
}

extern "C" int cu_stage_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

extern "C" int cu_stage_profile(stage_t *s, double *ms, const char **names, int max, int reset)
{
    if (!s || s->o.backend != STAGE_CUDA || !CS(s) || !CS(s)->prof)
        return 0;
    cs_dev *c = CS(s);
    int n = max < P_N ? max : P_N;
    for (int i = 0; i < n; i++) {
        if (ms)
            ms[i] = c->pms[i];
        if (names)
            names[i] = k_phase_name[i];
    }
    if (reset)
        memset(c->pms, 0, sizeof c->pms);
    return n;
}

// ---- test hook: attention alone ----

#define HK(call)                                                                                     \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) {                                                                     \
            if (err)                                                                                 \
                snprintf(err, errlen, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call,            \
                         cudaGetErrorString(e_));                                                    \
            rc = TAH_EDEVICE;                                                                        \
            goto out;                                                                                \
        }                                                                                            \
    } while (0)

template <class X>
static int s_attn_host(const float *qkv, const float *dout, float *out, float *lse, float *dqkv, int B, int T, int C,
                       int NH, char *err, size_t errlen)
{
    int rc = 0;
    const size_t BTC = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *f = NULL, *d_lse = NULL, *d_dsum = NULL;
    X *x_qkv = NULL, *x_out = NULL, *x_dout = NULL, *x_dqkv = NULL;
    HK(cudaMalloc((void **)&f, 3 * BTC * sizeof(float)));
    HK(cudaMalloc((void **)&d_lse, nl * sizeof(float)));
    HK(cudaMalloc((void **)&d_dsum, nl * sizeof(float)));
    HK(cudaMalloc((void **)&x_qkv, 3 * BTC * sizeof(X)));
    HK(cudaMalloc((void **)&x_out, BTC * sizeof(X)));
    HK(cudaMalloc((void **)&x_dout, BTC * sizeof(X)));
    HK(cudaMalloc((void **)&x_dqkv, 3 * BTC * sizeof(X)));
    HK(cudaMemset(x_out, 0xff, BTC * sizeof(X)));   // poison: NaN in both types
    HK(cudaMemset(x_dqkv, 0xff, 3 * BTC * sizeof(X)));
    HK(cudaMemcpy(f, qkv, 3 * BTC * sizeof(float), cudaMemcpyHostToDevice));
    HK(cl_from_f32<X>(x_qkv, f, 3 * BTC, 0));
    HK(cl_attention_forward<X>(x_out, d_lse, x_qkv, B, T, C, NH, 0));
    HK(cl_to_f32<X>(f, x_out, BTC, 0));
    HK(cudaMemcpy(out, f, BTC * sizeof(float), cudaMemcpyDeviceToHost));
    if (lse)
        HK(cudaMemcpy(lse, d_lse, nl * sizeof(float), cudaMemcpyDeviceToHost));
    if (dout && dqkv) {
        HK(cudaMemcpy(f, dout, BTC * sizeof(float), cudaMemcpyHostToDevice));
        HK(cl_from_f32<X>(x_dout, f, BTC, 0));
        HK(cl_attention_backward<X>(x_dqkv, d_dsum, x_dout, x_out, d_lse, x_qkv, B, T, C, NH, 0));
        HK(cl_to_f32<X>(f, x_dqkv, 3 * BTC, 0));
        HK(cudaMemcpy(dqkv, f, 3 * BTC * sizeof(float), cudaMemcpyDeviceToHost));
    }
    HK(cudaDeviceSynchronize());
out:
    cudaFree(f);
    cudaFree(d_lse);
    cudaFree(d_dsum);
    cudaFree(x_qkv);
    cudaFree(x_out);
    cudaFree(x_dout);
    cudaFree(x_dqkv);
    return rc;
}

extern "C" int cu_stage_attention_host(int device, int bf16, const float *qkv, const float *dout, float *out,
                                       float *lse, float *dqkv, int B, int T, int C, int NH, char *err,
                                       size_t errlen)
{
    int rc = 0;
    if (B < 1 || T < 1 || NH < 1 || C % NH || !cl_attention_supports(C / NH)) {
        if (err)
            snprintf(err, errlen, "attention: unsupported shape B=%d T=%d C=%d NH=%d", B, T, C, NH);
        return TAH_EINVAL;
    }
    HK(cudaSetDevice(device));
    rc = bf16 ? s_attn_host<cu_bf16>(qkv, dout, out, lse, dqkv, B, T, C, NH, err, errlen)
              : s_attn_host<float>(qkv, dout, out, lse, dqkv, B, T, C, NH, err, errlen);
out:
    return rc;
}

