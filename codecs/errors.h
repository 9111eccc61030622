/* errors.h — the project's error codes (lowest layer; every module returns these).
 *
 * Contract: library functions return 0 on success or one of the negative
 * TAH_E* codes below; tah_strerror() names a code for messages. Codes are
 * stable: they appear in logs and in the control protocol. */
#ifndef TAH_ERRORS_H
#define TAH_ERRORS_H

enum {
    TAH_OK = 0,
    TAH_EINVAL = -1,     /* invalid argument or parameter */
    TAH_ENOMEM = -2,     /* allocation failed */
    TAH_EIO = -3,        /* read/write/fsync/rename failed */
    TAH_ETRUNC = -4,     /* input shorter than its header says */
    TAH_EMAGIC = -5,     /* wrong magic number */
    TAH_EVERSION = -6,   /* unsupported format version */
    TAH_ECODEC = -7,     /* unknown codec id or name */
    TAH_EPARAM = -8,     /* codec parameter out of range */
    TAH_ESHAPE = -9,     /* shape empty, absurd, or not matching */
    TAH_ESIZE = -10,     /* byte length does not match what the header implies */
    TAH_ECHECKSUM = -11, /* checksum mismatch */
    TAH_ENONFINITE = -12,/* NaN or Inf where a finite value is required */
    TAH_ECORRUPT = -13,  /* internally inconsistent content (bad metadata) */
    TAH_ERANGE = -14,    /* value out of representable range */
    TAH_ESPACE = -15,    /* output buffer too small */
    TAH_EDEVICE = -16,   /* GPU runtime error (CUDA call or kernel launch failed) */
};

/* Short, static description of a TAH_E* code ("checksum mismatch"). */
const char *tah_strerror(int code);

#endif
