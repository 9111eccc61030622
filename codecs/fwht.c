/* fwht.c — in-place orthonormal Walsh–Hadamard transform.
 * Stage h pairs x[j] with x[j+h]; the inner loops run over contiguous j so
 * the compiler vectorises every stage with h >= 8. */
#include "fwht.h"

#include <math.h>

void fwht_f32(float *x, size_t n)
{
    for (size_t h = 1; h < n; h *= 2) {
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
