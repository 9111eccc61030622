/* runner.c — the compute thread of tah-node: one pipeline stage running
 * the job's schedule, step for step the same actions tah-train's trainer
 * (pipeline/trainer.c) runs for this stage, with the boundary tensors
 * crossing real links instead of memory:
 *
 *   per step s (1-based), as tah-train:
 *     [validation at s == 1, s % val_every == 0, s == steps: EVAL batches
 *      flow forward, the last stage averages their losses]
 *     first/last stage: M batches from the train loader (same order)
 *     zero grads; for each action of sched_build(kind, S, M, k):
 *       F(m): input = ACT(s, m) from stage k-1 (or tokens); forward;
 *             encode the output with the fwd codec -> ACT(s, m) to stage k+1
 *       B(m): dout = GRAD(s, m) from stage k+1 (or the loss); backward;
 *             encode the input gradient with the bwd codec -> GRAD(s, m) up
 *     tied embeddings: first and last stage swap their fp32 wte/head
 *       gradients (TIED) and both compute first + last (stage_tied_reduce)
 *     global norm: per-slot sums of squares travel down the pipeline
 *       (NORM_PARTIAL), the last stage totals them (stage_norm_total) and
 *       the norm travels back up (NORM): every stage clips with the same
 *       value tah-train computes
 *     AdamW with optim_lr(step), checkpoint every checkpoint_every steps
 *       (the agent replicates each to the coordinator)
 *     report: loss (last stage), bytes sent per link, step time
 *   Drain (the agent sets drain_step D): stop after step D, or, when step
 *   D+1 has started (its update cannot have happened: it needs every
 *   stage), abandon it; either way write a checkpoint of the last applied
 *   step and exit with NODE_DRAINED. D is checked at the end of each step
 *   and again as the next one starts (a Drain may land in between).
 *   Once out of the step loop the runner sets steps_over: from then on its
 *   neighbours may finish and go quiet (the agent's silence watchdog stops).
 * Every received tensor was validated and decoded by the agent. A stage
 * that encodes on its device (the CUDA backend) keeps its boundary tensors
 * there: the runner asks it for the sealed frame (stage_encode_boundary),
 * written into one of R_NPINNED page-locked buffers that ZeroMQ then sends
 * in place and hands back (s_pinned_done) once the bytes are out. */
#include <errno.h>
#include <stdatomic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "ckpt.h"     /* ckpt_save, ckpt_load */
#include "crc32c.h"   /* crc32c_update */
#include "data.h"     /* data_load, data_loader_* */
#include "errors.h"
#include "gpt2.h"
#include "guard.h"    /* guard_admit_norm: the checks of tensors decoded on the device */
#include "jobfile.h"  /* jobfile_parse, jobfile_resolve */
#include "layers.h"   /* layers_set_threads */
#include "log.h"
#include "node.h"
#include "optim.h"
#include "schedule.h"
#include "stage.h"
#include "trainer.h"  /* trainer_split */

typedef struct s_entry {
    int used;
    node_meta_t m;
    zmq_msg_t msg;
} s_entry_t;

#define R_NPINNED 8 /* page-locked frame buffers of a device-encoding stage */

typedef struct s_pinned {
    uint8_t *buf; /* NULL: not allocated (frames then go through pageable memory) */
    size_t cap;
    atomic_int busy; /* 1 from the send until ZeroMQ is done with the bytes */
} s_pinned_t;

/* TAH_NODE_PROFILE=1: where each step's wall time goes on this node's compute
 * thread, logged per step (the host's view: a phase that only launches
 * device work counts until the launch returns) */
enum { P_FWD, P_BWD, P_SEND, P_WAIT, P_DEC, P_TIED, P_TWAIT, P_NWAIT, P_UPDATE, P_N };
static const char *const s_phase_names[P_N] = { "fwd",    "bwd",  "encode+send", "wait act/grad", "decode",
                                                "tied",   "wait tied", "wait norm", "update" };

#define R_NTRACE 65536
typedef struct s_trace {
    uint32_t kind;
    int step, mb;
    uint32_t crc;
} s_trace_t;

typedef struct runner {
    node_job_t *job;
    link_expect_t *x;
    void *pipe;
    job_spec_t *spec;
    stage_t *st;
    sched_action_t *acts;
    data_t *train, *val;
    data_loader_t dl, vl;
    int *inputs, *targets;   /* (M, B,T) */
    int *vin, *vtg;          /* (B,T) */
    float *tmp;              /* (B,T,C) */
    int dev_enc;             /* the stage encodes its boundary tensors on its device */
    int dev_dec;             /* ... and decodes the received ones there (j->dev_dec) */
    guard_t *dguard;         /* dev_dec: the agent's norm bound, for the tensors decoded here */
    node_meta_t dlast[2];    /* dev_dec: the message whose decode the stage holds, input / gradient */
    uint8_t *rowmask;        /* tied, first or last stage: (Vp) */
    uint8_t *valmask;        /* (Vp): the tokens of the validation batches */
    int *rows;               /* (Vp): the wte rows of the step (stage_tied_rows) */
    float *rowbuf;           /* (R, C) rows of the tied exchange (R <= min(Vp, tokens of a step)) */
    s_pinned_t pinned[R_NPINNED];
    float *losses;           /* (M) */
    double *slots;           /* nnorm */
    optim_opts_t optim;      /* the job's, with total_steps = steps (as tah-train) */
    s_entry_t *stash;
    int nstash;
    int64_t fwd_fs, bwd_fs, fp32_fs, tied_fs;
    uint64_t bytes_fwd, bytes_bwd, fp32_fwd, fp32_bwd, bytes_tied; /* this step's training */
    uint64_t bytes_val, fp32_val;                                   /* this step's validation pass */
    uint64_t data_pos;
    double t_start;
    long ckpt_delay_ms;      /* TAH_NODE_TEST_CKPT_DELAY_MS (tests: a slow disk) */
    long drop_step;          /* TAH_NODE_TEST_DROP_STEP (tests: a message lost on the way) */
    long hang_step;          /* TAH_NODE_TEST_HANG_STEP (tests: a device call that never returns) */
    int profile;             /* TAH_NODE_PROFILE=1 */
    int trace;               /* TAH_NODE_TRACE=1: a log line per data message sent (its payload's CRC);
                                =mem: the same lines once the job ends */
    s_trace_t *tr;           /* trace 2: the messages sent so far */
    int ntr;
    double ph[P_N];          /* this step's seconds per phase */
} runner_t;

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- pipe ---- */

static int s_send_cmd(runner_t *r, char cmd, const void *data, size_t len)
{
    if (zmq_send(r->pipe, &cmd, 1, data ? ZMQ_SNDMORE : 0) < 0)
        return TAH_EIO;
    if (data && zmq_send(r->pipe, data, len, 0) < 0)
        return TAH_EIO;
    return 0;
}

static void s_report(runner_t *r, Tah__Envelope *env)
{
    env->version = TAH_PROTO_VERSION;
    size_t n = tah__envelope__get_packed_size(env);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return;
    tah__envelope__pack(env, buf);
    s_send_cmd(r, 'R', buf, n);
    free(buf);
}

static atomic_int s_dropped; /* TAH_NODE_TEST_DROP_STEP: once per process */

