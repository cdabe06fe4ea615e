#include <tdist/testing.h>
#include <unistd.h>
TD_TEST(smoke, .world_size = 4, .timeout_s = 30) { TD_CHECK(ctx->rank < ctx->world_size); }
TD_TEST(inner_fail, .world_size = 4, .hidden = true) { TD_CHECK(ctx->rank != 2); }
TD_TEST(meta_fail, .world_size = 1) {
    td_test_result r;
    TD_CHECK_OK(td_test_run("inner_fail", &r));
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK_CONTAINS(r.message, "Process 2 exited with error code 10 and exception:\n");
    td_test_result_free(&r);
}
TD_TEST_MAIN()
