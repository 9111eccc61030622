/* optim.c — AdamW, clipping factor and LR schedule (see optim.h). */
#include "optim.h"

#include <math.h>

void optim_defaults(optim_opts_t *o)
{
    o->lr = 3e-4f;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->eps = 1e-8f;
    o->weight_decay = 0.0f;
    o->grad_clip = 1.0f;
    o->schedule = OPTIM_CONSTANT;
    o->warmup = 0;
    o->total_steps = 1;
    o->lr_min_frac = 0.0f;
}

float optim_lr(const optim_opts_t *o, int step)
{
    if (o->warmup > 0 && step < o->warmup)
        return o->lr * (float)(step + 1) / (float)o->warmup;
    if (o->schedule == OPTIM_CONSTANT)
        return o->lr;
    int span = o->total_steps - 1 - o->warmup;
    double ratio = span > 0 ? (double)(step - o->warmup) / span : 1.0;
    if (ratio > 1.0)
        ratio = 1.0;
    if (ratio < 0.0)
        ratio = 0.0;
    double coeff = 0.5 * (1.0 + cos(3.14159265358979323846 * ratio));
    double lo = (double)o->lr * o->lr_min_frac;
    return (float)(lo + coeff * ((double)o->lr - lo));
}

float optim_clip_scale(double norm, float clip)
{
    if (clip > 0.0f && norm > (double)clip)
        return (float)((double)clip / norm);
    return 1.0f;
}

void optim_adamw(float *p, float *m, float *v, const float *g, size_t n, const optim_opts_t *o,
                 float lr, float wd, float grad_scale, long long t)
{
    const float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
    const float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    const float bc2 = (float)(1.0 - pow((double)b2, (double)t));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mh = mi / bc1, vh = vi / bc2;
        p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
    }
}
