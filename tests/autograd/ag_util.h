/* Helpers for the autograd tests: deterministic random tensors, element access by flat index,
 * and the finite-difference gradient check every op's test uses. */
#ifndef TDIST_TESTS_AG_UTIL_H
#define TDIST_TESTS_AG_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <tdist/autograd.h>
#include <tdist/testing.h>

/* Returns a failing status from the enclosing function. */
#define AG_TRY(expr)                  \
    do {                              \
        td_status ag_try_s_ = (expr); \
        if (ag_try_s_ != TD_OK)       \
            return ag_try_s_;         \
    } while (0)

static inline double ag_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}

/* A float64 tensor of uniform values in [lo, hi), kept at least `gap` away from 0 (for kinks and
 * divisions), requiring grad when asked. */
static inline td_tensor *ag_randn(td_shape shape, double lo, double hi, double gap, bool requires_grad, uint64_t *s)
{
    td_tensor *t;
    TD_CHECK_OK(td_tensor_empty(TD_FLOAT64, shape, &t));
    double *p = (double *)td_tensor_data(t);
    for (int64_t i = 0; i < td_tensor_numel(t); i++) {
        double v = lo + (hi - lo) * ag_rand(s);
        if (fabs(v) < gap)
            v = v < 0 ? -gap - fabs(v) : gap + v;
        p[i] = v;
    }
    if (requires_grad)
        TD_CHECK_OK(td_autograd_set_requires_grad(t, true));
    return t;
}

static inline double ag_at(const td_tensor *t, int64_t flat)
{
    int nd = td_tensor_ndim(t);
    int64_t idx[TD_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = flat % td_tensor_sizes(t)[d];
        flat /= td_tensor_sizes(t)[d];
    }
    double v;
    TD_CHECK_OK(td_tensor_get_f64(t, nd ? idx : NULL, &v));
    return v;
}

/* The function under test: out = f(inputs). */
typedef td_status (*ag_fn)(td_tensor *const *in, const void *arg, td_tensor **out);

/* sum(f(inputs) * weights), computed without recording. */
static inline double ag_weighted(ag_fn fn, const void *arg, td_tensor *const *in, const td_tensor *weights)
{
    bool prev = td_autograd_set_grad_enabled(false);
    td_tensor *out;
    TD_CHECK_OK(fn(in, arg, &out));
    td_autograd_set_grad_enabled(prev);
    double s = 0;
    for (int64_t i = 0; i < td_tensor_numel(out); i++)
        s += ag_at(out, i) * ag_at(weights, i);
    td_tensor_release(out);
    return s;
}

/* Checks the gradients backward gives each float64 input that requires grad against central
 * differences of sum(f * W) for random weights W (so the output's gradient is not all ones). */
static inline void ag_gradcheck(const char *what, ag_fn fn, const void *arg, td_tensor *const *in, int n)
{
    uint64_t seed = 99;
    td_tensor *out;
    TD_CHECK_OK(fn(in, arg, &out));
    TD_CHECK_MSG(td_autograd_requires_grad(out), "%s: the result does not require grad", what);
    td_tensor *w = ag_randn(td_tensor_shape(out), -1, 1, 0, false, &seed);
    for (int i = 0; i < n; i++)
        TD_CHECK_OK(td_autograd_set_grad(in[i], NULL));
    TD_CHECK_OK(td_autograd_backward(out, w, false));
    td_tensor_release(out);
    const double eps = 1e-6;
    for (int i = 0; i < n; i++) {
        if (!td_autograd_requires_grad(in[i]))
            continue;
        td_tensor *g = td_autograd_get_grad(in[i]);
        TD_CHECK_MSG(g, "%s: input %d has no gradient", what, i);
        TD_CHECK_EQ(td_tensor_ndim(g), td_tensor_ndim(in[i]));
        TD_CHECK_EQ(td_tensor_numel(g), td_tensor_numel(in[i]));
        double *p = (double *)td_tensor_data(in[i]);
        for (int64_t k = 0; k < td_tensor_numel(in[i]); k++) {
            double keep = p[k];
            p[k] = keep + eps;
            double up = ag_weighted(fn, arg, in, w);
            p[k] = keep - eps;
            double down = ag_weighted(fn, arg, in, w);
            p[k] = keep;
            double num = (up - down) / (2 * eps), ana = ag_at(g, k);
            TD_CHECK_MSG(fabs(num - ana) <= 1e-6 + 1e-5 * fabs(num),
                         "%s: d/d input %d [%lld]: analytic %.12g, numeric %.12g", what, i, (long long)k, ana, num);
        }
        td_tensor_release(g);
    }
    td_tensor_release(w);
}

#endif
