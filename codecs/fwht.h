/* fwht.h — the project's one fast Walsh–Hadamard transform.
 *
 * fwht_f32(x, n) replaces x (n floats, n a power of two >= 1) by H_n x / sqrt(n),
 * the orthonormal (and self-inverse) transform: applying it twice returns x
 * up to rounding. Butterflies in natural (Sylvester) order, in place. */
#ifndef TAH_FWHT_H
#define TAH_FWHT_H

#include <stddef.h>

void fwht_f32(float *x, size_t n);

#endif
