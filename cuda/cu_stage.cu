// cu_stage.cu — the CUDA stage (cu_stage.h): device memory, slot
// bookkeeping, forward/backward orchestration through cuBLASLt and the
// kernels of cu_layers.cuh / cu_attn.cu, AdamW, norms, host syncs, and the
// stage_backend_t table. The structure follows pipeline/stage.c line by
// line; where the GPU version differs it says so:
//   - residual adds are fused into the projection GEMMs (C = x, beta = 1);
//   - cross-entropy keeps each row's logsumexp instead of probabilities
//     (the backward turns logits into dlogits in place);
//   - attention keeps only (B,NH,T) logsumexps (cu_attn.cu).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

extern "C" {
#include "errors.h"
#include "gpt2.h"          // gpt2_tensor_* , GPT2_*
#include "optim.h"         // optim_opts_t
#include "stage.h"         // stage_t, STAGE_*, stage_norm_slot
#include "stage_backend.h" // stage_backend_t, stage_backend_register
}
#include "cu_codec.h" // cu_codec_encode: boundary tensors encoded on the device
#include "cu_layers.cuh"
#include "cu_stage.h"

#define S_WORKSPACE (32u << 20) /* cuBLASLt workspace bytes */
#define S_ALIGN 256              /* byte alignment of every carved device tensor */
#define S_NCACHE 96              /* cached GEMM heuristics */
#define S_NPEV 512               /* profile events per forward / backward */

// TAH_CU_PROFILE=1: a CUDA event after every kernel group of s_forward and
// s_backward, the time since the previous event charged to its phase;
// read by cu_stage_profile (bench/bench_cu_stage.c). Off: no events.
enum {
    P_LN, P_MM_FWD, P_ATTN_FWD, P_GELU, P_HEAD_FWD, P_CE, P_CE_BWD, P_HEAD_BWD, P_MM_DX, P_MM_DW, P_BIAS_BWD,
    P_GELU_BWD, P_ATTN_BWD, P_LN_BWD, P_ENCODER, P_COPY, P_N
};
static const char *const k_phase_name[P_N] = { "layernorm",   "matmul fwd", "attn fwd",   "gelu",
                                               "head fwd",    "ce fwd",     "ce bwd",     "head bwd",
                                               "matmul dx",   "matmul dw",  "bias bwd",   "gelu bwd",
                                               "attn bwd",    "ln bwd",     "encoder",    "copies" };

enum {
    A_IN, A_LN1, A_LN1_MEAN, A_LN1_RSTD, A_QKV, A_ATTY, A_LSE, A_RES2, A_LN2, A_LN2_MEAN, A_LN2_RSTD, A_FCH, A_FCHG,
    A_RES3, A_LNF, A_LNF_MEAN, A_LNF_RSTD, A_LOGITS, A_LOSSES, A_ROWLSE, A_N
};
// 1: activation type X (fp32 or bf16), 0: always fp32
static const int k_act_is_x[A_N] = { 1, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 0, 0 };

struct s_slot {
    int mb;    // micro-batch id, -1 when free
    int *tok;  // (B,T) device
    int *tgt;  // (B,T) device
    char *a[A_N];
};

struct s_gemm_key {
    int m, n, k, ta, tb, beta, bias, abt, cdt, align;
};
struct s_gemm_entry {
    s_gemm_key key;
    cublasLtMatmulAlgo_t algo;
};

struct s_dev {
    int dev, bf16;
    size_t xs; // bytes per activation element
    cudaStream_t st;
    cublasLtHandle_t lt;
    void *ws;
    float *params, *grads, *moments; // device: nparams, nparams, 2 nparams
    cu_bf16 *p16;                    // bf16 copy of params (bf16 mode) or NULL
    size_t off[STAGE_NTENSORS];      // element offset of each tensor
    char *acts;                      // all slots
    int *toks;                       // all slots' tokens and targets
    s_slot *slots;
    char *scratch;                   // dres, dbuf, dqkv, dbig (X), dsum (float), stage (float)
    char *dres, *dbuf, *dqkv, *dbig;
    float *dsum, *stage_f;
    float *colpart;                  // column partial sums (LayerNorm / bias gradients, no atomics)
    float *h_losses;                 // host (B*T)
    unsigned long long *segs;        // device (off, n) pairs
    double *partials;                // device (nseg * CL_SUMSQ_BLOCKS)
    double *h_partials;              // host
    size_t *seg_slot;                // host: canonical norm slot of each segment
    int nseg;
    s_gemm_entry cache[S_NCACHE];
    int ncache;
    int prof;                  // TAH_CU_PROFILE=1
    cudaEvent_t pev[S_NPEV];   // events of the current forward / backward
    int pph[S_NPEV], npev;     // phase each event closes
    double pms[P_N];           // accumulated ms per phase
    // stage_encode_boundary: its own stream, codec scratch and payload buffer
    cudaStream_t wst;
    cudaEvent_t wev;
    void *wscr;
    uint8_t *wpay;
    size_t wscr_n, wpay_n;
    int dinp_mb; // micro-batch whose input gradient dres holds, -1 when none
    char devname[64];
    char err[512];
    int failed;
};

static s_dev *S(const stage_t *s)
{
    return (s_dev *)s->cu;
}

// ---- errors: the first one is kept, printed once, and sticks ----

static int s_fail(s_dev *c, const stage_t *s, const char *what, const char *why, const char *file, int line)
{
    if (!c->failed) {
        snprintf(c->err, sizeof c->err, "cuda:%d stage (layers %d..%d): %s:%d: %s failed: %s", c->dev,
                 s->o.layer0, s->o.layer1 - 1, file, line, what, why);
        fprintf(stderr, "tah: %s\n", c->err);
        c->failed = 1;
    }
    return TAH_EDEVICE;
}

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess)                                                                    \
            return s_fail(c, s, #call, cudaGetErrorString(e_), __FILE__, __LINE__);               \
    } while (0)
#define CKB(call)                                                                                 \
    do {                                                                                          \
        cublasStatus_t e_ = (call);                                                               \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                                          \
            return s_fail(c, s, #call, cublasLtGetStatusString(e_), __FILE__, __LINE__);          \
    } while (0)

// ---- profile (TAH_CU_PROFILE=1) ----

// record an event closing phase ph (-1: the start mark)
static void s_mark(s_dev *c, int ph)
{
    if (!c->prof || c->npev >= S_NPEV)
        return;
    if (cudaEventRecord(c->pev[c->npev], c->st) == cudaSuccess)
        c->pph[c->npev++] = ph;
}

// after a stream synchronize: charge the intervals to their phases
static void s_collect(s_dev *c)
{
    for (int k = 1; k < c->npev; k++) {
        float ms = 0.0f;
        if (c->pph[k] >= 0 && cudaEventElapsedTime(&ms, c->pev[k - 1], c->pev[k]) == cudaSuccess)
            c->pms[c->pph[k]] += ms;
    }
    c->npev = 0;
}

// ---- GEMM through cuBLASLt ----

static int s_align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a % (uintptr_t)al) != 0)
        al >>= 1;
    return al;
}

