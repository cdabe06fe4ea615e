/* Autograd metadata and Parameters across processes (spec/multiprocessing.md section J; the seed's
 * test_variable_sharing, test_parameter_sharing, test_leaf_variable_sharing,
 * test_non_leaf_variable_sharing and _test_integer_parameter_serialization), with real processes:
 * a tensor sent through a queue or in a spawned process's arguments keeps its shared data (writes
 * seen both ways), its requires_grad and its kind (plain or Parameter), and loses its .grad, hooks
 * and graph; a non-leaf that requires grad is refused at put time with PyTorch's message and the
 * queue is left as it was; an int64 Parameter without requires_grad travels, one that requires grad
 * cannot be made. The decoder's side of the flags is checked on forged messages. Every case runs
 * inside the mp leak checker. */
#include <string.h>

#include <tdist/autograd.h>

#include "base/le.h"
#include "mp/message.h"
#include "mp_util.h"

#define NON_LEAF_MESSAGE                                                                                      \
    "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not support "   \
    "crossing process boundaries.  If you just want to transfer the data, call detach() on the tensor before " \
    "serializing (e.g., putting it on the queue)."

/* ---- helpers ------------------------------------------------------------------------------ */

/* arange(1, 26).view(5, 5), float32, as a leaf requiring grad or not. */
static td_status arange_5x5(bool requires_grad, td_tensor **out)
{
    td_tensor *flat;
    TD_TRY(td_tensor_arange(TD_FLOAT32, 1, 26, 1, &flat));
    td_status st = td_tensor_view(flat, TD_SHAPE(5, 5), out);
    td_tensor_release(flat);
    TD_TRY(st);
    return td_autograd_set_requires_grad(*out, requires_grad);
}

/* Whether t's .grad exists and every element equals v. */
static bool grad_all_equal(const td_tensor *t, double v)
{
    td_tensor *g = td_autograd_get_grad(t);
    bool ok = g && mpt_all_equal(g, v);
    td_tensor_release(g);
    return ok;
}

static bool has_grad(const td_tensor *t)
{
    td_tensor *g = td_autograd_get_grad(t);
    td_tensor_release(g);
    return g != NULL;
}

/* A hook that replaces the gradient by 7s: were it to travel, the child's backward would see 7s. */
static td_status sevens_hook(td_tensor *grad, void *ctx, td_tensor **replace)
{
    (void)ctx;
    return td_tensor_full(td_tensor_dtype(grad), td_tensor_shape(grad), 7, replace);
}

static td_mp_context *start(const char *entry, td_value *args, td_mp_start_method m, td_mp_leak_checker *lc)
{
    td_mp_context *ctx = NULL;
    td_mp_spawn_opts o = {.entry = entry, .args = args, .nprocs = 1, .method = m, .daemon = true};
    TD_CHECK_OK(td_mp_spawn(&o, &ctx));
    if (lc)
        td_mp_leak_checker_track(lc, td_mp_context_pid(ctx, 0));
    return ctx;
}

/* ---- _test_autograd_sharing -------------------------------------------------------------- */

/* The first check that fails, as the child's answer ("ok" when none). */
#define CHILD_CHECK(cond)                \
    do {                                 \
        if (!(cond) && !failed)          \
            failed = "check failed: " #cond; \
    } while (0)

/* autograd_sharing(queue, ready, master_modified, is_parameter, requires_grad): the seed's child,
 * which also gets the parent's hook handle (a second message) to show the hook did not come, and
 * sets its own .grad through a backward when var requires grad (the received flag at work). */
