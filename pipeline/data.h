/* data.h — training data: llm.c token files and raw UTF-8 text.
 *
 * Formats:
 *   llm.c token file: 256 int32 little-endian header [20240520, 1, ntok, 0...]
 *     followed by ntok uint16 tokens, nothing after. Used for any file that
 *     starts with the magic or whose name ends in ".bin".
 *   anything else: raw text, one token per byte (byte-level tokenizer, V=256).
 * data_load rejects a truncated file, a wrong magic or version, trailing
 * bytes, an empty file and any token >= V, with a message naming the file,
 * the value and the position.
 *
 * The loader walks the token stream llm.c-style: a batch is B*T+1
 * consecutive tokens at pos (inputs = first B*T, targets = shifted by one);
 * pos advances by B*T and wraps to 0 when the next batch would not fit.
 *
 * Memory: data_t owns its token array. */
#ifndef TAH_DATA_H
#define TAH_DATA_H

#include <stddef.h>
#include <stdint.h>

#define DATA_MAGIC 20240520
#define DATA_VERSION 1
#define DATA_HEADER_INTS 256

typedef struct data {
    int *tok;    /* n tokens */
    size_t n;
    int is_text; /* 1: raw bytes */
} data_t;

int data_load(const char *path, int V, data_t **out, char *err, size_t errlen);
void data_destroy(data_t **self_p);
/* Write n tokens (each 0..65535) as an llm.c token file, atomically. */
int data_write_tokens(const char *path, const int *tok, size_t n, char *err, size_t errlen);

typedef struct data_loader {
    const data_t *d;
    int B, T;
    size_t pos; /* next batch starts here (saved in checkpoints) */
} data_loader_t;

/* TAH_EINVAL (message) when the data holds fewer than B*T+1 tokens. */
int data_loader_init(data_loader_t *dl, const data_t *d, int B, int T, char *err, size_t errlen);
void data_next_batch(data_loader_t *dl, int *inputs /* (B,T) */, int *targets /* (B,T) */);

#endif
