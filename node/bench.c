/* bench.c — the speed a node announces: a short sgemm through the
 * pipeline's own matmul (the operation that dominates a stage), in GFLOP/s.
 * Takes about 0.1 s. */
#include <stdlib.h>
#include <time.h>

#include "layers.h" /* matmul_forward, layers_set_threads */
#include "node.h"

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double node_bench_gflops(int threads)
{
    enum { N = 256, C = 256, OC = 256 };
    float *in = malloc(sizeof(float) * N * C), *w = malloc(sizeof(float) * OC * C),
          *out = malloc(sizeof(float) * N * OC);
    double gflops = 0.0;
    if (in && w && out) {
        for (int i = 0; i < N * C; i++)
            in[i] = (float)(((unsigned)i * 7919u) % 1000u) * 1e-3f;
        for (int i = 0; i < OC * C; i++)
            w[i] = (float)(((unsigned)i * 104729u) % 1000u) * 1e-3f - 0.5f;
        layers_set_threads(threads);
        matmul_forward(out, in, w, NULL, N, C, OC); /* warm-up */
        int reps = 0;
        double t0 = s_now(), dt = 0.0;
        while (dt < 0.1) {
            matmul_forward(out, in, w, NULL, N, C, OC);
            reps++;
            dt = s_now() - t0;
        }
        gflops = 2.0 * N * C * OC * reps / dt / 1e9;
    }
    free(in);
    free(w);
    free(out);
    return gflops;
}
