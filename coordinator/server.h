/* server.h — `tah-coord serve`: the coordinator daemon.
 *
 * One ROUTER socket on --listen; nodes (DEALER) and CLI clients (DEALER)
 * talk to it with tah.Envelope messages (proto/tah.proto). State lives in
 * STATE_DIR/coord.db (store.h); the bound endpoint is written to
 * STATE_DIR/endpoint (useful with port 0); per-job metrics go to
 * STATE_DIR/jobs/<id>/metrics.jsonl unless the job sets `metrics`.
 *
 * Node state machine (event -> action):
 *   (unknown) --hello-------> IDLE        welcome; try placement
 *   IDLE      --placement---> BUSY        assign sent
 *   BUSY      --job_event---> IDLE        done: count; failed: job failed, abort the others
 *   IDLE/BUSY --silence-----> LOST        BUSY: job "failed: node X lost at step N", abort the others
 *   LOST      --hello-------> IDLE
 *   any       --heartbeat---> (same)      last_seen = now
 * Job state machine:
 *   queued --S idle nodes--> running --all stages done--> succeeded
 *   running --node lost / node failed--> failed
 *   queued|running --cancel--> cancelled
 * A coordinator restart keeps every job; jobs that were running are marked
 * failed ("coordinator restarted"), queued jobs stay queued.
 *
 * Secure mode (the default; --open turns it off): the ROUTER is a CURVE
 * server with STATE_DIR/coord.key; a ZAP handler maps each connection's
 * CURVE key to the User-Id of its messages. submit/status/cancel/token
 * are accepted only from the admin key (STATE_DIR/admin.key). A hello is
 * accepted with a valid join token (token.h), which puts the node's key on
 * the token's job allowlist (table allow), or from a key already on an
 * allowlist; a job is placed only on nodes on its allowlist. Assign names
 * the CURVE key of every stage's node, so that nodes admit only their
 * neighbours on the data plane (node/agent.c). */
#ifndef TAH_COORD_SERVER_H
#define TAH_COORD_SERVER_H

#include <stddef.h>

typedef struct coord_serve_opts {
    const char *listen;   /* HOST:PORT */
    const char *state_dir;
    double node_timeout;  /* seconds of silence before a node is lost */
    int open;             /* 1: plaintext, any node admitted (--open); 0: secure */
} coord_serve_opts_t;

/* Create what is missing of STATE_DIR/coord.{key,pub} (the coordinator's
 * CURVE pair), STATE_DIR/admin.{key,pub} (the key CLI commands must use)
 * and STATE_DIR/token.secret (join-token HMAC key); secrets are 0600.
 * 0 or a negative TAH_E* code with err filled. */
int coord_keygen(const char *state_dir, char *err, size_t errlen);

/* Runs until SIGINT/SIGTERM. 0 on a clean shutdown, 1 on a startup error. */
int coord_serve(const coord_serve_opts_t *o);

#endif
