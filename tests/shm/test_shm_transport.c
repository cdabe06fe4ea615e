/* The shm transport (src/transport/shm.h) between real rank processes over real shared memory:
 * set-up through a FileStore for worlds 1 to 4, messages of every size (larger than the ring too)
 * with iovecs, tag matching out of order, any-source receives, unexpected messages (large ones
 * drained by the transport's thread), length mismatches, callbacks with nobody waiting, a peer
 * killed with SIGKILL (survivors fail within 2 s naming it, nothing is left in /dev/shm), timeouts,
 * aborts relayed to the peers, orderly closes, refused hellos (different settings, another host),
 * four ranks sharing one core, the job secret's proofs (a wrong secret, a secret on one side
 * only), a process of another user refused before it gets a segment, and no fd, thread or segment left after destroy (the harness checks
 * fds, threads and /dev/shm after every case). The cases every transport passes are written once
 * in tests/support/transport_util.c; the tcp transport runs them too. */
#include <grp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../support/transport_util.h"
#include "base/clock.h"
#include "shm_util.h"
#include "transport/samehost.h"
#include "transport/shm_impl.h"
#include "transport/shm_proto.h"

static td_status create(const td_test_ctx *ctx, const td_transport_setup *setup, td_transport **out)
{
    (void)ctx;
    td_shm_options o = {.setup = *setup};
    return shm_transport_create(&o, out);
}

static void connect_body(td_test_ctx *ctx)
{
    tu_world w = shm_test_open(ctx, 0);
    tu_all_pairs(ctx, w.t, 1000);
    tu_all_pairs(ctx, w.t, 1 << 20); /* four times the ring */
    tu_world_close(&w);
}

TD_TEST(connect_world_2, .world_size = 2) { connect_body(ctx); }
TD_TEST(connect_world_3, .world_size = 3) { connect_body(ctx); }
TD_TEST(connect_world_4, .world_size = 4) { connect_body(ctx); }
TD_TEST(connect_world_8, .world_size = 8, .timeout_s = 120) { connect_body(ctx); }

TD_TEST(connect_world_1, .world_size = 1)
{
    tu_world w = shm_test_open(ctx, 0);
    tu_case_world_1(&w);
    tu_world_close(&w);
}

/* The cases every transport passes (transport_util.h); the abort of "timeout" is relayed, so the
 * stalled peer fails at once with the same cause. */
static tu_world open_default(td_test_ctx *ctx) { return shm_test_open(ctx, 0); }

/* Sizes around the 16-byte padding, and larger than the ring. */
static const size_t message_sizes[] = {0,     1,     2,      7,      15,     16,
                                       17,    4095,  65537,  262144, 262145, 3 * 1024 * 1024 + 3};

TU_TRANSPORT_CASES(open_default, message_sizes, TD_ERR_TIMEOUT, "Timed out waiting for a receive from rank 0")

/* A rank that destroys its transport says goodbye: what it sent before still arrives, the others
 * fail only what involves it and keep talking among themselves. */
TD_TEST(orderly_close, .world_size = 3)
{
    tu_world w = shm_test_open(ctx, 0);
    tu_all_pairs(ctx, w.t, 64);
    if (ctx->rank == 2) {
        int v = 2222;
        TD_CHECK_OK(transport_send(w.t, 0, 9, &v, sizeof v, tu_after_ms(30000)));
        tu_barrier(ctx, w.store, "sent");
        transport_destroy(w.t);
        tu_barrier(ctx, w.store, "synced");
        tu_store_close(ctx, w.store, ctx->store_path);
        return;
    }
    tu_barrier(ctx, w.store, "sent");
    tu_barrier(ctx, w.store, "synced");
    if (ctx->rank == 0) {
        int v = 0;
        TD_CHECK_OK(transport_recv(w.t, 2, 9, &v, sizeof v, tu_after_ms(30000)));
        TD_CHECK_EQ(v, 2222);
    }
    tu_check_after_close(&w);
    tu_world_close(&w);
}