// Column-major D (m,n) = op(A) op(B) + beta * Cm (+ bias[m] over columns).
// A is (m,k) with lda = m, or stored (k,m) with lda = k when ta; B is (k,n)
// with ldb = k, or stored (n,k) with ldb = n when tb; Cm and D have ld = m.
// abt: type of A and B (and bias), cdt: type of Cm and D. fp32 compute, no TF32.
static int s_gemm_run(s_dev *c, const stage_t *s, void *D, const void *A, const void *Bm, const void *Cm,
                      const void *bias, int m, int n, int k, int ta, int tb, float alpha, float beta, cudaDataType_t abt,
                      cudaDataType_t cdt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t *lay,
                      cublasLtMatmulPreference_t *pref)
{
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!Cm)
        Cm = D;
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        int32_t bt = (int32_t)abt;
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    CKB(cublasLtMatrixLayoutCreate(&lay[0], abt, ta ? k : m, ta ? m : k, ta ? k : m));
    CKB(cublasLtMatrixLayoutCreate(&lay[1], abt, tb ? n : k, tb ? k : n, tb ? n : k));
    CKB(cublasLtMatrixLayoutCreate(&lay[2], cdt, m, n, m));
    CKB(cublasLtMatrixLayoutCreate(&lay[3], cdt, m, n, m));

    int al = s_align_of(D);
    const void *ps[4] = { A, Bm, Cm, bias };
    for (int i = 0; i < 4; i++)
        if (ps[i] && s_align_of(ps[i]) < al)
            al = s_align_of(ps[i]);
    s_gemm_key key = { m, n, k, ta, tb, beta != 0.0f, bias != NULL, (int)abt, (int)cdt, al };
    const cublasLtMatmulAlgo_t *algo = NULL;
    for (int i = 0; i < c->ncache; i++)
        if (!memcmp(&c->cache[i].key, &key, sizeof key)) {
            algo = &c->cache[i].algo;
            break;
        }
    if (!algo) {
        CKB(cublasLtMatmulPreferenceCreate(pref));
        size_t wsz = S_WORKSPACE;
        uint32_t a32 = (uint32_t)al;
        CKB(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
        CKB(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof a32));
        CKB(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a32, sizeof a32));
        CKB(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &a32, sizeof a32));
        CKB(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &a32, sizeof a32));
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        CKB(cublasLtMatmulAlgoGetHeuristic(c->lt, op, lay[0], lay[1], lay[2], lay[3], *pref, 1, &res, &found));
        if (found < 1) {
            char why[160];
            snprintf(why, sizeof why, "no cuBLASLt algorithm for m=%d n=%d k=%d ta=%d tb=%d types %d/%d align %d",
                     m, n, k, ta, tb, (int)abt, (int)cdt, al);
            return s_fail(c, s, "cublasLtMatmulAlgoGetHeuristic", why, __FILE__, __LINE__);
        }
        if (c->ncache == S_NCACHE)
            c->ncache = 0; // simple wrap: the working set of one stage is far smaller
        c->cache[c->ncache].key = key;
        c->cache[c->ncache].algo = res.algo;
        algo = &c->cache[c->ncache++].algo;
    }
    CKB(cublasLtMatmul(c->lt, op, &alpha, A, lay[0], Bm, lay[1], &beta, Cm, lay[2], D, lay[3], algo, c->ws,
                       S_WORKSPACE, c->st));
    return 0;
}

static int s_gemm(s_dev *c, const stage_t *s, void *D, const void *A, const void *Bm, const void *Cm,
                  const void *bias, int m, int n, int k, int ta, int tb, float alpha, float beta, cudaDataType_t abt,
                  cudaDataType_t cdt)
{
    if (c->failed)
        return TAH_EDEVICE;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t lay[4] = { NULL, NULL, NULL, NULL };
    cublasLtMatmulPreference_t pref = NULL;
    int rc = 0;
    cublasStatus_t e = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (e != CUBLAS_STATUS_SUCCESS)
        return s_fail(c, s, "cublasLtMatmulDescCreate", cublasLtGetStatusString(e), __FILE__, __LINE__);
    rc = s_gemm_run(c, s, D, A, Bm, Cm, bias, m, n, k, ta, tb, alpha, beta, abt, cdt, op, lay, &pref);
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < 4; i++)
        if (lay[i])
            cublasLtMatrixLayoutDestroy(lay[i]);
    cublasLtMatmulDescDestroy(op);
    return rc;
}

// ---- the stage's tensors ----

template <class X> static cudaDataType_t s_dt(void);
template <> cudaDataType_t s_dt<float>(void) { return CUDA_R_32F; }
template <> cudaDataType_t s_dt<cu_bf16>(void) { return CUDA_R_16BF; }

// weight (or bias) tensor i at element offset off, in the GEMM operand type
template <class X> static const X *s_w(s_dev *c, int i, size_t off);
template <> const float *s_w<float>(s_dev *c, int i, size_t off) { return c->params + c->off[i] + off; }
template <> const cu_bf16 *s_w<cu_bf16>(s_dev *c, int i, size_t off) { return c->p16 + c->off[i] + off; }

static float *s_p(s_dev *c, int i, size_t off) { return c->params + c->off[i] + off; }
static float *s_g(s_dev *c, int i, size_t off) { return c->grads + c->off[i] + off; }

// out (N,OC) = inp (N,C) @ W^T (W (OC,C)) + bias (+ res when given)   [matmul_forward]
template <class X>
static int s_mm_fwd(s_dev *c, const stage_t *s, X *out, const X *inp, const X *w, const X *bias, const X *res, int N,
                    int C, int OC, int head = 0)
{
    int rc = s_gemm(c, s, out, w, inp, res, bias, OC, N, C, 1, 0, 1.0f, res ? 1.0f : 0.0f, s_dt<X>(), s_dt<X>());
    s_mark(c, head ? P_HEAD_FWD : P_MM_FWD);
    return rc;
}