/* Header + payload message to a neighbour. payload is moved (zero-copy). */
static int s_send_msg(runner_t *r, int dest, Tah__DataHeader *h, zmq_msg_t *payload)
{
    if (r->drop_step > 0 && r->drop_step == h->step && !atomic_exchange(&s_dropped, 1)) {
        log_warn("job %llu step %d: TAH_NODE_TEST_DROP_STEP: %s mb %d not sent (lost on the way)",
                 (unsigned long long)r->job->id, h->step, wire_data_kind_name(h->kind), h->mb);
        if (payload)
            zmq_msg_close(payload);
        return 0;
    }
    h->crc = payload ? crc32c_update(0, zmq_msg_data(payload), zmq_msg_size(payload)) : 0;
    if (r->trace == 1) /* runs compared message by message */
        log_info("trace: stage %d sent %s step %d mb %d crc %08x", r->x->stage, wire_data_kind_name(h->kind),
                 h->step, h->mb, h->crc);
    else if (r->trace == 2 && r->ntr < R_NTRACE) /* the same, logged after the job (no delay per message) */
        r->tr[r->ntr++] = (s_trace_t){ h->kind, h->step, h->mb, h->crc };
    uint8_t hb[WIRE_MAX_HEADER];
    size_t hl = tah__data_header__get_packed_size(h);
    if (hl > sizeof hb)
        return TAH_EINVAL;
    tah__data_header__pack(h, hb);
    char cmd = 'S';
    uint8_t d = (uint8_t)dest;
    int rc = 0;
    size_t total = hl + (payload ? zmq_msg_size(payload) : 0); /* before the send moves the payload */
    if (zmq_send(r->pipe, &cmd, 1, ZMQ_SNDMORE) < 0 || zmq_send(r->pipe, &d, 1, ZMQ_SNDMORE) < 0 ||
        zmq_send(r->pipe, hb, hl, ZMQ_SNDMORE) < 0)
        rc = TAH_EIO;
    if (!rc) {
        if (payload)
            rc = zmq_msg_send(payload, r->pipe, 0) < 0 ? TAH_EIO : 0;
        else
            rc = zmq_send(r->pipe, NULL, 0, 0) < 0 ? TAH_EIO : 0;
    }
    if (payload)
        zmq_msg_close(payload);
    if (h->kind == TAH__DATA_KIND__DATA_EVAL) /* the validation pass's: reported apart (val_bytes) */
        r->bytes_val += total;
    else if (dest == NODE_DEST_DOWN)
        r->bytes_fwd += total;
    else if (dest == NODE_DEST_UP)
        r->bytes_bwd += total;
    else
        r->bytes_tied += total;
    return rc;
}

/* Header for an encoded frame (moved: zero-copy) and send. */
static int s_send_frame(runner_t *r, int dest, uint32_t kind, int step, int mb, const codec_spec_t *spec,
                        codec_shape_t shape, zmq_msg_t *frame)
{
    Tah__DataHeader h;
    link_header(&h, r->x, kind, step, mb);
    h.codec = (uint32_t)spec->id;
    h.b = shape.b;
    h.t = shape.s;
    h.c = shape.c;
    return s_send_msg(r, dest, &h, frame);
}

static void s_pinned_done(void *data, void *hint)
{
    (void)data;
    atomic_store((atomic_int *)hint, 0);
}

/* The backward that stage_backward_encode runs before its encode. */
typedef struct s_bwd {
    const float *dout;
    float dloss;
} s_bwd_t;

/* Encode and send a boundary tensor: data (host, float32) through the CPU
 * codec, or, with data NULL, the stage's own tensor `what` of micro-batch
 * mb encoded on its device into a free page-locked buffer; with bwd, the
 * backward of mb runs first in the same call (stage_backward_encode). */
static int s_send_tensor(runner_t *r, int dest, uint32_t kind, int step, int mb, const codec_spec_t *base,
                         codec_shape_t shape, const float *data, int what, const s_bwd_t *bwd)
{
    codec_spec_t mspec; /* this message's spec: its own stochastic rounding seed (link_spec) */
    link_spec(base, kind, r->x->stage, step, mb, &mspec);
    const codec_spec_t *spec = &mspec;
    int64_t fs = codec_frame_size(spec, shape);
    if (fs < 0)
        return (int)fs;
    zmq_msg_t payload;
    s_pinned_t *pb = NULL;
    for (int i = 0; !data && !pb && i < R_NPINNED; i++)
        if (r->pinned[i].buf && r->pinned[i].cap >= (size_t)fs && !atomic_load(&r->pinned[i].busy))
            pb = &r->pinned[i];
    uint8_t *frame;
    if (pb) {
        frame = pb->buf;
    } else {
        if (zmq_msg_init_size(&payload, (size_t)fs) != 0)
            return TAH_ENOMEM;
        frame = zmq_msg_data(&payload);
    }
    size_t written = 0;
    char cerr[512] = "";
    int rc = data  ? codec_encode(spec, shape, data, frame, (size_t)fs, &written, cerr, sizeof cerr)
             : bwd ? stage_backward_encode(r->st, mb, bwd->dout, bwd->dloss, spec, frame, (size_t)fs, &written, cerr,
                                           sizeof cerr)
                   : stage_encode_boundary(r->st, what, mb, spec, frame, (size_t)fs, &written, cerr, sizeof cerr);
    if (!rc && pb) {
        atomic_store(&pb->busy, 1);
        if (zmq_msg_init_data(&payload, pb->buf, (size_t)fs, s_pinned_done, &pb->busy) != 0) {
            atomic_store(&pb->busy, 0);
            return TAH_ENOMEM;
        }
    }
    if (rc) {
        if (!pb)
            zmq_msg_close(&payload);
        snprintf(r->job->reason, sizeof r->job->reason, "step %d: %s %s mb %d failed: %.400s (%s)", step,
                 bwd ? "backward and encoding" : "encoding", wire_data_kind_name(kind), mb, cerr, tah_strerror(rc));
        return rc;
    }
    return s_send_frame(r, dest, kind, step, mb, spec, shape, &payload);
}

static int s_frame_check(runner_t *r, int idx);

/* Wait for a message (kind, step, mb); returns its stash index, or -1 when
 * aborted (reason set). */
static int s_wait_msg(runner_t *r, uint32_t kind, int step, int mb)
{
    for (;;) {
        for (int i = 0; i < r->nstash; i++) {
            s_entry_t *e = &r->stash[i];
            if (e->used && e->m.kind == kind && e->m.step == step && e->m.mb == mb)
                return i;
        }
        if (atomic_load(&r->job->abort))
            return -1;
        zmq_msg_t cmd;
        zmq_msg_init(&cmd);
        if (zmq_msg_recv(&cmd, r->pipe, 0) < 0) {
            zmq_msg_close(&cmd);
            if (errno == EAGAIN || errno == EINTR)
                continue; /* receive timeout: check abort */
            return -1;
        }
        char c = zmq_msg_size(&cmd) == 1 ? *(char *)zmq_msg_data(&cmd) : 0;
        int more = zmq_msg_more(&cmd);
        zmq_msg_close(&cmd);
        if (c == 'A') {
            atomic_store(&r->job->abort, 1);
            while (more) { /* reason */
                zmq_msg_t m;
                zmq_msg_init(&m);
                if (zmq_msg_recv(&m, r->pipe, 0) < 0)
                    break;
                more = zmq_msg_more(&m);
                zmq_msg_close(&m);
            }
            return -1;
        }
        if (c != 'D' || !more)
            continue;
        zmq_msg_t meta, data;
        zmq_msg_init(&meta);
        zmq_msg_init(&data);
        if (zmq_msg_recv(&meta, r->pipe, 0) < 0 || !zmq_msg_more(&meta) || zmq_msg_recv(&data, r->pipe, 0) < 0 ||
            zmq_msg_size(&meta) != sizeof(node_meta_t)) {
            zmq_msg_close(&meta);
            zmq_msg_close(&data);
            continue;
        }
        node_meta_t m;
        memcpy(&m, zmq_msg_data(&meta), sizeof m);
        zmq_msg_close(&meta);
        int slot = -1, dup = 0;
        for (int i = 0; i < r->nstash; i++) {
            s_entry_t *e = &r->stash[i];
            if (e->used && e->m.kind == m.kind && e->m.step == m.step && e->m.mb == m.mb)
                dup = 1;
            if (!e->used && slot < 0)
                slot = i;
        }
        if (dup || slot < 0) {
            atomic_fetch_add(r->job->rejected, 1);
            log_warn("job %llu step %d: %s %s mb %d rejected", (unsigned long long)r->job->id, m.step,
                     dup ? "duplicate" : "no room for", wire_data_kind_name(m.kind), m.mb);
            zmq_msg_close(&data);
            continue;
        }
        r->stash[slot].used = 1;
        r->stash[slot].m = m;
        zmq_msg_init(&r->stash[slot].msg);
        zmq_msg_move(&r->stash[slot].msg, &data);
        zmq_msg_close(&data);
        if (m.frame && s_frame_check(r, slot) < 0)
            return -1; /* a device error: the reason is set */
    }
}

