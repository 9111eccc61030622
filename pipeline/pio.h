/* pio.h — whole-file reads and atomic writes for the pipeline's file formats.
 *
 * pio_atomic_*: write to PATH.tmp.XXXXXX in the same directory, then
 * fflush + fsync + rename over PATH + fsync of the directory, so a reader
 * sees either the old file or the complete new one, never a half-written
 * file. On any failure the temporary file is removed.
 *
 * Memory: pio_read_all returns a malloc'd buffer the caller frees. */
#ifndef TAH_PIO_H
#define TAH_PIO_H

#include <stddef.h>
#include <stdio.h>

typedef struct pio_atomic {
    FILE *f;          /* open on the temporary file */
    char *tmp_path;   /* malloc'd */
    char *final_path; /* malloc'd */
} pio_atomic_t;

/* Open a temporary file next to path. 0 or TAH_EIO/TAH_ENOMEM (err filled). */
int pio_atomic_begin(pio_atomic_t *a, const char *path, char *err, size_t errlen);
/* Write n bytes; 0 or TAH_EIO. */
int pio_atomic_write(pio_atomic_t *a, const void *data, size_t n, char *err, size_t errlen);
/* Flush, fsync, rename into place. On failure the temporary is removed. */
int pio_atomic_commit(pio_atomic_t *a, char *err, size_t errlen);
/* Close and remove the temporary file (safe to call after a failed commit). */
void pio_atomic_abort(pio_atomic_t *a);

/* Read a whole file. *buf is malloc'd (NUL-terminated for convenience,
 * terminator not counted in *len). 0, TAH_EIO or TAH_ENOMEM. */
int pio_read_all(const char *path, unsigned char **buf, size_t *len, char *err, size_t errlen);

#endif
