/* The printed form of a td_value (td_value_format, td_value_print), modelled on Python's repr so
 * that logs and error messages read like PyTorch's: [1, 'a', (2.5, None), {'k': tensor([1, 2])}].
 * Floats print as Python's shortest round-tripping repr, strings with Python's quoting and
 * escapes, tensors through td_tensor_format, and records by their tag's name with named fields:
 * WorkerInfo(name='w0', id=0). Nesting deeper than TD_VALUE_MAX_DEPTH prints as "...". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "tensor/value_impl.h"

/* Python's float repr: the shortest digits that read back to d, in fixed notation for decimal
 * exponents in [-4, 16) and scientific otherwise. add_dot0 gives integral values a ".0" (floats
 * do, complex parts do not). */
static void put_double(td_buf *b, double d, bool add_dot0)
{
    if (isnan(d)) {
        buf_append_str(b, "nan");
        return;
    }
    if (isinf(d)) {
        buf_append_str(b, d < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    /* tmp is [-]D[.DDD]e(+|-)XX */
    const char *p = tmp;
    if (*p == '-') {
        buf_putc(b, '-');
        p++;
    }
    char digits[24];
    size_t nd = 0;
    for (; *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int exp = atoi(p + 1);
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            buf_append_str(b, "0.");
            for (int i = 0; i < -exp - 1; i++)
                buf_putc(b, '0');
            buf_append(b, digits, nd);
            return;
        }
        size_t int_digits = (size_t)exp + 1;
        for (size_t i = 0; i < int_digits; i++)
            buf_putc(b, i < nd ? digits[i] : '0');
        if (nd > int_digits) {
            buf_putc(b, '.');
            buf_append(b, digits + int_digits, nd - int_digits);
        } else if (add_dot0) {
            buf_append_str(b, ".0");
        }
        return;
    }
    buf_putc(b, digits[0]);
    if (nd > 1) {
        buf_putc(b, '.');
        buf_append(b, digits + 1, nd - 1);
    }
    buf_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
}

static void put_complex(td_buf *b, double re, double im)
{
    bool bare = re == 0.0 && !signbit(re);
    if (!bare) {
        buf_putc(b, '(');
        put_double(b, re, false);
        if (!(signbit(im) && !isnan(im)))
            buf_putc(b, '+');
    }
    put_double(b, im, false);
    buf_append_str(b, bare ? "j" : "j)");
}

/* Python's quoting: single quotes unless the text has one and no double quote. */
static void put_quoted(td_buf *b, const char *s, size_t len, bool bytes)
{
    bool has_single = memchr(s, '\'', len) != NULL, has_double = memchr(s, '"', len) != NULL;
    char q = has_single && !has_double ? '"' : '\'';
    if (bytes)
        buf_putc(b, 'b');
    buf_putc(b, q);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\' || c == (unsigned char)q) {
            buf_putc(b, '\\');
            buf_putc(b, (char)c);
        } else if (c == '\n') {
            buf_append_str(b, "\\n");
        } else if (c == '\r') {
            buf_append_str(b, "\\r");
        } else if (c == '\t') {
            buf_append_str(b, "\\t");
        } else if (c < 0x20 || c == 0x7f || (bytes && c > 0x7f)) {
            buf_printf(b, "\\x%02x", c);
        } else {
            buf_putc(b, (char)c); /* UTF-8 text passes through, as Python shows it */
        }
    }
    buf_putc(b, q);
}

typedef struct record_layout {
    uint32_t tag;
    const char *name;
    size_t nfields;
    const char *fields[4];
} record_layout;

static const record_layout record_layouts[] = {
    {TD_REC_WORKER_INFO, "WorkerInfo", 2, {"name", "id"}},
    {TD_REC_RREF, "RRef", 4, {"owner_id", "rref_id", "fork_id", "type"}},
    {TD_REC_ERROR, "Error", 2, {"type", "message"}},
    {TD_REC_DEVICE, "device", 2, {"type", "index"}},
};

static void put_value(td_buf *b, const td_value *v, int depth);