/* Ranks with different ring sizes refuse each other with a message that names the variables. */
TD_TEST(layout_mismatch, .world_size = 2)
{
    setenv("TDIST_SHM_RING", ctx->rank == 0 ? "64K" : "128K", 1);
    td_store *store = tu_store_open(ctx->store_path);
    td_transport_setup g = tu_setup(ctx, store, 3000, "g");
    td_transport *t = NULL;
    if (ctx->rank == 0)
        TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_INVALID, "TDIST_SHM_RING");
    else
        TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_TIMEOUT, "no connection yet with rank 0; last refused");
    unsetenv("TDIST_SHM_RING");
    tu_no_segments();
    tu_barrier(ctx, store, "done");
    tu_store_close(ctx, store, ctx->store_path);
}

/* Ranks that count as different hosts (TDIST_HOST_ID) cannot share memory: a clear error that
 * names the other rank and points to the auto backend. */
TD_TEST(other_host_refused, .world_size = 2)
{
    setenv("TDIST_HOST_ID", ctx->rank == 0 ? "hostA" : "hostB", 1);
    td_store *store = tu_store_open(ctx->store_path);
    td_transport_setup g = tu_setup(ctx, store, 10000, "g");
    td_transport *t = NULL;
    char want[64];
    snprintf(want, sizeof want, "but rank %d is on another host", 1 - ctx->rank);
    TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_INVALID, want);
    TD_CHECK_CONTAINS(td_last_error(), "auto backend");
    unsetenv("TDIST_HOST_ID");
    tu_barrier(ctx, store, "done");
    tu_store_close(ctx, store, ctx->store_path);
}

TD_TEST(setup_timeout, .world_size = 2) { tu_case_setup_timeout(ctx, create); }

/* ---- who gets a segment ------------------------------------------------------------------------ */

/* The same secret on every rank is accepted. */
TD_TEST(auth_secret_match, .world_size = 3)
{
    setenv("TDIST_AUTH_TOKEN", "shared-secret", 1);
    tu_world w = shm_test_open(ctx, 0);
    unsetenv("TDIST_AUTH_TOKEN");
    tu_all_pairs(ctx, w.t, 1000);
    tu_world_close(&w);
}

/* A wrong secret, or one on a single side: rank 0 (which connects) fails at once with the message,
 * rank 1 at its timeout naming the refusal; no segment is left behind. */
TD_TEST(auth_secret_refused, .world_size = 2, .params = "mismatch,listener_only,connector_only")
{
    const char *s0 = "secret-a", *s1 = "secret-b", *want0, *want1;
    if (strcmp(ctx->param, "mismatch") == 0) {
        want1 = "authentication failed: the connecting rank's TDIST_AUTH_TOKEN does not match rank 1's";
        want0 = "rank 1 refused the connection: authentication failed: the connecting rank's TDIST_AUTH_TOKEN does "
                "not match rank 1's";
    } else if (strcmp(ctx->param, "listener_only") == 0) {
        s0 = NULL;
        want1 = "authentication failed: rank 1 requires the job's secret (TDIST_AUTH_TOKEN) and the connecting rank "
                "has none";
        want0 = "rank 1 refused the connection: authentication failed: rank 1 requires the job's secret "
                "(TDIST_AUTH_TOKEN) and the connecting rank has none";
    } else {
        s1 = NULL;
        want1 = "authentication failed: rank 1 does not authenticate (it has no TDIST_AUTH_TOKEN) but the connecting "
                "rank has one";
        want0 = "authentication failed: rank 1 does not authenticate (it has no TDIST_AUTH_TOKEN) but this rank has one";
    }
    tu_case_auth_refused(ctx, create, s0, s1, want0, want1);
    tu_no_segments();
}

/* The child of rank 0 that runs as nobody: it connects to rank 1's socket with a hello that is
 * right in every other respect (rank 1's nonce, the group, the layout, a segment's fd attached)
 * and must get a refusal naming its uid, and no fd. Exit 0: so. */
