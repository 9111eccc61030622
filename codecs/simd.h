/* simd.h — 8-lane float/int vectors through the GCC/Clang vector extension
 * (portable across architectures; no intrinsics). Loads and stores go
 * through memcpy so any alignment is fine. Lane-wise min/max/select keep
 * exact IEEE semantics for the finite values the codecs handle, so a
 * vectorised reduction equals the scalar one. */
#ifndef TAH_SIMD_H
#define TAH_SIMD_H

#include <stdint.h>
#include <string.h>

typedef float simd_f8 __attribute__((vector_size(32)));
typedef int32_t simd_i8 __attribute__((vector_size(32)));

static inline simd_f8 simd_load(const float *p) { simd_f8 v; memcpy(&v, p, sizeof v); return v; }
static inline void simd_store(float *p, simd_f8 v) { memcpy(p, &v, sizeof v); }
static inline simd_f8 simd_splat(float f) { return (simd_f8){ f, f, f, f, f, f, f, f }; }
/* m lanes are all-ones (true) or zero, as vector comparisons produce */
static inline simd_f8 simd_sel(simd_i8 m, simd_f8 a, simd_f8 b) { return (simd_f8)((m & (simd_i8)a) | (~m & (simd_i8)b)); }
static inline simd_i8 simd_sel_i(simd_i8 m, simd_i8 a, simd_i8 b) { return (m & a) | (~m & b); }
static inline simd_f8 simd_min(simd_f8 a, simd_f8 b) { return simd_sel(a < b, a, b); }
static inline simd_f8 simd_max(simd_f8 a, simd_f8 b) { return simd_sel(a > b, a, b); }
static inline simd_f8 simd_abs(simd_f8 a) { return (simd_f8)((simd_i8)a & 0x7fffffff); }
static inline float simd_hmin(simd_f8 v)
{
    float m = v[0];
    for (int j = 1; j < 8; j++) m = v[j] < m ? v[j] : m;
    return m;
}
static inline float simd_hmax(simd_f8 v)
{
    float m = v[0];
    for (int j = 1; j < 8; j++) m = v[j] > m ? v[j] : m;
    return m;
}

#endif
