/* fuzz_decode.c — libFuzzer target for the codec frame decoder.
 *
 * Each input is decoded twice: as it is (exercising the header checks) and
 * with its CRC-32C rewritten to match (so mutations reach the per-codec
 * payload parsers behind the checksum). Decoding must either succeed with
 * finite output or fail with an error; ASan/UBSan catch everything else. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "crc32c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void s_try(const uint8_t *data, size_t size)
{
    codec_frame_info_t info;
    if (codec_frame_info(data, size, &info, NULL, 0) != 0)
        return;
    if (info.nelems > ((uint64_t)1 << 24)) /* keep the fuzzer's memory bounded */
        return;
    float *out = malloc(info.nelems * sizeof *out);
    if (!out)
        return;
    char err[CODEC_ERRLEN];
    if (codec_decode(data, size, out, info.nelems, NULL, err, sizeof err) == 0)
        for (uint64_t i = 0; i < info.nelems; i++)
            if (!isfinite(out[i]))
                abort(); /* the decoder promised finite output */
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    s_try(data, size);
    if (size >= CODEC_HEADER_SIZE) {
        uint8_t *copy = malloc(size);
        if (!copy)
            return 0;
        memcpy(copy, data, size);
        uint32_t c = crc32c_update(0, copy, 60);
        c = crc32c_update(c, copy + CODEC_HEADER_SIZE, size - CODEC_HEADER_SIZE);
        for (int i = 0; i < 4; i++)
            copy[60 + i] = (uint8_t)(c >> (8 * i));
        s_try(copy, size);
        free(copy);
    }
    return 0;
}
