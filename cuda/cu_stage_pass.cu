// cu_stage_pass.cu — the CUDA stage's forward and backward (cu_stage.h):
// cuBLASLt GEMMs, the kernels of cu_layers.cuh / cu_attn.cu, and at tp > 1
// the all-reduces between the ranks (cu_tpcomm.h). The structure follows
// pipeline/stage.c and pipeline/blocks.c; where the GPU version differs it
// says so:
//   - residual adds are fused into the projection GEMMs (C = x, beta = 1);
//   - cross-entropy keeps each row's logsumexp instead of probabilities
//     (the backward turns logits into dlogits in place);
//   - attention keeps only (B,NH,T) logsumexps (cu_attn.cu).
//
// Tensor parallelism (tp > 1), per layer, rank r (Cr = C/tp, NHr = NH/tp):
//   forward   ln1 (every rank) -> qkv_r = three GEMMs (rows r*Cr.. of the Q,
//             K and V blocks, written side by side, ld 3Cr) -> attention on
//             heads r*NHr.. (C' = Cr, NH' = NHr) -> partial (B,T,C) = atty_r
//             @ (columns r*Cr.. of W_attproj)^T -> all-reduce -> res2 = x +
//             sum + b; the same for the MLP (FC rows r*4Cr.., FC proj
//             columns r*4Cr..) -> res3.
//   backward  the mirror: d(ln2) and d(ln1) are partial sums, all-reduced
//             before the LayerNorm backward; bias gradients of the
//             row-parallel layers, LayerNorm gradients, lnf, the head and
//             the loss are computed by every rank from identical inputs.
//   With codec none the all-reduce is NCCL's in the activation type, and
//   rank 0's projection GEMM adds x and the bias in its epilogue (so the sum
//   is res2 at once); with a codec the partials alone are compressed (the
//   residual stream never is) into fp32 and cl_residual_bias adds x and b.
//   The embedding gradients are computed on rank 0 only (the positions
//   grouped by token are built for it alone); cu_stage.cu broadcasts them
//   before anything else reads them.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu_stage_impl.cuh"
#ifdef TAH_HAVE_NCCL
#include "cu_tpcomm.h" // cu_tp_allreduce, cu_tp_status
#endif

// ---- profile (TAH_CU_PROFILE=1): events on rank 0's stream ----

// record an event closing phase ph (-1: the start mark) after rank r's work
static void s_mark(cs_dev *c, int r, int ph)
{
    if (!c->prof || r != 0 || c->npev >= CS_NPEV)
        return;
    if (cudaEventRecord(c->pev[c->npev], c->g[0].st) == cudaSuccess)
        c->pph[c->npev++] = ph;
}

// after a stream synchronize: charge the intervals to their phases
static void s_collect(cs_dev *c)
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

// epilogues besides the bias: GELU of the result, its input kept in aux (forward); the
// result times GELU's derivative at aux (backward)
enum { EPI_NONE, EPI_GELU, EPI_DGELU };

// Column-major D (m,n) = op(A) op(B) + beta * Cm (+ bias[m] over columns).
// A is (m,k), or stored (k,m) when ta; B is (k,n), or stored (n,k) when tb;
// Cm and D are (m,n). Leading dimensions lda, ldb, ldd (Cm's too): 0 means
// the stored matrix's row count (contiguous columns). abt: type of A and B
// (and bias), cdt: type of Cm and D. fp32 compute, no TF32. epi: EPI_GELU
// (D = GELU(that), aux (m,n), ldd apart, its input) or EPI_DGELU (D = that
// times GELU'(aux)); aux has D's type.
static int s_gemm_run(cs_dev *c, cs_rank *g, const stage_t *s, void *D, const void *A, const void *Bm,
                      const void *Cm, const void *bias, int m, int n, int k, int ta, int tb, float alpha, float beta,
                      cudaDataType_t abt, cudaDataType_t cdt, int lda, int ldb, int ldd, int epi, const void *aux,
                      cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t *lay, cublasLtMatmulPreference_t *pref)
{
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
    lda = lda ? lda : ra;
    ldb = ldb ? ldb : rb;
    ldd = ldd ? ldd : m;
    if (!Cm)
        Cm = D;
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (bias) {
        int32_t bt = (int32_t)abt;
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (bias || epi != EPI_NONE) {
        const cublasLtEpilogue_t e = epi == EPI_GELU ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                     : epi == EPI_DGELU ? CUBLASLT_EPILOGUE_DGELU
                                                        : CUBLASLT_EPILOGUE_BIAS;
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    }
    if (epi != EPI_NONE) {
        const int64_t ald = ldd;
        const int32_t at = (int32_t)cdt;
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ald, sizeof ald));
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof at));
    }
    CKB(cublasLtMatrixLayoutCreate(&lay[0], abt, ra, ca, lda));
    CKB(cublasLtMatrixLayoutCreate(&lay[1], abt, rb, cb, ldb));
    CKB(cublasLtMatrixLayoutCreate(&lay[2], cdt, m, n, ldd));
    CKB(cublasLtMatrixLayoutCreate(&lay[3], cdt, m, n, ldd));

    int al = s_align_of(D);
    const void *ps[5] = { A, Bm, Cm, bias, aux };
    for (int i = 0; i < 5; i++)
        if (ps[i] && s_align_of(ps[i]) < al)
            al = s_align_of(ps[i]);
    cs_gemm_key key = { m, n, k, ta, tb, beta != 0.0f, bias != NULL, (int)abt, (int)cdt, al, lda, ldb, ldd, epi };
    const cublasLtMatmulAlgo_t *algo = NULL;
    for (int i = 0; i < g->ncache; i++)
        if (!memcmp(&g->cache[i].key, &key, sizeof key)) {
            algo = &g->cache[i].algo;
            break;
        }
    if (!algo) {
        CKB(cublasLtMatmulPreferenceCreate(pref));
        size_t wsz = CS_WORKSPACE;
        uint32_t a32 = (uint32_t)al;
        CKB(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
        CKB(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof a32));
        CKB(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a32, sizeof a32));
        CKB(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &a32, sizeof a32));
        CKB(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &a32, sizeof a32));
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        CKB(cublasLtMatmulAlgoGetHeuristic(g->lt, op, lay[0], lay[1], lay[2], lay[3], *pref, 1, &res, &found));
        if (found < 1) {
            char why[200];
            snprintf(why, sizeof why, "no cuBLASLt algorithm for m=%d n=%d k=%d ta=%d tb=%d ld %d/%d/%d types %d/%d "
                     "align %d", m, n, k, ta, tb, lda, ldb, ldd, (int)abt, (int)cdt, al);
            return cs_fail(c, s, "cublasLtMatmulAlgoGetHeuristic", why, __FILE__, __LINE__);
        }
        if (getenv("TAH_CU_GEMM_LOG")) { // the chosen algorithm per shape (comparing runs)
            int id = -1, tile = -1, splitk = -1, red = -1, stages = -1;
            size_t w = 0;
            cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
            cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
            cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
            cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
            cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
            fprintf(stderr, "gemm m=%d n=%d k=%d ta=%d tb=%d beta=%d bias=%d al=%d: algo %d tile %d splitk %d red %d "
                    "stages %d ws %zu\n", m, n, k, ta, tb, beta != 0.0f, bias != NULL, al, id, tile, splitk, red,
                    stages, res.workspaceSize);
        }
        if (g->ncache == CS_NCACHE)
            g->ncache = 0; // simple wrap: the working set of one stage is far smaller
        g->cache[g->ncache].key = key;
        g->cache[g->ncache].algo = res.algo;
        algo = &g->cache[g->ncache++].algo;
    }
    CKB(cublasLtMatmul(g->lt, op, &alpha, A, lay[0], Bm, lay[1], &beta, Cm, lay[2], D, lay[3], algo, g->ws,
                       CS_WORKSPACE, g->st));
    return 0;
}