static int s_wait(runner_t *r, uint32_t kind, int step, int mb)
{
    const double t = s_now();
    int idx = s_wait_msg(r, kind, step, mb);
    r->ph[kind == TAH__DATA_KIND__DATA_TIED  ? P_TWAIT
          : kind == TAH__DATA_KIND__DATA_NORM || kind == TAH__DATA_KIND__DATA_NORM_PARTIAL ? P_NWAIT
                                                                                           : P_WAIT] += s_now() - t;
    return idx;
}

static void s_release(runner_t *r, int i)
{
    zmq_msg_close(&r->stash[i].msg);
    r->stash[i].used = 0;
}

/* Drop anything left over from steps before `step` (cannot be used any more). */
static void s_purge(runner_t *r, int step)
{
    for (int i = 0; i < r->nstash; i++) {
        if (r->stash[i].used && r->stash[i].m.step < step) {
            atomic_fetch_add(r->job->rejected, 1);
            s_release(r, i);
        }
    }
}

/* ---- one step ---- */

static int s_fail(runner_t *r, int step, const char *fmt, const char *a)
{
    if (!r->job->reason[0])
        snprintf(r->job->reason, sizeof r->job->reason, fmt, a);
    r->job->fail_step = step;
    return TAH_EINVAL;
}

static int s_aborted(runner_t *r, int step)
{
    r->job->fail_step = step;
    return 1;
}

/* Frames the agent left encoded (dev_dec) are decoded into the stage: what
 * and the stage's micro-batch for message e (an evaluation batch runs in
 * slot 0) */
static int s_frame_what(const s_entry_t *e, int *smb)
{
    *smb = e->m.kind == TAH__DATA_KIND__DATA_EVAL ? 0 : e->m.mb;
    return e->m.kind == TAH__DATA_KIND__DATA_GRAD ? STAGE_WIRE_DOUT : STAGE_WIRE_IN;
}

/* Decode stashed frame e into the stage (its direction's buffer, which then
 * holds it: r->dlast); 0 or the decoder's error with err filled. */
static int s_frame_decode(runner_t *r, s_entry_t *e, double *norm, char *err, size_t errlen)
{
    int smb, what = s_frame_what(e, &smb), w = what == STAGE_WIRE_DOUT;
    int rc = stage_decode_boundary(r->st, what, smb, zmq_msg_data(&e->msg), zmq_msg_size(&e->msg), norm, err,
                                   errlen);
    r->dlast[w] = rc == 0 ? e->m : (node_meta_t){ 0 };
    return rc;
}

/* Check stashed frame idx as the agent checks the tensors it decodes, as
 * soon as it arrives: decoded on the device (finite values, metadata), then
 * the norm bound and the replay window (r->dguard). The stage then holds
 * its decode (r->dlast). A frame that fails is its sender's fault: reported
 * to the agent as a strike and dropped, as a frame the agent rejects.
 * 0: kept; 1: dropped; -1: a device error (reason set). */
static int s_frame_check(runner_t *r, int idx)
{
    s_entry_t *e = &r->stash[idx];
    char err[512] = "";
    double norm = 0.0;
    int rc = s_frame_decode(r, e, &norm, err, sizeof err);
    const int decoded = rc == 0; /* the guard's messages name the message themselves */
    if (rc == 0)
        rc = guard_admit_norm(r->dguard, e->m.kind, e->m.step, e->m.mb, norm, err, sizeof err);
    if (rc == 0)
        return 0;
    r->dlast[e->m.kind == TAH__DATA_KIND__DATA_GRAD] = (node_meta_t){ 0 };
    const node_meta_t m = e->m;
    s_release(r, idx);
    if (rc == TAH_EDEVICE || rc == TAH_EINVAL) {
        s_fail(r, m.step, "decoding a received tensor on the GPU failed: %s", err);
        return -1;
    }
    const int32_t from = m.kind == TAH__DATA_KIND__DATA_GRAD ? r->x->stage + 1 : r->x->stage - 1;
    char why[600];
    int n = decoded ? snprintf(why, sizeof why, "%s (%s)", err, tah_strerror(rc))
                    : snprintf(why, sizeof why, "%s step %d mb %d: %s (%s)", wire_data_kind_name(m.kind), m.step, m.mb,
                               err, tah_strerror(rc));
    if (zmq_send(r->pipe, "B", 1, ZMQ_SNDMORE) < 0 || zmq_send(r->pipe, &from, sizeof from, ZMQ_SNDMORE) < 0 ||
        zmq_send(r->pipe, why, n > 0 ? (size_t)n : 0, 0) < 0)
        log_warn("job %llu: %s", (unsigned long long)r->job->id, why);
    return 1;
}

/* Wait for tensor message (kind, step, mb): its stash index with *data the
 * decoded host tensor, or NULL for a frame the stage holds decoded for its
 * next forward (backward): decoded again unless it was the last one checked
 * in its direction. -1 when aborted or on a device error (reason set). */
static int s_wait_tensor(runner_t *r, uint32_t kind, int step, int mb, const float **data)
{
    int idx = s_wait(r, kind, step, mb);
    if (idx < 0)
        return -1;
    s_entry_t *e = &r->stash[idx];
    *data = e->m.frame ? NULL : zmq_msg_data(&e->msg);
    const node_meta_t *l = &r->dlast[kind == TAH__DATA_KIND__DATA_GRAD];
    if (!e->m.frame || (l->kind == kind && l->step == step && l->mb == mb))
        return idx;
    char err[512] = "";
    double norm = 0.0;
    const double t = s_now();
    int rc = s_frame_decode(r, e, &norm, err, sizeof err);
    r->ph[P_DEC] += s_now() - t;
    if (rc == 0)
        return idx;
    s_release(r, idx);
    s_fail(r, step, "decoding a checked tensor on the GPU again failed: %s", err);
    return -1;
}

/* Send rows r->rows[0..R) of r->rowbuf (R x C floats) as TIED (1, R, C)
 * through spec to the tied partner. */
static int s_send_rows(runner_t *r, int step, const codec_spec_t *base, size_t R)
{
    codec_spec_t mspec; /* link_spec, as s_send_tensor */
    link_spec(base, TAH__DATA_KIND__DATA_TIED, r->x->stage, step, 0, &mspec);
    const codec_spec_t *spec = &mspec;
    codec_shape_t ts = { 1, (uint32_t)R, (uint32_t)r->x->C };
    int64_t fs = codec_frame_size(spec, ts);
    zmq_msg_t frame;
    if (fs < 0)
        return (int)fs;
    if (zmq_msg_init_size(&frame, (size_t)fs) != 0)
        return TAH_ENOMEM;
    char cerr[CODEC_ERRLEN] = "";
    int rc = stage_tied_codec(spec, r->rowbuf, (int)R, r->x->C, NULL, R, NULL, zmq_msg_data(&frame), (size_t)fs, cerr,
                              sizeof cerr);
    if (rc) {
        zmq_msg_close(&frame);
        log_warn("job %llu step %d: encoding tied rows: %s", (unsigned long long)r->job->id, step, cerr);
        return rc;
    }
    return s_send_frame(r, NODE_DEST_TIED, TAH__DATA_KIND__DATA_TIED, step, 0, spec, ts, &frame);
}

