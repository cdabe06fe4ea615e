/* Unit tests of the harness's internal parts (src/testing): control-channel frames, Python-style
 * number formatting, symbol lookup for backtraces, and the fd / thread snapshots of the leak
 * check. The end-to-end behaviour is in test_harness.c and test_threaded.c. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tdist/testing.h>

#include "base/buf.h"
#include "base/error.h"
#include "testing/harness.h"

static void check_float(double v, const char *want)
{
    char out[64];
    pyfmt_float(v, out, sizeof out);
    TD_CHECK_MSG(strcmp(out, want) == 0, "repr(%.17g) gave '%s', want '%s'", v, out, want);
}

TD_TEST(python_float_repr)
{
    check_float(2.0, "2.0");
    check_float(0.5, "0.5");
    check_float(0.1, "0.1");
    check_float(1.0 / 3, "0.3333333333333333");
    check_float(2.0034510135650635, "2.0034510135650634");
    check_float(0.1 + 0.2, "0.30000000000000004");
    check_float(1.0 / 7, "0.14285714285714285");
    check_float(300.0, "300.0");
    check_float(1e-4, "0.0001");
    check_float(1e-5, "1e-05");
    check_float(1.5e-7, "1.5e-07");
    check_float(1e15, "1000000000000000.0");
    check_float(1e16, "1e+16");
    check_float(123456789012345678.0, "1.2345678901234568e+17");
    check_float(-2.5, "-2.5");
    check_float(0.0, "0.0");
    check_float(12.0625, "12.0625");
    char out[64];
    pyfmt_seconds_ms(2000, out, sizeof out);
    TD_CHECK_STR_EQ(out, "2");
    pyfmt_seconds_ms(1500, out, sizeof out);
    TD_CHECK_STR_EQ(out, "1.5");
    pyfmt_seconds_ms(300000, out, sizeof out);
    TD_CHECK_STR_EQ(out, "300");
}

typedef struct frames {
    int n;
    uint8_t types[8];
    char payloads[8][64];
} frames;

static void collect(void *arg, uint8_t type, const char *data, size_t len)
{
    frames *f = arg;
    if (f->n < 8) {
        f->types[f->n] = type;
        snprintf(f->payloads[f->n], sizeof f->payloads[f->n], "%.*s", (int)len, data);
    }
    f->n++;
}

TD_TEST(ctl_frames_parse_in_pieces)
{
    td_buf wire = TD_BUF_INIT;
    buf_put_u32(&wire, 0);
    buf_put_u8(&wire, TD_CTL_GET_TRACEBACK);
    buf_put_u32(&wire, 9);
    buf_put_u8(&wire, TD_CTL_ERROR);
    buf_append(&wire, "a.c:1: no", 9);
    buf_put_u32(&wire, 3);
    buf_put_u8(&wire, TD_CTL_PENDING);
    buf_append(&wire, "1 3", 3);
    /* feed one byte at a time: frames come out whole, in order, once complete */
    td_buf in = TD_BUF_INIT;
    frames f = {0};
    for (size_t i = 0; i < wire.len; i++) {
        buf_append(&in, wire.data + i, 1);
        TD_CHECK_OK(ctl_parse(&in, collect, &f));
        if (i == 4)
            TD_CHECK_EQ(f.n, 1);
        if (i == wire.len - 2)
            TD_CHECK_EQ(f.n, 2);
    }
    TD_CHECK_EQ(f.n, 3);
    TD_CHECK_EQ(in.len, 0);
    TD_CHECK_EQ(f.types[0], TD_CTL_GET_TRACEBACK);
    TD_CHECK_STR_EQ(f.payloads[0], "");
    TD_CHECK_EQ(f.types[1], TD_CTL_ERROR);
    TD_CHECK_STR_EQ(f.payloads[1], "a.c:1: no");
    TD_CHECK_STR_EQ(f.payloads[2], "1 3");
    buf_free(&in);
    buf_free(&wire);
}

TD_TEST(ctl_refuses_huge_lengths)
{
    td_buf in = TD_BUF_INIT;
    buf_put_u32(&in, TD_CTL_MAX_PAYLOAD + 1);
    buf_put_u8(&in, TD_CTL_ERROR);
    frames f = {0};
    TD_CHECK_ERR(ctl_parse(&in, collect, &f), TD_ERR_INVALID, "harness control frame of 67108865 bytes exceeds the limit of 67108864");
    TD_CHECK_EQ(f.n, 0);
    buf_free(&in);
}

