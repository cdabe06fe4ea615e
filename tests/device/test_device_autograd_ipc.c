/* Autograd metadata of device tensors across processes (spec/multiprocessing.md section J), on sim
 * and cuda under the spawn start method: the seed's test_cuda_variable_sharing,
 * test_cuda_parameter_sharing, the cuda rounds of test_leaf_variable_sharing and
 * test_non_leaf_variable_sharing, and test_integer_parameter_serialization_cuda. A device tensor
 * travels by IPC handle with its requires_grad and its kind (plain or Parameter), without its
 * .grad, hooks or graph; a non-leaf that requires grad is refused at put time. The CPU versions,
 * with fork as well, are tests/mp/test_mp_autograd.c. */
#include <string.h>

#include <tdist/autograd.h>
#include <tdist/mp.h>

#include "base/error.h"
#include "device_util.h"

#include "../support/entry_check.h"

#define QUEUE_WAIT_MS 30000

/* ---- helpers (for children too: they report by status) ------------------------------------ */

/* Whether every element of device tensor t equals expected[i] (expected NULL: equals v). */
static td_status all_equal(td_tensor *t, const float *expected, double v, bool *out)
{
    td_device cpu = {TD_DEVICE_CPU, -1};
    td_tensor *host = NULL, *flat = NULL;
    E_OK(td_tensor_to_device(t, cpu, false, &host));
    td_status st = td_tensor_reshape(host, TD_SHAPE(td_tensor_numel(host)), &flat);
    *out = st == TD_OK;
    for (int64_t i = 0; st == TD_OK && *out && i < td_tensor_numel(flat); i++) {
        double got = 0;
        st = td_tensor_get_f64(flat, &i, &got);
        *out = got == (expected ? (double)expected[i] : v);
    }
    td_tensor_release(flat);
    td_tensor_release(host);
    return st;
}

static td_status sync_device(td_device d)
{
    td_stream *s = NULL; /* borrowed */
    E_OK(td_stream_current(d, &s));
    return td_stream_synchronize(s);
}

/* arange(1, 26, device).view(5, 5) with requires_grad. */
static td_tensor *device_arange(td_device d, bool requires_grad)
{
    td_tensor *flat = NULL, *host = NULL;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT32, 1, 26, 1, &flat));
    TD_CHECK_OK(td_tensor_view(flat, TD_SHAPE(5, 5), &host));
    td_tensor *t = dev_to(host, d);
    td_tensor_release(host);
    td_tensor_release(flat);
    TD_CHECK_OK(td_autograd_set_requires_grad(t, requires_grad));
    return t;
}

static td_status no_op_hook(td_tensor *grad, void *ctx, td_tensor **replace)
{
    (void)grad;
    (void)ctx;
    (void)replace;
    return TD_OK;
}

/* ---- _test_autograd_sharing --------------------------------------------------------------- */

#define CHILD_CHECK(cond)                    \
    do {                                     \
        if (!(cond) && !failed)              \
            failed = "check failed: " #cond; \
    } while (0)

/* autograd_sharing(queue, ready, master_modified, is_parameter, requires_grad), and the parent's
 * hook handle as a second message. */
TD_MP_ENTRY(device_autograd_sharing)
{
    (void)rank;
    (void)result;
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *ready = td_mp_value_event(td_value_at(args, 1));
    td_mp_event *master_modified = td_mp_value_event(td_value_at(args, 2));
    bool is_parameter = td_value_get_bool(td_value_at(args, 3));
    bool requires_grad = td_value_get_bool(td_value_at(args, 4));
    E_CHECK(q && ready && master_modified);
    td_value *vv = NULL, *hv = NULL;
    E_OK(td_mp_queue_get(q, QUEUE_WAIT_MS, &vv));
    td_status st = td_mp_queue_get(q, QUEUE_WAIT_MS, &hv);
    if (st != TD_OK) {
        td_value_release(vv);
        E_OK(st);
    }
    td_mp_event_set(ready);
    st = td_mp_event_wait(master_modified, QUEUE_WAIT_MS);
    td_tensor *var = td_value_get_tensor(vv), *ones = NULL, *grad = NULL;
    const char *failed = var && td_tensor_device(var).type == td_device_default_type() ? NULL : "not a device tensor";
    float expected[25];
    for (int i = 0; i < 25; i++)
        expected[i] = (float)(i + 1);
    expected[0] = 1000;
    bool eq = false;
    if (st == TD_OK && !failed)
        st = all_equal(var, expected, 0, &eq);
    if (st == TD_OK && !failed) {
        CHILD_CHECK(eq); /* the parent's write after the put */
        st = td_tensor_fill(var, 1);
        if (st == TD_OK)
            st = sync_device(td_tensor_device(var));
        grad = td_autograd_get_grad(var);
        CHILD_CHECK(grad == NULL);
        CHILD_CHECK(td_autograd_remove_hook(var, (uint64_t)td_value_get_int(hv)) == TD_ERR_INVALID);
        CHILD_CHECK(td_autograd_is_parameter(var) == is_parameter);
        CHILD_CHECK(td_autograd_requires_grad(var) == requires_grad);
        CHILD_CHECK(td_autograd_is_leaf(var));
    }
    if (st == TD_OK && !failed) { /* var._grad = ones: local only */
        st = td_tensor_full_on(td_tensor_device(var), TD_FLOAT32, TD_SHAPE(5, 5), 1, &ones);
        if (st == TD_OK)
            st = td_autograd_set_grad(var, ones);
    }
    td_tensor_release(grad);
    td_tensor_release(ones);
    td_value_release(hv);
    td_value_release(vv);
    E_OK(st);
    td_value *answer = td_value_string(failed ? failed : "ok");
    st = td_mp_queue_put(q, answer, QUEUE_WAIT_MS);
    td_value_release(answer);
    return st;
}

