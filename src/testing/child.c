/* The rank side of the harness: what a re-executed test binary does as one rank of a case.
 *
 * c10d's run_test, in C: set up the fatal-signal backtraces, start the event-listener thread that
 * answers the parent's GET_TRACEBACK with the stacks of all threads, run the body, and end the way
 * the exit-code protocol says: a failed check sends "file:line: message" on the control channel and
 * exits 10 (with _exit, so that nothing at exit can change the code); a skip exits with its code
 * and sends nothing (trap T2); a body that returns is checked for leaked fds and threads, then the
 * listener is stopped and main returns 0, so that LeakSanitizer's exit check still runs.
 *
 * A rank started by an external launcher (--td-external: mpirun, srun, tdrun; see entry.c) runs
 * the same way without a parent: no control channel (a failure's message is logged on stderr,
 * which the launcher shows), the case's static skip checked here, and a watchdog thread in place
 * of the supervisor's timeout that logs the rank's stacks and exits 10. A case's setup hook runs
 * before the leak baseline in both modes. A case of a suite runs inside its suite's setup and
 * teardown, and a suite's batch (--td-cases) runs its cases one after another in this process,
 * telling the parent of each one passed (TD_CTL_CASE_DONE). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/le.h"
#include "base/thread.h"
#include "testing/harness.h"

static struct {
    bool active;
    bool threaded;
    int rank;
    int ctl;
    int stop[2];
    const char *name;
} g_child = {.ctl = -1, .stop = {-1, -1}};


void td_test_fail(const char *file, int line, const char *fmt, ...)
{
    td_buf m = TD_BUF_INIT;
    const char *subtest = harness_subtest_label();
    if (subtest)
        buf_printf(&m, "subtest (%s): ", subtest);
    buf_printf(&m, "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    char *text = NULL;
    int n = vasprintf(&text, fmt, ap);
    va_end(ap);
    if (n >= 0) {
        buf_append(&m, text, (size_t)n);
        free(text);
    }
    char *msg = buf_steal(&m);
    if (g_child.threaded)
        harness_threaded_fail(msg); /* returns only on a thread that is not a rank */
    harness_fail_process(msg);
}

void td_test_skip(int code, const char *reason)
{
    if (g_child.threaded)
        harness_threaded_skip(code, reason);
    if (g_child.active)
        harness_log(NULL, "Process %d skipping test %s for following reason: %s", g_child.rank, g_child.name,
                       reason ? reason : "");
    fflush(stdout);
    fflush(stderr);
    _exit(code);
}

void td_test_check_err_(td_status got, td_status want, const char *substr, const char *expr, const char *file,
                        int line)
{
    if (got != want) {
        if (got == TD_OK)
            td_test_fail(file, line, "%s succeeded, expected it to fail with %s", expr, td_status_str(want));
        td_test_fail(file, line, "%s returned %s, expected %s: %s", expr, td_status_str(got), td_status_str(want),
                     td_last_error());
    }
    if (substr && !strstr(td_last_error(), substr))
        td_test_fail(file, line, "%s failed with %s as expected, but its message \"%s\" does not contain \"%s\"", expr,
                     td_status_str(got), td_last_error(), substr);
}

void td_test_check_str_(const char *a, const char *b, bool contains, const char *ea, const char *eb, const char *file,
                        int line)
{
    const char *sa = a ? a : "(null)", *sb = b ? b : "(null)";
    if (contains) {
        if (!a || !b || !strstr(a, b))
            td_test_fail(file, line, "Check failed: %s contains %s (\"%s\" does not contain \"%s\")", ea, eb, sa, sb);
    } else if (!a || !b ? a != b : strcmp(a, b) != 0) {
        td_test_fail(file, line, "Check failed: %s == %s (\"%s\" vs \"%s\")", ea, eb, sa, sb);
    }
}

void td_test_add_abort_hook(td_test_ctx *ctx, void (*fn)(void *arg), void *arg)
{
    if (ctx && ctx->threaded)
        harness_threaded_add_hook(fn, arg);
}

void td_test_remove_abort_hook(td_test_ctx *ctx, void (*fn)(void *arg), void *arg)
{
    if (ctx && ctx->threaded)
        harness_threaded_remove_hook(fn, arg);
}

bool td_test_aborted(const td_test_ctx *ctx) { return ctx && ctx->threaded && harness_threaded_aborted(); }

/* ---- the event listener ------------------------------------------------------------------- */

/* A suite rank's wait for the parent's TD_CTL_CASE_ACK after each case (the listener reads it). */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool enabled; /* the listener runs */
    bool closed;  /* the channel is gone: nobody will answer */
    uint32_t acked;
} g_ack = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void ack_update(bool closed)
{
    pthread_mutex_lock(&g_ack.mu);
    if (closed)
        g_ack.closed = true;
    else
        g_ack.acked++;
    pthread_cond_broadcast(&g_ack.cv);
    pthread_mutex_unlock(&g_ack.mu);
}

static void ack_wait(uint32_t count)
{
    pthread_mutex_lock(&g_ack.mu);
    while (g_ack.enabled && !g_ack.closed && g_ack.acked < count)
        pthread_cond_wait(&g_ack.cv, &g_ack.mu);
    pthread_mutex_unlock(&g_ack.mu);
}

