/* synth.c — activation-like synthetic tensors. */
#include "synth.h"

#include <math.h>
#include <stdlib.h>

uint64_t codec_synth_u64(uint64_t seed, uint64_t index)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + index * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double codec_synth_normal(uint64_t seed, uint64_t index)
{
    /* two 53-bit uniforms in (0,1] and [0,1) */
    double u1 = ((double)(codec_synth_u64(seed, 2 * index) >> 11) + 1.0) * 0x1p-53;
    double u2 = (double)(codec_synth_u64(seed, 2 * index + 1) >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int codec_synth_activations(float *x, codec_shape_t shape, uint64_t seed)
{
    const uint32_t C = shape.c;
    float *mu = malloc((size_t)C * sizeof *mu), *sigma = malloc((size_t)C * sizeof *sigma);
    if (!mu || !sigma) {
        free(mu);
        free(sigma);
        return TAH_ENOMEM;
    }
    const uint64_t chan_seed = seed ^ 0xC4A77E1ull;
    for (uint32_t c = 0; c < C; c++) {
        double s = exp(0.6 * codec_synth_normal(chan_seed, 2ull * c));
        sigma[c] = (float)s;
        mu[c] = (float)(0.3 * s * codec_synth_normal(chan_seed ^ 1, c));
    }
    /* a few outlier channels, 20..60x larger: one at a random place in each
     * block of 256 channels (at least one), so they are spread out as in
     * GPT-2 (dims 138, 378, 447 of 768) */
    uint32_t n_out = C / 256 > 0 ? C / 256 : 1, span = C / n_out;
    for (uint32_t k = 0; k < n_out; k++) {
        uint32_t c = k * span + (uint32_t)(codec_synth_u64(chan_seed, 2ull * C + 2 * k) % span);
        double boost = 20.0 + 40.0 * (double)(codec_synth_u64(chan_seed, 2ull * C + 2 * k + 1) % 1000) / 1000.0;
        sigma[c] *= (float)boost;
        mu[c] *= (float)boost;
    }
    uint64_t n = (uint64_t)shape.b * shape.s * C;
    for (uint64_t i = 0; i < n; i++)
        x[i] = mu[i % C] + sigma[i % C] * (float)codec_synth_normal(seed, i);
    free(mu);
    free(sigma);
    return 0;
}