TD_MP_ENTRY(autograd_sharing)
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
    E_OK(td_mp_queue_get(q, 30000, &vv));
    td_status st = td_mp_queue_get(q, 30000, &hv);
    if (st != TD_OK) {
        td_value_release(vv);
        E_OK(st);
    }
    td_mp_event_set(ready);
    st = td_mp_event_wait(master_modified, 30000);
    td_tensor *var = td_value_get_tensor(vv), *expected = NULL, *ones = NULL, *sum = NULL;
    const char *failed = NULL;
    if (st == TD_OK)
        st = arange_5x5(false, &expected);
    if (st == TD_OK)
        st = td_tensor_set_f64(expected, (int64_t[]){0, 0}, 1000);
    if (st == TD_OK && var) {
        CHILD_CHECK(td_tensor_equal(var, expected)); /* the parent's write after the put */
        st = td_tensor_fill(var, 1);                 /* var.data[:] = 1, for the parent to see */
        CHILD_CHECK(!has_grad(var));
        CHILD_CHECK(td_autograd_remove_hook(var, (uint64_t)td_value_get_int(hv)) == TD_ERR_INVALID);
        CHILD_CHECK(td_autograd_is_parameter(var) == is_parameter);
        CHILD_CHECK(td_autograd_requires_grad(var) == requires_grad);
        CHILD_CHECK(td_autograd_is_leaf(var) && td_autograd_grad_fn(var) == NULL);
    } else if (st == TD_OK) {
        failed = "the message is not a tensor";
    }
    /* The child's own .grad: ones, from a backward when var requires grad (no hook of the
     * parent's turns it into 7s), else assigned; it must not reach the parent. */
    if (st == TD_OK && !failed && requires_grad) {
        st = td_autograd_sum(var, &sum);
        if (st == TD_OK)
            st = td_autograd_backward(sum, NULL, false);
    } else if (st == TD_OK && !failed) {
        st = td_tensor_ones(TD_FLOAT32, TD_SHAPE(5, 5), &ones);
        if (st == TD_OK)
            st = td_autograd_set_grad(var, ones);
    }
    if (st == TD_OK && !failed)
        CHILD_CHECK(grad_all_equal(var, 1));
    td_tensor_release(sum);
    td_tensor_release(ones);
    td_tensor_release(expected);
    td_value_release(hv);
    td_value_release(vv);
    E_OK(st);
    td_value *answer = td_value_string(failed ? failed : "ok");
    st = td_mp_queue_put(q, answer, 0);
    td_value_release(answer);
    return st;
}

/* The parent of _test_autograd_sharing, var a leaf (a Parameter when is_parameter). */
static void autograd_sharing(td_tensor *var, bool is_parameter, td_mp_start_method m, td_mp_leak_checker *lc)
{
    bool requires_grad = td_autograd_requires_grad(var);
    td_mp_queue *q;
    td_mp_event *ready, *master_modified;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    TD_CHECK_OK(td_mp_event_new(&ready));
    TD_CHECK_OK(td_mp_event_new(&master_modified));
    td_value *args = td_value_tuple_of(5, td_mp_queue_value(q), td_mp_event_value(ready),
                                       td_mp_event_value(master_modified), td_value_bool(is_parameter),
                                       td_value_bool(requires_grad));
    td_mp_context *ctx = start("autograd_sharing", args, m, lc); /* the child starts first */
    td_value_release(args);

    uint64_t handle = 0;
    if (requires_grad)
        TD_CHECK_OK(td_autograd_register_hook(var, sevens_hook, NULL, NULL, &handle));
    td_tensor *zeros;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(5, 5), &zeros));
    TD_CHECK_OK(td_autograd_set_grad(var, zeros));
    td_tensor_release(zeros);
    td_value *v = td_value_tensor(var), *hv = td_value_int((int64_t)handle);
    TD_CHECK_OK(td_mp_queue_put(q, v, 0));
    TD_CHECK_OK(td_mp_queue_put(q, hv, 0));
    td_value_release(hv);
    td_value_release(v);

    TD_CHECK_OK(td_mp_event_wait(ready, 30000));
    TD_CHECK_OK(td_tensor_set_f64(var, (int64_t[]){0, 0}, 1000)); /* var.data[0, 0] = 1000 */
    td_tensor *grad = td_autograd_get_grad(var);
    TD_CHECK(grad);
    TD_CHECK_OK(td_tensor_fill(grad, 4)); /* var.grad.data[:] = 4 */
    td_tensor_release(grad);
    td_mp_event_set(master_modified);

    td_value *answer;
    TD_CHECK_OK(td_mp_queue_get(q, 30000, &answer));
    TD_CHECK_STR_EQ(td_value_get_string(answer, NULL), "ok"); /* worker_ok */
    td_value_release(answer);
    TD_CHECK(mpt_all_equal(var, 1));  /* the child's write */
    TD_CHECK(grad_all_equal(var, 4)); /* the child's grad stayed there */
    TD_CHECK(td_autograd_is_parameter(var) == is_parameter);
    TD_CHECK(td_autograd_requires_grad(var) == requires_grad);
    if (requires_grad)
        TD_CHECK_OK(td_autograd_remove_hook(var, handle)); /* the parent's hook is still its own */
    TD_CHECK_OK(td_mp_join(ctx, 100000));
    TD_CHECK(!td_mp_is_alive(ctx, 0));
    int code = -1;
    TD_CHECK_OK(td_mp_exitcode(ctx, 0, &code));
    TD_CHECK_EQ(code, 0);
    td_mp_context_release(ctx);
    td_mp_event_release(master_modified);
    td_mp_event_release(ready);
    td_mp_queue_release(q);
}

