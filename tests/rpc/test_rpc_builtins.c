/* The builtin functions (src/rpc/builtins.c), called in one process through the registry as an
 * agent would call them: registered once under their aten names; add/sub/mul/div/eq with a tensor
 * or a number (torch's promotion), matmul, neg, sum, nonzero, ones/zeros with every size form and
 * dtype; arguments by keyword; and the failures: a binding failure as torch's schema-match
 * RuntimeError, wrong argument kinds as TypeError, a failing op with the tensor layer's message. */
#include <stdlib.h>
#include <string.h>

#include <tdist/rpc.h>
#include <tdist/testing.h>

#include "base/error.h"
#include "rpc/registry.h"

/* ---- helpers --------------------------------------------------------------------------------- */

/* Calls builtin name with args (a tuple) and kwargs (a dict or NULL), taking both references. */
static td_status call(const char *name, td_value *args, td_value *kwargs, td_value **result)
{
    rpc_builtins_register();
    rpc_function f;
    TD_CHECK_MSG(rpc_registry_lookup(name, &f), "%s is not registered", name);
    TD_CHECK(f.fn != NULL);
    td_value *kw = kwargs ? kwargs : td_value_dict_new();
    error_clear();
    *result = NULL;
    td_status st = f.fn(NULL, args, kw, result);
    td_value_release(args);
    td_value_release(kw);
    if (st != TD_OK)
        TD_CHECK(*result == NULL);
    return st;
}

/* A tensor value of dtype dt and shape with values v (row-major). */
static td_value *tv(td_dtype dt, td_shape shape, const double *v)
{
    td_tensor *t;
    TD_CHECK_OK(td_tensor_zeros(dt, shape, &t));
    int64_t n = td_tensor_numel(t);
    td_tensor *flat;
    TD_CHECK_OK(td_tensor_reshape(t, TD_SHAPE(-1), &flat));
    for (int64_t i = 0; i < n; i++)
        TD_CHECK_OK(td_tensor_set_f64(flat, &i, v[i]));
    td_tensor_release(flat);
    td_value *val = td_value_tensor(t);
    td_tensor_release(t);
    return val;
}

/* Checks that result holds a tensor of dtype dt, shape and values, and releases it. */
static void check_tensor(td_value *result, td_dtype dt, td_shape shape, const double *want)
{
    TD_CHECK(result != NULL);
    TD_CHECK_EQ(td_value_kind_of(result), TD_VAL_TENSOR);
    td_tensor *t = td_value_get_tensor(result), *flat;
    TD_CHECK_STR_EQ(td_dtype_name(td_tensor_dtype(t)), td_dtype_name(dt));
    TD_CHECK_EQ(td_tensor_ndim(t), shape.ndim);
    for (int i = 0; i < shape.ndim; i++)
        TD_CHECK_EQ(td_tensor_sizes(t)[i], shape.d[i]);
    TD_CHECK_OK(td_tensor_reshape(t, TD_SHAPE(-1), &flat));
    for (int64_t i = 0; i < td_tensor_numel(t); i++) {
        double got;
        TD_CHECK_OK(td_tensor_get_f64(flat, &i, &got));
        TD_CHECK_MSG(got == want[i], "element %lld: got %.17g, want %.17g", (long long)i, got, want[i]);
    }
    td_tensor_release(flat);
    td_value_release(result);
}

/* Checks a failure: status, the raised type (NULL: not raised) and a piece of the message. */
static void check_fails(td_status st, td_status want, const char *type, const char *substr)
{
    TD_CHECK_ERR(st, want, substr);
    const char *raised = error_type();
    if (type)
        TD_CHECK_STR_EQ(raised ? raised : "(none)", type);
    else
        TD_CHECK_MSG(raised == NULL, "unexpected raised type %s", raised);
}

static const char *const builtin_names[] = {"aten::add", "aten::sub",     "aten::mul",  "aten::div",
                                            "aten::eq",  "aten::matmul",  "aten::neg",  "aten::sum",
                                            "aten::nonzero", "aten::ones", "aten::zeros"};

