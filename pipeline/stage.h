/* stage.h — one pipeline stage of a GPT-2 model on the CPU backend.
 *
 * A stage owns the contiguous layer range [layer0, layer1) (at least one
 * layer). The first stage also owns wte and wpe (it embeds tokens); the last
 * stage owns lnf, the LM head and the loss. The LM head is its own tensor
 * STAGE_HEAD on the last stage; with tied embeddings it is a copy of wte that
 * stage_tied_sync keeps bit-identical (it sums the two gradient copies once
 * per step, after all micro-batches, in the fixed order first + last; the
 * single-stage model keeps both copies too, so every split computes the same
 * bits). Untied, HEAD is an independent parameter initialised from wte.
 *
 * Interface (backend-neutral; the CUDA backend, cuda/cu_stage.h, selected
 * by o->backend = STAGE_CUDA, implements the same calls through
 * stage_backend.h):
 *   stage_forward(mb, input)   -> boundary activation (B,T,C), or the loss on
 *                                 the last stage. Activations needed by
 *                                 backward are kept in one of nslots slots
 *                                 until stage_backward(mb) or stage_discard(mb).
 *   stage_backward(mb, dout)   -> gradient of the input activation (B,T,C);
 *                                 parameter gradients accumulate (+=) until
 *                                 stage_zero_grad.
 *   stage_step(lr, scale)      -> AdamW on this stage's parameters.
 *   save/load                  -> ckpt.h (per-stage) and stage_load_params/
 *                                 stage_store_params (whole llm.c model).
 *
 * Tensor parallelism (o.tp > 1, blocks.h): the layers run Megatron-style on
 * tp worker threads with a (compressed) all-reduce between them; the
 * stage's tensors stay whole, so everything above (gradients, norm, AdamW,
 * checkpoints) is the same at any tp. On the CUDA backend the tp ranks are
 * tp GPUs (stage_device()) driven by the calling thread, the all-reduce
 * NCCL's or the same two-shot compressed one (cuda/cu_tpcomm.h).
 *
 * Memory: parameters, gradients, moments (m then v) and activations are
 * each one allocation, carved from the size table stage_param_sizes(). */
#ifndef TAH_STAGE_H
#define TAH_STAGE_H

#include <stddef.h>

#include "codec.h"  /* codec_spec_t */
#include "gpt2.h"   /* gpt2_config_t, GPT2_* tensor ids */
#include "optim.h"  /* optim_opts_t */
#include "tpcomm.h" /* tp_comm_t, TP_MAX */
#include "tpteam.h" /* tp_team_t */

enum { STAGE_HEAD = GPT2_NTENSORS, STAGE_NTENSORS };

typedef struct stage_opts {
    gpt2_config_t cfg;
    int layer0, layer1; /* layers [layer0, layer1) */
    int first, last;    /* embeds / owns lnf + head + loss */
    int B, T;           /* micro-batch shape, 1 <= T <= maxT */
    int nslots;         /* micro-batches in flight at most (>= 1) */
    int tied;           /* 1: HEAD is a tied copy of wte */
    int tied_link;      /* tied, first and last on two nodes (tah-node; docs/runtime.md): the last
                           stage's head is the tied matrix and the first stage's wte a cache of it,
                           refreshed row by row (stage_tied_rows_put) before the rows are used.
                           The first stage neither counts wte in the norm nor updates it; the
                           last stage counts its head's gradient in wte's norm slot. */
    int backend;        /* STAGE_CPU (0, the default) or STAGE_CUDA (stage_backend.h) */
    int device;         /* STAGE_CUDA: GPU index (cuda:device); at tp > 1 ranks r on cuda:device+r ... */
    int ndevices;       /* STAGE_CUDA: ... unless this is tp (> 0): rank r on cuda:devices[r] (distinct) */
    int devices[TP_MAX];
    int precision;      /* STAGE_CUDA: STAGE_FP32 (0) or STAGE_BF16 */
    int tp;             /* tensor-parallel degree: 0 or 1 = none; else 2..TP_MAX dividing NH */
    codec_spec_t tp_rs, tp_ag; /* all-reduce codecs, reduce-scatter and all-gather (id 0 = none) */
} stage_opts_t;

enum { STAGE_CPU = 0, STAGE_CUDA = 1 };
enum { STAGE_FP32 = 0, STAGE_BF16 = 1 };

