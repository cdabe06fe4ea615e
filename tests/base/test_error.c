/* The thread-local error message (base/error.h): formatting, errno, prefixes, truncation, and that
 * each thread keeps its own message. Also holds the binary's TD_TEST_MAIN. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <tdist/testing.h>

#include "base/error.h"

TD_TEST(error_sets_message_and_returns_code)
{
    TD_CHECK_EQ(error_fmt(TD_ERR_INVALID, "size must be >= 0, got %d", -3), TD_ERR_INVALID);
    TD_CHECK_STR_EQ(td_last_error(), "size must be >= 0, got -3");
    /* a later success does not clear it */
    TD_CHECK_STR_EQ(td_last_error(), "size must be >= 0, got -3");
    error_clear();
    TD_CHECK_STR_EQ(td_last_error(), "");
}

TD_TEST(error_errno_appends_strerror)
{
    errno = ENOENT;
    TD_CHECK_EQ(error_errno(TD_ERR_IO, "open(%s)", "/nonexistent"), TD_ERR_IO);
    TD_CHECK_STR_EQ(td_last_error(), "open(/nonexistent): No such file or directory");
    errno = ECONNREFUSED;
    error_errno(TD_ERR_IO, "connect");
    TD_CHECK_STR_EQ(td_last_error(), "connect: Connection refused");
}

TD_TEST(error_prefix_adds_context)
{
    errno = ECONNREFUSED;
    error_errno(TD_ERR_IO, "connect");
    TD_CHECK_EQ(error_prefix(TD_ERR_PEER_LOST, "connecting to %s:%d", "10.0.0.1", 29500), TD_ERR_PEER_LOST);
    TD_CHECK_STR_EQ(td_last_error(), "connecting to 10.0.0.1:29500: connect: Connection refused");
    error_prefix(TD_ERR_PEER_LOST, "rank %d", 2);
    TD_CHECK_STR_EQ(td_last_error(), "rank 2: connecting to 10.0.0.1:29500: connect: Connection refused");
}

TD_TEST(error_set_and_status_names)
{
    TD_CHECK_EQ(error_set(TD_ERR_REMOTE, "remote said no"), TD_ERR_REMOTE);
    TD_CHECK_STR_EQ(td_last_error(), "remote said no");
    error_set(TD_ERR_REMOTE, NULL);
    TD_CHECK_STR_EQ(td_last_error(), "");
    static const struct {
        td_status s;
        const char *name;
    } names[] = {
        {TD_OK, "TD_OK"},
        {TD_ERR_INVALID, "TD_ERR_INVALID"},
        {TD_ERR_TIMEOUT, "TD_ERR_TIMEOUT"},
        {TD_ERR_PEER_LOST, "TD_ERR_PEER_LOST"},
        {TD_ERR_REMOTE, "TD_ERR_REMOTE"},
        {TD_ERR_NOT_INIT, "TD_ERR_NOT_INIT"},
        {TD_ERR_ALREADY, "TD_ERR_ALREADY"},
        {TD_ERR_IO, "TD_ERR_IO"},
        {TD_ERR_CLOSED, "TD_ERR_CLOSED"},
        {TD_ERR_UNSUPPORTED, "TD_ERR_UNSUPPORTED"},
        {TD_ERR_NOMEM, "TD_ERR_NOMEM"},
        {TD_ERR_NOT_MEMBER, "TD_ERR_NOT_MEMBER"},
        {TD_ERR_NOT_FOUND, "TD_ERR_NOT_FOUND"},
        {TD_ERR_INTERNAL, "TD_ERR_INTERNAL"},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        TD_CHECK_STR_EQ(td_status_str(names[i].s), names[i].name);
    TD_CHECK_STR_EQ(td_status_str((td_status)-999), "TD_ERR_UNKNOWN");
    TD_CHECK(strlen(td_version()) > 0);
}

static td_status inner(int fail) { return fail ? error_fmt(TD_ERR_TIMEOUT, "Wait timeout") : TD_OK; }

static td_status outer(int fail, int *reached)
{
    TD_TRY(inner(fail));
    *reached = 1;
    return TD_OK;
}

TD_TEST(try_propagates_the_first_failure)
{
    int reached = 0;
    TD_CHECK_EQ(outer(1, &reached), TD_ERR_TIMEOUT);
    TD_CHECK_EQ(reached, 0);
    TD_CHECK_STR_EQ(td_last_error(), "Wait timeout");
    TD_CHECK_OK(outer(0, &reached));
    TD_CHECK_EQ(reached, 1);
}

TD_TEST(long_messages_are_truncated)
{
    static char big[3 * TD_ERROR_MAX];
    memset(big, 'x', sizeof big - 1);
    error_fmt(TD_ERR_INVALID, "%s", big);
    const char *m = td_last_error();
    TD_CHECK_EQ(strlen(m), TD_ERROR_MAX - 1);
    TD_CHECK(strcmp(m + TD_ERROR_MAX - 4, "...") == 0);
    TD_CHECK_EQ(m[0], 'x');

    /* a prefix on a full message keeps the prefix and stays within the buffer */
    error_prefix(TD_ERR_INVALID, "context");
    m = td_last_error();
    TD_CHECK(strncmp(m, "context: xxx", 12) == 0);
    TD_CHECK(strlen(m) <= TD_ERROR_MAX - 1);

    errno = EINVAL;
    error_errno(TD_ERR_IO, "%s", big);
    m = td_last_error();
    TD_CHECK(strlen(m) <= TD_ERROR_MAX - 1);
    TD_CHECK(strlen(m) > TD_ERROR_MAX / 2 - 2);

    /* exactly TD_ERROR_MAX - 1 characters fit without "..." */
    big[TD_ERROR_MAX - 1] = '\0';
    error_fmt(TD_ERR_INVALID, "%s", big);
    TD_CHECK_EQ(strlen(td_last_error()), TD_ERROR_MAX - 1);
    TD_CHECK_EQ(td_last_error()[TD_ERROR_MAX - 2], 'x');
}

typedef struct thread_msg {
    const char *set;
    char seen_before[64];
    char seen_after[64];
    pthread_barrier_t *barrier;
} thread_msg;

static void *set_and_check(void *arg)
{
    thread_msg *t = arg;
    snprintf(t->seen_before, sizeof t->seen_before, "%s", td_last_error());
    error_fmt(TD_ERR_INVALID, "%s", t->set);
    pthread_barrier_wait(t->barrier); /* both threads have set their message */
    snprintf(t->seen_after, sizeof t->seen_after, "%s", td_last_error());
    return NULL;
}

TD_TEST(messages_are_per_thread)
{
    error_fmt(TD_ERR_INVALID, "main thread's message");
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 2);
    thread_msg a = {.set = "message of A", .barrier = &barrier}, b = {.set = "message of B", .barrier = &barrier};
    pthread_t ta, tb;
    TD_CHECK_EQ(pthread_create(&ta, NULL, set_and_check, &a), 0);
    TD_CHECK_EQ(pthread_create(&tb, NULL, set_and_check, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_barrier_destroy(&barrier);
    TD_CHECK_STR_EQ(a.seen_before, "");
    TD_CHECK_STR_EQ(b.seen_before, "");
    TD_CHECK_STR_EQ(a.seen_after, "message of A");
    TD_CHECK_STR_EQ(b.seen_after, "message of B");
    TD_CHECK_STR_EQ(td_last_error(), "main thread's message");
}

TD_TEST_MAIN()
