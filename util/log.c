/* log.c — leveled one-line logging (see log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int tah_log_level = TAH_LOG_INFO;
static char s_prog[64] = "tah";
static char s_tag[64] = "";

void tah_log_init(const char *prog, const char *tag)
{
    snprintf(s_prog, sizeof s_prog, "%s", prog ? prog : "tah");
    tah_log_set_tag(tag);
}

void tah_log_set_tag(const char *tag)
{
    snprintf(s_tag, sizeof s_tag, "%s", tag ? tag : "");
}

void tah_log_verbose(void)
{
    if (tah_log_level < TAH_LOG_DEBUG)
        tah_log_level++;
}

void tah_log_write(int level, const char *fmt, ...)
{
    static const char *names[] = { "ERROR", "WARN", "INFO", "DEBUG" };
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(line, sizeof line, "%Y-%m-%d %H:%M:%S", &tm);
    int k = snprintf(line + n, sizeof line - n, ".%03ld %s%s%s%s %s ", ts.tv_nsec / 1000000L, s_prog,
                     s_tag[0] ? "[" : "", s_tag, s_tag[0] ? "]" : "",
                     names[level < 0 ? 0 : level > 3 ? 3 : level]);
    if (k > 0)
        n += (size_t)k < sizeof line - n ? (size_t)k : sizeof line - n - 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    if (len + 1 < sizeof line) {
        line[len] = '\n';
        line[len + 1] = 0;
    } else {
        line[sizeof line - 2] = '\n';
    }
    fputs(line, stderr);
}
