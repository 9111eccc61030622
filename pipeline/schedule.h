/* schedule.h — micro-batch schedules as pure functions.
 *
 * sched_build(kind, S, M, k) yields the ordered list of actions stage k
 * (0..S-1) performs in one training step of M micro-batches:
 *   GPipe: F0 F1 .. F(M-1) B0 B1 .. B(M-1)
 *   1F1B:  w = min(S-1-k, M) warm-up forwards, then alternate one forward
 *          and one backward until every forward is issued, then the
 *          remaining backwards. At most min(S-k, M) micro-batches are in
 *          flight on stage k (GPipe: M).
 * Cross-stage dependencies (the runtime's job): F(m) on stage k needs F(m)
 * of stage k-1; B(m) on stage k needs B(m) of stage k+1 (on the last stage
 * only its own F(m)). Executing every stage's list in order under these
 * dependencies never deadlocks (tests/test_sched.c checks it). */
#ifndef TAH_SCHEDULE_H
#define TAH_SCHEDULE_H

typedef enum sched_kind { SCHED_GPIPE = 0, SCHED_1F1B = 1 } sched_kind_t;
typedef enum sched_op { SCHED_F = 0, SCHED_B = 1 } sched_op_t;

typedef struct sched_action {
    sched_op_t op;
    int mb; /* micro-batch 0..M-1 */
} sched_action_t;

/* "gpipe" / "1f1b" -> kind; 0 or TAH_EINVAL. */
int sched_parse(const char *name, sched_kind_t *kind);
const char *sched_name(sched_kind_t kind);

/* Fill out[0..2M) with stage k's actions. 0, or TAH_EINVAL for S < 1,
 * M < 1, k outside 0..S-1 or an unknown kind. */
int sched_build(sched_kind_t kind, int S, int M, int k, sched_action_t *out);
/* Most micro-batches in flight on stage k under the schedule. */
int sched_max_inflight(sched_kind_t kind, int S, int M, int k);

#endif
