/* Leveled, single-line logging to stderr.
 *
 * The level is read once from TDIST_LOG_LEVEL (a bad value is reported once and WARN is used). Each
 * line is formatted into a stack buffer and written with one write(2), which keeps concurrent lines
 * whole; lines longer than the buffer are cut and end with "...". */
#include "base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"

static const char *const level_names[] = {"TRACE", "DEBUG", "INFO", "WARN", "ERROR", "OFF", NULL};

static _Atomic int g_level = -1;
static __thread int tl_rank = -1;
static __thread bool tl_rank_set = false;
static _Atomic int g_process_rank = -1;

static int level_from_env(void)
{
    int level = TD_LOG_WARN;
    /* Keep the caller's error message: reading the level is a side effect of logging. */
    char saved[256];
    snprintf(saved, sizeof saved, "%s", td_last_error());
    if (env_get_enum("TDIST_LOG_LEVEL", level_names, TD_LOG_WARN, &level) != TD_OK) {
        char line[512];
        int n = snprintf(line, sizeof line, "[tdist WARN] %s; using WARN\n", td_last_error());
        if (n > 0)
            (void)!write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        level = TD_LOG_WARN;
    }
    error_set(TD_OK, saved);
    return level;
}

bool log_enabled(td_log_level level)
{
    int cur = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (cur < 0) {
        int want = level_from_env();
        int expected = -1;
        atomic_compare_exchange_strong(&g_level, &expected, want);
        cur = atomic_load(&g_level);
    }
    return (int)level >= cur && level < TD_LOG_OFF;
}

void log_set_level(td_log_level level) { atomic_store(&g_level, (int)level); }

void log_set_rank(int rank)
{
    tl_rank = rank;
    tl_rank_set = true;
    atomic_store(&g_process_rank, rank);
}

void log_emit(td_log_level level, const char *fmt, ...)
{
    int saved_errno = errno;
    char line[2048];
    /* A thread that never set a rank (an I/O thread, say) logs the process's rank. */
    int rank = tl_rank_set ? tl_rank : atomic_load(&g_process_rank);
    size_t n = (size_t)snprintf(line, sizeof line, "[tdist %s] ", level_names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    /* "[rank R] " after the level, unless the message names the rank itself as PyTorch's texts do
     * ("[Rank R] Watchdog caught ..."): one rank prefix per line (issue 22). */
    char own[32];
    int k = rank >= 0 ? snprintf(own, sizeof own, "[Rank %d]", rank) : 0;
    if (rank >= 0 && !(m >= k && memcmp(line + n, own, (size_t)k) == 0)) {
        k = snprintf(own, sizeof own, "[rank %d] ", rank);
        size_t body = (size_t)m < sizeof line - n - 1 ? (size_t)m : sizeof line - n - 2;
        if (n + (size_t)k + body > sizeof line - 1)
            body = sizeof line - 1 - n - (size_t)k;
        memmove(line + n + k, line + n, body);
        memcpy(line + n, own, (size_t)k);
        line[n + (size_t)k + body] = '\0';
        if ((size_t)m > body)
            m += k; /* truncated: keeps the "..." below */
        else
            m = (int)body + k;
    }
    n += (size_t)m;
    if (n >= sizeof line - 1) {
        n = sizeof line - 1;
        memcpy(line + n - 3, "...", 3);
    }
    line[n++] = '\n';
    (void)!write(STDERR_FILENO, line, n);
    errno = saved_errno;
}
