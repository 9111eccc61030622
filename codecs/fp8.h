/* fp8.h — FP8 E4M3 and E5M2 conversions in portable C.
 *
 * E4M3 is the OCP / NVIDIA "e4m3fn" format: 1 sign, 4 exponent bits (bias 7),
 * 3 mantissa bits, no infinities; S.1111.111 (0x7f, 0xff) is NaN; largest
 * finite 448 (0x7e), smallest normal 2^-6, subnormal step 2^-9.
 * E5M2 is IEEE-like: 1 sign, 5 exponent bits (bias 15), 2 mantissa bits,
 * +-Inf 0x7c/0xfc, NaN 0x7d..0x7f (and with sign); largest finite 57344,
 * smallest normal 2^-14, subnormal step 2^-16.
 *
 * Encoders round to nearest, ties to even, with subnormals handled exactly,
 * and SATURATE: a finite value beyond the largest finite code becomes that
 * code (+-448 / +-57344). NaN becomes NaN (0x7f / 0x7e with the input's
 * sign). +-Inf becomes +-448 in E4M3 (it has no infinity; OCP "saturating"
 * conversion) and stays +-Inf in E5M2. -0 keeps its sign.
 * Decoders are exact (every code is a float32 value).
 *
 * The bulk _n forms give results identical to the scalar forms and are
 * written so the compiler vectorises them (the E4M3 encoder is on the hot
 * path of ASH-FP8). fp8_e4m3_from_f32_scaled_n encodes src[i]*scale, the
 * product rounded to float first; fp8_e4m3_to_f32_scaled_n writes
 * decode(src[i]) * scale. */
#ifndef TAH_FP8_H
#define TAH_FP8_H

#include <stddef.h>
#include <stdint.h>

#define FP8_E4M3_MAX 448.0f
#define FP8_E5M2_MAX 57344.0f

uint8_t fp8_e4m3_from_f32(float f);
float fp8_e4m3_to_f32(uint8_t c);
void fp8_e4m3_from_f32_n(uint8_t *dst, const float *src, size_t n);
void fp8_e4m3_from_f32_scaled_n(uint8_t *dst, const float *src, float scale, size_t n);
void fp8_e4m3_to_f32_n(float *dst, const uint8_t *src, size_t n);
void fp8_e4m3_to_f32_scaled_n(float *dst, const uint8_t *src, float scale, size_t n);

uint8_t fp8_e5m2_from_f32(float f);
float fp8_e5m2_to_f32(uint8_t c);

#endif
