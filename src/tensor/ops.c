/* Tensor arithmetic with PyTorch's semantics: elementwise add, sub, mul, div and eq with
 * broadcasting and torch.result_type promotion, neg, sum, matmul (dot, mv, mm) and nonzero. The RPC
 * builtins ("aten::add", ...) and tests are its users; it is not a fast math library.
 *
 * One strided iterator (op_iter) walks up to three operands of one broadcast shape in row-major
 * order, any layout, calling a loop body per innermost run. Element values go through one of three
 * wide classes, picked by the compute dtype: int64 for bool and integers (wrapping, whose low bits
 * are what the narrow type's own arithmetic gives), double for the floating dtypes, complex128 for
 * complex. Each operand element is first converted to the compute dtype with copy.c's rules (as
 * TensorIterator casts inputs to the common dtype, so int64 -> float32 rounds before an add), then
 * widened exactly. A double result of +, -, *, / on two values of a narrower float format,
 * rounded to it, is that format's correctly rounded result (double has more than 2p + 2 bits), so
 * float32/float16/bfloat16 results equal torch's; complex64 is computed in complex128 and can
 * differ from torch in the last bit. Sums and matmul accumulate in the wide class and round once.
 * float32 and float64 ops on operands of the result's own dtype skip the conversions (typed loops),
 * as the common case of the RPC builtins. */
#include <complex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "tensor/device_tensor.h"
#include "tensor/dtype.h"
#include "tensor/strided.h"

/* ---- wide values ------------------------------------------------------------------------------ */

typedef enum wide_class { WIDE_INT, WIDE_REAL, WIDE_COMPLEX } wide_class;

typedef union wide {
    int64_t i;
    double d;
    td_c128 c;
} wide;

static wide_class class_of(td_dtype dt)
{
    if (td_dtype_is_complex(dt))
        return WIDE_COMPLEX;
    return td_dtype_is_floating(dt) ? WIDE_REAL : WIDE_INT;
}

static td_dtype wide_dtype(wide_class cls)
{
    return cls == WIDE_INT ? TD_INT64 : cls == WIDE_REAL ? TD_FLOAT64 : TD_COMPLEX128;
}

/* The element at p (of dtype src) converted to the compute dtype, then widened. The common
 * dtypes skip the conversion table's indirect calls. */
static inline wide wide_load(const char *p, td_dtype src, td_dtype compute)
{
    wide w = {0};
    if (src == compute) {
        float f;
        switch (src) {
        case TD_FLOAT32: memcpy(&f, p, sizeof f); w.d = f; return w;
        case TD_FLOAT64: memcpy(&w.d, p, sizeof w.d); return w;
        case TD_INT64: memcpy(&w.i, p, sizeof w.i); return w;
        default: break;
        }
        tensor_convert_element(&w, wide_dtype(class_of(compute)), p, src);
    } else {
        char tmp[16];
        tensor_convert_element(tmp, compute, p, src);
        tensor_convert_element(&w, wide_dtype(class_of(compute)), tmp, compute);
    }
    return w;
}

static inline void wide_store(char *p, td_dtype dst, wide w, wide_class cls)
{
    if (dst == TD_FLOAT32 && cls == WIDE_REAL) {
        float f = (float)w.d;
        memcpy(p, &f, sizeof f);
    } else if ((dst == TD_FLOAT64 && cls == WIDE_REAL) || (dst == TD_INT64 && cls == WIDE_INT)) {
        memcpy(p, &w, 8);
    } else {
        tensor_convert_element(p, dst, &w, wide_dtype(cls));
    }
}

/* td_c128 has double complex's layout (real, imaginary); copying avoids CMPLX, which not every
 * compiler's complex.h defines. */
_Static_assert(sizeof(td_c128) == sizeof(double complex), "td_c128 is laid out as double complex");
static double complex to_c(td_c128 v)
{
    double complex z;
    memcpy(&z, &v, sizeof z);
    return z;
}
static td_c128 from_c(double complex z)
{
    td_c128 v;
    memcpy(&v, &z, sizeof v);
    return v;
}

/* ---- the strided broadcast iterator -------------------------------------------------------- */

enum { MAX_OPS = 3 };

typedef struct op_operand {
    char *data; /* element 0 */
    td_dtype dtype;
    int ndim;
    const int64_t *sizes;   /* ndim entries */
    const int64_t *strides; /* elements */
    bool wrapped;           /* a Python number (td_scalar), for promotion */
} op_operand;

typedef struct op_iter {
    int ndim;
    int64_t sizes[TD_MAX_DIMS];
    int nops;
    char *data[MAX_OPS];
    int64_t strides[MAX_OPS][TD_MAX_DIMS]; /* bytes; 0 along broadcast dims */
} op_iter;

/* Called per innermost run of n elements; step[k] is operand k's byte stride along it. */
typedef void (*iter_body)(void *ctx, char *const *ptr, const int64_t *step, int64_t n);

static op_operand operand_of(const td_tensor *t)
{
    return (op_operand){.data = tensor_data_of(t), .dtype = t->dtype, .ndim = t->ndim, .sizes = t->sizes,
                        .strides = t->strides};
}

static void iter_init(op_iter *it, int ndim, const int64_t *sizes)
{
    memset(it, 0, sizeof *it);
    it->ndim = ndim;
    memcpy(it->sizes, sizes, sizeof(int64_t) * (size_t)ndim);
}

/* Adds an operand broadcast (aligned right) to the iterator's shape, which it must fit. */
static void iter_add(op_iter *it, char *data, td_dtype dtype, int ndim, const int64_t *sizes, const int64_t *strides)
{
    int k = it->nops++;
    int64_t es = (int64_t)dtype_size_of(dtype);
    it->data[k] = data;
    for (int i = 0; i < it->ndim; i++) {
        int oi = i - (it->ndim - ndim);
        it->strides[k][i] = oi >= 0 && sizes[oi] != 1 ? strides[oi] * es : 0;
    }
}