/* The tied exchange's two halves (grad: the first stage's gradient rows;
 * else the last stage's weight rows): send rows r->rows[0..R) of this
 * stage's tied matrix through spec, or wait for the partner's R rows (the
 * agent checked the frame; the row count is what only this end knows) and
 * put them (stage_tied_rows_put). 0, or the step fails (reason set). */
static int s_tied_send(runner_t *r, int step, int grad, const codec_spec_t *spec, size_t R)
{
    if (stage_tied_rows_get(r->st, grad, r->rows, R, r->rowbuf) != 0)
        return s_fail(r, step, grad ? "reading the tied gradient's rows failed: %s"
                                    : "reading the tied matrix's rows failed: %s",
                      stage_error(r->st));
    int rc = s_send_rows(r, step, spec, R);
    if (rc)
        return s_fail(r, step, grad ? "sending the tied gradient failed (%s)"
                                    : "sending the tied matrix's rows failed (%s)",
                      tah_strerror(rc));
    return 0;
}

static int s_tied_recv(runner_t *r, int step, int grad, size_t R)
{
    int idx = s_wait(r, TAH__DATA_KIND__DATA_TIED, step, 0);
    if (idx < 0)
        return s_aborted(r, step);
    size_t have = zmq_msg_size(&r->stash[idx].msg), want = R * (size_t)r->x->C * sizeof(float);
    if (have != want) {
        char why[160];
        snprintf(why, sizeof why, "%zu bytes of %s rows from stage %d, expected %zu rows (%zu bytes)", have,
                 grad ? "gradient" : "weight", r->x->stage == 0 ? r->x->S - 1 : 0, R, want);
        s_release(r, idx);
        s_fail(r, step, "tied exchange: %s", why);
        return TAH_ESHAPE;
    }
    int rc = stage_tied_rows_put(r->st, grad, r->rows, R, zmq_msg_data(&r->stash[idx].msg));
    s_release(r, idx);
    if (rc)
        return s_fail(r, step, grad ? "adding the tied gradient's rows failed: %s"
                                    : "putting the tied matrix's rows failed: %s",
                      stage_error(r->st));
    return 0;
}

/* The rows step s's forward passes on the first stage read: its M
 * batches' tokens, and the validation batches' when step s validates
 * (r->valmask); into r->rows, returns R. */
static size_t s_weight_rows(runner_t *r, int eval)
{
    const link_expect_t *x = r->x;
    const size_t n = (size_t)x->M * x->B * x->T;
    stage_tied_rows(r->inputs, n, x->Vp, r->rowmask, r->rows);
    size_t R = 0;
    for (int v = 0; v < x->Vp; v++)
        if (r->rowmask[v] || (eval && r->valmask[v]))
            r->rows[R++] = v;
    return R;
}

/* Start of step s on a tied first or last stage of S > 1: the last stage
 * sends the rows of its head (the tied matrix, after step s - 1's update)
 * that the first stage reads in step s, in fp32; the first stage puts them
 * into its wte before its first forward. */
static int s_tied_weights(runner_t *r, int step, int eval)
{
    const link_expect_t *x = r->x;
    const double t0 = s_now(), w0 = r->ph[P_TWAIT];
    const size_t R = s_weight_rows(r, eval);
    int rc;
    if (x->stage == x->S - 1) {
        /* the first stage's connection carries this; it may not be up yet at the first step */
        while (!atomic_load(&r->job->tied_peer)) {
            if (atomic_load(&r->job->abort))
                return s_aborted(r, step);
            nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
        }
        codec_spec_t fp32;
        codec_spec_default(CODEC_FP32, &fp32);
        rc = s_tied_send(r, step, 0, &fp32, R);
    } else {
        rc = s_tied_recv(r, step, 0, R);
    }
    if (rc)
        return rc;
    r->ph[P_TIED] += s_now() - t0 - (r->ph[P_TWAIT] - w0);
    return 0;
}

/* Validation pass (forward only), as trainer_eval: batch i of the val
 * loader from position 0, micro-batch slot 0. */
static int s_eval(runner_t *r, int step, double *val_loss)
{
    const link_expect_t *x = r->x;
    const int k = x->stage, S = x->S;
    codec_shape_t shape = { (uint32_t)x->B, (uint32_t)x->T, (uint32_t)x->C };
    double sum = 0.0;
    r->vl.pos = 0;
    for (int i = 0; i < x->val_batches; i++) {
        if (k == 0 || k == S - 1)
            data_next_batch(&r->vl, r->vin, r->vtg);
        const float *in = NULL;
        int idx = -1;
        if (k > 0) {
            idx = s_wait_tensor(r, TAH__DATA_KIND__DATA_EVAL, step, i, &in);
            if (idx < 0)
                return s_aborted(r, step);
        }
        float l = 0.0f;
        int rc = stage_forward(r->st, 0, r->vin, in, r->vtg, r->dev_enc ? NULL : r->tmp, &l);
        if (idx >= 0)
            s_release(r, idx);
        if (rc) {
            stage_discard(r->st, 0);
            return s_fail(r, step, "validation forward failed (%s)", tah_strerror(rc));
        }
        if (k < S - 1) {
            /* micro-batch slot 0 (the forward's) holds the device tensor until the discard */
            rc = s_send_tensor(r, NODE_DEST_DOWN, TAH__DATA_KIND__DATA_EVAL, step, i, &x->fwd, shape,
                               r->dev_enc ? NULL : r->tmp, STAGE_WIRE_OUT, NULL);
            stage_discard(r->st, 0);
            if (rc)
                return s_fail(r, step, "sending a validation activation failed (%s)", tah_strerror(rc));
            r->fp32_val += (uint64_t)r->fp32_fs;
        } else {
            stage_discard(r->st, 0);
            sum += l;
        }
    }
    *val_loss = x->val_batches > 0 ? sum / x->val_batches : 0.0;
    return 0;
}

