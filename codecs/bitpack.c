/* bitpack.c — b-bit code packing. Eight codes of b <= 8 bits are exactly b
 * bytes, so the main loop moves whole groups of eight through one uint64. */
#include "bitpack.h"

#include <string.h>

void bitpack_pack(uint8_t *dst, const uint16_t *codes, size_t n, unsigned bits)
{
    const uint32_t mask = (1u << bits) - 1u;
    size_t i = 0;
    if (bits <= 8) {
        for (; i + 8 <= n; i += 8) {
            uint64_t v = 0;
            for (unsigned k = 0; k < 8; k++)
                v |= (uint64_t)(codes[i + k] & mask) << (k * bits);
            for (unsigned k = 0; k < bits; k++)
                dst[k] = (uint8_t)(v >> (8 * k));
            dst += bits;
        }
    }
    /* tail (and every code for bits > 8): bit accumulator */
    uint64_t acc = 0;
    unsigned have = 0;
    for (; i < n; i++) {
        acc |= (uint64_t)(codes[i] & mask) << have;
        have += bits;
        while (have >= 8) {
            *dst++ = (uint8_t)acc;
            acc >>= 8;
            have -= 8;
        }
    }
    if (have > 0)
        *dst = (uint8_t)acc;
}

void bitpack_unpack(uint16_t *codes, const uint8_t *src, size_t n, unsigned bits)
{
    const uint32_t mask = (1u << bits) - 1u;
    size_t i = 0;
    if (bits <= 8) {
        for (; i + 8 <= n; i += 8) {
            uint64_t v = 0;
            for (unsigned k = 0; k < bits; k++)
                v |= (uint64_t)src[k] << (8 * k);
            for (unsigned k = 0; k < 8; k++)
                codes[i + k] = (uint16_t)((v >> (k * bits)) & mask);
            src += bits;
        }
    }
    uint64_t acc = 0;
    unsigned have = 0;
    for (; i < n; i++) {
        while (have < bits) {
            acc |= (uint64_t)(*src++) << have;
            have += 8;
        }
        codes[i] = (uint16_t)(acc & mask);
        acc >>= bits;
        have -= bits;
    }
}
