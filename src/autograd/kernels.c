/* The backward kernels that tensor.h has no forward op for: the derivatives of relu, tanh,
 * sigmoid and pow's exponent, softmax and log_softmax backward, nll_loss backward and
 * embedding_bag backward (aten's threshold_backward, tanh_backward, _softmax_backward_data, ...).
 * ops.c calls them from the nodes' backward functions; everything else a backward needs is made
 * of tensor.h's ops. They follow src/tensor/math.c's scheme: operands made contiguous in the
 * compute dtype of the gradient's dtype, one typed loop per compute dtype, the result rounded back
 * to that dtype once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "base/alloc.h"
#include "base/error.h"
#include "tensor/math.h"

/* t expanded to shape and made contiguous in the compute dtype of dtype. */
static td_status operand(const td_tensor *t, td_shape shape, td_dtype dtype, td_tensor **out)
{
    td_tensor *e;
    TD_TRY(td_tensor_expand((td_tensor *)t, shape, &e));
    td_status st = tensor_as_compute_of(e, dtype, out);
    td_tensor_release(e);
    return st;
}

#define POINTWISE(T, LOG)                                                        \
    do {                                                                         \
        const T *gv = td_tensor_data(cg), *xv = td_tensor_data(cx);              \
        const T *yv = cy ? td_tensor_data(cy) : NULL;                            \
        T *r = td_tensor_data(res);                                              \
        for (int64_t i = 0; i < n; i++) {                                        \
            T g = gv[i], v = xv[i];                                              \
            switch (kind) {                                                      \
            case AG_KERNEL_RELU: r[i] = v > 0 ? g : 0; break;                    \
            case AG_KERNEL_TANH: r[i] = g * (1 - v * v); break;                  \
            case AG_KERNEL_SIGMOID: r[i] = g * v * (1 - v); break;               \
            default: r[i] = v == 0 && yv[i] >= 0 ? 0 : g * yv[i] * LOG(v); break; \
            }                                                                    \
        }                                                                        \
    } while (0)

td_status ag_pointwise_backward(ag_kernel kind, const td_tensor *grad, const td_tensor *x, const td_tensor *y,
                                td_tensor **out)
{
    td_shape shape = td_tensor_shape(grad);
    td_tensor *cg = NULL, *cx = NULL, *cy = NULL, *res = NULL;
    td_status st = tensor_as_compute(grad, &cg);
    if (st == TD_OK)
        st = operand(x, shape, grad->dtype, &cx);
    if (st == TD_OK && y)
        st = operand(y, shape, grad->dtype, &cy);
    if (st == TD_OK)
        st = td_tensor_empty(cg->dtype, shape, &res);
    if (st == TD_OK) {
        int64_t n = td_tensor_numel(res);
        if (res->dtype == TD_FLOAT32)
            POINTWISE(float, logf);
        else
            POINTWISE(double, log);
    }
    td_tensor_release(cg);
    td_tensor_release(cx);
    td_tensor_release(cy);
    return tensor_finish_compute(st, res, grad->dtype, out);
}

/* softmax: gx = y * (g - sum(g * y)); log_softmax: gx = g - exp(y) * sum(g); rows along dim. */
#define SOFTMAX_BACKWARD(T, EXP)                                                 \
    do {                                                                         \
        const T *gv = td_tensor_data(cg), *yv = td_tensor_data(cy);              \
        T *r = td_tensor_data(res);                                              \
        for (int64_t o = 0; o < outer; o++) {                                    \
            for (int64_t j = 0; j < inner; j++) {                                \
                int64_t base = o * n * inner + j;                                \
                double dot = 0;                                                  \
                for (int64_t k = 0; k < n; k++)                                  \
                    dot += log_form ? (double)gv[base + k * inner]               \
                                    : (double)gv[base + k * inner] * yv[base + k * inner]; \
                for (int64_t k = 0; k < n; k++) {                                \
                    int64_t p = base + k * inner;                                \
                    r[p] = log_form ? (T)(gv[p] - EXP(yv[p]) * dot) : (T)(yv[p] * (gv[p] - dot)); \
                }                                                                \
            }                                                                    \
        }                                                                        \
    } while (0)

