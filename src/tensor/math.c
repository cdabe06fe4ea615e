/* Floating-point math for the differentiable ops of tdist/autograd.h, usable alone: exp, log,
 * tanh, sigmoid, relu, pow, sum and mean by dim, sum_to_size, softmax and log_softmax, addmm,
 * nll_loss and embedding_bag (tensor.h declares them). ops.c holds the general arithmetic (every
 * dtype, promotion, broadcasting through its strided iterator); these ops are floating-only and
 * take the simpler road of math.h: the input made contiguous in its compute dtype (float32 for the
 * 16-bit formats, as torch's CPU kernels compute them), one typed loop per op and compute dtype,
 * and the result rounded back to the input's dtype once. Sums accumulate in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "tensor/device_tensor.h"
#include "tensor/math.h"
#include "tensor/strided.h"

/* ---- compute-dtype helpers (math.h) ------------------------------------------------------------ */

td_dtype tensor_compute_dtype(td_dtype dtype) { return dtype == TD_FLOAT64 ? TD_FLOAT64 : TD_FLOAT32; }

td_status tensor_check_floating(const td_tensor *t, const char *fn)
{
    if (!t)
        return error_fmt(TD_ERR_INVALID, "%s: a tensor argument is NULL", fn);
    TD_TRY(tensor_require_host(t, fn));
    if (!td_dtype_is_floating(t->dtype))
        return error_fmt(TD_ERR_INVALID, "%s: expected a floating point tensor (float16, bfloat16, float32 or float64), "
                                         "got %s",
                         fn, td_dtype_name(t->dtype));
    return TD_OK;
}

td_status tensor_as_compute_of(const td_tensor *t, td_dtype dtype, td_tensor **out)
{
    td_dtype c = tensor_compute_dtype(dtype);
    if (t->dtype == c && td_tensor_is_contiguous(t)) {
        *out = td_tensor_retain((td_tensor *)t);
        return TD_OK;
    }
    return td_tensor_to(t, c, out);
}

td_status tensor_as_compute(const td_tensor *t, td_tensor **out) { return tensor_as_compute_of(t, t->dtype, out); }

td_status tensor_from_compute(td_tensor *res, td_dtype dtype, td_tensor **out)
{
    if (res->dtype == dtype) {
        *out = res;
        return TD_OK;
    }
    td_status st = td_tensor_to(res, dtype, out);
    td_tensor_release(res);
    return st;
}

td_status tensor_finish_compute(td_status st, td_tensor *res, td_dtype dtype, td_tensor **out)
{
    if (st != TD_OK) {
        td_tensor_release(res);
        return st;
    }
    return tensor_from_compute(res, dtype, out);
}

td_status tensor_dim_split(const td_tensor *t, int dim, int *wrapped, int64_t *outer, int64_t *n, int64_t *inner)
{
    int d;
    TD_TRY(tensor_wrap_dim(dim, t->ndim, &d));
    *outer = *inner = 1;
    *n = t->ndim ? t->sizes[d] : 1;
    for (int i = 0; i < d; i++)
        *outer *= t->sizes[i];
    for (int i = d + 1; i < t->ndim; i++)
        *inner *= t->sizes[i];
    *wrapped = d;
    return TD_OK;
}

/* A new contiguous tensor of the compute dtype of `like` with the given shape. */
static td_status compute_empty(td_dtype like, int ndim, const int64_t *sizes, td_tensor **out)
{
    return td_tensor_empty(tensor_compute_dtype(like), td_shape_of(ndim, sizes), out);
}

/* ---- elementwise ------------------------------------------------------------------------------- */

typedef enum unary_kind { U_EXP, U_LOG, U_TANH, U_SIGMOID, U_RELU, U_POW } unary_kind;

#define MAP(T, expr)                          \
    for (int64_t i = 0; i < n; i++) {         \
        T x = src[i];                         \
        dst[i] = (expr);                      \
    }

