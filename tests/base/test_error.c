/* The thread-local error message (base/error.h): formatting, errno, prefixes, truncation, and that
 * each thread keeps its own message; torchrun's error file (base/errfile.h). Also holds the binary's TD_TEST_MAIN. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/testing.h>

#include "base/errfile.h"
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

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    return text;
}

/* torchrun's error file: td_record_error writes torchrun's JSON (escaped) and replaces an earlier
 * record; the library's own record (errfile_record) never replaces one and keeps the thread's
 * error; without TORCHELASTIC_ERROR_FILE nothing is written. */
TD_TEST(error_file_records)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/error.json", ctx->tmpdir);
    unsetenv("TORCHELASTIC_ERROR_FILE");
    TD_CHECK_OK(td_record_error("nowhere"));
    TD_CHECK(read_file(path) == NULL);

    setenv("TORCHELASTIC_ERROR_FILE", path, 1);
    error_fmt(TD_ERR_PEER_LOST, "the thread's own failure");
    errfile_record("rank 1 \"lost\"\nsecond line");
    TD_CHECK_STR_EQ(td_last_error(), "the thread's own failure");
    char *text = read_file(path);
    TD_CHECK(text != NULL);
    TD_CHECK_CONTAINS(text, "{\"message\": {\"message\": \"rank 1 \\\"lost\\\"\\u000asecond line\", "
                            "\"extraInfo\": {\"py_callstack\": \"rank 1 \\\"lost\\\"\\u000asecond line\", "
                            "\"timestamp\": \"");
    errfile_record("a later failure");
    TD_CHECK_CONTAINS(read_file(path), "rank 1");

    TD_CHECK_OK(td_record_error("bad batch %d", 7));
    text = read_file(path);
    TD_CHECK_CONTAINS(text, "\"message\": \"bad batch 7\"");
    TD_CHECK(strstr(text, "rank 1") == NULL);

    setenv("TORCHELASTIC_ERROR_FILE", "/nonexistent-dir/error.json", 1);
    TD_CHECK_EQ(td_record_error("x"), TD_ERR_IO);
    TD_CHECK_CONTAINS(td_last_error(), "writing the error file /nonexistent-dir/error.json");
    unsetenv("TORCHELASTIC_ERROR_FILE");
    unlink(path);
}

TD_TEST_MAIN()