static void autograd_sharing(td_tensor *var, bool is_parameter)
{
    bool requires_grad = td_autograd_requires_grad(var);
    td_device d = td_tensor_device(var);
    td_mp_queue *q = NULL;
    td_mp_event *ready = NULL, *master_modified = NULL;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    TD_CHECK_OK(td_mp_event_new(&ready));
    TD_CHECK_OK(td_mp_event_new(&master_modified));
    td_value *args = td_value_tuple_of(5, td_mp_queue_value(q), td_mp_event_value(ready),
                                       td_mp_event_value(master_modified), td_value_bool(is_parameter),
                                       td_value_bool(requires_grad));
    td_mp_spawn_opts o = {.entry = "device_autograd_sharing", .args = args, .method = TD_MP_SPAWN, .daemon = true};
    td_mp_context *pc = NULL;
    TD_CHECK_OK(td_mp_spawn(&o, &pc));
    td_value_release(args);

    uint64_t handle = 0;
    if (requires_grad)
        TD_CHECK_OK(td_autograd_register_hook(var, no_op_hook, NULL, NULL, &handle));
    td_tensor *zeros = NULL;
    TD_CHECK_OK(td_tensor_full_on(d, TD_FLOAT32, TD_SHAPE(5, 5), 0, &zeros));
    TD_CHECK_OK(td_autograd_set_grad(var, zeros));
    td_tensor_release(zeros);
    td_value *v = td_value_tensor(var), *hv = td_value_int((int64_t)handle);
    TD_CHECK_OK(td_mp_queue_put(q, v, QUEUE_WAIT_MS));
    TD_CHECK_OK(td_mp_queue_put(q, hv, QUEUE_WAIT_MS));
    td_value_release(hv);
    td_value_release(v);

    if (td_mp_event_wait(ready, QUEUE_WAIT_MS) != TD_OK)
        TD_CHECK_OK(td_mp_join(pc, 1000)); /* the child's error, if it failed */
    td_tensor *row = NULL, *corner = NULL; /* var.data[0, 0] = 1000 */
    TD_CHECK_OK(td_tensor_select(var, 0, 0, &row));
    TD_CHECK_OK(td_tensor_select(row, 0, 0, &corner));
    TD_CHECK_OK(td_tensor_fill(corner, 1000));
    td_tensor_release(corner);
    td_tensor_release(row);
    td_tensor *grad = td_autograd_get_grad(var);
    TD_CHECK(grad);
    TD_CHECK_OK(td_tensor_fill(grad, 4)); /* var.grad.data[:] = 4 */
    TD_CHECK_OK(sync_device(d));          /* the child reads on its own stream */
    td_mp_event_set(master_modified);

    td_value *answer = NULL;
    if (td_mp_queue_get(q, QUEUE_WAIT_MS, &answer) != TD_OK)
        TD_CHECK_OK(td_mp_join(pc, 1000));
    TD_CHECK_STR_EQ(td_value_get_string(answer, NULL), "ok");
    td_value_release(answer);
    bool eq = false;
    TD_CHECK_OK(all_equal(var, NULL, 1, &eq));
    TD_CHECK(eq); /* the child's write */
    TD_CHECK_OK(all_equal(grad, NULL, 4, &eq));
    TD_CHECK(eq); /* the parent's grad, untouched by the child's */
    td_tensor *now = td_autograd_get_grad(var);
    TD_CHECK(now == grad);
    td_tensor_release(now);
    td_tensor_release(grad);
    if (requires_grad)
        TD_CHECK_OK(td_autograd_remove_hook(var, handle));
    TD_CHECK_OK(td_mp_join(pc, 100000));
    TD_CHECK(!td_mp_is_alive(pc, 0));
    td_mp_context_release(pc);
    td_mp_event_release(master_modified);
    td_mp_event_release(ready);
    td_mp_queue_release(q);
}

