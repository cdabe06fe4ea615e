/* Printing tensors the way PyTorch's repr does (torch/_tensor_str.py with the default print
 * options: precision 4, threshold 1000, edgeitems 3, linewidth 80), so output can be compared with
 * torch's by eye or in tests:
 *
 *     tensor([1, 2, 3])        tensor([1.0000, 2.5000])        tensor([1., 2.], dtype=float64)
 *     tensor([[ 0.,  1.],      tensor([0.0000e+00, 1.0000e+05, 1.0000e-05])
 *             [10., 11.]])
 *
 * As in torch, one formatter per tensor (two for complex: real and imaginary parts) decides from
 * the elements that will be shown whether floats print as integers ("1."), fixed ("1.5000") or
 * scientific, and the common width; tensors over 1000 elements show 3 items at each end of each
 * dim with "..." between. Dtype names print without torch's "torch." prefix. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "tensor/device_tensor.h"
#include "tensor/dtype.h"
#include "tensor/strided.h"

enum { PRECISION = 4, THRESHOLD = 1000, EDGEITEMS = 3, LINEWIDTH = 80 };

typedef enum part { PART_REAL, PART_IMAG } part;

typedef struct formatter {
    bool floating;
    bool int_mode;
    bool sci_mode;
    int max_width;
} formatter;

typedef struct printer {
    const td_tensor *t;
    size_t elsize;
    bool summarize;
    formatter f[2]; /* real (or only) part, imaginary part */
    bool is_complex;
    td_buf out;
} printer;

/* ---- values ----------------------------------------------------------------------------------- */

static double float_value(const printer *p, const char *ptr, part which)
{
    td_c128 v;
    tensor_convert_element(&v, TD_COMPLEX128, ptr, p->t->dtype);
    return which == PART_IMAG ? v.im : v.re;
}

/* Python's str() of a non-floating element. */
static int format_integral(char *buf, size_t len, const printer *p, const char *ptr)
{
    if (p->t->dtype == TD_BOOL)
        return snprintf(buf, len, "%s", *(const uint8_t *)ptr ? "True" : "False");
    int64_t v;
    tensor_convert_element(&v, TD_INT64, ptr, p->t->dtype);
    return snprintf(buf, len, "%lld", (long long)v);
}

/* Python's format(value, ".{prec}f" / ".{prec}e"); Python prints every NaN as "nan". */
static int format_float(char *buf, size_t len, double v, char conv, int prec, int width)
{
    if (isnan(v))
        return snprintf(buf, len, "%*s", width, "nan");
    if (conv == 'e')
        return snprintf(buf, len, "%*.*e", width, prec, v);
    return snprintf(buf, len, "%*.*f", width, prec, v);
}

/* ---- the elements that will be shown --------------------------------------------------------- */

typedef void (*visit_fn)(printer *p, const char *ptr, void *ctx);

/* Visits the elements get_summarized_data() keeps: with summarize, the first and last EDGEITEMS of
 * every dim longer than 2 * EDGEITEMS. */
static void visit(printer *p, const char *ptr, int dim, visit_fn fn, void *ctx)
{
    const td_tensor *t = p->t;
    if (dim == t->ndim) {
        fn(p, ptr, ctx);
        return;
    }
    int64_t size = t->sizes[dim], step = t->strides[dim] * (int64_t)p->elsize;
    bool cut = p->summarize && size > 2 * EDGEITEMS;
    for (int64_t i = 0; i < size; i++) {
        if (cut && i == EDGEITEMS)
            i = size - EDGEITEMS;
        visit(p, ptr + i * step, dim + 1, fn, ctx);
    }
}

typedef struct stats {
    part which;
    bool any;
    bool all_integral;
    double min_abs, max_abs;
    formatter *f;
} stats;

static void collect_stats(printer *p, const char *ptr, void *vctx)
{
    stats *s = vctx;
    double v = float_value(p, ptr, s->which);
    if (!isfinite(v) || v == 0)
        return;
    double a = fabs(v);
    if (!s->any) {
        s->min_abs = s->max_abs = a;
        s->any = true;
    }
    s->min_abs = a < s->min_abs ? a : s->min_abs;
    s->max_abs = a > s->max_abs ? a : s->max_abs;
    if (v != ceil(v))
        s->all_integral = false;
}

static void collect_width(printer *p, const char *ptr, void *vctx)
{
    stats *s = vctx;
    formatter *f = s->f;
    char buf[512];
    int n;
    if (!f->floating) {
        n = format_integral(buf, sizeof buf, p, ptr);
    } else {
        double v = float_value(p, ptr, s->which);
        if (!isfinite(v) || v == 0)
            return;
        if (f->sci_mode)
            n = format_float(buf, sizeof buf, v, 'e', PRECISION, 0);
        else if (f->int_mode)
            n = format_float(buf, sizeof buf, v, 'f', 0, 0) + 1; /* the "." added to every value */
        else
            n = format_float(buf, sizeof buf, v, 'f', PRECISION, 0);
    }
    if (n > f->max_width)
        f->max_width = n;
}

