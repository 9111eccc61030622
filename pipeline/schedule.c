/* schedule.c — GPipe and 1F1B action lists (see schedule.h). */
#include "schedule.h"

#include <string.h>

#include "errors.h"

int sched_parse(const char *name, sched_kind_t *kind)
{
    if (strcmp(name, "gpipe") == 0)
        *kind = SCHED_GPIPE;
    else if (strcmp(name, "1f1b") == 0)
        *kind = SCHED_1F1B;
    else
        return TAH_EINVAL;
    return 0;
}

const char *sched_name(sched_kind_t kind)
{
    return kind == SCHED_GPIPE ? "gpipe" : kind == SCHED_1F1B ? "1f1b" : "?";
}

int sched_build(sched_kind_t kind, int S, int M, int k, sched_action_t *out)
{
    if (S < 1 || M < 1 || k < 0 || k >= S)
        return TAH_EINVAL;
    int n = 0;
    if (kind == SCHED_GPIPE) {
        for (int m = 0; m < M; m++)
            out[n++] = (sched_action_t){ SCHED_F, m };
        for (int m = 0; m < M; m++)
            out[n++] = (sched_action_t){ SCHED_B, m };
        return 0;
    }
    if (kind != SCHED_1F1B)
        return TAH_EINVAL;
    int warm = S - 1 - k;
    if (warm > M)
        warm = M;
    int f = 0, b = 0;
    while (f < warm)
        out[n++] = (sched_action_t){ SCHED_F, f++ };
    while (f < M) {
        out[n++] = (sched_action_t){ SCHED_F, f++ };
        out[n++] = (sched_action_t){ SCHED_B, b++ };
    }
    while (b < M)
        out[n++] = (sched_action_t){ SCHED_B, b++ };
    return 0;
}

int sched_max_inflight(sched_kind_t kind, int S, int M, int k)
{
    if (kind == SCHED_GPIPE)
        return M;
    int w = S - k;
    return w < M ? w : M;
}
