/* Logging (base/log.h): the line format with its "[rank R]" prefix, levels, per-thread ranks, the
 * cut of long lines, and a bad TDIST_LOG_LEVEL. stderr is captured by pointing fd 2 at a pipe
 * inside the case and restoring it afterwards. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/testing.h>

#include "base/log.h"

typedef struct capture {
    int saved;
    int pipe_r;
} capture;

static void capture_begin(capture *c)
{
    int p[2];
    TD_CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    fflush(stderr);
    c->saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    TD_CHECK(c->saved >= 0);
    TD_CHECK_EQ(dup2(p[1], STDERR_FILENO), STDERR_FILENO);
    close(p[1]);
    c->pipe_r = p[0];
}

/* Restores stderr and returns what was written (free it). Lines are short: the pipe holds them. */
static char *capture_end(capture *c)
{
    fflush(stderr);
    dup2(c->saved, STDERR_FILENO);
    close(c->saved);
    char *out = calloc(1, 65536);
    size_t len = 0;
    ssize_t n;
    while ((n = read(c->pipe_r, out + len, 65535 - len)) > 0)
        len += (size_t)n;
    close(c->pipe_r);
    return out;
}

TD_TEST(log_line_has_level_and_rank)
{
    log_set_level(TD_LOG_INFO);
    capture c;
    capture_begin(&c);
    TD_LOG_INFO("no rank yet %d", 1);
    log_set_rank(3);
    TD_LOG_INFO("store server listening on %s", "127.0.0.1:29500");
    TD_LOG_DEBUG("not shown");
    TD_LOG_WARN("a warning");
    TD_LOG_ERROR("[Rank 3] Watchdog caught collective operation timeout"); /* names its rank: no second */
    TD_LOG_ERROR("[Rank 30] of another rank");
    log_set_rank(-1);
    TD_LOG_ERROR("rank removed");
    char *out = capture_end(&c);
    TD_CHECK_STR_EQ(out, "[tdist INFO] no rank yet 1\n"
                         "[tdist INFO] [rank 3] store server listening on 127.0.0.1:29500\n"
                         "[tdist WARN] [rank 3] a warning\n"
                         "[tdist ERROR] [Rank 3] Watchdog caught collective operation timeout\n"
                         "[tdist ERROR] [rank 3] [Rank 30] of another rank\n"
                         "[tdist ERROR] rank removed\n");
    free(out);
    TD_CHECK(log_enabled(TD_LOG_INFO));
    TD_CHECK(!log_enabled(TD_LOG_DEBUG));
    log_set_level(TD_LOG_OFF);
    TD_CHECK(!log_enabled(TD_LOG_ERROR));
}

static void *log_as_rank7(void *arg)
{
    (void)arg;
    log_set_rank(7);
    TD_LOG_WARN("from the thread");
    return NULL;
}

static void *log_without_rank(void *arg)
{
    (void)arg;
    TD_LOG_WARN("from an I/O thread");
    return NULL;
}

TD_TEST(log_rank_is_per_thread)
{
    log_set_level(TD_LOG_WARN);
    capture c;
    capture_begin(&c);
    log_set_rank(2);
    pthread_t t;
    pthread_create(&t, NULL, log_as_rank7, NULL);
    pthread_join(t, NULL);
    TD_LOG_WARN("from main");
    /* a thread that never set a rank logs the last rank set in the process */
    pthread_create(&t, NULL, log_without_rank, NULL);
    pthread_join(t, NULL);
    char *out = capture_end(&c);
    TD_CHECK_STR_EQ(out, "[tdist WARN] [rank 7] from the thread\n"
                         "[tdist WARN] [rank 2] from main\n"
                         "[tdist WARN] [rank 7] from an I/O thread\n");
    free(out);
}

TD_TEST(log_long_lines_are_cut)
{
    log_set_level(TD_LOG_WARN);
    char *big = malloc(10000);
    memset(big, 'y', 9999);
    big[9999] = '\0';
    capture c;
    capture_begin(&c);
    TD_LOG_WARN("%s", big);
    char *out = capture_end(&c);
    size_t len = strlen(out);
    TD_CHECK(len < 4096);
    TD_CHECK(strncmp(out, "[tdist WARN] yyyy", 17) == 0);
    TD_CHECK(strcmp(out + len - 4, "...\n") == 0);
    TD_CHECK(strchr(out, '\n') == out + len - 1); /* one line */
    free(out);
    free(big);
}

TD_TEST(log_level_from_env)
{
    /* The level is read once per process, and this case runs in its own process. */
    setenv("TDIST_LOG_LEVEL", "debug", 1);
    TD_CHECK(log_enabled(TD_LOG_DEBUG));
    TD_CHECK(!log_enabled(TD_LOG_TRACE));
    unsetenv("TDIST_LOG_LEVEL");
}

TD_TEST(log_bad_level_warns_once)
{
    setenv("TDIST_LOG_LEVEL", "chatty", 1);
    capture c;
    capture_begin(&c);
    TD_CHECK(log_enabled(TD_LOG_WARN));
    TD_CHECK(!log_enabled(TD_LOG_INFO));
    TD_CHECK(log_enabled(TD_LOG_ERROR));
    char *out = capture_end(&c);
    TD_CHECK_STR_EQ(out, "[tdist WARN] The value of TDIST_LOG_LEVEL must be TRACE, DEBUG, INFO, WARN, ERROR, or OFF. "
                         "Got 'chatty'.; using WARN\n");
    free(out);
    unsetenv("TDIST_LOG_LEVEL");
}
