/* errors.c — names of the TAH_E* codes. */
#include "errors.h"

const char *tah_strerror(int code)
{
    switch (code) {
    case TAH_OK: return "ok";
    case TAH_EINVAL: return "invalid argument";
    case TAH_ENOMEM: return "out of memory";
    case TAH_EIO: return "i/o error";
    case TAH_ETRUNC: return "truncated input";
    case TAH_EMAGIC: return "bad magic";
    case TAH_EVERSION: return "unsupported version";
    case TAH_ECODEC: return "unknown codec";
    case TAH_EPARAM: return "codec parameter out of range";
    case TAH_ESHAPE: return "bad shape";
    case TAH_ESIZE: return "size mismatch";
    case TAH_ECHECKSUM: return "checksum mismatch";
    case TAH_ENONFINITE: return "non-finite value";
    case TAH_ECORRUPT: return "corrupt content";
    case TAH_ERANGE: return "value out of range";
    case TAH_ESPACE: return "output buffer too small";
    case TAH_EDEVICE: return "device (CUDA) error";
    default: return "unknown error";
    }
}