static void unary_f32(unary_kind kind, const float *src, float *dst, int64_t n, double param)
{
    float p = (float)param;
    switch (kind) {
    case U_EXP: MAP(float, expf(x)) break;
    case U_LOG: MAP(float, logf(x)) break;
    case U_TANH: MAP(float, tanhf(x)) break;
    case U_SIGMOID: MAP(float, 1.0f / (1.0f + expf(-x))) break;
    case U_RELU: MAP(float, x > 0 || x != x ? x : 0.0f) break;
    case U_POW: MAP(float, powf(x, p)) break;
    }
}

static void unary_f64(unary_kind kind, const double *src, double *dst, int64_t n, double p)
{
    switch (kind) {
    case U_EXP: MAP(double, exp(x)) break;
    case U_LOG: MAP(double, log(x)) break;
    case U_TANH: MAP(double, tanh(x)) break;
    case U_SIGMOID: MAP(double, 1.0 / (1.0 + exp(-x))) break;
    case U_RELU: MAP(double, x > 0 || x != x ? x : 0.0) break;
    case U_POW: MAP(double, pow(x, p)) break;
    }
}

static td_status unary(unary_kind kind, const td_tensor *a, double param, const char *fn, td_tensor **out)
{
    TD_TRY(tensor_check_floating(a, fn));
    if (!out)
        return error_fmt(TD_ERR_INVALID, "%s: out is NULL", fn);
    td_tensor *src, *res;
    TD_TRY(tensor_as_compute(a, &src));
    td_status st = compute_empty(a->dtype, a->ndim, a->sizes, &res);
    if (st != TD_OK) {
        td_tensor_release(src);
        return st;
    }
    int64_t n = td_tensor_numel(a);
    if (src->dtype == TD_FLOAT32)
        unary_f32(kind, td_tensor_data(src), td_tensor_data(res), n, param);
    else
        unary_f64(kind, td_tensor_data(src), td_tensor_data(res), n, param);
    td_tensor_release(src);
    return tensor_from_compute(res, a->dtype, out);
}

td_status td_tensor_exp(const td_tensor *a, td_tensor **out) { return unary(U_EXP, a, 0, "exp", out); }
td_status td_tensor_log(const td_tensor *a, td_tensor **out) { return unary(U_LOG, a, 0, "log", out); }
td_status td_tensor_tanh(const td_tensor *a, td_tensor **out) { return unary(U_TANH, a, 0, "tanh", out); }
td_status td_tensor_sigmoid(const td_tensor *a, td_tensor **out) { return unary(U_SIGMOID, a, 0, "sigmoid", out); }
td_status td_tensor_relu(const td_tensor *a, td_tensor **out) { return unary(U_RELU, a, 0, "relu", out); }
td_status td_tensor_pow_scalar(const td_tensor *a, double exponent, td_tensor **out)
{
    return unary(U_POW, a, exponent, "pow", out);
}

td_status td_tensor_pow(const td_tensor *a, const td_tensor *b, td_tensor **out)
{
    TD_TRY(tensor_check_floating(a, "pow"));
    if (!b || !out)
        return error_fmt(TD_ERR_INVALID, "pow: %s is NULL", !b ? "b" : "out");
    TD_TRY(tensor_require_host(b, "pow"));
    int ndim;
    int64_t sizes[TD_MAX_DIMS];
    TD_TRY(strided_broadcast_shape(a->ndim, a->sizes, b->ndim, b->sizes, &ndim, sizes));
    td_tensor *ea = NULL, *eb = NULL, *ca = NULL, *cb = NULL, *res = NULL;
    td_status st = td_tensor_expand((td_tensor *)a, td_shape_of(ndim, sizes), &ea);
    if (st == TD_OK)
        st = td_tensor_expand((td_tensor *)b, td_shape_of(ndim, sizes), &eb);
    if (st == TD_OK)
        st = tensor_as_compute_of(ea, a->dtype, &ca);
    if (st == TD_OK)
        st = tensor_as_compute_of(eb, a->dtype, &cb);
    if (st == TD_OK)
        st = compute_empty(a->dtype, ndim, sizes, &res);
    if (st == TD_OK) {
        int64_t n = td_tensor_numel(res);
        if (res->dtype == TD_FLOAT32) {
            const float *x = td_tensor_data(ca), *y = td_tensor_data(cb);
            float *r = td_tensor_data(res);
            for (int64_t i = 0; i < n; i++)
                r[i] = powf(x[i], y[i]);
        } else {
            const double *x = td_tensor_data(ca), *y = td_tensor_data(cb);
            double *r = td_tensor_data(res);
            for (int64_t i = 0; i < n; i++)
                r[i] = pow(x[i], y[i]);
        }
    }
    td_tensor_release(ea);
    td_tensor_release(eb);
    td_tensor_release(ca);
    td_tensor_release(cb);
    return tensor_finish_compute(st, res, a->dtype, out);
}

