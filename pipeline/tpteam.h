/* tpteam.h — a persistent team of worker threads for one tensor-parallel
 * group on the CPU: fork-join, one thread per rank.
 *
 * tp_team_run(team, fn, arg) wakes every worker, runs fn(arg, rank) on
 * worker `rank` (0..n-1) and returns when all of them have returned; the
 * calling thread only waits. Inside fn, tp_team_barrier(team) blocks until
 * every rank has reached it. One run at a time (the caller is one thread).
 * Each worker keeps its own OpenMP settings (omp_set_num_threads inside fn
 * is per worker and persists between runs).
 *
 * Memory: the team owns its threads; tp_team_destroy joins them. */
#ifndef TAH_TPTEAM_H
#define TAH_TPTEAM_H

#include <stddef.h>

typedef struct tp_team tp_team_t;
typedef void (*tp_team_fn)(void *arg, int rank);

/* n workers, 1..TP_TEAM_MAX; NULL with err filled when threads cannot start. */
#define TP_TEAM_MAX 64
tp_team_t *tp_team_new(int n, char *err, size_t errlen);
void tp_team_destroy(tp_team_t **self_p);
int tp_team_size(const tp_team_t *team);
void tp_team_run(tp_team_t *team, tp_team_fn fn, void *arg);
void tp_team_barrier(tp_team_t *team);

#endif
