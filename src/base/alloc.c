/* Aborting allocators for bookkeeping, fallible ones for user- and peer-sized data (see alloc.h). */
#include "base/alloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"

static void out_of_memory(size_t size)
{
    char line[128];
    int n = snprintf(line, sizeof line, "tdist: out of memory allocating %zu bytes\n", size);
    (void)!write(STDERR_FILENO, line, (size_t)n);
    abort();
}

void *alloc_or_die(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p)
        out_of_memory(size);
    return p;
}

void *alloc_zeroed(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        out_of_memory(count * size);
    return p;
}

void *alloc_resize(void *ptr, size_t size)
{
    void *p = realloc(ptr, size ? size : 1);
    if (!p)
        out_of_memory(size);
    return p;
}

char *alloc_strdup(const char *s) { return alloc_strndup(s, strlen(s)); }

char *alloc_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *p = alloc_or_die(len + 1);
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

char *alloc_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    char *p = alloc_or_die((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

static td_status nomem(size_t size, const char *what)
{
    return error_fmt(TD_ERR_NOMEM, "out of memory allocating %s (%zu bytes)", what ? what : "a buffer", size);
}

td_status alloc_try(size_t size, const char *what, void **out)
{
    void *p = malloc(size ? size : 1);
    if (!p)
        return nomem(size, what);
    *out = p;
    return TD_OK;
}

td_status alloc_try_aligned(size_t align, size_t size, const char *what, void **out)
{
    void *p = NULL;
    if (posix_memalign(&p, align, size ? size : align) != 0)
        return nomem(size, what);
    *out = p;
    return TD_OK;
}
