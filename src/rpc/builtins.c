/* The builtin tensor functions every worker serves under their ATen names ("aten::add", ...), as
 * PyTorch's RPC runs builtin operators by their qualified name instead of pickling a Python
 * function. rpc_builtins_register puts them in the process's registry once (registry.h); each is
 * an ordinary td_rpc_fn over the tensor ops of tdist/tensor.h (src/tensor/ops.c).
 *
 * Arguments follow torch's Python signatures: torch.add(input, other) with other a tensor or a
 * number, torch.ones(*size, dtype=None). A call with the wrong number of arguments fails as torch's
 * RPC does when no operator schema matches (a RuntimeError naming the binding problem); an
 * argument of the wrong kind fails with torch's TypeError wording; a failing op (mismatched shapes)
 * passes the tensor layer's message through, a RuntimeError on the caller. docs/rpc.md lists the
 * builtins. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <tdist/rpc.h>
#include <tdist/rref.h>
#include <tdist/tensor.h>
#include <tdist/value.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "rpc/profiler.h"
#include "rpc/registry.h"

/* td_rpc_bind, with a binding failure reworded as torch's failed schema match. */
static td_status bind(const char *fn, const char *params, const td_value *args, const td_value *kwargs,
                      const td_value **out)
{
    td_status st = td_rpc_bind(fn, params, args, kwargs, out);
    if (st == TD_ERR_REMOTE)
        return td_rpc_raise("RuntimeError", "Overloaded torch operator invoked from Python failed to match any schema:\n%s",
                            td_last_error());
    return st;
}

static td_status expect_tensor(const char *fn, const char *param, int position, const td_value *v, td_tensor **out)
{
    if (td_value_kind_of(v) != TD_VAL_TENSOR)
        return td_rpc_raise("TypeError", "%s(): argument '%s' (position %d) must be Tensor, not %s", fn, param, position,
                            td_rpc_type_name(v));
    *out = td_value_get_tensor(v);
    return TD_OK;
}

/* The op's status, and on success its tensor *t as the function's value (taking the reference).
 * t is read here, after the op that sets it has run. */
static td_status give(td_status st, td_tensor **t, td_value **result)
{
    if (st != TD_OK)
        return st;
    *result = td_value_tensor(*t);
    td_tensor_release(*t);
    return TD_OK;
}

/* In a builtin's body: returns the status of expr (which runs the builtin), recorded as an event
 * named name when this thread profiles (rpc/profiler.h), at the cost of one load when not. */
#define RECORDED(name, expr)                                                                           \
    do {                                                                                               \
        td_profiler *prof_ = rpc_prof_current();                                                       \
        if (!prof_)                                                                                    \
            return (expr);                                                                             \
        int64_t start_ = clock_now_ns();                                                               \
        td_status st_ = (expr);                                                                        \
        rpc_prof_record_op(prof_, (name), start_, args, st_ == TD_OK ? *result : NULL);                \
        return st_;                                                                                    \
    } while (0)

/* ---- (tensor, tensor or number) -------------------------------------------------------------- */

typedef struct binary_builtin {
    const char *name; /* torch's, for messages */
    td_status (*tensor_fn)(const td_tensor *, const td_tensor *, td_tensor **);
    td_status (*scalar_fn)(const td_tensor *, td_scalar, td_tensor **); /* NULL: tensors only */
} binary_builtin;

static td_status run_binary(const binary_builtin *b, const td_value *args, const td_value *kwargs, td_value **result)
{
    const td_value *in[2];
    TD_TRY(bind(b->name, "input,other", args, kwargs, in));
    td_tensor *input = NULL, *out = NULL;
    TD_TRY(expect_tensor(b->name, "input", 1, in[0], &input));
    if (td_value_kind_of(in[1]) == TD_VAL_TENSOR)
        return give(b->tensor_fn(input, td_value_get_tensor(in[1]), &out), &out, result);
    td_scalar s;
    double re, im;
    switch (b->scalar_fn ? td_value_kind_of(in[1]) : TD_VAL_NONE) {
    case TD_VAL_BOOL: s = td_scalar_bool(td_value_get_bool(in[1])); break;
    case TD_VAL_INT: s = td_scalar_int(td_value_get_int(in[1])); break;
    case TD_VAL_DOUBLE: s = td_scalar_float(td_value_get_double(in[1])); break;
    case TD_VAL_COMPLEX:
        td_value_get_complex(in[1], &re, &im);
        s = td_scalar_complex(re, im);
        break;
    default:
        return td_rpc_raise("TypeError", "%s(): argument 'other' (position 2) must be Tensor, not %s", b->name,
                            td_rpc_type_name(in[1]));
    }
    return give(b->scalar_fn(input, s, &out), &out, result);
}

