/* Uses the installed headers and library: a tensor and a reduce kernel from the public API. */
#include <stdio.h>

#include <tdist/tdist.h>

int main(void)
{
    td_tensor *t;
    if (td_tensor_arange(TD_FLOAT32, 1, 5, 1, &t) != TD_OK) {
        fprintf(stderr, "arange: %s\n", td_last_error());
        return 1;
    }
    const float *v = td_tensor_data(t);
    float sum = 0;
    td_reduce_fn add = td_reduce_kernel(TD_SUM, TD_FLOAT32);
    for (int i = 0; i < 4; i++)
        add(&sum, &sum, &v[i], 1);
    printf("consumer: 1+2+3+4 = %g (tdist %s)\n", sum, td_version());
    td_tensor_release(t);
    return 0;
}
