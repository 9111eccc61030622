/* keys.c — see keys.h. */
#define _XOPEN_SOURCE 700
#include "keys.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include "errors.h" /* TAH_E* */
#include "fileio.h" /* tah_file_read, tah_file_write_atomic_mode */

int keys_curve_available(char *err, size_t errlen)
{
    if (zmq_has("curve"))
        return 0;
    snprintf(err, errlen,
             "this libzmq has no CURVE support (zmq_has(\"curve\") is false); HINT: install a libzmq built with "
             "libsodium (Debian/Ubuntu libzmq3-dev has it), or run the coordinator with --open on a trusted network");
    return TAH_EINVAL;
}

/* 40 Z85 characters that decode to 32 bytes. */
static int s_valid_z85(const char *s)
{
    if (strlen(s) != KEYS_Z85_LEN)
        return 0;
    uint8_t raw[32];
    return zmq_z85_decode(raw, s) != NULL;
}

int keys_new(keys_pair_t *kp, char *err, size_t errlen)
{
    int rc = keys_curve_available(err, errlen);
    if (rc != 0)
        return rc;
    if (zmq_curve_keypair(kp->pub, kp->sec) != 0) {
        snprintf(err, errlen, "zmq_curve_keypair failed: %s", zmq_strerror(errno));
        return TAH_EIO;
    }
    return 0;
}

int keys_write(const char *dir, const char *name, const keys_pair_t *kp, char *err, size_t errlen)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "%s: cannot create directory: %s", dir, strerror(errno));
        return TAH_EIO;
    }
    char path[4096], line[KEYS_Z85_LEN + 2];
    snprintf(path, sizeof path, "%s/%s.key", dir, name);
    snprintf(line, sizeof line, "%s\n", kp->sec);
    const void *parts[1] = { line };
    size_t sizes[1] = { KEYS_Z85_LEN + 1 };
    int rc = tah_file_write_atomic_mode(path, parts, sizes, 1, 0600, err, errlen);
    if (rc != 0)
        return rc;
    snprintf(path, sizeof path, "%s/%s.pub", dir, name);
    snprintf(line, sizeof line, "%s\n", kp->pub);
    return tah_file_write_atomic_mode(path, parts, sizes, 1, 0644, err, errlen);
}

/* The first line of a small file, without its newline. */
static int s_read_line(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = tah_file_read(path, 4096, &data, &len, err, errlen);
    if (rc != 0)
        return rc;
    size_t n = 0;
    while (n < len && data[n] != '\n' && data[n] != '\r')
        n++;
    if (n >= outlen) {
        free(data);
        snprintf(err, errlen, "%s: not a Z85 key (the first line has %zu characters, expected %d)", path, n,
                 KEYS_Z85_LEN);
        return TAH_EINVAL;
    }
    memcpy(out, data, n);
    out[n] = 0;
    free(data);
    return 0;
}

int keys_read_secret(const char *path, keys_pair_t *kp, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: cannot read secret key: %s; HINT: tah-node keygen --out DIR", path,
                 strerror(errno));
        return TAH_EIO;
    }
    if (st.st_mode & 077) {
        snprintf(err, errlen, "%s: secret key is readable by others (mode %04o); HINT: chmod 600 %s", path,
                 (unsigned)(st.st_mode & 07777), path);
        return TAH_EINVAL;
    }
    char line[64];
    int rc = s_read_line(path, line, sizeof line, err, errlen);
    if (rc != 0)
        return rc;
    if (!s_valid_z85(line)) {
        snprintf(err, errlen, "%s: not a Z85 secret key (expected %d Z85 characters)", path, KEYS_Z85_LEN);
        return TAH_EINVAL;
    }
    memcpy(kp->sec, line, KEYS_Z85_LEN + 1);
    if (zmq_curve_public(kp->pub, kp->sec) != 0) {
        snprintf(err, errlen, "%s: cannot derive the public key: %s", path, zmq_strerror(errno));
        return TAH_EIO;
    }
    return 0;
}

int keys_read_public(const char *arg, char pub[KEYS_Z85_LEN + 1], char *err, size_t errlen)
{
    if (s_valid_z85(arg)) {
        memcpy(pub, arg, KEYS_Z85_LEN + 1);
        return 0;
    }
    char line[64];
    int rc = s_read_line(arg, line, sizeof line, err, errlen);
    if (rc != 0) {
        snprintf(err, errlen, "%s: neither a Z85 public key (%d characters) nor a readable key file", arg,
                 KEYS_Z85_LEN);
        return rc;
    }
    if (!s_valid_z85(line)) {
        snprintf(err, errlen, "%s: not a Z85 public key (expected %d Z85 characters)", arg, KEYS_Z85_LEN);
        return TAH_EINVAL;
    }
    memcpy(pub, line, KEYS_Z85_LEN + 1);
    return 0;
}

int keys_set_client(void *sock, const char *server_pub, const keys_pair_t *kp, char *err, size_t errlen)
{
    int rc = keys_curve_available(err, errlen);
    if (rc != 0)
        return rc;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_pub, KEYS_Z85_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, kp->pub, KEYS_Z85_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, kp->sec, KEYS_Z85_LEN) != 0) {
        snprintf(err, errlen, "CURVE client options: %s", zmq_strerror(errno));
        return TAH_EINVAL;
    }
    return 0;
}

int keys_set_server(void *sock, const keys_pair_t *kp, char *err, size_t errlen)
{
    int rc = keys_curve_available(err, errlen);
    if (rc != 0)
        return rc;
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, kp->sec, KEYS_Z85_LEN) != 0) {
        snprintf(err, errlen, "CURVE server options: %s", zmq_strerror(errno));
        return TAH_EINVAL;
    }
    return 0;
}
