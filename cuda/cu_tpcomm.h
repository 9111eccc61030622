/* cu_tpcomm.h — the tensor-parallel all-reduce of N GPUs that one host
 * thread drives (libtahtpnccl, built when CMake finds NCCL): NCCL's own
 * all-reduce, or the two-shot compressed all-reduce of docs/tp.md with the
 * GPU codecs (cuda/cu_codec.h) and NCCL point-to-point. Used by the CUDA
 * stage at tp > 1 (cuda/cu_stage.cu) and by bench/bench_tp_nccl.cu.
 *
 * A group is N ranks on N distinct devices of this process, one NCCL
 * communicator each (ncclCommInitAll). Every call takes one pointer and one
 * stream per rank (stream r on devices[r]), issues the NCCL calls of all
 * ranks inside one ncclGroupStart/End and the codec kernels rank by rank,
 * and returns when all of it is enqueued: the results are ready in stream
 * order. Calls change the calling thread's current device.
 * cu_tp_new sets NCCL_NVLS_ENABLE=0 (overwriting any value) before NCCL
 * initialises: NVLink multicast must stay off on the machines we run on.
 *
 * cu_tp_allreduce(in -> out, n elements): on return (in stream order) every
 * rank's out holds the same sum of every rank's in.
 *   codec none (rs and ag both id 0): ncclAllReduce (sum) in the buffers'
 *     own type (fp32 or bf16); in and out must have the same type (in == out
 *     is in place).
 *   compressed: two-shot, exactly two compressions per element:
 *     0. in -> fp32 (a bf16 conversion, or the buffer itself when it is
 *        fp32 and n = N*k), zero-padded to N*k, k = ceil(n/N) rounded up to
 *        the codecs' block/group (and 4 floats);
 *     1. rank r encodes chunk j = [j*k, (j+1)*k) once for every j with the
 *        reduce-scatter codec (payload of shape (1,1,k));
 *     2. all-to-all of the payloads (grouped ncclSend/ncclRecv);
 *     3. it decodes the N payloads of chunk r (its own included) and sums
 *        them in fp32 in rank order 0..N-1;
 *     4. it encodes the sum once with the all-gather codec;
 *     5. ncclAllGather of the payloads (in place);
 *     6. it decodes every chunk (its own included: every rank gets the same
 *        bits) into out (converted to bf16 when out is bf16).
 *     A shot whose codec is "none" (id 0) while the other's is not moves raw
 *     fp32 (the fp32 codec). Only payloads travel: the 64-byte frame header
 *     is a pure function of (spec, shape) apart from its CRC, and both ends
 *     agree spec and shape when the group is made. in == out is allowed.
 *   parts (benchmarks): CU_TP_CODEC runs only steps 0,1,3,4,6 (the kernels),
 *   CU_TP_COMM only 2 and 5, CU_TP_ALL everything; codec none ignores it.
 *
 * Errors: host-visible ones (bad arguments, a CUDA or NCCL call that failed)
 * are returned at once with err filled (TAH_EINVAL, TAH_EDEVICE). What only
 * the codec kernels see (a non-finite input or sum, a corrupt payload) is
 * collected on the device into a per-rank sticky word without any
 * synchronisation; cu_tp_status() synchronises the streams and returns it
 * (TAH_ENONFINITE, TAH_ERANGE, TAH_ECORRUPT: the first phase -- input,
 * sum, output -- that saw one, so a NaN input reads as TAH_ENONFINITE, not
 * as the corrupt codes it left) for every compressed all-reduce since its
 * last call; out is then unspecified.
 *
 * Memory: the group owns its device buffers (allocated up front for
 * all-reduces of up to max_n elements: an fp32 copy, the decoded chunks and
 * the payload slots per rank; none for codec none); the caller owns in, out
 * and the streams. No call allocates. */
#ifndef TAH_CU_TPCOMM_H
#define TAH_CU_TPCOMM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h> /* cudaStream_t */

#include "codec.h" /* codec_spec_t */

#ifdef __cplusplus
extern "C" {
#endif

#define CU_TP_MAX 8 /* ranks of a group at most (pipeline/tpcomm.h TP_MAX) */

enum { CU_TP_F32 = 0, CU_TP_BF16 = 1 };                 /* element type of a buffer */
enum { CU_TP_CODEC = 1, CU_TP_COMM = 2, CU_TP_ALL = 3 }; /* parts of the two-shot */

typedef struct cu_tp cu_tp_t;

/* n ranks (1..CU_TP_MAX) on the distinct devices devices[0..n-1]; rs / ag
 * the two shots' codecs (id 0 = none; both none: NCCL's all-reduce).
 * NULL with err filled on failure. */
cu_tp_t *cu_tp_new(int n, const int *devices, const codec_spec_t *rs, const codec_spec_t *ag, size_t max_n,
                   char *err, size_t errlen);
void cu_tp_destroy(cu_tp_t **self_p);
int cu_tp_size(const cu_tp_t *t);
/* 1 when the all-reduce is the compressed two-shot. */
int cu_tp_compressed(const cu_tp_t *t);

/* The two-shot's shape for n elements: chunk k, payload bytes of one chunk
 * per shot, bytes one rank sends per all-reduce (payload slots, its own
 * chunks excluded); for codec none k = n, payloads 0 and wire the ring
 * all-reduce's 2(N-1)/N * n * 4. Any pointer may be NULL. */
void cu_tp_layout(const cu_tp_t *t, size_t n, size_t *chunk, size_t *plen_rs, size_t *plen_ag, size_t *wire);

/* in[r] / out[r]: rank r's device buffers of n (<= max_n) elements of
 * in_type / out_type (CU_TP_F32, CU_TP_BF16); st[r] its stream; id the
 * call's identity: each payload is encoded with tp_chunk_spec(spec, id,
 * ...) (pipeline/tpcomm.h), so a stochastic codec draws fresh coins for
 * every call, rank and chunk, the same as the CPU all-reduce's. 0 or a
 * negative TAH_E* code with err filled. */
int cu_tp_allreduce(cu_tp_t *t, void *const *in, int in_type, void *const *out, int out_type, size_t n,
                    uint64_t id, const cudaStream_t *st, int parts, char *err, size_t errlen);

/* buf[r] (n floats each) = buf[root] on every rank (ncclBroadcast). */
int cu_tp_broadcast(cu_tp_t *t, float *const *buf, size_t n, int root, const cudaStream_t *st, char *err,
                    size_t errlen);

/* Synchronise every rank's stream, then return what the codec kernels of
 * the compressed all-reduces since the last call found (0 if nothing;
 * always 0 for codec none) and forget it; TAH_EDEVICE on a CUDA error. */
int cu_tp_status(cu_tp_t *t, const cudaStream_t *st, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
