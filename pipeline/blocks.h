/* blocks.h — the transformer blocks of a stage (its layers [layer0,
 * layer1)), forward and backward, Megatron-style tensor parallel over tp
 * ranks (stage-internal; stage.c calls it).
 *
 * Rank r of tp computes with slices of the stage's full weights and writes
 * its slices of the full gradients (so parameters, gradients, moments and
 * checkpoints do not depend on tp):
 *   QKV  column-parallel: rows [r*C/tp, (r+1)*C/tp) of each of Q, K, V,
 *        i.e. heads [r*NH/tp, (r+1)*NH/tp); attention on those heads
 *   attention projection  row-parallel: columns [r*C/tp, ...) of W; partial
 *        (B,T,C) products all-reduced, bias added once after the reduction
 *   FC   column-parallel: rows [r*4C/tp, ...);  FC projection row-parallel
 * One all-reduce after attention and one after the MLP in forward; in
 * backward one of the input gradient of FC and one of QKV (before the ln2 /
 * ln1 backward). Replicated work (layernorms, residuals, bias gradients of
 * the row-parallel layers, layernorm gradients) is split across the ranks
 * by rows (B*T) or channels (C) into the shared activations, with the same
 * bits as at tp = 1; team barriers order it. Per-rank activations live in
 * the slot's buffers rank-major: rank r's qkv is (B,T,3C/tp) at offset
 * r*B*T*3C/tp, and so on.
 *
 * tp = 1 runs on the calling thread with exactly the operations of the
 * untensor-parallel stage. tp > 1 runs on a team of tp worker threads
 * (pipeline/tpteam.h), each with threads/tp OpenMP threads (at least 1);
 * the all-reduces go through pipeline/tpcomm.h with the stage's codecs. */
#ifndef TAH_BLOCKS_H
#define TAH_BLOCKS_H

#include <stddef.h>

#include "stage.h"

/* Team, all-reduce group and per-rank buffers (s->o.tp > 1), or the tp = 1
 * buffers. 0, or TAH_ENOMEM / TAH_EINVAL with err filled. */
int blocks_init(stage_t *s, char *err, size_t errlen);
void blocks_free(stage_t *s);

/* sl->in -> sl->res3 of the last layer. 0, or the all-reduce's error code
 * with s->err filled. */
int blocks_forward(stage_t *s, stage_slot_t *sl);
/* s->dres = d(output of the last layer) -> d(sl->in); parameter gradients
 * accumulate. 0 or an error code with s->err filled. */
int blocks_backward(stage_t *s, stage_slot_t *sl);

#endif
