/* crc32c.h — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the
 * checksum of codec frames and checkpoints. crc32c_update(0, p, n) is the
 * CRC of p[0..n); pass a previous result to continue over more bytes.
 * Uses the SSE4.2 instruction when the compiler targets it, else tables;
 * both give the same value. */
#ifndef TAH_CRC32C_H
#define TAH_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t crc32c_update(uint32_t crc, const void *data, size_t n);

#endif
