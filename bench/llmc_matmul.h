/* llmc_matmul.h — stand-ins for llm.c's CPU matmul kernels, to estimate how
 * fast llm.c's train_gpt2.c runs on this machine without fetching it. Written
 * from the description of llm.c's kernels (a plain OpenMP loop nest, and its
 * 8-row register-tiled variant), compiled with llm.c's flags (-Ofast). */
#ifndef TAH_LLMC_MATMUL_H
#define TAH_LLMC_MATMUL_H

/* out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias: one dot product per output. */
void llmc_matmul_naive(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC);
/* the same, 8 rows of inp per weight row loaded (N % 8 == 0). */
void llmc_matmul_tiled(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC);

/* llm.c's backward: dinp += dout W, one (b,t) row per thread, axpy over the
 * weight rows; then dweight += dout^T inp, dbias += sum dout, one output
 * channel per thread. */
void llmc_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC);

#endif
