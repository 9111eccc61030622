// cu_stage_impl.cuh — the CUDA stage's private state (cu_stage.h), shared
// by its two files: cu_stage.cu (device memory, slots, AdamW, norms, host
// syncs, the stage_backend_t table) and cu_stage_pass.cu (cuBLASLt GEMMs,
// forward, backward, the tensor-parallel all-reduces). Names shared between
// the two carry the cs_ prefix.
//
// Tensor parallelism (tp > 1, docs/tp.md "GPU"): rank r of tp runs on its
// own GPU with its own stream, cuBLASLt handle and workspace, and holds the
// stage's full fp32 parameters, gradients and moments in stage.c's layout
// (cs_shard: which parts it computes with and updates; the rest is never
// read), its own slots' activations (the per-rank ones -- qkv, atty, lse,
// fch, fchg -- 1/tp wide) and its own backward scratch. One host thread
// enqueues every rank's work, rank by rank, and the all-reduces of all ranks
// at once (cu_tpcomm.h). At tp = 1 there is one rank and none of it.
#ifndef TAH_CU_STAGE_IMPL_CUH
#define TAH_CU_STAGE_IMPL_CUH

#include <stddef.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

extern "C" {
#include "errors.h"
#include "gpt2.h"          // gpt2_tensor_*, GPT2_*
#include "optim.h"         // optim_opts_t
#include "stage.h"         // stage_t, STAGE_*, stage_norm_slot, TP_MAX
#include "stage_backend.h" // stage_backend_t
}
#include "cu_layers.cuh"

#define CS_WORKSPACE (32u << 20) /* cuBLASLt workspace bytes per rank */
#define CS_ALIGN 256              /* byte alignment of every carved device tensor */
#define CS_NCACHE 96              /* cached GEMM heuristics per rank */
#define CS_NPEV 512               /* profile events per forward / backward */

// TAH_CU_PROFILE=1: phases of the forward / backward on rank 0's stream
enum {
    P_LN, P_MM_FWD, P_ATTN_FWD, P_GELU, P_HEAD_FWD, P_CE, P_CE_BWD, P_HEAD_BWD, P_MM_DX, P_MM_DW, P_BIAS_BWD,
    P_GELU_BWD, P_ATTN_BWD, P_LN_BWD, P_ENCODER, P_COPY, P_TP_COMM, P_N
};

// a slot's activations; A_QKV, A_ATTY, A_LSE, A_FCH, A_FCHG are a rank's 1/tp
enum {
    A_IN, A_LN1, A_LN1_MEAN, A_LN1_RSTD, A_QKV, A_ATTY, A_LSE, A_RES2, A_LN2, A_LN2_MEAN, A_LN2_RSTD, A_FCH, A_FCHG,
    A_RES3, A_LNF, A_LNF_MEAN, A_LNF_RSTD, A_LOGITS, A_LOSSES, A_ROWLSE, A_N
};

struct cs_slot {
    int mb;               // micro-batch id, -1 when free
    int *tok[TP_MAX];     // (B,T) on each rank's device
    int *tgt[TP_MAX];     // (B,T)
    int *rows;            // first stage, rank 0: order (B*T), useg (B*T+1), urow (B*T) for cl_encoder_backward
    int nu;               // distinct tokens of the micro-batch
    char *a[TP_MAX][A_N]; // each rank's activations
};

struct cs_gemm_key {
    int m, n, k, ta, tb, beta, bias, abt, cdt, align, lda, ldb, ldd, epi;
};
struct cs_gemm_entry {
    cs_gemm_key key;
    cublasLtMatmulAlgo_t algo;
};

// one GPU of the stage (tensor-parallel rank; the only one at tp = 1)
struct cs_rank {
    int dev;
    cudaStream_t st;
    cudaEvent_t decev; // rank r > 0: its copy of a tensor stage_decode_boundary decoded (first use)
    cublasLtHandle_t lt;
    void *ws;
    float *params, *grads, *moments; // nparams, nparams, 2 nparams (full tensors, stage.c's carving)
    cu_bf16 *p16;                    // bf16 copy of params (bf16 mode) or NULL
    float *rowbuf;                   // stage_tied_rows_*: CS_ROWS rows of C floats (first use)
    int *rowidx;                     // their ids
    char *acts;                      // all slots' activations
    int *toks;                       // all slots' tokens and targets
    char *scratch;                   // dres, dbuf, dqkv, dbig (X), dsum (float), stage_f (float)
    char *dres, *dbuf, *dqkv, *dbig; // (B,T,C) (B,T,C) (B,T,3C/tp) (B,T,4C/tp)
    float *dsum, *stage_f;           // (B,NH/tp,T), (B,T,C) fp32 staging / all-reduce output
    float *colpart;                  // column partial sums (LayerNorm / bias gradients, no atomics)
    unsigned long long *segs;        // device: (off, n, rows, stride) per norm segment
    double *partials;                // device (nseg * CL_SUMSQ_BLOCKS)
    double *h_partials;              // host
    size_t *seg_slot;                // host: canonical norm slot of each segment
    int nseg;
    cs_gemm_entry cache[CS_NCACHE];
    int ncache;
};