/* ---- reductions -------------------------------------------------------------------------------- */

/* Sums (or averages) src [outer, n, inner] over n into dst [outer, inner], accumulating in double. */
#define REDUCE_DIM(T)                                                                     \
    do {                                                                                  \
        const T *x = td_tensor_data(src);                                                 \
        T *y = td_tensor_data(res);                                                       \
        for (int64_t o = 0; o < outer; o++) {                                             \
            for (int64_t j = 0; j < inner; j++)                                           \
                acc[j] = 0;                                                               \
            for (int64_t k = 0; k < n; k++) {                                             \
                const T *row = x + (o * n + k) * inner;                                   \
                for (int64_t j = 0; j < inner; j++)                                       \
                    acc[j] += row[j];                                                     \
            }                                                                             \
            for (int64_t j = 0; j < inner; j++)                                           \
                y[o * inner + j] = (T)(acc[j] * scale);                                   \
        }                                                                                 \
    } while (0)

static td_status reduce_dim(const td_tensor *a, int dim, bool keepdim, bool mean, const char *fn, td_tensor **out)
{
    TD_TRY(tensor_check_floating(a, fn));
    if (!out)
        return error_fmt(TD_ERR_INVALID, "%s: out is NULL", fn);
    int d;
    int64_t outer, n, inner;
    TD_TRY(tensor_dim_split(a, dim, &d, &outer, &n, &inner));
    int ndim = 0;
    int64_t sizes[TD_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++) {
        if (i != d)
            sizes[ndim++] = a->sizes[i];
        else if (keepdim)
            sizes[ndim++] = 1;
    }
    td_tensor *src, *res;
    TD_TRY(tensor_as_compute(a, &src));
    double *acc = NULL;
    td_status st = alloc_try(sizeof(double) * (size_t)(inner > 0 ? inner : 1), "a reduction row", (void **)&acc);
    if (st == TD_OK)
        st = compute_empty(a->dtype, ndim, sizes, &res);
    if (st != TD_OK) {
        free(acc);
        td_tensor_release(src);
        return st;
    }
    double scale = mean ? 1.0 / (double)n : 1.0;
    if (src->dtype == TD_FLOAT32)
        REDUCE_DIM(float);
    else
        REDUCE_DIM(double);
    free(acc);
    td_tensor_release(src);
    return tensor_from_compute(res, a->dtype, out);
}

td_status td_tensor_sum_dim(const td_tensor *a, int dim, bool keepdim, td_tensor **out)
{
    return reduce_dim(a, dim, keepdim, false, "sum", out);
}

td_status td_tensor_mean_dim(const td_tensor *a, int dim, bool keepdim, td_tensor **out)
{
    return reduce_dim(a, dim, keepdim, true, "mean", out);
}

td_status td_tensor_mean(const td_tensor *a, td_tensor **out)
{
    TD_TRY(tensor_check_floating(a, "mean"));
    if (!out)
        return error_fmt(TD_ERR_INVALID, "mean: out is NULL");
    td_tensor *flat;
    TD_TRY(td_tensor_reshape((td_tensor *)a, TD_SHAPE(td_tensor_numel(a)), &flat));
    td_status st = reduce_dim(flat, 0, false, true, "mean", out);
    td_tensor_release(flat);
    return st;
}