// dinp (=) dout @ W; dW += dout^T @ inp; dbias += colsum(dout)   [matmul_backward]
template <class X>
static int s_mm_bwd(s_dev *c, const stage_t *s, X *dinp, float *dw, float *db, const X *dout, const X *inp,
                    const X *w, int N, int C, int OC, int head = 0, float alpha = 1.0f)
{
    int rc = 0;
    if (dinp &&
        (rc = s_gemm(c, s, dinp, w, dout, NULL, NULL, C, N, OC, 0, 0, alpha, 0.0f, s_dt<X>(), s_dt<X>())) != 0)
        return rc;
    s_mark(c, head ? P_HEAD_BWD : P_MM_DX);
    if ((rc = s_gemm(c, s, dw, inp, dout, dw, NULL, C, OC, N, 0, 1, alpha, 1.0f, s_dt<X>(), CUDA_R_32F)) != 0)
        return rc;
    s_mark(c, head ? P_HEAD_BWD : P_MM_DW);
    if (db) {
        CK(cl_bias_backward<X>(db, dout, N, OC, c->colpart, c->st));
        s_mark(c, P_BIAS_BWD);
    }
    return 0;
}

static s_slot *s_find(s_dev *c, const stage_t *s, int mb)
{
    for (int k = 0; k < s->o.nslots; k++)
        if (c->slots[k].mb == mb)
            return &c->slots[k];
    return NULL;
}

static void s_act_sizes(const stage_opts_t *o, size_t a[A_N])
{
    size_t B = (size_t)o->B, T = (size_t)o->T, C = (size_t)o->cfg.C, NH = (size_t)o->cfg.NH;
    size_t nl = (size_t)(o->layer1 - o->layer0), BT = B * T, lastf = o->last ? 1 : 0;
    a[A_IN] = BT * C;
    a[A_LN1] = nl * BT * C;
    a[A_LN1_MEAN] = a[A_LN1_RSTD] = nl * BT;
    a[A_QKV] = nl * BT * 3 * C;
    a[A_ATTY] = nl * BT * C;
    a[A_LSE] = nl * B * NH * T;
    a[A_RES2] = nl * BT * C;
    a[A_LN2] = nl * BT * C;
    a[A_LN2_MEAN] = a[A_LN2_RSTD] = nl * BT;
    a[A_FCH] = a[A_FCHG] = nl * BT * 4 * C;
    a[A_RES3] = nl * BT * C;
    a[A_LNF] = lastf * BT * C;
    a[A_LNF_MEAN] = a[A_LNF_RSTD] = lastf * BT;
    a[A_LOGITS] = lastf * BT * (size_t)o->cfg.Vp;
    a[A_LOSSES] = a[A_ROWLSE] = lastf * BT;
}

static size_t s_round(size_t bytes)
{
    return (bytes + S_ALIGN - 1) / S_ALIGN * S_ALIGN;
}

// ---- forward / backward ----

template <class X>
static int s_forward(stage_t *s, s_slot *sl, const int *tokens, const float *in, const int *targets, float *out,
                     float *loss)
{
    s_dev *c = S(s);
    const int B = s->o.B, T = s->o.T, C = s->o.cfg.C, NH = s->o.cfg.NH;
    const int BT = B * T;
    const size_t BTC = (size_t)BT * C, C1 = (size_t)C;
    X *a_in = (X *)sl->a[A_IN];
    int rc;

    s_mark(c, -1);
    if (s->o.first) {
        CK(cudaMemcpyAsync(sl->tok, tokens, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, c->st));
        CK(cl_encoder_forward<X>(a_in, sl->tok, s_p(c, GPT2_WTE, 0), s_p(c, GPT2_WPE, 0), B, T, C, c->st));
    } else if (sizeof(X) == sizeof(float)) {
        CK(cudaMemcpyAsync(a_in, in, BTC * sizeof(float), cudaMemcpyHostToDevice, c->st));
    } else {
        CK(cudaMemcpyAsync(c->stage_f, in, BTC * sizeof(float), cudaMemcpyHostToDevice, c->st));
        CK(cl_from_f32<X>(a_in, c->stage_f, BTC, c->st));
    }
    if (s->o.last)
        CK(cudaMemcpyAsync(sl->tgt, targets, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, c->st));
    s_mark(c, P_ENCODER);

    const X *x = a_in;
    for (int l = 0; l < s->nl; l++) {
        X *ln1 = (X *)sl->a[A_LN1] + l * BTC, *qkv = (X *)sl->a[A_QKV] + l * 3 * BTC;
        X *atty = (X *)sl->a[A_ATTY] + l * BTC, *res2 = (X *)sl->a[A_RES2] + l * BTC;
        X *ln2 = (X *)sl->a[A_LN2] + l * BTC, *fch = (X *)sl->a[A_FCH] + l * 4 * BTC;
        X *fchg = (X *)sl->a[A_FCHG] + l * 4 * BTC, *res3 = (X *)sl->a[A_RES3] + l * BTC;
        float *ln1_mean = (float *)sl->a[A_LN1_MEAN] + (size_t)l * BT;
        float *ln1_rstd = (float *)sl->a[A_LN1_RSTD] + (size_t)l * BT;
        float *ln2_mean = (float *)sl->a[A_LN2_MEAN] + (size_t)l * BT;
        float *ln2_rstd = (float *)sl->a[A_LN2_RSTD] + (size_t)l * BT;
        float *lse = (float *)sl->a[A_LSE] + (size_t)l * B * NH * T;

        CK(cl_layernorm_forward<X>(ln1, ln1_mean, ln1_rstd, x, s_p(c, GPT2_LN1W, l * C1), s_p(c, GPT2_LN1B, l * C1),
                                   BT, C, c->st));
        s_mark(c, P_LN);
        if ((rc = s_mm_fwd<X>(c, s, qkv, ln1, s_w<X>(c, GPT2_QKVW, l * 3 * C1 * C1), s_w<X>(c, GPT2_QKVB, l * 3 * C1),
                              NULL, BT, C, 3 * C)) != 0)
            return rc;
        CK(cl_attention_forward<X>(atty, lse, qkv, B, T, C, NH, c->st));
        s_mark(c, P_ATTN_FWD);
        // res2 = x + atty @ attprojw^T + attprojb (residual fused: C = x)
        if ((rc = s_mm_fwd<X>(c, s, res2, atty, s_w<X>(c, GPT2_ATTPROJW, l * C1 * C1),
                              s_w<X>(c, GPT2_ATTPROJB, l * C1), x, BT, C, C)) != 0)
            return rc;
        CK(cl_layernorm_forward<X>(ln2, ln2_mean, ln2_rstd, res2, s_p(c, GPT2_LN2W, l * C1),
                                   s_p(c, GPT2_LN2B, l * C1), BT, C, c->st));
        s_mark(c, P_LN);
        if ((rc = s_mm_fwd<X>(c, s, fch, ln2, s_w<X>(c, GPT2_FCW, l * 4 * C1 * C1), s_w<X>(c, GPT2_FCB, l * 4 * C1),
                              NULL, BT, C, 4 * C)) != 0)
            return rc;
        CK(cl_gelu_forward<X>(fchg, fch, 4 * BTC, c->st));
        s_mark(c, P_GELU);
        if ((rc = s_mm_fwd<X>(c, s, res3, fchg, s_w<X>(c, GPT2_FCPROJW, l * 4 * C1 * C1),
                              s_w<X>(c, GPT2_FCPROJB, l * C1), res2, BT, 4 * C, C)) != 0)
            return rc;
        x = res3;
    }

    if (s->o.last) {
        const int V = s->o.cfg.V, Vp = s->o.cfg.Vp;
        X *lnf = (X *)sl->a[A_LNF], *logits = (X *)sl->a[A_LOGITS];
        float *losses = (float *)sl->a[A_LOSSES];
        CK(cl_layernorm_forward<X>(lnf, (float *)sl->a[A_LNF_MEAN], (float *)sl->a[A_LNF_RSTD], x,
                                   s_p(c, GPT2_LNFW, 0), s_p(c, GPT2_LNFB, 0), BT, C, c->st));
        s_mark(c, P_LN);
        if ((rc = s_mm_fwd<X>(c, s, logits, lnf, s_w<X>(c, STAGE_HEAD, 0), NULL, NULL, BT, C, Vp, 1)) != 0)
            return rc;
        if (cl_crossentropy_fusable<X>(logits, Vp))
            CK(cl_crossentropy_fused<X>(losses, (float *)sl->a[A_ROWLSE], logits, sl->tgt, BT, V, Vp, c->st));
        else
            CK(cl_crossentropy_forward<X>(losses, (float *)sl->a[A_ROWLSE], logits, sl->tgt, BT, V, Vp, c->st));
        s_mark(c, P_CE);
        CK(cudaMemcpyAsync(c->h_losses, losses, (size_t)BT * sizeof(float), cudaMemcpyDeviceToHost, c->st));
        CK(cudaStreamSynchronize(c->st));
        double sum = 0.0;
        for (int i = 0; i < BT; i++)
            sum += c->h_losses[i];
        if (loss)
            *loss = (float)(sum / BT);
    } else if (out) {
        if (sizeof(X) == sizeof(float)) {
            CK(cudaMemcpyAsync(out, x, BTC * sizeof(float), cudaMemcpyDeviceToHost, c->st));
        } else {
            CK(cl_to_f32<X>(c->stage_f, x, BTC, c->st));
            CK(cudaMemcpyAsync(out, c->stage_f, BTC * sizeof(float), cudaMemcpyDeviceToHost, c->st));
        }
        CK(cudaStreamSynchronize(c->st));
    } else {
        CK(cudaStreamSynchronize(c->st));
    }
    s_collect(c);
    return 0;
}