static void put_items(td_buf *b, td_value *const *items, size_t n, int depth)
{
    for (size_t i = 0; i < n; i++) {
        if (i)
            buf_append_str(b, ", ");
        put_value(b, items[i], depth);
    }
}

static void put_record(td_buf *b, const td_value *v, int depth)
{
    const record_layout *layout = NULL;
    for (size_t i = 0; i < sizeof record_layouts / sizeof *record_layouts; i++)
        if (record_layouts[i].tag == v->u.seq.tag)
            layout = &record_layouts[i];
    if (!layout) {
        buf_printf(b, "Record%u(", (unsigned)v->u.seq.tag);
        put_items(b, v->u.seq.items, v->u.seq.len, depth);
        buf_putc(b, ')');
        return;
    }
    buf_append_str(b, layout->name);
    buf_putc(b, '(');
    if (layout->nfields != v->u.seq.len) {
        put_items(b, v->u.seq.items, v->u.seq.len, depth);
        buf_putc(b, ')');
        return;
    }
    static const char *const device_names[] = {"cpu", "cuda", "sim"};
    for (size_t i = 0; i < v->u.seq.len; i++) {
        const td_value *f = v->u.seq.items[i];
        buf_printf(b, "%s%s=", i ? ", " : "", layout->fields[i]);
        if (layout->tag == TD_REC_DEVICE && i == 0 && f->kind == TD_VAL_INT && f->u.i >= 0 && f->u.i < 3)
            buf_printf(b, "'%s'", device_names[f->u.i]);
        else
            put_value(b, f, depth);
    }
    buf_putc(b, ')');
}

static void put_value(td_buf *b, const td_value *v, int depth)
{
    if (!v) {
        buf_append_str(b, "<NULL>");
        return;
    }
    if (depth > TD_VALUE_MAX_DEPTH) {
        buf_append_str(b, "...");
        return;
    }
    switch (v->kind) {
    case TD_VAL_NONE:
        buf_append_str(b, "None");
        break;
    case TD_VAL_BOOL:
        buf_append_str(b, v->u.b ? "True" : "False");
        break;
    case TD_VAL_INT:
        buf_printf(b, "%lld", (long long)v->u.i);
        break;
    case TD_VAL_DOUBLE:
        put_double(b, v->u.d, true);
        break;
    case TD_VAL_COMPLEX:
        put_complex(b, v->u.c.re, v->u.c.im);
        break;
    case TD_VAL_STRING:
    case TD_VAL_BYTES:
        put_quoted(b, v->u.str.data, v->u.str.len, v->kind == TD_VAL_BYTES);
        break;
    case TD_VAL_TENSOR: {
        char *s = td_tensor_format(v->u.tensor);
        buf_append_str(b, s ? s : "tensor(?)");
        free(s);
        break;
    }
    case TD_VAL_LIST:
        buf_putc(b, '[');
        put_items(b, v->u.seq.items, v->u.seq.len, depth + 1);
        buf_putc(b, ']');
        break;
    case TD_VAL_TUPLE:
        buf_putc(b, '(');
        put_items(b, v->u.seq.items, v->u.seq.len, depth + 1);
        buf_append_str(b, v->u.seq.len == 1 ? ",)" : ")");
        break;
    case TD_VAL_DICT: {
        const td_value_dict *d = v->u.dict;
        buf_putc(b, '{');
        for (size_t i = 0; i < d->len; i++) {
            if (i)
                buf_append_str(b, ", ");
            put_value(b, d->entries[i].key, depth + 1);
            buf_append_str(b, ": ");
            put_value(b, d->entries[i].value, depth + 1);
        }
        buf_putc(b, '}');
        break;
    }
    case TD_VAL_RECORD:
        put_record(b, v, depth + 1);
        break;
    default:
        buf_printf(b, "<kind %d>", (int)v->kind);
    }
}

char *td_value_format(const td_value *v)
{
    td_buf b = TD_BUF_INIT;
    put_value(&b, v, 1);
    return buf_steal(&b);
}

void td_value_print(FILE *f, const td_value *v)
{
    char *s = td_value_format(v);
    fputs(s, f);
    free(s);
}
