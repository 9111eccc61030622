/* tpcomm.h — the all-reduce of a tensor-parallel group: two-shot, one
 * codec per shot (TACO / Flash Communication), over a transport that moves
 * opaque byte chunks between the ranks of the group.
 *
 * tp_allreduce(c, rank, buf, n, id): every rank calls it at the same time
 * with its own buf of n floats and the same id; on return every rank's buf
 * holds the same sum.
 *   1. [0,n) is cut into tp chunks: chunk j starts at j*K, K = ceil(n/tp)
 *      rounded up to the codecs' block/group size (trailing chunks may be
 *      short or empty when n is small or does not divide).
 *   2. Reduce-scatter: the rank encodes each chunk j once with the rs codec
 *      (one frame per chunk, so the tensor is compressed exactly once) and
 *      an all-to-all hands rank j the tp frames of chunk j.
 *   3. Rank j decodes them and sums in fp32, in rank order 0..tp-1.
 *   4. All-gather: it encodes that sum once with the ag codec; every rank
 *      receives every rank's frame and decodes it into its chunk of buf --
 *      its own frame included, so every rank holds the same bits.
 * Two compressions per element per all-reduce, whatever tp is. With codec
 * "none" raw float32 bytes move (no frame, no rounding): the result is the
 * fp32 sum in rank order, identical on every rank and in every run.
 * The result is bit-reproducible for every codec (fixed chunking and order).
 *
 * Stochastic rounding (fixpt:stochastic=1): every frame is encoded with
 * tp_chunk_spec(spec, id, shot, rank, chunk), a seed of its own, so each
 * all-reduce, rank and chunk draws fresh coins; with one seed for all, an
 * element of every step's sum would round with the same coin, and ranks
 * holding equal values would round them alike, so the errors would add
 * up instead of averaging out. Callers give every all-reduce of a run its
 * own id (the stage: the step and the call's index in it, stage.h); the
 * GPU group (cuda/cu_tpcomm.h) derives the same specs. Other codecs ignore
 * the id.
 *
 * Codec specs (tp_codec_parse): "none", or a codec_spec_parse spec of fp32,
 * fp16, bf16, fixpt, ash-fp8 or int; each frame is shape (1,1,chunk). tah
 * is refused: it is built for (B,T,C) boundary activations. In a
 * codec_spec_t, id 0 means "none".
 *
 * Errors: every rank returns the same code (the transport's `agree`): a
 * non-finite input or sum (TAH_ENONFINITE from the encoder), a bad frame.
 * buf is then unspecified. A rank never leaves the protocol early, so an
 * error never deadlocks the group.
 *
 * Transport contract (tp_transport_ops_t): every rank calls the same
 * sequence of collectives; a send buffer must stay unchanged until the
 * caller's next transport call has returned (the shared-memory transport
 * lets peers read it in place; NCCL send/recv would satisfy it too). The
 * CPU transport (tp_shm_new) is for threads of one process.
 *
 * Memory: tp_comm_new takes ownership of the transport; buffers for
 * all-reduces of up to max_n floats are allocated per rank up front, so
 * tp_allreduce never allocates (encoders may use scratch, see codec.h). */
#ifndef TAH_TPCOMM_H
#define TAH_TPCOMM_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h" /* codec_spec_t, codec_spec_parse */

#define TP_MAX 8 /* largest tensor-parallel degree */

typedef struct tp_transport tp_transport_t;

typedef struct tp_transport_ops {
    /* send + j*cap holds slen[j] bytes for rank j; on return recv + j*cap
     * holds the slen[rank] bytes rank j sent to this rank, rlen[j] = length. */
    int (*alltoall)(tp_transport_t *t, int rank, const uint8_t *send, const size_t *slen,
                    uint8_t *recv, size_t *rlen, size_t cap);
    /* recv + j*cap gets rank j's send (rlen[j] = its slen). */
    int (*allgather)(tp_transport_t *t, int rank, const uint8_t *send, size_t slen, uint8_t *recv,
                     size_t *rlen, size_t cap);
    /* Returns the first nonzero rc in rank order (0 if none), on every rank. */
    int (*agree)(tp_transport_t *t, int rank, int rc);
    void (*destroy)(tp_transport_t *t);
} tp_transport_ops_t;

struct tp_transport {
    const tp_transport_ops_t *ops;
    int tp;
};

/* Threads of one process, 1..TP_MAX ranks. */
tp_transport_t *tp_shm_new(int tp, char *err, size_t errlen);

/* Elements per block or group of a chunk's codec (16 for the raw ones):
 * chunk starts are multiples of it, here and in the GPU group
 * (cuda/cu_tpcomm.cu). */
static inline size_t tp_codec_unit(const codec_spec_t *s)
{
    if (s->id == CODEC_ASH_FP8)
        return s->p.ash.block;
    if (s->id == CODEC_INT)
        return s->p.intq.group;
    if (s->id == CODEC_FIXPT)
        return s->p.fixpt.group;
    return 16; /* raw: one cache line of floats */
}

/* The spec of one frame of all-reduce `id`: shot 0 (reduce-scatter: rank
 * `rank` encodes chunk `chunk`) or 1 (all-gather: chunk = rank). */
static inline void tp_chunk_spec(const codec_spec_t *base, uint64_t id, int shot, int rank, int chunk,
                                 codec_spec_t *out)
{
    codec_spec_t k;
    codec_spec_derive(base, id, &k);
    codec_spec_derive(&k, ((uint64_t)(uint32_t)shot << 32) | ((uint64_t)(uint32_t)rank << 16) | (uint32_t)chunk,
                      out);
}

/* "none" -> spec->id = 0; otherwise codec_spec_parse, restricted as above. */
int tp_codec_parse(const char *str, codec_spec_t *spec, char *err, size_t errlen);
/* "none" or the canonical codec spec. */
int tp_codec_format(const codec_spec_t *spec, char *buf, size_t buflen);

typedef struct tp_comm tp_comm_t;

/* rs/ag: reduce-scatter and all-gather codecs (id 0 = none). */
tp_comm_t *tp_comm_new(tp_transport_t *transport, const codec_spec_t *rs, const codec_spec_t *ag,
                       size_t max_n, char *err, size_t errlen);
void tp_comm_destroy(tp_comm_t **self_p);
int tp_comm_size(const tp_comm_t *c);
/* All ranks at once with the same id; n <= max_n. err (may be NULL) gets
 * this rank's reason. */
int tp_allreduce(tp_comm_t *c, int rank, float *buf, size_t n, uint64_t id, char *err, size_t errlen);
/* Bytes one rank sends in an all-reduce of n floats (both shots, frames
 * with headers, its own chunks excluded). */
size_t tp_comm_wire_bytes(const tp_comm_t *c, size_t n);

#endif
