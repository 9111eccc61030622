/* client.h — the tah-coord subcommands that talk to a running coordinator:
 * submit, status, cancel, wait. Each opens one DEALER socket, sends one
 * request and waits for the answer (timeout_ms); the return value is the
 * process exit status (0 ok, 1 runtime error / job not successful). */
#ifndef TAH_COORD_CLIENT_H
#define TAH_COORD_CLIENT_H

#include <stdint.h>

typedef struct coord_client_opts {
    const char *coordinator; /* HOST:PORT */
    int timeout_ms;
    int json;
} coord_client_opts_t;

int coord_submit(const coord_client_opts_t *o, const char *job_file);
int coord_status(const coord_client_opts_t *o, uint64_t job);
int coord_cancel(const coord_client_opts_t *o, uint64_t job);
int coord_wait(const coord_client_opts_t *o, uint64_t job);

#endif
