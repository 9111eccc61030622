/* llmc_matmul.c — see llmc_matmul.h. Built with -Ofast like llm.c. */
#include "llmc_matmul.h"

void llmc_matmul_naive(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            float v = bias ? bias[o] : 0.0f;
            const float *x = inp + (long)n * C, *w = weight + (long)o * C;
            for (int i = 0; i < C; i++)
                v += x[i] * w[i];
            out[(long)n * OC + o] = v;
        }
    }
}

#define TILE 8
void llmc_matmul_tiled(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC)
{
#pragma omp parallel for schedule(static)
    for (int n0 = 0; n0 < N; n0 += TILE) {
        for (int o = 0; o < OC; o++) {
            float acc[TILE];
            for (int k = 0; k < TILE; k++)
                acc[k] = bias ? bias[o] : 0.0f;
            for (int i = 0; i < C; i++) {
                float w = weight[i + (long)o * C];
                for (int k = 0; k < TILE; k++)
                    acc[k] += inp[(long)(n0 + k) * C + i] * w;
            }
            for (int k = 0; k < TILE; k++)
                out[(long)(n0 + k) * OC + o] = acc[k];
        }
    }
}

void llmc_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *d = dout + (long)n * OC;
        float *dx = dinp + (long)n * C;
        for (int o = 0; o < OC; o++) {
            const float *w = weight + (long)o * C;
            float g = d[o];
            for (int i = 0; i < C; i++)
                dx[i] += w[i] * g;
        }
    }
#pragma omp parallel for schedule(static)
    for (int o = 0; o < OC; o++) {
        float *dw = dweight + (long)o * C;
        for (int n = 0; n < N; n++) {
            const float *x = inp + (long)n * C;
            float g = dout[(long)n * OC + o];
            if (dbias)
                dbias[o] += g;
            for (int i = 0; i < C; i++)
                dw[i] += x[i] * g;
        }
    }
}
