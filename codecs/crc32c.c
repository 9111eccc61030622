/* crc32c.c — CRC-32C, hardware or slicing-by-8. */
#include "crc32c.h"

#include <string.h>

#if defined(__SSE4_2__) && defined(__x86_64__)
#include <nmmintrin.h>

uint32_t crc32c_update(uint32_t crc, const void *data, size_t n)
{
    const uint8_t *p = data;
    uint64_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
    }
    uint32_t c32 = (uint32_t)c;
    for (; n > 0; n--, p++)
        c32 = _mm_crc32_u8(c32, *p);
    return ~c32;
}

#else
#include <threads.h> /* call_once */

static uint32_t s_table[8][256];
static once_flag s_once = ONCE_FLAG_INIT;

static void s_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        s_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            s_table[t][i] = (s_table[t - 1][i] >> 8) ^ s_table[0][s_table[t - 1][i] & 0xffu];
}

uint32_t crc32c_update(uint32_t crc, const void *data, size_t n)
{
    call_once(&s_once, s_init);
    const uint8_t *p = data;
    uint32_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = s_table[7][lo & 0xff] ^ s_table[6][(lo >> 8) & 0xff] ^ s_table[5][(lo >> 16) & 0xff] ^
            s_table[4][lo >> 24] ^ s_table[3][hi & 0xff] ^ s_table[2][(hi >> 8) & 0xff] ^
            s_table[1][(hi >> 16) & 0xff] ^ s_table[0][hi >> 24];
    }
    for (; n > 0; n--, p++)
        c = (c >> 8) ^ s_table[0][(c ^ *p) & 0xffu];
    return ~c;
}
#endif