static void *listener_main(void *arg)
{
    (void)arg;
    td_buf payload = TD_BUF_INIT;
    for (;;) {
        struct pollfd p[2] = {{.fd = g_child.ctl, .events = POLLIN}, {.fd = g_child.stop[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents)
            break;
        if (!p[0].revents)
            continue;
        uint8_t type = 0;
        td_status s = ctl_recv(g_child.ctl, &type, &payload);
        if (s == TD_ERR_CLOSED) {
            harness_log(NULL, "Pipe closed for process %d, stopping event listener thread", g_child.rank);
            break;
        }
        if (s != TD_OK) {
            harness_log(NULL, "Event listener of process %d stops: %s", g_child.rank, td_last_error());
            break;
        }
        if (type == TD_CTL_CASE_ACK) {
            ack_update(false);
            continue;
        }
        harness_log(NULL, "Received event %u on process %d", type, g_child.rank);
        if (type != TD_CTL_GET_TRACEBACK)
            continue;
        td_buf text = TD_BUF_INIT;
        if (harness_threaded_pending(&text)) {
            ctl_send(g_child.ctl, TD_CTL_PENDING, text.data, text.len);
            buf_clear(&text);
        }
        stacks_dump_all(&text);
        if (ctl_send(g_child.ctl, TD_CTL_TRACEBACK, text.data ? text.data : "", text.len) == TD_OK)
            harness_log(NULL, "Process %d sent traceback", g_child.rank);
        buf_free(&text);
    }
    ack_update(true);
    buf_free(&payload);
    return NULL;
}

/* ---- the watchdog of an externally launched rank --------------------------------------------- */

/* Without a supervisor, each rank enforces the case's timeout itself: past it, it logs the stacks
 * of all its threads and exits as failed (the launcher then stops the other ranks). */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    int64_t deadline_ns;
    int64_t timeout_ms;
} g_watch = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *watchdog_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_watch.mu);
    while (!g_watch.stop) {
        if (thread_cond_wait_until(&g_watch.cv, &g_watch.mu, g_watch.deadline_ns) || g_watch.stop)
            continue;
        pthread_mutex_unlock(&g_watch.mu);
        char secs[32];
        pyfmt_seconds_ms(g_watch.timeout_ms, secs, sizeof secs);
        td_buf stacks = TD_BUF_INIT;
        stacks_dump_all(&stacks);
        harness_log(NULL, "Process %d terminated or timed out after %s seconds (case %s). Its threads:\n%s",
                       g_child.rank, secs, g_child.name, stacks.data ? stacks.data : "");
        buf_free(&stacks);
        fflush(stdout);
        fflush(stderr);
        _exit(TD_TEST_ERROR_EXIT_CODE);
    }
    pthread_mutex_unlock(&g_watch.mu);
    return NULL;
}

/* ---- running cases ------------------------------------------------------------------------- */

/* The context of one instance in dir (which the context's strings own, with the parameter). */
static void ctx_init(td_test_ctx *ctx, const char *name, const char *param, size_t plen, const char *dir, int rank,
                     int world_size, bool threaded)
{
    char *store = harness_store_path(dir);
    *ctx = (td_test_ctx){
        .rank = rank,
        .world_size = world_size,
        .name = name,
        .param = alloc_strndup(param, plen),
        .tmpdir = dir,
        .store_path = store,
        .init_url = alloc_printf("file://%s", store),
        .threaded = threaded,
    };
}

static void ctx_free(td_test_ctx *ctx)
{
    free((char *)ctx->param);
    free((char *)ctx->store_path);
    free((char *)ctx->init_url);
}

/* A process case: its setup hook, then the body between two leak snapshots. */
static void run_case(td_test_case *c, td_test_ctx *ctx)
{
    if (c->setup)
        c->setup(ctx);
    td_leak_snapshot before = {0};
    if (!c->no_leak_check)
        leak_snapshot_take(&before);
    c->fn(ctx);
    if (!c->no_leak_check) {
        char *leak = leak_check(&before, leak_grace_ms(c));
        leak_snapshot_free(&before);
        if (leak)
            harness_fail_process(leak);
    }
}

/* A suite's batch in this rank (testing.h, "Suites"): the suite's setup, each case in turn in its
 * own dir (<dir>/<index> when the supervisor runs a batch, else dir itself), each passed case
 * reported to the parent, then the teardown, with a leak check around the whole. A failure or skip
 * ends the process as in any case. */