TD_TEST(test_cuda_variable_sharing, DEV_CASE)
{
    dev_setup(ctx, 1);
    for (int rg = 1; rg >= 0; rg--) {
        td_test_breadcrumb("requires_grad %d", rg);
        td_tensor *var = device_arange(dev(0), rg);
        autograd_sharing(var, false);
        td_tensor_release(var);
    }
    TD_CHECK_EQ(td_mp_ipc_collect(), 0);
    dev_teardown();
}

TD_TEST(test_cuda_parameter_sharing, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_tensor *data = device_arange(dev(0), false), *param = NULL;
    TD_CHECK_OK(td_autograd_parameter(data, true, &param));
    td_tensor_release(data);
    autograd_sharing(param, true);
    td_tensor_release(param);
    TD_CHECK_EQ(td_mp_ipc_collect(), 0);
    dev_teardown();
}

/* ---- test_leaf_variable_sharing (cuda) ---------------------------------------------------- */

TD_MP_ENTRY(device_requires_grad_sharing)
{
    (void)rank;
    (void)result;
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *ready = td_mp_value_event(td_value_at(args, 1));
    E_CHECK(q && ready);
    td_value *v = NULL;
    E_OK(td_mp_queue_get(q, QUEUE_WAIT_MS, &v));
    td_mp_event_set(ready);
    td_tensor *var = td_value_get_tensor(v);
    td_value *answer = td_value_bool(var && td_autograd_requires_grad(var));
    td_value_release(v);
    td_status st = td_mp_queue_put(q, answer, QUEUE_WAIT_MS);
    td_value_release(answer);
    return st;
}

TD_TEST(test_leaf_variable_sharing_cuda, DEV_CASE)
{
    dev_setup(ctx, 1);
    for (int rg = 1; rg >= 0; rg--) {
        td_tensor *var = device_arange(dev(0), rg);
        TD_CHECK(td_autograd_is_leaf(var));
        td_mp_queue *q = NULL;
        td_mp_event *ready = NULL;
        TD_CHECK_OK(td_mp_queue_new(0, &q));
        TD_CHECK_OK(td_mp_event_new(&ready));
        td_value *args = td_value_tuple_of(2, td_mp_queue_value(q), td_mp_event_value(ready));
        td_mp_spawn_opts o = {
            .entry = "device_requires_grad_sharing", .args = args, .method = TD_MP_SPAWN, .daemon = true};
        td_mp_context *pc = NULL;
        TD_CHECK_OK(td_mp_spawn(&o, &pc));
        td_value_release(args);
        td_value *v = td_value_tensor(var), *got = NULL;
        TD_CHECK_OK(td_mp_queue_put(q, v, QUEUE_WAIT_MS));
        td_value_release(v);
        if (td_mp_event_wait(ready, QUEUE_WAIT_MS) != TD_OK)
            TD_CHECK_OK(td_mp_join(pc, 1000));
        TD_CHECK_OK(td_mp_queue_get(q, QUEUE_WAIT_MS, &got));
        TD_CHECK(td_value_kind_of(got) == TD_VAL_BOOL);
        TD_CHECK_EQ(td_value_get_bool(got), rg);
        td_value_release(got);
        TD_CHECK_OK(td_mp_join(pc, 100000));
        td_mp_context_release(pc);
        td_mp_event_release(ready);
        td_mp_queue_release(q);
        td_tensor_release(var);
    }
    TD_CHECK_EQ(td_mp_ipc_collect(), 0);
    dev_teardown();
}

/* ---- test_non_leaf_variable_sharing (cuda) ------------------------------------------------ */

static td_status never_backward(void *fctx, td_tensor *const *grad_outputs, int num_outputs, td_tensor **grad_inputs,
                                int num_inputs)
{
    (void)fctx;
    (void)grad_outputs;
    (void)num_outputs;
    (void)grad_inputs;
    (void)num_inputs;
    return error_fmt(TD_ERR_UNSUPPORTED, "not called");
}