static int s_step(runner_t *r, int step, double *loss, double *norm_out, float *lr_out)
{
    const link_expect_t *x = r->x;
    const int k = x->stage, S = x->S, M = x->M;
    const size_t BT = (size_t)x->B * x->T;
    const float dloss = 1.0f / (float)((double)BT * M);
    codec_shape_t shape = { (uint32_t)x->B, (uint32_t)x->T, (uint32_t)x->C };
    stage_t *st = r->st;
    int rc;

    stage_zero_grad(st); /* the first and last stage loaded the step's batches (node_runner_main) */
    for (int a = 0; a < 2 * M; a++) {
        sched_action_t act = r->acts[a];
        int m = act.mb, idx = -1;
        if (act.op == SCHED_F) {
            const float *in = NULL;
            if (k > 0) {
                idx = s_wait_tensor(r, TAH__DATA_KIND__DATA_ACT, step, m, &in);
                if (idx < 0)
                    return s_aborted(r, step);
            }
            double t = s_now();
            rc = stage_forward(st, m, r->inputs + m * BT, in, r->targets + m * BT,
                               k < S - 1 && !r->dev_enc ? r->tmp : NULL,
                               &r->losses[m]);
            r->ph[P_FWD] += s_now() - t;
            if (idx >= 0)
                s_release(r, idx);
            if (rc)
                return s_fail(r, step, "schedule error: forward failed (%s)", tah_strerror(rc));
            if (k < S - 1) {
                t = s_now();
                rc = s_send_tensor(r, NODE_DEST_DOWN, TAH__DATA_KIND__DATA_ACT, step, m, &x->fwd, shape,
                                   r->dev_enc ? NULL : r->tmp, STAGE_WIRE_OUT, NULL);
                r->ph[P_SEND] += s_now() - t;
                if (rc)
                    return s_fail(r, step, "sending an activation failed (%s)", tah_strerror(rc));
                r->fp32_fwd += (uint64_t)r->fp32_fs;
            }
        } else {
            const float *dout = NULL;
            if (k < S - 1) {
                idx = s_wait_tensor(r, TAH__DATA_KIND__DATA_GRAD, step, m, &dout);
                if (idx < 0)
                    return s_aborted(r, step);
            }
            double t = s_now();
            if (k > 0 && r->dev_enc) { /* backward and the encode of d(input), overlapped on the device */
                rc = s_send_tensor(r, NODE_DEST_UP, TAH__DATA_KIND__DATA_GRAD, step, m, &x->bwd, shape, NULL,
                                   STAGE_WIRE_DINP, &(s_bwd_t){ dout, dloss });
                r->ph[P_BWD] += s_now() - t;
                if (idx >= 0)
                    s_release(r, idx);
                if (rc)
                    return s_fail(r, step, "backward or sending its gradient failed (%s)", tah_strerror(rc));
                r->fp32_bwd += (uint64_t)r->fp32_fs;
                continue;
            }
            rc = stage_backward(st, m, dout, dloss, k > 0 ? r->tmp : NULL);
            r->ph[P_BWD] += s_now() - t;
            if (idx >= 0)
                s_release(r, idx);
            if (rc)
                return s_fail(r, step, "schedule error: backward failed (%s)", tah_strerror(rc));
            if (k > 0) {
                t = s_now();
                rc = s_send_tensor(r, NODE_DEST_UP, TAH__DATA_KIND__DATA_GRAD, step, m, &x->bwd, shape, r->tmp,
                                   STAGE_WIRE_DINP, NULL);
                r->ph[P_SEND] += s_now() - t;
                if (rc)
                    return s_fail(r, step, "sending a gradient failed (%s)", tah_strerror(rc));
                r->fp32_bwd += (uint64_t)r->fp32_fs;
            }
        }
    }

    /* tied embeddings (link.h): the first stage sends the rows of its wte
     * gradient its step touched, the last stage adds them to its head's
     * gradient (first + last, as stage_tied_sync): the head is the tied
     * matrix, whose rows the first stage gets before its next forward
     * (s_tied_weights). With a lossy tied codec the rows are the decode of
     * the frame, as tah-train --tied-codec computes them. */
    const double t_tied = s_now(), w_tied = r->ph[P_TWAIT];
    if (x->tied && S == 1) {
        stage_tied_sync(st, st);
    } else if (x->tied && (k == 0 || k == S - 1)) {
        const size_t R = stage_tied_rows(r->inputs, (size_t)M * BT, x->Vp, r->rowmask, r->rows);
        rc = k == 0 ? s_tied_send(r, step, 1, &x->tied_spec, R) : s_tied_recv(r, step, 1, R);
        if (rc)
            return rc;
    }

    r->ph[P_TIED] += s_now() - t_tied - (r->ph[P_TWAIT] - w_tied);

    /* global norm over every stage, in tah-train's slot order */
    const double t_upd = s_now();
    memset(r->slots, 0, x->nnorm * sizeof(double));
    stage_grad_sumsq(st, r->slots);
    if (k > 0) {
        int idx = s_wait(r, TAH__DATA_KIND__DATA_NORM_PARTIAL, step, 0);
        if (idx < 0)
            return s_aborted(r, step);
        const double *p = zmq_msg_data(&r->stash[idx].msg);
        for (size_t i = 0; i < x->nnorm; i++)
            r->slots[i] = p[i] + r->slots[i];
        if (k < S - 1 || S == 1)
            r->data_pos = r->stash[idx].m.data_pos;
        s_release(r, idx);
    } else {
        r->data_pos = r->dl.pos;
    }
    double norm = 0.0;
    if (k < S - 1) {
        Tah__DataHeader h;
        link_header(&h, x, TAH__DATA_KIND__DATA_NORM_PARTIAL, step, 0);
        h.data_pos = r->data_pos;
        zmq_msg_t payload;
        if (zmq_msg_init_size(&payload, x->nnorm * sizeof(double)) != 0)
            return s_fail(r, step, "out of memory%s", "");
        memcpy(zmq_msg_data(&payload), r->slots, x->nnorm * sizeof(double));
        if (s_send_msg(r, NODE_DEST_DOWN, &h, &payload) != 0)
            return s_fail(r, step, "sending norm partials failed%s", "");
        int idx = s_wait(r, TAH__DATA_KIND__DATA_NORM, step, 0);
        if (idx < 0)
            return s_aborted(r, step);
        norm = r->stash[idx].m.value;
        s_release(r, idx);
    } else {
        norm = stage_norm_total(r->slots, x->nnorm);
    }
    if (k > 0) {
        Tah__DataHeader h;
        link_header(&h, x, TAH__DATA_KIND__DATA_NORM, step, 0);
        h.value = norm;
        if (s_send_msg(r, NODE_DEST_UP, &h, NULL) != 0)
            return s_fail(r, step, "sending the norm failed%s", "");
    }
    if (k == S - 1)
        r->data_pos = r->dl.pos;

    const optim_opts_t *opt = &r->optim;
    float scale = optim_clip_scale(norm, opt->grad_clip);
    float lr = optim_lr(opt, step - 1);
    stage_step(st, opt, lr, scale);
    r->ph[P_UPDATE] += s_now() - t_upd - r->ph[P_NWAIT];
    double sum = 0.0;
    for (int m = 0; m < M; m++)
        sum += r->losses[m];
    *loss = sum / M;
    *norm_out = norm;
    *lr_out = lr;
    return 0;
}

/* One line per step: each phase's ms, what the phases leave out ("other"),
 * and the agent's time on received tensors (validation and host decode: on
 * its own thread, so it overlaps the phases). */
static void s_log_profile(const runner_t *r, int step, double dt)
{
    char buf[512];
    int n = 0;
    double sum = 0.0;
    for (int i = 0; i < P_N && n < (int)sizeof buf; i++) {
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s %.1f, ", s_phase_names[i], r->ph[i] * 1e3);
        sum += r->ph[i];
    }
    log_info("job %llu stage %d step %d profile: %.1f ms = %sother %.1f | agent rx %.1f ms",
             (unsigned long long)r->job->id, r->x->stage, step, dt * 1e3, buf, (dt - sum) * 1e3,
             (double)atomic_load(&r->job->rx_ns) * 1e-6);
}

/* ---- setup ---- */

int node_test_setting(const char *name, long *v, char *err, size_t errlen)
{
    *v = 0;
    const char *s = getenv(name);
    if (!s)
        return 0;
    char *end = NULL;
    long n = strtol(s, &end, 10);
    if (end == s || *end || n < 0 || n > 600000) {
        snprintf(err, errlen, "%s wants an integer in 0..600000, got '%.64s'", name, s);
        return TAH_EINVAL;
    }
    *v = n;
    return 0;
}

