/* Internal growable byte buffer, also used as a string builder.
 *
 *   td_buf b = TD_BUF_INIT;
 *   buf_printf(&b, "%d ranks", n);  buf_append(&b, bytes, len);
 *   use(b.data, b.len);  buf_free(&b);
 *
 * data is always NUL-terminated (one spare byte beyond len), so a text buffer is a C string. Growth
 * aborts on out-of-memory (base/alloc.h); buf_try_reserve is the fallible form for peer sizes. */
#ifndef TDIST_BASE_BUF_H
#define TDIST_BASE_BUF_H

#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>

typedef struct td_buf {
    char *data;
    size_t len;
    size_t cap;
} td_buf;

#define TD_BUF_INIT {NULL, 0, 0}

void buf_reserve(td_buf *b, size_t extra);
td_status buf_try_reserve(td_buf *b, size_t extra);
void buf_append(td_buf *b, const void *data, size_t len);
void buf_append_str(td_buf *b, const char *s);
void buf_putc(td_buf *b, char c);
void buf_printf(td_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string: quoted, with '"', '\\' and control characters escaped. */
void buf_put_json(td_buf *b, const char *s);
/* Grows len by n and returns the start of the new (uninitialized) bytes. */
void *buf_extend(td_buf *b, size_t n);
void buf_clear(td_buf *b);
/* Drops the first n bytes. */
void buf_consume(td_buf *b, size_t n);
/* Hands the data to the caller (free() it) and resets the buffer; never NULL. */
char *buf_steal(td_buf *b);
void buf_free(td_buf *b);

/* Little-endian fixed-width appends, for wire formats. */
void buf_put_u8(td_buf *b, uint8_t v);
void buf_put_u32(td_buf *b, uint32_t v);
void buf_put_u64(td_buf *b, uint64_t v);

#endif