/* _Formatter.__init__. */
static void init_formatter(printer *p, formatter *f, part which)
{
    td_dtype dt = p->t->dtype;
    *f = (formatter){.floating = td_dtype_is_floating(dt) || td_dtype_is_complex(dt), .int_mode = true, .max_width = 1};
    stats s = {.which = which, .all_integral = true, .f = f};
    if (f->floating) {
        visit(p, td_tensor_data(p->t), 0, collect_stats, &s);
        if (!s.any)
            return;
        f->int_mode = s.all_integral;
        if (f->int_mode)
            f->sci_mode = s.max_abs / s.min_abs > 1000.0 || s.max_abs > 1.0e8;
        else
            f->sci_mode = s.max_abs / s.min_abs > 1000.0 || s.max_abs > 1.0e8 || s.min_abs < 1.0e-4;
    }
    visit(p, td_tensor_data(p->t), 0, collect_width, &s);
}

/* _Formatter.format: the element padded to the formatter's width. */
static void format_value(const printer *p, const formatter *f, const char *ptr, part which, td_buf *out)
{
    char buf[512];
    int n;
    if (!f->floating) {
        n = format_integral(buf, sizeof buf, p, ptr);
    } else {
        double v = float_value(p, ptr, which);
        if (f->sci_mode) {
            n = format_float(buf, sizeof buf, v, 'e', PRECISION, f->max_width);
        } else if (f->int_mode) {
            n = format_float(buf, sizeof buf, v, 'f', 0, 0);
            if (isfinite(v))
                n += snprintf(buf + n, sizeof buf - (size_t)n, ".");
        } else {
            n = format_float(buf, sizeof buf, v, 'f', PRECISION, 0);
        }
    }
    for (int i = n; i < f->max_width; i++)
        buf_putc(out, ' ');
    buf_append(out, buf, (size_t)n);
}

/* _val_formatter / _scalar_str: one element, complex as "re+imj". */
static void format_element(printer *p, const char *ptr, td_buf *out)
{
    format_value(p, &p->f[0], ptr, PART_REAL, out);
    if (!p->is_complex)
        return;
    td_buf im = TD_BUF_INIT;
    format_value(p, &p->f[1], ptr, PART_IMAG, &im);
    buf_putc(&im, 'j');
    const char *s = im.data;
    while (*s == ' ')
        s++;
    if (*s != '+' && *s != '-')
        buf_putc(out, '+');
    buf_append_str(out, s);
    buf_free(&im);
}

/* ---- layout ----------------------------------------------------------------------------------- */

static void put_spaces(td_buf *out, int n)
{
    for (int i = 0; i < n; i++)
        buf_putc(out, ' ');
}

/* _vector_str. */
static void format_vector(printer *p, const char *ptr, int dim, int indent, td_buf *out)
{
    const td_tensor *t = p->t;
    int element_length = p->f[0].max_width + 2;
    if (p->is_complex)
        element_length += p->f[1].max_width + 1;
    int per_line = (LINEWIDTH - indent) / element_length;
    if (per_line < 1)
        per_line = 1;
    int64_t size = t->sizes[dim], step = t->strides[dim] * (int64_t)p->elsize;
    bool cut = p->summarize && size > 2 * EDGEITEMS;
    buf_putc(out, '[');
    int64_t item = 0; /* position in the printed list, "..." included */
    for (int64_t i = 0; i < size; i++, item++) {
        if (item > 0) {
            if (item % per_line == 0) {
                buf_append_str(out, ",\n");
                put_spaces(out, indent + 1);
            } else {
                buf_append_str(out, ", ");
            }
        }
        if (cut && i == EDGEITEMS) {
            buf_append_str(out, " ...");
            i = size - EDGEITEMS - 1;
            continue;
        }
        format_element(p, ptr + i * step, out);
    }
    buf_putc(out, ']');
}

/* _tensor_str_with_formatter. */
static void format_dims(printer *p, const char *ptr, int dim, int indent, td_buf *out)
{
    const td_tensor *t = p->t;
    int rest = t->ndim - dim;
    if (rest == 0) {
        format_element(p, ptr, out);
        return;
    }
    if (rest == 1) {
        format_vector(p, ptr, dim, indent, out);
        return;
    }
    int64_t size = t->sizes[dim], step = t->strides[dim] * (int64_t)p->elsize;
    bool cut = p->summarize && size > 2 * EDGEITEMS;
    buf_putc(out, '[');
    for (int64_t i = 0; i < size; i++) {
        if (i > 0) {
            buf_putc(out, ',');
            for (int k = 0; k < rest - 1; k++)
                buf_putc(out, '\n');
            put_spaces(out, indent + 1);
        }
        if (cut && i == EDGEITEMS) {
            buf_append_str(out, "...");
            i = size - EDGEITEMS - 1;
            continue;
        }
        format_dims(p, ptr + i * step, dim + 1, indent + 1, out);
    }
    buf_putc(out, ']');
}

