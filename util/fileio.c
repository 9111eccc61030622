/* fileio.c — bounded reads and write-fsync-rename writes. */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h" /* TAH_E* */

int tah_file_read(const char *path, uint64_t max_bytes, uint8_t **data, size_t *len, char *err, size_t errlen)
{
    int rc = TAH_EIO;
    uint8_t *buf = NULL;
    int fd = open(path, O_RDONLY);
    *data = NULL;
    *len = 0;
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return TAH_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        goto out;
    }
    if ((uint64_t)st.st_size > max_bytes) {
        snprintf(err, errlen, "%s: %" PRIu64 " bytes, more than the limit of %" PRIu64, path,
                 (uint64_t)st.st_size, max_bytes);
        rc = TAH_ESIZE;
        goto out;
    }
    size_t n = (size_t)st.st_size;
    buf = malloc(n ? n : 1);
    if (!buf) {
        snprintf(err, errlen, "%s: cannot allocate %zu bytes", path, n);
        rc = TAH_ENOMEM;
        goto out;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(err, errlen, "%s: read failed after %zu of %zu bytes: %s", path, got, n,
                     r < 0 ? strerror(errno) : "file shrank");
            goto out;
        }
        got += (size_t)r;
    }
    *data = buf;
    *len = n;
    buf = NULL;
    rc = 0;
out:
    free(buf);
    close(fd);
    return rc;
}

static int s_write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int tah_file_write_atomic(const char *path, const void *const *parts, const size_t *sizes, int nparts, char *err,
                          size_t errlen)
{
    return tah_file_write_atomic_mode(path, parts, sizes, nparts, 0644, err, errlen);
}

int tah_file_write_atomic_mode(const char *path, const void *const *parts, const size_t *sizes, int nparts,
                               unsigned mode, char *err, size_t errlen)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp) {
        snprintf(err, errlen, "%s: path too long", path);
        return TAH_EINVAL;
    }
    unlink(tmp); /* a stale one may have a wider mode */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, (mode_t)mode);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        return TAH_EIO;
    }
    if (fchmod(fd, (mode_t)mode) != 0) { /* exact mode, whatever the umask */
        snprintf(err, errlen, "%s: chmod failed: %s", tmp, strerror(errno));
        goto fail;
    }
    for (int i = 0; i < nparts; i++) {
        if (s_write_all(fd, parts[i], sizes[i]) != 0) {
            snprintf(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
            goto fail;
        }
    }
    if (fsync(fd) != 0) {
        snprintf(err, errlen, "%s: fsync failed: %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        snprintf(err, errlen, "%s: close failed: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
        goto fail;
    }
    /* make the rename itself durable */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = '\0';
    else
        strcpy(dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return TAH_EIO;
}