/* Activations of one in-flight micro-batch; per-layer buffers hold nl layers. */
typedef struct stage_slot {
    int mb;                                 /* micro-batch id, -1 when free */
    int *tokens, *targets;                  /* (B,T) first / last stage */
    float *in;                              /* (B,T,C) input of the first layer */
    float *ln1, *ln1_mean, *ln1_rstd;       /* (nl,B,T,C) (nl,B,T) (nl,B,T) */
    float *qkv;                             /* (nl,B,T,3C) */
    float *atty;                            /* (nl,B,T,C) */
    float *att;                             /* (nl,B,NH,T,T) */
    float *res2;                            /* (nl,B,T,C) */
    float *ln2, *ln2_mean, *ln2_rstd;       /* (nl,B,T,C) (nl,B,T) (nl,B,T) */
    float *fch, *fchg;                      /* (nl,B,T,4C) each */
    float *res3;                            /* (nl,B,T,C) */
    float *lnf, *lnf_mean, *lnf_rstd;       /* (B,T,C) (B,T) (B,T) last stage */
    float *logits;                          /* (B,T,Vp) last stage; probs, then dlogits */
    float *losses;                          /* (B,T) last stage */
} stage_slot_t;

typedef struct stage {
    stage_opts_t o;
    int nl;                          /* layer1 - layer0 */
    size_t sizes[STAGE_NTENSORS];    /* elements per tensor on this stage (0 = absent) */
    size_t nparams;
    float *params;                   /* one allocation */
    float *grads;                    /* one allocation */
    float *moments;                  /* one allocation: m (nparams) then v (nparams) */
    float *p[STAGE_NTENSORS], *g[STAGE_NTENSORS], *m[STAGE_NTENSORS], *v[STAGE_NTENSORS];
    float *acts;                     /* one allocation for all slots */
    int *acts_i;                     /* tokens/targets of all slots */
    stage_slot_t *slots;
    float *scratch;                  /* one allocation: backward buffers below */
    float *dres, *dbuf, *dqkv, *dbig;
    int tp;                          /* >= 1 */
    tp_team_t *team;                 /* tp > 1: one worker per rank */
    tp_comm_t *comm;                 /* tp > 1: the all-reduce group */
    float *red;                      /* (tp, B,T,C): each rank's all-reduce buffer */
    float *tpscr;                    /* (tp, tpscr_n): attention scratch per rank */
    size_t tpscr_n;
    int rank_threads;                /* OpenMP threads of each rank */
    int tp_rc[TP_MAX];
    char tp_err[TP_MAX][256];
    char err[512];                   /* why the last forward/backward (or tied rows call) failed */
    double *partials;                /* norm chunk partial sums */
    size_t npartials;
    long long t;                     /* AdamW steps taken */
    long long tp_call_t[TP_MAX];     /* per rank: the step of its last all-reduce id ... */
    uint32_t tp_calls[TP_MAX];       /* ... and the all-reduces it made in that step */
    void *cu;                        /* STAGE_CUDA: the backend's state (stage_backend.h) */
} stage_t;

/* The GPU of tensor-parallel rank r (STAGE_CUDA): devices[r] when a list
 * is given (ndevices > 0), else device + r. */
int stage_device(const stage_opts_t *o, int r);

/* The id (tpcomm.h) of rank r's next tensor-parallel all-reduce: the
 * steps taken (t) in the high 32 bits, the call's index since then below, so
 * a resumed run numbers its calls as the uninterrupted one did (every rank
 * makes the same sequence of calls). */
uint64_t stage_tp_call_id(stage_t *s, int r);

/* Elements per tensor of a stage with these options; returns the total. */
size_t stage_param_sizes(const stage_opts_t *o, size_t sizes[STAGE_NTENSORS]);
/* Name of a stage tensor ("head" for STAGE_HEAD). */
const char *stage_tensor_name(int i);

/* NULL on invalid options (err says which) or out of memory. Parameters,
 * gradients and moments start at zero. */
stage_t *stage_new(const stage_opts_t *o, char *err, size_t errlen);
void stage_destroy(stage_t **self_p);

/* Copy this stage's slices of a full model in (HEAD gets wte) / out (wte
 * comes from the first stage only). Configs must match. */
int stage_load_params(stage_t *s, const gpt2_model_t *model);
int stage_store_params(const stage_t *s, gpt2_model_t *model);

/* tokens (first stage) or in (B,T,C) (other stages); targets (last stage).
 * out (B,T,C) gets the boundary activation (non-last stages); *loss the
 * mean cross-entropy of the micro-batch (last stage). 0, or TAH_EINVAL when
 * no slot is free / mb is already in flight. */
int stage_forward(stage_t *s, int mb, const int *tokens, const float *in, const int *targets,
                  float *out, float *loss);
