/* node.h — tah-node internals: the agent (I/O thread: coordinator link,
 * data-plane sockets, validation) and the runner (compute thread: one
 * pipeline stage running the job's schedule), and the in-process pipe
 * between them.
 *
 * Threads and ownership: every ZeroMQ socket except the runner's end of
 * the pipe belongs to the agent thread. The runner never touches the
 * network: it encodes frames and hands them to the agent ('S'), and gets
 * validated, decoded tensors back ('D'). Messages on the pipe (inproc PAIR,
 * multipart, first frame one command byte):
 *   runner -> agent  'Y'                       stage built; job->x is filled
 *                    'S' [dest][header][frame] send to a neighbour (zero-copy frame)
 *                    'R' [packed Envelope]     forward to the coordinator
 *                    'C' [int32 step][path]    a checkpoint was written: replicate it
 *                                              to the coordinator
 *                    'X'                       runner is done; job->result says how
 *   agent -> runner  'D' [node_meta_t][data]   a validated message's content
 *                    'A' [reason]              abort the job
 * The runner's sends block when the agent stops reading (a peer's queue is
 * at its high-water mark): that is the back-pressure that bounds memory. */
#ifndef TAH_NODE_H
#define TAH_NODE_H

#include <stdatomic.h>
#include <stdint.h>

#include "link.h"   /* link_expect_t */
#include "tpcomm.h" /* TP_MAX */

enum { NODE_DEST_DOWN = 1, NODE_DEST_UP = 2, NODE_DEST_TIED = 3 };
enum { NODE_DONE = 1, NODE_FAILED = 2, NODE_ABORTED = 3, NODE_DRAINED = 4 };

typedef struct node_meta { /* what the agent tells the runner about a data message */
    uint32_t kind;
    int32_t step, mb;
    uint32_t frame;        /* 1: the data is the received frame, checked up to its decode, which is
                              the runner's (dev_dec); 0: the decoded tensor */
    uint64_t data_pos;     /* NORM_PARTIAL */
    double value;          /* NORM */
} node_meta_t;

/* One assigned job, shared by agent and runner. The agent fills the
 * assignment fields before starting the runner; the runner fills x before
 * sending 'Y' and result/reason before 'X'. */
typedef struct node_job {
    /* assignment (agent) */
    uint64_t id, token;
    int stage, S;
    int layer0, layer1;            /* -1: tah-train's split of the model's L */
    char *ini;                     /* owned */
    char base_dir[1024];
    char ckpt_prefix[2200];
    char resume_file[2300];        /* "" or a checkpoint to start from (the coordinator's replica) */
    char (*endpoints)[256];        /* per stage */
    char (*names)[64];             /* per stage */
    char (*keys)[41];              /* per stage: CURVE public key (Z85); NULL: plaintext data plane */
    int threads;
    int cuda, device;              /* cuda: the stage runs on cuda:device (the node's --device) ... */
    int ndevices, devices[TP_MAX]; /* ... or, ndevices > 0, its tensor-parallel ranks on devices[] */
    int tp;                        /* > 0: the node's --tp (overrides the job's tp) */
    uint32_t peer_timeout_ms;
    void *ctx;                     /* ZeroMQ context (for the runner's pipe end) */
    char pipe_ep[64];              /* inproc endpoint */
    /* filled by the runner */
    link_expect_t x;
    int result;                    /* NODE_DONE / NODE_FAILED / NODE_ABORTED */
    int fail_step;                 /* the step it stopped in, whatever the result (events name it) */
    int drained_step;              /* NODE_DRAINED: the last step applied (its checkpoint was written) */
    char reason[512];
    /* shared counters */
    atomic_int cur_step;           /* step the runner works on (1-based) */
    atomic_int abort;              /* set by the agent */
    atomic_int drain_step;         /* > 0: stop after this step (Drain); set by the agent, also
                                      before the runner has started (FETCHING, LOADING) */
    atomic_int steps_over;         /* set by the runner once it has left its step loop: it waits for
                                      no neighbour any more (only its last checkpoint is left) */
    atomic_ullong *rejected;       /* the agent's rejection counter */
    atomic_int dev_dec;            /* the runner decodes ACT, GRAD and EVAL frames on its stage's
                                      device (set before 'Y'); the agent checks them up to that */
    atomic_int tied_peer;          /* last stage: the first stage has connected (its hello came), so
                                      TIED can go to it (set by the agent) */
    atomic_ullong rx_ns;           /* the agent's time validating and decoding received tensors
                                      (TAH_NODE_PROFILE: the runner reads and resets it per step) */
} node_job_t;

/* Runner thread entry (arg: node_job_t *). */
void *node_runner_main(void *arg);

typedef struct node_opts {
    const char *coordinator;       /* HOST:PORT */
    const char *name;
    const char *listen;            /* HOST:PORT (port 0: ephemeral) */
    const char *advertise;         /* host others use to reach us (default: the listen host) */
    int threads;
    int cuda, device;              /* --device cuda:K: cuda = 1, device = K (0, 0: cpu); tp > 1: ranks on K+r */
    int ndevices, devices[TP_MAX]; /* --device cuda:K,L,...: one GPU per tensor-parallel rank (ndevices = tp) */
    int tp;                        /* --tp N: tensor-parallel degree of the stages it runs (0: the job's) */
    double coord_timeout;          /* s */
    double stop_timeout;           /* s a stage may take to stop when asked (0: no limit); past it and
                                      three times its slowest step, the node exits (agent.c: s_stuck) */
    const char *pid_file;          /* --pid-file (removed at exit), or NULL */
    const char *coordinator_key;   /* secure coordinator: its public key (Z85 or file); NULL: plaintext */
    const char *key_file;          /* our secret key (tah-node keygen); NULL: a one-off key */
    const char *token;             /* join token sent in hello, or NULL */
    double gpu_gflops[2];          /* cuda: its GPUs' measured speed, fp32 and bf16 (main.c: cu_stage_bench);
                                      announced instead of the CPU's sgemm */
    char device_id[TP_MAX * 33];   /* cuda: its GPUs' UUIDs (hex, comma-separated): nodes that share a GPU */
} node_opts_t;

/* The agent's event loop; returns the exit status. */
int node_agent_run(const node_opts_t *o);

/* A test-only fault-injection setting from the environment variable `name`
 * (TAH_NODE_TEST_CKPT_DELAY_MS, _LOAD_DELAY_MS, _FETCH_DELAY_MS in ms;
 * _DROP_STEP, _HANG_STEP, a step): *v = 0 when it is unset; a value outside 0..600000
 * is an error (message in err). */
int node_test_setting(const char *name, long *v, char *err, size_t errlen);

/* Measured sgemm speed of this machine with n threads, GFLOP/s. */
double node_bench_gflops(int threads);

#endif
