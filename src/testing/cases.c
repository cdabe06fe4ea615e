/* The case registry: TD_TEST registers each case from a constructor; a case with .params expands
 * to one instance per parameter, named "<case>/<param>"; TD_TEST_SUITE registers a suite's setup
 * and teardown. Also what both sides of the harness share:
 * a case's world size, timeout and store path, and the harness's log lines. The command line that
 * runs cases is entry.c. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "base/launcher.h"
#include "testing/harness.h"

#include <tdist/mp.h>

static td_test_case *g_head, *g_tail;

void td_test_register(td_test_case *c)
{
    c->next = NULL;
    if (g_tail)
        g_tail->next = c;
    else
        g_head = c;
    g_tail = c;
}

static td_test_suite *g_suites;

void td_test_register_suite(td_test_suite *s)
{
    s->next = g_suites;
    g_suites = s;
}

const td_test_suite *harness_find_suite(const char *name)
{
    for (td_test_suite *s = name ? g_suites : NULL; s; s = s->next)
        if (strcmp(s->name, name) == 0)
            return s;
    return NULL;
}

static const char *const skip_messages[] = {
    [72 - 72] = "Skipped because distributed backend is not available.",
    [73 - 72] = "Skipped due to small world size.",
    [74 - 72] = "CUDA is not available.",
    [75 - 72] = "Need at least 1 CUDA device",
    [76 - 72] = "c10d not compiled with NCCL support",
    [77 - 72] = "Need at least 2 CUDA devices",
    [78 - 72] = "Test skipped for ROCm",
    [79 - 72] = "Test skipped because no GPU peer access",
    [80 - 72] = "Need at least 3 CUDA devices",
    [81 - 72] = "Need at least 4 CUDA devices",
    [82 - 72] = "Need at least 5 CUDA devices",
    [83 - 72] = "Need at least 6 CUDA devices",
    [84 - 72] = "Need at least 7 CUDA devices",
    [85 - 72] = "Need at least 8 CUDA devices",
    [86 - 72] = "Test skipped at subprocess level, look at subprocess log for skip reason",
    [87 - 72] = "Skipped due to odd world size.",
    [88 - 72] = "Test skipped due to missing import",
};

const char *td_skip_message(int code)
{
    if (code < 72 || code > 88)
        return NULL;
    return skip_messages[code - 72];
}

int td_skip_multi_gpu(int n)
{
    if (n == 1)
        return TD_SKIP_MULTI_GPU_1;
    if (n == 2)
        return TD_SKIP_MULTI_GPU_2;
    if (n >= 3 && n <= 8)
        return 80 + n - 3;
    return -1;
}

int harness_world_size(const td_test_case *c) { return c->world_size > 0 ? c->world_size : 1; }

int64_t harness_timeout_ms(const td_test_case *c)
{
    if (c->timeout_s > 0)
        return (int64_t)c->timeout_s * 1000;
    int64_t ms = 300000;
    if (env_get_duration_ms("TDIST_TEST_TIMEOUT", 300000, 1000, &ms) != TD_OK) {
        harness_log(NULL, "%s; using 300 seconds", td_last_error());
        ms = 300000;
    }
    return ms > 0 ? ms : 300000;
}

bool harness_sandcastle(void)
{
    bool on = false;
    if (env_get_bool("TDIST_TEST_SANDCASTLE", false, &on) != TD_OK)
        harness_log(NULL, "%s; treating it as off", td_last_error());
    return on;
}

char *harness_store_path(const char *dir) { return alloc_printf("%s/store", dir); }

__attribute__((format(printf, 3, 0))) static void log_line(td_buf *log, bool print, const char *fmt, va_list ap0)
{
    td_buf line = TD_BUF_INIT;
    va_list ap;
    va_copy(ap, ap0);
    char small[1024];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof small) {
        buf_reserve(&line, (size_t)n + 1);
        va_copy(ap, ap0);
        vsnprintf(buf_extend(&line, (size_t)n), (size_t)n + 1, fmt, ap);
        va_end(ap);
    } else if (n > 0) {
        buf_append(&line, small, (size_t)n);
    }
    if (log) {
        buf_append(log, line.data ? line.data : "", line.len);
        buf_putc(log, '\n');
    }
    if (!print) {
        buf_free(&line);
        return;
    }
    td_buf out = TD_BUF_INIT;
    buf_append_str(&out, "[tdist-test] ");
    buf_append(&out, line.data ? line.data : "", line.len);
    buf_putc(&out, '\n');
    fflush(stderr);
    for (size_t off = 0; off < out.len;) {
        ssize_t w = write(STDERR_FILENO, out.data + off, out.len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    buf_free(&out);
    buf_free(&line);
}

void harness_log(td_buf *log, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_line(log, true, fmt, ap);
    va_end(ap);
}

void harness_note(td_buf *log, const char *fmt, ...)
{
    bool verbose = false;
    if (env_get_bool("TDIST_TEST_VERBOSE", false, &verbose) != TD_OK)
        verbose = false;
    va_list ap;
    va_start(ap, fmt);
    log_line(log, verbose, fmt, ap);
    va_end(ap);
}

/* ---- instances ---------------------------------------------------------------------------- */

/* Calls fn for each instance of c: ("" , 0) for a plain case, else each parameter. */
void harness_for_each_param(const td_test_case *c, void (*fn)(void *, const td_test_case *, const char *, size_t),
                            void *arg)
{
    if (!c->params || !c->params[0]) {
        fn(arg, c, "", 0);
        return;
    }
    const char *p = c->params;
    for (;;) {
        size_t n = strcspn(p, ",");
        if (n > 0)
            fn(arg, c, p, n);
        if (!p[n])
            break;
        p += n + 1;
    }
}

char *harness_instance_name(const td_test_case *c, const char *param, size_t plen)
{
    if (plen == 0)
        return alloc_strdup(c->name);
    return alloc_printf("%s/%.*s", c->name, (int)plen, param);
}

typedef struct find_ctx {
    const char *want; /* the param part */
    const char *found;
    size_t found_len;
    bool ok;
} find_ctx;

static void find_param(void *arg, const td_test_case *c, const char *param, size_t plen)
{
    (void)c;
    find_ctx *f = arg;
    if (!f->ok && strlen(f->want) == plen && strncmp(f->want, param, plen) == 0) {
        f->ok = true;
        f->found = param;
        f->found_len = plen;
    }
}

bool harness_find(const char *name, td_test_case **out, const char **param, size_t *param_len)
{
    const char *slash = strchr(name, '/');
    size_t nlen = slash ? (size_t)(slash - name) : strlen(name);
    for (td_test_case *c = g_head; c; c = c->next) {
        if (strlen(c->name) != nlen || strncmp(c->name, name, nlen) != 0)
            continue;
        find_ctx f = {slash ? slash + 1 : "", NULL, 0, false};
        harness_for_each_param(c, find_param, &f);
        if (!f.ok)
            return false;
        *out = c;
        *param = f.found ? f.found : "";
        *param_len = f.found_len;
        return true;
    }
    return false;
}

td_test_case *harness_cases(void) { return g_head; }
