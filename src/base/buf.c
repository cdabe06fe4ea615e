/* The growable byte buffer / string builder behind logs, messages and wire formats (buf.h). */
#include "base/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

static size_t grown_capacity(const td_buf *b, size_t extra, int *overflow)
{
    *overflow = 0;
    if (extra > SIZE_MAX - b->len - 1) {
        *overflow = 1;
        return 0;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return b->cap;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    return cap;
}

void buf_reserve(td_buf *b, size_t extra)
{
    int overflow;
    size_t cap = grown_capacity(b, extra, &overflow);
    if (overflow)
        cap = SIZE_MAX; /* alloc_resize aborts with a message */
    if (cap != b->cap) {
        b->data = alloc_resize(b->data, cap);
        b->cap = cap;
    }
}

td_status buf_try_reserve(td_buf *b, size_t extra)
{
    int overflow;
    size_t cap = grown_capacity(b, extra, &overflow);
    if (overflow)
        return error_fmt(TD_ERR_NOMEM, "buffer size overflow adding %zu bytes", extra);
    if (cap != b->cap) {
        char *p = realloc(b->data, cap);
        if (!p)
            return error_fmt(TD_ERR_NOMEM, "out of memory growing a buffer to %zu bytes", cap);
        b->data = p;
        b->cap = cap;
    }
    return TD_OK;
}

void *buf_extend(td_buf *b, size_t n)
{
    buf_reserve(b, n);
    void *p = b->data + b->len;
    b->len += n;
    b->data[b->len] = '\0';
    return p;
}

void buf_append(td_buf *b, const void *data, size_t len)
{
    if (len)
        memcpy(buf_extend(b, len), data, len);
    else
        buf_reserve(b, 0), b->data[b->len] = '\0';
}

void buf_append_str(td_buf *b, const char *s) { buf_append(b, s, strlen(s)); }

void buf_putc(td_buf *b, char c) { *(char *)buf_extend(b, 1) = c; }

void buf_put_json(td_buf *b, const char *s)
{
    buf_putc(b, '"');
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            buf_putc(b, '\\');
            buf_putc(b, (char)*c);
        } else if (*c < 0x20) {
            buf_printf(b, "\\u%04x", *c);
        } else {
            buf_putc(b, (char)*c);
        }
    }
    buf_putc(b, '"');
}

void buf_printf(td_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0) {
        buf_append(b, "", 0);
        return;
    }
    buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void buf_clear(td_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

void buf_consume(td_buf *b, size_t n)
{
    if (n >= b->len) {
        buf_clear(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

char *buf_steal(td_buf *b)
{
    if (!b->data)
        buf_reserve(b, 0), b->data[0] = '\0';
    char *p = b->data;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

void buf_free(td_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

void buf_put_u8(td_buf *b, uint8_t v) { *(uint8_t *)buf_extend(b, 1) = v; }

void buf_put_u32(td_buf *b, uint32_t v)
{
    uint8_t *p = buf_extend(b, 4);
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void buf_put_u64(td_buf *b, uint64_t v)
{
    uint8_t *p = buf_extend(b, 8);
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
