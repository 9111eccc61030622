/* test_trainopts.c — the job file and tah-train cannot drift apart: every
 * long option tah-train's --help lists is a key the job parser knows (and
 * the reverse), and a value parses to the same ranges (spot checks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "jobfile.h"
#include "trainopts.h"

static void test_every_tah_train_option_is_a_job_key(void **state)
{
    (void)state;
    FILE *p = popen(TAH_TRAIN_EXE " --help", "r");
    assert_non_null(p);
    char help[16384];
    size_t n = fread(help, 1, sizeof help - 1, p);
    help[n] = 0;
    assert_int_equal(pclose(p), 0);
    int seen = 0;
    for (const char *s = help; (s = strstr(s, "--")) != NULL; s += 2) {
        char name[64];
        size_t k = 0;
        while (k + 1 < sizeof name && ((s[2 + k] >= 'a' && s[2 + k] <= 'z') || (s[2 + k] >= '0' && s[2 + k] <= '9') || s[2 + k] == '-'))
            name[k] = s[2 + k], k++;
        name[k] = 0;
        if (!k || !strcmp(name, "help"))
            continue;
        if (!trainopts_known(name))
            fail_msg("tah-train --%s is not a job key", name);
        seen++;
    }
    assert_true(seen > 25);
    for (const char *const *o = trainopts_names(); *o; o++) {
        char opt[80];
        snprintf(opt, sizeof opt, "--%s", *o);
        if (!strstr(help, opt))
            fail_msg("job key %s is not a tah-train option", *o);
    }
}

static void test_values(void **state)
{
    (void)state;
    job_spec_t j;
    char err[512];
    assert_int_equal(jobfile_parse("[job]\nmodel = 4,2,64,32,256\ntrain_data = t\nbatch = 2\nseq = 16\nsteps = 5\n"
                                   "lr = 1e-3\ngrad_clip = 0\nuntied = yes\nschedule = gpipe\nckpt_every = 3\n",
                                   "j.ini", &j, err, sizeof err),
                     0);
    assert_int_equal(j.t.untied, 1);
    assert_int_equal(j.t.schedule, SCHED_GPIPE);
    assert_int_equal(j.checkpoint_every, 3);
    assert_true(j.t.optim.grad_clip == 0.0f);
    assert_int_equal(j.t.mcfg.Vp, 256);
    /* tensor parallelism: tp and its two codecs reach the stage options */
    assert_int_equal(jobfile_parse("[job]\nmodel = 4,2,64,32,256\ntrain_data = t\nbatch = 2\nseq = 16\nsteps = 5\n"
                                   "lr = 1e-3\ntp = 2\ntp_codec = int:bits=4\ntp_codec_ag = int:bits=8\n",
                                   "j.ini", &j, err, sizeof err),
                     0);
    assert_int_equal(j.t.tp, 2);
    codec_spec_t rs, ag;
    assert_int_equal(trainopts_tp_codecs(&j.t, &rs, &ag, err, sizeof err), 0);
    assert_int_equal(rs.p.intq.bits, 4);
    assert_int_equal(ag.p.intq.bits, 8);
    assert_int_equal(jobfile_parse("[job]\ntp = 9\n", "j.ini", &j, err, sizeof err) != 0, 1);
    assert_non_null(strstr(err, "1..8"));
    assert_int_equal(jobfile_parse("[job]\ntp_codec = tah\n", "j.ini", &j, err, sizeof err) != 0, 1);
    assert_non_null(strstr(err, "tensor-parallel"));
    assert_int_equal(jobfile_parse("[job]\nmodel = 4,2,64,32,256\ntrain_data = t\nbatch = 2\nseq = 16\nsteps = 5\n"
                                   "lr = 1e-3\ntp = 4\n", "j.ini", &j, err, sizeof err) != 0, 1);
    assert_non_null(strstr(err, "tp 4 must divide the model's NH = 2"));
    assert_int_equal(jobfile_parse("[job]\nbeta2 = 1\n", "j.ini", &j, err, sizeof err) != 0, 1);
    assert_non_null(strstr(err, "j.ini:2: beta2"));
}

