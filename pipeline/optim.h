/* optim.h — AdamW, global-norm clipping and the learning-rate schedule.
 *
 * AdamW (decoupled weight decay, bias-corrected moments):
 *   g' = g * grad_scale                 (grad_scale = clip factor, 1 if off)
 *   m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
 *   p -= lr * ( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd * p )
 * Weight decay applies to weight matrices only (gpt2_tensor_is_matrix), as
 * GPT-2 training does; biases and LayerNorm parameters get wd = 0.
 *
 * LR schedule (step counts from 0): linear warm-up lr*(step+1)/warmup for
 * step < warmup, then constant, or cosine from lr down to lr*lr_min_frac at
 * the last step. */
#ifndef TAH_OPTIM_H
#define TAH_OPTIM_H

#include <stddef.h>

typedef enum optim_schedule { OPTIM_CONSTANT = 0, OPTIM_COSINE = 1 } optim_schedule_t;

typedef struct optim_opts {
    float lr;           /* peak learning rate */
    float beta1, beta2; /* 0.9, 0.95 */
    float eps;          /* 1e-8 */
    float weight_decay; /* 0.0 */
    float grad_clip;    /* global-norm clip, 0 = off (1.0) */
    optim_schedule_t schedule;
    int warmup;         /* warm-up steps (0) */
    int total_steps;    /* for the cosine schedule */
    float lr_min_frac;  /* cosine floor as a fraction of lr (0.0) */
} optim_opts_t;

/* Defaults above. */
void optim_defaults(optim_opts_t *o);
/* Learning rate of step (0-based). */
float optim_lr(const optim_opts_t *o, int step);
/* Factor to multiply gradients by: clip/norm when clip > 0 and norm > clip, else 1. */
float optim_clip_scale(double norm, float clip);
/* One AdamW update of n parameters. t is the 1-based step count. */
void optim_adamw(float *p /* (n) */, float *m /* (n) */, float *v /* (n) */, const float *g /* (n) */,
                 size_t n, const optim_opts_t *o, float lr, float wd, float grad_scale, long long t);

#endif