td_status td_tensor_sum_to_size(const td_tensor *a, td_shape shape, td_tensor **out)
{
    TD_TRY(tensor_check_floating(a, "sum_to_size"));
    if (!out)
        return error_fmt(TD_ERR_INVALID, "sum_to_size: out is NULL");
    int lead = a->ndim - shape.ndim;
    bool ok = lead >= 0;
    for (int i = 0; ok && i < shape.ndim; i++)
        ok = shape.d[i] == a->sizes[lead + i] || shape.d[i] == 1;
    if (!ok) {
        char b1[256], b2[256];
        return error_fmt(TD_ERR_INVALID, "size {%s} is not expandable to size {%s}.",
                         tensor_format_sizes(b1, sizeof b1, shape.ndim, shape.d),
                         tensor_format_sizes(b2, sizeof b2, a->ndim, a->sizes));
    }
    td_tensor *cur = td_tensor_retain((td_tensor *)a), *next;
    for (int i = 0; i < lead; i++) {
        td_status st = td_tensor_sum_dim(cur, 0, false, &next);
        td_tensor_release(cur);
        TD_TRY(st);
        cur = next;
    }
    for (int i = 0; i < shape.ndim; i++) {
        if (shape.d[i] != 1 || cur->sizes[i] == 1)
            continue;
        td_status st = td_tensor_sum_dim(cur, i, true, &next);
        td_tensor_release(cur);
        TD_TRY(st);
        cur = next;
    }
    td_status st = cur == a ? td_tensor_clone(cur, &next) : td_tensor_reshape(cur, shape, &next);
    td_tensor_release(cur);
    TD_TRY(st);
    *out = next;
    return TD_OK;
}

/* ---- softmax ----------------------------------------------------------------------------------- */

