/* guard.h — hostile-input rules a data message passes after link_check
 * (link.h): no replays, no absurd norms; and the per-sender strike count
 * that gets a misbehaving neighbour evicted.
 *
 * Replay: every (kind, step, micro-batch) is accepted once. link_check
 * already confines a message to the receiver's current step or the next,
 * so a message for a step the receiver finished is rejected there; the
 * guard remembers which (kind, mb) of those two steps it has admitted and
 * rejects a second copy (a replayed or duplicated frame), whether or not
 * the runner has consumed the first one yet. Each kind has exactly one
 * sender (link.h's role table), so the window is per kind.
 *
 * Norm bound: for tensor kinds (ACT, GRAD, EVAL, TIED) the decoded
 * tensor's L2 norm must not exceed max_norm_ratio times the running
 * estimate for that kind (exponential average of the admitted norms, weight
 * GUARD_EMA_WEIGHT on the newest). The first admitted frame of a kind sets
 * the estimate; an estimate of 0 (only all-zero tensors so far) bounds
 * nothing; max_norm_ratio <= 0 turns the rule off. Non-finite values never
 * get here: codec_decode rejects them.
 *
 * A rejected message leaves the guard unchanged (it is not "seen"), so the
 * genuine frame can still arrive. Memory: guard_new allocates, the caller
 * owns it and frees with guard_destroy. Not thread-safe (the agent thread
 * owns it). */
#ifndef TAH_GUARD_H
#define TAH_GUARD_H

#include <stddef.h>
#include <stdint.h>

#define GUARD_EMA_WEIGHT 0.1

typedef struct guard guard_t;

/* M micro-batches, val_batches validation batches per step. NULL on OOM. */
guard_t *guard_new(int M, int val_batches, double max_norm_ratio);
void guard_destroy(guard_t **g_p);

/* Admit a message that passed link_check: kind and (step, mb) from its
 * header, data/n the decoded floats for tensor kinds (NULL/0 otherwise).
 * 0: admitted and remembered. TAH_ERANGE: replay or norm out of bound,
 * with the reason in err. */
int guard_admit(guard_t *g, uint32_t kind, int step, int mb, const float *data, size_t n, char *err,
                size_t errlen);
/* The same for a tensor decoded elsewhere (a GPU stage's decoder), whose
 * L2 norm the caller computed. */
int guard_admit_norm(guard_t *g, uint32_t kind, int step, int mb, double norm, char *err, size_t errlen);

/* Running norm estimate of a tensor kind (0 if none yet). */
double guard_norm_estimate(const guard_t *g, uint32_t kind);

#endif