static int s_setup(runner_t *r, int *start)
{
    node_job_t *j = r->job;
    link_expect_t *x = &j->x;
    char err[1024] = "", path[2400];
    gpt2_model_t *model = NULL;
    int rc = TAH_EINVAL;
    r->spec = malloc(sizeof *r->spec);
    if (!r->spec)
        goto nomem;
    if (jobfile_parse(j->ini, "job", r->spec, err, sizeof err) != 0)
        goto fail;
    const trainopts_t *t = &r->spec->t;
    r->optim = t->optim;
    r->optim.total_steps = t->steps;
    layers_set_threads(j->threads > 0 ? j->threads : t->threads > 0 ? t->threads : layers_max_threads());
    if (t->init_from[0]) {
        jobfile_resolve(j->base_dir, t->init_from, path, sizeof path);
        if (gpt2_model_read(path, &model, err, sizeof err) != 0)
            goto fail;
    } else {
        model = gpt2_model_new(&t->mcfg, err, sizeof err);
        if (!model)
            goto fail;
        gpt2_model_init_random(model, (uint64_t)t->seed);
    }
    const gpt2_config_t cfgv = model->cfg, *cfg = &cfgv; /* model is freed below */
    if (t->stages != j->S || j->S > cfg->L || t->seq > cfg->maxT) {
        snprintf(err, sizeof err, "job wants %d stages (assigned %d) of a %d-layer model, seq %d (maxT %d)",
                 t->stages, j->S, cfg->L, t->seq, cfg->maxT);
        goto fail;
    }
    stage_opts_t so = { .cfg = *cfg, .B = t->batch, .T = t->seq, .tied = !t->untied,
                        .tied_link = !t->untied && j->S > 1,
                        .tp = j->tp > 0 ? j->tp : t->tp,
                        .backend = j->cuda ? STAGE_CUDA : STAGE_CPU, .device = j->device,
                        .ndevices = j->cuda ? j->ndevices : 0,
                        /* the job's precision is for GPU nodes; a CPU stage computes in fp32 */
                        .precision = j->cuda ? t->precision : STAGE_FP32 };
    memcpy(so.devices, j->devices, sizeof so.devices);
    if (trainopts_tp_codecs(t, &so.tp_rs, &so.tp_ag, err, sizeof err) != 0)
        goto fail;
    if (j->layer0 >= 0) {
        so.layer0 = j->layer0;
        so.layer1 = j->layer1;
    } else {
        trainer_split(cfg->L, j->S, j->stage, &so.layer0, &so.layer1);
    }
    so.first = so.layer0 == 0;
    so.last = so.layer1 == cfg->L;
    if (so.first != (j->stage == 0) || so.last != (j->stage == j->S - 1)) {
        snprintf(err, sizeof err, "assigned layers %d..%d do not fit stage %d of %d", so.layer0, so.layer1 - 1,
                 j->stage, j->S);
        goto fail;
    }
    so.nslots = sched_max_inflight(t->schedule, j->S, t->micro_batches, j->stage);
    r->st = stage_new(&so, err, sizeof err);
    if (!r->st)
        goto fail;
    if (stage_load_params(r->st, model) != 0) {
        snprintf(err, sizeof err, "initial model does not match the stage");
        goto fail;
    }
    gpt2_model_destroy(&model);
    if (j->resume_file[0] || t->resume[0]) {
        char rp[2200];
        jobfile_resolve(j->base_dir, t->resume, rp, sizeof rp);
        if (j->resume_file[0])
            snprintf(path, sizeof path, "%s", j->resume_file);
        else
            snprintf(path, sizeof path, "%.2150s.stage%d.ckpt", rp, j->stage);
        ckpt_meta_t meta;
        if (ckpt_load(r->st, path, &meta, err, sizeof err) != 0)
            goto fail;
        *start = (int)meta.step;
        r->data_pos = meta.data_pos;
    }
    r->acts = malloc(2 * (size_t)t->micro_batches * sizeof *r->acts);
    if (!r->acts)
        goto nomem;
    sched_build(t->schedule, j->S, t->micro_batches, j->stage, r->acts);

    /* what the agent checks every message against */
    memset(x, 0, sizeof *x);
    x->job = j->id;
    x->token = j->token;
    x->stage = j->stage;
    x->S = j->S;
    x->M = t->micro_batches;
    x->val_batches = t->val_data[0] ? t->val_batches : 0;
    x->B = t->batch;
    x->T = t->seq;
    x->C = cfg->C;
    x->Vp = cfg->Vp;
    x->tied = !t->untied;
    x->nnorm = stage_norm_nslots(cfg);
    x->max_norm_ratio = r->spec->max_norm_ratio;
    x->max_bad_frames = r->spec->max_bad_frames;
    if (codec_spec_parse(t->fwd_codec, &x->fwd, err, sizeof err) != 0 ||
        codec_spec_parse(t->bwd_codec, &x->bwd, err, sizeof err) != 0 ||
        codec_spec_parse(t->tied_codec, &x->tied_spec, err, sizeof err) != 0)
        goto fail;
    codec_shape_t shape = { (uint32_t)x->B, (uint32_t)x->T, (uint32_t)x->C };
    codec_spec_t fp32;
    codec_spec_default(CODEC_FP32, &fp32);
    r->fwd_fs = codec_frame_size(&x->fwd, shape);
    r->bwd_fs = codec_frame_size(&x->bwd, shape);
    r->fp32_fs = codec_frame_size(&fp32, shape);
    if (r->fwd_fs < 0 || r->bwd_fs < 0) {
        snprintf(err, sizeof err, "codecs %s / %s cannot encode a (%d,%d,%d) tensor", t->fwd_codec, t->bwd_codec,
                 x->B, x->T, x->C);
        goto fail;
    }
    /* the header of an ACT/GRAD message, counted in the fp32 reference too */
    {
        Tah__DataHeader h;
        link_header(&h, x, TAH__DATA_KIND__DATA_ACT, 1, 0);
        h.codec = CODEC_FP32;
        h.b = shape.b;
        h.t = shape.s;
        h.c = shape.c;
        h.crc = 0xffffffffu;
        r->fp32_fs += (int64_t)tah__data_header__get_packed_size(&h);
    }

    /* data: the first stage needs inputs, the last one targets */
    const size_t BT = (size_t)x->B * x->T;
    if (j->stage == 0 || j->stage == j->S - 1) {
        jobfile_resolve(j->base_dir, t->train_data, path, sizeof path);
        if (data_load(path, cfg->V, &r->train, err, sizeof err) != 0 ||
            data_loader_init(&r->dl, r->train, x->B, x->T, err, sizeof err) != 0)
            goto fail;
        if (j->resume_file[0] || t->resume[0]) {
            if (r->data_pos + BT + 1 > r->train->n) {
                snprintf(err, sizeof err, "resume: data position %llu is beyond %.900s",
                         (unsigned long long)r->data_pos, path);
                goto fail;
            }
            r->dl.pos = r->data_pos;
        }
        if (t->val_data[0]) {
            jobfile_resolve(j->base_dir, t->val_data, path, sizeof path);
            if (data_load(path, cfg->V, &r->val, err, sizeof err) != 0 ||
                data_loader_init(&r->vl, r->val, x->B, x->T, err, sizeof err) != 0)
                goto fail;
        }
    }
    size_t BTC = BT * x->C;
    r->inputs = calloc((size_t)x->M * BT, sizeof(int));
    r->targets = calloc((size_t)x->M * BT, sizeof(int));
    r->vin = calloc(BT, sizeof(int));
    r->vtg = calloc(BT, sizeof(int));
    r->tmp = calloc(BTC, sizeof(float));
    r->losses = calloc((size_t)x->M, sizeof(float));
    r->slots = calloc(x->nnorm, sizeof(double));
    r->nstash = 4 * x->M + 2 * x->val_batches + 16;
    r->stash = calloc((size_t)r->nstash, sizeof *r->stash);
    if (!r->inputs || !r->targets || !r->vin || !r->vtg || !r->tmp || !r->losses || !r->slots || !r->stash)
        goto nomem;
    if (x->tied && x->S > 1 && (x->stage == 0 || x->stage == x->S - 1)) {
        /* rows of a tied exchange: at most Vp, at most the tokens of a step */
        size_t maxr = (size_t)(x->M + x->val_batches) * BT;
        maxr = maxr < (size_t)x->Vp ? maxr : (size_t)x->Vp;
        r->rowmask = malloc((size_t)x->Vp);
        r->valmask = calloc((size_t)x->Vp, 1);
        r->rows = malloc((size_t)x->Vp * sizeof(int));
        r->rowbuf = malloc(maxr * x->C * sizeof(float));
        if (!r->rowmask || !r->valmask || !r->rows || !r->rowbuf)
            goto nomem;
        if (x->val_batches > 0) { /* every validation reads the same batches (s_eval) */
            r->vl.pos = 0;
            for (int i = 0; i < x->val_batches; i++) {
                data_next_batch(&r->vl, r->vin, r->vtg);
                for (size_t e = 0; e < BT; e++)
                    r->valmask[r->vin[e]] = 1;
            }
            r->vl.pos = 0;
        }
    }
    /* TAH_NODE_TEST_CKPT_DELAY_MS=N: each checkpoint write takes N ms longer
     * (fault injection for tests: a slow disk at the end of a step) */
    if (node_test_setting("TAH_NODE_TEST_CKPT_DELAY_MS", &r->ckpt_delay_ms, err, sizeof err) != 0)
        goto fail;
    if (r->ckpt_delay_ms > 0)
        log_warn("job %llu: TAH_NODE_TEST_CKPT_DELAY_MS: each checkpoint write takes %ld ms longer",
                 (unsigned long long)j->id, r->ckpt_delay_ms);
    /* TAH_NODE_TEST_DROP_STEP=N: the first data message this process would
     * send in step N is not sent (fault injection for tests: a message lost
     * on a reset connection; the coordinator's stall watchdog recovers) */
    if (node_test_setting("TAH_NODE_TEST_DROP_STEP", &r->drop_step, err, sizeof err) != 0)
        goto fail;
    /* TAH_NODE_TEST_HANG_STEP=N: step N never ends and the runner never looks
     * at an abort again (fault injection for tests: a GPU call that does not
     * return; the agent's --stop-timeout ends the process) */
    if (node_test_setting("TAH_NODE_TEST_HANG_STEP", &r->hang_step, err, sizeof err) != 0)
        goto fail;
    /* TAH_NODE_TEST_LOAD_DELAY_MS=N: loading the stage takes N ms longer
     * (fault injection for tests: a slow disk or a big model; the agent
     * stays in LOADING meanwhile). The wait ends early on an abort. */
    long load_delay_ms = 0;
    if (node_test_setting("TAH_NODE_TEST_LOAD_DELAY_MS", &load_delay_ms, err, sizeof err) != 0)
        goto fail;
    if (load_delay_ms > 0) {
        log_warn("job %llu: TAH_NODE_TEST_LOAD_DELAY_MS: loading stage %d takes %ld ms longer",
                 (unsigned long long)j->id, j->stage, load_delay_ms);
        for (double until = s_now() + load_delay_ms / 1e3; s_now() < until && !atomic_load(&j->abort);)
            nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
    }
    /* TAH_NODE_HOST_ENCODE=1: encode on the host anyway (to compare the two paths) */
    const char *pe = getenv("TAH_NODE_PROFILE"), *te = getenv("TAH_NODE_TRACE");
    r->profile = pe && !strcmp(pe, "1");
    r->trace = te && !strcmp(te, "1") ? 1 : te && !strcmp(te, "mem") ? 2 : 0;
    if (r->trace == 2 && !(r->tr = malloc(R_NTRACE * sizeof *r->tr)))
        goto nomem;
    const char *he = getenv("TAH_NODE_HOST_ENCODE");
    r->dev_enc = stage_encodes_on_device(r->st) && !(he && !strcmp(he, "1"));
    /* TAH_NODE_HOST_DECODE=1: received frames decoded by the agent on the host (comparisons) */
    const char *hd = getenv("TAH_NODE_HOST_DECODE");
    r->dev_dec = stage_decodes_on_device(r->st) && !(hd && !strcmp(hd, "1"));
    if (r->dev_dec && !(r->dguard = guard_new(x->M, x->val_batches, x->max_norm_ratio)))
        goto nomem;
    atomic_store(&j->dev_dec, r->dev_dec);
    size_t cap = (size_t)(r->fwd_fs > r->bwd_fs ? r->fwd_fs : r->bwd_fs);
    for (int i = 0; r->dev_enc && i < R_NPINNED; i++) {
        r->pinned[i].buf = stage_host_alloc(r->st, cap);
        r->pinned[i].cap = r->pinned[i].buf ? cap : 0;
        atomic_init(&r->pinned[i].busy, 0);
    }
    char d[256];
    stage_describe(r->st, d, sizeof d);
    log_info("job %llu: stage %d/%d: %s; codecs fwd %s (%lld B/frame) bwd %s (%lld B/frame), encoded on the %s, "
             "decoded on the %s",
             (unsigned long long)j->id, j->stage, j->S, d, t->fwd_codec, (long long)r->fwd_fs, t->bwd_codec,
             (long long)r->bwd_fs, r->dev_enc ? "device into page-locked frames" : "host",
             r->dev_dec ? "device" : "host");
    return 0;
nomem:
    snprintf(err, sizeof err, "out of memory building the stage");
    rc = TAH_ENOMEM;
fail:
    gpt2_model_destroy(&model);
    snprintf(j->reason, sizeof j->reason, "%.500s", err);
    return rc;
}

