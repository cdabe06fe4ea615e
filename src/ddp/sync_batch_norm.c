/* SyncBatchNorm (tdist/ddp.h; torch.nn.SyncBatchNorm in training mode): batch normalization whose
 * statistics are those of every rank's batch together.
 *
 * The forward sums each channel's values and squares over the local batch and spatial positions,
 * all_reduces [sum, sum of squares, count] over the group, and normalizes with the global mean and
 * biased variance; the running statistics move with the global mean and unbiased variance. It
 * records a custom autograd function whose backward all_reduces each channel's [sum of dy, sum of
 * dy * xhat] and gives x's gradient from the global sums (the gradient of the global batch's loss),
 * and the weight and bias their local sums (DDP then averages them like any parameter). The
 * arithmetic is in double on contiguous copies, whatever the float dtype. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/autograd.h>
#include <tdist/ddp.h>

#include "base/alloc.h"
#include "base/error.h"
#include "pg/pg_impl.h"

typedef struct sbn_ctx {
    td_pg *pg;
    td_tensor *x;          /* contiguous float64 copy [N, C, L] */
    double *mean, *var, *invstd; /* [C]; var biased */
    double *weight;        /* [C], NULL without affine */
    int64_t n, c, l;
    double count;          /* the global N * L */
    int x_index, w_index, b_index; /* positions among the recorded inputs, -1 when absent */
    int num_inputs;
    td_dtype x_dtype, w_dtype;
} sbn_ctx;

static void sbn_release_saved(void *p)
{
    sbn_ctx *s = p;
    td_tensor_release(s->x);
    s->x = NULL;
}

static void sbn_destroy(void *p)
{
    sbn_ctx *s = p;
    td_tensor_release(s->x);
    free(s->mean);
    free(s->var);
    free(s->invstd);
    free(s->weight);
    free(s);
}

/* A contiguous float64 copy of t. */
static td_status sbn_f64(const td_tensor *t, td_tensor **out)
{
    td_tensor *d = NULL, *c = NULL;
    TD_TRY(td_tensor_to(t, TD_FLOAT64, &d));
    td_status st = td_tensor_contiguous(d, &c);
    td_tensor_release(d);
    if (st == TD_OK)
        *out = c;
    return st;
}

/* A new tensor of dtype dt and that shape from its doubles v. */
static td_status sbn_from(const double *v, td_shape shape, td_dtype dt, td_tensor **out)
{
    td_tensor *d = NULL;
    TD_TRY(td_tensor_from_buffer(TD_FLOAT64, shape, v, &d));
    td_status st = td_tensor_to(d, dt, out);
    td_tensor_release(d);
    return st;
}

static td_status sbn_backward(void *p, td_tensor *const *grad_outputs, int num_outputs, td_tensor **grad_inputs,
                              int num_inputs)
{
    sbn_ctx *s = p;
    (void)num_outputs;
    (void)num_inputs;
    if (!s->x)
        return error_fmt(TD_ERR_INVALID, "SyncBatchNorm: the saved input was freed (retain_graph was false)");
    int64_t n = s->n, c = s->c, l = s->l;
    double *red = calloc((size_t)(2 * c), sizeof(double));
    double *local_dy = calloc((size_t)c, sizeof(double)), *local_dyx = calloc((size_t)c, sizeof(double));
    td_tensor *dy = NULL, *sums = NULL;
    td_status st = (red && local_dy && local_dyx) ? TD_OK : error_fmt(TD_ERR_NOMEM, "SyncBatchNorm: out of memory");
    if (st == TD_OK && grad_outputs[0])
        st = sbn_f64(grad_outputs[0], &dy);
    else if (st == TD_OK)
        st = td_tensor_zeros(TD_FLOAT64, td_tensor_shape(s->x), &dy);
    const double *x = s->x ? td_tensor_data(s->x) : NULL;
    if (st == TD_OK) {
        const double *g = td_tensor_data(dy);
        for (int64_t i = 0; i < n; i++)
            for (int64_t k = 0; k < c; k++)
                for (int64_t j = 0; j < l; j++) {
                    int64_t at = (i * c + k) * l + j;
                    local_dy[k] += g[at];
                    local_dyx[k] += g[at] * (x[at] - s->mean[k]) * s->invstd[k];
                }
        for (int64_t k = 0; k < c; k++) {
            red[k] = local_dy[k];
            red[c + k] = local_dyx[k];
        }
        st = td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(2 * c), red, &sums);
    }
    if (st == TD_OK)
        st = td_pg_all_reduce(s->pg, sums, TD_OP_SUM, NULL);
    if (st == TD_OK && s->x_index >= 0) {
        const double *tot = td_tensor_data(sums), *g = td_tensor_data(dy);
        double *gx = malloc(sizeof(double) * (size_t)(n * c * l > 0 ? n * c * l : 1));
        if (!gx)
            st = error_fmt(TD_ERR_NOMEM, "SyncBatchNorm: out of memory");
        for (int64_t i = 0; st == TD_OK && i < n; i++)
            for (int64_t k = 0; k < c; k++) {
                double w = s->weight ? s->weight[k] : 1.0, mdy = tot[k] / s->count, mdyx = tot[c + k] / s->count;
                for (int64_t j = 0; j < l; j++) {
                    int64_t at = (i * c + k) * l + j;
                    double xhat = (x[at] - s->mean[k]) * s->invstd[k];
                    gx[at] = w * s->invstd[k] * (g[at] - mdy - xhat * mdyx);
                }
            }
        if (st == TD_OK)
            st = sbn_from(gx, td_tensor_shape(s->x), s->x_dtype, &grad_inputs[s->x_index]);
        free(gx);
    }
    if (st == TD_OK && s->w_index >= 0)
        st = sbn_from(local_dyx, TD_SHAPE(c), s->w_dtype, &grad_inputs[s->w_index]);
    if (st == TD_OK && s->b_index >= 0)
        st = sbn_from(local_dy, TD_SHAPE(c), s->w_dtype, &grad_inputs[s->b_index]);
    td_tensor_release(dy);
    td_tensor_release(sums);
    free(red);
    free(local_dy);
    free(local_dyx);
    return st;
}

