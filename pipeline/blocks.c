/* blocks.c — tensor-parallel transformer blocks of a stage (see blocks.h). */
#include "blocks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "layers.h" /* layer functions, layers_set_threads */
#include "tpcomm.h" /* tp_shm_new, tp_comm_*, tp_allreduce */
#include "tpteam.h" /* tp_team_* */

int blocks_init(stage_t *s, char *err, size_t errlen)
{
    const stage_opts_t *o = &s->o;
    const int tp = s->tp, T = o->T;
    const size_t BTC = (size_t)o->B * T * o->cfg.C;
    s->rank_threads = layers_max_threads() / tp;
    if (s->rank_threads < 1)
        s->rank_threads = 1;
    s->tpscr_n = (size_t)s->rank_threads * T * T;
    s->red = malloc((size_t)tp * BTC * sizeof(float));
    s->tpscr = malloc((size_t)tp * s->tpscr_n * sizeof(float));
    if (!s->red || !s->tpscr) {
        if (err)
            snprintf(err, errlen, "out of memory for the tensor-parallel buffers (tp %d)", tp);
        return TAH_ENOMEM;
    }
    if (tp == 1)
        return 0;
    s->team = tp_team_new(tp, err, errlen);
    if (!s->team)
        return TAH_ENOMEM;
    s->comm = tp_comm_new(tp_shm_new(tp, err, errlen), &o->tp_rs, &o->tp_ag, BTC, err, errlen);
    return s->comm ? 0 : TAH_EINVAL;
}

void blocks_free(stage_t *s)
{
    tp_comm_destroy(&s->comm);
    tp_team_destroy(&s->team);
    free(s->red);
    free(s->tpscr);
    s->red = s->tpscr = NULL;
}

/* [*lo, *hi) = part r of n split tp ways */
static void s_part(int n, int r, int tp, int *lo, int *hi)
{
    *lo = (int)((long long)n * r / tp);
    *hi = (int)((long long)n * (r + 1) / tp);
}

static void s_barrier(stage_t *s)
{
    if (s->team)
        tp_team_barrier(s->team);
}

static int s_allreduce(stage_t *s, int rank, float *buf, size_t n)
{
    if (!s->comm)
        return 0;
    return tp_allreduce(s->comm, rank, buf, n, stage_tp_call_id(s, rank), s->tp_err[rank], sizeof s->tp_err[rank]);
}

/* out = x + (red + bias), rows of width C (bias NULL: out = x + red) */
static void s_residual(float *out, const float *x, const float *red, const float *bias, int rows, int C)
{
    if (!bias) {
        residual_forward(out, x, red, (size_t)rows * C);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < rows; n++) {
        const size_t o = (size_t)n * C;
        for (int i = 0; i < C; i++)
            out[o + i] = x[o + i] + (red[o + i] + bias[i]);
    }
}

/* The weights and activations of layer l seen by one rank. */
typedef struct s_view {
    const float *ln1w, *ln1b, *qkvw, *qkvb, *apw, *apb, *ln2w, *ln2b, *fcw, *fcb, *fpw, *fpb;
    float *ln1, *ln1_mean, *ln1_rstd, *res2, *ln2, *ln2_mean, *ln2_rstd, *res3; /* shared, full */
    float *qkv, *att, *atty, *fch, *fchg;                                        /* this rank's */
} s_view_t;

static void s_view(const stage_t *s, const stage_slot_t *sl, int l, int rank, s_view_t *v)
{
    const int tp = s->tp;
    const size_t B = (size_t)s->o.B, T = (size_t)s->o.T, C = (size_t)s->o.cfg.C, NH = (size_t)s->o.cfg.NH;
    const size_t BT = B * T, BTC = BT * C, L = (size_t)l, r = (size_t)rank;
    const size_t Cr = C / (size_t)tp, NHr = NH / (size_t)tp;
    v->ln1w = s->p[GPT2_LN1W] + L * C;
    v->ln1b = s->p[GPT2_LN1B] + L * C;
    v->qkvw = s->p[GPT2_QKVW] + L * 3 * C * C;
    v->qkvb = s->p[GPT2_QKVB] + L * 3 * C;
    v->apw = s->p[GPT2_ATTPROJW] + L * C * C;
    v->apb = s->p[GPT2_ATTPROJB] + L * C;
    v->ln2w = s->p[GPT2_LN2W] + L * C;
    v->ln2b = s->p[GPT2_LN2B] + L * C;
    v->fcw = s->p[GPT2_FCW] + L * 4 * C * C;
    v->fcb = s->p[GPT2_FCB] + L * 4 * C;
    v->fpw = s->p[GPT2_FCPROJW] + L * 4 * C * C;
    v->fpb = s->p[GPT2_FCPROJB] + L * C;
    v->ln1 = sl->ln1 + L * BTC;
    v->ln1_mean = sl->ln1_mean + L * BT;
    v->ln1_rstd = sl->ln1_rstd + L * BT;
    v->res2 = sl->res2 + L * BTC;
    v->ln2 = sl->ln2 + L * BTC;
    v->ln2_mean = sl->ln2_mean + L * BT;
    v->ln2_rstd = sl->ln2_rstd + L * BT;
    v->res3 = sl->res3 + L * BTC;
    v->qkv = sl->qkv + L * 3 * BTC + r * BT * 3 * Cr;
    v->att = sl->att + L * B * NH * T * T + r * B * NHr * T * T;
    v->atty = sl->atty + L * BTC + r * BT * Cr;
    v->fch = sl->fch + L * 4 * BTC + r * BT * 4 * Cr;
    v->fchg = sl->fchg + L * 4 * BTC + r * BT * 4 * Cr;
}