TD_TEST(ctl_send_and_recv_over_a_socketpair)
{
    int sv[2];
    TD_CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    TD_CHECK_OK(ctl_send(sv[0], TD_CTL_TRACEBACK, "stack text", 10));
    TD_CHECK_OK(ctl_send(sv[0], TD_CTL_GET_TRACEBACK, NULL, 0));
    td_buf payload = TD_BUF_INIT;
    uint8_t type = 0;
    TD_CHECK_OK(ctl_recv(sv[1], &type, &payload));
    TD_CHECK_EQ(type, TD_CTL_TRACEBACK);
    TD_CHECK_EQ(payload.len, 10);
    TD_CHECK(memcmp(payload.data, "stack text", 10) == 0);
    TD_CHECK_OK(ctl_recv(sv[1], &type, &payload));
    TD_CHECK_EQ(type, TD_CTL_GET_TRACEBACK);
    TD_CHECK_EQ(payload.len, 0);
    /* a header announcing too much is refused before anything is allocated */
    unsigned char bad[5] = {0xff, 0xff, 0xff, 0xff, 3};
    TD_CHECK_EQ(write(sv[0], bad, 5), 5);
    TD_CHECK_ERR(ctl_recv(sv[1], &type, &payload), TD_ERR_INVALID, "exceeds the limit");
    close(sv[0]);
    TD_CHECK_ERR(ctl_recv(sv[1], &type, &payload), TD_ERR_CLOSED, "was closed");
    close(sv[1]);
    buf_free(&payload);
}

__attribute__((noinline)) static int a_static_function_to_find(int x) { return x * 3 + 1; }

TD_TEST(symbols_name_static_functions)
{
    symbols_init();
    char out[512];
    uintptr_t addr = (uintptr_t)a_static_function_to_find + 1;
    symbols_describe(addr, out, sizeof out);
    TD_CHECK_CONTAINS(out, " in a_static_function_to_find+0x1 (");
    TD_CHECK_CONTAINS(out, "test_harness_parts+0x");
    symbols_describe((uintptr_t)&printf, out, sizeof out);
    TD_CHECK_CONTAINS(out, "printf");
    symbols_describe(1, out, sizeof out); /* nothing is mapped there */
    TD_CHECK_STR_EQ(out, "");
    char tiny[8];
    symbols_describe(addr, tiny, sizeof tiny);
    TD_CHECK_EQ(strlen(tiny), 7);
    TD_CHECK_EQ(a_static_function_to_find(1), 4);
}

__attribute__((noinline)) static void dump_my_stack(td_buf *out)
{
    stacks_dump_self(out, 0);
    buf_append_str(out, "end\n"); /* not a tail call: this frame stays on the stack */
}

TD_TEST(own_stack_names_the_caller)
{
    td_buf out = TD_BUF_INIT;
    dump_my_stack(&out);
    TD_CHECK_CONTAINS(out.data, "    #0 0x");
    TD_CHECK_CONTAINS(out.data, " in dump_my_stack"); /* gcc may name a clone "dump_my_stack.constprop.0" */
    TD_CHECK_CONTAINS(out.data, " in td_test_body_own_stack_names_the_caller+0x");
    buf_free(&out);
}

static void *idle(void *arg)
{
    int *p = arg;
    int c;
    (void)!read(p[0], &c, 1); /* until the pipe's write end closes */
    return NULL;
}

TD_TEST(leak_snapshots, .no_leak_check = true)
{
    td_leak_snapshot before;
    leak_snapshot_take(&before);
    TD_CHECK(before.nfds >= 3);
    TD_CHECK(before.ntids >= 1);
    char *msg = leak_check(&before, 0);
    TD_CHECK(msg == NULL);

    int p[2];
    TD_CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    pthread_t t;
    TD_CHECK_EQ(pthread_create(&t, NULL, idle, p), 0);
    pthread_setname_np(t, "td-idle");
    msg = leak_check(&before, 0);
    TD_CHECK(msg != NULL);
    char want[64];
    snprintf(want, sizeof want, "%d -> pipe:[", p[0]);
    TD_CHECK_CONTAINS(msg, "Test leaked file descriptors: ");
    TD_CHECK_CONTAINS(msg, want);
    TD_CHECK_CONTAINS(msg, "\nTest leaked threads: ");
    TD_CHECK_CONTAINS(msg, " (td-idle) (join them before the test returns, or set .no_leak_check)");
    free(msg);

    close(p[1]);
    pthread_join(t, NULL);
    close(p[0]);
    msg = leak_check(&before, 2000); /* the thread may linger in /proc for a moment */
    TD_CHECK_MSG(msg == NULL, "%s", msg);
    leak_snapshot_free(&before);
}

TD_TEST_MAIN()