static void run_suite(const td_harness_child_args *a, td_test_case *first, td_test_ctx *suite_ctx)
{
    const td_test_suite *fixture = harness_find_suite(first->suite);
    td_leak_snapshot before = {0};
    if (!first->no_leak_check)
        leak_snapshot_take(&before);
    suite_ctx->name = first->suite;
    if (fixture && fixture->setup)
        fixture->setup(suite_ctx);
    const char *list = a->suite_cases ? a->suite_cases : a->name;
    uint32_t index = 0;
    for (const char *p = list; *p; index++) {
        size_t n = strcspn(p, ",");
        char *name = alloc_strndup(p, n);
        p += n + (p[n] == ',');
        td_test_case *c;
        const char *param;
        size_t plen;
        if (!harness_find(name, &c, &param, &plen))
            harness_fail_process(alloc_printf("no test case named '%s' in this binary", name));
        char *dir = a->suite_cases ? alloc_printf("%s/%u", a->dir, index) : alloc_strdup(a->dir);
        td_test_ctx ctx;
        ctx_init(&ctx, name, param, plen, dir, a->rank, a->world_size, false);
        if (a->suite_cases) /* under the supervisor: no watchdog thread reads the name */
            g_child.name = name;
        run_case(c, &ctx);
        ctx_free(&ctx);
        free(dir);
        if (a->suite_cases)
            g_child.name = a->name;
        free(name);
        uint8_t le[4];
        le_put(le, index, 4);
        fflush(stdout); /* the parent reads what the case printed before its report */
        fflush(stderr);
        if (g_child.ctl >= 0 && ctl_send(g_child.ctl, TD_CTL_CASE_DONE, le, sizeof le) != TD_OK)
            harness_fail_process(alloc_printf("could not report case %u of the suite: %s", index, td_last_error()));
        ack_wait(index + 1);
    }
    suite_ctx->name = first->suite;
    if (fixture && fixture->teardown)
        fixture->teardown(suite_ctx);
    if (!first->no_leak_check) {
        char *leak = leak_check(&before, leak_grace_ms(first));
        leak_snapshot_free(&before);
        if (leak)
            harness_fail_process(alloc_printf("suite %s, after its teardown: %s", first->suite, leak));
    }
}

/* ---- main of a rank ----------------------------------------------------------------------- */

int harness_child_main(const td_harness_child_args *a)
{
    td_test_case *c;
    const char *param;
    size_t plen;
    if (!harness_find(a->name, &c, &param, &plen)) {
        fprintf(stderr, "tdist test harness: no test case named '%s' in this binary\n", a->name);
        return 2;
    }
    /* The kernel named this process "exe" after /proc/self/exe; show the binary's name instead. */
    char exe[4096];
    ssize_t en = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (en > 0) {
        exe[en] = '\0';
        const char *base = strrchr(exe, '/');
        prctl(PR_SET_NAME, base ? base + 1 : exe);
    }
    bool external = a->ctl_fd < 0; /* started by a launcher (--td-external), not by the supervisor */
    /* Nested runs (a meta-test's own ranks) must not inherit this rank's channel. */
    if (!external)
        fcntl(a->ctl_fd, F_SETFD, FD_CLOEXEC);
    g_child.active = true;
    g_child.threaded = c->threads;
    g_child.rank = a->rank;
    g_child.ctl = a->ctl_fd;
    harness_ctl_attach(a->rank, a->ctl_fd);
    g_child.name = a->name;
    stacks_install(a->rank, c->threads);
    if (!c->threads)
        stacks_set_thread_rank(a->rank);

    td_test_ctx ctx;
    ctx_init(&ctx, a->name, param, plen, a->dir, a->rank, a->world_size, c->threads);

    pthread_t listener;
    bool listening = false, watching = false;
    if (external) {
        const char *reason = c->static_skip ? c->static_skip(ctx.param) : NULL;
        if (reason)
            td_test_skip(TD_SKIP_GENERIC, reason);
        thread_cond_init(&g_watch.cv);
        g_watch.timeout_ms = harness_timeout_ms(c);
        g_watch.deadline_ns = deadline_after_ms(g_watch.timeout_ms);
        watching = thread_start(&listener, "td-watchdog", watchdog_main, NULL) == TD_OK;
        if (!watching)
            harness_log(NULL, "%s; the case's timeout is left to the launcher", td_last_error());
    } else if (pipe2(g_child.stop, O_CLOEXEC) == 0) {
        harness_note(NULL, "Starting event listener thread for rank %d", a->rank);
        g_ack.enabled = true; /* before the thread starts: it may clear it (closed) */
        listening = thread_start(&listener, "td-listener", listener_main, NULL) == TD_OK;
        g_ack.enabled = listening;
        if (!listening)
            harness_log(NULL, "%s; hung-rank stacks will not be available", td_last_error());
    }

    if (c->threads)
        harness_threaded_main(c, &ctx, a->ctl_fd);
    else if (c->suite)
        run_suite(a, c, &ctx);
    else
        run_case(c, &ctx);

    if (listening) {
        (void)!write(g_child.stop[1], "x", 1);
        thread_join(listener);
    }
    if (watching) {
        pthread_mutex_lock(&g_watch.mu);
        g_watch.stop = true;
        pthread_cond_broadcast(&g_watch.cv);
        pthread_mutex_unlock(&g_watch.mu);
        thread_join(listener);
    }
    if (g_child.stop[0] >= 0) {
        close(g_child.stop[0]);
        close(g_child.stop[1]);
    }
    if (!external)
        close(g_child.ctl);
    ctx_free(&ctx);
    fflush(stdout);
    fflush(stderr);
    return 0;
}