/* One td_rpc_fn per builtin, so that a function needs nothing from its td_rpc_call. */
#define DEF_BINARY(op, scalar_fn)                                                                      \
    static td_status aten_##op(td_rpc_call *call, const td_value *args, const td_value *kwargs,        \
                               td_value **result)                                                      \
    {                                                                                                  \
        static const binary_builtin b = {#op, td_tensor_##op, scalar_fn};                             \
        RECORDED("aten::" #op, run_binary(&b, args, kwargs, result));                                  \
    }
DEF_BINARY(add, td_tensor_add_scalar)
DEF_BINARY(sub, td_tensor_sub_scalar)
DEF_BINARY(mul, td_tensor_mul_scalar)
DEF_BINARY(div, td_tensor_div_scalar)
DEF_BINARY(eq, td_tensor_eq_scalar)
DEF_BINARY(matmul, NULL)

/* ---- (tensor) -------------------------------------------------------------------------------- */

static td_status run_unary(const char *name, td_status (*fn)(const td_tensor *, td_tensor **), const td_value *args,
                           const td_value *kwargs, td_value **result)
{
    const td_value *in[1];
    TD_TRY(bind(name, "input", args, kwargs, in));
    td_tensor *input = NULL, *out = NULL;
    TD_TRY(expect_tensor(name, "input", 1, in[0], &input));
    return give(fn(input, &out), &out, result);
}

#define DEF_UNARY(op)                                                                                  \
    static td_status aten_##op(td_rpc_call *call, const td_value *args, const td_value *kwargs,        \
                               td_value **result)                                                      \
    {                                                                                                  \
        RECORDED("aten::" #op, run_unary(#op, td_tensor_##op, args, kwargs, result));                  \
    }
DEF_UNARY(neg)
DEF_UNARY(sum)
DEF_UNARY(nonzero)

/* ---- factories: (*size, dtype=None) ---------------------------------------------------------- */

typedef struct factory_builtin {
    const char *name;
    td_status (*fn)(td_dtype, td_shape, td_tensor **);
} factory_builtin;

/* Appends the ints of seq (a list or tuple) to shape; position is the argument's, 0 for the kwarg. */
static td_status parse_size_list(const char *fn, const td_value *seq, int position, td_shape *shape)
{
    char where[32] = "";
    if (position > 0)
        snprintf(where, sizeof where, " (position %d)", position);
    size_t n = td_value_len(seq);
    for (size_t i = 0; i < n; i++) {
        const td_value *e = td_value_at(seq, i);
        if (td_value_kind_of(e) != TD_VAL_INT)
            return td_rpc_raise("TypeError",
                                "%s(): argument 'size'%s must be tuple of ints, but found element of type %s at pos %zu",
                                fn, where, td_rpc_type_name(e), i);
        if (shape->ndim >= TD_MAX_DIMS)
            return td_rpc_raise("RuntimeError", "%s(): a tensor has at most %d dims, got a size with %zu", fn,
                                TD_MAX_DIMS, n);
        shape->d[shape->ndim++] = td_value_get_int(e);
    }
    return TD_OK;
}

static td_status run_factory(const factory_builtin *f, const td_value *args, const td_value *kwargs, td_value **result)
{
    td_shape shape = {.ndim = 0};
    td_dtype dtype = TD_FLOAT32;
    const td_value *size_kw = NULL;
    size_t nkw = td_value_len(kwargs);
    for (size_t k = 0; k < nkw; k++) {
        const td_value *key = td_value_dict_key_at(kwargs, k), *val = td_value_dict_value_at(kwargs, k);
        const char *kname = td_value_kind_of(key) == TD_VAL_STRING ? td_value_get_string(key, NULL) : "";
        if (strcmp(kname, "size") == 0) {
            size_kw = val;
        } else if (strcmp(kname, "dtype") == 0) {
            if (td_value_kind_of(val) == TD_VAL_NONE)
                continue;
            if (td_value_kind_of(val) != TD_VAL_STRING)
                return td_rpc_raise("TypeError", "%s(): argument 'dtype' must be torch.dtype, not %s", f->name,
                                    td_rpc_type_name(val));
            if (td_dtype_from_name(td_value_get_string(val, NULL), &dtype) != TD_OK)
                return td_rpc_raise("TypeError", "%s(): argument 'dtype': %s", f->name, td_last_error());
        } else {
            return td_rpc_raise("TypeError", "%s() got an unexpected keyword argument '%s'", f->name, kname);
        }
    }
    size_t nargs = td_value_len(args);
    if (size_kw && nargs)
        return td_rpc_raise("TypeError", "%s() got multiple values for argument 'size'", f->name);
    if (size_kw) {
        td_value_kind k = td_value_kind_of(size_kw);
        if (k != TD_VAL_LIST && k != TD_VAL_TUPLE)
            return td_rpc_raise("TypeError", "%s(): argument 'size' must be tuple of ints, not %s", f->name,
                                td_rpc_type_name(size_kw));
        TD_TRY(parse_size_list(f->name, size_kw, 0, &shape));
    } else if (nargs == 1 && (td_value_kind_of(td_value_at(args, 0)) == TD_VAL_LIST ||
                              td_value_kind_of(td_value_at(args, 0)) == TD_VAL_TUPLE)) {
        TD_TRY(parse_size_list(f->name, td_value_at(args, 0), 1, &shape));
    } else if (nargs == 0) {
        return td_rpc_raise("RuntimeError",
                            "Overloaded torch operator invoked from Python failed to match any schema:\n%s() missing "
                            "1 required positional argument: 'size'",
                            f->name);
    } else {
        TD_TRY(parse_size_list(f->name, args, 1, &shape));
    }
    td_tensor *out = NULL;
    return give(f->fn(dtype, shape, &out), &out, result);
}

#define DEF_FACTORY(op)                                                                                \
    static td_status aten_##op(td_rpc_call *call, const td_value *args, const td_value *kwargs,        \
                               td_value **result)                                                      \
    {                                                                                                  \
        static const factory_builtin f = {#op, td_tensor_##op};                                       \
        RECORDED("aten::" #op, run_factory(&f, args, kwargs, result));                                 \
    }
DEF_FACTORY(ones)
DEF_FACTORY(zeros)

/* ---- registration ---------------------------------------------------------------------------- */

static const struct {
    const char *name;
    td_rpc_fn fn;
} builtins[] = {
    {"aten::add", aten_add},         {"aten::sub", aten_sub},   {"aten::mul", aten_mul},
    {"aten::div", aten_div},         {"aten::eq", aten_eq},     {"aten::matmul", aten_matmul},
    {"aten::neg", aten_neg},         {"aten::sum", aten_sum},   {"aten::nonzero", aten_nonzero},
    {"aten::ones", aten_ones},       {"aten::zeros", aten_zeros},
};

/* ---- Tensor methods (RRef proxies: rref.rpc_sync().size(), tdist/rref.h) ---------------------- */

/* size(self): the sizes as a tuple of ints, torch.Size's contents. */
static td_status tensor_size(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *in[1];
    td_tensor *t = NULL;
    TD_TRY(bind("size", "self", args, kwargs, in));
    TD_TRY(expect_tensor("size", "self", 1, in[0], &t));
    int nd = td_tensor_ndim(t);
    td_value *sizes = td_value_tuple_new((size_t)nd);
    for (int i = 0; i < nd; i++)
        td_value_set(sizes, (size_t)i, td_value_int(td_tensor_sizes(t)[i]));
    *result = sizes;
    return TD_OK;
}

/* view(self, *shape) or view(self, shape): a view with that shape (-1 infers one size). */
static td_status tensor_view(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    size_t n = td_value_len(args);
    td_tensor *t = NULL, *out = NULL;
    if (n < 1 || td_value_len(kwargs) != 0)
        return td_rpc_raise("TypeError", "view() takes the tensor and its new sizes, positionally");
    TD_TRY(expect_tensor("view", "self", 1, td_value_at(args, 0), &t));
    td_shape shape = {.ndim = 0};
    const td_value *first = n > 1 ? td_value_at(args, 1) : NULL;
    if (n == 2 && (td_value_kind_of(first) == TD_VAL_LIST || td_value_kind_of(first) == TD_VAL_TUPLE)) {
        TD_TRY(parse_size_list("view", first, 1, &shape));
    } else {
        td_value *rest = td_value_tuple_new(n - 1);
        for (size_t i = 1; i < n; i++)
            td_value_set(rest, i - 1, td_value_retain(td_value_at(args, i)));
        td_status st = parse_size_list("view", rest, 1, &shape);
        td_value_release(rest);
        TD_TRY(st);
    }
    return give(td_tensor_view(t, shape, &out), &out, result);
}

static const struct {
    const char *method;
    td_rpc_fn fn;
} tensor_methods[] = {{"size", tensor_size}, {"add", aten_add}, {"view", tensor_view}};

static void register_all(void)
{
    for (size_t i = 0; i < sizeof tensor_methods / sizeof tensor_methods[0]; i++)
        if (td_rpc_register_method("Tensor", tensor_methods[i].method, tensor_methods[i].fn, NULL) != TD_OK)
            TD_LOG_WARN("RPC method Tensor.%s not registered: %s", tensor_methods[i].method, td_last_error());
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++) {
        /* A name the application registered first stays its own, as an override. */
        if (td_rpc_register(builtins[i].name, builtins[i].fn, NULL) != TD_OK)
            TD_LOG_WARN("RPC builtin %s not registered: %s", builtins[i].name, td_last_error());
    }
}

void rpc_builtins_register(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_all);
}