static int stranger(const td_shm_entry *e, const td_shm_hello *h, int ready)
{
    if (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
        return 3;
    int mem = memfd_create("stranger", MFD_CLOEXEC);
    if (mem < 0 || ftruncate(mem, (off_t)h->seg_size) != 0)
        return 4;
    int fd = samehost_unix_connect(e->sock_name);
    if (fd < 0)
        return 5;
    uint8_t b[TD_SHM_HELLO_SIZE];
    shm_hello_encode(b, h);
    if (samehost_send_fd(fd, b, sizeof b, mem) != (ssize_t)sizeof b)
        return 6;
    if (write(ready, "x", 1) != 1)
        return 7;
    size_t got = 0;
    int passed = -1;
    bool extra = false;
    while (got < sizeof b) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 30000) != 1)
            return 8;
        ssize_t n = samehost_recv_fd(fd, b + got, sizeof b - got, &passed, &extra);
        if (n <= 0)
            return 9;
        got += (size_t)n;
    }
    if (passed >= 0 || extra)
        return 10; /* it was handed a segment */
    td_shm_hello answer;
    const char *why = NULL;
    if (!shm_hello_parse(b, got, &answer, &why) || answer.type != TD_SHM_REFUSE)
        return 11;
    char msg[TD_SHM_HELLO_MSG_MAX + 1];
    memcpy(msg, answer.msg, answer.msg_len);
    msg[answer.msg_len] = '\0';
    if (!strstr(msg, "runs as uid 65534 and rank 1 as uid 0"))
        return 12;
    close(fd);
    close(mem);
    return 0;
}

/* A process of another user that connects to a rank's abstract socket is refused with a message
 * naming its uid, before it could get the rank's segment; the real group forms after it. */
TD_TEST(refuses_other_uid, .world_size = 2, .timeout_s = 60)
{
    if (geteuid() != 0)
        TD_SKIP(TD_SKIP_GENERIC, "the uid check needs a peer of another uid: only root can switch to nobody "
                                 "(setresuid) for it, and this test does not run as root");
    if (ctx->rank == 1) {
        tu_world w = shm_test_open(ctx, 0);
        tu_all_pairs(ctx, w.t, 1000);
        tu_world_close(&w);
        return;
    }
    td_store *store = tu_store_open(ctx->store_path);
    const char *key = "shm/1/addr/1";
    TD_CHECK_OK(td_store_wait(store, &key, 1, 30000));
    char *text = NULL;
    size_t n = 0;
    TD_CHECK_OK(td_store_get(store, key, (void **)&text, &n));
    text = realloc(text, n + 1);
    text[n] = '\0';
    td_shm_entry e;
    TD_CHECK_OK(shm_entry_parse(text, 1, &e));
    free(text);
    td_shm_hello h = {.type = TD_SHM_HELLO, .from = 0, .to = 1, .world = 2, .pid = (uint32_t)getpid(),
                      .nonce = e.nonce, .group_hash = shm_name_hash("test")};
    TD_CHECK_OK(shm_layout_from_env(2, &h.layout));
    shm_offsets off;
    shm_layout_offsets(2, &h.layout, &off);
    h.seg_size = off.total;
    int ready[2];
    TD_CHECK(pipe(ready) == 0);
    pid_t c = fork();
    TD_CHECK(c >= 0);
    if (c == 0) {
        close(ready[0]);
        _exit(stranger(&e, &h, ready[1]));
    }
    close(ready[1]);
    char x;
    /* Its hello is in rank 1's backlog before rank 0's: rank 1 answers it first. */
    TD_CHECK_MSG(read(ready[0], &x, 1) == 1, "the stranger did not get to send its hello");
    close(ready[0]);
    td_store_release(store);
    tu_world w = shm_test_open(ctx, 0);
    int status = 0;
    TD_CHECK(waitpid(c, &status, 0) == c);
    TD_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the stranger ended with status %#x", status);
    tu_all_pairs(ctx, w.t, 1000);
    tu_world_close(&w);
}

/* Four ranks on one core: every exchange still completes (the waits yield and then sleep). */
TD_TEST(four_ranks_one_core, .world_size = 4, .timeout_s = 120)
{
    tu_one_core();
    tu_world w = shm_test_open(ctx, 0);
    int64_t t0 = clock_now_ns();
    for (int i = 0; i < 300; i++)
        tu_all_pairs(ctx, w.t, (size_t)(i % 7) * 1000);
    tu_all_pairs(ctx, w.t, 3 << 20);
    double dt = tu_since_s(t0);
    TD_CHECK_MSG(dt < 60, "300 exchanges among 4 ranks on one core took %.1f s", dt);
    tu_barrier(ctx, w.store, "done");
    tu_world_close(&w);
}

TD_TEST(create_destroy_repeatedly, .world_size = 3) { tu_case_create_destroy_repeatedly(ctx, create); }

TD_TEST_MAIN()