static int s_gemm(cs_dev *c, cs_rank *g, const stage_t *s, void *D, const void *A, const void *Bm, const void *Cm,
                  const void *bias, int m, int n, int k, int ta, int tb, float alpha, float beta, cudaDataType_t abt,
                  cudaDataType_t cdt, int lda = 0, int ldb = 0, int ldd = 0, int epi = EPI_NONE,
                  const void *aux = NULL)
{
    if (c->failed)
        return TAH_EDEVICE;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t lay[4] = { NULL, NULL, NULL, NULL };
    cublasLtMatmulPreference_t pref = NULL;
    int rc = 0;
    cublasStatus_t e = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (e != CUBLAS_STATUS_SUCCESS)
        return cs_fail(c, s, "cublasLtMatmulDescCreate", cublasLtGetStatusString(e), __FILE__, __LINE__);
    rc = s_gemm_run(c, g, s, D, A, Bm, Cm, bias, m, n, k, ta, tb, alpha, beta, abt, cdt, lda, ldb, ldd, epi, aux, op,
                    lay, &pref);
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < 4; i++)
        if (lay[i])
            cublasLtMatrixLayoutDestroy(lay[i]);
    cublasLtMatmulDescDestroy(op);
    return rc;
}

// ---- the stage's tensors in the GEMM operand type ----

template <class X> static cudaDataType_t s_dt(void);
template <> cudaDataType_t s_dt<float>(void) { return CUDA_R_32F; }
template <> cudaDataType_t s_dt<cu_bf16>(void) { return CUDA_R_16BF; }

// weight (or bias) tensor i of rank g at element offset off
template <class X> static const X *s_w(const cs_dev *c, const cs_rank *g, int i, size_t off);
template <> const float *s_w<float>(const cs_dev *c, const cs_rank *g, int i, size_t off)
{
    return g->params + c->off[i] + off;
}
template <> const cu_bf16 *s_w<cu_bf16>(const cs_dev *c, const cs_rank *g, int i, size_t off)
{
    return g->p16 + c->off[i] + off;
}

// out (N,OC) = inp (N,K) @ W^T + bias (+ res when given)   [matmul_forward]
// W holds OC rows of K, ldw apart; inp's rows are ldi apart, out's (and
// res's) ldo (0: K, K, OC)
// gelu_in non-NULL: out = GELU(that), gelu_in (like out) its input (EPI_GELU)
template <class X>
static int s_mm_fwd(cs_dev *c, cs_rank *g, int r, const stage_t *s, X *out, const X *inp, const X *w, const X *bias,
                    const X *res, int N, int K, int OC, int head = 0, int ldw = 0, int ldi = 0, int ldo = 0,
                    X *gelu_in = NULL)
{
    int rc = s_gemm(c, g, s, out, w, inp, res, bias, OC, N, K, 1, 0, 1.0f, res ? 1.0f : 0.0f, s_dt<X>(), s_dt<X>(),
                    ldw, ldi, ldo, gelu_in ? EPI_GELU : EPI_NONE, gelu_in);
    s_mark(c, r, head ? P_HEAD_FWD : P_MM_FWD);
    return rc;
}

// dinp (N,K) = alpha dout (N,OC) @ W + beta dinp; rows ldi / ldo / ldw apart (0: K, OC, K);
// gelu_in non-NULL: times GELU'(gelu_in) (like dinp; EPI_DGELU)
template <class X>
static int s_mm_dx(cs_dev *c, cs_rank *g, const stage_t *s, X *dinp, const X *dout, const X *w, int N, int K, int OC,
                   float alpha, float beta, int ldw = 0, int ldo = 0, int ldi = 0, const X *gelu_in = NULL)
{
    return s_gemm(c, g, s, dinp, w, dout, NULL, NULL, K, N, OC, 0, 0, alpha, beta, s_dt<X>(), s_dt<X>(), ldw, ldo,
                  ldi, gelu_in ? EPI_DGELU : EPI_NONE, gelu_in);
}

// dW (OC,K) += alpha dout^T @ inp (N,K); dW's rows ldw apart, inp's ldin, dout's ldo (0: K, K, OC)
template <class X>
static int s_mm_dw(cs_dev *c, cs_rank *g, const stage_t *s, float *dw, const X *inp, const X *dout, int N, int K,
                   int OC, float alpha, int ldw = 0, int ldin = 0, int ldo = 0)
{
    return s_gemm(c, g, s, dw, inp, dout, dw, NULL, K, OC, N, 0, 1, alpha, 1.0f, s_dt<X>(), CUDA_R_32F, ldin, ldo,
                  ldw);
}