/* dout (B,T,C) (non-last stages) or dloss = d(objective)/d(mean loss of this
 * micro-batch) / (B*T) (last stage); dinp (B,T,C) gets the input gradient
 * (non-first stages). 0 or TAH_EINVAL when mb is not in flight. */
int stage_backward(stage_t *s, int mb, const float *dout, float dloss, float *dinp);
/* Why the last stage_forward / stage_backward failed (all-reduce errors: a
 * codec refusing a non-finite tensor), "" after success; on the CUDA
 * backend the first device error ("cuda:0: ...: out of memory"), sticky.
 * Never NULL. */
const char *stage_error(const stage_t *s);
/* Drop micro-batch mb's activations without backward (evaluation). */
void stage_discard(stage_t *s, int mb);
/* Micro-batches currently in flight. */
int stage_inflight(const stage_t *s);

void stage_zero_grad(stage_t *s);
/* Tied-embedding gradient sync, once per step after all backward passes:
 * both copies become first->g[wte] + last->g[head] (that order). first and
 * last may be the same stage. No-op unless tied. */
void stage_tied_sync(stage_t *first, stage_t *last);
/* The same for a runtime that exchanges the gradient over a link:
 * mine = (mine_is_first ? mine + peer : peer + mine), n elements. */
void stage_tied_reduce(float *mine, const float *peer, size_t n, int mine_is_first);

/* The tied exchange over a link (docs/runtime.md): the first stage's wte
 * gradient is zero outside the rows of its step's tokens, so only those
 * rows travel. stage_tied_rows: the distinct values of tokens[0..n) (each
 * < Vp), ascending, into rows (Vp ints; mask: Vp bytes of scratch);
 * returns their count. stage_tied_codec: g's travelling rows (rows[0..
 * nrows), or all Vp when rows is NULL) are encoded with spec, shape
 * (1, rows, C), into frame (cap bytes, for sending; NULL: a scratch frame)
 * and become the decode of that frame, as the receiving end sees them, so
 * both ends add the same bits; fp32 leaves g as it is (and without a frame
 * does nothing). scratch: nrows * C floats for the rows, or NULL (then
 * allocated). 0 or a codec error. */
size_t stage_tied_rows(const int *tokens, size_t n, int Vp, uint8_t *mask, int *rows);
int stage_tied_codec(const codec_spec_t *spec, float *g, int Vp, int C, const int *rows, size_t nrows,
                     float *scratch, uint8_t *frame, size_t cap, char *err, size_t errlen);

/* Rows of the tied matrix on this stage (wte on the first stage, the head
 * on the last; tied only): rows[0..R) distinct ids < Vp, C floats each in
 * buf (R * C). get: buf = (grad ? g : p)[rows]. put: grad: g[rows] = buf +
 * g[rows] (the first stage's rows added to the last stage's gradient, in
 * stage_tied_sync's order); else p[rows] = buf (a device stage refreshes
 * its bf16 copy too). On a device stage these run on the device (no full
 * host sync). 0, TAH_EINVAL or TAH_EDEVICE. */
int stage_tied_rows_get(stage_t *s, int grad, const int *rows, size_t R, float *buf);
int stage_tied_rows_put(stage_t *s, int grad, const int *rows, size_t R, const float *buf);

/* Global-norm bookkeeping that gives the same bits for every split: one
 * double sum of squares per (tensor, layer) in a canonical slot, summed in
 * slot order by stage_norm_total. */
size_t stage_norm_nslots(const gpt2_config_t *cfg);
/* Add this stage's sums of squares into slots[stage_norm_nslots()]. The
 * tied HEAD copy is not counted (its gradient is wte's), except with
 * tied_link, where it is counted in wte's slot and the first stage's wte is
 * not. */
void stage_grad_sumsq(stage_t *s, double *slots);
double stage_norm_total(const double *slots, size_t n);
/* The canonical slot of tensor i (layer: the model layer of a per-layer
 * tensor, else ignored); STAGE_HEAD has its own. */
size_t stage_norm_slot(const gpt2_config_t *cfg, int i, int layer);
/* Both backends' rules: whether tensor i's gradient is left out of the
 * norm, the tensor whose slot it is counted in (the tied head: wte's), and
 * whether AdamW leaves tensor i alone (tied_link: the first stage's wte). */
int stage_norm_skips(const stage_opts_t *o, int i);
int stage_norm_tensor(const stage_opts_t *o, int i);
int stage_step_skips(const stage_opts_t *o, int i);

/* AdamW on every parameter of this stage (t increments); with tied_link
 * not on the first stage's wte (a cache of the last stage's head). */
void stage_step(stage_t *s, const optim_opts_t *o, float lr, float grad_scale);

