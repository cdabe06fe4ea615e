/* Subtests: c10d's run_subtests in C. td_test_run_subtests runs a test function once per
 * combination of a few named dimensions (the cartesian product, in itertools.product's order: the
 * last dimension varies fastest), inside the ranks of the running case, with a barrier on the
 * case's group after each combination, so that one spawn and one rendezvous serve them all.
 *
 * The combination being run is kept per thread (a threaded case's ranks are threads): a failed
 * check inside it names it ("subtest (dtype=f32, size=4): file:line: message", child.c's
 * td_test_fail asks harness_subtest_label), and it is the thread's breadcrumb, shown with its stack
 * if the case hangs. As in c10d inside a spawned rank, the first failing combination ends the rank
 * (the others are not run). */
#include <stdio.h>
#include <stdlib.h>

#include <tdist/pg.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "testing/harness.h"

static __thread const char *tl_label; /* the combination being run, NULL outside one */

const char *harness_subtest_label(void) { return tl_label; }

static void check_dims(const td_subtest_dim *dims, int ndims)
{
    if (ndims < 0 || (ndims > 0 && !dims))
        TD_FAIL("td_test_run_subtests: %d dimensions at %p", ndims, (const void *)dims);
    for (int d = 0; d < ndims; d++)
        if (!dims[d].name || dims[d].count < 0 || (dims[d].count > 0 && !dims[d].values))
            TD_FAIL("td_test_run_subtests: dimension %d (%s) needs a name and count >= 0 values", d,
                    dims[d].name ? dims[d].name : "no name");
}

/* "a=x, n=2" for the combination index[]. */
static char *label_of(const td_subtest_dim *dims, int ndims, const int *index)
{
    td_buf b = TD_BUF_INIT;
    for (int d = 0; d < ndims; d++) {
        const char *v = dims[d].values[index[d]];
        buf_printf(&b, "%s%s=%s", d ? ", " : "", dims[d].name, v ? v : "NULL");
    }
    return buf_steal(&b);
}

void td_test_run_subtests(td_test_ctx *ctx, struct td_pg *group, const td_subtest_dim *dims, int ndims,
                          void (*fn)(td_test_ctx *ctx, const td_subtest *sub, void *arg), void *arg)
{
    check_dims(dims, ndims);
    int count = 1;
    for (int d = 0; d < ndims; d++)
        count *= dims[d].count;
    int *index = alloc_zeroed((size_t)ndims + 1, sizeof *index);
    const char *outer = tl_label; /* a subtest may run subtests of its own */
    for (int number = 0; number < count; number++) {
        char *label = label_of(dims, ndims, index);
        td_subtest sub = {.dims = dims, .ndims = ndims, .index = index, .number = number, .count = count,
                          .label = label};
        tl_label = label;
        td_test_breadcrumb("subtest %d of %d (%s)", number + 1, count, label);
        fn(ctx, &sub, arg);
        tl_label = outer;
        /* c10d.barrier() after each combination: on the named group, else the default one if any. */
        if (group || td_is_initialized()) {
            td_status st = td_pg_barrier(group, NULL);
            if (st != TD_OK)
                TD_FAIL("the barrier after subtest (%s) failed: %s: %s", label, td_status_str(st), td_last_error());
        }
        free(label);
        for (int d = ndims - 1; d >= 0; d--) { /* the next combination, last dimension fastest */
            if (++index[d] < dims[d].count)
                break;
            index[d] = 0;
        }
    }
    free(index);
}
