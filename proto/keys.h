/* keys.h — long-term CURVE keys of nodes and the coordinator (ZeroMQ
 * CURVE: Curve25519 keys, Z85-encoded as 40 characters).
 *
 * Files: NAME.key holds the secret key (one Z85 line, mode 0600, written
 * atomically); NAME.pub holds the public key (one Z85 line, 0644). A
 * secret key file that its group or others may read is refused. The
 * public key is always derived from the secret key (zmq_curve_public), so
 * a .key file alone is a complete identity.
 *
 * Every function returns 0 or a negative TAH_E* code and fills err with
 * the path, what failed and a hint. */
#ifndef TAH_KEYS_H
#define TAH_KEYS_H

#include <stddef.h>

#define KEYS_Z85_LEN 40

typedef struct keys_pair {
    char pub[KEYS_Z85_LEN + 1];
    char sec[KEYS_Z85_LEN + 1];
} keys_pair_t;

/* Whether libzmq has CURVE (zmq_has("curve")); err says how to fix it. */
int keys_curve_available(char *err, size_t errlen);

/* A fresh pair (zmq_curve_keypair). */
int keys_new(keys_pair_t *kp, char *err, size_t errlen);

/* Write DIR/NAME.key (0600) and DIR/NAME.pub (0644); DIR is created
 * (0700) if missing. Existing files are replaced. */
int keys_write(const char *dir, const char *name, const keys_pair_t *kp, char *err, size_t errlen);

/* Read a secret key file (refused when group/world-readable) into kp. */
int keys_read_secret(const char *path, keys_pair_t *kp, char *err, size_t errlen);

/* A public key given as 40 Z85 characters or as a file holding them. */
int keys_read_public(const char *arg, char pub[KEYS_Z85_LEN + 1], char *err, size_t errlen);

/* Make sock a CURVE client of the server whose public key is server_pub,
 * with our pair kp. Call before zmq_connect. */
int keys_set_client(void *sock, const char *server_pub, const keys_pair_t *kp, char *err, size_t errlen);

/* Make sock a CURVE server with our pair kp. Call before zmq_bind. */
int keys_set_server(void *sock, const keys_pair_t *kp, char *err, size_t errlen);

#endif