/* Host mirrors of a device stage (no-ops, 0, on the CPU backend):
 * to_host copies the device's values into s->params / s->moments / the
 * tied gradient tensor (g[wte] on the first, g[head] on the last stage)
 * / every gradient (s->grads, for tests and debugging);
 * to_device copies the host values back (after ckpt_load, or after a tied
 * gradient exchange over a link). 0 or TAH_EDEVICE. */
enum { STAGE_SYNC_PARAMS = 1, STAGE_SYNC_MOMENTS = 2, STAGE_SYNC_TIED = 4, STAGE_SYNC_GRADS = 8 /* all */ };
int stage_sync_to_host(const stage_t *s, int what);
int stage_sync_to_device(stage_t *s, int what);

/* Boundary tensors encoded where they live (the CUDA backend; issue 6):
 * the codec runs on the stage's device and only the payload crosses to the
 * host, one device-to-host copy into frame + 64, then the frame is sealed
 * (header + CRC, codec_frame_seal). what = STAGE_WIRE_OUT: the output of
 * micro-batch mb's stage_forward (non-last stages; mb still in flight, so
 * before any stage_discard); STAGE_WIRE_DINP: the input gradient of the last
 * stage_backward (non-first stages; mb is that call's). Either call may have
 * passed out / dinp = NULL. The frame is byte for byte what codec_encode
 * writes for the same tensor in float32 (cuda/cu_codec.h). frame holds
 * cap >= codec_frame_size(spec, shape (B,T,C)) bytes; stage_host_alloc
 * memory (pinned) is copied into fastest. 0, TAH_EINVAL (no such tensor,
 * a CPU stage), TAH_ESPACE, a codec error (TAH_ENONFINITE...) or
 * TAH_EDEVICE, with err filled. */
enum { STAGE_WIRE_OUT = 1, STAGE_WIRE_DINP = 2 };
int stage_encodes_on_device(const stage_t *s);
int stage_encode_boundary(stage_t *s, int what, int mb, const codec_spec_t *spec, uint8_t *frame, size_t cap,
                          size_t *written, char *err, size_t errlen);
/* stage_backward and stage_encode_boundary(STAGE_WIRE_DINP) in one call
 * (non-first CUDA stages), overlapped: the encode of d(input) starts on the
 * wire stream as soon as the first layer's input gradient is complete, while
 * the compute stream still runs that layer's QKV weight and bias gradients
 * (the same operations as stage_backward, later). Same frame, same
 * gradients; errors as the two calls'. */
int stage_backward_encode(stage_t *s, int mb, const float *dout, float dloss, const codec_spec_t *spec,
                          uint8_t *frame, size_t cap, size_t *written, char *err, size_t errlen);
/* Received boundary frames decoded where the stage computes (the CUDA
 * backend; at tp > 1 on rank 0's GPU, the other ranks copy the tensor):
 * what = STAGE_WIRE_IN, the input of micro-batch mb's next stage_forward
 * (non-first stages), or STAGE_WIRE_DOUT, the output gradient of its next
 * stage_backward / stage_backward_encode (non-last stages); that call then
 * passes in / dout = NULL. frame: len bytes, a whole codec frame of shape
 * (B,T,C) (header and CRC are checked again here). One payload copy to the
 * device, the codec's GPU decoder (the CPU decoder's floats:
 * cuda/cu_codec.h), the decoded tensor's L2 norm into *norm for the caller's
 * checks. 0; a frame error (TAH_ECORRUPT, TAH_ENONFINITE, TAH_ERANGE,
 * TAH_ESHAPE, TAH_ECHECKSUM...: the sender's fault, err filled, nothing
 * pending); TAH_EINVAL (a stage that cannot: stage_decodes_on_device is 0)
 * or TAH_EDEVICE. */
enum { STAGE_WIRE_IN = 3, STAGE_WIRE_DOUT = 4 };
int stage_decodes_on_device(const stage_t *s);
int stage_decode_boundary(stage_t *s, int what, int mb, const uint8_t *frame, size_t len, double *norm, char *err,
                          size_t errlen);
/* Host memory for frames: page-locked on a CUDA stage (NULL if that fails),
 * malloc otherwise. Free with stage_host_free on the same stage. */
void *stage_host_alloc(const stage_t *s, size_t bytes);
void stage_host_free(const stage_t *s, void *p);

/* One line: "layers 0..3 (first, last), 1234 params, cpu backend (OpenBLAS, 2 threads)"
 * plus the tensor-parallel degree and codecs when tp > 1. */
void stage_describe(const stage_t *s, char *buf, size_t buflen);

#endif