static void iter_run(const op_iter *it, iter_body body, void *ctx)
{
    for (int i = 0; i < it->ndim; i++) {
        if (it->sizes[i] == 0)
            return;
    }
    char *p[MAX_OPS];
    int64_t step[MAX_OPS] = {0};
    memcpy(p, it->data, sizeof p);
    if (it->ndim == 0) {
        body(ctx, p, step, 1);
        return;
    }
    int inner = it->ndim - 1;
    for (int k = 0; k < it->nops; k++)
        step[k] = it->strides[k][inner];
    int64_t idx[TD_MAX_DIMS] = {0};
    for (;;) {
        body(ctx, p, step, it->sizes[inner]);
        int d = inner - 1;
        for (; d >= 0; d--) {
            for (int k = 0; k < it->nops; k++)
                p[k] += it->strides[k][d];
            if (++idx[d] < it->sizes[d])
                break;
            for (int k = 0; k < it->nops; k++)
                p[k] -= it->strides[k][d] * it->sizes[d];
            idx[d] = 0;
        }
        if (d < 0)
            return;
    }
}

/* ---- promotion (torch.result_type) ------------------------------------------------------------ */

/* c10's promoteTypes with "undefined" (-1) as the identity. */
static int promote_opt(int a, int b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    return (int)td_dtype_promote((td_dtype)a, (td_dtype)b);
}

static td_dtype to_complex(td_dtype dt) { return dt == TD_FLOAT64 ? TD_COMPLEX128 : TD_COMPLEX64; }

/* at::native::combine_categories: the higher tier's dtype unless the lower one's category is
 * above it. */
static int combine_categories(int higher, int lower)
{
    if (higher < 0)
        return lower;
    if (lower < 0)
        return higher;
    td_dtype h = (td_dtype)higher, l = (td_dtype)lower;
    if (td_dtype_is_complex(h))
        return higher;
    if (td_dtype_is_complex(l))
        return td_dtype_is_floating(h) ? (int)to_complex(h) : lower;
    if (td_dtype_is_floating(h))
        return higher;
    if (h == TD_BOOL || td_dtype_is_floating(l))
        return promote_opt(higher, lower);
    return higher;
}

static td_dtype result_type(const op_operand *ops, int n)
{
    int dim_result = -1, zero_result = -1, wrapped_result = -1;
    for (int i = 0; i < n; i++) {
        td_dtype dt = ops[i].dtype;
        if (ops[i].wrapped) {
            /* Python numbers count as the default dtypes of their category. */
            if (td_dtype_is_complex(dt))
                dt = TD_COMPLEX64;
            else if (td_dtype_is_floating(dt))
                dt = TD_FLOAT32;
            wrapped_result = promote_opt(wrapped_result, (int)dt);
        } else if (ops[i].ndim > 0) {
            dim_result = promote_opt(dim_result, (int)dt);
        } else {
            zero_result = promote_opt(zero_result, (int)dt);
        }
    }
    return (td_dtype)combine_categories(dim_result, combine_categories(zero_result, wrapped_result));
}

/* ---- elementwise binary ops ------------------------------------------------------------------- */

typedef enum binary_op { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_EQ } binary_op;

typedef struct binary_ctx {
    binary_op op;
    wide_class cls;
    td_dtype compute, out, in[2];
} binary_ctx;

static wide binary_apply(binary_op op, wide_class cls, wide x, wide y)
{
    wide r = {0};
    switch (cls) {
    case WIDE_INT: {
        /* Unsigned arithmetic wraps without UB; its low bits are the narrow type's result. */
        uint64_t a = (uint64_t)x.i, b = (uint64_t)y.i;
        uint64_t v = op == OP_ADD ? a + b : op == OP_SUB ? a - b : op == OP_MUL ? a * b : (uint64_t)(a == b);
        r.i = (int64_t)v;
        break;
    }
    case WIDE_REAL:
        switch (op) {
        case OP_ADD: r.d = x.d + y.d; break;
        case OP_SUB: r.d = x.d - y.d; break;
        case OP_MUL: r.d = x.d * y.d; break;
        case OP_DIV: r.d = x.d / y.d; break;
        default: r.i = x.d == y.d; break;
        }
        break;
    default: {
        double complex a = to_c(x.c), b = to_c(y.c);
        switch (op) {
        case OP_ADD: r.c = from_c(a + b); break;
        case OP_SUB: r.c = from_c(a - b); break;
        case OP_MUL: r.c = from_c(a * b); break;
        case OP_DIV: r.c = from_c(a / b); break;
        default: r.i = x.c.re == y.c.re && x.c.im == y.c.im; break;
        }
        break;
    }
    }
    return r;
}

/* float32 and float64 operands of the result's dtype: typed loops, without the per-element
 * conversion calls. Computing in the type itself rounds as double-then-round does. */
#define FAST_LOOP(T, expr)                                                        \
    for (int64_t j = 0; j < n; j++) {                                             \
        T x, y, r;                                                                \
        memcpy(&x, ptr[1] + j * step[1], sizeof x);                               \
        memcpy(&y, ptr[2] + j * step[2], sizeof y);                               \
        r = (expr);                                                               \
        memcpy(ptr[0] + j * step[0], &r, sizeof r);                               \
    }
#define FAST_OPS(T)                                                               \
    switch (c->op) {                                                              \
    case OP_ADD: FAST_LOOP(T, x + y) break;                                       \
    case OP_SUB: FAST_LOOP(T, x - y) break;                                       \
    case OP_MUL: FAST_LOOP(T, x * y) break;                                       \
    default: FAST_LOOP(T, x / y) break;                                           \
    }