/* test_variable_sharing: requires_grad True and False. */
static void variable_sharing(td_mp_start_method m)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    for (int rg = 1; rg >= 0; rg--) {
        td_test_breadcrumb("requires_grad %d", rg);
        td_tensor *var;
        TD_CHECK_OK(arange_5x5(rg, &var));
        autograd_sharing(var, false, m, lc);
        td_tensor_release(var);
    }
    mpt_lc_end(lc);
}

/* test_parameter_sharing: Parameter(arange(1, 26).view(5, 5)), which requires grad. */
static void parameter_sharing(td_mp_start_method m)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_tensor *data, *param;
    TD_CHECK_OK(arange_5x5(false, &data));
    TD_CHECK_OK(td_autograd_parameter(data, true, &param));
    TD_CHECK(td_autograd_is_parameter(param) && td_autograd_requires_grad(param) && td_autograd_is_leaf(param));
    TD_CHECK(!td_autograd_is_parameter(data));
    td_tensor_release(data);
    autograd_sharing(param, true, m, lc);
    td_tensor_release(param);
    mpt_lc_end(lc);
}

TD_TEST(variable_sharing, .timeout_s = 120) { variable_sharing(TD_MP_FORK); }
TD_TEST(variable_sharing_spawn, .timeout_s = 120) { variable_sharing(TD_MP_SPAWN); }
TD_TEST(parameter_sharing, .timeout_s = 120) { parameter_sharing(TD_MP_FORK); }
TD_TEST(parameter_sharing_spawn, .timeout_s = 120) { parameter_sharing(TD_MP_SPAWN); }

/* ---- test_leaf_variable_sharing ----------------------------------------------------------- */

/* requires_grad_variable_sharing(queue, ready): var = queue.get(); ready.set();
 * queue.put(var.requires_grad) */
TD_MP_ENTRY(requires_grad_variable_sharing)
{
    (void)rank;
    (void)result;
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *ready = td_mp_value_event(td_value_at(args, 1));
    E_CHECK(q && ready);
    td_value *v;
    E_OK(td_mp_queue_get(q, 30000, &v));
    td_mp_event_set(ready);
    td_tensor *var = td_value_get_tensor(v);
    td_value *answer = td_value_bool(var && td_autograd_requires_grad(var));
    td_value_release(v);
    td_status st = td_mp_queue_put(q, answer, 0);
    td_value_release(answer);
    return st;
}