/* Row by row along n (stride inner): max, then the exponentials' sum in double. */
#define SOFTMAX(T, EXP, LOG)                                                              \
    do {                                                                                  \
        const T *x = td_tensor_data(src);                                                 \
        T *y = td_tensor_data(res);                                                       \
        for (int64_t o = 0; o < outer; o++) {                                             \
            for (int64_t j = 0; j < inner; j++) {                                         \
                const T *xr = x + o * n * inner + j;                                      \
                T *yr = y + o * n * inner + j;                                            \
                T mx = -INFINITY;                                                         \
                for (int64_t k = 0; k < n; k++)                                           \
                    mx = xr[k * inner] > mx || xr[k * inner] != xr[k * inner] ? xr[k * inner] : mx; \
                double sum = 0;                                                           \
                for (int64_t k = 0; k < n; k++)                                           \
                    sum += EXP(xr[k * inner] - mx);                                       \
                if (log_form) {                                                           \
                    T lse = (T)log(sum);                                                  \
                    for (int64_t k = 0; k < n; k++)                                       \
                        yr[k * inner] = xr[k * inner] - mx - lse;                         \
                } else {                                                                  \
                    for (int64_t k = 0; k < n; k++)                                       \
                        yr[k * inner] = (T)(EXP(xr[k * inner] - mx) / sum);               \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
    } while (0)

static td_status softmax(const td_tensor *a, int dim, bool log_form, td_tensor **out)
{
    const char *fn = log_form ? "log_softmax" : "softmax";
    TD_TRY(tensor_check_floating(a, fn));
    if (!out)
        return error_fmt(TD_ERR_INVALID, "%s: out is NULL", fn);
    int d;
    int64_t outer, n, inner;
    TD_TRY(tensor_dim_split(a, dim, &d, &outer, &n, &inner));
    td_tensor *src, *res;
    TD_TRY(tensor_as_compute(a, &src));
    td_status st = compute_empty(a->dtype, a->ndim, a->sizes, &res);
    if (st != TD_OK) {
        td_tensor_release(src);
        return st;
    }
    if (src->dtype == TD_FLOAT32)
        SOFTMAX(float, expf, logf);
    else
        SOFTMAX(double, exp, log);
    td_tensor_release(src);
    return tensor_from_compute(res, a->dtype, out);
}

td_status td_tensor_softmax(const td_tensor *a, int dim, td_tensor **out) { return softmax(a, dim, false, out); }
td_status td_tensor_log_softmax(const td_tensor *a, int dim, td_tensor **out) { return softmax(a, dim, true, out); }

/* ---- addmm ------------------------------------------------------------------------------------- */

td_status td_tensor_addmm(const td_tensor *bias, const td_tensor *a, const td_tensor *b, double beta, double alpha,
                          td_tensor **out)
{
    if (!bias || !a || !b || !out)
        return error_fmt(TD_ERR_INVALID, "addmm: %s is NULL", !bias ? "bias" : !a ? "a" : !b ? "b" : "out");
    TD_TRY(tensor_require_host(bias, "addmm"));
    if (bias->dtype != a->dtype)
        return error_fmt(TD_ERR_INVALID, "self and mat2 must have the same dtype, but got %s and %s",
                         td_dtype_name(bias->dtype), td_dtype_name(a->dtype));
    td_tensor *prod;
    TD_TRY(td_tensor_mm(a, b, &prod));
    int ndim;
    int64_t sizes[TD_MAX_DIMS];
    td_status st = strided_broadcast_shape(bias->ndim, bias->sizes, prod->ndim, prod->sizes, &ndim, sizes);
    if (st == TD_OK && (ndim != 2 || sizes[0] != prod->sizes[0] || sizes[1] != prod->sizes[1])) {
        char b1[256];
        st = error_fmt(TD_ERR_INVALID, "The expanded size of the tensor (%lld) must match the existing size at "
                                       "non-singleton dimension: bias of shape %s does not broadcast to [%lld, %lld]",
                       (long long)prod->sizes[1], tensor_format_sizes(b1, sizeof b1, bias->ndim, bias->sizes),
                       (long long)prod->sizes[0], (long long)prod->sizes[1]);
    }
    if (st != TD_OK) {
        td_tensor_release(prod);
        return st;
    }
    int64_t rows = prod->sizes[0], cols = prod->sizes[1];
    /* The Linear layer's case: a bias row added in place to each row of the product. */
    if (alpha == 1 && beta == 1 && td_tensor_is_contiguous(bias) && td_tensor_numel(bias) == cols &&
        (bias->ndim == 1 || (bias->ndim == 2 && bias->sizes[0] == 1))) {
        size_t row_bytes = (size_t)cols * td_dtype_size(prod->dtype);
        char *p = td_tensor_data(prod);
        for (int64_t i = 0; i < rows; i++)
            TD_TRY(td_reduce(TD_SUM, prod->dtype, p + (size_t)i * row_bytes, p + (size_t)i * row_bytes,
                             td_tensor_data(bias), (size_t)cols));
        *out = prod;
        return TD_OK;
    }
    td_tensor *scaled_prod = NULL, *scaled_bias = NULL;
    st = alpha == 1 ? (scaled_prod = td_tensor_retain(prod), TD_OK)
                    : td_tensor_mul_scalar(prod, td_scalar_float(alpha), &scaled_prod);
    if (st == TD_OK)
        st = beta == 1 ? (scaled_bias = td_tensor_retain((td_tensor *)bias), TD_OK)
                       : td_tensor_mul_scalar(bias, td_scalar_float(beta), &scaled_bias);
    if (st == TD_OK)
        st = beta == 0 ? td_tensor_clone(scaled_prod, out) : td_tensor_add(scaled_prod, scaled_bias, out);
    td_tensor_release(prod);
    td_tensor_release(scaled_prod);
    td_tensor_release(scaled_bias);
    return st;
}

/* ---- nll_loss ---------------------------------------------------------------------------------- */

/* An index tensor as contiguous int64 (int32 is converted, as torch accepts both for offsets). */
static td_status as_int64(const td_tensor *t, const char *what, td_tensor **out)
{
    TD_TRY(tensor_require_host(t, what));
    if (t->dtype == TD_INT64)
        return td_tensor_contiguous((td_tensor *)t, out);
    if (t->dtype == TD_INT32)
        return td_tensor_to(t, TD_INT64, out);
    return error_fmt(TD_ERR_INVALID, "%s: expected scalar type Long but found %s", what, td_dtype_name(t->dtype));
}

td_status td_tensor_nll_loss(const td_tensor *input, const td_tensor *target, td_loss_reduction reduction,
                             int64_t ignore_index, td_tensor **out)
{
    TD_TRY(tensor_check_floating(input, "nll_loss"));
    if (!target || !out)
        return error_fmt(TD_ERR_INVALID, "nll_loss: %s is NULL", !target ? "target" : "out");
    if (input->ndim != 1 && input->ndim != 2)
        return error_fmt(TD_ERR_INVALID, "input tensor should be 1D or 2D");
    if (target->ndim > 1)
        return error_fmt(TD_ERR_INVALID, "0D or 1D target tensor expected, multi-target not supported");
    int64_t rows = input->ndim == 2 ? input->sizes[0] : 1, classes = input->sizes[input->ndim - 1];
    int64_t trows = target->ndim == 1 ? target->sizes[0] : 1;
    if ((input->ndim == 1 && target->ndim != 0) || (input->ndim == 2 && target->ndim != 1) || rows != trows)
        return error_fmt(TD_ERR_INVALID, "Expected input batch_size (%lld) to match target batch_size (%lld).",
                         (long long)rows, (long long)trows);
    if ((unsigned)reduction > TD_REDUCTION_NONE)
        return error_fmt(TD_ERR_INVALID, "nll_loss: invalid reduction %d", (int)reduction);
    td_tensor *tgt, *src = NULL, *res = NULL;
    TD_TRY(as_int64(target, "nll_loss", &tgt));
    const int64_t *t = td_tensor_data(tgt);
    td_status st = TD_OK;
    for (int64_t i = 0; i < rows && st == TD_OK; i++) {
        if (t[i] != ignore_index && (t[i] < 0 || t[i] >= classes))
            st = error_fmt(TD_ERR_INVALID, "Target %lld is out of bounds.", (long long)t[i]);
    }
    if (st == TD_OK)
        st = tensor_as_compute(input, &src);
    if (st == TD_OK) {
        td_shape shape = reduction == TD_REDUCTION_NONE && input->ndim == 2 ? TD_SHAPE(rows) : TD_SHAPE_SCALAR;
        st = compute_empty(input->dtype, shape.ndim, shape.d, &res);
    }
    if (st == TD_OK) {
        double total = 0, count = 0;
        for (int64_t i = 0; i < rows; i++) {
            double v = 0;
            if (t[i] != ignore_index) {
                v = src->dtype == TD_FLOAT32 ? -(double)((const float *)td_tensor_data(src))[i * classes + t[i]]
                                             : -((const double *)td_tensor_data(src))[i * classes + t[i]];
                count += 1;
            }
            if (reduction == TD_REDUCTION_NONE) {
                if (res->dtype == TD_FLOAT32)
                    ((float *)td_tensor_data(res))[i] = (float)v;
                else
                    ((double *)td_tensor_data(res))[i] = v;
            }
            total += v;
        }
        if (reduction != TD_REDUCTION_NONE) {
            double v = reduction == TD_REDUCTION_MEAN ? total / count : total;
            if (res->dtype == TD_FLOAT32)
                *(float *)td_tensor_data(res) = (float)v;
            else
                *(double *)td_tensor_data(res) = v;
        }
    }
    td_tensor_release(tgt);
    td_tensor_release(src);
    return tensor_finish_compute(st, res, input->dtype, out);
}

/* ---- embedding_bag ----------------------------------------------------------------------------- */

#define BAG_SUM(T)                                                                        \
    do {                                                                                  \
        const T *w = td_tensor_data(src);                                                 \
        T *y = td_tensor_data(res);                                                       \
        for (int64_t b = 0; b < bags; b++) {                                              \
            int64_t lo = off[b], hi = b + 1 < bags ? off[b + 1] : nidx;                   \
            T *row = y + b * dim;                                                         \
            for (int64_t k = lo; k < hi; k++) {                                           \
                const T *wr = w + idx[k] * dim;                                           \
                for (int64_t j = 0; j < dim; j++)                                         \
                    row[j] += wr[j];                                                      \
            }                                                                             \
            if (mode == TD_EMBEDDING_BAG_MEAN && hi > lo) {                               \
                for (int64_t j = 0; j < dim; j++)                                         \
                    row[j] /= (T)(hi - lo);                                               \
            }                                                                             \
        }                                                                                 \
    } while (0)

td_status tensor_embedding_bag_offsets(const td_tensor *weight, const td_tensor *indices, const td_tensor *offsets,
                             td_tensor **idx_out, int64_t **starts_out, int64_t *bags_out)
{
    if (indices->ndim == 2 && offsets)
        return error_fmt(TD_ERR_INVALID, "if input is 2D, then offsets has to be None, as input is treated is a "
                                         "mini-batch of fixed length sequences.");
    if (indices->ndim == 1 && !offsets)
        return error_fmt(TD_ERR_INVALID, "offsets has to be a 1D Tensor but got None");
    if (indices->ndim != 1 && indices->ndim != 2)
        return error_fmt(TD_ERR_INVALID, "input has to be 1D or 2D Tensor, but got Tensor of dimension %d",
                         indices->ndim);
    if (offsets && offsets->ndim != 1)
        return error_fmt(TD_ERR_INVALID, "offsets has to be a 1D Tensor");
    td_tensor *idx, *flat;
    TD_TRY(as_int64(indices, "embedding_bag", &idx));
    td_status st = td_tensor_reshape(idx, TD_SHAPE(td_tensor_numel(idx)), &flat);
    td_tensor_release(idx);
    TD_TRY(st);
    int64_t nidx = td_tensor_numel(flat), rows = weight->sizes[0];
    const int64_t *iv = td_tensor_data(flat);
    for (int64_t k = 0; k < nidx; k++) {
        if (iv[k] < 0 || iv[k] >= rows) {
            td_tensor_release(flat);
            return error_fmt(TD_ERR_INVALID, "index %lld is out of bounds for dimension 0 with size %lld",
                             (long long)iv[k], (long long)rows);
        }
    }
    int64_t bags = offsets ? offsets->sizes[0] : indices->sizes[0];
    int64_t *starts = alloc_zeroed((size_t)(bags > 0 ? bags : 1), sizeof(int64_t));
    if (offsets) {
        td_tensor *off;
        st = as_int64(offsets, "embedding_bag", &off);
        for (int64_t b = 0; st == TD_OK && b < bags; b++) {
            starts[b] = ((const int64_t *)td_tensor_data(off))[b];
            if ((b == 0 && starts[b] != 0) || starts[b] < (b ? starts[b - 1] : 0) || starts[b] > nidx)
                st = error_fmt(TD_ERR_INVALID, "offsets[%lld] = %lld is out of order or out of range: offsets must "
                                               "start at 0 and not decrease past the %lld indices",
                               (long long)b, (long long)starts[b], (long long)nidx);
        }
        if (offsets)
            td_tensor_release(off);
    } else {
        for (int64_t b = 0; b < bags; b++)
            starts[b] = b * indices->sizes[1];
    }
    if (st != TD_OK) {
        free(starts);
        td_tensor_release(flat);
        return st;
    }
    *idx_out = flat;
    *starts_out = starts;
    *bags_out = bags;
    return TD_OK;
}

td_status td_tensor_embedding_bag(const td_tensor *weight, const td_tensor *indices, const td_tensor *offsets,
                                  td_embedding_bag_mode mode, td_tensor **out)
{
    TD_TRY(tensor_check_floating(weight, "embedding_bag"));
    if (!indices || !out)
        return error_fmt(TD_ERR_INVALID, "embedding_bag: %s is NULL", !indices ? "indices" : "out");
    if (weight->ndim != 2)
        return error_fmt(TD_ERR_INVALID, "'weight' must be 2-D");
    if (mode != TD_EMBEDDING_BAG_SUM && mode != TD_EMBEDDING_BAG_MEAN)
        return error_fmt(TD_ERR_INVALID, "embedding_bag: mode must be sum or mean, got %d", (int)mode);
    td_tensor *flat, *src = NULL, *res = NULL;
    int64_t *off, bags;
    TD_TRY(tensor_embedding_bag_offsets(weight, indices, offsets, &flat, &off, &bags));
    int64_t dim = weight->sizes[1], nidx = td_tensor_numel(flat);
    const int64_t *idx = td_tensor_data(flat);
    td_status st = tensor_as_compute(weight, &src);
    if (st == TD_OK)
        st = td_tensor_zeros(tensor_compute_dtype(weight->dtype), TD_SHAPE(bags, dim), &res);
    if (st == TD_OK) {
        if (src->dtype == TD_FLOAT32)
            BAG_SUM(float);
        else
            BAG_SUM(double);
    }
    free(off);
    td_tensor_release(flat);
    td_tensor_release(src);
    return tensor_finish_compute(st, res, weight->dtype, out);
}