/* ---- registration ------------------------------------------------------------------------------ */

static td_status my_fn(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    *result = NULL;
    return TD_OK;
}

TD_TEST(builtins_are_registered_once)
{
    rpc_builtins_register();
    rpc_builtins_register();
    for (size_t i = 0; i < sizeof builtin_names / sizeof builtin_names[0]; i++) {
        rpc_function f;
        TD_CHECK_MSG(rpc_registry_lookup(builtin_names[i], &f), "%s missing", builtin_names[i]);
        TD_CHECK(f.fn != NULL && f.async_fn == NULL);
    }
    TD_CHECK_ERR(td_rpc_register("aten::add", my_fn, NULL), TD_ERR_ALREADY, "already registered");
}

/* ---- binary ------------------------------------------------------------------------------------ */

TD_TEST(binary_builtins_on_tensors)
{
    static const struct {
        const char *name;
        td_dtype dt;
        double want[6];
    } cases[] = {
        {"aten::add", TD_FLOAT32, {11, 22, 33, 14, 25, 36}},
        {"aten::sub", TD_FLOAT32, {-9, -18, -27, -6, -15, -24}},
        {"aten::mul", TD_FLOAT32, {10, 40, 90, 40, 100, 180}},
        {"aten::div", TD_FLOAT32, {0.5, 0.25, 0.5, 0.25, 0.5, 0.25}},
        {"aten::eq", TD_BOOL, {0, 0, 0, 0, 0, 0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* [2, 3] op [3]: broadcasting. */
        td_value *a = tv(TD_FLOAT32, TD_SHAPE(2, 3), (double[]){1, 2, 3, 4, 5, 6});
        td_value *b = tv(TD_FLOAT32, TD_SHAPE(3), (double[]){10, 20, 30});
        double want[6];
        memcpy(want, cases[i].want, sizeof want);
        if (strcmp(cases[i].name, "aten::div") == 0)
            for (int k = 0; k < 6; k++)
                want[k] = (double)(float)((k + 1) / (10.0 * (k % 3 + 1)));
        td_value *r;
        TD_CHECK_OK(call(cases[i].name, td_value_tuple_of(2, a, b), NULL, &r));
        check_tensor(r, cases[i].dt, TD_SHAPE(2, 3), want);
    }
    /* Keyword arguments bind by torch's parameter names. */
    td_value *kw = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(kw, "other", tv(TD_INT64, TD_SHAPE(2), (double[]){5, 5})));
    td_value *r;
    TD_CHECK_OK(call("aten::eq", td_value_tuple_of(1, tv(TD_INT64, TD_SHAPE(2), (double[]){5, 6})), kw, &r));
    check_tensor(r, TD_BOOL, TD_SHAPE(2), (double[]){1, 0});
    kw = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(kw, "input", tv(TD_INT32, TD_SHAPE(1), (double[]){7})));
    TD_CHECK_OK(td_value_dict_set_str(kw, "other", tv(TD_INT32, TD_SHAPE(1), (double[]){2})));
    TD_CHECK_OK(call("aten::div", td_value_tuple_new(0), kw, &r));
    check_tensor(r, TD_FLOAT32, TD_SHAPE(1), (double[]){3.5});
}