template <class X> static int s_backward(stage_t *s, s_slot *sl, const float *dout, float dloss, float *dinp)
{
    s_dev *c = S(s);
    const int B = s->o.B, T = s->o.T, C = s->o.cfg.C, NH = s->o.cfg.NH;
    const int BT = B * T;
    const size_t BTC = (size_t)BT * C, C1 = (size_t)C;
    X *dres = (X *)c->dres, *dbuf = (X *)c->dbuf, *dqkv = (X *)c->dqkv, *dbig = (X *)c->dbig;
    int rc;

    s_mark(c, -1);
    if (s->o.last) {
        const int V = s->o.cfg.V, Vp = s->o.cfg.Vp;
        const X *xlast = (X *)sl->a[A_RES3] + (size_t)(s->nl - 1) * BTC;
        X *logits = (X *)sl->a[A_LOGITS], *lnf = (X *)sl->a[A_LNF];
        // the fused forward left softmax - onehot in logits: dloss is the GEMMs' alpha
        float alpha = dloss;
        if (!cl_crossentropy_fusable<X>(logits, Vp)) {
            CK(cl_crossentropy_backward<X>(logits, (float *)sl->a[A_ROWLSE], sl->tgt, dloss, BT, V, Vp, c->st));
            alpha = 1.0f;
        }
        s_mark(c, P_CE_BWD);
        if ((rc = s_mm_bwd<X>(c, s, dbuf, s_g(c, STAGE_HEAD, 0), NULL, logits, lnf, s_w<X>(c, STAGE_HEAD, 0), BT, C,
                              Vp, 1, alpha)) != 0)
            return rc;
        CK(cudaMemsetAsync(dres, 0, BTC * sizeof(X), c->st));
        CK(cl_layernorm_backward<X>(dres, s_g(c, GPT2_LNFW, 0), s_g(c, GPT2_LNFB, 0), dbuf, xlast,
                                    s_p(c, GPT2_LNFW, 0), (float *)sl->a[A_LNF_MEAN], (float *)sl->a[A_LNF_RSTD], BT,
                                    C, c->colpart, c->st));
        s_mark(c, P_LN_BWD);
    } else if (sizeof(X) == sizeof(float)) {
        CK(cudaMemcpyAsync(dres, dout, BTC * sizeof(float), cudaMemcpyHostToDevice, c->st));
    } else {
        CK(cudaMemcpyAsync(c->stage_f, dout, BTC * sizeof(float), cudaMemcpyHostToDevice, c->st));
        CK(cl_from_f32<X>(dres, c->stage_f, BTC, c->st));
    }

    for (int l = s->nl - 1; l >= 0; l--) {
        const X *x = l == 0 ? (X *)sl->a[A_IN] : (X *)sl->a[A_RES3] + (size_t)(l - 1) * BTC;
        const X *ln1 = (X *)sl->a[A_LN1] + l * BTC, *qkv = (X *)sl->a[A_QKV] + l * 3 * BTC;
        const X *atty = (X *)sl->a[A_ATTY] + l * BTC, *res2 = (X *)sl->a[A_RES2] + l * BTC;
        const X *ln2 = (X *)sl->a[A_LN2] + l * BTC, *fch = (X *)sl->a[A_FCH] + l * 4 * BTC;
        const X *fchg = (X *)sl->a[A_FCHG] + l * 4 * BTC;
        const float *ln1_mean = (float *)sl->a[A_LN1_MEAN] + (size_t)l * BT;
        const float *ln1_rstd = (float *)sl->a[A_LN1_RSTD] + (size_t)l * BT;
        const float *ln2_mean = (float *)sl->a[A_LN2_MEAN] + (size_t)l * BT;
        const float *ln2_rstd = (float *)sl->a[A_LN2_RSTD] + (size_t)l * BT;
        const float *lse = (float *)sl->a[A_LSE] + (size_t)l * B * NH * T;

        // MLP: dres holds d(res3)
        if ((rc = s_mm_bwd<X>(c, s, dbig, s_g(c, GPT2_FCPROJW, l * 4 * C1 * C1), s_g(c, GPT2_FCPROJB, l * C1), dres,
                              fchg, s_w<X>(c, GPT2_FCPROJW, l * 4 * C1 * C1), BT, 4 * C, C)) != 0)
            return rc;
        CK(cl_gelu_backward<X>(dbig, fch, dbig, 4 * BTC, c->st));
        s_mark(c, P_GELU_BWD);
        if ((rc = s_mm_bwd<X>(c, s, dbuf, s_g(c, GPT2_FCW, l * 4 * C1 * C1), s_g(c, GPT2_FCB, l * 4 * C1), dbig, ln2,
                              s_w<X>(c, GPT2_FCW, l * 4 * C1 * C1), BT, C, 4 * C)) != 0)
            return rc;
        CK(cl_layernorm_backward<X>(dres, s_g(c, GPT2_LN2W, l * C1), s_g(c, GPT2_LN2B, l * C1), dbuf, res2,
                                    s_p(c, GPT2_LN2W, l * C1), ln2_mean, ln2_rstd, BT, C, c->colpart, c->st));
        s_mark(c, P_LN_BWD);
        // attention: dres holds d(res2)
        if ((rc = s_mm_bwd<X>(c, s, dbuf, s_g(c, GPT2_ATTPROJW, l * C1 * C1), s_g(c, GPT2_ATTPROJB, l * C1), dres,
                              atty, s_w<X>(c, GPT2_ATTPROJW, l * C1 * C1), BT, C, C)) != 0)
            return rc;
        CK(cl_attention_backward<X>(dqkv, c->dsum, dbuf, atty, lse, qkv, B, T, C, NH, c->st));
        s_mark(c, P_ATTN_BWD);
        if ((rc = s_mm_bwd<X>(c, s, dbuf, s_g(c, GPT2_QKVW, l * 3 * C1 * C1), s_g(c, GPT2_QKVB, l * 3 * C1), dqkv,
                              ln1, s_w<X>(c, GPT2_QKVW, l * 3 * C1 * C1), BT, C, 3 * C)) != 0)
            return rc;
        CK(cl_layernorm_backward<X>(dres, s_g(c, GPT2_LN1W, l * C1), s_g(c, GPT2_LN1B, l * C1), dbuf, x,
                                    s_p(c, GPT2_LN1W, l * C1), ln1_mean, ln1_rstd, BT, C, c->colpart, c->st));
        s_mark(c, P_LN_BWD);
        // dres holds d(x)
    }

    if (s->o.first) {
        CK(cl_encoder_backward<X>(s_g(c, GPT2_WTE, 0), s_g(c, GPT2_WPE, 0), dres, sl->tok, B, T, C, c->st));
        s_mark(c, P_ENCODER);
        CK(cudaStreamSynchronize(c->st));
    } else if (dinp) {
        if (sizeof(X) == sizeof(float)) {
            CK(cudaMemcpyAsync(dinp, dres, BTC * sizeof(float), cudaMemcpyDeviceToHost, c->st));
        } else {
            CK(cl_to_f32<X>(c->stage_f, dres, BTC, c->st));
            CK(cudaMemcpyAsync(dinp, c->stage_f, BTC * sizeof(float), cudaMemcpyDeviceToHost, c->st));
        }
        CK(cudaStreamSynchronize(c->st));
    } else {
        CK(cudaStreamSynchronize(c->st));
    }
    s_collect(c);
    return 0;
}

