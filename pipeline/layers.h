/* layers.h — GPT-2 layer functions of the CPU backend (forward and exact
 * backward), llm.c style.
 *
 * Conventions: outputs first, then saved state, then inputs and weights,
 * then sizes; every pointer has its shape in a comment. Backward functions
 * ADD (+=) into parameter gradients and into input gradients, so gradient
 * accumulation over micro-batches is free; callers zero what must start at
 * zero. Matrix products go through OpenBLAS (cblas_sgemm); the rest is
 * OpenMP, with every output element written by exactly one thread and every
 * reduction in a fixed order, so results are deterministic for a fixed
 * thread count. Buffers never alias unless a comment says so. */
#ifndef TAH_LAYERS_H
#define TAH_LAYERS_H

#include <stddef.h>

#define LAYERS_LN_EPS 1e-5f

/* out[b,t,:] = wte[inp[b,t],:] + wpe[t,:] */
void encoder_forward(float *out /* (B,T,C) */, const int *inp /* (B,T) */,
                     const float *wte /* (Vp,C) */, const float *wpe /* (maxT,C) */,
                     int B, int T, int C);
void encoder_backward(float *dwte /* (Vp,C) */, float *dwpe /* (maxT,C) */,
                      const float *dout /* (B,T,C) */, const int *inp /* (B,T) */,
                      int B, int T, int C);

void layernorm_forward(float *out /* (N,C) */, float *mean /* (N) */, float *rstd /* (N) */,
                       const float *inp /* (N,C) */, const float *weight /* (C) */,
                       const float *bias /* (C) */, int N, int C);
void layernorm_backward(float *dinp /* (N,C) += */, float *dweight /* (C) += */,
                        float *dbias /* (C) += */, const float *dout /* (N,C) */,
                        const float *inp /* (N,C) */, const float *weight /* (C) */,
                        const float *mean /* (N) */, const float *rstd /* (N) */, int N, int C);
/* The two halves of layernorm_backward, for splitting it across
 * tensor-parallel ranks with the same bits: the input gradient row by row
 * (any block of rows: offset the pointers), and the weight/bias gradients
 * of channels [c0, c1) (each channel sums its N rows in order). */
void layernorm_backward_input(float *dinp /* (N,C) += */, const float *dout /* (N,C) */,
                              const float *inp /* (N,C) */, const float *weight /* (C) */,
                              const float *mean /* (N) */, const float *rstd /* (N) */, int N, int C);
void layernorm_backward_params(float *dweight /* (C) += */, float *dbias /* (C) += */,
                               const float *dout /* (N,C) */, const float *inp /* (N,C) */,
                               const float *mean /* (N) */, const float *rstd /* (N) */, int N, int C,
                               int c0, int c1);

/* out = inp @ weight^T + bias (bias may be NULL) */
void matmul_forward(float *out /* (N,OC) */, const float *inp /* (N,C) */,
                    const float *weight /* (OC,C) */, const float *bias /* (OC) or NULL */,
                    int N, int C, int OC);
/* dinp += dout @ weight (dinp may be NULL), dweight += dout^T @ inp,
 * dbias += column sums of dout (dbias may be NULL) */
void matmul_backward(float *dinp /* (N,C) */, float *dweight /* (OC,C) */,
                     float *dbias /* (OC) */, const float *dout /* (N,OC) */,
                     const float *inp /* (N,C) */, const float *weight /* (OC,C) */,
                     int N, int C, int OC);
/* The same on blocks of larger row-major matrices: ld* is the row stride
 * (elements) of each matrix, >= its width (tensor-parallel shards: a block
 * of weight rows is a pointer offset, a block of columns a pointer offset
 * plus the full row stride). */
void matmul_forward_strided(float *out /* (N,OC) ld ldo */, int ldo,
                            const float *inp /* (N,C) ld ldi */, int ldi,
                            const float *weight /* (OC,C) ld ldw */, int ldw,
                            const float *bias /* (OC) or NULL */, int N, int C, int OC);
void matmul_backward_strided(float *dinp /* (N,C) ld lddi, or NULL */, int lddi,
                             float *dweight /* (OC,C) ld lddw */, int lddw,
                             float *dbias /* (OC) or NULL */,
                             const float *dout /* (N,OC) ld lddo */, int lddo,
                             const float *inp /* (N,C) ld ldi */, int ldi,
                             const float *weight /* (OC,C) ld ldw */, int ldw, int N, int C, int OC);
/* dbias += column sums of dout: the bias gradient of matmul_backward alone,
 * with the same bits (each column sums its N rows in order). */
void bias_backward(float *dbias /* (OC) += */, const float *dout /* (N,OC) ld ld */, int ld, int N,
                   int OC);

/* Causal multi-head self-attention. qkv rows are [q | k | v], each C wide,
 * head h owning channels h*hs..(h+1)*hs-1. att keeps the softmax
 * probabilities (zero above the diagonal) for backward. */
void attention_forward(float *out /* (B,T,C) */, float *att /* (B,NH,T,T) */,
                       const float *qkv /* (B,T,3C) */, int B, int T, int C, int NH);
/* dqkv += ...; scratch holds T*T floats per OpenMP thread
 * (attention_scratch_floats). */
void attention_backward(float *dqkv /* (B,T,3C) */, float *scratch,
                        const float *dout /* (B,T,C) */, const float *att /* (B,NH,T,T) */,
                        const float *qkv /* (B,T,3C) */, int B, int T, int C, int NH);
size_t attention_scratch_floats(int T);

/* GELU, tanh approximation. gelu_backward: dinp = gelu'(inp) * dout
 * (overwrites; dinp may alias dout). */
void gelu_forward(float *out /* (N) */, const float *inp /* (N) */, size_t N);
void gelu_backward(float *dinp /* (N) */, const float *inp /* (N) */, const float *dout /* (N) */,
                   size_t N);

/* out = a + b (out may alias a) */
void residual_forward(float *out /* (N) */, const float *a /* (N) */, const float *b /* (N) */,
                      size_t N);

/* In place: logits -> probabilities (softmax over the first V of Vp entries,
 * padding set to 0); losses[i] = -log p[targets[i]]. */
void softmax_crossentropy_forward(float *probs_inout /* (N,Vp) */, float *losses /* (N) */,
                                  const int *targets /* (N) */, int N, int V, int Vp);
/* In place: probabilities -> dlogits = (p - onehot(target)) * dloss. */
void softmax_crossentropy_backward(float *probs_inout /* (N,Vp) */, const int *targets /* (N) */,
                                   float dloss, int N, int V, int Vp);

/* Number of OpenMP threads the layers use (1 without OpenMP). */
int layers_max_threads(void);
/* Set OpenMP and OpenBLAS thread counts (n >= 1). */
void layers_set_threads(int n);

#endif