TD_TEST(leaf_variable_sharing, .timeout_s = 120)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    for (int m = TD_MP_FORK; m <= TD_MP_SPAWN; m++) {
        for (int rg = 1; rg >= 0; rg--) {
            td_test_breadcrumb("%s, requires_grad %d", td_mp_start_method_name((td_mp_start_method)m), rg);
            td_tensor *var;
            TD_CHECK_OK(arange_5x5(rg, &var));
            TD_CHECK(td_autograd_is_leaf(var));
            td_mp_queue *q;
            td_mp_event *ready;
            TD_CHECK_OK(td_mp_queue_new(0, &q));
            TD_CHECK_OK(td_mp_event_new(&ready));
            td_value *args = td_value_tuple_of(2, td_mp_queue_value(q), td_mp_event_value(ready));
            td_mp_context *pc = start("requires_grad_variable_sharing", args, (td_mp_start_method)m, lc);
            td_value_release(args);
            td_value *v = td_value_tensor(var), *got;
            TD_CHECK_OK(td_mp_queue_put(q, v, 0));
            td_value_release(v);
            TD_CHECK_OK(td_mp_event_wait(ready, 30000));
            TD_CHECK_OK(td_mp_queue_get(q, 30000, &got)); /* on the same queue */
            TD_CHECK(td_value_kind_of(got) == TD_VAL_BOOL);
            TD_CHECK_EQ(td_value_get_bool(got), rg);
            td_value_release(got);
            TD_CHECK_OK(td_mp_join(pc, 100000));
            td_mp_context_release(pc);
            td_mp_event_release(ready);
            td_mp_queue_release(q);
            td_tensor_release(var);
        }
    }
    mpt_lc_end(lc);
}

/* Within one process: a new td_tensor on the same storage, with the flags and nothing else. */
TD_TEST(flags_round_trip)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_mp_queue *q;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    td_tensor *plain, *leaf, *data, *param, *frozen, *ones;
    TD_CHECK_OK(arange_5x5(false, &plain));
    TD_CHECK_OK(arange_5x5(true, &leaf));
    TD_CHECK_OK(arange_5x5(false, &data));
    TD_CHECK_OK(td_autograd_parameter(data, true, &param));
    TD_CHECK_OK(td_autograd_parameter(data, false, &frozen)); /* requires_grad=False */
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(5, 5), &ones));
    TD_CHECK_OK(td_autograd_set_grad(leaf, ones));
    TD_CHECK_OK(td_autograd_set_grad(param, ones));
    td_value *v = td_value_list_new(), *got;
    td_value_list_append(v, td_value_tensor(plain));
    td_value_list_append(v, td_value_tensor(leaf));
    td_value_list_append(v, td_value_tensor(param));
    td_value_list_append(v, td_value_tensor(frozen));
    td_value_list_append(v, td_value_tensor(param)); /* the same object twice: one object back */
    TD_CHECK_OK(td_mp_queue_put(q, v, 0));
    TD_CHECK_OK(td_mp_queue_get(q, 1000, &got));
    TD_CHECK_EQ(td_value_len(got), 5);
    td_tensor *sent[4] = {plain, leaf, param, frozen};
    for (size_t i = 0; i < 4; i++) {
        td_tensor *t = td_value_get_tensor(td_value_at(got, i));
        TD_CHECK(t && t != sent[i]);
        TD_CHECK(td_tensor_storage(t) == td_tensor_storage(sent[i]));
        TD_CHECK(td_tensor_equal(t, sent[i]));
        TD_CHECK_EQ(td_autograd_requires_grad(t), td_autograd_requires_grad(sent[i]));
        TD_CHECK_EQ(td_autograd_is_parameter(t), td_autograd_is_parameter(sent[i]));
        TD_CHECK(td_autograd_is_leaf(t));
        TD_CHECK(!has_grad(t)); /* .grad stays behind */
    }
    TD_CHECK(td_value_get_tensor(td_value_at(got, 4)) == td_value_get_tensor(td_value_at(got, 2)));
    /* The received leaf works as one: a backward fills its own .grad, not the sender's. */
    td_tensor *leaf2 = td_value_get_tensor(td_value_at(got, 1)), *sum;
    TD_CHECK_OK(td_autograd_mul_scalar(leaf2, 3, &sum));
    td_tensor *loss;
    TD_CHECK_OK(td_autograd_sum(sum, &loss));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    TD_CHECK(grad_all_equal(leaf2, 3));
    TD_CHECK(grad_all_equal(leaf, 1));
    td_tensor_release(loss);
    td_tensor_release(sum);
    /* A Parameter's views, detach and op results are plain tensors; requires_grad_ keeps the kind. */
    td_tensor *view, *detached;
    TD_CHECK_OK(td_tensor_view(param, TD_SHAPE(25), &view));
    TD_CHECK_OK(td_autograd_detach(param, &detached));
    TD_CHECK(!td_autograd_is_parameter(view) && !td_autograd_is_parameter(detached));
    TD_CHECK_OK(td_autograd_set_requires_grad(param, false));
    TD_CHECK(td_autograd_is_parameter(param) && !td_autograd_requires_grad(param));
    td_tensor_release(detached);
    td_tensor_release(view);
    td_value_release(got);
    td_value_release(v);
    td_tensor_release(ones);
    td_tensor_release(frozen);
    td_tensor_release(param);
    td_tensor_release(data);
    td_tensor_release(leaf);
    td_tensor_release(plain);
    td_mp_queue_release(q);
    mpt_lc_end(lc);
}

