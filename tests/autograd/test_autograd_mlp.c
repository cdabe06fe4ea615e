/* The examples' MLP (examples/mlp.c: 16-96-96-4, batches of 32) trained through autograd beside
 * its hand-written backward from the same initialisation and data: the losses of every step, the
 * gradients and the parameters after several steps of SGD with momentum agree to 1e-5. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>

#include "ag_mlp.h"
#include "mlp.h"

enum { HIDDEN = 96, BATCH = 32, STEPS = 8 };

TD_TEST(mlp_trained_through_autograd_matches_the_hand_written_backward)
{
    (void)ctx;
    int n = BATCH * STEPS;
    float *x = malloc(sizeof(float) * DIM * (size_t)n);
    int *y = malloc(sizeof(int) * (size_t)n);
    make_data(1234, n, x, y);
    size_t np = model_size(HIDDEN);
    float *params = calloc(np, sizeof(float)), *grads = calloc(np, sizeof(float));
    float *vel_ref = calloc(np, sizeof(float)), *vel_ag = calloc(np, sizeof(float));
    float *scratch = malloc(sizeof(float) * HIDDEN * 4);
    model m, g;
    model_bind(&m, params, HIDDEN);
    model_bind(&g, grads, HIDDEN);
    model_init(&m, 1234);

    td_tensor *flat;
    TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT32, TD_SHAPE((int64_t)np), params, &flat));
    ag_mlp net;
    TD_CHECK_OK(ag_mlp_bind(&net, flat, DIM, HIDDEN, CLASSES));
    const float lr = 0.05f;
    for (int step = 0; step < STEPS; step++) {
        const float *xb = x + (size_t)step * BATCH * DIM;
        const int *yb = y + (size_t)step * BATCH;
        /* hand-written */
        memset(grads, 0, sizeof(float) * np);
        double loss_ref = 0;
        for (int b = 0; b < BATCH; b++)
            loss_ref += backward(&m, &g, xb + (size_t)b * DIM, yb[b], 1.0f / BATCH, scratch, scratch + HIDDEN,
                                 scratch + 2 * HIDDEN, scratch + 3 * HIDDEN);
        loss_ref /= BATCH;
        /* autograd */
        int64_t labels[BATCH];
        for (int b = 0; b < BATCH; b++)
            labels[b] = yb[b];
        td_tensor *xt, *yt, *loss;
        TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT32, TD_SHAPE(BATCH, DIM), xb, &xt));
        TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(BATCH), labels, &yt));
        TD_CHECK_OK(ag_mlp_loss(&net, xt, yt, &loss));
        double loss_ag;
        TD_CHECK_OK(td_tensor_get_f64(loss, NULL, &loss_ag));
        TD_CHECK_MSG(fabs(loss_ag - loss_ref) <= 1e-5, "step %d: autograd loss %.9f, hand-written %.9f", step,
                     loss_ag, loss_ref);
        TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
        size_t at = 0;
        for (int i = 0; i < AG_MLP_PARAMS; i++) {
            td_tensor *gt = td_autograd_get_grad(net.param[i]);
            TD_CHECK(gt != NULL);
            const float *gv = td_tensor_data(gt);
            for (int64_t k = 0; k < td_tensor_numel(gt); k++)
                TD_CHECK_MSG(fabsf(gv[k] - grads[at + (size_t)k]) <= 1e-5f, "step %d param %d [%lld]: %g vs %g", step,
                             i, (long long)k, gv[k], grads[at + (size_t)k]);
            at += (size_t)td_tensor_numel(gt);
            td_tensor_release(gt);
        }
        TD_CHECK_EQ(at, np);
        td_tensor_release(loss);
        td_tensor_release(xt);
        td_tensor_release(yt);
        /* the same SGD step on both */
        for (size_t i = 0; i < np; i++) {
            vel_ref[i] = 0.9f * vel_ref[i] + grads[i];
            params[i] -= lr * vel_ref[i];
        }
        ag_mlp_sgd(&net, vel_ag, lr);
    }
    const float *p_ag = td_tensor_data(flat);
    for (size_t i = 0; i < np; i++)
        TD_CHECK_MSG(fabsf(p_ag[i] - params[i]) <= 1e-5f, "parameter %zu: %g vs %g", i, p_ag[i], params[i]);
    ag_mlp_free(&net);
    td_tensor_release(flat);
    free(x);
    free(y);
    free(params);
    free(grads);
    free(vel_ref);
    free(vel_ag);
    free(scratch);
}

TD_TEST_MAIN()
