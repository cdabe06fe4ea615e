/* Helpers of the mp tests (mp_util.h), and their main(): a spawned child (TD_MP_SPAWN) is this
 * test binary run again, so main first lets td_mp_child_main run the entry point. */
#include "mp_util.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"

int main(int argc, char **argv)
{
    TD_MP_MAIN_PROLOGUE(argc, argv);
    return td_test_main(argc, argv);
}

bool mpt_all_equal(const td_tensor *t, double v)
{
    td_tensor *ref = NULL;
    if (td_tensor_full(td_tensor_dtype(t), td_tensor_shape(t), v, &ref) != TD_OK)
        return false;
    bool eq = td_tensor_equal(t, ref);
    td_tensor_release(ref);
    return eq;
}

td_tensor *mpt_randn(int64_t rows, int64_t cols)
{
    td_tensor *t = NULL;
    if (td_tensor_empty(TD_FLOAT32, TD_SHAPE(rows, cols), &t) != TD_OK)
        abort();
    float *p = td_tensor_data(t);
    for (int64_t i = 0; i < rows * cols; i++)
        p[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    return t;
}

int mpt_shm_entries(pid_t pid)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "tdist.%d.", (int)pid), count = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, (size_t)n) == 0)
            count++;
    closedir(d);
    return count;
}

int mpt_wait_shm_entries(pid_t pid, int want, int ms)
{
    int64_t deadline = deadline_after_ms(ms);
    int n;
    while ((n = mpt_shm_entries(pid)) != want && !deadline_passed(deadline))
        clock_sleep_ms(20);
    return n;
}

void mpt_set_strategy(td_mp_strategy s) { TD_CHECK_OK(td_mp_set_sharing_strategy(s)); }

td_mp_leak_checker *mpt_lc_begin(void)
{
    td_mp_leak_checker *lc = NULL;
    TD_CHECK_OK(td_mp_leak_checker_begin(&lc));
    return lc;
}

void mpt_lc_end(td_mp_leak_checker *lc)
{
    TD_CHECK_OK(td_mp_leak_checker_end(lc, td_mp_get_sharing_strategy() == TD_MP_FILE_SYSTEM ? 30000 : 2000));
}
