/* guard.c — replay window and norm bound on admitted data messages (see guard.h). */
#include "guard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "errors.h"
#include "wire.h" /* TAH__DATA_KIND__*, wire_data_kind_name */

#define S_NKIND 9 /* DataKind values 0..8 */

typedef struct s_window {
    int step[2];       /* step held in each parity slot (0: none; steps are 1-based) */
    uint8_t *seen[2];  /* nmb flags per slot */
} s_window_t;

struct guard {
    int nmb;
    double ratio;
    s_window_t w[S_NKIND];
    double est[S_NKIND];
    int have_est[S_NKIND];
    uint8_t *mem;
};

guard_t *guard_new(int M, int val_batches, double max_norm_ratio)
{
    guard_t *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->nmb = M > val_batches ? M : val_batches;
    if (g->nmb < 1)
        g->nmb = 1;
    g->ratio = max_norm_ratio;
    g->mem = calloc((size_t)S_NKIND * 2, (size_t)g->nmb);
    if (!g->mem) {
        free(g);
        return NULL;
    }
    for (int k = 0; k < S_NKIND; k++)
        for (int p = 0; p < 2; p++)
            g->w[k].seen[p] = g->mem + ((size_t)k * 2 + (size_t)p) * (size_t)g->nmb;
    return g;
}

void guard_destroy(guard_t **g_p)
{
    if (!g_p || !*g_p)
        return;
    free((*g_p)->mem);
    free(*g_p);
    *g_p = NULL;
}

static int s_tensor_kind(uint32_t kind)
{
    return kind == TAH__DATA_KIND__DATA_ACT || kind == TAH__DATA_KIND__DATA_GRAD ||
           kind == TAH__DATA_KIND__DATA_EVAL || kind == TAH__DATA_KIND__DATA_TIED;
}

/* Sum of squares in double, eight running sums (one chain of dependent adds
 * made the check of a 4x1024x768 tensor take ~3 ms on the agent's thread,
 * in every pipeline hop's path) */
static double s_sumsq(const float *x, size_t n)
{
    double a[8] = { 0 };
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            a[k] += (double)x[i + k] * (double)x[i + k];
    for (; i < n; i++)
        a[0] += (double)x[i] * (double)x[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

static int s_admit(guard_t *g, uint32_t kind, int step, int mb, int tensor, double norm, char *err, size_t errlen);

int guard_admit(guard_t *g, uint32_t kind, int step, int mb, const float *data, size_t n, char *err,
                size_t errlen)
{
    const int tensor = s_tensor_kind(kind) && data;
    return s_admit(g, kind, step, mb, tensor, tensor ? sqrt(s_sumsq(data, n)) : 0.0, err, errlen);
}

int guard_admit_norm(guard_t *g, uint32_t kind, int step, int mb, double norm, char *err, size_t errlen)
{
    return s_admit(g, kind, step, mb, s_tensor_kind(kind), norm, err, errlen);
}

static int s_admit(guard_t *g, uint32_t kind, int step, int mb, int tensor, double norm, char *err, size_t errlen)
{
    const char *kn = wire_data_kind_name(kind);
    if (kind == TAH__DATA_KIND__DATA_PING || kind == TAH__DATA_KIND__DATA_HELLO)
        return 0; /* liveness and hello carry no step */
    if (kind >= S_NKIND || step < 1 || mb < 0 || mb >= g->nmb) {
        snprintf(err, errlen, "%s step %d mb %d: outside the replay window", kn, step, mb);
        return TAH_ERANGE;
    }
    s_window_t *w = &g->w[kind];
    int p = step & 1;
    int fresh = w->step[p] != step;
    if (!fresh && w->seen[p][mb]) {
        snprintf(err, errlen, "%s step %d mb %d: replayed (already received)", kn, step, mb);
        return TAH_ERANGE;
    }
    if (fresh && w->step[p] > step) {
        snprintf(err, errlen, "%s step %d mb %d: replayed (step %d already seen)", kn, step, mb, w->step[p]);
        return TAH_ERANGE;
    }
    if (tensor) {
        if (!isfinite(norm)) { /* only reachable if a caller skipped codec_decode's finite check */
            snprintf(err, errlen, "%s step %d mb %d: L2 norm is not finite", kn, step, mb);
            return TAH_ENONFINITE;
        }
        double est = g->est[kind];
        if (g->ratio > 0 && g->have_est[kind] && est > 0 && norm > g->ratio * est) {
            snprintf(err, errlen,
                     "%s step %d mb %d: L2 norm %.6g is %.3g x the running estimate %.6g (max_norm_ratio %g)", kn,
                     step, mb, norm, norm / est, est, g->ratio);
            return TAH_ERANGE;
        }
    }
    /* admitted: remember it */
    if (fresh) {
        w->step[p] = step;
        for (int i = 0; i < g->nmb; i++)
            w->seen[p][i] = 0;
    }
    w->seen[p][mb] = 1;
    if (tensor) {
        g->est[kind] = g->have_est[kind] ? (1.0 - GUARD_EMA_WEIGHT) * g->est[kind] + GUARD_EMA_WEIGHT * norm : norm;
        g->have_est[kind] = 1;
    }
    return 0;
}

double guard_norm_estimate(const guard_t *g, uint32_t kind)
{
    return kind < S_NKIND && g->have_est[kind] ? g->est[kind] : 0.0;
}
