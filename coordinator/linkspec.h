/* linkspec.h — per-link settings of a job or an experiment point: a rate
 * (Mbit/s) or a one-way delay (ms) for every directed link between stages.
 *
 * One grammar for the job keys link_rate_mbps / link_delay_ms and for the
 * [sweep] lists of `tah-coord experiment`:
 *   V            every link, both directions              "50"
 *   VF/VB        forward (k -> k+1, and first -> last for the tied link)
 *                VF, backward VB                          "50/20"
 *   i>j:V,...    per directed link between stages i and j "0>1:50,1>0:20,1>2:100"
 *                (links not listed: not shaped / no delay)
 *   none         nothing (same as 0)
 * Values are finite and >= 0; 0 means "no limit" (rate) or "no delay".
 *
 * Memory: fixed-size struct, nothing to free. */
#ifndef TAH_LINKSPEC_H
#define TAH_LINKSPEC_H

#include <stddef.h>

#define LINKSPEC_MAX 64

typedef struct linkspec {
    int matrix;              /* 1: per-link entries below; 0: fwd/bwd */
    double fwd, bwd;         /* matrix == 0 */
    int n;
    struct { int from, to; double v; } e[LINKSPEC_MAX];
} linkspec_t;

/* Parse s into ls; values above vmax are refused. 0 or TAH_EINVAL with a
 * message (without the key name). */
int linkspec_parse(const char *s, double vmax, linkspec_t *ls, char *err, size_t errlen);
/* The value for the directed link from -> to (0: none). */
double linkspec_value(const linkspec_t *ls, int from, int to);
/* 1 when some link has a non-zero value. */
int linkspec_any(const linkspec_t *ls);
/* Largest stage index named by a matrix (-1 otherwise). */
int linkspec_max_stage(const linkspec_t *ls);
/* Canonical text ("50", "50/20", "0>1:50,1>0:20", "none"). */
void linkspec_format(const linkspec_t *ls, char *buf, size_t n);

/* 1 when this machine's kernel has the netem qdisc (loaded or as a module
 * file). tah never sets netem up itself; nodes say which mechanism delays
 * their sends ("delay: in-process (no netem)"). */
int linkspec_netem_available(void);

#endif
