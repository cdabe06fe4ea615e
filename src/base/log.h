/* Internal logging: one line per event on stderr, written with a single write(2) so lines from
 * threads and processes never interleave mid-line.
 *
 *   TD_LOG_INFO("store server listening on %s", addr);   ->  "[tdist INFO] [rank 2] store server ..."
 *
 * The level comes from TDIST_LOG_LEVEL (TRACE, DEBUG, INFO, WARN, ERROR, OFF; default WARN). The
 * "[rank R]" prefix appears once log_set_rank() has been called (process groups do it). */
#ifndef TDIST_BASE_LOG_H
#define TDIST_BASE_LOG_H

#include <stdbool.h>

typedef enum td_log_level {
    TD_LOG_TRACE = 0,
    TD_LOG_DEBUG = 1,
    TD_LOG_INFO = 2,
    TD_LOG_WARN = 3,
    TD_LOG_ERROR = 4,
    TD_LOG_OFF = 5,
} td_log_level;

bool log_enabled(td_log_level level);
void log_emit(td_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Overrides TDIST_LOG_LEVEL for this process. */
void log_set_level(td_log_level level);
/* The rank printed in each line's prefix; a negative rank removes the prefix. Thread-local, so
 * several ranks hosted as threads of one process each log their own rank. */
void log_set_rank(int rank);

#define TD_LOG_AT(lvl, ...)              \
    do {                                 \
        if (log_enabled(lvl))         \
            log_emit((lvl), __VA_ARGS__);  \
    } while (0)
#define TD_LOG_TRACE(...) TD_LOG_AT(TD_LOG_TRACE, __VA_ARGS__)
#define TD_LOG_DEBUG(...) TD_LOG_AT(TD_LOG_DEBUG, __VA_ARGS__)
#define TD_LOG_INFO(...) TD_LOG_AT(TD_LOG_INFO, __VA_ARGS__)
#define TD_LOG_WARN(...) TD_LOG_AT(TD_LOG_WARN, __VA_ARGS__)
#define TD_LOG_ERROR(...) TD_LOG_AT(TD_LOG_ERROR, __VA_ARGS__)

#endif
