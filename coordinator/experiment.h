/* experiment.h — `tah-coord experiment`: a job swept over link settings
 * and codecs on a running coordinator, with a CSV, a Markdown table and
 * PNG plots of the results.
 *
 *   tah-coord experiment --coordinator HOST:PORT EXPERIMENT.ini [--out DIR]
 *
 * EXPERIMENT.ini holds a [job] section (the keys of a job file, jobfile.h)
 * and a [sweep] section:
 *   bandwidths     points separated by spaces, each a link spec in Mbit/s
 *                  (linkspec.h): "none 50 100 300 1000", "50/20" (forward /
 *                  backward), "0>1:50,1>0:20,1>2:100,2>1:100,2>3:50,3>2:50"
 *                  (per directed stage link; asymmetric)    default none
 *   delays         one-way delays in ms, same grammar        default 0
 *   codecs         FWD/BWD codec spec pairs separated by spaces, e.g.
 *                  "fp32/fp32 fp16/fp16 tah/fixpt:bits=8"    default the job's
 *   micro_batches  list of M                                 default the job's
 *   steps          steps per point                           default the job's
 *   shaping        netlab | inprocess | none                 default inprocess
 *                  netlab: the nodes run in scripts/netlab namespaces (their
 *                  data endpoint is their namespace address); before each
 *                  point this command calls `netlab shape` for every link
 *                  between the stages' namespaces (needs root). inprocess:
 *                  the job carries link_rate_mbps and the nodes shape their
 *                  own sends. none: bandwidths must be none.
 *                  Delays are always added by the nodes (link_delay_ms; the
 *                  lab has no netem), reported as "in-process (no netem)".
 *   netlab         path of scripts/netlab    default $TAH_NETLAB or scripts/netlab
 *   baseline       codec pair speedups are measured against (default
 *                  fp32/fp32 when swept, else the first pair)
 *   warmup_steps   first steps left out of tokens/s (default 1); steps that
 *                  ran validation are left out too
 *   output         output directory (default EXPERIMENT.out next to the file;
 *                  --out wins)
 * Relative paths are relative to the experiment file. Errors name the file
 * and line; exit 2 for a bad command line or experiment file, 1 when a
 * point failed or the coordinator cannot be reached, 0 otherwise.
 *
 * Output (DIR): results.csv (one row per point, written as points finish),
 * table.md (per delay and M: rows codecs, columns bandwidths, tokens/s and
 * speedup against the baseline; share of the unthrottled throughput; bytes
 * and loss per codec), throughput.png and loss.png (gnuplot; skipped with a
 * warning when gnuplot is missing), curves/pN.dat (step, loss, time_s) and
 * points/pN.ini (the job file each point ran). Metrics are read from the
 * path the coordinator reports, so run this where that path is visible. */
#ifndef TAH_COORD_EXPERIMENT_H
#define TAH_COORD_EXPERIMENT_H

#include "client.h" /* coord_client_opts_t */

int coord_experiment(const coord_client_opts_t *o, const char *file, const char *out_dir);

#endif