td_status ag_softmax_backward(const td_tensor *grad, const td_tensor *y, int dim, bool log_form, td_tensor **out)
{
    int d;
    int64_t outer, n, inner;
    TD_TRY(tensor_dim_split(y, dim, &d, &outer, &n, &inner));
    td_tensor *cg = NULL, *cy = NULL, *res = NULL;
    td_status st = tensor_as_compute(grad, &cg);
    if (st == TD_OK)
        st = tensor_as_compute_of(y, grad->dtype, &cy);
    if (st == TD_OK)
        st = td_tensor_empty(cg->dtype, td_tensor_shape(y), &res);
    if (st == TD_OK) {
        if (res->dtype == TD_FLOAT32)
            SOFTMAX_BACKWARD(float, expf);
        else
            SOFTMAX_BACKWARD(double, exp);
    }
    td_tensor_release(cg);
    td_tensor_release(cy);
    return tensor_finish_compute(st, res, grad->dtype, out);
}

/* Stores v at element i of a contiguous float32 or float64 tensor. */
static void store_at(td_tensor *t, int64_t i, double v)
{
    if (t->dtype == TD_FLOAT32)
        ((float *)td_tensor_data(t))[i] = (float)v;
    else
        ((double *)td_tensor_data(t))[i] = v;
}

static double load_at(const td_tensor *t, int64_t i)
{
    return t->dtype == TD_FLOAT32 ? ((const float *)td_tensor_data(t))[i] : ((const double *)td_tensor_data(t))[i];
}

td_status ag_nll_loss_backward(const td_tensor *grad, const td_tensor *input, const td_tensor *target,
                               td_loss_reduction reduction, int64_t ignore_index, td_tensor **out)
{
    int64_t rows = input->ndim == 2 ? input->sizes[0] : 1, classes = input->sizes[input->ndim - 1];
    td_tensor *tgt = NULL, *cg = NULL, *res = NULL;
    td_status st = target->dtype == TD_INT64 ? td_tensor_contiguous((td_tensor *)target, &tgt)
                                             : td_tensor_to(target, TD_INT64, &tgt);
    if (st == TD_OK)
        st = tensor_as_compute(grad, &cg);
    if (st == TD_OK)
        st = td_tensor_zeros(cg->dtype, td_tensor_shape(input), &res);
    if (st == TD_OK) {
        const int64_t *t = td_tensor_data(tgt);
        double count = 0;
        for (int64_t i = 0; i < rows; i++)
            count += t[i] != ignore_index;
        for (int64_t i = 0; i < rows; i++) {
            if (t[i] == ignore_index)
                continue;
            double g = reduction == TD_REDUCTION_NONE ? load_at(cg, i) : load_at(cg, 0);
            if (reduction == TD_REDUCTION_MEAN)
                g /= count;
            store_at(res, i * classes + t[i], -g);
        }
    }
    td_tensor_release(tgt);
    td_tensor_release(cg);
    return tensor_finish_compute(st, res, input->dtype, out);
}

#define BAG_BACKWARD(T)                                                          \
    do {                                                                         \
        const T *gv = td_tensor_data(cg);                                        \
        T *r = td_tensor_data(res);                                              \
        for (int64_t b = 0; b < bags; b++) {                                     \
            int64_t lo = starts[b], hi = b + 1 < bags ? starts[b + 1] : nidx;    \
            T scale = mode == TD_EMBEDDING_BAG_MEAN && hi > lo ? (T)1 / (T)(hi - lo) : (T)1; \
            for (int64_t k = lo; k < hi; k++) {                                  \
                T *row = r + idx[k] * dim;                                       \
                for (int64_t j = 0; j < dim; j++)                                \
                    row[j] += gv[b * dim + j] * scale;                           \
            }                                                                    \
        }                                                                        \
    } while (0)

td_status ag_embedding_bag_backward(const td_tensor *grad, const td_tensor *weight, const td_tensor *indices,
                                    const td_tensor *offsets, td_embedding_bag_mode mode, td_tensor **out)
{
    td_tensor *flat, *cg = NULL, *res = NULL;
    int64_t *starts, bags;
    TD_TRY(tensor_embedding_bag_offsets(weight, indices, offsets, &flat, &starts, &bags));
    int64_t dim = weight->sizes[1], nidx = td_tensor_numel(flat);
    const int64_t *idx = td_tensor_data(flat);
    td_status st = tensor_as_compute(grad, &cg);
    if (st == TD_OK)
        st = td_tensor_zeros(cg->dtype, td_tensor_shape(weight), &res);
    if (st == TD_OK) {
        if (res->dtype == TD_FLOAT32)
            BAG_BACKWARD(float);
        else
            BAG_BACKWARD(double);
    }
    free(starts);
    td_tensor_release(flat);
    td_tensor_release(cg);
    return tensor_finish_compute(st, res, weight->dtype, out);
}
