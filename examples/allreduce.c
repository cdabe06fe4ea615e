/* The shortest complete tdist program: every rank contributes its rank number and all of them
 * receive the sum.   tdrun --nproc-per-node 4 ./allreduce   prints "rank 2: sum = 6" four times. */
#include <stdio.h>

#include <tdist/tdist.h>

int main(void)
{
    if (td_init_process_group(NULL) != TD_OK) { /* env:// rendezvous: tdrun sets the variables */
        fprintf(stderr, "init failed: %s\n", td_last_error());
        return 1;
    }
    td_tensor *t;
    td_tensor_full(TD_FLOAT32, TD_SHAPE(1), td_get_rank(), &t);
    if (td_pg_all_reduce(td_default_pg(), t, TD_OP_SUM, NULL) != TD_OK) {
        fprintf(stderr, "all_reduce failed: %s\n", td_last_error());
        return 1;
    }
    printf("rank %d: sum = %g\n", td_get_rank(), *(float *)td_tensor_data(t));
    td_tensor_release(t);
    td_destroy_process_group();
    return 0;
}
