/* fwht.c — in-place orthonormal Walsh–Hadamard transform.
 *
 * n >= 8: each run of 8 elements gets its three butterfly stages (h = 1, 2, 4)
 * in registers (vector shuffles; multiplying by +-1 is exact, so the result
 * is bit-identical to the scalar butterflies), then the stages h >= 8 pair
 * x[j] with x[j+h] across contiguous j, which the compiler vectorises.
 * n < 8 takes the plain scalar butterflies. */
#include "fwht.h"

#include <math.h>
#include <string.h>

typedef float s_v8 __attribute__((vector_size(32)));

static void s_fwht8_runs(float *x, size_t n)
{
    const s_v8 sg1 = { 1, -1, 1, -1, 1, -1, 1, -1 };
    const s_v8 sg2 = { 1, 1, -1, -1, 1, 1, -1, -1 };
    const s_v8 sg4 = { 1, 1, 1, 1, -1, -1, -1, -1 };
    for (size_t i = 0; i < n; i += 8) {
        s_v8 v;
        memcpy(&v, x + i, sizeof v);
        v = __builtin_shufflevector(v, v, 0, 0, 2, 2, 4, 4, 6, 6) +
            __builtin_shufflevector(v, v, 1, 1, 3, 3, 5, 5, 7, 7) * sg1;
        v = __builtin_shufflevector(v, v, 0, 1, 0, 1, 4, 5, 4, 5) +
            __builtin_shufflevector(v, v, 2, 3, 2, 3, 6, 7, 6, 7) * sg2;
        v = __builtin_shufflevector(v, v, 0, 1, 2, 3, 0, 1, 2, 3) +
            __builtin_shufflevector(v, v, 4, 5, 6, 7, 4, 5, 6, 7) * sg4;
        memcpy(x + i, &v, sizeof v);
    }
}

void fwht_f32(float *x, size_t n)
{
    size_t h = 1;
    if (n >= 8) {
        s_fwht8_runs(x, n);
        h = 8;
    }
    for (; h < n; h *= 2) {
        for (size_t i = 0; i < n; i += 2 * h) {
            float *a = x + i, *b = x + i + h;
            for (size_t j = 0; j < h; j++) {
                float u = a[j], v = b[j];
                a[j] = u + v;
                b[j] = u - v;
            }
        }
    }
    /* 1/sqrt(n): exact for n a power of four, else rounded once */
    float norm = (float)(1.0 / sqrt((double)n));
    for (size_t i = 0; i < n; i++)
        x[i] *= norm;
}
