/* train_main.c — tah-train: single-process pipeline trainer (all stages in
 * one process), the reference the distributed runtime must match.
 *
 * Exit status: 0 ok, 1 runtime error (bad file, bad config, I/O), 2 usage. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data.h"    /* data_load, data_loader_* */
#include "errors.h"
#include "gpt2.h"    /* gpt2_model_* */
#include "layers.h"  /* layers_set_threads, layers_max_threads */
#include "trainer.h" /* trainer_* */
#include "trainopts.h" /* trainopts_*: the option table shared with job files */
#ifdef TAH_HAVE_CUDA_STAGE
#include "cu_stage.h" /* cu_stage_register, cu_stage_device_count */
#endif

static const char *s_usage =
    "usage: tah-train (--init-from MODEL.bin | --model L,NH,C,maxT,V[,Vp]) --train-data F\n"
    "                 [--val-data F] --batch B --seq T --steps N --lr X\n"
    "                 [--lr-schedule constant|cosine] [--warmup N] [--weight-decay X]\n"
    "                 [--beta1 X] [--beta2 X] [--eps X] [--grad-clip X (0 = off)]\n"
    "                 [--stages S] [--micro-batches M] [--schedule 1f1b|gpipe]\n"
    "                 [--fwd-codec SPEC] [--bwd-codec SPEC] [--threads N] [--seed N]\n"
    "                 [--tp N] [--tp-codec SPEC] [--tp-codec-ag SPEC]\n"
    "                 [--metrics FILE] [--save MODEL.bin]\n"
    "                 [--val-every N] [--val-batches N] [--lr-min-frac X] [--untied] [--tied-codec SPEC]\n"
    "                 [--save-ckpt PREFIX] [--ckpt-every N] [--resume PREFIX] [--quiet]\n"
    "                 [--device cpu|cuda:K|cuda:K,L,...] [--precision fp32|bf16]\n"
    "\n"
    "  --init-from F     start from an llm.c GPT-2 model file (version 3)\n"
    "  --model ...       random GPT-2 init (--seed); Vp defaults to V rounded up to 128 (V >= 1024)\n"
    "  --train-data F    llm.c token file (.bin, magic 20240520) or raw UTF-8 text (byte tokens, V >= 256)\n"
    "  --val-data F      validation data, same formats (default: none)\n"
    "  --batch B         sequences per micro-batch; a step takes M*B sequences of T tokens\n"
    "  --seq T           sequence length, <= maxT\n"
    "  --steps N         total optimizer steps (with --resume: up to N)\n"
    "  --lr X            peak learning rate; --warmup N linear warm-up steps (0);\n"
    "                    --lr-schedule cosine decays to lr*lr-min-frac (0) at the last step\n"
    "  --weight-decay X  AdamW decay of weight matrices (0); --beta1 0.9 --beta2 0.95 --eps 1e-8\n"
    "  --grad-clip X     global gradient-norm clip (1.0; 0 = off)\n"
    "  --stages S        pipeline stages, 1..L (1); --micro-batches M (1); --schedule 1f1b (default) or gpipe\n"
    "  --fwd-codec SPEC  codec of every stage-boundary activation (fp32); e.g. tah:hi_frac=0.8\n"
    "  --bwd-codec SPEC  codec of every stage-boundary gradient (fp32); e.g. fixpt:bits=8\n"
    "  --threads N       OpenMP/OpenBLAS threads (default: all cores)\n"
    "  --tp N            tensor parallelism: every stage's layers on N ranks, Megatron-style (1..8, must\n"
    "                    divide NH): N worker threads (each gets threads/N threads), or N GPUs with --device\n"
    "  --tp-codec SPEC   codec of the tensor-parallel all-reduce: none (exact fp32 sum, default),\n"
    "                    ash-fp8, int:bits=4, fp16, bf16, fixpt; --tp-codec-ag SPEC for its\n"
    "                    all-gather shot (default: the same), e.g. --tp-codec int:bits=4 --tp-codec-ag int:bits=8\n"
    "  --metrics FILE    one JSON object per step (default metrics.jsonl; '' = none)\n"
    "  --save F          write the trained model as an llm.c model file (atomically)\n"
    "  --val-every N     evaluate every N steps (50), on --val-batches batches (8)\n"
    "  --untied          LM head independent of wte (no tied-embedding sync)\n"
    "  --tied-codec SPEC codec of the tied-embedding gradient exchange between the first and the last\n"
    "                    stage, as tah-node sends it (fp32 = exact, default); e.g. fixpt:bits=8, bf16\n"
    "  --save-ckpt P     write per-stage checkpoints P.stage<k>.ckpt (atomically) at the end,\n"
    "                    and every N steps with --ckpt-every N\n"
    "  --resume P        continue from per-stage checkpoints P.stage<k>.ckpt\n"
    "  --device D        cpu (default) or cuda:K: every stage on GPU K (the CUDA backend); with --tp N on\n"
    "                    GPUs K..K+N-1, or on the N GPUs of a list cuda:K,L,... (NCCL all-reduce)\n"
    "  --precision P     fp32 (default) or bf16 (cuda only: bf16 activations, fp32 master weights)\n";