/* the one device parser (tah-train --device, tah-node join --device): cpu,
 * cuda:K, and a list of distinct GPUs, one per tensor-parallel rank */
static void test_devices(void **state)
{
    (void)state;
    int dev = 7, n = 7, list[TP_MAX];
    char err[256] = "";
    assert_int_equal(trainopts_parse_device("cpu", &dev, &n, list, err, sizeof err), 0);
    assert_int_equal(dev, -1);
    assert_int_equal(n, 0);
    assert_int_equal(trainopts_parse_device("cuda:3", &dev, &n, list, err, sizeof err), 0);
    assert_int_equal(dev, 3);
    assert_int_equal(n, 0);
    assert_int_equal(trainopts_parse_device("cuda:2,0,5", &dev, &n, list, err, sizeof err), 0);
    assert_int_equal(dev, 2);
    assert_int_equal(n, 3);
    assert_int_equal(list[0], 2);
    assert_int_equal(list[1], 0);
    assert_int_equal(list[2], 5);
    assert_int_equal(trainopts_parse_device("cuda:0,1,2,3,4,5,6,7", &dev, &n, list, err, sizeof err), 0);
    assert_int_equal(n, 8);
    const char *bad[] = { "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1024", "cuda:0,", "cuda:,1", "cuda:0,,1",
                          "cuda:0, 1", "cuda:1 ", "cuda:+1" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        if (trainopts_parse_device(bad[i], &dev, &n, list, err, sizeof err) == 0)
            fail_msg("device '%s' was accepted", bad[i]);
        assert_non_null(strstr(err, "cuda:K,L,..."));
    }
    assert_int_not_equal(trainopts_parse_device("cuda:0,1,0", &dev, &n, list, err, sizeof err), 0);
    assert_non_null(strstr(err, "twice"));
    assert_int_not_equal(trainopts_parse_device("cuda:0,1,2,3,4,5,6,7,8", &dev, &n, list, err, sizeof err), 0);
    assert_non_null(strstr(err, "(8)"));
    /* through the option table and the cross-option check: the list's length is tp */
    trainopts_t o;
    trainopts_defaults(&o);
    assert_int_equal(trainopts_set(&o, "device", "cuda:0,1", err, sizeof err), 0);
    assert_int_equal(o.device, 0);
    assert_int_equal(o.ndevices, 2);
    assert_int_not_equal(trainopts_set(&o, "device", "cuda:1,1", err, sizeof err), 0);
    assert_non_null(strstr(err, "device = 'cuda:1,1' lists a GPU twice"));
    /* the tied exchange's codec: fp32 by default, any codec but TAH-Quant */
    assert_string_equal(o.tied_codec, "fp32");
    assert_int_equal(trainopts_set(&o, "tied_codec", "fixpt:bits=8", err, sizeof err), 0);
    assert_string_equal(o.tied_codec, "fixpt:bits=8");
    assert_int_not_equal(trainopts_set(&o, "tied-codec", "tah", err, sizeof err), 0);
    assert_non_null(strstr(err, "TAH-Quant is for (B,T,C) activations"));
    assert_int_not_equal(trainopts_set(&o, "tied-codec", "zstd", err, sizeof err), 0);
    job_spec_t j;
    assert_int_equal(jobfile_parse("[job]\nmodel = 4,2,64,32,256\ntrain_data = t\nbatch = 2\nseq = 16\nsteps = 5\n"
                                   "lr = 1e-3\ndevice = cuda:0,1\n", "j.ini", &j, err, sizeof err) != 0, 1);
    assert_non_null(strstr(err, "device lists 2 GPUs but tp is 1"));
    assert_int_equal(jobfile_parse("[job]\nmodel = 4,2,64,32,256\ntrain_data = t\nbatch = 2\nseq = 16\nsteps = 5\n"
                                   "lr = 1e-3\ndevice = cuda:0,1\ntp = 2\n", "j.ini", &j, err, sizeof err),
                     0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_tah_train_option_is_a_job_key),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
