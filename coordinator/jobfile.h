/* jobfile.h — the distributed job file (INI), parsed with libinih.
 *
 * Format: one [job] section; keys are tah-train's long options with dashes
 * turned into underscores (trainopts.h holds the table, so the two cannot
 * drift), plus runtime keys:
 *   name              free text shown by `tah-coord status` (default: file name)
 *   checkpoint_every  N > 0: every stage writes PREFIX.stage<k>.ckpt every N
 *                     steps (PREFIX = save_ckpt, or DIR/job<ID> under the
 *                     job file's directory); 0 = off (default). Same as
 *                     tah-train's ckpt_every, except that save_ckpt may be
 *                     left out.
 *   link_rate_mbps    in-process token bucket on this job's data links, in
 *                     Mbit/s (headers included): "50", "50/20" (forward /
 *                     backward) or "0>1:50,1>0:20,..." per directed link
 *                     (linkspec.h); unset or 0 = not shaped
 *   link_delay_ms     one-way delay the sender adds to every data message
 *                     on a link, same grammar (ms); the node's I/O thread
 *                     holds the message, compute goes on
 *   max_norm_ratio    a received activation/gradient whose L2 norm exceeds
 *                     this times the running estimate for its kind is
 *                     rejected (node/guard.h); default 1000, 0 = off
 *   max_bad_frames    a neighbour whose rejected data messages reach this
 *                     count (as reported by the node receiving them) is
 *                     evicted: the coordinator re-places its stage (and
 *                     never gives this job to that node again); default
 *                     10, 0 = never
 *   max_recoveries    how many times the job may be re-placed after a lost,
 *                     leaving or evicted node or a stall (each rolls every stage back
 *                     to the last step with a complete set of checkpoint
 *                     replicas, or step 0); default 20, 0 = fail instead
 *   stall_timeout     seconds a running job may go without progress (a step
 *                     report or a checkpoint chunk) before the coordinator
 *                     rolls it back to the last complete checkpoint set on
 *                     the same nodes (a recovery: a data message lost on a
 *                     reset connection would otherwise hang every stage);
 *                     20 times the slowest step seen if that is longer;
 *                     auto (default): 300 until a placement's first step
 *                     report, then 60; 0 = never
 * Relative paths are relative to the job file's directory (base_dir).
 * `save` (a whole llm.c model file) is refused: stages live on different
 * machines; use save_ckpt, then tah-train --resume PREFIX --save F.
 *
 * Errors name the file and line: "job.ini:7: batch = 'x' is not an integer
 * in range 1..1048576". jobfile_parse checks syntax and ranges only (it runs
 * in the coordinator, which may not see the files); jobfile_check_files
 * (run by `tah-coord submit`) checks that the data/model files exist. */
#ifndef TAH_JOBFILE_H
#define TAH_JOBFILE_H

#include <stddef.h>

#include "linkspec.h"  /* linkspec_t */
#include "trainopts.h" /* trainopts_t */

typedef struct job_spec {
    trainopts_t t;
    char name[128];
    int checkpoint_every;
    linkspec_t link_rate;  /* Mbit/s per directed link (0: unshaped) */
    linkspec_t link_delay; /* ms per directed link (0: none) */
    double max_norm_ratio; /* 0: no norm bound */
    int max_bad_frames;    /* 0: never evict */
    int max_recoveries;    /* 0: a lost node fails the job */
    double stall_timeout;  /* s without progress before a rollback; 0: never; JOB_STALL_AUTO */
} job_spec_t;

#define JOB_DEFAULT_MAX_NORM_RATIO 1000.0
#define JOB_DEFAULT_MAX_BAD_FRAMES 10
#define JOB_DEFAULT_MAX_RECOVERIES 20
#define JOB_STALL_AUTO (-1.0)      /* stall_timeout = auto */
#define JOB_STALL_AUTO_FIRST 300.0 /* auto: before a placement's first step report */
#define JOB_STALL_AUTO_NEXT 60.0   /* auto: after it */

/* The stall limit in seconds (0: no watchdog) for a job's stall_timeout t,
 * whether its current placement has reported a step yet, and the slowest
 * step seen (s): t, or JOB_STALL_AUTO_FIRST / _NEXT for auto, or 20 *
 * slowest if that is more. */
double jobfile_stall_limit(double t, int reported, double slowest);

/* 0, or TAH_EINVAL with "FNAME:LINE: message" in err. */
int jobfile_parse(const char *text, const char *fname, job_spec_t *j, char *err, size_t errlen);
/* Resolve path against base_dir (absolute paths unchanged). */
void jobfile_resolve(const char *base_dir, const char *path, char *out, size_t outlen);
/* Every input file named by the job exists and is readable. */
int jobfile_check_files(const job_spec_t *j, const char *base_dir, char *err, size_t errlen);

#endif
