/* ckpt.h — per-stage training checkpoints (parameters + AdamW state + step
 * + data position), the project's own format.
 *
 * Layout (little-endian):
 *   0   u32 magic 0x4B484154 ("TAHK")     4  u32 version (1)
 *   8   i32 maxT, V, Vp, L, NH, C         32 i32 layer0, layer1, first, last, tied, 0
 *   56  u64 nparams                       64 i64 AdamW step count t
 *   72  i64 training steps done           80 u64 data position (train loader)
 *   88  u64 seed                          96 7 x u32 reserved (0)
 *   124 u32 CRC-32C of bytes [0,124) and the payload
 *   128 payload: params, then m, then v (nparams float32 each, stage
 *       tensor order of stage_param_sizes)
 * ckpt_save writes atomically (tmp, fsync, rename): a crash leaves the old
 * file or the new one. ckpt_load checks magic, version, exact size, CRC and
 * that the checkpoint belongs to this stage (config, layer range, tying)
 * before touching the stage. */
#ifndef TAH_CKPT_H
#define TAH_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "stage.h"

#define CKPT_MAGIC 0x4B484154u
#define CKPT_VERSION 1u
#define CKPT_HEADER_SIZE 128u

typedef struct ckpt_meta {
    long long step;    /* training steps done */
    uint64_t data_pos; /* train loader position */
    uint64_t seed;
} ckpt_meta_t;

int ckpt_save(const stage_t *s, const char *path, const ckpt_meta_t *meta, char *err, size_t errlen);
int ckpt_load(stage_t *s, const char *path, ckpt_meta_t *meta, char *err, size_t errlen);

#endif
