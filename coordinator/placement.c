/* placement.c — speed-balanced contiguous layer split (see placement.h). */
#include "placement.h"

#include <math.h>
#include <stdlib.h>

#include "errors.h"

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
        long long q = 4;
        if (maxs > 0.0 && isfinite(speed[k]) && speed[k] > 0.0)
            q = llround(4.0 * speed[k] / maxs);
        w[k] = q < 1 ? 1 : q;
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