static bool binary_fast(const binary_ctx *c, char *const *ptr, const int64_t *step, int64_t n)
{
    if (c->op == OP_EQ || c->in[0] != c->out || c->in[1] != c->out || c->compute != c->out)
        return false;
    if (c->out == TD_FLOAT32) {
        FAST_OPS(float)
    } else if (c->out == TD_FLOAT64) {
        FAST_OPS(double)
    } else {
        return false;
    }
    return true;
}

static void binary_body(void *vctx, char *const *ptr, const int64_t *step, int64_t n)
{
    const binary_ctx *c = vctx;
    if (binary_fast(c, ptr, step, n))
        return;
    /* eq's result is an int64 0/1 whatever the class. */
    wide_class out_cls = c->op == OP_EQ ? WIDE_INT : c->cls;
    for (int64_t j = 0; j < n; j++) {
        wide x = wide_load(ptr[1] + j * step[1], c->in[0], c->compute);
        wide y = wide_load(ptr[2] + j * step[2], c->in[1], c->compute);
        wide_store(ptr[0] + j * step[0], c->out, binary_apply(c->op, c->cls, x, y), out_cls);
    }
}

static const char *const op_names[] = {"add", "sub", "mul", "div", "eq"};

static td_status binary(binary_op op, const op_operand *a, const op_operand *b, td_tensor **out)
{
    if (op == OP_SUB && (a->dtype == TD_BOOL || b->dtype == TD_BOOL)) {
        if (a->dtype == TD_BOOL && b->dtype == TD_BOOL)
            return error_fmt(TD_ERR_INVALID, "Subtraction, the `-` operator, with two bool tensors is not supported. "
                                             "Use the `^` or `logical_xor()` operator instead.");
        return error_fmt(TD_ERR_INVALID, "Subtraction, the `-` operator, with a bool tensor is not supported. If you "
                                         "are trying to invert a mask, use the `~` or `logical_not()` operator instead.");
    }
    int ndim = 0;
    int64_t sizes[TD_MAX_DIMS];
    TD_TRY(strided_broadcast_shape(a->ndim, a->sizes, b->ndim, b->sizes, &ndim, sizes));
    op_operand both[2] = {*a, *b};
    td_dtype common = result_type(both, 2);
    binary_ctx c = {.op = op, .compute = common, .out = common, .in = {a->dtype, b->dtype}};
    if (op == OP_DIV && td_dtype_is_integral(common, true))
        c.compute = c.out = TD_FLOAT32; /* true division: the default float dtype */
    if (op == OP_EQ)
        c.out = TD_BOOL;
    c.cls = class_of(c.compute);
    /* A 0-dim operand (a Python number, or a 0-dim tensor) is one value: converted to the compute
     * dtype once here rather than at every element (wide_load converts to it first anyway), which
     * also lets `x + 1` on float32 or float64 take the typed loops. */
    _Alignas(16) char once[2][16];
    for (int k = 0; k < 2; k++) {
        if (both[k].ndim == 0 && both[k].dtype != c.compute) {
            tensor_convert_element(once[k], c.compute, both[k].data, both[k].dtype);
            both[k].data = once[k];
            both[k].dtype = c.compute;
            c.in[k] = c.compute;
        }
    }
    td_tensor *res;
    TD_TRY(td_tensor_empty(c.out, td_shape_of(ndim, sizes), &res));
    op_iter it;
    iter_init(&it, ndim, sizes);
    iter_add(&it, tensor_data_of(res), res->dtype, res->ndim, res->sizes, res->strides);
    for (int k = 0; k < 2; k++)
        iter_add(&it, both[k].data, both[k].dtype, both[k].ndim, both[k].sizes, both[k].strides);
    iter_run(&it, binary_body, &c);
    *out = res;
    return TD_OK;
}

/* The arguments every op checks first; b is NULL for ops of one tensor (has_b false). */
static td_status check_args(const char *fn, const td_tensor *a, bool has_b, const td_tensor *b, td_tensor **out)
{
    if (!a || (has_b && !b) || !out)
        return error_fmt(TD_ERR_INVALID, "td_tensor_%s: %s is NULL", fn, !a ? "a" : has_b && !b ? "b" : "out");
    /* Device tensors: only add has a kernel (binary_tensors sends it there before this check). */
    const td_tensor *dev = !tensor_is_host(a) ? a : has_b && !tensor_is_host(b) ? b : NULL;
    if (dev) {
        char name[32];
        return error_fmt(TD_ERR_UNSUPPORTED,
                         "td_tensor_%s is not supported on device tensors (got a tensor on %s): copy the operands to "
                         "the host first (td_tensor_to_device)",
                         fn, td_device_str(dev->storage->device, name, sizeof name));
    }
    return TD_OK;
}

static td_status check_in(const td_tensor *a, td_tensor **out, const char *fn) { return check_args(fn, a, false, NULL, out); }

static td_status binary_tensors(binary_op op, const td_tensor *a, const td_tensor *b, td_tensor **out)
{
    if (op == OP_ADD && a && b && out && (!tensor_is_host(a) || !tensor_is_host(b)))
        return tensor_device_add(a, b, out); /* follows its inputs' device */
    TD_TRY(check_args(op_names[op], a, true, b, out));
    op_operand oa = operand_of(a), ob = operand_of(b);
    return binary(op, &oa, &ob, out);
}