static int s_forward_rank(stage_t *s, stage_slot_t *sl, int rank)
{
    const int tp = s->tp, B = s->o.B, T = s->o.T, C = s->o.cfg.C, NH = s->o.cfg.NH;
    const int BT = B * T, Cr = C / tp, NHr = NH / tp;
    const size_t BTC = (size_t)BT * C;
    int r0, r1;
    s_part(BT, rank, tp, &r0, &r1);
    const int rows = r1 - r0;
    const size_t ro = (size_t)r0 * C;
    float *red = s->red + (size_t)rank * BTC;
    const float *x = sl->in;
    for (int l = 0; l < s->nl; l++) {
        s_view_t v;
        s_view(s, sl, l, rank, &v);
        layernorm_forward(v.ln1 + ro, v.ln1_mean + r0, v.ln1_rstd + r0, x + ro, v.ln1w, v.ln1b, rows, C);
        s_barrier(s);
        if (tp == 1) {
            matmul_forward(v.qkv, v.ln1, v.qkvw, v.qkvb, BT, C, 3 * C);
        } else {
            for (int p = 0; p < 3; p++) {
                size_t row = (size_t)p * C + (size_t)rank * Cr;
                matmul_forward_strided(v.qkv + (size_t)p * Cr, 3 * Cr, v.ln1, C, v.qkvw + row * C, C,
                                       v.qkvb + row, BT, C, Cr);
            }
        }
        attention_forward(v.atty, v.att, v.qkv, B, T, Cr, NHr);
        matmul_forward_strided(red, C, v.atty, Cr, v.apw + (size_t)rank * Cr, C, tp == 1 ? v.apb : NULL, BT,
                               Cr, C);
        int rc = s_allreduce(s, rank, red, BTC);
        if (rc)
            return rc;
        s_residual(v.res2 + ro, x + ro, red + ro, tp == 1 ? NULL : v.apb, rows, C);
        layernorm_forward(v.ln2 + ro, v.ln2_mean + r0, v.ln2_rstd + r0, v.res2 + ro, v.ln2w, v.ln2b, rows, C);
        s_barrier(s);
        size_t frow = (size_t)rank * 4 * Cr;
        matmul_forward(v.fch, v.ln2, v.fcw + frow * C, v.fcb + frow, BT, C, 4 * Cr);
        gelu_forward(v.fchg, v.fch, (size_t)BT * 4 * Cr);
        matmul_forward_strided(red, C, v.fchg, 4 * Cr, v.fpw + frow, 4 * C, tp == 1 ? v.fpb : NULL, BT, 4 * Cr,
                               C);
        rc = s_allreduce(s, rank, red, BTC);
        if (rc)
            return rc;
        s_residual(v.res3 + ro, v.res2 + ro, red + ro, tp == 1 ? NULL : v.fpb, rows, C);
        x = v.res3;
    }
    return 0;
}

