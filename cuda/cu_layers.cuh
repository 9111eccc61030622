// cu_layers.cuh — the GPT-2 layer kernels of the CUDA stage (private to
// cuda/): launchers mirroring pipeline/layers.h (outputs first, then saved
// state, inputs, weights, sizes; a stream last). X is the activation type
// (float or __nv_bfloat16); parameters and their gradients are always fp32;
// every reduction accumulates in fp32. Launchers return the launch's
// cudaGetLastError(). Backward launchers ADD (+=) into parameter gradients,
// like layers.c, unless the comment says "=".
#ifndef TAH_CU_LAYERS_CUH
#define TAH_CU_LAYERS_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>

typedef __nv_bfloat16 cu_bf16;

__device__ __forceinline__ float cu_ld(float x) { return x; }
__device__ __forceinline__ float cu_ld(cu_bf16 x) { return __bfloat162float(x); }
template <class X> __device__ __forceinline__ X cu_st(float x);
template <> __device__ __forceinline__ float cu_st<float>(float x) { return x; }
template <> __device__ __forceinline__ cu_bf16 cu_st<cu_bf16>(float x) { return __float2bfloat16_rn(x); }

// 2^x by the special-function unit alone (ex2.approx.ftz: about 2 ulp, results below 2^-126
// flushed to zero), where exp2f adds three instructions per call to produce those denormals
// and expf about four more for its range reduction: the attention softmax and the bf16
// cross-entropy, whose probabilities below 1.2e-38 sit beside a row sum of at least 1.
__device__ __forceinline__ float cl_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Raise kernel's dynamic shared-memory limit to bytes (needed above 48 KB)
// on the current device. The attribute is per device (a tensor-parallel
// stage launches the same kernel on several GPUs): *state remembers, per
// device (0..63; others always set it), the largest limit set so far, so
// the call is free after the first. Zero-initialised state (a static).
struct cl_optin {
    int bytes[64];
};
cudaError_t cl_smem_optin(const void *kernel, size_t bytes, cl_optin *state);

// y = (X) x, n elements (and back)
template <class X> cudaError_t cl_from_f32(X *y, const float *x, size_t n, cudaStream_t st);
template <class X> cudaError_t cl_to_f32(float *y, const X *x, size_t n, cudaStream_t st);

template <class X>
cudaError_t cl_encoder_forward(X *out /* (B,T,C) */, const int *tok /* (B,T) */, const float *wte /* (Vp,C) */,
                               const float *wpe /* (maxT,C) */, int B, int T, int C, cudaStream_t st);
// dwte: the positions grouped by token (built on the host, cu_stage_pass.cu): order
// (B*T positions, by token, ascending within one), useg (nu+1 starts), urow
// (nu distinct tokens); deterministic, in layers.c's order of additions
template <class X>
cudaError_t cl_encoder_backward(float *dwte /* (Vp,C) += */, float *dwpe /* (maxT,C) += */,
                                const X *dout /* (B,T,C) */, const int *order, const int *useg, const int *urow,
                                int nu, int B, int T, int C, cudaStream_t st);
template <class X>
cudaError_t cl_layernorm_forward(X *out /* (N,C) */, float *mean /* (N) */, float *rstd /* (N) */,
                                 const X *inp /* (N,C) */, const float *w /* (C) */, const float *b /* (C) */,
                                 int N, int C, cudaStream_t st);
// Column partial sums of the deterministic parameter-gradient kernels: part
// needs CL_COLPART_FLOATS(lnC, biasOC) floats (the widest LayerNorm C, the
// widest bias OC); with part NULL (or an unsupported shape) the atomic column
// kernel runs instead.
#define CL_COLPART_BLOCKS 512 /* LayerNorm backward blocks */
#define CL_COLPART_CHUNKS 512 /* row chunks of the bias column sums (<= CL_COLPART_BLOCKS) */
#define CL_COLPART_FLOATS(lnC, biasOC) \
    ((size_t)CL_COLPART_BLOCKS * (3 * (size_t)(lnC) > (size_t)(biasOC) ? 3 * (size_t)(lnC) : (size_t)(biasOC)))
