/* stage_backend.h — the table through which a second stage backend (the
 * CUDA one in cuda/cu_stage.cu) implements stage.h, so that libtahpipe
 * never links it: a program built with the backend registers the table
 * once (cu_stage_register()), and stage_new hands a stage whose options
 * ask for it (o->backend == STAGE_CUDA) to the table's create. Every public
 * stage_* call of such a stage then goes to the table (stage.c, one line
 * each).
 *
 * A backend stage keeps the stage_t bookkeeping of stage.c (o, nl, sizes,
 * nparams, t) and the host mirrors params / grads / moments with their
 * tensor views p/g/m/v; the mirrors hold what the last sync copied
 * (stage_sync_to_host / stage_sync_to_device in stage.h), the device holds
 * the truth. Its own state lives behind s->cu. Functions returning int give
 * 0 or a negative TAH_E* code; the void ones keep their error for the next
 * int call and stage_error. */
#ifndef TAH_STAGE_BACKEND_H
#define TAH_STAGE_BACKEND_H

#include <stddef.h>

#include "stage.h" /* stage_t, stage_opts_t, optim_opts_t, gpt2_model_t */

typedef struct stage_backend {
    const char *name; /* "cuda" */
    /* Device state for s (s->o, sizes, nparams and host mirrors are set up);
     * NULL with err filled on failure. */
    void *(*create)(stage_t *s, char *err, size_t errlen);
    void (*destroy)(stage_t *s);
    int (*forward)(stage_t *s, int mb, const int *tokens, const float *in, const int *targets,
                   float *out, float *loss);
    int (*backward)(stage_t *s, int mb, const float *dout, float dloss, float *dinp);
    void (*discard)(stage_t *s, int mb);
    int (*inflight)(const stage_t *s);
    void (*zero_grad)(stage_t *s);
    /* first == last on this backend: both copies become g[wte] + g[head] */
    void (*tied_sync_self)(stage_t *s);
    void (*grad_sumsq)(stage_t *s, double *slots);
    void (*step)(stage_t *s, const optim_opts_t *o, float lr, float grad_scale); /* s->t already incremented */
    int (*to_host)(const stage_t *s, int what);                                  /* STAGE_SYNC_* mask */
    int (*to_device)(stage_t *s, int what);
    void (*describe)(const stage_t *s, char *buf, size_t buflen);
    const char *(*error)(const stage_t *s); /* NULL while no call failed */
    /* stage_encode_boundary (stage.h); the stage checked what and the frame size */
    int (*encode)(stage_t *s, int what, int mb, const codec_spec_t *spec, uint8_t *frame, size_t len, char *err,
                  size_t errlen);
    /* stage_backward_encode (stage.h); the stage checked the role and the frame size */
    int (*backward_encode)(stage_t *s, int mb, const float *dout, float dloss, const codec_spec_t *spec,
                           uint8_t *frame, size_t len, char *err, size_t errlen);
    /* stage_decode_boundary (stage.h): NULL when the backend does not decode on its device */
    int (*decode)(stage_t *s, int what, int mb, const uint8_t *frame, size_t len, double *norm, char *err,
                  size_t errlen);
    /* stage_tied_rows_get / _put (stage.h); the stage checked tied, rows and R */
    int (*tied_rows)(stage_t *s, int put, int grad, const int *rows, size_t R, float *buf);
    void *(*host_alloc)(size_t bytes); /* page-locked, NULL on failure */
    void (*host_free)(void *p);
} stage_backend_t;

/* Register the backend for STAGE_CUDA (one; a later call replaces it). */
void stage_backend_register(const stage_backend_t *b);
/* The registered backend or NULL. */
const stage_backend_t *stage_backend_get(void);

#endif
