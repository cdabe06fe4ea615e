// The installed headers from C++17: a tensor, a reduce kernel and a td_op value.
#include <cstdio>

#include <tdist/tdist.h>

int main()
{
    td_tensor *t = nullptr;
    if (td_tensor_arange(TD_FLOAT32, 1, 5, 1, &t) != TD_OK) {
        std::fprintf(stderr, "arange: %s\n", td_last_error());
        return 1;
    }
    const float *v = static_cast<const float *>(td_tensor_data(t));
    float sum = 0;
    td_reduce_fn add = td_reduce_kernel(TD_SUM, TD_FLOAT32);
    for (int i = 0; i < 4; i++)
        add(&sum, &sum, &v[i], 1);
    td_op op = TD_OP_SUM;
    std::printf("consumer_cxx: 1+2+3+4 = %g (op %s)\n", sum, td_reduce_op_name(op.kind));
    td_tensor_release(t);
    return 0;
}