// dinp (=) dout @ W; dW += dout^T @ inp; dbias += colsum(dout)   [matmul_backward]
// (W's and dW's rows ldw apart: a column slice at tp > 1); gelu_in: dinp times GELU'(gelu_in)
template <class X>
static int s_mm_bwd(cs_dev *c, cs_rank *g, int r, const stage_t *s, X *dinp, float *dw, float *db, const X *dout,
                    const X *inp, const X *w, int N, int K, int OC, int head = 0, float alpha = 1.0f, int ldw = 0,
                    const X *gelu_in = NULL)
{
    int rc = 0;
    if (dinp && (rc = s_mm_dx<X>(c, g, s, dinp, dout, w, N, K, OC, alpha, 0.0f, ldw, 0, 0, gelu_in)) != 0)
        return rc;
    s_mark(c, r, head ? P_HEAD_BWD : P_MM_DX);
    if ((rc = s_mm_dw<X>(c, g, s, dw, inp, dout, N, K, OC, alpha, ldw)) != 0)
        return rc;
    s_mark(c, r, head ? P_HEAD_BWD : P_MM_DW);
    if (db) {
        CK(cl_bias_backward<X>(db, dout, N, OC, g->colpart, g->st));
        s_mark(c, r, P_BIAS_BWD);
    }
    return 0;
}

// ---- the all-reduces between the ranks (tp > 1) ----

// every rank's buf (B,T,C) = the sum of all ranks' (in the activation type)
template <class X> static int s_tp_sum(stage_t *s, X *const *buf)
{
    cs_dev *c = CS(s);
#ifdef TAH_HAVE_NCCL
    const size_t BTC = (size_t)s->o.B * s->o.T * s->o.cfg.C;
    char why[512];
    const int xt = sizeof(X) == sizeof(float) ? CU_TP_F32 : CU_TP_BF16;
    int rc = cu_tp_allreduce((cu_tp_t *)c->tpc, (void *const *)buf, xt, (void *const *)buf, xt, BTC,
                             stage_tp_call_id(s, 0), c->streams, CU_TP_ALL, why, sizeof why);
    if (rc)
        return cs_fail(c, s, "tensor-parallel all-reduce", why, __FILE__, __LINE__);
    s_mark(c, 0, P_TP_COMM);
    return 0;
#else
    (void)buf;
    return cs_fail(c, s, "tensor-parallel all-reduce", "built without NCCL", __FILE__, __LINE__);
#endif
}

// After the row-parallel GEMMs left each rank's partial product in buf:
// buf = x + sum of the partials + bias on every rank. Codec none: rank 0's
// GEMM already added x and the bias, the sum is the result. Compressed:
// the partials go through the codecs into fp32 (stage_f), then the
// residual and the bias are added exactly.
template <class X>
static int s_tp_residual(stage_t *s, X *const *buf, const X *const *x, int bias_tensor, size_t bias_off)
{
    cs_dev *c = CS(s);
    if (!c->compressed)
        return s_tp_sum<X>(s, buf);
#ifdef TAH_HAVE_NCCL
    const int BT = s->o.B * s->o.T, C = s->o.cfg.C;
    void *sums[TP_MAX];
    for (int r = 0; r < c->tp; r++)
        sums[r] = c->g[r].stage_f;
    char why[512];
    const int xt = sizeof(X) == sizeof(float) ? CU_TP_F32 : CU_TP_BF16;
    int rc = cu_tp_allreduce((cu_tp_t *)c->tpc, (void *const *)buf, xt, sums, CU_TP_F32, (size_t)BT * C,
                             stage_tp_call_id(s, 0), c->streams, CU_TP_ALL, why, sizeof why);
    if (rc)
        return cs_fail(c, s, "tensor-parallel all-reduce", why, __FILE__, __LINE__);
    s_mark(c, 0, P_TP_COMM);
    for (int r = 0; r < c->tp; r++) {
        cs_rank *g = &c->g[r];
        CK(cudaSetDevice(g->dev));
        CK(cl_residual_bias<X>(buf[r], x[r], g->stage_f, cs_p(c, g, bias_tensor, bias_off), BT, C, g->st));
    }
    return 0;
#else
    (void)x;
    (void)bias_tensor;
    (void)bias_off;
    return cs_fail(c, s, "tensor-parallel all-reduce", "built without NCCL", __FILE__, __LINE__);
#endif
}

// Every rank's stream synchronised; then the codec conditions of the
// compressed all-reduces since the last call (not sticky: lasterr).
static int s_finish(stage_t *s)
{
    cs_dev *c = CS(s);
    for (int r = 0; r < c->tp; r++) {
        CK(cudaSetDevice(c->g[r].dev));
        CK(cudaStreamSynchronize(c->g[r].st));
    }
#ifdef TAH_HAVE_NCCL
    if (c->tpc && c->compressed) {
        char why[320];
        int rc = cu_tp_status((cu_tp_t *)c->tpc, c->streams, why, sizeof why);
        if (rc == TAH_EDEVICE)
            return cs_fail(c, s, "cu_tp_status", why, __FILE__, __LINE__);
        if (rc) {
            snprintf(c->lasterr, sizeof c->lasterr, "cuda:%s stage (layers %d..%d): tensor-parallel all-reduce: %s",
                     c->devlist, s->o.layer0, s->o.layer1 - 1, why);
            return rc;
        }
    }
#endif
    s_collect(c);
    return 0;
}

// ---- forward / backward ----

// host (B,T,C) fp32 -> every rank's dst (X)
// src NULL: the tensor stage_decode_boundary left on rank 0's device (c->dsrc, complete: the
// decode synchronises its stream). Rank r > 0 copies it from there on its own stream and
// records g->decev, which the next decode waits for before it writes over the tensor.
template <class X> static int s_upload(stage_t *s, X *const *dst, const float *src)
{
    cs_dev *c = CS(s);
    const size_t BTC = (size_t)s->o.B * s->o.T * s->o.cfg.C;
    if (!src && !c->dsrc)
        return TAH_EINVAL;
    for (int r = 0; r < c->tp; r++) {
        cs_rank *g = &c->g[r];
        CK(cudaSetDevice(g->dev));
        if (!src) {
            const float *from = c->dsrc;
            if (r > 0) {
                if (!g->decev)
                    CK(cudaEventCreateWithFlags(&g->decev, cudaEventDisableTiming));
                float *to = sizeof(X) == sizeof(float) ? (float *)dst[r] : g->stage_f;
                CK(cudaMemcpyPeerAsync(to, g->dev, from, c->g[0].dev, BTC * sizeof(float), g->st));
                from = to;
            }
            if (sizeof(X) == sizeof(float)) {
                if (r == 0)
                    CK(cudaMemcpyAsync(dst[r], from, BTC * sizeof(float), cudaMemcpyDeviceToDevice, g->st));
            } else {
                CK(cl_from_f32<X>(dst[r], from, BTC, g->st));
            }
            if (r > 0)
                CK(cudaEventRecord(g->decev, g->st));
        } else if (sizeof(X) == sizeof(float)) {
            CK(cudaMemcpyAsync(dst[r], src, BTC * sizeof(float), cudaMemcpyHostToDevice, g->st));
        } else {
            CK(cudaMemcpyAsync(g->stage_f, src, BTC * sizeof(float), cudaMemcpyHostToDevice, g->st));
            CK(cl_from_f32<X>(dst[r], g->stage_f, BTC, g->st));
        }
    }
    return 0;
}

