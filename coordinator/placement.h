/* placement.h — which idle nodes run which stages of a job.
 *
 * placement_split gives stage k the contiguous layers [layer0[k], layer1[k])
 * with layer counts proportional to the stages' announced speeds. Speeds
 * are first quantised to quarters of the fastest node (a node within ~12 %
 * of another counts as equally fast), so measurement noise does not move
 * layers around, and equal speeds give exactly tah-train's split
 * (trainer_split: stage k holds [k*L/S, (k+1)*L/S)). Every stage gets at
 * least one layer. The embedding and the LM head are not weighted. */
#ifndef TAH_PLACEMENT_H
#define TAH_PLACEMENT_H

/* 0, or TAH_EINVAL when S < 1 or S > L. */
int placement_split(int L, int S, const double *speed, int *layer0, int *layer1);

#endif