/* ---- test_non_leaf_variable_sharing ------------------------------------------------------ */

static void non_leaf_sharing(td_mp_strategy s)
{
    mpt_set_strategy(s);
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_tensor *var0, *var;
    TD_CHECK_OK(arange_5x5(true, &var0));
    TD_CHECK_OK(td_autograd_mul_scalar(var0, 2, &var)); /* var = var0 * 2 */
    TD_CHECK(!td_autograd_is_leaf(var) && td_autograd_requires_grad(var));
    /* A bounded queue shows that a refused put takes no slot. */
    td_mp_queue *q;
    TD_CHECK_OK(td_mp_queue_new(1, &q));
    td_value *v = td_value_tensor(var);
    TD_CHECK_ERR(td_mp_queue_put(q, v, TD_MP_NO_WAIT), TD_ERR_INVALID, NON_LEAF_MESSAGE);
    TD_CHECK_CONTAINS(td_last_error(), "requires_grad");
    td_value *inner = td_value_list_new();
    td_value_list_append(inner, td_value_tensor(var));
    td_value *nested = td_value_tuple_of(2, td_value_tensor(var0), inner); /* found at any depth */
    TD_CHECK_ERR(td_mp_queue_put(q, nested, TD_MP_NO_WAIT), TD_ERR_INVALID, NON_LEAF_MESSAGE);
    TD_CHECK(td_mp_queue_empty(q));
    TD_CHECK_EQ(td_mp_queue_size(q), 0);
    /* Nor can it be a spawned process's argument: no process starts. */
    td_mp_context *ctx = NULL;
    td_mp_spawn_opts o = {.entry = "requires_grad_variable_sharing", .args = v, .method = TD_MP_SPAWN};
    TD_CHECK_ERR(td_mp_spawn(&o, &ctx), TD_ERR_INVALID, NON_LEAF_MESSAGE);
    TD_CHECK(ctx == NULL);
    /* The queue works on: detach() sends the data. */
    td_tensor *detached;
    TD_CHECK_OK(td_autograd_detach(var, &detached));
    td_value *dv = td_value_tensor(detached), *got;
    TD_CHECK_OK(td_mp_queue_put(q, dv, TD_MP_NO_WAIT));
    TD_CHECK(td_mp_queue_full(q));
    TD_CHECK_OK(td_mp_queue_get(q, 1000, &got));
    td_tensor *t = td_value_get_tensor(got);
    TD_CHECK(t && td_tensor_equal(t, var) && !td_autograd_requires_grad(t) && td_autograd_is_leaf(t));
    td_value_release(got);
    td_value_release(dv);
    td_tensor_release(detached);
    /* Without grad mode, var0 * 2 is a leaf that does not require grad, and travels. */
    td_tensor *plain = NULL;
    TD_NO_GRAD { TD_CHECK_OK(td_autograd_mul_scalar(var0, 2, &plain)); }
    TD_CHECK(td_autograd_is_leaf(plain) && !td_autograd_requires_grad(plain));
    td_value *pv = td_value_tensor(plain);
    TD_CHECK_OK(td_mp_queue_put(q, pv, TD_MP_NO_WAIT));
    TD_CHECK_OK(td_mp_queue_get(q, 1000, &got));
    TD_CHECK(td_value_equal(got, pv));
    td_value_release(got);
    td_value_release(pv);
    td_tensor_release(plain);
    td_value_release(nested);
    td_value_release(v);
    td_mp_queue_release(q);
    td_tensor_release(var);
    td_tensor_release(var0);
    mpt_lc_end(lc);
}

