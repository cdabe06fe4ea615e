/* Tensor layouts across a real RPC between worker processes: test_non_cont_tensors sends a
 * narrowed view of a random 5x5 matrix (not contiguous) and its contiguous copy; the callee finds
 * the view still not contiguous, the copy contiguous and the two equal, and returns the view,
 * which reaches the caller still not contiguous and equal. The td_value codec keeps a view's
 * strides for this (docs/protocols.md, "td_value codec"). Workers are "worker<rank>". */
#include <stdio.h>
#include <string.h>

#include <tdist/rpc.h>
#include <tdist/testing.h>

#include "rpc_util.h"

/* non_cont_test(t_view, t_cont) from the seed: raises as it does when a layout or the values did
 * not survive the trip, else returns t_view. */
static td_status fn_non_cont_test(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[2];
    if (td_rpc_bind("non_cont_test", "t_view,t_cont", args, kwargs, p) != TD_OK)
        return TD_ERR_REMOTE;
    td_tensor *view = td_value_get_tensor(p[0]), *cont = td_value_get_tensor(p[1]);
    if (!view || !cont)
        return td_rpc_raise("TypeError", "non_cont_test() takes two tensors");
    if (td_tensor_is_contiguous(view))
        return td_rpc_raise("Exception", "t_view is contiguous!");
    if (!td_tensor_is_contiguous(cont))
        return td_rpc_raise("Exception", "t_cont is not contiguous!");
    if (!td_tensor_equal(view, cont))
        return td_rpc_raise("Exception", "t_view is not equal to t_cont!");
    *result = td_value_tensor(view);
    return TD_OK;
}

/* torch.rand(5, 5) in spirit: values in [0, 1) from a fixed per-rank LCG, so a failure repeats. */
static td_tensor *rand_5x5(uint64_t seed)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_empty(TD_FLOAT32, TD_SHAPE(5, 5), &t));
    float *p = td_tensor_data(t);
    for (int i = 0; i < 25; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)(seed >> 40) / (float)(1u << 24);
    }
    return t;
}

TD_TEST(non_cont_tensors, .world_size = 2, .timeout_s = 60)
{
    const rpc_test_function fns[] = {{"non_cont_test", fn_non_cont_test, NULL, NULL}};
    rpc_test_register(fns, 1);
    rpc_test_init(ctx, NULL);

    if (ctx->rank == 0) {
        td_tensor *t = rand_5x5(12345), *view = NULL, *cont = NULL;
        TD_CHECK_OK(td_tensor_narrow(t, 1, 2, 2, &view));
        TD_CHECK(!td_tensor_is_contiguous(view));
        TD_CHECK_OK(td_tensor_contiguous(view, &cont));
        TD_CHECK(td_tensor_is_contiguous(cont));
        TD_CHECK(td_tensor_equal(view, cont));

        td_value *args = td_value_tuple_of(2, td_value_tensor(view), td_value_tensor(cont)), *r = NULL;
        td_status st = td_rpc_sync(NULL, td_rpc_to_name("worker1"), "non_cont_test", args, NULL,
                                   TD_RPC_DEFAULT_TIMEOUT, &r);
        TD_CHECK_MSG(st == TD_OK, "non_cont_test failed: %s", td_last_error());
        td_tensor *ret = r ? td_value_get_tensor(r) : NULL;
        TD_CHECK(ret != NULL);
        if (ret) {
            TD_CHECK(td_tensor_equal(view, ret));
            TD_CHECK(!td_tensor_is_contiguous(ret));
            /* The layout itself came back: the view's strides, over just the span it covers. */
            TD_CHECK_EQ(td_tensor_ndim(ret), 2);
            TD_CHECK(memcmp(td_tensor_strides(ret), td_tensor_strides(view), 2 * sizeof(int64_t)) == 0);
        }
        td_value_release(r);
        td_value_release(args);
        td_tensor_release(cont);
        td_tensor_release(view);
        td_tensor_release(t);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

TD_TEST_MAIN()
