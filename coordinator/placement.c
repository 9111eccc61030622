/* placement.c — speed-balanced contiguous layer split (see placement.h). */
#include "placement.h"

#include <math.h>
#include <string.h>

#include "errors.h"

void placement_speeds(int S, const double *gflops, const double *gflops_bf16, const char *const *device_id, int bf16,
                      double *speed)
{
    double own[S > 0 ? S : 1];
    for (int k = 0; k < S; k++)
        own[k] = bf16 && gflops_bf16[k] > 0.0 ? gflops_bf16[k] : gflops[k];
    for (int k = 0; k < S; k++) {
        double best = own[k];
        int n = 1;
        if (device_id[k] && device_id[k][0])
            for (int i = 0; i < S; i++)
                if (i != k && device_id[i] && !strcmp(device_id[i], device_id[k])) {
                    n++;
                    best = own[i] > best ? own[i] : best;
                }
        speed[k] = best / n;
    }
}

/* Weights 2^(q/2) * 2^16 for q half octaves below the fastest (q >= -32:
 * at least 1), so the split below stays in integers. */
int placement_split(int L, int S, const double *speed, int *layer0, int *layer1)
{
    if (S < 1 || S > L)
        return TAH_EINVAL;
    double maxs = 0.0;
    for (int k = 0; k < S; k++)
        if (isfinite(speed[k]) && speed[k] > maxs)
            maxs = speed[k];
    long long w[S], total = 0;
    for (int k = 0; k < S; k++) {
        long long q = 0;
        if (maxs > 0.0 && isfinite(speed[k]) && speed[k] > 0.0)
            q = llround(2.0 * log2(speed[k] / maxs));
        q = q < -32 ? -32 : q;
        w[k] = llround(ldexp(exp2((double)q / 2.0), 16));
        w[k] = w[k] < 1 ? 1 : w[k];
        total += w[k];
    }
    int b[S + 1];
    long long cum = 0;
    for (int k = 0; k <= S; k++) {
        b[k] = (int)((long long)L * cum / total);
        if (k < S)
            cum += w[k];
    }
    b[S] = L;
    for (int k = 1; k < S; k++) /* at least one layer each, from the front ... */
        if (b[k] < b[k - 1] + 1)
            b[k] = b[k - 1] + 1;
    for (int k = S - 1; k >= 1; k--) /* ... and from the back */
        if (b[k] > b[k + 1] - 1)
            b[k] = b[k + 1] - 1;
    for (int k = 0; k < S; k++) {
        layer0[k] = b[k];
        layer1[k] = b[k + 1];
    }
    return 0;
}
