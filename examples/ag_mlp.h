/* ag_mlp.h: the examples' MLP (mlp.h: DIM -> H -> H -> CLASSES, ReLU, softmax cross-entropy) built
 * from tdist/autograd.h's ops, for ddp_train (its default, DDP path), the autograd MLP test and
 * bench/autograd: its parameters are leaves that view one flat float32 tensor laid out as mlp.c's
 * model_bind lays out its buffer, so both models start from the same model_init. */
#ifndef TDIST_EXAMPLES_AG_MLP_H
#define TDIST_EXAMPLES_AG_MLP_H

#include <tdist/autograd.h>

enum { AG_MLP_PARAMS = 6 };

typedef struct ag_mlp {
    td_tensor *flat;                    /* the parameters, model_bind's layout */
    td_tensor *param[AG_MLP_PARAMS];    /* w1 [DIM, h], b1 [h], w2 [h, h], b2 [h], w3 [h, C], b3 [C] */
} ag_mlp;

/* Views of flat (retained) as the six parameters, each a leaf requiring grad. */
static inline td_status ag_mlp_bind(ag_mlp *m, td_tensor *flat, int dim, int h, int classes)
{
    td_shape shapes[AG_MLP_PARAMS] = {TD_SHAPE(dim, h), TD_SHAPE(h), TD_SHAPE(h, h),
                                      TD_SHAPE(h),      TD_SHAPE(h, classes), TD_SHAPE(classes)};
    int64_t at = 0;
    m->flat = td_tensor_retain(flat);
    for (int i = 0; i < AG_MLP_PARAMS; i++) {
        td_status st = td_tensor_from_storage(td_tensor_storage(flat), at, TD_FLOAT32, shapes[i], NULL, &m->param[i]);
        if (st != TD_OK)
            return st;
        at += td_shape_numel(&shapes[i]);
        st = td_autograd_set_requires_grad(m->param[i], true);
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

static inline void ag_mlp_free(ag_mlp *m)
{
    for (int i = 0; i < AG_MLP_PARAMS; i++)
        td_tensor_release(m->param[i]);
    td_tensor_release(m->flat);
}

/* The mean cross-entropy loss of a batch: x float32 [B, DIM], y int64 [B]. */
static inline td_status ag_mlp_loss(const ag_mlp *m, td_tensor *x, td_tensor *y, td_tensor **loss)
{
    td_tensor *h1 = NULL, *a1 = NULL, *h2 = NULL, *a2 = NULL, *logits = NULL;
    td_status st = td_autograd_addmm(m->param[1], x, m->param[0], &h1);
    if (st == TD_OK)
        st = td_autograd_relu(h1, &a1);
    if (st == TD_OK)
        st = td_autograd_addmm(m->param[3], a1, m->param[2], &h2);
    if (st == TD_OK)
        st = td_autograd_relu(h2, &a2);
    if (st == TD_OK)
        st = td_autograd_addmm(m->param[5], a2, m->param[4], &logits);
    if (st == TD_OK)
        st = td_autograd_cross_entropy(logits, y, TD_REDUCTION_MEAN, -100, loss);
    td_tensor_release(h1);
    td_tensor_release(a1);
    td_tensor_release(h2);
    td_tensor_release(a2);
    td_tensor_release(logits);
    return st;
}

/* SGD with momentum as ddp_train steps: vel = 0.9 vel + grad; p -= lr vel (vel: the flat
 * parameter count of floats), then the gradients are cleared. */
static inline void ag_mlp_sgd(ag_mlp *m, float *vel, float lr)
{
    float *p = (float *)td_tensor_data(m->flat);
    size_t at = 0;
    for (int i = 0; i < AG_MLP_PARAMS; i++) {
        td_tensor *g = td_autograd_get_grad(m->param[i]);
        size_t n = (size_t)td_tensor_numel(m->param[i]);
        const float *gv = g ? (const float *)td_tensor_data(g) : NULL;
        for (size_t k = 0; k < n; k++) {
            vel[at + k] = 0.9f * vel[at + k] + (gv ? gv[k] : 0.0f);
            p[at + k] -= lr * vel[at + k];
        }
        at += n;
        td_tensor_release(g);
        td_autograd_set_grad(m->param[i], NULL);
    }
}

#endif
