/* jobfile.c — job file parser (see jobfile.h). */
#include "jobfile.h"

#include <ini.h> /* ini_parse_string */
#include <math.h>  /* isfinite */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* access */

#include "errors.h"

typedef struct s_ctx {
    job_spec_t *j;
    char msg[512];
    char seen[64][40]; /* keys already given */
    int nseen;
    int have_section;
} s_ctx_t;

static int s_handler(void *user, const char *section, const char *name, const char *value)
{
    s_ctx_t *c = user;
    if (c->msg[0]) /* keep the first error */
        return 1;
    if (!name) /* section start (INI_CALL_HANDLER_ON_NEW_SECTION builds) */
        return 1;
    if (strcmp(section, "job") != 0) {
        snprintf(c->msg, sizeof c->msg, "key '%s' in section [%s]; every key belongs in [job]", name,
                 section[0] ? section : "(none)");
        return 0;
    }
    c->have_section = 1;
    if (strchr(name, '-')) {
        snprintf(c->msg, sizeof c->msg, "unknown key '%s'; HINT: keys use underscores (tah-train's --%s)", name, name);
        return 0;
    }
    for (int i = 0; i < c->nseen; i++) {
        if (!strcmp(c->seen[i], name)) {
            snprintf(c->msg, sizeof c->msg, "key '%s' given twice", name);
            return 0;
        }
    }
    if (c->nseen < 64 && strlen(name) < sizeof c->seen[0])
        snprintf(c->seen[c->nseen++], sizeof c->seen[0], "%s", name);
    if (!strcmp(name, "name")) {
        if (strlen(value) >= sizeof c->j->name) {
            snprintf(c->msg, sizeof c->msg, "name is longer than %zu characters", sizeof c->j->name - 1);
            return 0;
        }
        snprintf(c->j->name, sizeof c->j->name, "%s", value);
        return 1;
    }
    if (!strcmp(name, "checkpoint_every")) {
        char *end = NULL;
        long v = strtol(value, &end, 10);
        if (end == value || *end || v < 0 || v > (1L << 30)) {
            snprintf(c->msg, sizeof c->msg, "checkpoint_every = '%s' is not an integer in range 0..1073741824", value);
            return 0;
        }
        c->j->checkpoint_every = (int)v;
        c->j->t.ckpt_every = (int)v;
        return 1;
    }
    if (!strcmp(name, "max_norm_ratio")) {
        char *end = NULL;
        double v = strtod(value, &end);
        if (end == value || *end || !isfinite(v) || (v != 0 && v < 1) || v > 1e30) {
            snprintf(c->msg, sizeof c->msg, "max_norm_ratio = '%s' is not 0 (off) or a number in range 1..1e30",
                     value);
            return 0;
        }
        c->j->max_norm_ratio = v;
        return 1;
    }
    if (!strcmp(name, "max_bad_frames")) {
        char *end = NULL;
        long v = strtol(value, &end, 10);
        if (end == value || *end || v < 0 || v > (1L << 30)) {
            snprintf(c->msg, sizeof c->msg, "max_bad_frames = '%s' is not an integer in range 0..1073741824", value);
            return 0;
        }
        c->j->max_bad_frames = (int)v;
        return 1;
    }
    if (!strcmp(name, "max_recoveries")) {
        char *end = NULL;
        long v = strtol(value, &end, 10);
        if (end == value || *end || v < 0 || v > 1000000) {
            snprintf(c->msg, sizeof c->msg, "max_recoveries = '%s' is not an integer in range 0..1000000", value);
            return 0;
        }
        c->j->max_recoveries = (int)v;
        return 1;
    }
    if (!strcmp(name, "stall_timeout")) {
        const int is_auto = !strcmp(value, "auto");
        char *end = NULL;
        double v = is_auto ? JOB_STALL_AUTO : strtod(value, &end);
        if (!is_auto && (end == value || *end || !isfinite(v) || (v != 0 && v < 1) || v > 1e7)) {
            snprintf(c->msg, sizeof c->msg, "stall_timeout = '%s' is not auto, 0 (off) or seconds in range 1..1e7",
                     value);
            return 0;
        }
        c->j->stall_timeout = v;
        return 1;
    }
    if (!strcmp(name, "link_rate_mbps") || !strcmp(name, "link_delay_ms")) {
        int rate = name[5] == 'r';
        char lerr[400];
        if (linkspec_parse(value, rate ? 1e5 : 6e4, rate ? &c->j->link_rate : &c->j->link_delay, lerr, sizeof lerr)) {
            snprintf(c->msg, sizeof c->msg, "%s = %s", name, lerr);
            return 0;
        }
        return 1;
    }
    if (!strcmp(name, "save")) {
        snprintf(c->msg, sizeof c->msg,
                 "save is not supported by the distributed runtime (stages live on different machines); "
                 "HINT: use save_ckpt = PREFIX, then tah-train --resume PREFIX --save FILE");
        return 0;
    }
    if (!trainopts_known(name)) {
        snprintf(c->msg, sizeof c->msg,
                 "unknown key '%s'; HINT: keys are tah-train's long options with underscores, plus name, "
                 "checkpoint_every, link_rate_mbps, link_delay_ms, max_norm_ratio, max_bad_frames, max_recoveries and "
                 "stall_timeout",
                 name);
        return 0;
    }
    if (trainopts_set(&c->j->t, name, value, c->msg, sizeof c->msg) != 0)
        return 0;
    c->j->checkpoint_every = c->j->t.ckpt_every;
    return 1;
}

