/* linkspec.c — per-link rate/delay settings (see linkspec.h). */
#define _POSIX_C_SOURCE 200809L
#include "linkspec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h> /* uname */
#include <unistd.h>      /* access */

#include "errors.h"

static int s_number(const char *p, const char **end, double vmax, double *out)
{
    char *e = NULL;
    errno = 0;
    double v = strtod(p, &e);
    if (errno || e == p || !isfinite(v) || v < 0 || v > vmax)
        return -1;
    *end = e;
    *out = v;
    return 0;
}

static int s_index(const char *p, const char **end, int *out)
{
    char *e = NULL;
    errno = 0;
    long v = strtol(p, &e, 10);
    if (errno || e == p || v < 0 || v > 4095 || (*p < '0' || *p > '9'))
        return -1;
    *end = e;
    *out = (int)v;
    return 0;
}

int linkspec_parse(const char *s, double vmax, linkspec_t *ls, char *err, size_t errlen)
{
    memset(ls, 0, sizeof *ls);
    if (!s || !*s) {
        snprintf(err, errlen, "is empty (want V, VF/VB, i>j:V,... or none)");
        return TAH_EINVAL;
    }
    if (!strcmp(s, "none"))
        return 0;
    const char *p = s;
    if (!strchr(s, '>')) {
        double f, b;
        if (s_number(p, &p, vmax, &f) != 0)
            goto bad_value;
        b = f;
        if (*p == '/') {
            p++;
            if (s_number(p, &p, vmax, &b) != 0)
                goto bad_value;
        }
        if (*p)
            goto bad_syntax;
        ls->fwd = f;
        ls->bwd = b;
        return 0;
    }
    ls->matrix = 1;
    for (;;) {
        int from, to;
        double v;
        if (s_index(p, &p, &from) != 0 || *p++ != '>' || s_index(p, &p, &to) != 0 || *p++ != ':')
            goto bad_syntax;
        if (from == to) {
            snprintf(err, errlen, "'%s': link %d>%d goes nowhere", s, from, to);
            return TAH_EINVAL;
        }
        if (s_number(p, &p, vmax, &v) != 0)
            goto bad_value;
        for (int i = 0; i < ls->n; i++) {
            if (ls->e[i].from == from && ls->e[i].to == to) {
                snprintf(err, errlen, "'%s': link %d>%d given twice", s, from, to);
                return TAH_EINVAL;
            }
        }
        if (ls->n == LINKSPEC_MAX) {
            snprintf(err, errlen, "'%s': more than %d links", s, LINKSPEC_MAX);
            return TAH_EINVAL;
        }
        ls->e[ls->n].from = from;
        ls->e[ls->n].to = to;
        ls->e[ls->n].v = v;
        ls->n++;
        if (!*p)
            return 0;
        if (*p++ != ',')
            goto bad_syntax;
    }
bad_value:
    snprintf(err, errlen, "'%s': values must be numbers in [0, %g]", s, vmax);
    return TAH_EINVAL;
bad_syntax:
    snprintf(err, errlen, "'%s' is not V, VF/VB, i>j:V[,i>j:V...] or none", s);
    return TAH_EINVAL;
}

double linkspec_value(const linkspec_t *ls, int from, int to)
{
    if (ls->matrix) {
        for (int i = 0; i < ls->n; i++)
            if (ls->e[i].from == from && ls->e[i].to == to)
                return ls->e[i].v;
        return 0.0;
    }
    return to > from ? ls->fwd : ls->bwd;
}

int linkspec_any(const linkspec_t *ls)
{
    if (!ls->matrix)
        return ls->fwd > 0 || ls->bwd > 0;
    for (int i = 0; i < ls->n; i++)
        if (ls->e[i].v > 0)
            return 1;
    return 0;
}

int linkspec_max_stage(const linkspec_t *ls)
{
    int m = -1;
    for (int i = 0; ls->matrix && i < ls->n; i++) {
        if (ls->e[i].from > m)
            m = ls->e[i].from;
        if (ls->e[i].to > m)
            m = ls->e[i].to;
    }
    return m;
}

void linkspec_format(const linkspec_t *ls, char *buf, size_t n)
{
    if (!linkspec_any(ls)) {
        snprintf(buf, n, "none");
        return;
    }
    if (!ls->matrix) {
        if (ls->fwd == ls->bwd)
            snprintf(buf, n, "%g", ls->fwd);
        else
            snprintf(buf, n, "%g/%g", ls->fwd, ls->bwd);
        return;
    }
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < ls->n && used < n; i++) {
        int w = snprintf(buf + used, n - used, "%s%d>%d:%g", i ? "," : "", ls->e[i].from, ls->e[i].to, ls->e[i].v);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

int linkspec_netem_available(void)
{
    if (access("/sys/module/sch_netem", F_OK) == 0)
        return 1;
    struct utsname u;
    if (uname(&u) != 0)
        return 0;
    const char *ext[] = { "", ".xz", ".zst", ".gz" };
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "/lib/modules/%s/kernel/net/sched/sch_netem.ko%s", u.release, ext[i]);
        if (access(path, F_OK) == 0)
            return 1;
    }
    return 0;
}
