/* token.h — join tokens: `tah-coord token create --job J --expires D`.
 *
 * A token is the text  tah1.JOB.EXPIRY.NONCE.MAC  where JOB is the job id
 * (decimal), EXPIRY a Unix time in seconds (decimal), NONCE 16 random bytes
 * and MAC = HMAC-SHA256(secret, "tah-join-v1|JOB|EXPIRY|NONCE") (both hex,
 * lower case). The 32-byte secret lives in STATE_DIR/token.secret (hex,
 * mode 0600, created on first use). Verification recomputes the MAC and
 * compares it with CRYPTO_memcmp (constant time), then checks the expiry.
 * Tokens are bearer secrets until they expire: whoever holds one may put
 * one key on the job's allowlist. */
#ifndef TAH_COORD_TOKEN_H
#define TAH_COORD_TOKEN_H

#include <stddef.h>
#include <stdint.h>

#define TOKEN_SECRET_LEN 32
#define TOKEN_MAX_LEN 160

/* Load STATE_DIR/token.secret, creating it (0600) if missing; refused when
 * group/world-readable. */
int token_secret_load(const char *state_dir, uint8_t secret[TOKEN_SECRET_LEN], char *err, size_t errlen);

/* A token for job that expires at `expires` (Unix seconds). */
int token_create(const uint8_t secret[TOKEN_SECRET_LEN], uint64_t job, int64_t expires, char *out, size_t outlen);

/* 0 and *job / *expires when the token is well formed, its MAC is right and
 * it has not expired at `now`; a negative TAH_E* code and why otherwise. */
int token_verify(const uint8_t secret[TOKEN_SECRET_LEN], const char *token, int64_t now, uint64_t *job,
                 int64_t *expires, char *why, size_t whylen);

/* A duration such as 90, 90s, 30m, 12h, 7d -> seconds (> 0), or -1. */
int64_t token_parse_duration(const char *s);

#endif
