/* pio.c — whole-file reads and atomic (write, fsync, rename) writes. */
#include "pio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* fsync, close, unlink */

#include "errors.h"

static char *s_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static void s_fsync_dir(const char *path)
{
    char *dir = s_strdup(path);
    if (!dir)
        return;
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash == dir)
        d = "/";
    else if (slash) {
        *slash = '\0';
        d = dir;
    }
    int fd = open(d, O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

int pio_atomic_begin(pio_atomic_t *a, const char *path, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    size_t n = strlen(path);
    char *final_path = s_strdup(path);
    char *tmp_path = malloc(n + 16);
    if (!final_path || !tmp_path) {
        free(final_path);
        free(tmp_path);
        if (err)
            snprintf(err, errlen, "%s: out of memory", path);
        return TAH_ENOMEM;
    }
    snprintf(tmp_path, n + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp_path);
    if (fd < 0) {
        if (err)
            snprintf(err, errlen, "%s: cannot create temporary file: %s", path, strerror(errno));
        free(final_path);
        free(tmp_path);
        return TAH_EIO;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        if (err)
            snprintf(err, errlen, "%s: fdopen: %s", tmp_path, strerror(errno));
        close(fd);
        unlink(tmp_path);
        free(final_path);
        free(tmp_path);
        return TAH_EIO;
    }
    a->f = f;
    a->tmp_path = tmp_path;
    a->final_path = final_path;
    return 0;
}

int pio_atomic_write(pio_atomic_t *a, const void *data, size_t n, char *err, size_t errlen)
{
    if (n && fwrite(data, 1, n, a->f) != n) {
        if (err)
            snprintf(err, errlen, "%s: write failed: %s", a->final_path, strerror(errno));
        return TAH_EIO;
    }
    return 0;
}

int pio_atomic_commit(pio_atomic_t *a, char *err, size_t errlen)
{
    int rc = 0;
    if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0) {
        if (err)
            snprintf(err, errlen, "%s: flush/fsync failed: %s", a->final_path, strerror(errno));
        rc = TAH_EIO;
        goto out;
    }
    FILE *f = a->f;
    a->f = NULL;
    if (fclose(f) != 0) {
        if (err)
            snprintf(err, errlen, "%s: close failed: %s", a->final_path, strerror(errno));
        rc = TAH_EIO;
        goto out;
    }
    if (rename(a->tmp_path, a->final_path) != 0) {
        if (err)
            snprintf(err, errlen, "%s: rename from %s failed: %s", a->final_path, a->tmp_path,
                     strerror(errno));
        rc = TAH_EIO;
        goto out;
    }
    s_fsync_dir(a->final_path);
    free(a->tmp_path);
    a->tmp_path = NULL;
out:
    pio_atomic_abort(a);
    return rc;
}

void pio_atomic_abort(pio_atomic_t *a)
{
    if (a->f) {
        fclose(a->f);
        a->f = NULL;
    }
    if (a->tmp_path) {
        unlink(a->tmp_path);
        free(a->tmp_path);
        a->tmp_path = NULL;
    }
    free(a->final_path);
    a->final_path = NULL;
}

int pio_read_all(const char *path, unsigned char **buf, size_t *len, char *err, size_t errlen)
{
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (err)
            snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return TAH_EIO;
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *b = malloc(cap + 1);
    int rc = 0;
    while (b) {
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (n < cap) {
            if (ferror(f)) {
                if (err)
                    snprintf(err, errlen, "%s: read failed: %s", path, strerror(errno));
                rc = TAH_EIO;
            }
            break;
        }
        unsigned char *nb = realloc(b, 2 * cap + 1);
        if (!nb) {
            free(b);
            b = NULL;
            break;
        }
        b = nb;
        cap *= 2;
    }
    fclose(f);
    if (!b) {
        if (err)
            snprintf(err, errlen, "%s: out of memory reading file", path);
        return TAH_ENOMEM;
    }
    if (rc) {
        free(b);
        return rc;
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return 0;
}
