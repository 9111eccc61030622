/* link.h — the data plane between neighbouring stages: what a message may
 * be, and the check every received message passes before it is used.
 *
 * A data message is two ZeroMQ frames [tah.DataHeader][payload]:
 *   kind          sent by          payload                    step  mb
 *   HELLO         connecting side  empty (header has token)   0     0
 *   ACT           stage k-1        fwd codec frame (B,T,C)    s     0..M-1
 *   EVAL          stage k-1        fwd codec frame (B,T,C)    s     0..val_batches-1
 *   GRAD          stage k+1        bwd codec frame (B,T,C)    s     0..M-1
 *   TIED          last stage       fp32 frame (1,R',C): the    s     0
 *                                  head's rows step s reads
 *                 first stage      tied codec frame (1,R,C):  s     0
 *                                  rows of wte its step touched
 *   NORM_PARTIAL  stage k-1        nnorm float64 (LE), >= 0   s     0
 *   NORM          stage k+1        empty; header value >= 0   s     0
 *   PING          any neighbour    empty                      0     0
 * The tied partner of the first stage is the last one and vice versa. The
 * last stage's head is the tied matrix; the first stage's wte is a cache
 * of it. At the start of step s the last stage sends the rows the first
 * stage's forward passes of step s read (R': the distinct token ids of its
 * M batches, and of the validation batches when step s validates); at the
 * end, the first stage sends its wte gradient, which is zero outside the
 * rows of its M batches' tokens: only those R rows. Rows are distinct token
 * ids ascending, 1 <= R <= Vp; each receiver knows the same tokens and
 * checks R.
 * Connections: stage k connects (DEALER) to stage k+1's listening ROUTER,
 * and the first stage also to the last one's (tied embeddings, S > 2).
 *
 * link_check validates, in order: job id, the sender's role for the kind,
 * step (the receiver's current step or the next: a neighbour may be one
 * step ahead), micro-batch range, payload CRC-32C (header field), then the
 * payload itself: codec id, shape and canonical parameters equal to the
 * job's, and codec_decode's own checks (magic, sizes, frame CRC, finite
 * values); doubles must be finite and >= 0. Anything else is rejected with
 * a negative TAH_E* code and a message. Header-level rejections leave the
 * output untouched; a frame that fails inside codec_decode may have been
 * partly decoded, so the agent decodes into a fresh buffer and drops it on
 * rejection. */
#ifndef TAH_LINK_H
#define TAH_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h" /* codec_spec_t */
#include "wire.h"  /* Tah__DataHeader */

enum { LINK_UP = 1, LINK_DOWN = 2, LINK_TIED = 4 }; /* the sender's roles, seen from the receiver */

typedef struct link_expect {
    uint64_t job, token;
    int stage, S;          /* receiver's stage index and the stage count */
    int M, val_batches;
    int B, T, C, Vp;
    int tied;              /* tied embeddings (first and last stage exchange TIED) */
    codec_spec_t fwd, bwd; /* the job's codecs */
    codec_spec_t tied_spec; /* the tied exchange's (job key tied_codec, fp32 by default) */
    size_t nnorm;          /* norm slots (stage_norm_nslots) */
    double max_norm_ratio; /* job key max_norm_ratio (node/guard.h; 0: off) */
    int max_bad_frames;    /* job key max_bad_frames (reports to the coordinator) */
} link_expect_t;

/* Roles stage `from` holds for the receiver (0: none, it may not talk to us). */
int link_roles(const link_expect_t *x, int from);
/* Elements the decoded payload of this header needs (floats; doubles for
 * NORM_PARTIAL): for TIED rows, R * C when the header's R is in 1..Vp
 * (link_check rejects other shapes). */
size_t link_payload_elems(const link_expect_t *x, const Tah__DataHeader *h);

/* Validate header + payload from a sender whose stage is `from` (already
 * authenticated by the caller), at receiver step cur_step (1-based).
 * Tensor kinds decode into out (out_elems floats), or with out NULL are
 * checked up to the decode, which is then the caller's (the frame's header,
 * CRC, codec and shape are); NORM_PARTIAL copies the doubles into out (as
 * bytes). 0 or a negative TAH_E* code + err. */
int link_check(const link_expect_t *x, int from, int cur_step, const Tah__DataHeader *h, const uint8_t *payload,
               size_t len, void *out, size_t out_bytes, char *err, size_t errlen);

/* HELLO check: job, token and that `from` may connect to us. */
int link_check_hello(const link_expect_t *x, const Tah__DataHeader *h, char *err, size_t errlen);

/* The codec spec of the tensor message (kind, from, step, mb) sent with
 * `base`: codec_spec_for_tensor of base for that message (kind's stream),
 * so that stochastic fixpt draws new rounding coins for every step,
 * micro-batch and stage (other specs: base). Sender and receiver derive the
 * same, and link_check requires a frame's spec to be it: a stochastic frame
 * replayed under another step or micro-batch is rejected. */
void link_spec(const codec_spec_t *base, uint32_t kind, int from, int step, int mb, codec_spec_t *out);

/* Fill a header for sending (version set by the caller's pack). */
void link_header(Tah__DataHeader *h, const link_expect_t *x, uint32_t kind, int step, int mb);

#endif
