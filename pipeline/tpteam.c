/* tpteam.c — fork-join worker team (see tpteam.h). */
#include "tpteam.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tp_team {
    int n;
    pthread_t *threads;
    int started;              /* threads created so far */
    pthread_mutex_t mu;
    pthread_cond_t wake;      /* workers wait for a new generation */
    pthread_cond_t done;      /* the caller waits for pending == 0 */
    unsigned long generation; /* bumped per run */
    int pending;              /* workers still running this generation */
    int quit;
    tp_team_fn fn;
    void *arg;
    pthread_barrier_t bar;
};

typedef struct s_worker {
    tp_team_t *team;
    int rank;
} s_worker_t;

static void *s_main(void *p)
{
    s_worker_t w = *(s_worker_t *)p;
    free(p);
    tp_team_t *t = w.team;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (!t->quit && t->generation == seen)
            pthread_cond_wait(&t->wake, &t->mu);
        if (t->quit) {
            pthread_mutex_unlock(&t->mu);
            return NULL;
        }
        seen = t->generation;
        tp_team_fn fn = t->fn;
        void *arg = t->arg;
        pthread_mutex_unlock(&t->mu);

        fn(arg, w.rank);

        pthread_mutex_lock(&t->mu);
        if (--t->pending == 0)
            pthread_cond_signal(&t->done);
        pthread_mutex_unlock(&t->mu);
    }
}

tp_team_t *tp_team_new(int n, char *err, size_t errlen)
{
    if (n < 1 || n > TP_TEAM_MAX) {
        if (err)
            snprintf(err, errlen, "tensor-parallel team of %d threads (must be 1..%d)", n, TP_TEAM_MAX);
        return NULL;
    }
    tp_team_t *t = calloc(1, sizeof *t);
    if (!t)
        goto nomem;
    t->n = n;
    t->threads = calloc((size_t)n, sizeof *t->threads);
    if (!t->threads) {
        free(t);
        goto nomem;
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->wake, NULL);
    pthread_cond_init(&t->done, NULL);
    pthread_barrier_init(&t->bar, NULL, (unsigned)n);
    for (int r = 0; r < n; r++) {
        s_worker_t *w = malloc(sizeof *w);
        int rc = w ? 0 : -1;
        if (w) {
            *w = (s_worker_t){ t, r };
            rc = pthread_create(&t->threads[r], NULL, s_main, w);
            if (rc)
                free(w);
        }
        if (rc) {
            if (err)
                snprintf(err, errlen, "cannot start tensor-parallel worker %d of %d: %s", r, n,
                         w ? strerror(rc) : "out of memory");
            tp_team_destroy(&t);
            return NULL;
        }
        t->started++;
    }
    return t;
nomem:
    if (err)
        snprintf(err, errlen, "out of memory starting a tensor-parallel team of %d", n);
    return NULL;
}

void tp_team_destroy(tp_team_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    tp_team_t *t = *self_p;
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->mu);
    for (int r = 0; r < t->started; r++)
        pthread_join(t->threads[r], NULL);
    pthread_barrier_destroy(&t->bar);
    pthread_cond_destroy(&t->done);
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->mu);
    free(t->threads);
    free(t);
    *self_p = NULL;
}

int tp_team_size(const tp_team_t *team)
{
    return team->n;
}

void tp_team_run(tp_team_t *t, tp_team_fn fn, void *arg)
{
    pthread_mutex_lock(&t->mu);
    t->fn = fn;
    t->arg = arg;
    t->pending = t->n;
    t->generation++;
    pthread_cond_broadcast(&t->wake);
    while (t->pending > 0)
        pthread_cond_wait(&t->done, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

void tp_team_barrier(tp_team_t *t)
{
    pthread_barrier_wait(&t->bar);
}