// ---- the backend table ----

static int b_forward(stage_t *s, int mb, const int *tokens, const float *in, const int *targets, float *out,
                     float *loss)
{
    s_dev *c = S(s);
    if (c->failed)
        return TAH_EDEVICE;
    if (mb < 0 || s_find(c, s, mb))
        return TAH_EINVAL;
    s_slot *sl = s_find(c, s, -1);
    if (!sl)
        return TAH_EINVAL;
    CK(cudaSetDevice(c->dev));
    int rc = c->bf16 ? s_forward<cu_bf16>(s, sl, tokens, in, targets, out, loss)
                     : s_forward<float>(s, sl, tokens, in, targets, out, loss);
    if (rc == 0)
        sl->mb = mb;
    return rc;
}

static int b_backward(stage_t *s, int mb, const float *dout, float dloss, float *dinp)
{
    s_dev *c = S(s);
    if (c->failed)
        return TAH_EDEVICE;
    s_slot *sl = mb >= 0 ? s_find(c, s, mb) : NULL;
    if (!sl)
        return TAH_EINVAL;
    CK(cudaSetDevice(c->dev));
    int rc = c->bf16 ? s_backward<cu_bf16>(s, sl, dout, dloss, dinp) : s_backward<float>(s, sl, dout, dloss, dinp);
    c->dinp_mb = rc == 0 && !s->o.first ? mb : -1;
    sl->mb = -1;
    return rc;
}

static void b_discard(stage_t *s, int mb)
{
    s_dev *c = S(s);
    s_slot *sl = mb >= 0 ? s_find(c, s, mb) : NULL;
    if (sl)
        sl->mb = -1;
}

static int b_inflight(const stage_t *s)
{
    s_dev *c = S(s);
    int n = 0;
    for (int k = 0; k < s->o.nslots; k++)
        n += c->slots[k].mb >= 0;
    return n;
}

static int s_zero_grad(stage_t *s)
{
    s_dev *c = S(s);
    if (c->failed)
        return TAH_EDEVICE;
    CK(cudaSetDevice(c->dev));
    CK(cudaMemsetAsync(c->grads, 0, s->nparams * sizeof(float), c->st));
    CK(cudaStreamSynchronize(c->st));
    return 0;
}

static void b_zero_grad(stage_t *s)
{
    (void)s_zero_grad(s);
}

static int s_tied_sync_self(stage_t *s)
{
    s_dev *c = S(s);
    if (c->failed)
        return TAH_EDEVICE;
    CK(cudaSetDevice(c->dev));
    CK(cl_tied_sum(s_g(c, GPT2_WTE, 0), s_g(c, STAGE_HEAD, 0), s->sizes[GPT2_WTE], c->st));
    CK(cudaStreamSynchronize(c->st));
    return 0;
}

static void b_tied_sync_self(stage_t *s)
{
    (void)s_tied_sync_self(s);
}

static int s_grad_sumsq(stage_t *s, double *slots)
{
    s_dev *c = S(s);
    if (c->failed)
        return TAH_EDEVICE;
    CK(cudaSetDevice(c->dev));
    CK(cl_sumsq(c->partials, c->grads, c->segs, c->nseg, c->st));
    CK(cudaMemcpyAsync(c->h_partials, c->partials, (size_t)c->nseg * CL_SUMSQ_BLOCKS * sizeof(double),
                       cudaMemcpyDeviceToHost, c->st));
    CK(cudaStreamSynchronize(c->st));
    for (int k = 0; k < c->nseg; k++) {
        double acc = 0.0;
        for (int j = 0; j < CL_SUMSQ_BLOCKS; j++)
            acc += c->h_partials[(size_t)k * CL_SUMSQ_BLOCKS + j];
        slots[c->seg_slot[k]] += acc;
    }
    return 0;
}

