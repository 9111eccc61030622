/* cu_codec.h — GPU encoders and decoders of the codec payloads (libtahcuda).
 *
 * What it does: the same payloads as the CPU codecs (codecs/codec.h,
 * docs/codecs.md), produced and consumed in device memory, so a GPU node
 * and a CPU node read each other's frames. A frame is the 64-byte header
 * followed by the payload; the GPU writes and reads only the payload:
 *
 *   encode:  cu_codec_encode(d_x -> d_payload)   copy payload to host at
 *            frame + 64, then codec_frame_seal() writes header and CRC.
 *   decode:  codec_frame_info() checks header and CRC on the host, copy
 *            frame + 64 to d_payload, cu_codec_decode(d_payload -> d_out).
 *
 * Bit-exactness with the CPU codecs (tests/test_cu_codec.c checks it):
 * fp32/fp16/bf16, fixpt (nearest and stochastic), int, ash-fp8 and tah
 * encoders write the same bytes as the CPU for finite input, and the
 * decoders the same floats: the kernels do the CPU's float operations in
 * the CPU's order where the order matters (the RMS sum of ash-fp8, TAH's
 * 16-lane entropy sums, every Hadamard butterfly), and this file is built
 * without FMA contraction like the C code.
 *
 * Calls are asynchronous on `stream`. Errors the host can see (bad spec or
 * shape, a CUDA call or launch that failed) are returned at once, with a
 * message in err. Errors only the kernels can see (non-finite input,
 * TAH_ERANGE, corrupt payload metadata, non-finite decoded values) are
 * recorded in the scratch buffer's status word, tagged with the call (no
 * per-call memset): cu_codec_status() synchronises the stream and returns
 * those of the last call made with that scratch. The contents of the output
 * are unspecified when the status is an error.
 *
 * Memory: the caller owns every buffer. d_scratch holds at least
 * cu_codec_scratch_bytes(spec, shape) bytes of device memory, 256-byte
 * aligned (cudaMalloc's), used by one call at a time. Pointers to x, out
 * and payload may have any alignment (16-byte aligned ones take the wide
 * vector paths). No call allocates. */
#ifndef TAH_CU_CODEC_H
#define TAH_CU_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h> /* cudaStream_t */

#include "codec.h" /* codec_spec_t, codec_shape_t, TAH_E* */

#ifdef __cplusplus
extern "C" {
#endif

/* Element type of an encoder's input in device memory. A bf16 element is
 * read as its exact float value, so encoding bf16 input writes the payload
 * codec_encode() writes for the widened floats. */
typedef enum cu_dtype { CU_F32 = 0, CU_BF16 = 1 } cu_dtype_t;

/* Device scratch bytes needed by encode and decode of (spec, shape), or 0
 * if the spec or shape is invalid. */
size_t cu_codec_scratch_bytes(const codec_spec_t *spec, codec_shape_t shape);

/* The same for an encode of input type xt. tah reads bf16 in its own
 * kernels where its default encode applies (k_tah_spec: 64-element tiles,
 * C a multiple of 64, 16-byte aligned input) and otherwise widens bf16 input
 * into the scratch first, which this reserves (4 bytes per element more);
 * every other codec reads bf16 in its own kernels and needs what
 * cu_codec_scratch_bytes says. */
size_t cu_codec_scratch_bytes_x(const codec_spec_t *spec, codec_shape_t shape, cu_dtype_t xt);

/* Encode B*S*C floats at d_x (device, row-major (B,S,C)) into exactly
 * codec_frame_size() - 64 payload bytes at d_payload (device). */
int cu_codec_encode(const codec_spec_t *spec, codec_shape_t shape, const float *d_x, uint8_t *d_payload,
                    void *d_scratch, cudaStream_t stream, char *err, size_t errlen);

/* Encode B*S*C elements of type xt at d_x; d_scratch holds at least
 * cu_codec_scratch_bytes_x(spec, shape, xt) bytes. */
int cu_codec_encode_x(const codec_spec_t *spec, codec_shape_t shape, cu_dtype_t xt, const void *d_x,
                      uint8_t *d_payload, void *d_scratch, cudaStream_t stream, char *err, size_t errlen);

/* Decode a payload (device; its frame header already validated on the
 * host) into B*S*C floats at d_out (device). */
int cu_codec_decode(const codec_spec_t *spec, codec_shape_t shape, const uint8_t *d_payload, float *d_out,
                    void *d_scratch, cudaStream_t stream, char *err, size_t errlen);

/* Synchronise `stream`, then return what the last encode or decode on
 * d_scratch found: 0, TAH_ENONFINITE, TAH_ERANGE or TAH_ECORRUPT (with a
 * message), or TAH_EDEVICE when the synchronisation reports a CUDA error. */
int cu_codec_status(const void *d_scratch, cudaStream_t stream, char *err, size_t errlen);

/* E4M3 bytes of n floats with the hardware conversion the ash-fp8 encoder
 * uses (round to nearest even, saturating); exposed so the tests can
 * compare it with codecs/fp8.c on every float. */
int cu_fp8_e4m3_from_f32_n(const float *d_x, uint8_t *d_q, size_t n, cudaStream_t stream);

/* fp16 bits of n floats rounded down (dir < 0), to nearest even (0) or up
 * (dir > 0) as the kernels round the codecs' fp16 fields; exposed so the
 * tests can compare them with codecs/half.c on every float. */
int cu_half_from_f32_n(const float *d_x, uint16_t *d_h, size_t n, int dir, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