static int s_backward_rank(stage_t *s, stage_slot_t *sl, int rank)
{
    const int tp = s->tp, B = s->o.B, T = s->o.T, C = s->o.cfg.C, NH = s->o.cfg.NH;
    const int BT = B * T, Cr = C / tp, NHr = NH / tp;
    const size_t BTC = (size_t)BT * C, C1 = (size_t)C;
    int r0, r1, c0, c1;
    s_part(BT, rank, tp, &r0, &r1);
    s_part(C, rank, tp, &c0, &c1);
    const int rows = r1 - r0;
    const size_t ro = (size_t)r0 * C;
    float *red = s->red + (size_t)rank * BTC, *dres = s->dres;
    float *dbig = s->dbig + (size_t)rank * BT * 4 * Cr;   /* (B,T,4C/tp) */
    float *datty = dbig;                                  /* (B,T,C/tp), after the MLP */
    float *dqkv = s->dqkv + (size_t)rank * BT * 3 * Cr;   /* (B,T,3C/tp) */
    float *scr = s->tpscr + (size_t)rank * s->tpscr_n;
    for (int l = s->nl - 1; l >= 0; l--) {
        s_view_t v;
        s_view(s, sl, l, rank, &v);
        const float *x = l == 0 ? sl->in : sl->res3 + (size_t)(l - 1) * BTC;
        const size_t L = (size_t)l;
        float *d_ln1w = s->g[GPT2_LN1W] + L * C1, *d_ln1b = s->g[GPT2_LN1B] + L * C1;
        float *d_qkvw = s->g[GPT2_QKVW] + L * 3 * C1 * C1, *d_qkvb = s->g[GPT2_QKVB] + L * 3 * C1;
        float *d_apw = s->g[GPT2_ATTPROJW] + L * C1 * C1, *d_apb = s->g[GPT2_ATTPROJB] + L * C1;
        float *d_ln2w = s->g[GPT2_LN2W] + L * C1, *d_ln2b = s->g[GPT2_LN2B] + L * C1;
        float *d_fcw = s->g[GPT2_FCW] + L * 4 * C1 * C1, *d_fcb = s->g[GPT2_FCB] + L * 4 * C1;
        float *d_fpw = s->g[GPT2_FCPROJW] + L * 4 * C1 * C1, *d_fpb = s->g[GPT2_FCPROJB] + L * C1;
        const size_t frow = (size_t)rank * 4 * Cr;

        /* MLP: dres holds d(res3), every rank reads all of it */
        memset(dbig, 0, (size_t)BT * 4 * Cr * sizeof(float));
        matmul_backward_strided(dbig, 4 * Cr, d_fpw + frow, 4 * C, NULL, dres, C, v.fchg, 4 * Cr, v.fpw + frow,
                                4 * C, BT, 4 * Cr, C);
        bias_backward(d_fpb + c0, dres + c0, C, BT, c1 - c0);
        gelu_backward(dbig, v.fch, dbig, (size_t)BT * 4 * Cr);
        memset(red, 0, BTC * sizeof(float));
        matmul_backward(red, d_fcw + frow * C1, d_fcb + frow, dbig, v.ln2, v.fcw + frow * C1, BT, C, 4 * Cr);
        int rc = s_allreduce(s, rank, red, BTC); /* every rank is past its reads of dres */
        if (rc)
            return rc;
        layernorm_backward_input(dres + ro, red + ro, v.res2 + ro, v.ln2w, v.ln2_mean + r0, v.ln2_rstd + r0,
                                 rows, C);
        layernorm_backward_params(d_ln2w, d_ln2b, red, v.res2, v.ln2_mean, v.ln2_rstd, BT, C, c0, c1);
        s_barrier(s);

        /* attention: dres holds d(res2) */
        memset(datty, 0, (size_t)BT * Cr * sizeof(float));
        matmul_backward_strided(datty, Cr, d_apw + (size_t)rank * Cr, C, NULL, dres, C, v.atty, Cr,
                                v.apw + (size_t)rank * Cr, C, BT, Cr, C);
        bias_backward(d_apb + c0, dres + c0, C, BT, c1 - c0);
        memset(dqkv, 0, (size_t)BT * 3 * Cr * sizeof(float));
        attention_backward(dqkv, scr, datty, v.att, v.qkv, B, T, Cr, NHr);
        memset(red, 0, BTC * sizeof(float));
        if (tp == 1) {
            matmul_backward(red, d_qkvw, d_qkvb, dqkv, v.ln1, v.qkvw, BT, C, 3 * C);
        } else {
            for (int p = 0; p < 3; p++) {
                size_t row = (size_t)p * C + (size_t)rank * Cr;
                matmul_backward_strided(red, C, d_qkvw + row * C1, C, d_qkvb + row, dqkv + (size_t)p * Cr, 3 * Cr,
                                        v.ln1, C, v.qkvw + row * C1, C, BT, C, Cr);
            }
        }
        rc = s_allreduce(s, rank, red, BTC);
        if (rc)
            return rc;
        layernorm_backward_input(dres + ro, red + ro, x + ro, v.ln1w, v.ln1_mean + r0, v.ln1_rstd + r0, rows, C);
        layernorm_backward_params(d_ln1w, d_ln1b, red, x, v.ln1_mean, v.ln1_rstd, BT, C, c0, c1);
        s_barrier(s); /* dres holds d(x) */
    }
    return 0;
}

typedef struct s_job {
    stage_t *s;
    stage_slot_t *sl;
    int backward;
} s_job_t;

static void s_rank_main(void *arg, int rank)
{
    s_job_t *j = arg;
    layers_set_threads(j->s->rank_threads); /* this worker's OpenMP team */
    j->s->tp_rc[rank] = j->backward ? s_backward_rank(j->s, j->sl, rank) : s_forward_rank(j->s, j->sl, rank);
}

static int s_run(stage_t *s, stage_slot_t *sl, int backward)
{
    if (!s->team)
        return backward ? s_backward_rank(s, sl, 0) : s_forward_rank(s, sl, 0);
    s_job_t j = { s, sl, backward };
    tp_team_run(s->team, s_rank_main, &j);
    int rc = s->tp_rc[0]; /* the all-reduce makes every rank agree */
    if (rc) {
        const char *why = "";
        for (int r = 0; r < s->tp && !*why; r++)
            why = s->tp_err[r];
        snprintf(s->err, sizeof s->err, "layers %d..%d %s: %s", s->o.layer0, s->o.layer1 - 1,
                 backward ? "backward" : "forward", *why ? why : tah_strerror(rc));
    }
    return rc;
}

int blocks_forward(stage_t *s, stage_slot_t *sl)
{
    return s_run(s, sl, 0);
}

int blocks_backward(stage_t *s, stage_slot_t *sl)
{
    return s_run(s, sl, 1);
}