// rank 0's src (B,T,C) -> host fp32 (enqueued; s_finish waits)
template <class X> static int s_download(stage_t *s, float *dst, const X *src)
{
    cs_dev *c = CS(s);
    cs_rank *g = &c->g[0];
    const size_t BTC = (size_t)s->o.B * s->o.T * s->o.cfg.C;
    CK(cudaSetDevice(g->dev));
    if (sizeof(X) == sizeof(float)) {
        CK(cudaMemcpyAsync(dst, src, BTC * sizeof(float), cudaMemcpyDeviceToHost, g->st));
    } else {
        CK(cl_to_f32<X>(g->stage_f, src, BTC, g->st));
        CK(cudaMemcpyAsync(dst, g->stage_f, BTC * sizeof(float), cudaMemcpyDeviceToHost, g->st));
    }
    return 0;
}

// every token inside the vocabulary, before the encoder reads wte's rows by them
static int s_token_check(stage_t *s, const int *tokens)
{
    cs_dev *c = CS(s);
    const int BT = s->o.B * s->o.T, Vp = s->o.cfg.Vp;
    for (int i = 0; i < BT; i++)
        if (tokens[i] < 0 || tokens[i] >= Vp) {
            snprintf(c->lasterr, sizeof c->lasterr, "token %d at position %d outside the vocabulary 0..%d", tokens[i],
                     i, Vp - 1);
            return TAH_EINVAL;
        }
    return 0;
}

// The positions of the micro-batch grouped by token, for the deterministic
// embedding gradient (cl_encoder_backward): into c->h_rows as order (B*T
// positions, by token, ascending within one token), useg (nu + 1 starts) and
// urow (the nu distinct tokens); sl->nu. A counting sort over the vocabulary
// (tokens checked by s_token_check). The caller uploads h_rows before the next
// call (the stream is synchronised at the end of every forward).
static void s_token_rows(stage_t *s, cs_slot *sl, const int *tokens)
{
    cs_dev *c = CS(s);
    const int BT = s->o.B * s->o.T, Vp = s->o.cfg.Vp;
    int *order = c->h_rows, *useg = order + BT, *urow = useg + BT + 1, *cnt = c->h_cnt;
    memset(cnt, 0, (size_t)Vp * sizeof(int));
    for (int i = 0; i < BT; i++)
        cnt[tokens[i]]++;
    int nu = 0, off = 0;
    for (int v = 0; v < Vp; v++) {
        if (!cnt[v])
            continue;
        urow[nu] = v;
        useg[nu++] = off;
        const int n = cnt[v];
        cnt[v] = off; // from here: the next free place of token v
        off += n;
    }
    useg[nu] = BT;
    for (int i = 0; i < BT; i++)
        order[cnt[tokens[i]]++] = i;
    sl->nu = nu;
}

// TAH_CU_HASH=1: a hash of rank 0's tensor (n elements of X) on stderr, to compare runs
// kernel by kernel (bisecting run-to-run differences; synchronises the stream)
template <class X> static int s_hash(stage_t *s, const char *what, int l, const X *d, size_t n)
{
    static const int on = getenv("TAH_CU_HASH") != NULL;
    if (!on)
        return 0;
    cs_dev *c = CS(s);
    cs_rank *g = &c->g[0];
    static unsigned long long calls;
    unsigned char *h = (unsigned char *)malloc(n * sizeof(X));
    if (!h)
        return 0;
    CK(cudaStreamSynchronize(g->st));
    CK(cudaMemcpy(h, d, n * sizeof(X), cudaMemcpyDeviceToHost));
    unsigned long long f = 1469598103934665603ull;
    for (size_t i = 0; i < n * sizeof(X); i++)
        f = (f ^ h[i]) * 1099511628211ull;
    free(h);
    fprintf(stderr, "hash %llu layers %d.. %s %d %016llx\n", calls++, s->o.layer0, what, l, f);
    return 0;
}