static void s_teardown(runner_t *r)
{
    for (int i = 0; r->stash && i < r->nstash; i++)
        if (r->stash[i].used)
            s_release(r, i);
    free(r->stash);
    /* ZeroMQ may still be sending from a page-locked frame: wait for it
     * (5 s for all of them), and leave a buffer it never hands back allocated */
    double deadline = s_now() + 5.0;
    for (int i = 0; r->st && i < R_NPINNED; i++) {
        if (!r->pinned[i].buf)
            continue;
        while (atomic_load(&r->pinned[i].busy) && s_now() < deadline)
            nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
        if (atomic_load(&r->pinned[i].busy))
            log_warn("a frame buffer is still in use by the network layer; not freed");
        else
            stage_host_free(r->st, r->pinned[i].buf);
        r->pinned[i].buf = NULL;
    }
    stage_destroy(&r->st);
    free(r->acts);
    data_destroy(&r->train);
    data_destroy(&r->val);
    free(r->inputs);
    free(r->targets);
    free(r->vin);
    free(r->vtg);
    free(r->tmp);
    free(r->rowmask);
    free(r->rows);
    free(r->rowbuf);
    free(r->valmask);
    free(r->tr);
    guard_destroy(&r->dguard);
    free(r->losses);
    free(r->slots);
    free(r->spec);
}

/* Checkpoint of `step` (data position data_pos after it), then ask the
 * agent to replicate it to the coordinator. */
static int s_save(runner_t *r, int step, uint64_t data_pos)
{
    char path[2300], err[512];
    snprintf(path, sizeof path, "%s.stage%d.ckpt", r->job->ckpt_prefix, r->x->stage);
    ckpt_meta_t meta = { .step = step, .data_pos = data_pos, .seed = (uint64_t)r->spec->t.seed };
    struct timespec delay = { r->ckpt_delay_ms / 1000, r->ckpt_delay_ms % 1000 * 1000000L };
    while (r->ckpt_delay_ms > 0 && nanosleep(&delay, &delay) != 0 && errno == EINTR)
        ;
    if (ckpt_save(r->st, path, &meta, err, sizeof err) != 0) {
        snprintf(r->job->reason, sizeof r->job->reason, "checkpoint at step %d: %.400s", step, err);
        r->job->fail_step = step;
        return TAH_EIO;
    }
    log_info("job %llu step %d: wrote %s", (unsigned long long)r->job->id, step, path);
    size_t pl = strlen(path);
    char msg[sizeof(int32_t) + sizeof path];
    int32_t st32 = step;
    memcpy(msg, &st32, sizeof st32);
    memcpy(msg + sizeof st32, path, pl);
    s_send_cmd(r, 'C', msg, sizeof st32 + pl);
    return 0;
}

