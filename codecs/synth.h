/* synth.h — reproducible activation-like test tensors for benchmarks, demos
 * and tests of the codecs.
 *
 * codec_synth_activations fills x (B,S,C) with what transformer boundary
 * activations look like: every channel c has its own scale
 * sigma_c = exp(0.6 N(0,1)) (a 20x spread across channels) and mean
 * mu_c = 0.3 * sigma_c * N(0,1); a few channels (one in each block of 256,
 * at least one) are outlier channels 20-60x larger, spread out as in GPT-2's
 * residual stream; values
 * are mu_c + sigma_c * N(0,1). Same seed, same tensor, on every machine. */
#ifndef TAH_SYNTH_H
#define TAH_SYNTH_H

#include <stdint.h>

#include "codec.h" /* codec_shape_t */

int codec_synth_activations(float *x, codec_shape_t shape, uint64_t seed);

/* Counter-based generator shared by the synthesiser and tests:
 * splitmix64 of (seed, index). */
uint64_t codec_synth_u64(uint64_t seed, uint64_t index);
/* Standard normal from (seed, index), Box-Muller in double. */
double codec_synth_normal(uint64_t seed, uint64_t index);

#endif
