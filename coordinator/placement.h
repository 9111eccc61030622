/* placement.h — which idle nodes run which stages of a job.
 *
 * placement_speeds gives the speed each chosen node counts with: what it
 * measured for the job's precision (a GPU node's bf16 matrix product for a
 * bf16 job, where it announced one; else its fp32 one, or a CPU node's
 * sgemm), and nodes that announced the same GPUs (device id) share them:
 * each counts with the group's largest speed divided by the group's size,
 * so that nodes benchmarking one GPU at the same moment, whose measurements
 * vary with how their runs overlapped, weigh the same.
 *
 * placement_split gives stage k the contiguous layers [layer0[k], layer1[k])
 * with layer counts proportional to those speeds. Speeds are first
 * quantised on a log scale, to half octaves of the fastest node's (2^(q/2),
 * q <= 0: a node within ~16 % of the fastest counts as equally fast),
 * so measurement noise does not move layers around, equal speeds give
 * exactly tah-train's split (trainer_split: stage k holds [k*L/S,
 * (k+1)*L/S)), and a GPU node next to CPU nodes (hundreds of times faster)
 * takes nearly all layers. Every stage gets at least one layer. The
 * embedding and the LM head are not weighted. A speed that is not finite
 * and positive counts as the fastest. */
#ifndef TAH_PLACEMENT_H
#define TAH_PLACEMENT_H

/* speed[k] of node k of S: gflops[k], or gflops_bf16[k] when bf16 and it is
 * positive; then shared device ids (non-empty, equal strings) as above. */
void placement_speeds(int S, const double *gflops, const double *gflops_bf16, const char *const *device_id, int bf16,
                      double *speed);

/* 0, or TAH_EINVAL when S < 1 or S > L. */
int placement_split(int L, int S, const double *speed, int *layer0, int *layer1);

#endif