TD_TEST(binary_builtins_with_numbers)
{
    td_value *r;
    /* torch.add(int64 tensor, 2) stays int64; with 0.5 it is float32. */
    TD_CHECK_OK(call("aten::add", td_value_tuple_of(2, tv(TD_INT64, TD_SHAPE(2), (double[]){1, 2}), td_value_int(2)),
                     NULL, &r));
    check_tensor(r, TD_INT64, TD_SHAPE(2), (double[]){3, 4});
    TD_CHECK_OK(call("aten::add",
                     td_value_tuple_of(2, tv(TD_INT64, TD_SHAPE(2), (double[]){1, 2}), td_value_double(0.5)), NULL,
                     &r));
    check_tensor(r, TD_FLOAT32, TD_SHAPE(2), (double[]){1.5, 2.5});
    TD_CHECK_OK(call("aten::mul",
                     td_value_tuple_of(2, tv(TD_FLOAT64, TD_SHAPE(2), (double[]){1, 2}), td_value_bool(false)), NULL,
                     &r));
    check_tensor(r, TD_FLOAT64, TD_SHAPE(2), (double[]){0, 0});
    TD_CHECK_OK(call("aten::div", td_value_tuple_of(2, tv(TD_INT16, TD_SHAPE(2), (double[]){3, -1}), td_value_int(2)),
                     NULL, &r));
    check_tensor(r, TD_FLOAT32, TD_SHAPE(2), (double[]){1.5, -0.5});
    TD_CHECK_OK(call("aten::sub", td_value_tuple_of(2, tv(TD_UINT8, TD_SHAPE(1), (double[]){1}), td_value_int(2)),
                     NULL, &r));
    check_tensor(r, TD_UINT8, TD_SHAPE(1), (double[]){255});
    TD_CHECK_OK(call("aten::eq", td_value_tuple_of(2, tv(TD_FLOAT32, TD_SHAPE(2), (double[]){2, 3}), td_value_int(2)),
                     NULL, &r));
    check_tensor(r, TD_BOOL, TD_SHAPE(2), (double[]){1, 0});
    /* A complex number makes a float64 tensor complex128. */
    TD_CHECK_OK(call("aten::sub",
                     td_value_tuple_of(2, tv(TD_FLOAT64, TD_SHAPE(1), (double[]){1}), td_value_complex(0.5, 2)), NULL,
                     &r));
    td_tensor *t = td_value_get_tensor(r);
    TD_CHECK_EQ(td_tensor_dtype(t), TD_COMPLEX128);
    double re, im;
    int64_t zero = 0;
    TD_CHECK_OK(td_tensor_get_complex(t, &zero, &re, &im));
    TD_CHECK(re == 0.5 && im == -2);
    td_value_release(r);
}

/* ---- the others -------------------------------------------------------------------------------- */

TD_TEST(matmul_neg_sum_nonzero_builtins)
{
    td_value *r;
    td_value *m = tv(TD_FLOAT64, TD_SHAPE(2, 3), (double[]){1, 2, 3, 4, 5, 6});
    td_value *n = tv(TD_FLOAT64, TD_SHAPE(3, 2), (double[]){1, 0, 0, 1, 1, 1});
    TD_CHECK_OK(call("aten::matmul", td_value_tuple_of(2, td_value_retain(m), n), NULL, &r));
    check_tensor(r, TD_FLOAT64, TD_SHAPE(2, 2), (double[]){4, 5, 10, 11});
    TD_CHECK_OK(call("aten::matmul",
                     td_value_tuple_of(2, td_value_retain(m), tv(TD_FLOAT64, TD_SHAPE(3), (double[]){1, 1, 1})), NULL,
                     &r));
    check_tensor(r, TD_FLOAT64, TD_SHAPE(2), (double[]){6, 15});
    TD_CHECK_OK(call("aten::neg", td_value_tuple_of(1, td_value_retain(m)), NULL, &r));
    check_tensor(r, TD_FLOAT64, TD_SHAPE(2, 3), (double[]){-1, -2, -3, -4, -5, -6});
    TD_CHECK_OK(call("aten::sum", td_value_tuple_of(1, td_value_retain(m)), NULL, &r));
    check_tensor(r, TD_FLOAT64, TD_SHAPE_SCALAR, (double[]){21});
    TD_CHECK_OK(call("aten::sum", td_value_tuple_of(1, tv(TD_INT32, TD_SHAPE(3), (double[]){1, 2, 3})), NULL, &r));
    check_tensor(r, TD_INT64, TD_SHAPE_SCALAR, (double[]){6});
    TD_CHECK_OK(call("aten::nonzero", td_value_tuple_of(1, tv(TD_INT32, TD_SHAPE(2, 2), (double[]){0, 3, 4, 0})),
                     NULL, &r));
    check_tensor(r, TD_INT64, TD_SHAPE(2, 2), (double[]){0, 1, 1, 0});
    td_value_release(m);
}