static const td_autograd_function sbn_function = {
    .name = "SyncBatchNormBackward",
    .backward = sbn_backward,
    .release_saved = sbn_release_saved,
    .destroy = sbn_destroy,
};

static td_status sbn_check(const td_tensor *v, const char *what, int64_t c)
{
    if (!v)
        return TD_OK;
    if (td_tensor_ndim(v) != 1 || td_tensor_sizes(v)[0] != c)
        return error_fmt(TD_ERR_INVALID, "SyncBatchNorm: %s must have shape [%lld]", what, (long long)c);
    if (!td_dtype_is_floating(td_tensor_dtype(v)))
        return error_fmt(TD_ERR_INVALID, "SyncBatchNorm: %s must be a floating point tensor", what);
    return TD_OK;
}

td_status td_sync_batch_norm(td_pg *pg, td_tensor *x, td_tensor *weight, td_tensor *bias, td_tensor *running_mean,
                             td_tensor *running_var, double momentum, double eps, td_tensor **out)
{
    if (!x || !out)
        return error_fmt(TD_ERR_INVALID, "td_sync_batch_norm: x and out must not be NULL");
    *out = NULL;
    pg = pg_or_default(pg);
    if (!pg)
        return error_fmt(TD_ERR_INVALID, "td_sync_batch_norm: no process group given and no default group");
    int nd = td_tensor_ndim(x);
    if (nd < 2)
        return error_fmt(TD_ERR_INVALID, "expected at least 2D input (got %dD input)", nd);
    if (!td_dtype_is_floating(td_tensor_dtype(x)))
        return error_fmt(TD_ERR_INVALID, "SyncBatchNorm: the input must be a floating point tensor");
    int64_t n = td_tensor_sizes(x)[0], c = td_tensor_sizes(x)[1], l = 1;
    for (int d = 2; d < nd; d++)
        l *= td_tensor_sizes(x)[d];
    TD_TRY(sbn_check(weight, "weight", c));
    TD_TRY(sbn_check(bias, "bias", c));
    TD_TRY(sbn_check(running_mean, "running_mean", c));
    TD_TRY(sbn_check(running_var, "running_var", c));

    sbn_ctx *s = TD_NEW(sbn_ctx);
    *s = (sbn_ctx){.pg = pg, .n = n, .c = c, .l = l, .x_index = -1, .w_index = -1, .b_index = -1,
                   .x_dtype = td_tensor_dtype(x), .w_dtype = weight ? td_tensor_dtype(weight) : td_tensor_dtype(x)};
    s->mean = calloc((size_t)c, sizeof(double));
    s->invstd = calloc((size_t)c, sizeof(double));
    s->var = calloc((size_t)c, sizeof(double));
    double *stats = calloc((size_t)(2 * c + 1), sizeof(double));
    td_tensor *st_t = NULL, *w64 = NULL, *b64 = NULL, *y = NULL;
    double *yv = NULL;
    td_status st = (s->mean && s->var && s->invstd && stats) ? TD_OK : error_fmt(TD_ERR_NOMEM, "SyncBatchNorm: out of memory");
    if (st == TD_OK)
        st = sbn_f64(x, &s->x);
    if (st == TD_OK) { /* the local sums, then the group's */
        const double *xv = td_tensor_data(s->x);
        for (int64_t i = 0; i < n; i++)
            for (int64_t k = 0; k < c; k++)
                for (int64_t j = 0; j < l; j++) {
                    double v = xv[(i * c + k) * l + j];
                    stats[k] += v;
                    stats[c + k] += v * v;
                }
        stats[2 * c] = (double)(n * l);
        st = td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(2 * c + 1), stats, &st_t);
    }
    if (st == TD_OK)
        st = td_pg_all_reduce(pg, st_t, TD_OP_SUM, NULL);
    if (st == TD_OK) {
        const double *g = td_tensor_data(st_t);
        s->count = g[2 * c];
        if (s->count <= 1)
            st = error_fmt(TD_ERR_INVALID, "Expected more than 1 value per channel when training, got input size %lld",
                           (long long)s->count);
        for (int64_t k = 0; st == TD_OK && k < c; k++) {
            double mean = g[k] / s->count, var = g[c + k] / s->count - mean * mean;
            if (var < 0)
                var = 0;
            s->mean[k] = mean;
            s->var[k] = var;
            s->invstd[k] = 1.0 / sqrt(var + eps);
        }
    }
    if (st == TD_OK && weight) {
        st = sbn_f64(weight, &w64);
        if (st == TD_OK) {
            s->weight = malloc(sizeof(double) * (size_t)c);
            if (s->weight)
                memcpy(s->weight, td_tensor_data(w64), sizeof(double) * (size_t)c);
            else
                st = error_fmt(TD_ERR_NOMEM, "SyncBatchNorm: out of memory");
        }
    }
    if (st == TD_OK && bias)
        st = sbn_f64(bias, &b64);
    if (st == TD_OK) {
        yv = malloc(sizeof(double) * (size_t)(n * c * l > 0 ? n * c * l : 1));
        if (!yv)
            st = error_fmt(TD_ERR_NOMEM, "SyncBatchNorm: out of memory");
        const double *xv = td_tensor_data(s->x), *bv = b64 ? td_tensor_data(b64) : NULL;
        for (int64_t i = 0; st == TD_OK && i < n; i++)
            for (int64_t k = 0; k < c; k++)
                for (int64_t j = 0; j < l; j++) {
                    int64_t at = (i * c + k) * l + j;
                    double v = (xv[at] - s->mean[k]) * s->invstd[k];
                    yv[at] = v * (s->weight ? s->weight[k] : 1.0) + (bv ? bv[k] : 0.0);
                }
    }
    if (st == TD_OK)
        st = sbn_from(yv, td_tensor_shape(x), td_tensor_dtype(x), &y);
    if (st == TD_OK && (running_mean || running_var)) { /* under no_grad, in place */
        bool prev = td_autograd_set_grad_enabled(false);
        for (int64_t k = 0; st == TD_OK && k < c; k++) {
            double unbiased = s->var[k] * s->count / (s->count - 1);
            double old = 0;
            if (running_mean && (st = td_tensor_get_f64(running_mean, &k, &old)) == TD_OK)
                st = td_tensor_set_f64(running_mean, &k, (1 - momentum) * old + momentum * s->mean[k]);
            if (st == TD_OK && running_var && (st = td_tensor_get_f64(running_var, &k, &old)) == TD_OK)
                st = td_tensor_set_f64(running_var, &k, (1 - momentum) * old + momentum * unbiased);
        }
        td_autograd_set_grad_enabled(prev);
    }
    td_tensor_release(st_t);
    td_tensor_release(w64);
    td_tensor_release(b64);
    free(stats);
    free(yv);
    if (st == TD_OK) {
        td_tensor *inputs[3];
        int k = 0;
        s->x_index = k, inputs[k++] = x;
        if (weight)
            s->w_index = k, inputs[k++] = weight;
        if (bias)
            s->b_index = k, inputs[k++] = bias;
        s->num_inputs = k;
        st = td_autograd_function_record(&sbn_function, s, inputs, k, &y, 1, NULL); /* takes s */
        s = NULL;
    }
    if (st != TD_OK) {
        if (s)
            sbn_destroy(s);
        td_tensor_release(y);
        return st;
    }
    *out = y;
    return TD_OK;
}