static void b_grad_sumsq(stage_t *s, double *slots)
{
    (void)s_grad_sumsq(s, slots);
}

static int s_step(stage_t *s, const optim_opts_t *o, float lr, float grad_scale)
{
    s_dev *c = S(s);
    if (c->failed)
        return TAH_EDEVICE;
    CK(cudaSetDevice(c->dev));
    cl_adamw_tensors t;
    memset(&t, 0, sizeof t);
    for (int i = 0; i < STAGE_NTENSORS; i++) {
        if (!s->sizes[i])
            continue;
        int matrix = i == STAGE_HEAD || gpt2_tensor_is_matrix(i);
        t.off[t.count] = c->off[i];
        t.n[t.count] = s->sizes[i];
        t.wd[t.count] = matrix ? o->weight_decay : 0.0f;
        t.count++;
    }
    // the bias corrections exactly as optim_adamw computes them
    const float bc1 = (float)(1.0 - pow((double)o->beta1, (double)s->t));
    const float bc2 = (float)(1.0 - pow((double)o->beta2, (double)s->t));
    CK(cl_adamw(c->params, c->p16, c->moments, c->moments + s->nparams, c->grads, &t, lr, o->beta1, o->beta2, o->eps,
                bc1, bc2, grad_scale, c->st));
    CK(cudaStreamSynchronize(c->st));
    return 0;
}

static void b_step(stage_t *s, const optim_opts_t *o, float lr, float grad_scale)
{
    (void)s_step(s, o, lr, grad_scale);
}