TD_TEST(ones_and_zeros_take_every_size_form)
{
    td_value *r;
    TD_CHECK_OK(call("aten::ones", td_value_tuple_of(2, td_value_int(2), td_value_int(3)), NULL, &r));
    check_tensor(r, TD_FLOAT32, TD_SHAPE(2, 3), (double[]){1, 1, 1, 1, 1, 1});
    td_value *size = td_value_tuple_of(2, td_value_int(3), td_value_int(1));
    TD_CHECK_OK(call("aten::zeros", td_value_tuple_of(1, size), NULL, &r));
    check_tensor(r, TD_FLOAT32, TD_SHAPE(3, 1), (double[]){0, 0, 0});
    td_value *list = td_value_list_new();
    TD_CHECK_OK(td_value_list_append(list, td_value_int(2)));
    td_value *kw = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(kw, "dtype", td_value_string("float64")));
    TD_CHECK_OK(call("aten::ones", td_value_tuple_of(1, list), kw, &r));
    check_tensor(r, TD_FLOAT64, TD_SHAPE(2), (double[]){1, 1});
    /* size= as a keyword, a 0x0 tensor; an empty tuple is a 0-dim tensor. */
    kw = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(kw, "size", td_value_tuple_of(2, td_value_int(0), td_value_int(0))));
    TD_CHECK_OK(td_value_dict_set_str(kw, "dtype", td_value_none()));
    TD_CHECK_OK(call("aten::zeros", td_value_tuple_new(0), kw, &r));
    check_tensor(r, TD_FLOAT32, TD_SHAPE(0, 0), NULL);
    TD_CHECK_OK(call("aten::ones", td_value_tuple_of(1, td_value_tuple_new(0)), NULL, &r));
    check_tensor(r, TD_FLOAT32, TD_SHAPE_SCALAR, (double[]){1});
    kw = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(kw, "dtype", td_value_string("int64")));
    TD_CHECK_OK(call("aten::ones", td_value_tuple_of(1, td_value_int(1)), kw, &r));
    check_tensor(r, TD_INT64, TD_SHAPE(1), (double[]){1});
}

/* ---- failures ---------------------------------------------------------------------------------- */