double jobfile_stall_limit(double t, int reported, double slowest)
{
    if (t == 0)
        return 0;
    if (t == JOB_STALL_AUTO)
        t = reported ? JOB_STALL_AUTO_NEXT : JOB_STALL_AUTO_FIRST;
    return 20.0 * slowest > t ? 20.0 * slowest : t;
}

int jobfile_parse(const char *text, const char *fname, job_spec_t *j, char *err, size_t errlen)
{
    s_ctx_t *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "%s: out of memory", fname);
        return TAH_ENOMEM;
    }
    memset(j, 0, sizeof *j);
    trainopts_defaults(&j->t);
    j->max_norm_ratio = JOB_DEFAULT_MAX_NORM_RATIO;
    j->max_bad_frames = JOB_DEFAULT_MAX_BAD_FRAMES;
    j->max_recoveries = JOB_DEFAULT_MAX_RECOVERIES;
    j->stall_timeout = JOB_STALL_AUTO;
    c->j = j;
    int rc = 0;
    int line = ini_parse_string(text, s_handler, c);
    if (line > 0) {
        /* inih goes on after an error and reports the first error's line,
         * which may be a syntax error the handler never saw: re-parse only
         * the lines up to it so the message belongs to that line. */
        const char *p = text;
        for (int i = 0; i < line && p; i++) {
            p = strchr(p, '\n');
            if (p)
                p++;
        }
        size_t n = p ? (size_t)(p - text) : strlen(text);
        char *prefix = malloc(n + 1);
        if (prefix) {
            memcpy(prefix, text, n);
            prefix[n] = 0;
            memset(c, 0, sizeof *c);
            memset(j, 0, sizeof *j);
            trainopts_defaults(&j->t);
            c->j = j;
            ini_parse_string(prefix, s_handler, c);
            free(prefix);
        }
    }
    if (line != 0) {
        if (line < 0)
            snprintf(err, errlen, "%s: cannot parse (inih error %d)", fname, line);
        else if (c->msg[0])
            snprintf(err, errlen, "%s:%d: %s", fname, line, c->msg);
        else
            snprintf(err, errlen, "%s:%d: syntax error (expected [job] or key = value)", fname, line);
        rc = TAH_EINVAL;
    } else if (!c->have_section) {
        snprintf(err, errlen, "%s: no [job] section with keys", fname);
        rc = TAH_EINVAL;
    } else if (trainopts_check(&j->t, c->msg, sizeof c->msg) != 0) {
        snprintf(err, errlen, "%s: %s", fname, c->msg);
        rc = TAH_EINVAL;
    } else if (linkspec_max_stage(&j->link_rate) >= j->t.stages || linkspec_max_stage(&j->link_delay) >= j->t.stages) {
        snprintf(err, errlen, "%s: link_rate_mbps/link_delay_ms name stage %d; the job has stages 0..%d", fname,
                 linkspec_max_stage(&j->link_rate) > linkspec_max_stage(&j->link_delay)
                     ? linkspec_max_stage(&j->link_rate)
                     : linkspec_max_stage(&j->link_delay),
                 j->t.stages - 1);
        rc = TAH_EINVAL;
    }
    if (!rc && !j->name[0]) {
        const char *slash = strrchr(fname, '/');
        snprintf(j->name, sizeof j->name, "%s", slash ? slash + 1 : fname);
    }
    free(c);
    return rc;
}

void jobfile_resolve(const char *base_dir, const char *path, char *out, size_t outlen)
{
    if (path[0] == '/' || !base_dir || !base_dir[0])
        snprintf(out, outlen, "%s", path);
    else
        snprintf(out, outlen, "%s/%s", base_dir, path);
}

static int s_readable(const char *base_dir, const char *key, const char *path, const char *suffix, char *err,
                      size_t errlen)
{
    char full[2 * TRAINOPTS_PATH + 64];
    jobfile_resolve(base_dir, path, full, sizeof full);
    strncat(full, suffix, sizeof full - strlen(full) - 1);
    if (access(full, R_OK) != 0) {
        snprintf(err, errlen, "%s = '%s': cannot read %s", key, path, full);
        return TAH_EIO;
    }
    return 0;
}

int jobfile_check_files(const job_spec_t *j, const char *base_dir, char *err, size_t errlen)
{
    const trainopts_t *t = &j->t;
    if (s_readable(base_dir, "train_data", t->train_data, "", err, errlen))
        return TAH_EIO;
    if (t->val_data[0] && s_readable(base_dir, "val_data", t->val_data, "", err, errlen))
        return TAH_EIO;
    if (t->init_from[0] && s_readable(base_dir, "init_from", t->init_from, "", err, errlen))
        return TAH_EIO;
    if (t->resume[0] && s_readable(base_dir, "resume", t->resume, ".stage0.ckpt", err, errlen))
        return TAH_EIO;
    return 0;
}
