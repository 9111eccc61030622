/* cu_stage.h — the CUDA backend of the pipeline stage (pipeline/stage.h).
 *
 * Same tensors, llm.c parameter layout, layer range, first/last roles, slot
 * bookkeeping and AdamW as the CPU stage (pipeline/stage.c, layers.c,
 * optim.c); a program selects it per stage with stage_opts_t.backend =
 * STAGE_CUDA, .device = K (cuda:K), .precision = STAGE_FP32 | STAGE_BF16,
 * after calling cu_stage_register() once.
 *
 * On the device: fp32 master parameters, gradients and AdamW moments (one
 * allocation each, carved like stage.c's), and per in-flight slot one
 * activation allocation. Precision:
 *   fp32  activations fp32, cuBLASLt CUBLAS_COMPUTE_32F (no TF32): the mode
 *         that matches the CPU backend to rounding (tests/test_cu_stage.c);
 *   bf16  activations and a bf16 copy of the parameters for the matrix
 *         products (refreshed by every AdamW step and every upload), fp32
 *         accumulation, LayerNorm statistics, softmax, loss, gradients of
 *         the parameters, master weights and moments in fp32.
 * Tensor parallelism (o.tp > 1, docs/tp.md "GPU"): the stage runs over tp
 * GPUs (stage_device(o, r)) driven by the calling thread, Megatron-style
 * (pipeline/blocks.h's split), with NCCL's all-reduce or the compressed
 * two-shot of cu_tpcomm.h between them; every rank holds the full
 * tensors, the host mirrors and checkpoints are the same as at tp = 1.
 * Needs a build with NCCL (otherwise creation fails: "built without
 * NCCL").
 * Attention is causal flash-style (online softmax; per-row logsumexp kept
 * for backward, which recomputes the probabilities): no (T,T) buffer; in
 * bf16 on the tensor cores (cu_flash.cu). Parameter gradients have no
 * float atomics: the same step gives the same bits (docs/cuda-stage.md).
 * Boundary activations, gradients, tokens and the loss stay host pointers
 * at the interface; the copies happen inside. Every CUDA and cuBLASLt call
 * is checked: the first failure is kept as a message (stage_error), printed
 * once on stderr, and every later call returns TAH_EDEVICE.
 *
 * Kernels use fast contraction (FMA) and the hardware exp/log where noted;
 * they are not bit-identical to the CPU, which the test's tolerances state. */
#ifndef TAH_CU_STAGE_H
#define TAH_CU_STAGE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Register the backend with stage_backend_register (stage_backend.h). */
void cu_stage_register(void);
/* CUDA devices visible to this process (0 when none or no driver). */
int cu_stage_device_count(void);

/* The speed a GPU node announces (node/bench.c's sgemm, for the GPU): a
 * GPT-2 MLP product of 4096 tokens (3072 x 4096 x 768) through cuBLASLt on
 * each of the n devices, in fp32 (CUBLAS_COMPUTE_32F, no TF32: the fp32
 * stage's) and in bf16 (fp32 accumulation: the bf16 stage's); the best of 4
 * timings of 8 products, GFLOP/s summed over the devices. id: the devices'
 * UUIDs in hex, comma-separated (at most 33 bytes each), by which the
 * coordinator knows nodes that share a GPU. About 50 ms per device after
 * its context exists. 0, or TAH_EDEVICE / TAH_EINVAL with err filled. */
int cu_stage_bench(const int *devices, int n, double *gflops_f32, double *gflops_bf16, char *id, size_t idlen,
                   char *err, size_t errlen);

/* Test hook: the attention kernels alone on host arrays. qkv (B,T,3C),
 * dout (B,T,C) in; out (B,T,C), lse (B,NH,T) and dqkv (B,T,3C) out (dout
 * and dqkv may be NULL: forward only). bf16: inputs rounded to bf16 and the
 * bf16 kernels run. 0 or TAH_EINVAL / TAH_EDEVICE with err filled. */
int cu_stage_attention_host(int device, int bf16, const float *qkv, const float *dout, float *out,
                            float *lse, float *dqkv, int B, int T, int C, int NH, char *err,
                            size_t errlen);

/* Benchmark hook: with TAH_CU_PROFILE=1 in the environment when the stage
 * was created, CUDA events split every forward and backward into phases
 * (layernorm, matmul fwd, attn fwd, ..., "copies"); this writes up to max
 * accumulated milliseconds and the phase names (static strings), zeroes
 * them when reset, and returns the count (0: profiling off). */
struct stage;
int cu_stage_profile(struct stage *s, double *ms, const char **names, int max, int reset);

#ifdef __cplusplus
}
#endif

#endif
