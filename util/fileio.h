/* fileio.h — whole-file reads with a size limit, and atomic writes.
 *
 * tah_file_read reads a regular file into a malloc'd buffer (caller frees),
 * refusing files larger than max_bytes. tah_file_write_atomic writes to
 * PATH.tmp.PID, fsyncs, renames over PATH and fsyncs the directory, so a
 * reader sees the old file or the new one, never a half-written one; on any
 * failure the temporary file is removed. Both return 0 or a negative TAH_E*
 * code and fill err with the path and the system's reason. */
#ifndef TAH_FILEIO_H
#define TAH_FILEIO_H

#include <stddef.h>
#include <stdint.h>

int tah_file_read(const char *path, uint64_t max_bytes, uint8_t **data, size_t *len, char *err, size_t errlen);

/* Write the concatenation of nparts buffers. */
int tah_file_write_atomic(const char *path, const void *const *parts, const size_t *sizes, int nparts, char *err,
                          size_t errlen);
/* The same with the file's mode set exactly (fchmod before the rename, so
 * a secret written with 0600 is never readable by others, whatever the
 * umask). tah_file_write_atomic uses 0644. */
int tah_file_write_atomic_mode(const char *path, const void *const *parts, const size_t *sizes, int nparts,
                               unsigned mode, char *err, size_t errlen);

#endif