static td_status binary_scalar(binary_op op, const td_tensor *a, td_scalar s, td_tensor **out)
{
    TD_TRY(check_in(a, out, op_names[op]));
    /* The scalar as a wrapped 0-dim operand of its Python type's dtype. */
    union {
        uint8_t b;
        int64_t i;
        double d;
        td_c128 c;
    } value;
    op_operand os = {.data = (char *)&value, .ndim = 0, .wrapped = true};
    switch (s.kind) {
    case TD_SCALAR_BOOL: value.b = s.i != 0; os.dtype = TD_BOOL; break;
    case TD_SCALAR_INT: value.i = s.i; os.dtype = TD_INT64; break;
    case TD_SCALAR_FLOAT: value.d = s.re; os.dtype = TD_FLOAT64; break;
    case TD_SCALAR_COMPLEX: value.c = (td_c128){s.re, s.im}; os.dtype = TD_COMPLEX128; break;
    default: return error_fmt(TD_ERR_INVALID, "td_tensor_%s_scalar: invalid scalar kind %d", op_names[op], (int)s.kind);
    }
    op_operand oa = operand_of(a);
    return binary(op, &oa, &os, out);
}

td_status td_tensor_add(const td_tensor *a, const td_tensor *b, td_tensor **out) { return binary_tensors(OP_ADD, a, b, out); }
td_status td_tensor_sub(const td_tensor *a, const td_tensor *b, td_tensor **out) { return binary_tensors(OP_SUB, a, b, out); }
td_status td_tensor_mul(const td_tensor *a, const td_tensor *b, td_tensor **out) { return binary_tensors(OP_MUL, a, b, out); }
td_status td_tensor_div(const td_tensor *a, const td_tensor *b, td_tensor **out) { return binary_tensors(OP_DIV, a, b, out); }
td_status td_tensor_eq(const td_tensor *a, const td_tensor *b, td_tensor **out) { return binary_tensors(OP_EQ, a, b, out); }
td_status td_tensor_add_scalar(const td_tensor *a, td_scalar b, td_tensor **out) { return binary_scalar(OP_ADD, a, b, out); }
td_status td_tensor_sub_scalar(const td_tensor *a, td_scalar b, td_tensor **out) { return binary_scalar(OP_SUB, a, b, out); }
td_status td_tensor_mul_scalar(const td_tensor *a, td_scalar b, td_tensor **out) { return binary_scalar(OP_MUL, a, b, out); }
td_status td_tensor_div_scalar(const td_tensor *a, td_scalar b, td_tensor **out) { return binary_scalar(OP_DIV, a, b, out); }
td_status td_tensor_eq_scalar(const td_tensor *a, td_scalar b, td_tensor **out) { return binary_scalar(OP_EQ, a, b, out); }

td_dtype td_tensor_result_type(const td_tensor *a, const td_tensor *b)
{
    op_operand ops[2] = {operand_of(a), operand_of(b)};
    return result_type(ops, 2);
}

/* ---- neg and sum ------------------------------------------------------------------------------ */

typedef struct unary_ctx {
    td_dtype dtype;
    wide_class cls;
    wide acc; /* sum */
} unary_ctx;

static void neg_body(void *vctx, char *const *ptr, const int64_t *step, int64_t n)
{
    const unary_ctx *c = vctx;
    for (int64_t j = 0; j < n; j++) {
        wide x = wide_load(ptr[1] + j * step[1], c->dtype, c->dtype);
        if (c->cls == WIDE_INT)
            x.i = (int64_t)(0 - (uint64_t)x.i);
        else if (c->cls == WIDE_REAL)
            x.d = -x.d;
        else
            x.c = (td_c128){-x.c.re, -x.c.im};
        wide_store(ptr[0] + j * step[0], c->dtype, x, c->cls);
    }
}

td_status td_tensor_neg(const td_tensor *a, td_tensor **out)
{
    TD_TRY(check_in(a, out, "neg"));
    if (a->dtype == TD_BOOL)
        return error_fmt(TD_ERR_INVALID, "Negation, the `-` operator, on a bool tensor is not supported. If you are "
                                         "trying to invert a tensor, use the `~` or `logical_not()` operator instead.");
    td_tensor *res;
    TD_TRY(td_tensor_empty(a->dtype, td_tensor_shape(a), &res));
    unary_ctx c = {.dtype = a->dtype, .cls = class_of(a->dtype)};
    op_iter it;
    iter_init(&it, a->ndim, a->sizes);
    iter_add(&it, tensor_data_of(res), res->dtype, res->ndim, res->sizes, res->strides);
    iter_add(&it, tensor_data_of(a), a->dtype, a->ndim, a->sizes, a->strides);
    iter_run(&it, neg_body, &c);
    *out = res;
    return TD_OK;
}

static void sum_body(void *vctx, char *const *ptr, const int64_t *step, int64_t n)
{
    unary_ctx *c = vctx;
    for (int64_t j = 0; j < n; j++) {
        wide x = wide_load(ptr[0] + j * step[0], c->dtype, c->dtype);
        if (c->cls == WIDE_INT)
            c->acc.i = (int64_t)((uint64_t)c->acc.i + (uint64_t)x.i);
        else if (c->cls == WIDE_REAL)
            c->acc.d += x.d;
        else
            c->acc.c = (td_c128){c->acc.c.re + x.c.re, c->acc.c.im + x.c.im};
    }
}

/* Sums every element of a (read as dtype, which a converts to) into a wide value of dtype's class. */
static wide sum_all(const td_tensor *a, td_dtype dtype)
{
    unary_ctx c = {.dtype = a->dtype, .cls = class_of(dtype)};
    memset(&c.acc, 0, sizeof c.acc);
    op_iter it;
    iter_init(&it, a->ndim, a->sizes);
    iter_add(&it, tensor_data_of(a), a->dtype, a->ndim, a->sizes, a->strides);
    iter_run(&it, sum_body, &c);
    return c.acc;
}

td_status td_tensor_sum(const td_tensor *a, td_tensor **out)
{
    TD_TRY(check_in(a, out, "sum"));
    td_dtype dt = td_dtype_is_integral(a->dtype, true) ? TD_INT64 : a->dtype;
    td_tensor *res;
    TD_TRY(td_tensor_empty(dt, TD_SHAPE_SCALAR, &res));
    /* Integer inputs widen to int64 exactly, so their own dtype serves as the load dtype. */
    wide_store(tensor_data_of(res), dt, sum_all(a, dt), class_of(dt));
    *out = res;
    return TD_OK;
}

