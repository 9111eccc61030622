// cu_speed.cu — the speed a GPU node announces (cu_stage_bench, cu_stage.h): node/bench.c's
// sgemm for the GPU, through cuBLASLt as the stage runs its matrix products.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "cu_stage.h"
extern "C" {
#include "errors.h" // TAH_EDEVICE, TAH_EINVAL
}

// GPT-2's MLP product for 4096 tokens: (4096 x 768) @ (768 x 3072), 19.3 GFLOP
enum { S_M = 3072, S_N = 4096, S_K = 768, S_REPS = 8, S_ROUNDS = 4 };
static const size_t S_WS = 32u << 20; // cuBLASLt workspace

static int s_fail(char *err, size_t errlen, const char *what, const char *why, int dev)
{
    snprintf(err, errlen, "GPU speed test on cuda:%d: %s: %s", dev, what, why);
    return TAH_EDEVICE;
}
#define S_CU(call, what)                                                                                          \
    do {                                                                                                          \
        cudaError_t e_ = (call);                                                                                  \
        if (e_ != cudaSuccess) {                                                                                  \
            rc = s_fail(err, errlen, what, cudaGetErrorString(e_), dev);                                          \
            goto out;                                                                                             \
        }                                                                                                         \
    } while (0)
#define S_LT(call, what)                                                                                          \
    do {                                                                                                          \
        cublasStatus_t e_ = (call);                                                                               \
        if (e_ != CUBLAS_STATUS_SUCCESS) {                                                                        \
            rc = s_fail(err, errlen, what, cublasLtGetStatusString(e_), dev);                                     \
            goto out;                                                                                             \
        }                                                                                                         \
    } while (0)

// GFLOP/s of S_M x S_N x S_K in type dt (fp32 accumulation, CUBLAS_COMPUTE_32F: no TF32, as the
// fp32 stage) on the current device: the best of S_ROUNDS timings of S_REPS products each.
static int s_gemm_speed(int dev, cudaDataType_t dt, size_t esz, double *gflops, char *err, size_t errlen)
{
    int rc = 0;
    void *a = NULL, *b = NULL, *d = NULL, *ws = NULL;
    cudaStream_t st = NULL;
    cudaEvent_t ev[2] = { NULL, NULL };
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    const float alpha = 1.0f, beta = 0.0f;
    const cublasOperation_t tr = CUBLAS_OP_T;
    float best = 0.0f;
    S_CU(cudaMalloc(&a, (size_t)S_M * S_K * esz), "cudaMalloc");
    S_CU(cudaMalloc(&b, (size_t)S_K * S_N * esz), "cudaMalloc");
    S_CU(cudaMalloc(&d, (size_t)S_M * S_N * esz), "cudaMalloc");
    S_CU(cudaMalloc(&ws, S_WS), "cudaMalloc");
    S_CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    S_CU(cudaMemsetAsync(a, 0x3c, (size_t)S_M * S_K * esz, st), "cudaMemset"); // 0.0115 in fp32 and bf16
    S_CU(cudaMemsetAsync(b, 0x3c, (size_t)S_K * S_N * esz, st), "cudaMemset");
    S_CU(cudaEventCreate(&ev[0]), "cudaEventCreate");
    S_CU(cudaEventCreate(&ev[1]), "cudaEventCreate");
    S_LT(cublasLtCreate(&lt), "cublasLtCreate");
    S_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    S_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr), "transa");
    // column-major: D (M x N) = A^T (A: K x M) B (K x N), the stage's matmul_forward
    S_LT(cublasLtMatrixLayoutCreate(&la, dt, S_K, S_M, S_K), "layout");
    S_LT(cublasLtMatrixLayoutCreate(&lb, dt, S_K, S_N, S_K), "layout");
    S_LT(cublasLtMatrixLayoutCreate(&ld, dt, S_M, S_N, S_M), "layout");
    S_LT(cublasLtMatmulPreferenceCreate(&pref), "preference");
    S_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &S_WS, sizeof S_WS),
         "preference");
    S_LT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &res, &found), "heuristic");
    if (found < 1) {
        rc = s_fail(err, errlen, "cublasLtMatmulAlgoGetHeuristic", "no algorithm", dev);
        goto out;
    }
    for (int r = 0; r <= S_ROUNDS; r++) { // round 0 warms up
        S_CU(cudaEventRecord(ev[0], st), "cudaEventRecord");
        for (int i = 0; i < S_REPS; i++)
            S_LT(cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &res.algo, ws, S_WS, st),
                 "cublasLtMatmul");
        S_CU(cudaEventRecord(ev[1], st), "cudaEventRecord");
        S_CU(cudaEventSynchronize(ev[1]), "cudaEventSynchronize");
        float ms = 0.0f;
        S_CU(cudaEventElapsedTime(&ms, ev[0], ev[1]), "cudaEventElapsedTime");
        if (r > 0 && ms > 0.0f && (best == 0.0f || ms < best))
            best = ms;
    }
    *gflops = best > 0.0f ? 2.0 * S_M * S_N * S_K * S_REPS / (best * 1e-3) / 1e9 : 0.0;
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (ld)
        cublasLtMatrixLayoutDestroy(ld);
    if (op)
        cublasLtMatmulDescDestroy(op);
    if (lt)
        cublasLtDestroy(lt);
    for (int i = 0; i < 2; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    if (st)
        cudaStreamDestroy(st);
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
    cudaFree(ws);
    return rc;
}

extern "C" int cu_stage_bench(const int *devices, int n, double *gflops_f32, double *gflops_bf16, char *id,
                              size_t idlen, char *err, size_t errlen)
{
    if (!devices || n < 1 || !gflops_f32 || !gflops_bf16 || !id || idlen == 0) {
        snprintf(err, errlen, "cu_stage_bench: bad arguments");
        return TAH_EINVAL;
    }
    *gflops_f32 = *gflops_bf16 = 0.0;
    id[0] = 0;
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        const int dev = devices[i];
        cudaDeviceProp prop;
        cudaError_t e = cudaSetDevice(dev);
        if (e == cudaSuccess)
            e = cudaGetDeviceProperties(&prop, dev);
        if (e != cudaSuccess)
            return s_fail(err, errlen, "cudaSetDevice", cudaGetErrorString(e), dev);
        double f = 0.0, h = 0.0;
        int rc = s_gemm_speed(dev, CUDA_R_32F, 4, &f, err, errlen);
        if (rc == 0)
            rc = s_gemm_speed(dev, CUDA_R_16BF, 2, &h, err, errlen);
        if (rc != 0)
            return rc;
        *gflops_f32 += f;
        *gflops_bf16 += h;
        char u[40];
        int k = snprintf(u, sizeof u, "%s", i ? "," : "");
        for (int j = 0; j < 16; j++)
            k += snprintf(u + k, sizeof u - (size_t)k, "%02x", (unsigned char)prop.uuid.bytes[j]);
        if (used + (size_t)k >= idlen) {
            snprintf(err, errlen, "cu_stage_bench: device id buffer of %zu bytes is too small", idlen);
            return TAH_EINVAL;
        }
        memcpy(id + used, u, (size_t)k + 1);
        used += (size_t)k;
    }
    return 0;
}