static int b_to_host(const stage_t *cs, int what)
{
    stage_t *s = (stage_t *)cs; // the host mirrors are a cache of the device state
    s_dev *c = S(s);
    if (c->failed)
        return TAH_EDEVICE;
    CK(cudaSetDevice(c->dev));
    CK(cudaStreamSynchronize(c->st));
    if (what & STAGE_SYNC_PARAMS)
        CK(cudaMemcpy(s->params, c->params, s->nparams * sizeof(float), cudaMemcpyDeviceToHost));
    if (what & STAGE_SYNC_MOMENTS)
        CK(cudaMemcpy(s->moments, c->moments, 2 * s->nparams * sizeof(float), cudaMemcpyDeviceToHost));
    if (what & STAGE_SYNC_GRADS)
        CK(cudaMemcpy(s->grads, c->grads, s->nparams * sizeof(float), cudaMemcpyDeviceToHost));
    if (what & STAGE_SYNC_TIED) {
        for (int i = 0; i < STAGE_NTENSORS; i++)
            if ((i == GPT2_WTE || i == STAGE_HEAD) && s->sizes[i])
                CK(cudaMemcpy(s->g[i], s_g(c, i, 0), s->sizes[i] * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return 0;
}

static int b_to_device(stage_t *s, int what)
{
    s_dev *c = S(s);
    if (c->failed)
        return TAH_EDEVICE;
    CK(cudaSetDevice(c->dev));
    CK(cudaStreamSynchronize(c->st));
    if (what & STAGE_SYNC_PARAMS) {
        CK(cudaMemcpy(c->params, s->params, s->nparams * sizeof(float), cudaMemcpyHostToDevice));
        if (c->p16) {
            CK(cl_from_f32<cu_bf16>(c->p16, c->params, s->nparams, c->st));
            CK(cudaStreamSynchronize(c->st));
        }
    }
    if (what & STAGE_SYNC_MOMENTS)
        CK(cudaMemcpy(c->moments, s->moments, 2 * s->nparams * sizeof(float), cudaMemcpyHostToDevice));
    if (what & STAGE_SYNC_GRADS)
        CK(cudaMemcpy(c->grads, s->grads, s->nparams * sizeof(float), cudaMemcpyHostToDevice));
    if (what & STAGE_SYNC_TIED) {
        for (int i = 0; i < STAGE_NTENSORS; i++)
            if ((i == GPT2_WTE || i == STAGE_HEAD) && s->sizes[i])
                CK(cudaMemcpy(s_g(c, i, 0), s->g[i], s->sizes[i] * sizeof(float), cudaMemcpyHostToDevice));
    }
    return 0;
}

static void b_describe(const stage_t *s, char *buf, size_t buflen)
{
    s_dev *c = S(s);
    snprintf(buf, buflen, "layers %d..%d%s%s, %zu params, cuda backend (cuda:%d %s, %s, cuBLASLt)", s->o.layer0,
             s->o.layer1 - 1, s->o.first ? ", embeddings" : "",
             s->o.last ? (s->o.tied ? ", lnf + tied head + loss" : ", lnf + untied head + loss") : "", s->nparams,
             c->dev, c->devname, c->bf16 ? "bf16 activations, fp32 master weights" : "fp32");
}

static const char *b_error(const stage_t *s)
{
    s_dev *c = S(s);
    return c->failed ? c->err : NULL;
}

static void b_destroy(stage_t *s)
{
    s_dev *c = S(s);
    if (!c)
        return;
    if (c->st) { // created on a valid device
        cudaSetDevice(c->dev);
        cudaStreamSynchronize(c->st);
    }
    cudaFree(c->params);
    cudaFree(c->grads);
    cudaFree(c->moments);
    cudaFree(c->p16);
    cudaFree(c->acts);
    cudaFree(c->toks);
    cudaFree(c->scratch);
    cudaFree(c->ws);
    cudaFree(c->colpart);
    cudaFree(c->segs);
    cudaFree(c->partials);
    cudaFreeHost(c->h_losses);
    cudaFree(c->wscr);
    cudaFree(c->wpay);
    if (c->wst)
        cudaStreamDestroy(c->wst);
    if (c->wev)
        cudaEventDestroy(c->wev);
    free(c->h_partials);
    free(c->seg_slot);
    free(c->slots);
    if (c->lt)
        cublasLtDestroy(c->lt);
    if (c->st)
        cudaStreamDestroy(c->st);
    if (c->prof)
        for (int k = 0; k < S_NPEV; k++)
            cudaEventDestroy(c->pev[k]);
    free(c);
    s->cu = NULL;
    (void)cudaGetLastError(); // a failed creation must not leave its error to the next stage's launch check
}

static int s_alloc(s_dev *c, const stage_t *s, void **p, size_t bytes, const char *what)
{
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        char why[256];
        snprintf(why, sizeof why, "%s (%.2f GiB for %s; B=%d, T=%d, %d slots; HINT: a smaller micro-batch or "
                 "fewer layers per stage)", cudaGetErrorString(e), (double)bytes / (1u << 30), what, s->o.B, s->o.T,
                 s->o.nslots);
        return s_fail(c, s, "cudaMalloc", why, __FILE__, __LINE__);
    }
    return 0;
}

static int s_create(stage_t *s, s_dev *c)
{
    const stage_opts_t *o = &s->o;
    int ndev = 0, rc;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || o->device < 0 || o->device >= ndev) {
        char why[160];
        snprintf(why, sizeof why, "no such device: cuda:%d (%d CUDA devices visible%s%s)", o->device,
                 e == cudaSuccess ? ndev : 0, e == cudaSuccess ? "" : "; ", e == cudaSuccess ? "" : cudaGetErrorString(e));
        return s_fail(c, s, "selecting the device", why, __FILE__, __LINE__);
    }
    const int hs = o->cfg.C / o->cfg.NH;
    if (!cl_attention_supports(hs)) {
        char why[128];
        snprintf(why, sizeof why, "head size C/NH = %d not supported by the attention kernels (16, 32, 64, 128)", hs);
        return s_fail(c, s, "checking the model", why, __FILE__, __LINE__);
    }
    CK(cudaSetDevice(o->device));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, o->device));
    snprintf(c->devname, sizeof c->devname, "%.63s", prop.name);
    CK(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
    {
        const char *pe = getenv("TAH_CU_PROFILE");
        if (pe && !strcmp(pe, "1")) {
            for (int k = 0; k < S_NPEV; k++)
                CK(cudaEventCreate(&c->pev[k]));
            c->prof = 1;
        }
    }
    CKB(cublasLtCreate(&c->lt));
    if ((rc = s_alloc(c, s, &c->ws, S_WORKSPACE, "the cuBLASLt workspace")) != 0)
        return rc;
    if ((rc = s_alloc(c, s, (void **)&c->colpart, CL_COLPART_FLOATS(4 * (size_t)o->cfg.C) * sizeof(float),
                      "the column partial sums")) != 0)
        return rc;

    // parameters, gradients, moments: one allocation each, stage.c's carving
    size_t off = 0;
    for (int i = 0; i < STAGE_NTENSORS; i++) {
        c->off[i] = off;
        off += s->sizes[i];
    }
    const size_t np = s->nparams;
    if ((rc = s_alloc(c, s, (void **)&c->params, np * sizeof(float), "parameters")) ||
        (rc = s_alloc(c, s, (void **)&c->grads, np * sizeof(float), "gradients")) ||
        (rc = s_alloc(c, s, (void **)&c->moments, 2 * np * sizeof(float), "AdamW moments")))
        return rc;
    CK(cudaMemset(c->params, 0, np * sizeof(float)));
    CK(cudaMemset(c->grads, 0, np * sizeof(float)));
    CK(cudaMemset(c->moments, 0, 2 * np * sizeof(float)));
    if (c->bf16) {
        if ((rc = s_alloc(c, s, (void **)&c->p16, np * sizeof(cu_bf16), "bf16 parameter copy")) != 0)
            return rc;
        CK(cudaMemset(c->p16, 0, np * sizeof(cu_bf16)));
    }

    // activations: nslots x the size table, every tensor 256-byte aligned
    size_t asz[A_N], per_slot = 0;
    s_act_sizes(o, asz);
    for (int i = 0; i < A_N; i++)
        per_slot += s_round(asz[i] * (k_act_is_x[i] ? c->xs : sizeof(float)));
    const size_t BT = (size_t)o->B * o->T, BTC = BT * o->cfg.C;
    if ((rc = s_alloc(c, s, (void **)&c->acts, (size_t)o->nslots * per_slot, "activations")) ||
        (rc = s_alloc(c, s, (void **)&c->toks, (size_t)o->nslots * 2 * BT * sizeof(int), "tokens")))
        return rc;
    c->slots = (s_slot *)calloc((size_t)o->nslots, sizeof *c->slots);
    if (!c->slots)
        return s_fail(c, s, "calloc", "out of host memory", __FILE__, __LINE__);
    for (int k = 0; k < o->nslots; k++) {
        s_slot *sl = &c->slots[k];
        char *a = c->acts + (size_t)k * per_slot;
        sl->mb = -1;
        sl->tok = c->toks + (size_t)k * 2 * BT;
        sl->tgt = sl->tok + BT;
        for (int i = 0; i < A_N; i++) {
            size_t b = s_round(asz[i] * (k_act_is_x[i] ? c->xs : sizeof(float)));
            sl->a[i] = asz[i] ? a : NULL;
            a += b;
        }
    }

    // backward scratch: dres, dbuf (B,T,C); dqkv (B,T,3C); dbig (B,T,4C) in X;
    // dsum (B,NH,T) and the fp32 staging buffer (B,T,C)
    size_t sz[6] = { s_round(BTC * c->xs), s_round(BTC * c->xs), s_round(3 * BTC * c->xs), s_round(4 * BTC * c->xs),
                     s_round((size_t)o->B * o->cfg.NH * o->T * sizeof(float)), s_round(BTC * sizeof(float)) };
    size_t tot = 0;
    for (int i = 0; i < 6; i++)
        tot += sz[i];
    if ((rc = s_alloc(c, s, (void **)&c->scratch, tot, "backward scratch")) != 0)
        return rc;
    c->dres = c->scratch;
    c->dbuf = c->dres + sz[0];
    c->dqkv = c->dbuf + sz[1];
    c->dbig = c->dqkv + sz[2];
    c->dsum = (float *)(c->dbig + sz[3]);
    c->stage_f = (float *)((char *)c->dsum + sz[4]);
    CK(cudaMallocHost((void **)&c->h_losses, (BT ? BT : 1) * sizeof(float)));

    // norm segments: one per (tensor, layer), in stage_grad_sumsq's order
    int nseg = 0;
    for (int i = 0; i < STAGE_NTENSORS; i++) {
        if (!s->sizes[i] || (i == STAGE_HEAD && o->tied))
            continue;
        nseg += gpt2_tensor_per_layer(i) ? s->nl : 1;
    }
    unsigned long long *hsegs = (unsigned long long *)calloc((size_t)(nseg ? nseg : 1) * 2, sizeof *hsegs);
    c->seg_slot = (size_t *)calloc((size_t)(nseg ? nseg : 1), sizeof *c->seg_slot);
    c->h_partials = (double *)calloc((size_t)(nseg ? nseg : 1) * CL_SUMSQ_BLOCKS, sizeof(double));
    if (!hsegs || !c->seg_slot || !c->h_partials) {
        free(hsegs);
        return s_fail(c, s, "calloc", "out of host memory", __FILE__, __LINE__);
    }
    int k = 0;
    for (int i = 0; i < STAGE_NTENSORS; i++) {
        if (!s->sizes[i] || (i == STAGE_HEAD && o->tied))
            continue;
        if (gpt2_tensor_per_layer(i)) {
            size_t per = gpt2_tensor_layer_size(&o->cfg, i);
            for (int l = 0; l < s->nl; l++, k++) {
                hsegs[2 * k] = c->off[i] + (size_t)l * per;
                hsegs[2 * k + 1] = per;
                c->seg_slot[k] = stage_norm_slot(&o->cfg, i, o->layer0 + l);
            }
        } else {
            hsegs[2 * k] = c->off[i];
            hsegs[2 * k + 1] = s->sizes[i];
            c->seg_slot[k] = stage_norm_slot(&o->cfg, i, 0);
            k++;
        }
    }
    c->nseg = nseg;
    rc = s_alloc(c, s, (void **)&c->segs, (size_t)(nseg ? nseg : 1) * 2 * sizeof *hsegs, "norm segments");
    if (!rc)
        rc = s_alloc(c, s, (void **)&c->partials, (size_t)(nseg ? nseg : 1) * CL_SUMSQ_BLOCKS * sizeof(double),
                     "norm partials");
    if (!rc) {
        cudaError_t ce = cudaMemcpy(c->segs, hsegs, (size_t)nseg * 2 * sizeof *hsegs, cudaMemcpyHostToDevice);
        if (ce != cudaSuccess)
            rc = s_fail(c, s, "cudaMemcpy(segs)", cudaGetErrorString(ce), __FILE__, __LINE__);
    }
    free(hsegs);
    return rc;
}

