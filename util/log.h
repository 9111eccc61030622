/* log.h — the one logging facility of the daemons and tools.
 *
 * One line per event on stderr: "2024-05-01 12:00:00.123 tah-node[node1] INFO job 3 step 17: ...".
 * Levels error < warn < info < debug; a message above the current level is
 * dropped before any formatting (the macros test the level first). -v on a
 * command line raises the level by one (tah_log_verbose). Thread-safe: each
 * line is formatted into one buffer and written with a single fputs. */
#ifndef TAH_LOG_H
#define TAH_LOG_H

typedef enum tah_log_level { TAH_LOG_ERROR = 0, TAH_LOG_WARN = 1, TAH_LOG_INFO = 2, TAH_LOG_DEBUG = 3 } tah_log_level_t;

extern int tah_log_level;

/* Program name and an optional tag (node name) shown on every line. */
void tah_log_init(const char *prog, const char *tag);
void tah_log_set_tag(const char *tag);
void tah_log_verbose(void);
void tah_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_AT(lvl, ...)                        \
    do {                                        \
        if ((lvl) <= tah_log_level)             \
            tah_log_write((lvl), __VA_ARGS__);  \
    } while (0)
#define log_error(...) LOG_AT(TAH_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) LOG_AT(TAH_LOG_WARN, __VA_ARGS__)
#define log_info(...) LOG_AT(TAH_LOG_INFO, __VA_ARGS__)
#define log_debug(...) LOG_AT(TAH_LOG_DEBUG, __VA_ARGS__)

#endif
