/* layers.c — GPT-2 layers on the CPU: cblas_sgemm for matrix products,
 * OpenMP loops for the rest. See layers.h for the conventions. */
/* OpenBLAS's cblas.h declares openblas_setaffinity(.., cpu_set_t *), which
 * glibc only defines under _GNU_SOURCE; this file uses nothing else of it. */
#define _GNU_SOURCE
#include "layers.h"

#include <cblas.h> /* cblas_sgemm */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define S_CBLOCK 64 /* channels per thread in column reductions */

int layers_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

void layers_set_threads(int n)
{
    if (n < 1)
        n = 1;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    /* no openblas_set_num_threads: the OpenMP build of OpenBLAS shares our
     * OpenMP threads (its call would reset omp_set_num_threads) and runs
     * single-threaded inside our parallel regions */
}

static int s_thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T,
                     int C)
{
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *we = wte + (size_t)inp[b * T + t] * C;
            const float *pe = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++)
                o[i] = we[i] + pe[i];
        }
    }
}

void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                      int C)
{
    /* each thread owns a block of channels: the scatter into dwte never races */
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += S_CBLOCK) {
        int c1 = c0 + S_CBLOCK < C ? c0 + S_CBLOCK : C;
        for (int bt = 0; bt < B * T; bt++) {
            float *dw = dwte + (size_t)inp[bt] * C;
            const float *d = dout + (size_t)bt * C;
            for (int i = c0; i < c1; i++)
                dw[i] += d[i];
        }
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *dp = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            for (int i = 0; i < C; i++)
                dp[i] += d[i];
        }
    }
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int i = 0; i < C; i++)
            m += x[i];
        m /= (float)C;
        float v = 0.0f;
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            v += d * d;
        }
        v /= (float)C;
        float s = 1.0f / sqrtf(v + LAYERS_LN_EPS);
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++)
            o[i] = s * (x[i] - m) * weight[i] + bias[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void layernorm_backward_input(float *dinp, const float *dout, const float *inp, const float *weight,
                              const float *mean, const float *rstd, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * C;
        const float *x = inp + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            float dnorm = weight[i] * d[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= (float)C;
        dnorm_norm_mean /= (float)C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            float dnorm = weight[i] * d[i];
            dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
}

void layernorm_backward_params(float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *mean, const float *rstd, int N, int C, int c0, int c1)
{
#pragma omp parallel for schedule(static)
    for (int b0 = c0; b0 < c1; b0 += S_CBLOCK) {
        int b1 = b0 + S_CBLOCK < c1 ? b0 + S_CBLOCK : c1;
        float dw[S_CBLOCK], db[S_CBLOCK];
        memset(dw, 0, sizeof dw);
        memset(db, 0, sizeof db);
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C;
            const float *x = inp + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            for (int i = b0; i < b1; i++) {
                dw[i - b0] += d[i] * ((x[i] - m) * s);
                db[i - b0] += d[i];
            }
        }
        for (int i = b0; i < b1; i++) {
            dweight[i] += dw[i - b0];
            dbias[i] += db[i - b0];
        }
    }
}

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const float *mean, const float *rstd,
                        int N, int C)
{
    layernorm_backward_input(dinp, dout, inp, weight, mean, rstd, N, C);
    layernorm_backward_params(dweight, dbias, dout, inp, mean, rstd, N, C, 0, C);
}

/* Matrix products: OpenBLAS runs single-threaded inside our OpenMP threads,
 * each thread owning a block of output rows. One thread pool instead of two
 * (OpenBLAS's pthreads spinning against OpenMP's made steps 10x slower on 2
 * cores), and each output element is computed by one fixed thread. */
static void s_rows(int n, int *lo, int *hi)
{
#ifdef _OPENMP
    int nt = omp_get_num_threads(), id = omp_get_thread_num();
#else
    int nt = 1, id = 0;
#endif
    int per = (n + nt - 1) / nt;
    per = (per + 7) / 8 * 8;
    *lo = id * per < n ? id * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

void matmul_forward_strided(float *out, int ldo, const float *inp, int ldi, const float *weight,
                            int ldw, const float *bias, int N, int C, int OC)
{
#pragma omp parallel
    {
        int lo, hi;
        s_rows(N, &lo, &hi);
        if (hi > lo) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, hi - lo, OC, C, 1.0f,
                        inp + (size_t)lo * ldi, ldi, weight, ldw, 0.0f, out + (size_t)lo * ldo, ldo);
            if (bias) {
                for (int n = lo; n < hi; n++) {
                    float *o = out + (size_t)n * ldo;
                    for (int j = 0; j < OC; j++)
                        o[j] += bias[j];
                }
            }
        }
    }
}

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                    int C, int OC)
{
    matmul_forward_strided(out, OC, inp, C, weight, C, bias, N, C, OC);
}

/* dbias[j] += sum over n of d[n*ld + j], j in [j0, j1): one float
 * accumulator per column, rows in order (the same bits for any split of
 * the columns) */
static void s_bias_cols(float *dbias, const float *dout, int ld, int N, int j0, int j1)
{
    for (int b0 = j0; b0 < j1; b0 += S_CBLOCK) {
        int b1 = b0 + S_CBLOCK < j1 ? b0 + S_CBLOCK : j1;
        float acc[S_CBLOCK];
        memset(acc, 0, sizeof acc);
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * ld;
            for (int j = b0; j < b1; j++)
                acc[j - b0] += d[j];
        }
        for (int j = b0; j < b1; j++)
            dbias[j] += acc[j - b0];
    }
}