TD_TEST(bad_arguments_fail_as_torch)
{
    td_value *r;
    td_value *t3 = tv(TD_FLOAT32, TD_SHAPE(3), (double[]){1, 2, 3});
    td_value *t4 = tv(TD_FLOAT32, TD_SHAPE(4), (double[]){1, 2, 3, 4});

    /* Binding: torch's failed schema match, with Python's explanation. */
    check_fails(call("aten::add", td_value_tuple_new(0), NULL, &r), TD_ERR_REMOTE, "RuntimeError",
                "Overloaded torch operator invoked from Python failed to match any schema");
    TD_CHECK_CONTAINS(td_last_error(), "add() missing 2 required positional arguments: 'input' and 'other'");
    check_fails(call("aten::mul", td_value_tuple_of(3, td_value_retain(t3), td_value_retain(t3), td_value_int(1)), NULL,
                     &r),
                TD_ERR_REMOTE, "RuntimeError", "mul() takes 2 positional arguments but 3 were given");
    td_value *kw = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(kw, "alpha", td_value_int(2)));
    check_fails(call("aten::add", td_value_tuple_of(2, td_value_retain(t3), td_value_retain(t3)), kw, &r),
                TD_ERR_REMOTE, "RuntimeError", "add() got an unexpected keyword argument 'alpha'");
    check_fails(call("aten::neg", td_value_tuple_new(0), NULL, &r), TD_ERR_REMOTE, "RuntimeError",
                "neg() missing 1 required positional argument: 'input'");

    /* Kinds: TypeError in torch's words. */
    check_fails(call("aten::add", td_value_tuple_of(2, td_value_int(1), td_value_retain(t3)), NULL, &r), TD_ERR_REMOTE,
                "TypeError", "add(): argument 'input' (position 1) must be Tensor, not int");
    check_fails(call("aten::sub", td_value_tuple_of(2, td_value_retain(t3), td_value_string("x")), NULL, &r),
                TD_ERR_REMOTE, "TypeError", "sub(): argument 'other' (position 2) must be Tensor, not str");
    check_fails(call("aten::matmul", td_value_tuple_of(2, td_value_retain(t3), td_value_int(2)), NULL, &r),
                TD_ERR_REMOTE, "TypeError", "matmul(): argument 'other' (position 2) must be Tensor, not int");
    check_fails(call("aten::sum", td_value_tuple_of(1, td_value_list_new()), NULL, &r), TD_ERR_REMOTE, "TypeError",
                "sum(): argument 'input' (position 1) must be Tensor, not list");
    check_fails(call("aten::ones", td_value_tuple_of(1, td_value_double(2.5)), NULL, &r), TD_ERR_REMOTE, "TypeError",
                "ones(): argument 'size' (position 1) must be tuple of ints, but found element of type float at pos 0");
    check_fails(call("aten::zeros", td_value_tuple_new(0), NULL, &r), TD_ERR_REMOTE, "RuntimeError",
                "zeros() missing 1 required positional argument: 'size'");
    kw = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(kw, "device", td_value_string("cpu")));
    check_fails(call("aten::ones", td_value_tuple_of(1, td_value_int(1)), kw, &r), TD_ERR_REMOTE, "TypeError",
                "ones() got an unexpected keyword argument 'device'");
    kw = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(kw, "dtype", td_value_string("float128")));
    check_fails(call("aten::ones", td_value_tuple_of(1, td_value_int(1)), kw, &r), TD_ERR_REMOTE, "TypeError",
                "unknown dtype 'float128'");
    kw = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(kw, "dtype", td_value_int(6)));
    check_fails(call("aten::ones", td_value_tuple_of(1, td_value_int(1)), kw, &r), TD_ERR_REMOTE, "TypeError",
                "ones(): argument 'dtype' must be torch.dtype, not int");
    kw = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(kw, "size", td_value_tuple_of(1, td_value_int(1))));
    check_fails(call("aten::ones", td_value_tuple_of(1, td_value_int(1)), kw, &r), TD_ERR_REMOTE, "TypeError",
                "ones() got multiple values for argument 'size'");

    /* A failing op: the tensor layer's message, not raised (a RuntimeError on the caller). */
    check_fails(call("aten::add", td_value_tuple_of(2, td_value_retain(t3), td_value_retain(t4)), NULL, &r),
                TD_ERR_INVALID, NULL,
                "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 0");
    check_fails(call("aten::matmul",
                     td_value_tuple_of(2, tv(TD_FLOAT32, TD_SHAPE(2, 3), (double[]){0, 0, 0, 0, 0, 0}),
                                       tv(TD_FLOAT32, TD_SHAPE(4, 5), (double[20]){0})),
                     NULL, &r),
                TD_ERR_INVALID, NULL, "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)");
    check_fails(call("aten::ones", td_value_tuple_of(1, td_value_int(-1)), NULL, &r), TD_ERR_INVALID, NULL,
                "Trying to create tensor with negative dimension -1");
    check_fails(call("aten::neg", td_value_tuple_of(1, tv(TD_BOOL, TD_SHAPE(1), (double[]){1})), NULL, &r),
                TD_ERR_INVALID, NULL, "Negation, the `-` operator, on a bool tensor is not supported");
    td_value_release(t3);
    td_value_release(t4);
}

TD_TEST_MAIN()