struct cs_dev {
    int tp, bf16;
    int gelu_fuse;              // bf16: GELU in the FC GEMM's epilogue and its gradient in the FC
                                // projection's dx GEMM (cuBLASLt GELU_AUX_BIAS / DGELU); TAH_CU_GELU_FUSE=0: off
    size_t xs;                  // bytes per activation element
    cs_rank g[TP_MAX];
    cudaStream_t streams[TP_MAX]; // g[r].st, for the all-reduce calls
    size_t off[STAGE_NTENSORS]; // element offset of each tensor
    cs_slot *slots;
    float *h_losses;            // host (B*T), pinned: rank 0's losses
    int *h_rows;                // first stage: host (3 B*T + 1), pinned: a slot's rows before the upload
    int *h_cnt;                 // first stage: host (Vp) counts
    void *tpc;                  // the all-reduce group (cu_tp_t, tp > 1)
    int compressed;             // its all-reduce is the compressed two-shot
    int embed_dirty;            // tp > 1: rank 0 has new wte/wpe gradients the others lack
    int prof;                   // TAH_CU_PROFILE=1
    cudaEvent_t pev[CS_NPEV];   // events of the current forward / backward (rank 0)
    int pph[CS_NPEV], npev;     // phase each event closes
    double pms[P_N];            // accumulated ms per phase
    // stage_encode_boundary (rank 0's tensors): its own stream, codec scratch and payload buffer
    cudaStream_t wst;
    cudaEvent_t wev;
    void *wscr;
    uint8_t *wpay;
    size_t wscr_n, wpay_n;
    int dinp_mb;                // micro-batch whose input gradient rank 0's dres holds, -1 when none
    // stage_decode_boundary (on rank 0's device): the received payload, the codec's scratch, the
    // decoded tensors (0: an input, 1: an output gradient, fp32 (B,T,C)) and the micro-batch each
    // holds (-1: none); dsrc is the one the running forward / backward uploads instead of host
    // memory (ranks r > 0 copy it from rank 0's device: g[r].decev)
    uint8_t *dpay;
    void *dscr;
    size_t dpay_n, dscr_n, dec_n[2];
    float *dec[2];
    int dec_mb[2];
    const float *dsrc;
    unsigned long long *dseg;   // its one norm segment (0, B*T*C, 1, 0)
    double *dpart, *h_dpart;    // the norm's partial sums, device and host
    // stage_backward_encode's request while its backward runs (wspec NULL otherwise)
    const codec_spec_t *wspec;
    uint8_t *wframe;
    size_t wlen;
    int wlaunched;
    char devname[64];           // rank 0's GPU
    char devlist[64];           // "0" or "0,1"
    char err[512];              // the first device error (sticky)
    int failed;
    char lasterr[512];          // why the last forward / backward failed without a device error
};

static inline cs_dev *CS(const stage_t *s)
{
    return (cs_dev *)s->cu;
}

// The first device error: kept, printed once, sticky (TAH_EDEVICE).
int cs_fail(cs_dev *c, const stage_t *s, const char *what, const char *why, const char *file, int line);

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess)                                                                    \
            return cs_fail(c, s, #call, cudaGetErrorString(e_), __FILE__, __LINE__);             \
    } while (0)
#define CKB(call)                                                                                 \
    do {                                                                                          \
        cublasStatus_t e_ = (call);                                                               \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                                          \
            return cs_fail(c, s, #call, cublasLtGetStatusString(e_), __FILE__, __LINE__);         \
    } while (0)

// parameter / gradient tensor i of rank g at element offset off
static inline float *cs_p(const cs_dev *c, const cs_rank *g, int i, size_t off)
{
    return g->params + c->off[i] + off;
}
static inline float *cs_g(const cs_dev *c, const cs_rank *g, int i, size_t off)
{
    return g->grads + c->off[i] + off;
}

// Rank r's part of tensor i over nl layers at degree tp, the split of
// pipeline/blocks.h: rows runs of n elements, stride apart, from element
// off of the tensor. 0 for a replicated tensor (every rank holds, computes
// and updates all of it; so do all tensors at tp = 1).
//   QKV w/b   rows [r*C/tp, (r+1)*C/tp) of each of the Q, K and V blocks
//   attproj w columns [r*C/tp, ...) of every row
//   FC w/b    rows [r*4C/tp, ...);   FC proj w  columns [r*4C/tp, ...)
int cs_shard(const stage_opts_t *o, int i, int r, int tp, int nl, size_t *off, size_t *n, size_t *rows,
             size_t *stride);

// The forward / backward of stage.h on a free / in-flight slot
// (cu_stage_pass.cu); they end with every rank's stream synchronised.
int cs_forward(stage_t *s, cs_slot *sl, const int *tokens, const float *in, const int *targets, float *out,
               float *loss);
int cs_backward(stage_t *s, cs_slot *sl, const float *dout, float dloss, float *dinp);
// Enqueue the encode of rank 0's (B,T,C) tensor src with the request's spec
// on the wire stream, after what rank 0's compute stream has queued so far,
// and the copy of the payload into the request's frame (cu_stage.cu).
int cs_wire_launch(stage_t *s, const char *src);

#endif