/* _add_suffixes: ", suffix" on the same line while it fits in LINEWIDTH. *last_line_len starts
 * at -1 and is then kept as torch keeps it (its first value is torch's slightly odd
 * len - rfind("\n") + 1). */
static void add_suffix(td_buf *out, const char *suffix, int indent, long *last_line_len)
{
    if (*last_line_len < 0) {
        const char *nl = strrchr(out->data, '\n');
        *last_line_len = (long)out->len - (nl ? (long)(nl - out->data) : -1) + 1;
    }
    long len = (long)strlen(suffix);
    if (*last_line_len + len + 2 > LINEWIDTH) {
        buf_append_str(out, ",\n");
        put_spaces(out, indent);
        *last_line_len = indent + len;
    } else {
        buf_append_str(out, ", ");
        *last_line_len += len + 2;
    }
    buf_append_str(out, suffix);
}

/* device: "device='sim:1'" for a tensor copied from a device (printed before the dtype, as
 * torch does), NULL for a host one. */
static char *format_host(const td_tensor *t, const char *device)
{
    const int indent = 7; /* strlen("tensor(") */
    printer p = {.t = t, .elsize = td_dtype_size(t->dtype), .is_complex = td_dtype_is_complex(t->dtype)};
    buf_append_str(&p.out, "tensor(");
    int64_t numel = td_tensor_numel(t);
    char suffix[TD_MAX_DIMS * 22 + 16];
    long line_len = -1;
    if (numel == 0) {
        buf_append_str(&p.out, "[]");
        if (device)
            add_suffix(&p.out, device, indent, &line_len);
        /* torch prints the shape of an empty tensor unless it is (0,), and always its dtype
         * unless it is the default float32: there are no elements to tell int64 apart. */
        if (t->ndim != 1) {
            size_t n = (size_t)snprintf(suffix, sizeof suffix, "size=(");
            for (int i = 0; i < t->ndim; i++)
                n += (size_t)snprintf(suffix + n, sizeof suffix - n, "%s%lld", i ? ", " : "", (long long)t->sizes[i]);
            snprintf(suffix + n, sizeof suffix - n, ")");
            add_suffix(&p.out, suffix, indent, &line_len);
        }
        if (t->dtype != TD_FLOAT32) {
            snprintf(suffix, sizeof suffix, "dtype=%s", td_dtype_name(t->dtype));
            add_suffix(&p.out, suffix, indent, &line_len);
        }
    } else {
        p.summarize = numel > THRESHOLD;
        init_formatter(&p, &p.f[0], PART_REAL);
        if (p.is_complex)
            init_formatter(&p, &p.f[1], PART_IMAG);
        format_dims(&p, td_tensor_data(t), 0, indent, &p.out);
        if (device)
            add_suffix(&p.out, device, indent, &line_len);
        td_dtype dt = t->dtype;
        if (dt != TD_FLOAT32 && dt != TD_COMPLEX64 && dt != TD_INT64 && dt != TD_BOOL) {
            snprintf(suffix, sizeof suffix, "dtype=%s", td_dtype_name(dt));
            add_suffix(&p.out, suffix, indent, &line_len);
        }
    }
    buf_putc(&p.out, ')');
    return buf_steal(&p.out);
}

char *td_tensor_format(const td_tensor *t)
{
    if (!t)
        return alloc_strdup("NULL");
    if (tensor_is_host(t))
        return format_host(t, NULL);
    /* A device tensor prints from a host copy, with its device, as torch prints a cuda tensor. */
    const td_device cpu = {TD_DEVICE_CPU, -1};
    char name[32], device[48];
    td_device_str(t->storage->device, name, sizeof name);
    td_tensor *host = NULL;
    if (td_tensor_to_device((td_tensor *)t, cpu, false, &host) != TD_OK)
        return alloc_printf("tensor(<unreadable on %s: %s>)", name, td_last_error());
    snprintf(device, sizeof device, "device='%s'", name);
    char *s = format_host(host, device);
    td_tensor_release(host);
    return s;
}

void td_tensor_print(FILE *f, const td_tensor *t)
{
    char *s = td_tensor_format(t);
    fputs(s, f ? f : stdout);
    fputc('\n', f ? f : stdout);
    free(s);
}