/* ---- nonzero ---------------------------------------------------------------------------------- */

typedef struct nonzero_ctx {
    const td_tensor *t;
    int64_t pos;     /* row-major position of the run's first element */
    int64_t count;
    int64_t *coords; /* NULL on the counting pass */
} nonzero_ctx;

static void nonzero_body(void *vctx, char *const *ptr, const int64_t *step, int64_t n)
{
    nonzero_ctx *c = vctx;
    for (int64_t j = 0; j < n; j++) {
        uint8_t nz;
        /* Conversion to bool is copy's "!= 0": NaN and a non-zero imaginary part count. */
        tensor_convert_element(&nz, TD_BOOL, ptr[0] + j * step[0], c->t->dtype);
        if (!nz)
            continue;
        if (c->coords) {
            int64_t flat = c->pos + j, *row = c->coords + c->count * c->t->ndim;
            for (int d = c->t->ndim - 1; d >= 0; d--) {
                row[d] = flat % c->t->sizes[d];
                flat /= c->t->sizes[d];
            }
        }
        c->count++;
    }
    c->pos += n;
}

td_status td_tensor_nonzero(const td_tensor *a, td_tensor **out)
{
    TD_TRY(check_in(a, out, "nonzero"));
    op_iter it;
    iter_init(&it, a->ndim, a->sizes);
    iter_add(&it, tensor_data_of(a), a->dtype, a->ndim, a->sizes, a->strides);
    nonzero_ctx c = {.t = a};
    iter_run(&it, nonzero_body, &c);
    td_tensor *res;
    TD_TRY(td_tensor_empty(TD_INT64, TD_SHAPE(c.count, a->ndim), &res));
    c.coords = tensor_data_of(res);
    c.count = c.pos = 0;
    iter_run(&it, nonzero_body, &c);
    *out = res;
    return TD_OK;
}

/* ---- matmul ----------------------------------------------------------------------------------- */

/* Gathers t (1-D or 2-D, any layout) into a new row-major array of wide values. */
typedef struct gather_ctx {
    td_dtype dtype;
    wide *dst;
} gather_ctx;

static void gather_body(void *vctx, char *const *ptr, const int64_t *step, int64_t n)
{
    gather_ctx *c = vctx;
    for (int64_t j = 0; j < n; j++)
        *c->dst++ = wide_load(ptr[0] + j * step[0], c->dtype, c->dtype);
}

static td_status gather_wide(const td_tensor *t, wide **out)
{
    int64_t n = strided_numel(t->ndim, t->sizes);
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(wide))
        return error_fmt(TD_ERR_INVALID, "matmul: an operand has too many elements");
    void *buf;
    TD_TRY(alloc_try((size_t)(n > 0 ? n : 1) * sizeof(wide), "matmul operand", &buf));
    gather_ctx c = {.dtype = t->dtype, .dst = buf};
    op_iter it;
    iter_init(&it, t->ndim, t->sizes);
    iter_add(&it, tensor_data_of(t), t->dtype, t->ndim, t->sizes, t->strides);
    iter_run(&it, gather_body, &c);
    *out = buf;
    return TD_OK;
}

/* The real dtypes' path of matmul_2d: the operands gathered as plain doubles (8 bytes, not the
 * 16 of a wide), a as an n x k row-major array and b in panels of MM_NR columns (zero-padded), so
 * that a register tile of MM_MR x MM_NR outputs is updated per step along k. The arithmetic is the
 * wide path's, in the same order (each output element sums a[i][p] * b[p][j] over p in double,
 * multiply then add, rounded once into the result's dtype), so the results are bit-identical on
 * every CPU; only the layout and the vector width differ. b is packed one panel at a time into
 * scratch that stays in the caches, as doubles (converted exactly); a float32/float64 b with
 * contiguous rows is read in place instead when a has a single tile of rows. A float32 or float64
 * result is written by the kernel, rounded as it stores; other dtypes go through a double scratch.
 * The tile kernel is built for the baseline ISA and for AVX2, picked at run time; no FMA, which
 * would round differently. */
#define MM_MR 4
#define MM_NR 8

/* The element strides of an operand seen as a matrix: a 1-D a is one row of k, a 1-D b one column
 * of k. */
static void matrix_strides(const td_tensor *t, bool is_b, int64_t *rs, int64_t *cs)
{
    if (t->ndim == 2) {
        *rs = t->strides[0];
        *cs = t->strides[1];
    } else {
        *rs = is_b ? t->strides[0] : 0;
        *cs = is_b ? 0 : t->strides[0];
    }
}

/* Element (row, col) of t at the given strides, as a double. */
#define MM_ELEM(T, base, off) ((double)((const T *)(base))[off])

static inline double element_real(const td_tensor *t, const void *base, int64_t off)
{
    return wide_load((const char *)base + (size_t)off * dtype_size_of(t->dtype), t->dtype, t->dtype).d;
}

/* Copies rows x cols elements of t (strides rs, cs) into dst at dst[i * drs + j * dcs]. */
#define MM_GATHER(T)                                                                                     \
    for (int64_t i = 0; i < rows; i++)                                                                   \
        for (int64_t j = 0; j < cols; j++)                                                               \
            dst[i * drs + j * dcs] = MM_ELEM(T, base, i * rs + j * cs)