// ---- boundary tensors encoded on the device (stage_encode_boundary) ----
// The codec runs on the stage's wire stream once the compute stream has
// produced the tensor (an event), bf16 activations widened to fp32 first
// (the codecs read fp32), then only the payload is copied to the host frame
// (page-locked when it comes from b_host_alloc). The call returns when the
// frame is sealed: the next forward / backward may reuse dres and stage_f.

static int s_grow(s_dev *c, const stage_t *s, void **p, size_t *have, size_t need, const char *what)
{
    if (need <= *have)
        return 0;
    cudaFree(*p);
    *p = NULL;
    *have = 0;
    int rc = s_alloc(c, s, p, need, what);
    if (rc == 0)
        *have = need;
    return rc;
}

static int s_encode(stage_t *s, int what, int mb, const codec_spec_t *spec, uint8_t *frame, size_t len, char *err,
                    size_t errlen)
{
    s_dev *c = S(s);
    const size_t BTC = (size_t)s->o.B * s->o.T * s->o.cfg.C;
    const codec_shape_t shape = { (uint32_t)s->o.B, (uint32_t)s->o.T, (uint32_t)s->o.cfg.C };
    const char *src;
    if (what == STAGE_WIRE_OUT) {
        s_slot *sl = mb >= 0 ? s_find(c, s, mb) : NULL;
        if (!sl) {
            snprintf(err, errlen, "micro-batch %d is not in flight: no output to encode", mb);
            return TAH_EINVAL;
        }
        src = s->nl ? sl->a[A_RES3] + (size_t)(s->nl - 1) * BTC * c->xs : sl->a[A_IN];
    } else {
        if (mb < 0 || c->dinp_mb != mb) {
            snprintf(err, errlen, "the last backward was not micro-batch %d: no input gradient to encode", mb);
            return TAH_EINVAL;
        }
        src = c->dres;
    }
    const size_t scr = cu_codec_scratch_bytes(spec, shape);
    if (!scr || len <= CODEC_HEADER_SIZE) {
        snprintf(err, errlen, "codec spec or shape (%u,%u,%u) not encodable on the device", shape.b, shape.s, shape.c);
        return TAH_EINVAL;
    }
    CK(cudaSetDevice(c->dev));
    if (!c->wst) {
        CK(cudaStreamCreateWithFlags(&c->wst, cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&c->wev, cudaEventDisableTiming));
    }
    int rc;
    const size_t pay = len - CODEC_HEADER_SIZE;
    if ((rc = s_grow(c, s, &c->wscr, &c->wscr_n, scr, "codec scratch")) != 0 ||
        (rc = s_grow(c, s, (void **)&c->wpay, &c->wpay_n, pay, "codec payload")) != 0)
        return rc;
    CK(cudaEventRecord(c->wev, c->st));
    CK(cudaStreamWaitEvent(c->wst, c->wev, 0));
    const float *x = (const float *)src;
    if (c->bf16) {
        CK(cl_to_f32<cu_bf16>(c->stage_f, (const cu_bf16 *)src, BTC, c->wst));
        x = c->stage_f;
    }
    char cerr[256] = "";
    rc = cu_codec_encode(spec, shape, x, c->wpay, c->wscr, c->wst, cerr, sizeof cerr);
    if (rc == TAH_EDEVICE)
        return s_fail(c, s, "cu_codec_encode", cerr, __FILE__, __LINE__);
    if (rc == 0) {
        CK(cudaMemcpyAsync(frame + CODEC_HEADER_SIZE, c->wpay, pay, cudaMemcpyDeviceToHost, c->wst));
        rc = cu_codec_status(c->wscr, c->wst, cerr, sizeof cerr);
        if (rc == TAH_EDEVICE)
            return s_fail(c, s, "cu_codec_status", cerr, __FILE__, __LINE__);
    }
    if (rc == 0)
        rc = codec_frame_seal(spec, shape, frame, len, cerr, sizeof cerr);
    if (rc)
        snprintf(err, errlen, "encoding the %s on cuda:%d: %s", what == STAGE_WIRE_OUT ? "output" : "input gradient",
                 c->dev, cerr);
    return rc;
}

static int b_encode(stage_t *s, int what, int mb, const codec_spec_t *spec, uint8_t *frame, size_t len, char *err,
                    size_t errlen)
{
    s_dev *c = S(s);
    int rc = c->failed ? TAH_EDEVICE : s_encode(s, what, mb, spec, frame, len, err, errlen);
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
    s_dev *c = (s_dev *)calloc(1, sizeof *c);
    if (!c) {
        if (err)
            snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    c->dev = s->o.device;
    c->bf16 = s->o.precision == STAGE_BF16;
    c->xs = c->bf16 ? sizeof(cu_bf16) : sizeof(float);
    c->dinp_mb = -1;
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
    b_encode,      b_host_alloc, b_host_free,
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

extern "C" int cu_stage_profile(stage_t *s, double *ms, const char **names, int max, int reset)
{
    if (!s || s->o.backend != STAGE_CUDA || !S(s) || !S(s)->prof)
        return 0;
    s_dev *c = S(s);
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
