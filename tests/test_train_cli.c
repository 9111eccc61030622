/* test_train_cli.c — tah-train end to end: usage errors exit 2 with the
 * usage text; bad input (data with a wrong magic, a truncated model, bytes
 * >= V, --seq > maxT, an unwritable --save) exits 1 with a message naming
 * the file and value, leaving nothing half-written; a small 2-stage run
 * writes one metrics.jsonl object per step and an llm.c model file that
 * loads back; --save-ckpt + --resume continues exactly where it stopped. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "gpt2.h"

#ifndef TAH_TRAIN_EXE
#error "TAH_TRAIN_EXE must name the tah-train binary"
#endif

static char s_dir[64];
static char s_out[8192];

/* run tah-train with args; returns its exit status, stderr+stdout in s_out */
static int s_run(const char *args)
{
    char cmd[2048], log[128];
    snprintf(log, sizeof log, "%s/log.txt", s_dir);
    snprintf(cmd, sizeof cmd, "cd %s && %s %s > %s 2>&1", s_dir, TAH_TRAIN_EXE, args, log);
    int st = system(cmd);
    FILE *f = fopen(log, "rb");
    size_t n = f ? fread(s_out, 1, sizeof s_out - 1, f) : 0;
    s_out[n] = 0;
    if (f)
        fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void s_expect(const char *args, int want_rc, const char *want_msg)
{
    int rc = s_run(args);
    if (rc != want_rc || !strstr(s_out, want_msg))
        fail_msg("tah-train %s: exit %d (want %d), output:\n%s\n(want '%s')", args, rc, want_rc, s_out,
                 want_msg);
}

static int s_count(const char *needle)
{
    int n = 0;
    DIR *d = opendir(s_dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strstr(e->d_name, needle) != NULL;
    if (d)
        closedir(d);
    return n;
}

static void s_write(const char *name, const void *b, size_t n)
{
    char p[128];
    snprintf(p, sizeof p, "%s/%s", s_dir, name);
    FILE *f = fopen(p, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

static int s_setup(void **state)
{
    (void)state;
    strcpy(s_dir, "/tmp/tah_cli_XXXXXX");
    if (!mkdtemp(s_dir))
        return -1;
    /* generated English-like text, 20 kB */
    static char text[20000];
    const char *w[] = { "the ", "jury ", "said ", "it ", "was ", "a ", "day ", "of ", "county. " };
    size_t n = 0;
    uint64_t rs = 1;
    while (n < sizeof text - 16) {
        const char *x = w[gpt2_rand_u64(&rs) % 9];
        memcpy(text + n, x, strlen(x));
        n += strlen(x);
    }
    s_write("train.txt", text, n);
    s_write("val.txt", text + 10000, n - 10000);
    s_write("junk.bin", "this is not a token file, but long enough to have a header.............", 70);
    static unsigned char junk[2048];
    memset(junk, 0, sizeof junk);
    int32_t h[2] = { 20240326, 3 };
    memcpy(junk, h, 8);
    s_write("short_model.bin", junk, sizeof junk); /* zero config: rejected */
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

#define TINY "--model 2,2,32,16,256 --batch 2 --seq 16 --lr 1e-3 --threads 2 "

static void test_usage_errors(void **state)
{
    (void)state;
    s_expect("", 2, "usage: tah-train");
    s_expect("--train-data train.txt --batch 2 --seq 16 --steps 1 --lr 1e-3", 2, "exactly one of --init-from or --model");
    s_expect(TINY "--train-data train.txt", 2, "--steps and --lr are required");
    s_expect(TINY "--steps 1 --train-data train.txt --bogus 1", 2, "unknown option --bogus");
    s_expect(TINY "--steps x --train-data train.txt", 2, "bad value for --steps: steps = 'x' is not an integer");
    s_expect("--model 2,2,32 --batch 2 --seq 16 --lr 1e-3 --steps 1 --train-data train.txt", 2, "model = '2,2,32' wants L,NH,C,maxT,V");
    s_expect(TINY "--steps 1 --train-data train.txt --schedule zb", 2, "bad value for --schedule");
    s_expect(TINY "--steps 1 --train-data train.txt --fwd-codec nosuch", 2, "fwd-codec = 'nosuch': unknown codec");
    s_expect(TINY "--steps 1 --train-data train.txt --steps", 2, "needs a value");
    s_expect(TINY "--steps 1 --train-data train.txt --ckpt-every 2", 2, "--ckpt-every needs --save-ckpt");
    s_expect("--help", 0, "--micro-batches");
    /* tensor parallelism */
    s_expect(TINY "--steps 1 --train-data train.txt --tp 0", 2, "bad value for --tp: tp = '0' is not an integer in range 1..8");
    s_expect(TINY "--steps 1 --train-data train.txt --tp 9", 2, "range 1..8");
    s_expect(TINY "--steps 1 --train-data train.txt --tp two", 2, "bad value for --tp");
    s_expect(TINY "--steps 1 --train-data train.txt --tp 2 --tp-codec tah", 2, "not the tensor-parallel all-reduce");
    s_expect(TINY "--steps 1 --train-data train.txt --tp 2 --tp-codec-ag int:bits=7", 2, "bad value for --tp-codec-ag");
    s_expect("--help", 0, "--tp-codec-ag SPEC");
}

static void test_runtime_errors(void **state)
{
    (void)state;
    s_expect(TINY "--steps 1 --train-data junk.bin", 1, "junk.bin: bad magic 0x73696874 (expected 20240520");
    s_expect(TINY "--steps 1 --train-data missing.txt", 1, "missing.txt: No such file");
    s_expect("--init-from short_model.bin --batch 2 --seq 16 --lr 1e-3 --steps 1 --train-data train.txt", 1,
             "short_model.bin: header has a bad config");
    s_expect("--model 2,2,32,16,100 --batch 2 --seq 16 --lr 1e-3 --steps 1 --train-data train.txt", 1,
             ">= vocabulary size V = 100");
    s_expect("--model 2,2,32,16,256 --batch 2 --seq 32 --lr 1e-3 --steps 1 --train-data train.txt", 1,
             "--seq 32 exceeds the model's maxT = 16");
    s_expect(TINY "--steps 1 --train-data train.txt --stages 3", 1, "--stages 3 exceeds the model's 2 layers");
    s_expect("--model 2,4,32,16,256 --batch 2 --seq 16 --lr 1e-3 --steps 1 --train-data train.txt --tp 8", 1,
             "--tp 8 must divide the model's NH = 4 attention heads");
    s_expect("--model 2,3,32,16,256 --batch 2 --seq 16 --lr 1e-3 --steps 1 --train-data train.txt", 1,
             "C = 32 is not divisible by NH = 3");
    s_expect(TINY "--steps 1 --train-data train.txt --save nodir/m.bin --metrics ''", 1, "nodir/m.bin");
    s_expect(TINY "--steps 1 --train-data train.txt --resume nothere", 1, "nothere.stage0.ckpt: No such file");
    assert_int_equal(s_count(".tmp."), 0);
}

static void test_small_run(void **state)
{
    (void)state;
    s_expect(TINY "--steps 5 --train-data train.txt --val-data val.txt --val-every 4 --stages 2 "
                  "--micro-batches 2 --schedule gpipe --metrics m.jsonl --save out.bin",
             0, "final | val loss");
    assert_non_null(strstr(s_out, "step     5/5 | loss "));
    assert_non_null(strstr(s_out, "tok/s"));
    assert_non_null(strstr(s_out, "ETA"));
    char p[128], line[512];
    snprintf(p, sizeof p, "%s/m.jsonl", s_dir);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        char want[32];
        snprintf(want, sizeof want, "{\"step\":%d,\"loss\":", n);
        assert_true(strncmp(line, want, strlen(want)) == 0);
        double loss = atof(line + strlen(want));
        assert_true(isfinite(loss) && loss > 0 && loss < 10);
        assert_non_null(strstr(line, "\"grad_norm\":"));
        assert_non_null(strstr(line, "\"tokens_per_s\":"));
        int has_val = strstr(line, "\"val_loss\":") != NULL;
        assert_int_equal(has_val, n == 1 || n == 4 || n == 5);
    }
    fclose(f);
    assert_int_equal(n, 5);
    snprintf(p, sizeof p, "%s/out.bin", s_dir);
    gpt2_model_t *m = NULL;
    char err[256];
    assert_int_equal(gpt2_model_read(p, &m, err, sizeof err), 0);
    assert_int_equal(m->cfg.L, 2);
    assert_int_equal(m->cfg.C, 32);
    gpt2_model_destroy(&m);
    /* the same run at tp = 2 with compressed all-reduces */
    s_expect(TINY "--steps 2 --train-data train.txt --stages 2 --tp 2 --tp-codec int:bits=4 --tp-codec-ag int:bits=8 "
                  "--metrics ''",
             0, "tensor parallel tp=2 (1 thread per rank, all-reduce int:bits=4,group=128,symmetric=0 / "
                "int:bits=8,group=128,symmetric=0)");
    assert_non_null(strstr(s_out, "step     2/2 | loss "));
    /* continue training from the written model file */
    s_expect("--init-from out.bin --batch 2 --seq 16 --lr 1e-3 --steps 1 --train-data train.txt --metrics ''", 0,
             "step     1/1 | loss");
}

static double s_loss_at(const char *file, int step)
{
    char p[128], line[512], want[32];
    snprintf(p, sizeof p, "%s/%s", s_dir, file);
    snprintf(want, sizeof want, "{\"step\":%d,\"loss\":", step);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    double v = NAN;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, want, strlen(want)) == 0)
            v = atof(line + strlen(want));
    fclose(f);
    return v;
}

static void test_resume(void **state)
{
    (void)state;
    s_expect(TINY "--steps 6 --train-data train.txt --stages 2 --lr-schedule cosine --warmup 2 --metrics full.jsonl", 0, "6/6");
    s_expect(TINY "--steps 6 --train-data train.txt --stages 2 --lr-schedule cosine --warmup 2 --metrics a.jsonl", 0, "6/6");
    /* stop after 3: same flags but --steps 6 is the schedule's length, so stop via a checkpointing run of 3 */
    s_expect(TINY "--steps 3 --train-data train.txt --stages 2 --lr-schedule constant --metrics b.jsonl --save-ckpt ck", 0, "ck.stage0..1.ckpt");
    assert_int_equal(s_count(".ckpt"), 2);
    s_expect(TINY "--steps 5 --train-data train.txt --stages 2 --lr-schedule constant --metrics c.jsonl --resume ck", 0, "step     5/5");
    s_expect(TINY "--steps 5 --train-data train.txt --stages 2 --lr-schedule constant --metrics d.jsonl", 0, "step     5/5");
    for (int s = 4; s <= 5; s++)
        assert_true(s_loss_at("c.jsonl", s) == s_loss_at("d.jsonl", s));
    assert_true(isnan(s_loss_at("c.jsonl", 3))); /* resumed at step 4 */
    assert_true(s_loss_at("full.jsonl", 6) == s_loss_at("a.jsonl", 6)); /* deterministic */
    /* a checkpoint for another split is refused */
    s_expect(TINY "--steps 5 --train-data train.txt --stages 1 --resume ck", 1, "checkpoint is for");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_runtime_errors),
        cmocka_unit_test(test_small_run),
        cmocka_unit_test(test_resume),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