static void gather_block(const td_tensor *t, int64_t r0, int64_t c0, int64_t rows, int64_t cols, bool is_b,
                         double *dst, int64_t drs, int64_t dcs)
{
    int64_t rs, cs;
    matrix_strides(t, is_b, &rs, &cs);
    const char *base = tensor_data_of(t);
    base += (size_t)(r0 * rs + c0 * cs) * dtype_size_of(t->dtype);
    if (t->dtype == TD_FLOAT32) {
        MM_GATHER(float);
    } else if (t->dtype == TD_FLOAT64) {
        MM_GATHER(double);
    } else {
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                dst[i * drs + j * dcs] = element_real(t, base, i * rs + j * cs);
    }
}

/* a [rows x cols] into dst, row-major. */
static void gather_rows(const td_tensor *t, int64_t rows, int64_t cols, double *dst)
{
    gather_block(t, 0, 0, rows, cols, false, dst, cols, 1);
}

typedef double mm_v4 __attribute__((vector_size(4 * sizeof(double))));

#define MM_LOAD(v, p) memcpy(&(v), (p), sizeof(v)) /* an unaligned vector load */

static inline void mm_store_double(double *dst, const mm_v4 *acc, int64_t w)
{
    double tmp[MM_NR];
    memcpy(tmp, acc, sizeof tmp);
    memcpy(dst, tmp, (size_t)w * sizeof(double));
}

static inline void mm_store_float(float *dst, const mm_v4 *acc, int64_t w)
{
    double tmp[MM_NR];
    memcpy(tmp, acc, sizeof tmp);
    for (int64_t j = 0; j < w; j++)
        dst[j] = (float)tmp[j];
}

#define MM_BCAST(x) ((mm_v4){(x), (x), (x), (x)})

typedef float mm_f4 __attribute__((vector_size(4 * sizeof(float))));

/* Row p of a panel (columns j0 .. j0 + MM_NR - 1) as two vectors of doubles: from rows of doubles
 * (a packed panel, or a float64 b whose rows are contiguous) or of floats (converted exactly). */
#define MM_ROW_DOUBLE(b0, b1, b, p, ldb) (MM_LOAD(b0, (b) + (p) * (ldb)), MM_LOAD(b1, (b) + (p) * (ldb) + 4))
#define MM_ROW_FLOAT(b0, b1, b, p, ldb)                                                                  \
    do {                                                                                                 \
        mm_f4 lo_, hi_;                                                                                  \
        memcpy(&lo_, (b) + (p) * (ldb), sizeof lo_);                                                     \
        memcpy(&hi_, (b) + (p) * (ldb) + 4, sizeof hi_);                                                 \
        b0 = __builtin_convertvector(lo_, mm_v4);                                                        \
        b1 = __builtin_convertvector(hi_, mm_v4);                                                        \
    } while (0)

/* c[:, j0 .. j0 + w) (row-major, n x m, CT: double or float) = a [n x k] @ one panel of b, whose
 * row p starts at b + p * ldb (BT: double or float). */
#define DEF_MM_PANEL(name, ATTR, BT, ROW, CT)                                                            \
    ATTR static void name(const double *a, const BT *b, int64_t ldb, int64_t n, int64_t k, int64_t m,   \
                          int64_t j0, int64_t w, CT *c)                                                  \
    {                                                                                                    \
        int64_t i = 0;                                                                                   \
        for (; i + MM_MR <= n; i += MM_MR) {                                                             \
            const double *a0 = a + i * k, *a1 = a0 + k, *a2 = a1 + k, *a3 = a2 + k;                      \
            mm_v4 acc[MM_MR][2] = {{{0}}};                                                               \
            for (int64_t p = 0; p < k; p++) {                                                            \
                mm_v4 b0, b1;                                                                            \
                ROW(b0, b1, b, p, ldb);                                                                  \
                mm_v4 x0 = MM_BCAST(a0[p]), x1 = MM_BCAST(a1[p]);                                        \
                mm_v4 x2 = MM_BCAST(a2[p]), x3 = MM_BCAST(a3[p]);                                        \
                acc[0][0] += x0 * b0, acc[0][1] += x0 * b1;                                              \
                acc[1][0] += x1 * b0, acc[1][1] += x1 * b1;                                              \
                acc[2][0] += x2 * b0, acc[2][1] += x2 * b1;                                              \
                acc[3][0] += x3 * b0, acc[3][1] += x3 * b1;                                              \
            }                                                                                            \
            for (int r = 0; r < MM_MR; r++)                                                              \
                mm_store_##CT(c + (i + r) * m + j0, acc[r], w);                                          \
        }                                                                                                \
        for (; i < n; i++) {                                                                             \
            const double *a0 = a + i * k;                                                                \
            mm_v4 acc[2] = {{0}};                                                                        \
            for (int64_t p = 0; p < k; p++) {                                                            \
                mm_v4 x0 = MM_BCAST(a0[p]), b0, b1;                                                      \
                ROW(b0, b1, b, p, ldb);                                                                  \
                acc[0] += x0 * b0, acc[1] += x0 * b1;                                                    \
            }                                                                                            \
            mm_store_##CT(c + i * m + j0, acc, w);                                                       \
        }                                                                                                \
    }

/* mm_panel_<b's type>_<c's type>_<ISA>. A float b read in place has a float result (both operands
 * and the result share a dtype); a packed panel is doubles whatever the result. */