static int s_usage_error(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "tah-train: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n%s", s_usage);
    return 2;
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void s_fmt_eta(char *buf, size_t n, double sec)
{
    long s = (long)(sec + 0.5);
    if (s >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
    else
        snprintf(buf, n, "%ld:%02ld", s / 60, s % 60);
}

int main(int argc, char **argv)
{
    /* values and ranges: the option table shared with job files (trainopts.h) */
    trainopts_t o;
    trainopts_defaults(&o);
    const char *metrics_path = "metrics.jsonl"; /* tah-train only: '' turns it off */
    char err[512] = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(s_usage, stdout);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0)
            return s_usage_error("unexpected argument '%s'%s", a, "");
        const char *name = a + 2;
        if (!trainopts_known(name) || strchr(name, '_'))
            return s_usage_error("unknown option %s%s", a, "");
        if (trainopts_is_flag(name)) {
            trainopts_set(&o, name, "1", NULL, 0);
            continue;
        }
        if (i + 1 >= argc)
            return s_usage_error("option %s needs a value%s", a, "");
        const char *v = argv[++i];
        if (!strcmp(name, "metrics")) {
            metrics_path = v;
            continue;
        }
        if (trainopts_set(&o, name, v, err, sizeof err) != 0)
            return s_usage_error("bad value for %s: %s", a, err);
    }
    if (!!o.init_from[0] == !!o.model[0])
        return s_usage_error("give exactly one of --init-from or --model%s%s", "", "");
    if (!o.train_data[0])
        return s_usage_error("--train-data is required%s%s", "", "");
    if (o.ckpt_every && !o.save_ckpt[0])
        return s_usage_error("--ckpt-every needs --save-ckpt PREFIX%s%s", "", "");
    if (!o.batch || !o.seq || !o.steps || !o.have_lr)
        return s_usage_error("--batch, --seq, --steps and --lr are required%s%s", "", "");
    if (o.precision != 0 && o.device < 0)
        return s_usage_error("--precision bf16 needs --device cuda:K%s%s", "", "");
    if (o.ndevices > 0 && o.ndevices != o.tp) {
        char why[160];
        snprintf(why, sizeof why, "%d GPUs but --tp is %d", o.ndevices, o.tp);
        return s_usage_error("--device lists %s: one GPU per tensor-parallel rank (cuda:K puts rank r on GPU K+r)%s",
                             why, "");
    }
    if (o.device >= 0) {
#ifdef TAH_HAVE_CUDA_STAGE
        int ndev = cu_stage_device_count();
        for (int r = 0; r < (o.tp > 1 ? o.tp : 1); r++) {
            const int d = o.ndevices ? o.devices[r] : o.device + r;
            if (d >= ndev) {
                fprintf(stderr, "tah-train: --device: cuda:%d%s: no such device (%d CUDA devices visible)%s\n", d,
                        o.tp > 1 ? " (a tensor-parallel rank's GPU)" : "", ndev,
                        ndev ? "" : "; HINT: is the NVIDIA driver loaded? --device cpu runs without a GPU");
                return 1;
            }
        }
        cu_stage_register();
#else
        fprintf(stderr, "tah-train: --device cuda:%d: this tah-train was built without the CUDA backend "
                        "(TAH_CUDA=OFF or no nvcc at build time); HINT: --device cpu\n", o.device);
        return 1;
#endif
    }
    /* the model's own limits are checked against the model below (exit 1),
     * as for --init-from */
    const char *init_from = o.init_from[0] ? o.init_from : NULL, *model_str = o.model[0] ? o.model : NULL;
    const char *train_path = o.train_data, *val_path = o.val_data[0] ? o.val_data : NULL;
    const char *fwd_codec = o.fwd_codec, *bwd_codec = o.bwd_codec;
    const char *save_path = o.save[0] ? o.save : NULL, *save_ckpt = o.save_ckpt[0] ? o.save_ckpt : NULL;
    const char *resume = o.resume[0] ? o.resume : NULL;
    const int B = o.batch, T = o.seq, steps = o.steps, S = o.stages, M = o.micro_batches, threads = o.threads;
    const int val_every = o.val_every, val_batches = o.val_batches, untied = o.untied, quiet = o.quiet;
    const int ckpt_every = o.ckpt_every, seed = o.seed;
    const sched_kind_t sched = o.schedule;
    const int tp = o.tp;
    codec_spec_t tp_rs, tp_ag;
    if (trainopts_tp_codecs(&o, &tp_rs, &tp_ag, err, sizeof err) != 0)
        return s_usage_error("bad value: %s%s", err, "");
    const gpt2_config_t mcfg = o.mcfg;
    optim_opts_t opt = o.optim;

    int rc = 1;
    gpt2_model_t *model = NULL;
    data_t *train = NULL, *val = NULL;
    trainer_t *tr = NULL;
    FILE *mf = NULL;

    if (threads > 0)
        layers_set_threads(threads);
    else
        layers_set_threads(layers_max_threads());

    if (init_from) {
        if (gpt2_model_read(init_from, &model, err, sizeof err) != 0) {
            fprintf(stderr, "tah-train: %s\n", err);
            goto out;
        }
    } else {
        model = gpt2_model_new(&mcfg, err, sizeof err);
        if (!model) {
            fprintf(stderr, "tah-train: --model %s: %s\n", model_str, err);
            goto out;
        }
        gpt2_model_init_random(model, (uint64_t)seed);
    }
    const gpt2_config_t *cfg = &model->cfg;
    if (T > cfg->maxT) {
        fprintf(stderr, "tah-train: --seq %d exceeds the model's maxT = %d\n", T, cfg->maxT);
        goto out;
    }
    if (S > cfg->L) {
        fprintf(stderr, "tah-train: --stages %d exceeds the model's %d layers (each stage needs >= 1)\n", S, cfg->L);
        goto out;
    }
    if (tp > 1 && cfg->NH % tp != 0) {
        fprintf(stderr, "tah-train: --tp %d must divide the model's NH = %d attention heads\n", tp, cfg->NH);
        goto out;
    }
    if (data_load(train_path, cfg->V, &train, err, sizeof err) != 0) {
        fprintf(stderr, "tah-train: %s\n", err);
        goto out;
    }
    if (val_path && data_load(val_path, cfg->V, &val, err, sizeof err) != 0) {
        fprintf(stderr, "tah-train: %s\n", err);
        goto out;
    }
    data_loader_t dl, vl;
    if (data_loader_init(&dl, train, B, T, err, sizeof err) != 0) {
        fprintf(stderr, "tah-train: %s: %s\n", train_path, err);
        goto out;
    }
    if (val && data_loader_init(&vl, val, B, T, err, sizeof err) != 0) {
        fprintf(stderr, "tah-train: %s: %s\n", val_path, err);
        goto out;
    }
    opt.total_steps = steps;
    trainer_opts_t to = { .cfg = *cfg, .S = S, .M = M, .B = B, .T = T, .sched = sched,
                          .tied = !untied, .fwd_codec = fwd_codec, .bwd_codec = bwd_codec,
                          .tied_codec = o.tied_codec,
                          .tp = tp, .tp_rs = tp_rs, .tp_ag = tp_ag,
                          .optim = opt, .backend = o.device >= 0 ? STAGE_CUDA : STAGE_CPU,
                          .device = o.device >= 0 ? o.device : 0, .ndevices = o.ndevices,
                          .precision = o.precision };
    memcpy(to.devices, o.devices, sizeof to.devices);
    tr = trainer_new(&to, model, err, sizeof err);
    if (!tr) {
        fprintf(stderr, "tah-train: %s\n", err);
        goto out;
    }
    int start = 0;
    if (resume) {
        ckpt_meta_t meta;
        if (trainer_load_ckpt(tr, resume, &meta, err, sizeof err) != 0) {
            fprintf(stderr, "tah-train: --resume: %s\n", err);
            goto out;
        }
        if (meta.data_pos + (size_t)B * T + 1 > train->n) {
            fprintf(stderr, "tah-train: --resume: data position %llu is beyond %s (%zu tokens); HINT: same --train-data?\n",
                    (unsigned long long)meta.data_pos, train_path, train->n);
            goto out;
        }
        dl.pos = meta.data_pos;
        start = (int)meta.step;
    }
    if (metrics_path && *metrics_path) {
        mf = fopen(metrics_path, "w");
        if (!mf) {
            fprintf(stderr, "tah-train: %s: cannot open for writing: %s\n", metrics_path, strerror(errno));
            goto out;
        }
    }

    if (!quiet) {
        printf("tah-train: model L=%d NH=%d C=%d maxT=%d V=%d Vp=%d (%zu params), %s embeddings\n",
               cfg->L, cfg->NH, cfg->C, cfg->maxT, cfg->V, cfg->Vp, model->nparams,
               untied ? "untied" : "tied");
        printf("tah-train: %d stage(s), %d micro-batch(es) of B=%d T=%d, schedule %s, codecs fwd=%s bwd=%s%s%s, %d threads\n",
               S, M, B, T, sched_name(sched), fwd_codec, bwd_codec, !untied && S > 1 ? " tied=" : "",
               !untied && S > 1 ? o.tied_codec : "", layers_max_threads());
        for (int k = 0; k < S; k++) {
            char d[256];
            stage_describe(tr->stages[k], d, sizeof d);
            printf("tah-train: stage %d: %s\n", k, d);
        }
        printf("tah-train: train %s (%zu tokens%s)%s%s\n", train_path, train->n,
               train->is_text ? ", byte-level text" : "", val ? ", val " : "", val ? val_path : "");
        fflush(stdout);
    }

    const double tokens_per_step = (double)M * B * T;
    double t_train = 0.0;
    int timed = 0;
    for (int step = start; step < steps; step++) {
        int s1 = step + 1;
        double val_loss = NAN;
        if (val && (s1 == 1 || s1 % val_every == 0 || s1 == steps)) {
            vl.pos = 0;
            if (trainer_eval(tr, &vl, val_batches, &val_loss, err, sizeof err) != 0) {
                fprintf(stderr, "tah-train: validation: %s\n", err);
                goto out;
            }
            if (!quiet)
                printf("step %5d/%d | val loss %.4f\n", s1, steps, val_loss);
        }
        trainer_stats_t st;
        double t0 = s_now();
        if (trainer_step(tr, &dl, &st, err, sizeof err) != 0) {
            fprintf(stderr, "tah-train: %s\n", err);
            goto out;
        }
        double dt = s_now() - t0;
        if (!isfinite(st.loss)) {
            fprintf(stderr, "tah-train: step %d: loss is %f; HINT: lower --lr or enable --grad-clip\n", s1, st.loss);
            goto out;
        }
        if (step > start || steps - start == 1) {
            t_train += dt;
            timed++;
        }
        double avg = timed ? t_train / timed : dt;
        char eta[32];
        s_fmt_eta(eta, sizeof eta, avg * (steps - s1));
        if (!quiet) {
            printf("step %5d/%d | loss %.4f | lr %.2e | norm %.4f | %.0f tok/s | %.1f ms | ETA %s\n", s1,
                   steps, st.loss, (double)st.lr, st.grad_norm, tokens_per_step / dt, dt * 1e3, eta);
            fflush(stdout);
        }
        if (mf) {
            fprintf(mf, "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,\"tokens_per_s\":%.1f,\"ms\":%.3f",
                    s1, st.loss, (double)st.lr, st.grad_norm, tokens_per_step / dt, dt * 1e3);
            if (!isnan(val_loss))
                fprintf(mf, ",\"val_loss\":%.6f", val_loss);
            fprintf(mf, "}\n");
            fflush(mf);
        }
        if (ckpt_every && s1 % ckpt_every == 0 && s1 < steps) {
            ckpt_meta_t meta = { .step = tr->step, .data_pos = dl.pos, .seed = (uint64_t)seed };
            if (trainer_save_ckpt(tr, save_ckpt, &meta, err, sizeof err) != 0) {
                fprintf(stderr, "tah-train: --save-ckpt at step %d: %s\n", s1, err);
                goto out;
            }
        }
    }
    if (val) {
        double vloss = 0.0;
        vl.pos = 0;
        if (trainer_eval(tr, &vl, val_batches, &vloss, err, sizeof err) != 0) {
            fprintf(stderr, "tah-train: validation: %s\n", err);
            goto out;
        }
        if (!quiet)
            printf("final | val loss %.4f after %d steps\n", vloss, steps);
    }
    if (!quiet && timed)
        printf("tah-train: %.0f tokens/s average over %d timed steps\n", tokens_per_step * timed / t_train, timed);
    if (save_path) {
        if (trainer_export(tr, model) != 0 || gpt2_model_write(save_path, model, err, sizeof err) != 0) {
            fprintf(stderr, "tah-train: --save: %s\n", err);
            goto out;
        }
        if (!quiet)
            printf("tah-train: wrote %s%s\n", save_path, untied ? " (llm.c format: the untied head is not stored)" : "");
    }
    if (save_ckpt) {
        ckpt_meta_t meta = { .step = tr->step, .data_pos = dl.pos, .seed = (uint64_t)seed };
        if (trainer_save_ckpt(tr, save_ckpt, &meta, err, sizeof err) != 0) {
            fprintf(stderr, "tah-train: --save-ckpt: %s\n", err);
            goto out;
        }
        if (!quiet)
            printf("tah-train: wrote %s.stage0..%d.ckpt\n", save_ckpt, S - 1);
    }
    rc = 0;
out:
    if (mf && fclose(mf) != 0 && rc == 0) {
        fprintf(stderr, "tah-train: %s: write failed\n", metrics_path);
        rc = 1;
    }
    trainer_destroy(&tr);
    data_destroy(&train);
    data_destroy(&val);
    gpt2_model_destroy(&model);
    return rc;
}