TD_TEST(non_leaf_variable_sharing) { non_leaf_sharing(TD_MP_FILE_DESCRIPTOR); }
TD_TEST(fs_non_leaf_variable_sharing, .timeout_s = 120) { non_leaf_sharing(TD_MP_FILE_SYSTEM); }

/* ---- _test_integer_parameter_serialization ----------------------------------------------- */

/* integer_parameter_serialization(iparam): iparam + 1 */
TD_MP_ENTRY(integer_parameter_serialization)
{
    (void)rank;
    (void)result;
    td_tensor *iparam = td_value_get_tensor(args), *sum;
    E_CHECK(iparam && td_tensor_dtype(iparam) == TD_INT64 && td_tensor_ndim(iparam) == 0);
    E_CHECK(td_autograd_is_parameter(iparam) && !td_autograd_requires_grad(iparam));
    E_OK(td_tensor_add_scalar(iparam, td_scalar_int(1), &sum));
    int64_t value = -1;
    td_status st = td_tensor_get_i64(sum, NULL, &value);
    td_tensor_release(sum);
    E_OK(st);
    E_CHECK(value == 1);
    return TD_OK;
}

TD_TEST(integer_parameter_serialization, .timeout_s = 120)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_tensor *zero, *param = NULL, *boolean;
    TD_CHECK_OK(td_tensor_zeros(TD_INT64, TD_SHAPE_SCALAR, &zero));
    /* Integer tensors cannot require grad, whichever way it is asked. */
    TD_CHECK_ERR(td_autograd_parameter(zero, true, &param), TD_ERR_INVALID,
                 "Only Tensors of floating point and complex dtype can require gradients");
    TD_CHECK(param == NULL);
    TD_CHECK_ERR(td_autograd_set_requires_grad(zero, true), TD_ERR_INVALID,
                 "only Tensors of floating point and complex dtype can require gradients");
    TD_CHECK_OK(td_tensor_zeros(TD_BOOL, TD_SHAPE(2), &boolean));
    TD_CHECK_ERR(td_autograd_parameter(boolean, true, &param), TD_ERR_INVALID, "floating point and complex");
    td_tensor_release(boolean);
    /* Parameter(tensor(0, dtype=int64), requires_grad=False) */
    TD_CHECK_OK(td_autograd_parameter(zero, false, &param));
    TD_CHECK(td_autograd_is_parameter(param) && !td_autograd_requires_grad(param));
    TD_CHECK_ERR(td_autograd_set_requires_grad(param, true), TD_ERR_INVALID, "floating point and complex");
    TD_CHECK(td_autograd_is_parameter(param) && !td_autograd_requires_grad(param));
    /* As a spawned process's argument (the seed), and forked. */
    td_value *args = td_value_tensor(param);
    for (int m = TD_MP_SPAWN; m >= TD_MP_FORK; m--) {
        td_mp_context *pc = start("integer_parameter_serialization", args, (td_mp_start_method)m, lc);
        TD_CHECK_OK(td_mp_join(pc, 100000));
        int code = -1;
        TD_CHECK_OK(td_mp_exitcode(pc, 0, &code));
        TD_CHECK_MSG(code == 0, "Failed to serialize successfully for \"cpu\" device! (%s start)",
                     td_mp_start_method_name((td_mp_start_method)m));
        td_mp_context_release(pc);
    }
    /* And through a queue. */
    td_mp_queue *q;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    td_value *got;
    TD_CHECK_OK(td_mp_queue_put(q, args, 0));
    TD_CHECK_OK(td_mp_queue_get(q, 1000, &got));
    td_tensor *t = td_value_get_tensor(got);
    TD_CHECK(t && td_autograd_is_parameter(t) && !td_autograd_requires_grad(t) && td_tensor_dtype(t) == TD_INT64);
    td_value_release(got);
    td_mp_queue_release(q);
    td_value_release(args);
    td_tensor_release(param);
    td_tensor_release(zero);
    mpt_lc_end(lc);
}