template <class X>
static int s_forward(stage_t *s, cs_slot *sl, const int *tokens, const float *in, const int *targets, float *out,
                     float *loss)
{
    cs_dev *c = CS(s);
    const int tp = c->tp, B = s->o.B, T = s->o.T, C = s->o.cfg.C, NH = s->o.cfg.NH;
    const int Cr = C / tp, NHr = NH / tp, BT = B * T;
    const size_t BTC = (size_t)BT * C, BTCr = (size_t)BT * Cr, C1 = (size_t)C, Cr1 = (size_t)Cr;
    X *a_in[TP_MAX] = {}, *res[TP_MAX] = {};
    const X *xs[TP_MAX] = {};
    int rc;

    s_mark(c, 0, -1);
    for (int r = 0; r < tp; r++)
        a_in[r] = (X *)sl->a[r][A_IN];
    if (!s->o.first && (rc = s_upload<X>(s, a_in, in)) != 0)
        return rc;
    for (int r = 0; r < tp; r++) {
        cs_rank *g = &c->g[r];
        CK(cudaSetDevice(g->dev));
        if (s->o.first && r == 0 && (rc = s_token_check(s, tokens)) != 0)
            return rc;
        if (s->o.first) {
            CK(cudaMemcpyAsync(sl->tok[r], tokens, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, g->st));
            CK(cl_encoder_forward<X>(a_in[r], sl->tok[r], cs_p(c, g, GPT2_WTE, 0), cs_p(c, g, GPT2_WPE, 0), B, T, C,
                                     g->st));
        }
        if (s->o.last)
            CK(cudaMemcpyAsync(sl->tgt[r], targets, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, g->st));
    }
    s_mark(c, 0, P_ENCODER);
    if ((rc = s_hash<X>(s, "in", -1, a_in[0], BTC)) != 0)
        return rc;

    for (int l = 0; l < s->nl; l++) {
        // attention: x -> res2
        for (int r = 0; r < tp; r++) {
            cs_rank *g = &c->g[r];
            char *const *a = sl->a[r];
            const X *x = l == 0 ? a_in[r] : (X *)a[A_RES3] + (l - 1) * BTC;
            X *ln1 = (X *)a[A_LN1] + l * BTC, *qkv = (X *)a[A_QKV] + l * 3 * BTCr;
            X *atty = (X *)a[A_ATTY] + l * BTCr, *res2 = (X *)a[A_RES2] + l * BTC;
            float *ln1_mean = (float *)a[A_LN1_MEAN] + (size_t)l * BT;
            float *ln1_rstd = (float *)a[A_LN1_RSTD] + (size_t)l * BT;
            float *lse = (float *)a[A_LSE] + (size_t)l * B * NHr * T;
            const X *wqkv = s_w<X>(c, g, GPT2_QKVW, l * 3 * C1 * C1), *bqkv = s_w<X>(c, g, GPT2_QKVB, l * 3 * C1);
            xs[r] = x;
            res[r] = res2;
            CK(cudaSetDevice(g->dev));
            CK(cl_layernorm_forward<X>(ln1, ln1_mean, ln1_rstd, x, cs_p(c, g, GPT2_LN1W, l * C1),
                                       cs_p(c, g, GPT2_LN1B, l * C1), BT, C, g->st));
            s_mark(c, r, P_LN);
            if (tp == 1) {
                if ((rc = s_mm_fwd<X>(c, g, r, s, qkv, ln1, wqkv, bqkv, NULL, BT, C, 3 * C)) != 0)
                    return rc;
            } else {
                for (int q = 0; q < 3; q++) // rows r*Cr.. of block q (Q, K, V) -> columns q*Cr.. of qkv_r
                    if ((rc = s_mm_fwd<X>(c, g, r, s, qkv + q * Cr1, ln1, wqkv + (q * C1 + r * Cr1) * C1,
                                          bqkv + q * C1 + r * Cr1, NULL, BT, C, Cr, 0, 0, 0, 3 * Cr)) != 0)
                        return rc;
            }
            CK(cl_attention_forward<X>(atty, lse, qkv, B, T, Cr, NHr, g->st));
            s_mark(c, r, P_ATTN_FWD);
            // res2 = x + atty @ attprojw^T + attprojb (residual fused: C = x); at
            // tp > 1 rank r's columns of W, the reduction adds the ranks
            const int whole = tp == 1 || (r == 0 && !c->compressed);
            if ((rc = s_mm_fwd<X>(c, g, r, s, res2, atty, s_w<X>(c, g, GPT2_ATTPROJW, l * C1 * C1 + r * Cr1),
                                  whole ? s_w<X>(c, g, GPT2_ATTPROJB, l * C1) : NULL, whole ? x : NULL, BT, Cr, C, 0,
                                  tp > 1 ? C : 0)) != 0)
                return rc;
        }
        if (tp > 1 && (rc = s_tp_residual<X>(s, res, xs, GPT2_ATTPROJB, l * C1)) != 0)
            return rc;
        // MLP: res2 -> res3
        for (int r = 0; r < tp; r++) {
            cs_rank *g = &c->g[r];
            char *const *a = sl->a[r];
            X *res2 = (X *)a[A_RES2] + l * BTC, *ln2 = (X *)a[A_LN2] + l * BTC;
            X *fch = (X *)a[A_FCH] + l * 4 * BTCr, *fchg = (X *)a[A_FCHG] + l * 4 * BTCr;
            X *res3 = (X *)a[A_RES3] + l * BTC;
            float *ln2_mean = (float *)a[A_LN2_MEAN] + (size_t)l * BT;
            float *ln2_rstd = (float *)a[A_LN2_RSTD] + (size_t)l * BT;
            xs[r] = res2;
            res[r] = res3;
            CK(cudaSetDevice(g->dev));
            CK(cl_layernorm_forward<X>(ln2, ln2_mean, ln2_rstd, res2, cs_p(c, g, GPT2_LN2W, l * C1),
                                       cs_p(c, g, GPT2_LN2B, l * C1), BT, C, g->st));
            s_mark(c, r, P_LN);
            if (c->gelu_fuse) { // fchg = GELU(fc(ln2)), fch its input, in the GEMM's epilogue
                if ((rc = s_mm_fwd<X>(c, g, r, s, fchg, ln2,
                                      s_w<X>(c, g, GPT2_FCW, l * 4 * C1 * C1 + r * 4 * Cr1 * C1),
                                      s_w<X>(c, g, GPT2_FCB, l * 4 * C1 + r * 4 * Cr1), NULL, BT, C, 4 * Cr, 0, 0, 0, 0,
                                      fch)) != 0)
                    return rc;
            } else {
                if ((rc = s_mm_fwd<X>(c, g, r, s, fch, ln2,
                                      s_w<X>(c, g, GPT2_FCW, l * 4 * C1 * C1 + r * 4 * Cr1 * C1),
                                      s_w<X>(c, g, GPT2_FCB, l * 4 * C1 + r * 4 * Cr1), NULL, BT, C, 4 * Cr)) != 0)
                    return rc;
                CK(cl_gelu_forward<X>(fchg, fch, 4 * BTCr, g->st));
                s_mark(c, r, P_GELU);
            }
            const int whole = tp == 1 || (r == 0 && !c->compressed);
            if ((rc = s_mm_fwd<X>(c, g, r, s, res3, fchg, s_w<X>(c, g, GPT2_FCPROJW, l * 4 * C1 * C1 + r * 4 * Cr1),
                                  whole ? s_w<X>(c, g, GPT2_FCPROJB, l * C1) : NULL, whole ? res2 : NULL, BT, 4 * Cr,
                                  C, 0, tp > 1 ? 4 * C : 0)) != 0)
                return rc;
        }
        if (tp > 1 && (rc = s_tp_residual<X>(s, res, xs, GPT2_FCPROJB, l * C1)) != 0)
            return rc;
        if ((rc = s_hash<X>(s, "ln1", l, (X *)sl->a[0][A_LN1] + (size_t)l * BTC, BTC)) != 0 ||
            (rc = s_hash<X>(s, "qkv", l, (X *)sl->a[0][A_QKV] + (size_t)l * 3 * BTC, 3 * BTC)) != 0 ||
            (rc = s_hash<X>(s, "atty", l, (X *)sl->a[0][A_ATTY] + (size_t)l * BTC, BTC)) != 0 ||
            (rc = s_hash<X>(s, "res2", l, (X *)sl->a[0][A_RES2] + (size_t)l * BTC, BTC)) != 0 ||
            (rc = s_hash<X>(s, "res3", l, (X *)sl->a[0][A_RES3] + (size_t)l * BTC, BTC)) != 0)
            return rc;
    }
    if (s->o.first) { // the encoder backward's token rows, sorted on the host while the layers run
        // (h_rows is free: the previous forward's copy of it ended before its s_finish returned)
        s_token_rows(s, sl, tokens);
        CK(cudaSetDevice(c->g[0].dev));
        CK(cudaMemcpyAsync(sl->rows, c->h_rows, (3 * (size_t)BT + 1) * sizeof(int), cudaMemcpyHostToDevice,
                           c->g[0].st));
    }

    if (s->o.last) { // every rank (identical inputs): lnf, head, loss; rank 0's loss is reported
        const int V = s->o.cfg.V, Vp = s->o.cfg.Vp;
        for (int r = 0; r < tp; r++) {
            cs_rank *g = &c->g[r];
            char *const *a = sl->a[r];
            const X *x = (X *)a[A_RES3] + (size_t)(s->nl - 1) * BTC;
            X *lnf = (X *)a[A_LNF], *logits = (X *)a[A_LOGITS];
            float *losses = (float *)a[A_LOSSES];
            CK(cudaSetDevice(g->dev));
            CK(cl_layernorm_forward<X>(lnf, (float *)a[A_LNF_MEAN], (float *)a[A_LNF_RSTD], x,
                                       cs_p(c, g, GPT2_LNFW, 0), cs_p(c, g, GPT2_LNFB, 0), BT, C, g->st));
            s_mark(c, r, P_LN);
            if ((rc = s_mm_fwd<X>(c, g, r, s, logits, lnf, s_w<X>(c, g, STAGE_HEAD, 0), NULL, NULL, BT, C, Vp, 1)) != 0)
                return rc;
            if (cl_crossentropy_fusable<X>(logits, Vp))
                CK(cl_crossentropy_fused<X>(losses, (float *)a[A_ROWLSE], logits, sl->tgt[r], BT, V, Vp, g->st));
            else
                CK(cl_crossentropy_forward<X>(losses, (float *)a[A_ROWLSE], logits, sl->tgt[r], BT, V, Vp, g->st));
            s_mark(c, r, P_CE);
            if (r == 0)
                CK(cudaMemcpyAsync(c->h_losses, losses, (size_t)BT * sizeof(float), cudaMemcpyDeviceToHost, g->st));
        }
    } else if (out && (rc = s_download<X>(s, out, (X *)sl->a[0][A_RES3] + (size_t)(s->nl - 1) * BTC)) != 0) {
        return rc;
    }
    if ((rc = s_finish(s)) != 0)
        return rc;
    if (s->o.last) {
        double sum = 0.0;
        for (int i = 0; i < BT; i++)
            sum += c->h_losses[i];
        if (loss)
            *loss = (float)(sum / BT);
    }
    return 0;
}