void matmul_backward_strided(float *dinp, int lddi, float *dweight, int lddw, float *dbias,
                             const float *dout, int lddo, const float *inp, int ldi,
                             const float *weight, int ldw, int N, int C, int OC)
{
#pragma omp parallel
    {
        int lo, hi;
        if (dinp) {
            s_rows(N, &lo, &hi);
            if (hi > lo)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, hi - lo, C, OC, 1.0f,
                            dout + (size_t)lo * lddo, lddo, weight, ldw, 1.0f,
                            dinp + (size_t)lo * lddi, lddi);
        }
        s_rows(OC, &lo, &hi);
        if (hi > lo) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hi - lo, C, N, 1.0f, dout + lo, lddo,
                        inp, ldi, 1.0f, dweight + (size_t)lo * lddw, lddw);
            if (dbias)
                s_bias_cols(dbias, dout, lddo, N, lo, hi);
        }
    }
}

void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, int N, int C, int OC)
{
    matmul_backward_strided(dinp, C, dweight, C, dbias, dout, OC, inp, C, weight, C, N, C, OC);
}

void bias_backward(float *dbias, const float *dout, int ld, int N, int OC)
{
#pragma omp parallel for schedule(static)
    for (int j0 = 0; j0 < OC; j0 += S_CBLOCK)
        s_bias_cols(dbias, dout, ld, N, j0, j0 + S_CBLOCK < OC ? j0 + S_CBLOCK : OC);
}

size_t attention_scratch_floats(int T)
{
    return (size_t)layers_max_threads() * (size_t)T * (size_t)T;
}

/* One (b,h) pair per OpenMP thread; the T x T score matrix and the
 * products with V run as single-threaded sgemm calls (q, k, v are strided
 * views into qkv, ld 3C). The upper triangle is computed and then masked.
 *
 *   thread (b,h):  S = scale * Q K^T  (T,T)  -> causal softmax in place (att)
 *                  out[:, h*hs..] = att V      (T,hs) */
void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    const int C3 = 3 * C, hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C, *v = q + 2 * C;
            float *A = att + ((size_t)b * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3,
                        0.0f, A, T);
            for (int t = 0; t < T; t++) {
                float *row = A + (size_t)t * T;
                float maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++)
                    if (row[t2] > maxv)
                        maxv = row[t2];
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    float e = expf(row[t2] - maxv);
                    row[t2] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++)
                    row[t2] *= inv;
                for (int t2 = t + 1; t2 < T; t2++)
                    row[t2] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, A, T, v, C3,
                        0.0f, out + (size_t)b * T * C + h * hs, C);
        }
    }
}

/*   thread (b,h):  D  = dout V^T                (T,T)   scratch
 *                  dV += att^T dout             (T,hs)
 *                  D  = att * (D - rowsum(att*D)) * scale   (softmax backward)
 *                  dQ += D K,  dK += D^T Q      (T,hs)
 * Each (b,h) owns its q, k, v columns of dqkv, so nothing races. */
void attention_backward(float *dqkv, float *scratch, const float *dout, const float *att,
                        const float *qkv, int B, int T, int C, int NH)
{
    const int C3 = 3 * C, hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float *D = scratch + (size_t)s_thread_id() * T * T;
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs;
            float *dk = dq + C, *dv = dq + 2 * C;
            const float *A = att + ((size_t)b * NH + h) * T * T;
            const float *d = dout + (size_t)b * T * C + h * hs;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, v, C3, 0.0f,
                        D, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, A, T, d, C, 1.0f,
                        dv, C3);
            for (int t = 0; t < T; t++) {
                const float *a = A + (size_t)t * T;
                float *row = D + (size_t)t * T;
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++)
                    sum += a[t2] * row[t2];
                for (int t2 = 0; t2 <= t; t2++)
                    row[t2] = a[t2] * (row[t2] - sum) * scale;
                for (int t2 = t + 1; t2 < T; t2++)
                    row[t2] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, D, T, k, C3, 1.0f,
                        dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, D, T, q, C3, 1.0f,
                        dk, C3);
        }
    }
}

#define S_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* tanh through one expf (much cheaper than tanhf): tanh|u| = (1-e)/(1+e),
 * e = exp(-2|u|), which never overflows. */
static inline float s_tanh(float u)
{
    float e = expf(-2.0f * fabsf(u));
    float t = (1.0f - e) / (1.0f + e);
    return u < 0.0f ? -t : t;
}

void gelu_forward(float *out, const float *inp, size_t N)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + s_tanh(S_GELU_SCALE * (x + cube)));
    }
}

void gelu_backward(float *dinp, const float *inp, const float *dout, size_t N)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        float th = s_tanh(S_GELU_SCALE * (x + cube));
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) + x * 0.5f * sech2 * S_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = local * dout[i];
    }
}

void residual_forward(float *out, const float *a, const float *b, size_t N)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++)
        out[i] = a[i] + b[i];
}

void softmax_crossentropy_forward(float *probs, float *losses, const int *targets, int N, int V,
                                  int Vp)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *p = probs + (size_t)n * Vp;
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++)
            if (p[i] > maxv)
                maxv = p[i];
        float sum = 0.0f;
        for (int i = 0; i < V; i++) {
            p[i] = expf(p[i] - maxv);
            sum += p[i];
        }
        float inv = 1.0f / sum;
        for (int i = 0; i < V; i++)
            p[i] *= inv;
        for (int i = V; i < Vp; i++)
            p[i] = 0.0f;
        losses[n] = -logf(p[targets[n]]);
    }
}

void softmax_crossentropy_backward(float *probs, const int *targets, float dloss, int N, int V,
                                   int Vp)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *p = probs + (size_t)n * Vp;
        int tg = targets[n];
        for (int i = 0; i < V; i++)
            p[i] = (p[i] - (i == tg ? 1.0f : 0.0f)) * dloss;
        for (int i = V; i < Vp; i++)
            p[i] = 0.0f;
    }
}
