/* gpt2.h — GPT-2 model configuration, parameter layout and llm.c model files.
 *
 * Parameter tensors, in llm.c's order (this order is the file format):
 *   wte (Vp,C)  wpe (maxT,C)  ln1w ln1b (L,C)  qkvw (L,3C,C)  qkvb (L,3C)
 *   attprojw (L,C,C)  attprojb (L,C)  ln2w ln2b (L,C)  fcw (L,4C,C)  fcb (L,4C)
 *   fcprojw (L,C,4C)  fcprojb (L,C)  lnfw lnfb (C)
 * Rows V..Vp-1 of wte are padding (zero, never used by the loss).
 *
 * llm.c model file (train_gpt2.c, version 3): 256 int32 little-endian header
 *   [20240326, 3, maxT, V, L, NH, C, Vp, 0...] then the float32 parameters
 *   above, nothing after. gpt2_model_read checks magic, version, config and
 *   the exact file size before trusting it; gpt2_model_write writes
 *   atomically (tmp, fsync, rename).
 *
 * Memory: a gpt2_model_t owns one allocation of all parameters; tensor
 * pointers t[i] point into it. */
#ifndef TAH_GPT2_H
#define TAH_GPT2_H

#include <stddef.h>
#include <stdint.h>

#define GPT2_MODEL_MAGIC 20240326
#define GPT2_MODEL_VERSION 3
#define GPT2_HEADER_INTS 256

typedef struct gpt2_config {
    int maxT; /* max sequence length (positions in wpe) */
    int V;    /* vocabulary size */
    int Vp;   /* padded vocabulary size (rows of wte), >= V */
    int L;    /* layers */
    int NH;   /* attention heads, divides C */
    int C;    /* channels */
} gpt2_config_t;

enum {
    GPT2_WTE, GPT2_WPE, GPT2_LN1W, GPT2_LN1B, GPT2_QKVW, GPT2_QKVB,
    GPT2_ATTPROJW, GPT2_ATTPROJB, GPT2_LN2W, GPT2_LN2B, GPT2_FCW, GPT2_FCB,
    GPT2_FCPROJW, GPT2_FCPROJB, GPT2_LNFW, GPT2_LNFB,
    GPT2_NTENSORS
};

/* Name of tensor i ("qkvw"). */
const char *gpt2_tensor_name(int i);
/* 1 for the per-layer tensors ln1w..fcprojb. */
int gpt2_tensor_per_layer(int i);
/* 1 for weight matrices (wte, wpe, qkvw, attprojw, fcw, fcprojw): the
 * tensors AdamW decays. */
int gpt2_tensor_is_matrix(int i);
/* Elements of tensor i for one layer (per-layer tensors) or in total. */
size_t gpt2_tensor_layer_size(const gpt2_config_t *cfg, int i);
/* Full-model sizes in elements; returns the total. */
size_t gpt2_param_sizes(const gpt2_config_t *cfg, size_t sizes[GPT2_NTENSORS]);

/* Check ranges (every field >= 1, NH | C, V <= Vp, sizes that fit memory
 * arithmetic). 0 or TAH_EINVAL with a message naming the field and value. */
int gpt2_config_validate(const gpt2_config_t *cfg, char *err, size_t errlen);
/* Padded vocabulary llm.c-style: V rounded up to a multiple of 128 (V >= 1024)
 * or left as is (small byte-level vocabularies). */
int gpt2_padded_vocab(int V);

typedef struct gpt2_model {
    gpt2_config_t cfg;
    size_t sizes[GPT2_NTENSORS];
    size_t nparams;
    float *params;               /* one allocation, nparams floats */
    float *t[GPT2_NTENSORS];     /* tensor views into params */
} gpt2_model_t;

/* Zero-initialised model; NULL on bad config (err filled) or no memory. */
gpt2_model_t *gpt2_model_new(const gpt2_config_t *cfg, char *err, size_t errlen);
void gpt2_model_destroy(gpt2_model_t **self_p);
/* GPT-2 initialisation: N(0, 0.02) matrices, residual projections
 * (attprojw, fcprojw) N(0, 0.02/sqrt(2L)), zero biases, unit LN weights,
 * zero wte padding rows. Deterministic in seed. */
void gpt2_model_init_random(gpt2_model_t *m, uint64_t seed);
/* Read an llm.c model file. 0 or TAH_EIO/TAH_EMAGIC/TAH_EVERSION/TAH_EINVAL/
 * TAH_ETRUNC/TAH_ESIZE/TAH_ENONFINITE/TAH_ENOMEM with a message in err. */
int gpt2_model_read(const char *path, gpt2_model_t **out, char *err, size_t errlen);
/* Write an llm.c model file atomically. 0 or TAH_EIO. */
int gpt2_model_write(const char *path, const gpt2_model_t *m, char *err, size_t errlen);

/* Deterministic random numbers shared by init and tests (splitmix64). */
uint64_t gpt2_rand_u64(uint64_t *state);
/* Standard normal (Box-Muller in double). */
double gpt2_rand_normal(uint64_t *state);

#endif