// bf16: bias gradients come out of kernels that hold their tensor anyway instead of a
// pass that reads it again: the projections' (column sums of dres) from the LayerNorm
// backward that leaves dres (fcproj of layer l from ln1 of layer l + 1 or from lnf,
// attproj from ln2), QKV's from the attention backward. fp32 keeps the separate sums.
static int s_bias_fused(const cs_dev *c) { return c->bf16; }

// Layer l's QKV weight and bias gradients of rank r from its dqkv and ln1
// (column-parallel at tp > 1: rank r's rows of each of Q, K and V; the bias
// only where the attention backward did not sum it: s_bias_fused).
template <class X> static int s_qkv_dw(stage_t *s, int r, int l, const X *dqkv, const X *ln1)
{
    cs_dev *c = CS(s);
    cs_rank *g = &c->g[r];
    const int tp = c->tp, C = s->o.cfg.C, Cr = C / tp, BT = s->o.B * s->o.T;
    const size_t C1 = (size_t)C, Cr1 = (size_t)Cr;
    float *dwqkv = cs_g(c, g, GPT2_QKVW, l * 3 * C1 * C1), *dbqkv = cs_g(c, g, GPT2_QKVB, l * 3 * C1);
    int rc;
    if (tp == 1) {
        if ((rc = s_mm_dw<X>(c, g, s, dwqkv, ln1, dqkv, BT, C, 3 * C, 1.0f)) != 0)
            return rc;
        s_mark(c, r, P_MM_DW);
        if (!s_bias_fused(c)) {
            CK(cl_bias_backward<X>(dbqkv, dqkv, BT, 3 * C, g->colpart, g->st));
            s_mark(c, r, P_BIAS_BWD);
        }
        return 0;
    }
    for (int q = 0; q < 3; q++) {
        const size_t wo = (q * C1 + r * Cr1) * C1;
        if ((rc = s_mm_dw<X>(c, g, s, dwqkv + wo, ln1, dqkv + q * Cr1, BT, C, Cr, 1.0f, 0, 0, 3 * Cr)) != 0)
            return rc;
    }
    s_mark(c, r, P_MM_DW);
    if (!s_bias_fused(c)) {
        for (int q = 0; q < 3; q++)
            CK(cl_bias_backward<X>(dbqkv + q * C1 + r * Cr1, dqkv + q * Cr1, BT, Cr, g->colpart, g->st, 3 * Cr));
        s_mark(c, r, P_BIAS_BWD);
    }
    return 0;
}

