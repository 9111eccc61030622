/* client.h — the tah-coord subcommands that talk to a running coordinator:
 * submit, status, cancel, wait. Each opens one DEALER socket, sends one
 * request and waits for the answer (timeout_ms); the return value is the
 * process exit status (0 ok, 1 runtime error / job not successful). */
#ifndef TAH_COORD_CLIENT_H
#define TAH_COORD_CLIENT_H

#include <stdint.h>

#include "wire.h" /* Tah__Envelope */

typedef struct coord_client_opts {
    const char *coordinator; /* HOST:PORT */
    const char *coordinator_key; /* secure coordinator: its public key (Z85 or file), or NULL */
    const char *key;         /* with coordinator_key: our secret key file (the admin key) */
    int timeout_ms;
    int json;
} coord_client_opts_t;

int coord_submit(const coord_client_opts_t *o, const char *job_file);
int coord_status(const coord_client_opts_t *o, uint64_t job);
int coord_cancel(const coord_client_opts_t *o, uint64_t job);
int coord_wait(const coord_client_opts_t *o, uint64_t job);
/* Ask the coordinator for a join token for job, valid expires_s seconds;
 * prints it on stdout. */
int coord_token_create(const coord_client_opts_t *o, uint64_t job, int64_t expires_s);

/* Library forms (for `tah-coord experiment`): submit ini text whose
 * relative paths start at base_dir (absolute) -> 0 and *job, or a negative
 * TAH_E* code after printing why; status of one job (0: all) -> the reply
 * (free with wire_envelope_free), or NULL after printing why. */
int coord_submit_ini(const coord_client_opts_t *o, const char *ini, const char *base_dir, const char *fname,
                     uint64_t *job);
Tah__Envelope *coord_status_get(const coord_client_opts_t *o, uint64_t job);

#endif