#define DEF_MM_PANELS(isa, ATTR)                                                                         \
    DEF_MM_PANEL(mm_panel_double_double_##isa, ATTR, double, MM_ROW_DOUBLE, double)                     \
    DEF_MM_PANEL(mm_panel_double_float_##isa, ATTR, double, MM_ROW_DOUBLE, float)                       \
    DEF_MM_PANEL(mm_panel_float_float_##isa, ATTR, float, MM_ROW_FLOAT, float)
DEF_MM_PANELS(base, )
#if defined(__x86_64__) && defined(__GNUC__)
DEF_MM_PANELS(avx2, __attribute__((target("avx2"))))

static bool mm_have_avx2(void)
{
    static _Atomic int cached = -1;
    int v = cached;
    if (v < 0)
        cached = v = __builtin_cpu_supports("avx2") ? 1 : 0;
    return v;
}
#define MM_PANEL(kind, ...) (mm_have_avx2() ? mm_panel_##kind##_avx2(__VA_ARGS__) : mm_panel_##kind##_base(__VA_ARGS__))
#else
#define MM_PANEL(kind, ...) mm_panel_##kind##_base(__VA_ARGS__)
#endif

/* One panel of b through the kernel of its (BT) and the result's (CT) types. */
#define MM_RUN_PANEL(BT, CT, panel, ld)                                                                  \
    MM_PANEL(BT##_##CT, a, (const BT *)(panel), ld, rows, k, m, j0, w, (CT *)out)

/* The result [rows x m] (out: float if out_float, else double) of a (gathered, rows x k) and b,
 * one panel of b at a time through bp (scratch of k x MM_NR doubles). */
static void matmul_panels(const double *a, const td_tensor *b, double *bp, int64_t rows, int64_t k, int64_t m,
                          void *out, bool out_float)
{
    /* Read by a single tile of a's rows, a full panel of a b with contiguous rows is read in place.
     * Read by several, it is packed (and a float32 one converted) once: in place, each of its k rows
     * is a different cache line and often a different page, and converted again for every tile. */
    bool in_place = rows <= MM_MR && (b->dtype == TD_FLOAT32 || b->dtype == TD_FLOAT64) && b->ndim == 2 &&
                    b->strides[1] == 1;
    for (int64_t j0 = 0; j0 < m; j0 += MM_NR) {
        int64_t w = m - j0 < MM_NR ? m - j0 : MM_NR;
        if (in_place && w == MM_NR) {
            const char *panel = (const char *)tensor_data_of(b) + (size_t)j0 * dtype_size_of(b->dtype);
            if (b->dtype == TD_FLOAT32)
                MM_RUN_PANEL(float, float, panel, b->strides[0]);
            else
                MM_RUN_PANEL(double, double, panel, b->strides[0]);
            continue;
        }
        if (w < MM_NR) /* the last, partial panel: zero-padded */
            memset(bp, 0, (size_t)(k * MM_NR) * sizeof(double));
        gather_block(b, 0, j0, k, w, true, bp, MM_NR, 1);
        if (out_float)
            MM_RUN_PANEL(double, float, bp, MM_NR);
        else
            MM_RUN_PANEL(double, double, bp, MM_NR);
    }
}

static td_status matmul_real(const td_tensor *a, const td_tensor *b, int64_t n, int64_t k, int64_t m, td_tensor *res)
{
    bool direct = res->dtype == TD_FLOAT64 || res->dtype == TD_FLOAT32; /* res is contiguous */
    size_t na = (size_t)(n * k), nb, nc = direct ? 0 : (size_t)(n * m), total;
    if (__builtin_mul_overflow((size_t)k, (size_t)MM_NR, &nb) || __builtin_add_overflow(na, nb, &total) ||
        __builtin_add_overflow(total, nc + 1, &total) || total > SIZE_MAX / sizeof(double))
        return error_fmt(TD_ERR_INVALID, "matmul: the operands have too many elements");
    double *buf;
    TD_TRY(alloc_try(total * sizeof(double), "matmul operands", (void **)&buf));
    double *bp = buf + na;
    char *out = direct ? tensor_data_of(res) : (char *)(bp + nb);
    gather_rows(a, n, k, buf);
    matmul_panels(buf, b, bp, n, k, m, out, res->dtype == TD_FLOAT32);
    if (!direct) {
        const double *c = (const double *)out;
        char *dst = tensor_data_of(res);
        size_t es = dtype_size_of(res->dtype);
        for (size_t j = 0; j < nc; j++)
            wide_store(dst + j * es, res->dtype, (wide){.d = c[j]}, WIDE_REAL);
    }
    free(buf);
    return TD_OK;
}

/* res[n x m] = a[n x k] @ b[k x m], row-major wide arrays, into the contiguous tensor res. */
static td_status matmul_2d(const td_tensor *a, const td_tensor *b, int64_t n, int64_t k, int64_t m, td_tensor *res)
{
    if (class_of(res->dtype) == WIDE_REAL && a->ndim <= 2 && b->ndim <= 2)
        return matmul_real(a, b, n, k, m, res);
    wide *wa = NULL, *wb = NULL, *acc = NULL;
    td_status st = gather_wide(a, &wa);
    if (st == TD_OK)
        st = gather_wide(b, &wb);
    if (st == TD_OK)
        st = alloc_try((size_t)(m > 0 ? m : 1) * sizeof(wide), "matmul row", (void **)&acc);
    if (st != TD_OK) {
        free(wa);
        free(wb);
        return st;
    }
    td_dtype dt = res->dtype;
    wide_class cls = class_of(dt);
    size_t es = dtype_size_of(dt);
    char *dst = tensor_data_of(res);
    /* One output row at a time, i-p-j order so that the inner loop runs along rows of b. */
    for (int64_t i = 0; i < n; i++) {
        memset(acc, 0, (size_t)m * sizeof(wide));
        for (int64_t p = 0; p < k; p++) {
            wide x = wa[i * k + p];
            const wide *row = wb + p * m;
            if (cls == WIDE_INT) {
                for (int64_t j = 0; j < m; j++)
                    acc[j].i = (int64_t)((uint64_t)acc[j].i + (uint64_t)x.i * (uint64_t)row[j].i);
            } else if (cls == WIDE_REAL) {
                for (int64_t j = 0; j < m; j++)
                    acc[j].d += x.d * row[j].d;
            } else {
                for (int64_t j = 0; j < m; j++)
                    acc[j].c = from_c(to_c(acc[j].c) + to_c(x.c) * to_c(row[j].c));
            }
        }
        for (int64_t j = 0; j < m; j++)
            wide_store(dst + (size_t)(i * m + j) * es, dt, acc[j], cls);
    }
    free(wa);
    free(wb);
    free(acc);
    return TD_OK;
}

static td_status check_same_dtype(const td_tensor *a, const td_tensor *b, const char *fn)
{
    if (a->dtype != b->dtype) {
        if (strcmp(fn, "dot") == 0)
            return error_fmt(TD_ERR_INVALID, "dot : expected both vectors to have same dtype, but found %s and %s",
                             td_dtype_name(a->dtype), td_dtype_name(b->dtype));
        return error_fmt(TD_ERR_INVALID, "expected m1 and m2 to have the same dtype, but got: %s != %s",
                         td_dtype_name(a->dtype), td_dtype_name(b->dtype));
    }
    return TD_OK;
}


/* Runs a [n x k] @ b [k x m] into a new tensor of shape (ndim, sizes). */
static td_status matmul_into(const td_tensor *a, const td_tensor *b, int64_t n, int64_t k, int64_t m, td_shape shape,
                             td_tensor **out)
{
    td_tensor *res;
    TD_TRY(td_tensor_empty(a->dtype, shape, &res));
    td_status st = matmul_2d(a, b, n, k, m, res);
    if (st != TD_OK) {
        td_tensor_release(res);
        return st;
    }
    *out = res;
    return TD_OK;
}

td_status td_tensor_mm(const td_tensor *a, const td_tensor *b, td_tensor **out)
{
    TD_TRY(check_args("mm", a, true, b, out));
    if (a->ndim != 2)
        return error_fmt(TD_ERR_INVALID, "self must be a matrix");
    if (b->ndim != 2)
        return error_fmt(TD_ERR_INVALID, "mat2 must be a matrix");
    if (a->sizes[1] != b->sizes[0])
        return error_fmt(TD_ERR_INVALID, "mat1 and mat2 shapes cannot be multiplied (%lldx%lld and %lldx%lld)",
                         (long long)a->sizes[0], (long long)a->sizes[1], (long long)b->sizes[0],
                         (long long)b->sizes[1]);
    TD_TRY(check_same_dtype(a, b, "mm"));
    return matmul_into(a, b, a->sizes[0], a->sizes[1], b->sizes[1], TD_SHAPE(a->sizes[0], b->sizes[1]), out);
}

td_status td_tensor_mv(const td_tensor *a, const td_tensor *b, td_tensor **out)
{
    TD_TRY(check_args("mv", a, true, b, out));
    if (a->ndim != 2 || b->ndim != 1)
        return error_fmt(TD_ERR_INVALID, "vector + matrix @ vector expected, got 1, %d, %d", a->ndim, b->ndim);
    if (a->sizes[1] != b->sizes[0])
        return error_fmt(TD_ERR_INVALID, "size mismatch, got input (%lld), mat (%lldx%lld), vec (%lld)",
                         (long long)a->sizes[0], (long long)a->sizes[0], (long long)a->sizes[1],
                         (long long)b->sizes[0]);
    TD_TRY(check_same_dtype(a, b, "mv"));
    /* The vector is a k x 1 matrix: its row-major gather is the same array. */
    return matmul_into(a, b, a->sizes[0], a->sizes[1], 1, TD_SHAPE(a->sizes[0]), out);
}

td_status td_tensor_dot(const td_tensor *a, const td_tensor *b, td_tensor **out)
{
    TD_TRY(check_args("dot", a, true, b, out));
    if (a->ndim != 1 || b->ndim != 1)
        return error_fmt(TD_ERR_INVALID, "1D tensors expected, but got %dD and %dD tensors", a->ndim, b->ndim);
    if (a->sizes[0] != b->sizes[0])
        return error_fmt(TD_ERR_INVALID,
                         "inconsistent tensor size, expected tensor [%lld] and src [%lld] to have the same number of "
                         "elements, but got %lld and %lld elements respectively",
                         (long long)a->sizes[0], (long long)b->sizes[0], (long long)a->sizes[0],
                         (long long)b->sizes[0]);
    TD_TRY(check_same_dtype(a, b, "dot"));
    return matmul_into(a, b, 1, a->sizes[0], 1, TD_SHAPE_SCALAR, out);
}

td_status td_tensor_matmul(const td_tensor *a, const td_tensor *b, td_tensor **out)
{
    TD_TRY(check_args("matmul", a, true, b, out));
    if (a->ndim == 0 || b->ndim == 0)
        return error_fmt(TD_ERR_INVALID, "both arguments to matmul need to be at least 1D, but they are %dD and %dD",
                         a->ndim, b->ndim);
    if (a->ndim > 2 || b->ndim > 2)
        return error_fmt(TD_ERR_UNSUPPORTED,
                         "matmul: batched operands (more than 2 dims) are not supported yet, got %dD and %dD", a->ndim,
                         b->ndim);
    if (a->ndim == 1 && b->ndim == 1)
        return td_tensor_dot(a, b, out);
    if (a->ndim == 2 && b->ndim == 1)
        return td_tensor_mv(a, b, out);
    if (a->ndim == 2)
        return td_tensor_mm(a, b, out);
    /* 1-D @ 2-D: torch runs a.unsqueeze(0).mm(b).squeeze(0), and its error names the 1 x k matrix. */
    if (a->sizes[0] != b->sizes[0])
        return error_fmt(TD_ERR_INVALID, "mat1 and mat2 shapes cannot be multiplied (1x%lld and %lldx%lld)",
                         (long long)a->sizes[0], (long long)b->sizes[0], (long long)b->sizes[1]);
    TD_TRY(check_same_dtype(a, b, "matmul"));
    return matmul_into(a, b, 1, a->sizes[0], b->sizes[1], TD_SHAPE(b->sizes[1]), out);
}
