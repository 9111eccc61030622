/* half.h — IEEE binary16 (fp16) and bfloat16 conversions in portable C.
 *
 * half_from_f32 / bf16_from_f32 round to nearest, ties to even; values past
 * the format's range become +-Inf, NaN stays NaN. The _down/_up variants
 * round toward -Inf / +Inf (used for quantisation metadata that must
 * bracket the data). The _n bulk forms use F16C when the compiler targets it;
 * results are identical to the scalar forms. */
#ifndef TAH_HALF_H
#define TAH_HALF_H

#include <stddef.h>
#include <stdint.h>

#define HALF_MAX 65504.0f

uint16_t half_from_f32(float f);
uint16_t half_from_f32_down(float f);
uint16_t half_from_f32_up(float f);
float half_to_f32(uint16_t h);
void half_from_f32_n(uint16_t *dst, const float *src, size_t n);
void half_to_f32_n(float *dst, const uint16_t *src, size_t n);

uint16_t bf16_from_f32(float f);
float bf16_to_f32(uint16_t h);

#endif
