/* bitpack.h — pack unsigned b-bit codes into bytes and back.
 *
 * Layout: little-endian bit stream; code i occupies bits [i*b, (i+1)*b) of the
 * stream, bit k of the stream is bit (k % 8) of byte k / 8. n codes take
 * bitpack_bytes(n, b) = ceil(n*b/8) bytes; unused high bits of the last byte
 * are written as zero. Codes must already be < 2^b (the packer masks them). */
#ifndef TAH_BITPACK_H
#define TAH_BITPACK_H

#include <stddef.h>
#include <stdint.h>

static inline size_t bitpack_bytes(size_t n, unsigned bits) { return (n * bits + 7) / 8; }

/* 1 if the unused high bits of the last byte of n packed codes are zero
 * (what bitpack_pack writes; decoders of untrusted streams check it). */
static inline int bitpack_tail_clear(const uint8_t *src, size_t n, unsigned bits)
{
    unsigned used = (unsigned)((n * bits) & 7u);
    return used == 0 || (src[bitpack_bytes(n, bits) - 1] >> used) == 0;
}

/* bits in 1..16 */
void bitpack_pack(uint8_t *dst, const uint16_t *codes, size_t n, unsigned bits);
void bitpack_unpack(uint16_t *codes, const uint8_t *src, size_t n, unsigned bits);

#endif