template <class X> static int s_backward(stage_t *s, cs_slot *sl, const float *dout, float dloss, float *dinp)
{
    cs_dev *c = CS(s);
    const int tp = c->tp, B = s->o.B, T = s->o.T, C = s->o.cfg.C, NH = s->o.cfg.NH;
    const int Cr = C / tp, NHr = NH / tp, BT = B * T;
    const size_t BTC = (size_t)BT * C, BTCr = (size_t)BT * Cr, C1 = (size_t)C, Cr1 = (size_t)Cr;
    X *dres[TP_MAX] = {}, *dbuf[TP_MAX] = {};
    int rc;
    const int bsum = s_bias_fused(c);

    for (int r = 0; r < tp; r++) {
        dres[r] = (X *)c->g[r].dres;
        dbuf[r] = (X *)c->g[r].dbuf;
    }
    s_mark(c, 0, -1);
    if (s->o.last) { // every rank: the head's backward from its own (identical) logits
        const int V = s->o.cfg.V, Vp = s->o.cfg.Vp;
        for (int r = 0; r < tp; r++) {
            cs_rank *g = &c->g[r];
            char *const *a = sl->a[r];
            const X *xlast = (X *)a[A_RES3] + (size_t)(s->nl - 1) * BTC;
            X *logits = (X *)a[A_LOGITS], *lnf = (X *)a[A_LNF];
            CK(cudaSetDevice(g->dev));
            // the fused forward left softmax - onehot in logits: dloss is the GEMMs' alpha
            float alpha = dloss;
            if (!cl_crossentropy_fusable<X>(logits, Vp)) {
                CK(cl_crossentropy_backward<X>(logits, (float *)a[A_ROWLSE], sl->tgt[r], dloss, BT, V, Vp, g->st));
                alpha = 1.0f;
            }
            s_mark(c, r, P_CE_BWD);
            if ((rc = s_mm_bwd<X>(c, g, r, s, dbuf[r], cs_g(c, g, STAGE_HEAD, 0), NULL, logits, lnf,
                                  s_w<X>(c, g, STAGE_HEAD, 0), BT, C, Vp, 1, alpha)) != 0)
                return rc;
            CK(cudaMemsetAsync(dres[r], 0, BTC * sizeof(X), g->st));
            CK(cl_layernorm_backward<X>(dres[r], cs_g(c, g, GPT2_LNFW, 0), cs_g(c, g, GPT2_LNFB, 0), dbuf[r], xlast,
                                        cs_p(c, g, GPT2_LNFW, 0), (float *)a[A_LNF_MEAN], (float *)a[A_LNF_RSTD],
                                        BT, C, g->colpart, g->st,
                                        bsum ? cs_g(c, g, GPT2_FCPROJB, (size_t)(s->nl - 1) * C1) : NULL));
            s_mark(c, r, P_LN_BWD);
        }
    } else if ((rc = s_upload<X>(s, dres, dout)) != 0) {
        return rc;
    }

    for (int l = s->nl - 1; l >= 0; l--) {
        // stage_backward_encode: layer 0's QKV weight gradients wait until d(input) is on its way
        const int defer = l == 0 && c->wspec != NULL;
        // MLP: dres holds d(res3) -> dbuf = d(ln2) (a partial sum at tp > 1)
        for (int r = 0; r < tp; r++) {
            cs_rank *g = &c->g[r];
            char *const *a = sl->a[r];
            const X *ln2 = (X *)a[A_LN2] + l * BTC, *fch = (X *)a[A_FCH] + l * 4 * BTCr;
            const X *fchg = (X *)a[A_FCHG] + l * 4 * BTCr;
            X *dbig = (X *)g->dbig;
            CK(cudaSetDevice(g->dev));
            // FC projection (row-parallel at tp > 1: rank r's columns of W; its bias on every rank)
            // (with gelu_fuse, dbig comes out of the dx GEMM already times GELU'(fch))
            // (its bias gradient already summed where a LayerNorm backward left dres: bsum)
            const int fsum = bsum && (l < s->nl - 1 || s->o.last);
            if ((rc = s_mm_bwd<X>(c, g, r, s, dbig, cs_g(c, g, GPT2_FCPROJW, l * 4 * C1 * C1 + r * 4 * Cr1),
                                  fsum ? NULL : cs_g(c, g, GPT2_FCPROJB, l * C1), dres[r], fchg,
                                  s_w<X>(c, g, GPT2_FCPROJW, l * 4 * C1 * C1 + r * 4 * Cr1), BT, 4 * Cr, C, 0, 1.0f,
                                  tp > 1 ? 4 * C : 0, c->gelu_fuse ? fch : NULL)) != 0)
                return rc;
            if (!c->gelu_fuse) {
                CK(cl_gelu_backward<X>(dbig, fch, dbig, 4 * BTCr, g->st));
                s_mark(c, r, P_GELU_BWD);
            }
            // FC (column-parallel: rank r's rows)
            if ((rc = s_mm_bwd<X>(c, g, r, s, dbuf[r], cs_g(c, g, GPT2_FCW, l * 4 * C1 * C1 + r * 4 * Cr1 * C1),
                                  cs_g(c, g, GPT2_FCB, l * 4 * C1 + r * 4 * Cr1), dbig, ln2,
                                  s_w<X>(c, g, GPT2_FCW, l * 4 * C1 * C1 + r * 4 * Cr1 * C1), BT, C, 4 * Cr)) != 0)
                return rc;
        }
        if (tp > 1 && (rc = s_tp_sum<X>(s, dbuf)) != 0)
            return rc;
        // ln2, attention projection, attention, QKV: dres -> d(res2) -> dbuf = d(ln1)
        for (int r = 0; r < tp; r++) {
            cs_rank *g = &c->g[r];
            char *const *a = sl->a[r];
            const X *ln1 = (X *)a[A_LN1] + l * BTC, *qkv = (X *)a[A_QKV] + l * 3 * BTCr;
            const X *atty = (X *)a[A_ATTY] + l * BTCr, *res2 = (X *)a[A_RES2] + l * BTC;
            const float *ln2_mean = (float *)a[A_LN2_MEAN] + (size_t)l * BT;
            const float *ln2_rstd = (float *)a[A_LN2_RSTD] + (size_t)l * BT;
            const float *lse = (float *)a[A_LSE] + (size_t)l * B * NHr * T;
            X *dqkv = (X *)g->dqkv;
            CK(cudaSetDevice(g->dev));
            CK(cl_layernorm_backward<X>(dres[r], cs_g(c, g, GPT2_LN2W, l * C1), cs_g(c, g, GPT2_LN2B, l * C1),
                                        dbuf[r], res2, cs_p(c, g, GPT2_LN2W, l * C1), ln2_mean, ln2_rstd, BT, C,
                                        g->colpart, g->st, bsum ? cs_g(c, g, GPT2_ATTPROJB, l * C1) : NULL));
            s_mark(c, r, P_LN_BWD);
            // attention: dres holds d(res2); projection row-parallel at tp > 1
            if ((rc = s_mm_bwd<X>(c, g, r, s, dbuf[r], cs_g(c, g, GPT2_ATTPROJW, l * C1 * C1 + r * Cr1),
                                  bsum ? NULL : cs_g(c, g, GPT2_ATTPROJB, l * C1), dres[r], atty,
                                  s_w<X>(c, g, GPT2_ATTPROJW, l * C1 * C1 + r * Cr1), BT, Cr, C, 0, 1.0f,
                                  tp > 1 ? C : 0)) != 0)
                return rc;
            const X *wqkv = s_w<X>(c, g, GPT2_QKVW, l * 3 * C1 * C1);
            float *dwqkv = cs_g(c, g, GPT2_QKVW, l * 3 * C1 * C1), *dbqkv = cs_g(c, g, GPT2_QKVB, l * 3 * C1);
            // bf16: the QKV bias gradient from the attention backward's own tiles (rank r's
            // rows of each of the q, k, v biases)
            float *const dbq[3] = { dbqkv + r * Cr1, dbqkv + C1 + r * Cr1, dbqkv + 2 * C1 + r * Cr1 };
            CK(cl_attention_backward<X>(dqkv, g->dsum, dbuf[r], atty, lse, qkv, B, T, Cr, NHr, g->st,
                                        bsum ? dbq : NULL, g->colpart));
            s_mark(c, r, P_ATTN_BWD);
            if (tp == 1 && !defer) {
                if ((rc = s_mm_bwd<X>(c, g, r, s, dbuf[r], dwqkv, bsum ? NULL : dbqkv, dqkv, ln1, wqkv, BT, C,
                                      3 * C)) != 0)
                    return rc;
                continue;
            }
            if (tp == 1) { // the weight and bias gradients after d(input) is out (s_qkv_dw)
                if ((rc = s_mm_dx<X>(c, g, s, dbuf[r], dqkv, wqkv, BT, C, 3 * C, 1.0f, 0.0f)) != 0)
                    return rc;
                s_mark(c, r, P_MM_DX);
                continue;
            }
            // QKV column-parallel: block q of dqkv_r (columns q*Cr.., ld 3Cr) against rows r*Cr.. of block q
            for (int q = 0; q < 3; q++) {
                const size_t wo = (q * C1 + r * Cr1) * C1;
                if ((rc = s_mm_dx<X>(c, g, s, dbuf[r], dqkv + q * Cr1, wqkv + wo, BT, C, Cr, 1.0f, q ? 1.0f : 0.0f, 0,
                                     3 * Cr)) != 0)
                    return rc;
            }
            s_mark(c, r, P_MM_DX);
            if (!defer && (rc = s_qkv_dw<X>(s, r, l, dqkv, ln1)) != 0)
                return rc;
        }
        if (tp > 1 && (rc = s_tp_sum<X>(s, dbuf)) != 0)
            return rc;
        for (int r = 0; r < tp; r++) {
            cs_rank *g = &c->g[r];
            char *const *a = sl->a[r];
            const X *x = l == 0 ? (X *)a[A_IN] : (X *)a[A_RES3] + (size_t)(l - 1) * BTC;
            const float *ln1_mean = (float *)a[A_LN1_MEAN] + (size_t)l * BT;
            const float *ln1_rstd = (float *)a[A_LN1_RSTD] + (size_t)l * BT;
            CK(cudaSetDevice(g->dev));
            CK(cl_layernorm_backward<X>(dres[r], cs_g(c, g, GPT2_LN1W, l * C1), cs_g(c, g, GPT2_LN1B, l * C1),
                                        dbuf[r], x, cs_p(c, g, GPT2_LN1W, l * C1), ln1_mean, ln1_rstd, BT, C,
                                        g->colpart, g->st,
                                        bsum && l > 0 ? cs_g(c, g, GPT2_FCPROJB, (size_t)(l - 1) * C1) : NULL));
            s_mark(c, r, P_LN_BWD);
        }
        // dres holds d(x)
        if (defer) {
            // d(input) is complete: the wire stream encodes it while the
            // compute streams finish layer 0's QKV weight and bias gradients
            if ((rc = cs_wire_launch(s, c->g[0].dres)) != 0)
                return rc;
            for (int r = 0; r < tp; r++) {
                char *const *a = sl->a[r];
                CK(cudaSetDevice(c->g[r].dev));
                if ((rc = s_qkv_dw<X>(s, r, 0, (X *)c->g[r].dqkv, (const X *)a[A_LN1])) != 0)
                    return rc;
            }
        }
    }

    if (s->o.first) { // rank 0 only; cu_stage.cu broadcasts before use
        cs_rank *g = &c->g[0];
        CK(cudaSetDevice(g->dev));
        const int *order = sl->rows, *useg = order + BT, *urow = useg + BT + 1;
        CK(cl_encoder_backward<X>(cs_g(c, g, GPT2_WTE, 0), cs_g(c, g, GPT2_WPE, 0), dres[0], order, useg, urow, sl->nu,
                                  B, T, C,
                                  g->st));
        s_mark(c, 0, P_ENCODER);
        if (tp > 1)
            c->embed_dirty = 1;
    } else if (dinp && (rc = s_download<X>(s, dinp, dres[0])) != 0) {
        return rc;
    }
    return s_finish(s);
}

int cs_forward(stage_t *s, cs_slot *sl, const int *tokens, const float *in, const int *targets, float *out,
               float *loss)
{
    return CS(s)->bf16 ? s_forward<cu_bf16>(s, sl, tokens, in, targets, out, loss)
                       : s_forward<float>(s, sl, tokens, in, targets, out, loss);
}

int cs_backward(stage_t *s, cs_slot *sl, const float *dout, float dloss, float *dinp)
{
    return CS(s)->bf16 ? s_backward<cu_bf16>(s, sl, dout, dloss, dinp) : s_backward<float>(s, sl, dout, dloss, dinp);
}