/* ---- the decoder's side: forged messages -------------------------------------------------- */

/* Decodes a message whose only tensor entry is (0, 0, dtype, (0,), (1,)) plus `flags` (a 6th field
 * unless NULL; taken) over an empty storage: no fd, nothing mapped. */
static td_status decode_forged(td_dtype dtype, td_value *flags, td_value **out)
{
    td_value *entry = flags ? td_value_tuple_of(6, td_value_int(0), td_value_int(0), td_value_int(dtype),
                                                td_value_tuple_of(1, td_value_int(0)),
                                                td_value_tuple_of(1, td_value_int(1)), flags)
                            : td_value_tuple_of(5, td_value_int(0), td_value_int(0), td_value_int(dtype),
                                                td_value_tuple_of(1, td_value_int(0)),
                                                td_value_tuple_of(1, td_value_int(1)));
    td_value *env = td_value_tuple_of(4, td_value_tuple_of(1, td_value_tuple_of(2, td_value_int(0), td_value_int(0))),
                                      td_value_tuple_of(1, entry), td_value_list_new(),
                                      td_value_record_of(TD_REC_MP_TENSOR, 1, td_value_int(0)));
    void *body = NULL;
    size_t len = 0;
    td_status st = td_value_encode_bytes(env, &body, &len);
    td_value_release(env);
    if (st != TD_OK)
        return st;
    uint8_t *msg = calloc(1, TD_MP_MSG_HEADER + len);
    le_put(msg, TD_MP_MSG_MAGIC, 4);
    le_put(msg + 4, TD_MP_MSG_VERSION, 2);
    le_put(msg + 16, len, 8);
    memcpy(msg + TD_MP_MSG_HEADER, body, len);
    free(body);
    int fds[1];
    st = mp_msg_decode_bytes(msg, TD_MP_MSG_HEADER + len, fds, 0, mp_object_classes, out);
    free(msg);
    return st;
}

TD_TEST(decode_flags)
{
    struct {
        td_dtype dtype;
        int64_t flags; /* -100: no sixth field */
        bool requires_grad, parameter;
    } ok[] = {
        {TD_FLOAT32, -100, false, false}, {TD_FLOAT32, 1, true, false}, {TD_FLOAT64, 2, false, true},
        {TD_FLOAT32, 3, true, true},      {TD_INT64, 2, false, true},   {TD_COMPLEX64, 1, true, false},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        td_test_breadcrumb("valid entry %zu", i);
        td_value *v = NULL;
        TD_CHECK_OK(decode_forged(ok[i].dtype, ok[i].flags == -100 ? NULL : td_value_int(ok[i].flags), &v));
        td_tensor *t = td_value_get_tensor(v);
        TD_CHECK(t && td_tensor_dtype(t) == ok[i].dtype);
        TD_CHECK_EQ(td_autograd_requires_grad(t), ok[i].requires_grad);
        TD_CHECK_EQ(td_autograd_is_parameter(t), ok[i].parameter);
        TD_CHECK(td_autograd_is_leaf(t));
        td_value_release(v);
    }
    td_value *v = NULL;
    /* An integer or bool tensor that requires grad is a state no sender can be in. */
    TD_CHECK_ERR(decode_forged(TD_INT64, td_value_int(1), &v), TD_ERR_INVALID, "requires grad");
    TD_CHECK_ERR(decode_forged(TD_BOOL, td_value_int(3), &v), TD_ERR_INVALID, "requires grad");
    int64_t bad_flags[] = {0, 4, 8, 7, -1, INT64_MAX};
    for (size_t i = 0; i < sizeof bad_flags / sizeof bad_flags[0]; i++)
        TD_CHECK_ERR(decode_forged(TD_FLOAT32, td_value_int(bad_flags[i]), &v), TD_ERR_INVALID, "autograd flags");
    TD_CHECK_ERR(decode_forged(TD_FLOAT32, td_value_string("1"), &v), TD_ERR_INVALID, "autograd flags");
    TD_CHECK(v == NULL);
}