// dinp += LN backward (may not alias dout); dw, db +=; ds non-NULL: ds += the
// column sums of dinp as it is left (the bias gradient of the layer whose
// output gradient dinp is, without reading it again)
template <class X>
cudaError_t cl_layernorm_backward(X *dinp /* (N,C) += */, float *dw /* (C) += */, float *db /* (C) += */,
                                  const X *dout /* (N,C) */, const X *inp /* (N,C) */, const float *w /* (C) */,
                                  const float *mean /* (N) */, const float *rstd /* (N) */, int N, int C,
                                  float *part /* scratch or NULL */, cudaStream_t st, float *ds = NULL);
// out[i][c] += the sum over b < nblocks of part[b][i n + c] (rows of np n floats, np <= 3;
// a NULL out[i] is skipped), in a fixed order: the column pass of the kernels above and of
// the attention backward's bias sums
cudaError_t cl_colpart_sum(float *const *out, int np, int n, const float *part, int nblocks, cudaStream_t st);
// dbias[j] += sum_n dout[n,j]; dout's rows are ld apart (0: OC)
template <class X>
cudaError_t cl_bias_backward(float *dbias /* (OC) += */, const X *dout /* (N,OC), row stride ld */, int N, int OC,
                             float *part /* scratch or NULL */, cudaStream_t st, int ld = 0);
// dbias[i] (NULL: none) += the column sums of dqkv's i-th third (q, k, v), by cl_bias_backward:
// the QKV bias gradient where the attention backward's kernels did not sum it
template <class X>
cudaError_t cl_qkv_bias_backward(float *const *dbias, const X *dqkv /* (N,3C) */, int N, int C, float *part,
                                 cudaStream_t st);
// out = x + sum + bias[column] (the row-parallel layers' residual after a
// compressed all-reduce; out may not alias sum)
template <class X>
cudaError_t cl_residual_bias(X *out /* (N,C) */, const X *x /* (N,C) */, const float *sum /* (N,C) */,
                             const float *bias /* (C) */, int N, int C, cudaStream_t st);
template <class X> cudaError_t cl_gelu_forward(X *out, const X *inp, size_t n, cudaStream_t st);
// dinp = gelu'(inp) * dout (=, dinp may alias dout)
template <class X> cudaError_t cl_gelu_backward(X *dinp, const X *inp, const X *dout, size_t n, cudaStream_t st);
// losses[n] = lse[n] - logits[n, targets[n]], lse over the first V columns
template <class X>
cudaError_t cl_crossentropy_forward(float *losses /* (N) */, float *lse /* (N) */, const X *logits /* (N,Vp) */,
                                    const int *targets /* (N) */, int N, int V, int Vp, cudaStream_t st);
// 1 when cl_crossentropy_fused can run on this buffer
template <class X> int cl_crossentropy_fusable(const X *logits, int Vp);
// losses and lse as cl_crossentropy_forward, and logits (in place) =
// softmax - onehot, padding columns 0 (unscaled: dloss goes into the
// head's backward GEMMs as alpha)
template <class X>
cudaError_t cl_crossentropy_fused(float *losses /* (N) */, float *lse /* (N) */, X *logits /* (N,Vp) */,
                                  const int *targets /* (N) */, int N, int V, int Vp, cudaStream_t st);
// logits (in place) = (softmax - onehot) * dloss, padding columns 0
template <class X>
cudaError_t cl_crossentropy_backward(X *logits /* (N,Vp) */, const float *lse /* (N) */, const int *targets /* (N) */,
                                     float dloss, int N, int V, int Vp, cudaStream_t st);
// causal self-attention, flash style: out (=), lse (B,NH,T) (=)
template <class X>
cudaError_t cl_attention_forward(X *out /* (B,T,C) */, float *lse /* (B,NH,T) */, const X *qkv /* (B,T,3C) */,
                                 int B, int T, int C, int NH, cudaStream_t st);