void *node_runner_main(void *arg)
{
    node_job_t *j = arg;
    runner_t rr;
    memset(&rr, 0, sizeof rr);
    runner_t *r = &rr;
    r->job = j;
    r->x = &j->x;
    r->pipe = zmq_socket(j->ctx, ZMQ_PAIR);
    int zero = 0, small = 4, timeout = 200;
    zmq_setsockopt(r->pipe, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(r->pipe, ZMQ_SNDHWM, &small, sizeof small);
    zmq_setsockopt(r->pipe, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(r->pipe, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    if (zmq_connect(r->pipe, j->pipe_ep) != 0) {
        snprintf(j->reason, sizeof j->reason, "internal: pipe connect failed: %s", zmq_strerror(errno));
        j->result = NODE_FAILED;
        zmq_close(r->pipe);
        return NULL; /* the agent notices the thread ended without 'X' only via join; it always sends 'X' below otherwise */
    }
    int start = 0;
    j->result = NODE_FAILED;
    if (s_setup(r, &start) != 0)
        goto out;
    atomic_store(&j->cur_step, start + 1); /* before 'Y': the agent checks steps against it */
    s_send_cmd(r, 'Y', NULL, 0);
    r->t_start = s_now();
    const trainopts_t *t = &r->spec->t;
    const int steps = t->steps, k = j->stage, S = j->S;
    int drained = -1; /* >= 0: stop; the last applied step */
    for (int s1 = start + 1; s1 <= steps; s1++) {
        atomic_store(&j->cur_step, s1);
        /* A Drain(D = s1 - 1) that came after the check at the end of step
         * s1 - 1 (say while its checkpoint was written): the agent saw step
         * s1 - 1 as the current one, so it did not abort us, and every other
         * stage stops after it: step s1 would wait for them for ever. Both
         * sides store, then load the other's value (sequentially consistent):
         * either the agent sees s1 and aborts, or this load sees D. */
        int late = atomic_load(&j->drain_step);
        if (late > 0 && late < s1) {
            drained = s1 - 1;
            break;
        }
        if (r->hang_step > 0 && s1 == r->hang_step) {
            log_warn("job %llu step %d: TAH_NODE_TEST_HANG_STEP: stage %d hangs for good", (unsigned long long)j->id,
                     s1, k);
            for (;;)
                nanosleep(&(struct timespec){ 1, 0 }, NULL);
        }
        s_purge(r, s1);
        const uint64_t pos_before = r->data_pos; /* the data position after step s1 - 1 */
        double val_loss = NAN, t0 = s_now(), t_eval = 0.0, loss = 0.0, norm = 0.0;
        float lr = 0.0f;
        int rc = 0;
        const int eval = r->x->val_batches && (s1 == 1 || s1 % t->val_every == 0 || s1 == steps);
        r->bytes_fwd = r->bytes_bwd = r->fp32_fwd = r->fp32_bwd = r->bytes_tied = r->bytes_val = r->fp32_val = 0;
        memset(r->ph, 0, sizeof r->ph);
        atomic_store(&j->rx_ns, 0);
        if (k == 0 || k == S - 1) /* the step's batches (the tied exchange's rows need them first) */
            for (int m = 0; m < r->x->M; m++)
                data_next_batch(&r->dl, r->inputs + (size_t)m * r->x->B * r->x->T,
                                r->targets + (size_t)m * r->x->B * r->x->T);
        if (r->x->tied && S > 1 && (k == 0 || k == S - 1))
            rc = s_tied_weights(r, s1, eval);
        if (!rc && eval) { /* not part of the step's time and phases */
            double ph[P_N];
            memcpy(ph, r->ph, sizeof ph);
            const double te = s_now();
            rc = s_eval(r, s1, &val_loss);
            t_eval = s_now() - te;
            memcpy(r->ph, ph, sizeof ph);
        }
        if (!rc)
            rc = s_step(r, s1, &loss, &norm, &lr);
        if (rc) {
            int ds = atomic_load(&j->drain_step);
            if (ds > 0 && ds < s1) { /* drained: step s1 was abandoned before its update */
                r->data_pos = pos_before;
                drained = s1 - 1;
                break;
            }
            goto out; /* failed, or aborted (out: says which) */
        }
        double dt = s_now() - t0 - t_eval;
        if (k == S - 1 && !isfinite(loss)) {
            snprintf(j->reason, sizeof j->reason, "step %d: loss is %f; HINT: lower lr or enable grad_clip", s1,
                     loss);
            j->fail_step = s1;
            goto out;
        }
        Tah__StepReport sr = TAH__STEP_REPORT__INIT;
        sr.job = j->id;
        sr.stage = (uint32_t)k;
        sr.step = s1;
        sr.has_loss = k == S - 1;
        sr.loss = loss;
        sr.has_val_loss = k == S - 1 && !isnan(val_loss);
        sr.val_loss = sr.has_val_loss ? val_loss : 0.0;
        sr.lr = lr;
        sr.grad_norm = norm;
        sr.ms = dt * 1e3;
        sr.val_ms = t_eval * 1e3;
        sr.time_s = s_now() - r->t_start;
        sr.fwd_bytes = r->bytes_fwd;
        sr.bwd_bytes = r->bytes_bwd;
        sr.fwd_fp32_bytes = r->fp32_fwd;
        sr.bwd_fp32_bytes = r->fp32_bwd;
        sr.tied_bytes = r->bytes_tied;
        sr.val_bytes = r->bytes_val;
        sr.val_fp32_bytes = r->fp32_val;
        sr.rejected = atomic_load(j->rejected);
        Tah__Envelope env = TAH__ENVELOPE__INIT;
        env.body_case = TAH__ENVELOPE__BODY_STEP_REPORT;
        env.step_report = &sr;
        s_report(r, &env);
        if (k == S - 1)
            log_info("job %llu step %d/%d: loss %.4f | norm %.4f | %.1f ms", (unsigned long long)j->id, s1, steps,
                     loss, norm, dt * 1e3);
        if (r->profile)
            s_log_profile(r, s1, dt);
        int ds = atomic_load(&j->drain_step);
        if (ds > 0 && s1 >= ds && s1 < steps) {
            drained = s1;
            break;
        }
        int ce = r->spec->checkpoint_every;
        if (ce && s1 % ce == 0 && s1 < steps && s_save(r, s1, r->data_pos) != 0)
            goto out;
    }
    atomic_store(&j->steps_over, 1);
    if (drained >= 0) {
        if (s_save(r, drained, r->data_pos) != 0)
            goto out;
        j->drained_step = drained;
        j->result = NODE_DRAINED;
        log_info("job %llu: stage %d drained after step %d", (unsigned long long)j->id, k, drained);
        goto out;
    }
    if ((t->save_ckpt[0] || r->spec->checkpoint_every) && s_save(r, steps, r->data_pos) != 0)
        goto out;
    j->result = NODE_DONE;
out:
    atomic_store(&j->steps_over, 1);
    for (int i = 0; i < r->ntr; i++)
        log_info("trace: stage %d sent %s step %d mb %d crc %08x", j->stage, wire_data_kind_name(r->tr[i].kind),
                 r->tr[i].step, r->tr[i].mb, r->tr[i].crc);
    if (atomic_load(&j->abort) && j->result != NODE_DONE && j->result != NODE_DRAINED)
        j->result = NODE_ABORTED;
    /* the step we stopped in, however we ended: the agent's event names it
     * when it stopped us, which may be after our last step (a neighbour's
     * silence, an Abort or a second signal while the last checkpoint is
     * written: NODE_DONE all the same) */
    if (!j->fail_step)
        j->fail_step = atomic_load(&j->cur_step);
    s_teardown(r);
    s_send_cmd(r, 'X', NULL, 0);
    zmq_close(r->pipe);
    return NULL;
}