TD_TEST(test_non_leaf_variable_sharing_cuda, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_tensor *var0 = device_arange(dev(0), true), *var = NULL;
    /* var = f(var0) for a recorded function (device tensors have no arithmetic autograd ops). */
    static const td_autograd_function times_two = {.name = "TimesTwoBackward", .backward = never_backward};
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_FLOAT32, TD_SHAPE(5, 5), 2, &var));
    TD_CHECK_OK(td_autograd_function_record(&times_two, NULL, &var0, 1, &var, 1, NULL));
    TD_CHECK(!td_autograd_is_leaf(var) && td_autograd_requires_grad(var));
    td_mp_queue *q = NULL;
    TD_CHECK_OK(td_mp_queue_new(1, &q));
    td_value *v = td_value_tensor(var), *got = NULL;
    TD_CHECK_ERR(td_mp_queue_put(q, v, TD_MP_NO_WAIT), TD_ERR_INVALID,
                 "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not "
                 "support crossing process boundaries.  If you just want to transfer the data, call detach() on "
                 "the tensor before serializing (e.g., putting it on the queue).");
    TD_CHECK(td_mp_queue_empty(q));
    td_tensor *detached = NULL;
    TD_CHECK_OK(td_autograd_detach(var, &detached));
    td_value *dv = td_value_tensor(detached);
    TD_CHECK_OK(td_mp_queue_put(q, dv, TD_MP_NO_WAIT)); /* the refused put took no slot */
    TD_CHECK_OK(td_mp_queue_get(q, 1000, &got));
    td_tensor *t = td_value_get_tensor(got);
    TD_CHECK(t && !td_autograd_requires_grad(t) && td_tensor_device(t).type == dev(0).type);
    /* Received in the process that sent it: the storage it sent (CUDA cannot open its own handles). */
    TD_CHECK(td_tensor_storage(t) == td_tensor_storage(detached));
    td_value_release(got);
    td_value_release(dv);
    td_tensor_release(detached);
    td_value_release(v);
    td_mp_queue_release(q);
    td_tensor_release(var);
    td_tensor_release(var0);
    TD_CHECK_EQ(td_mp_ipc_collect(), 0);
    dev_teardown();
}

/* ---- test_integer_parameter_serialization_cuda -------------------------------------------- */

/* integer_parameter_serialization(iparam): iparam + 1 (on the host: device tensors have no
 * arithmetic ops). */
TD_MP_ENTRY(device_integer_parameter_serialization)
{
    (void)rank;
    (void)result;
    td_tensor *iparam = td_value_get_tensor(args), *host = NULL, *sum = NULL;
    E_CHECK(iparam && td_tensor_dtype(iparam) == TD_INT64 && td_tensor_ndim(iparam) == 0);
    E_CHECK(td_tensor_device(iparam).type == td_device_default_type());
    E_CHECK(td_autograd_is_parameter(iparam) && !td_autograd_requires_grad(iparam));
    E_OK(td_tensor_to_device(iparam, (td_device){TD_DEVICE_CPU, -1}, false, &host));
    td_status st = td_tensor_add_scalar(host, td_scalar_int(1), &sum);
    int64_t value = -1;
    if (st == TD_OK)
        st = td_tensor_get_i64(sum, NULL, &value);
    td_tensor_release(sum);
    td_tensor_release(host);
    E_OK(st);
    E_CHECK(value == 1);
    return TD_OK;
}

TD_TEST(test_integer_parameter_serialization_cuda, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_tensor *zero = NULL, *param = NULL;
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_INT64, TD_SHAPE_SCALAR, 0, &zero));
    TD_CHECK_ERR(td_autograd_parameter(zero, true, &param), TD_ERR_INVALID,
                 "Only Tensors of floating point and complex dtype can require gradients");
    TD_CHECK_OK(td_autograd_parameter(zero, false, &param));
    td_value *args = td_value_tensor(param);
    td_mp_spawn_opts o = {.entry = "device_integer_parameter_serialization", .args = args, .method = TD_MP_SPAWN};
    td_mp_context *pc = NULL;
    TD_CHECK_OK(td_mp_spawn(&o, &pc));
    TD_CHECK_OK(td_mp_join(pc, 100000));
    int code = -1;
    TD_CHECK_OK(td_mp_exitcode(pc, 0, &code));
    TD_CHECK_MSG(code == 0, "Failed to serialize successfully for \"%s\" device!",
                 td_device_type_name(dev(0).type));
    td_mp_context_release(pc);
    td_value_release(args);
    td_tensor_release(param);
    td_tensor_release(zero);
    TD_CHECK_EQ(td_mp_ipc_collect(), 0);
    dev_teardown();
}

int main(int argc, char **argv)
{
    TD_MP_MAIN_PROLOGUE(argc, argv);
    return td_test_main(argc, argv);
}