// dqkv (=) from dout; dsum (B,NH,T) scratch. dbias non-NULL: dbias[i] (C, NULL: none) +=
// the column sums of dqkv's q, k, v thirds (the QKV bias gradient): from the flash kernels'
// own tiles (into part: CL_COLPART_FLOATS(C, .) floats, then cl_colpart_sum), otherwise
// by cl_bias_backward
template <class X>
cudaError_t cl_attention_backward(X *dqkv /* (B,T,3C) */, float *dsum /* (B,NH,T) */, const X *dout /* (B,T,C) */,
                                  const X *out /* (B,T,C) */, const float *lse /* (B,NH,T) */,
                                  const X *qkv /* (B,T,3C) */, int B, int T, int C, int NH, cudaStream_t st,
                                  float *const *dbias = NULL, float *part = NULL);
// the same on the tensor cores (cu_flash.cu, bf16 only); the two above call
// these for bf16 unless TAH_CU_ATTN_LEGACY=1
cudaError_t cl_flash_forward(cu_bf16 *out /* (B,T,C) */, float *lse /* (B,NH,T) */, const cu_bf16 *qkv /* (B,T,3C) */,
                             int B, int T, int C, int NH, cudaStream_t st);
cudaError_t cl_flash_backward(cu_bf16 *dqkv /* (B,T,3C) */, float *dsum /* (B,NH,T) */,
                              const cu_bf16 *dout /* (B,T,C) */, const cu_bf16 *out /* (B,T,C) */,
                              const float *lse /* (B,NH,T) */, const cu_bf16 *qkv /* (B,T,3C) */, int B, int T,
                              int C, int NH, cudaStream_t st, float *const *dbias = NULL, float *part = NULL);
// 1 when the attention kernels support head size hs
int cl_attention_supports(int hs);

#endif

// ---- optimizer and gradient bookkeeping (cu_optim.cu) ----
// One AdamW launch over every tensor of a stage: blockIdx.y picks the tensor.
#define CL_MAX_TENSORS 24
// Rows rows[0..n) of a (Vp, C) tensor t against a packed (n, C) buffer:
// GET buf = t[rows]; SET t[rows] = buf (and t16[rows] = bf16(buf) unless
// t16 is NULL); ADD t[rows] = buf + t[rows] (stage_tied_rows_*, stage.h).
enum { CL_ROWS_GET = 0, CL_ROWS_SET = 1, CL_ROWS_ADD = 2 };
cudaError_t cl_rows(float *t, cu_bf16 *t16, float *buf, const int *rows, size_t n, int C, int mode, cudaStream_t st);

struct cl_adamw_tensors {
    size_t off[CL_MAX_TENSORS], n[CL_MAX_TENSORS]; // element offset in the allocation, elements per run
    size_t rows[CL_MAX_TENSORS], stride[CL_MAX_TENSORS]; // runs of n elements stride apart (rows <= 1: one run)
    float wd[CL_MAX_TENSORS];                      // weight decay of the tensor
    int count;
};
// p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p) exactly as optim_adamw; p16
// (NULL in fp32 mode) gets bf16(p) of every updated element.
cudaError_t cl_adamw(float *p, cu_bf16 *p16, float *m, float *v, const float *g, const cl_adamw_tensors *t,
                     float lr, float b1, float b2, float eps, float bc1, float bc2, float grad_scale, cudaStream_t st);
// Sum of squares (double) of each segment of x: partials[seg * CL_SUMSQ_BLOCKS + k] for
// k < CL_SUMSQ_BLOCKS; segs is a device array of (off, n, rows, stride) quadruples: rows runs
// of n elements starting at off, stride apart (rows <= 1: the one run [off, off+n)).
#define CL_SUMSQ_BLOCKS 128
cudaError_t cl_sumsq(double *partials, const float *x, const unsigned long long *segs, int nseg, cudaStream_t st);
// a = b = a + b (a first, as stage_tied_sync)
cudaError_t cl_tied_sum(float *a, float *b, size_t n, cudaStream_t st);
