/* The same-host layer (transport/samehost.h) on its own, in one process: abstract UNIX-domain
 * sockets and fd passing, single-copy reads, and the arrivals of a segment set whose two members
 * live in this process's memory, with an owner that records how it was told to fail. The shm
 * transport and collective tests run the same code between processes. Shared copies run between
 * this process (the reader) and a child it forks (the writer), whose end the reader sees. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tdist/testing.h>

#include "base/clock.h"
#include "base/error.h"
#include "transport/samehost.h"

/* ---- sockets ------------------------------------------------------------------------------------ */

TD_TEST(unix_socket_passes_an_fd)
{
    char name[64];
    snprintf(name, sizeof name, "tdist-test-samehost-%d", (int)getpid());
    int lfd = samehost_unix_listen(name, 4);
    TD_CHECK(lfd >= 0);
    int cfd = samehost_unix_connect(name);
    TD_CHECK(cfd >= 0);
    int afd = -1;
    for (int i = 0; i < 1000 && afd < 0; i++) {
        afd = accept(lfd, NULL, NULL);
        if (afd < 0)
            usleep(1000);
    }
    TD_CHECK(afd >= 0);
    int pipe_fds[2];
    TD_CHECK_EQ(pipe(pipe_fds), 0);
    TD_CHECK_EQ(samehost_send_fd(cfd, "hello", 5, pipe_fds[1]), 5);
    char buf[8] = {0};
    int got_fd = -1;
    bool extra = false;
    TD_CHECK_EQ(samehost_recv_fd(afd, buf, sizeof buf, &got_fd, &extra), 5);
    TD_CHECK(!extra);
    TD_CHECK_STR_EQ(buf, "hello");
    TD_CHECK(got_fd >= 0);
    /* The fd that came is the pipe's write end. */
    TD_CHECK_EQ(write(got_fd, "x", 1), 1);
    char c = 0;
    TD_CHECK_EQ(read(pipe_fds[0], &c, 1), 1);
    TD_CHECK_EQ(c, 'x');
    /* A second fd for a receiver that holds one already is closed and reported. */
    TD_CHECK_EQ(samehost_send_fd(cfd, "again", 5, pipe_fds[1]), 5);
    TD_CHECK_EQ(samehost_recv_fd(afd, buf, sizeof buf, &got_fd, &extra), 5);
    TD_CHECK(extra);
    /* Nothing there: EAGAIN, not a block. */
    errno = 0;
    TD_CHECK_EQ(samehost_recv_fd(afd, buf, sizeof buf, &got_fd, &extra), -1);
    TD_CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
    close(got_fd);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    close(afd);
    close(cfd);
    close(lfd);
}

/* ---- single-copy reads -------------------------------------------------------------------------- */

TD_TEST(single_copy_reads)
{
    uint64_t word = UINT64_C(0x1234567890abcdef);
    if (!samehost_word_is(getpid(), (uint64_t)(uintptr_t)&word, word))
        TD_SKIP(TD_SKIP_GENERIC, "process_vm_readv is not permitted here");
    TD_CHECK(!samehost_word_is(getpid(), (uint64_t)(uintptr_t)&word, word + 1));
    char src_a[100], src_b[50], dst_a[70], dst_b[80];
    for (int i = 0; i < 100; i++)
        src_a[i] = (char)i;
    for (int i = 0; i < 50; i++)
        src_b[i] = (char)(100 + i);
    /* Two pieces there, two buffers here, split at different places. */
    td_transport t = {.rank = 0, .size = 2};
    td_xfer x;
    x.on_done = NULL;
    struct iovec iov[2] = {{dst_a, sizeof dst_a}, {dst_b, sizeof dst_b}};
    TD_CHECK_OK(transport_prepare(&t, 1, 1, iov, 2, TD_DEADLINE_NONE, &x, TD_XFER_RECV, false));
    uint64_t addr[2] = {(uint64_t)(uintptr_t)src_a, (uint64_t)(uintptr_t)src_b};
    uint64_t len[2] = {sizeof src_a, sizeof src_b};
    TD_CHECK_EQ(samehost_read_into(getpid(), &x, addr, len, 2), 0);
    for (int i = 0; i < 150; i++) {
        char want = (char)i, got = i < 70 ? dst_a[i] : dst_b[i - 70];
        TD_CHECK_EQ(got, want);
    }
}

/* ---- the segment set ---------------------------------------------------------------------------- */

typedef struct fake_owner {
    _Atomic int failed;
    td_status status;
    char message[512];
    int missing;
} fake_owner;

static td_status owner_failure(void *arg)
{
    fake_owner *o = arg;
    return error_set(o->status, o->message);
}

static void owner_abort(void *arg, td_status status, const char *message)
{
    fake_owner *o = arg;
    o->status = status;
    snprintf(o->message, sizeof o->message, "%s", message);
    atomic_store(&o->failed, 1);
}

static td_status owner_wait_failed(void *arg, int missing, uint64_t e, int64_t deadline_ns, int64_t start_ns)
{
    (void)e;
    (void)deadline_ns;
    (void)start_ns;
    fake_owner *o = arg;
    o->missing = missing;
    owner_abort(o, TD_ERR_TIMEOUT, "timed out");
    return error_set(TD_ERR_TIMEOUT, "timed out");
}

static void describe(uint64_t what, uint64_t count, char *out, size_t size)
{
    snprintf(out, size, "op %llu of %llu", (unsigned long long)what, (unsigned long long)count);
}

/* Two ranks' views of one pair of members (as two processes would map them). */
typedef struct two_ranks {
    samehost_bell bell[2];
    samehost_arrival arrival[2];
    _Alignas(64) char small[2][2 * 256];
    _Alignas(64) char large[2][2 * 4096];
    _Atomic bool gone[2];
    samehost_member members[2];
    samehost_spin spin;
    fake_owner owner[2];
    samehost_set set[2];
} two_ranks;

static two_ranks *two_ranks_new(void)
{
    two_ranks *w = aligned_alloc(64, sizeof(two_ranks));
    memset(w, 0, sizeof *w);
    for (int r = 0; r < 2; r++)
        w->members[r] = (samehost_member){&w->bell[r], &w->arrival[r], w->small[r], w->large[r], &w->gone[r]};
    TD_CHECK_OK(samehost_spin_init(&w->spin, 2));
    w->spin.spin_ns = 1000;
    for (int r = 0; r < 2; r++) {
        w->set[r] = (samehost_set){
            .rank = r,
            .size = 2,
            .small_bytes = 256,
            .slot_bytes = 4096,
            .members = w->members,
            .spin = &w->spin,
            .owner = {.arg = &w->owner[r], .failed = &w->owner[r].failed, .failure = owner_failure,
                      .abort = owner_abort, .wait_failed = owner_wait_failed},
        };
    }
    return w;
}

/* ---- writes a peer will read -------------------------------------------------------------------- */

/* samehost_copy copies exactly either way, for every alignment of head and tail. */
TD_TEST(copies_through_and_around_the_caches)
{
    enum { N = 4096 + 256 };
    char *src = aligned_alloc(64, N), *dst = aligned_alloc(64, N);
    for (int i = 0; i < N; i++)
        src[i] = (char)(i * 7 + 3);
    static const size_t lens[] = {0, 1, 255, 256, 257, 1000, 4096};
    for (int stream = 0; stream < 2; stream++) {
        for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
            for (size_t shift = 0; shift < 20; shift += 3) {
                memset(dst, 0x55, N);
                samehost_copy(dst + shift, src + 1, lens[k], stream);
                samehost_copy_done(stream);
                TD_CHECK_MSG(memcmp(dst + shift, src + 1, lens[k]) == 0, "stream %d, %zu bytes at +%zu", stream, lens[k],
                             shift);
                for (size_t i = 0; i < shift; i++)
                    TD_CHECK_EQ(dst[i], 0x55);
                for (size_t i = shift + lens[k]; i < N; i++)
                    TD_CHECK_EQ(dst[i], 0x55);
            }
        }
    }
    free(src);
    free(dst);
}

/* Every rank tries each way SAMEHOST_TRIALS times on the same chunks, rank 0 keeps the cheaper one
 * (a slow first trial, as the first touches of a buffer give, does not condemn its way), publishes
 * a plan that rank 1 follows chunk for chunk (the same chunks explore the other way), and follows a
 * change of placement; one wild sample moves a way's figure at most to twice what it was, one fast
 * sample of the way not taken brings it back at once. Costs are fed in, not timed. */
TD_TEST(writes_follow_the_measured_cheaper_way)
{
    two_ranks *w = two_ranks_new();
    for (int r = 0; r < 2; r++)
        TD_CHECK_OK(samehost_writes_init(&w->set[r].writes));
    const size_t big = SAMEHOST_TUNED_MIN;
    /* Small chunks: always through the caches, and not counted. */
    TD_CHECK(!samehost_writes_begin(&w->set[0], big - 1));
    TD_CHECK_EQ(w->set[0].writes.chunks, 0);
    /* The warm-up: through the caches, untimed. */
    for (int j = 0; j < SAMEHOST_WARM_UP; j++) {
        TD_CHECK(!samehost_writes_begin(&w->set[0], big));
        TD_CHECK(!samehost_writes_begin(&w->set[1], big));
        samehost_writes_end(&w->set[0], big, 1000 * (int64_t)big);
    }
    TD_CHECK(w->set[0].writes.cost[0] == 0);
    /* The trials, alternating on both ranks, through the caches first: the first costs 10 ns per
     * byte, the others 1; around the caches 3. */
    for (int t = 0; t < 2 * SAMEHOST_TRIALS; t++) {
        bool a = samehost_writes_begin(&w->set[0], big);
        bool b = samehost_writes_begin(&w->set[1], big);
        TD_CHECK_MSG(a == (t & 1) && b == a, "trial %d: rank 0 %d, rank 1 %d", t, a, b);
        samehost_writes_end(&w->set[0], big, (int64_t)big * (a ? 3 : t == 0 ? 10 : 1));
        samehost_writes_end(&w->set[1], big, 1); /* rank 1 learns nothing */
    }
    TD_CHECK(w->set[1].writes.cost[0] == 0 && w->set[1].writes.cost[1] == 0);
    TD_CHECK(w->set[0].writes.cost[0] == 1.0 && w->set[0].writes.cost[1] == 3.0);
    /* Through the caches, around them on one chunk in SAMEHOST_EXPLORE_FAR (it costs 3x), the same
     * chunks on both. */
    int around = 0;
    for (int j = SAMEHOST_WARM_UP + 2 * SAMEHOST_TRIALS; j < SAMEHOST_WARM_UP + 2 * SAMEHOST_TRIALS + 2 * SAMEHOST_EXPLORE_FAR;
         j++) {
        bool a = samehost_writes_begin(&w->set[0], big);
        bool b = samehost_writes_begin(&w->set[1], big);
        TD_CHECK_MSG(a == b, "chunk %d: rank 0 %d, rank 1 %d", j, a, b);
        TD_CHECK_EQ(a, j % SAMEHOST_EXPLORE_FAR == SAMEHOST_EXPLORE_FAR - 1);
        around += a;
        samehost_writes_end(&w->set[0], big, (int64_t)big * (a ? 3 : 1));
    }
    TD_CHECK_EQ(around, 2);
    /* The placement changes: through the caches now costs 5 ns per byte. A single sample moves the
     * average at most to twice what it was; a few make around the caches the cheaper way. */
    double before = w->set[0].writes.cost[0];
    TD_CHECK(!samehost_writes_begin(&w->set[0], big));
    samehost_writes_end(&w->set[0], big, 1000 * (int64_t)big);
    TD_CHECK(w->set[0].writes.cost[0] <= 2 * before + 1e-9);
    for (int k = 0; k < 20; k++) {
        bool a = samehost_writes_begin(&w->set[0], big);
        samehost_writes_end(&w->set[0], big, (int64_t)big * (a ? 3 : 5));
    }
    int later = 0;
    for (int k = 0; k < 64; k++)
        later += samehost_writes_begin(&w->set[1], big);
    /* (All but the chunks that try the other way: one in SAMEHOST_EXPLORE while the figures are
     * close, as they are just after the change.) */
    TD_CHECK_MSG(later >= 64 - 64 / SAMEHOST_EXPLORE, "rank 1 wrote %d of 64 chunks around the caches after the change",
                 later);
    /* And back: through the caches costs 1 again. The first chunk that tries it brings its figure
     * down at once, and the plan back to it. */
    int tried = -1;
    for (int k = 0; k < 2 * SAMEHOST_EXPLORE_FAR && tried < 0; k++) {
        bool a = samehost_writes_begin(&w->set[0], big);
        samehost_writes_end(&w->set[0], big, (int64_t)big * (a ? 3 : 1));
        if (!a)
            tried = k;
    }
    TD_CHECK_MSG(tried >= 0, "through the caches was not tried in %d chunks", 2 * SAMEHOST_EXPLORE_FAR);
    TD_CHECK(w->set[0].writes.cost[0] == 1.0);
    later = 0;
    for (int k = 0; k < 64; k++)
        later += samehost_writes_begin(&w->set[1], big);
    TD_CHECK_MSG(later <= 64 / SAMEHOST_EXPLORE_FAR + 1, "rank 1 wrote %d of 64 chunks around the caches after the change back",
                 later);
    free(w);
}

/* TDIST_SHM_WRITES pins the way (for every size) or is refused with a clear message. */
TD_TEST(writes_pinned_by_the_environment)
{
    two_ranks *w = two_ranks_new();
    setenv("TDIST_SHM_WRITES", "around", 1);
    TD_CHECK_OK(samehost_writes_init(&w->set[0].writes));
    TD_CHECK(samehost_writes_begin(&w->set[0], 64));
    TD_CHECK(samehost_writes_begin(&w->set[0], SAMEHOST_TUNED_MIN));
    setenv("TDIST_SHM_WRITES", "cached", 1);
    TD_CHECK_OK(samehost_writes_init(&w->set[0].writes));
    TD_CHECK(!samehost_writes_begin(&w->set[0], SAMEHOST_TUNED_MIN));
    setenv("TDIST_SHM_WRITES", "sideways", 1);
    TD_CHECK_ERR(samehost_writes_init(&w->set[0].writes), TD_ERR_INVALID,
                 "TDIST_SHM_WRITES must be auto, cached or around, got 'sideways'");
    unsetenv("TDIST_SHM_WRITES");
    free(w);
}

TD_TEST(arrivals_and_slots)
{
    two_ranks *w = two_ranks_new();
    samehost_desc d = {.what = 7, .count = 3, .describe = describe};
    TD_CHECK(samehost_slot(&w->set[0], 1, 1) == w->large[1] + 4096);
    TD_CHECK(samehost_small(&w->set[1], 0, 2) == w->small[0]);
    uint64_t e0 = samehost_next_epoch(&w->set[0]), e1 = samehost_next_epoch(&w->set[1]);
    TD_CHECK_EQ(e0, 1);
    TD_CHECK_EQ(e1, 1);
    memcpy(samehost_slot(&w->set[0], 0, e0), "rank 0", 7);
    samehost_arrive(&w->set[0], e0, &d);
    TD_CHECK_OK(samehost_wait_arrival(&w->set[1], 0, e1, &d, clock_now_ns() + 1000000000LL));
    TD_CHECK_STR_EQ(samehost_slot(&w->set[1], 0, e1), "rank 0");
    /* A later epoch that rank 0 has not reached: the owner is told at the deadline. */
    TD_CHECK_ERR(samehost_wait_arrival(&w->set[1], 0, 2, &d, clock_now_ns() + 20000000LL), TD_ERR_TIMEOUT, "timed out");
    TD_CHECK_EQ(w->owner[1].missing, 0);
    /* Once failed, the owner's failure is every wait's answer. */
    TD_CHECK_ERR(samehost_wait_arrival(&w->set[1], -1, 1, &d, TD_DEADLINE_NONE), TD_ERR_TIMEOUT, "timed out");
    free(w);
}

TD_TEST(arrivals_that_disagree_fail_the_owner)
{
    two_ranks *w = two_ranks_new();
    samehost_desc mine = {.what = 1, .count = 8, .describe = describe};
    samehost_desc theirs = {.what = 2, .count = 8, .describe = describe};
    samehost_arrive(&w->set[0], samehost_next_epoch(&w->set[0]), &theirs);
    TD_CHECK_ERR(samehost_wait_arrival(&w->set[1], -1, samehost_next_epoch(&w->set[1]), &mine, TD_DEADLINE_NONE),
                 TD_ERR_INVALID, "Ranks disagree about a collective: rank 1 runs op 1 of 8, rank 0 runs op 2 of 8");
    TD_CHECK_EQ(w->owner[1].status, TD_ERR_INVALID);
    TD_CHECK(atomic_load(&w->owner[1].failed));
    free(w);
}

/* A rank that writes no slots arrives without waiting, so it can run epochs ahead of a peer that
 * is still checking its description of an earlier one (a scatter's non-roots do). The peer must
 * never mistake the entry being rewritten for a disagreement: rank 0 arrives at every epoch as
 * fast as it can, each epoch described differently, while rank 1 checks each epoch in turn. */
typedef struct racing_arrivals {
    two_ranks *w;
    uint64_t epochs;
} racing_arrivals;

static void *arrive_ahead(void *p)
{
    racing_arrivals *r = p;
    for (uint64_t e = 1; e <= r->epochs; e++) {
        samehost_desc d = {.what = e, .count = e * 3, .describe = describe};
        samehost_arrive(&r->w->set[0], e, &d);
    }
    return NULL;
}

TD_TEST(arrivals_far_ahead_are_not_a_disagreement, .timeout_s = 120)
{
    two_ranks *w = two_ranks_new();
    racing_arrivals r = {w, 1000000};
    pthread_t t;
    TD_CHECK_EQ(pthread_create(&t, NULL, arrive_ahead, &r), 0);
    for (uint64_t e = 1; e <= r.epochs; e++) {
        samehost_desc d = {.what = e, .count = e * 3, .describe = describe};
        td_status st = samehost_wait_arrival(&w->set[1], 0, e, &d, TD_DEADLINE_NONE);
        if (st != TD_OK) {
            pthread_join(t, NULL);
            TD_FAIL("epoch %llu: %s", (unsigned long long)e, td_last_error());
        }
    }
    pthread_join(t, NULL);
    TD_CHECK(!atomic_load(&w->owner[1].failed));
    /* The check still works when the entry holds the epoch: a real disagreement is caught. */
    samehost_desc other = {.what = 1, .count = 2, .describe = describe};
    TD_CHECK_ERR(samehost_wait_arrival(&w->set[1], 0, r.epochs, &other, TD_DEADLINE_NONE), TD_ERR_INVALID,
                 "rank 0 runs op 1000000 of 3000000");
    free(w);
}

TD_TEST(a_member_that_left_ends_the_wait)
{
    two_ranks *w = two_ranks_new();
    atomic_store(&w->gone[0], true);
    TD_CHECK_ERR(samehost_wait_arrival(&w->set[1], 0, 1, NULL, TD_DEADLINE_NONE), TD_ERR_TIMEOUT, "timed out");
    TD_CHECK_EQ(w->owner[1].missing, 0);
    free(w);
}

/* ---- lanes ----------------------------------------------------------------------------------- */

#define LANE_MSGS 200000

/* Message i: a length from a cheap generator (0 to SAMEHOST_LANE_MAX, mostly small), kind i, bytes
 * (i + j) & 0xff. */
static size_t lane_len(uint64_t i)
{
    uint64_t x = i * 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    return (x % 8 == 0) ? (size_t)(x % (SAMEHOST_LANE_MAX + 1)) : (size_t)(x % 200);
}

static void *lane_writer_main(void *arg)
{
    samehost_lane_writer w = {.lane = arg, .head = 0};
    for (uint64_t i = 0; i < LANE_MSGS; i++) {
        size_t n = lane_len(i);
        bool corrupt;
        uint8_t *p;
        while (!(p = samehost_lane_reserve(&w, (uint32_t)i, n, &corrupt))) {
            if (corrupt)
                return (void *)1;
            sched_yield();
        }
        for (size_t j = 0; j < n; j++)
            p[j] = (uint8_t)(i + j);
        samehost_lane_publish(&w);
    }
    return NULL;
}

/* One writer and one reader threads over a lane: every message arrives once, in order, whole,
 * across many wrap-arounds of the ring (sizes up to the largest entry). */
TD_TEST(lane_carries_messages_in_order, .timeout_s = 120)
{
    samehost_lane *lane = aligned_alloc(SAMEHOST_LINE, sizeof *lane);
    TD_CHECK(lane != NULL);
    memset(lane, 0, sizeof *lane);
    pthread_t th;
    TD_CHECK_EQ(pthread_create(&th, NULL, lane_writer_main, lane), 0);
    samehost_lane_reader r = {.lane = lane};
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < LANE_MSGS;) {
        uint32_t kind;
        const uint8_t *data;
        size_t n;
        int got = samehost_lane_next(&r, &kind, &data, &n);
        TD_CHECK(got >= 0);
        if (got == 0) {
            sched_yield();
            continue;
        }
        TD_CHECK_EQ(kind, (uint32_t)i);
        TD_CHECK_EQ(n, lane_len(i));
        for (size_t j = 0; j < n; j++)
            if (data[j] != (uint8_t)(i + j))
                TD_CHECK_EQ(data[j], (uint8_t)(i + j));
        samehost_lane_consume(&r);
        bytes += n;
        i++;
    }
    void *rc;
    pthread_join(th, &rc);
    TD_CHECK(rc == NULL);
    TD_CHECK(bytes > 20 * SAMEHOST_LANE_BYTES); /* the ring wrapped many times */
    TD_CHECK(!samehost_lane_ready(&r));
    free(lane);
}

/* A peer's words are not trusted: a head beyond the ring, a length beyond what was published or a
 * filler that does not end the ring is refused, and so is a tail ahead of the writer's head. */
TD_TEST(lane_refuses_what_makes_no_sense)
{
    samehost_lane *lane = aligned_alloc(SAMEHOST_LINE, sizeof *lane);
    TD_CHECK(lane != NULL);
    memset(lane, 0, sizeof *lane);
    samehost_lane_reader r = {.lane = lane};
    uint32_t kind;
    const uint8_t *data;
    size_t n;
    TD_CHECK_EQ(samehost_lane_next(&r, &kind, &data, &n), 0);
    atomic_store(&lane->head, SAMEHOST_LANE_BYTES + 8); /* more than the ring ahead */
    TD_CHECK_EQ(samehost_lane_next(&r, &kind, &data, &n), SAMEHOST_LANE_CORRUPT);
    uint32_t word[2] = {64, 7}; /* 64 bytes announced, 8 published */
    memcpy(lane->ring, word, sizeof word);
    atomic_store(&lane->head, 8);
    TD_CHECK_EQ(samehost_lane_next(&r, &kind, &data, &n), SAMEHOST_LANE_CORRUPT);
    word[0] = UINT32_MAX - 3; /* a length that overflows the span */
    memcpy(lane->ring, word, sizeof word);
    atomic_store(&lane->head, 64);
    TD_CHECK_EQ(samehost_lane_next(&r, &kind, &data, &n), SAMEHOST_LANE_CORRUPT);
    word[0] = 8;
    word[1] = SAMEHOST_LANE_PAD; /* a filler in the middle of the ring */
    memcpy(lane->ring, word, sizeof word);
    atomic_store(&lane->head, 64);
    TD_CHECK_EQ(samehost_lane_next(&r, &kind, &data, &n), SAMEHOST_LANE_CORRUPT);
    word[0] = 0;
    word[1] = 5; /* an empty message is fine */
    memcpy(lane->ring, word, sizeof word);
    atomic_store(&lane->head, 8);
    TD_CHECK_EQ(samehost_lane_next(&r, &kind, &data, &n), 1);
    TD_CHECK_EQ(kind, 5u);
    TD_CHECK_EQ(n, 0u);
    samehost_lane_consume(&r);
    TD_CHECK_EQ(atomic_load(&lane->tail), 8u);

    samehost_lane_writer w = {.lane = lane, .head = 8};
    bool corrupt;
    atomic_store(&lane->tail, 16); /* the reader claims more than was written */
    TD_CHECK(samehost_lane_reserve(&w, 1, 8, &corrupt) == NULL);
    TD_CHECK(corrupt);
    atomic_store(&lane->tail, 8);
    TD_CHECK(samehost_lane_reserve(&w, 1, SAMEHOST_LANE_MAX + 1, &corrupt) == NULL); /* too large */
    TD_CHECK(!corrupt);
    TD_CHECK(samehost_lane_reserve(&w, 1, 8, &corrupt) != NULL);
    /* Nobody asleep: no ring wanted; the reader asleep with no poller: a ring. */
    TD_CHECK(!samehost_lane_publish(&w));
    atomic_store(&lane->asleep, 1);
    TD_CHECK(samehost_lane_reserve(&w, 1, 8, &corrupt) != NULL);
    TD_CHECK(samehost_lane_publish(&w));
    atomic_store(&lane->pollers, 1);
    TD_CHECK(samehost_lane_reserve(&w, 1, 8, &corrupt) != NULL);
    TD_CHECK(!samehost_lane_publish(&w));
    free(lane);
}

/* ---- shared copies ------------------------------------------------------------------------------ */

/* What the reader and the forked writer share: the share, and what the writer says. */
typedef struct share_test {
    samehost_share share;
    _Atomic int can_write; /* the writer can write into the reader: 1 yes, 2 no */
    _Atomic uint64_t wrote;
    _Atomic int reader_done; /* the writer's memory may go (as RPC's sender waits for its ack) */
} share_test;

enum { SHARE_BYTES = 5 << 20, SHARE_DST_BYTES = (5 << 20) + 64 };
static uint8_t share_src[SHARE_BYTES]; /* the same address in the child, holding the writer's bytes */
static uint8_t share_dst[SHARE_DST_BYTES]; /* the reader's destination (each case is a process of its own) */

/* Three spans of share_src, of odd lengths, placed in the destination out of their order. */
static const samehost_span share_spans[3] = {
    {.offset = 2 << 20, .addr = 0, .len = (2 << 20) + 777},
    {.offset = 100, .addr = (3 << 20), .len = (1 << 20) + 3},
    {.offset = (4 << 20) + 1000, .addr = (2 << 20) + 4096, .len = 12345},
};

static void share_spans_at(samehost_span *s)
{
    for (int i = 0; i < 3; i++) {
        s[i] = share_spans[i];
        s[i].addr += (uint64_t)(uintptr_t)share_src;
    }
}

static uint8_t share_byte(uint64_t i) { return (uint8_t)(i * 7 + (i >> 12) + 1); }

/* Every byte of the spans arrived where they go in share_dst, and nothing else was written. */
static void share_check(void)
{
    const uint8_t *dst = share_dst;
    size_t dst_len = SHARE_DST_BYTES;
    uint8_t *want = calloc(dst_len, 1);
    TD_CHECK(want != NULL);
    for (int i = 0; i < 3; i++)
        for (uint64_t j = 0; j < share_spans[i].len; j++)
            want[share_spans[i].offset + j] = share_byte(share_spans[i].addr + j);
    for (size_t i = 0; i < dst_len; i++)
        if (dst[i] != want[i])
            TD_CHECK_MSG(dst[i] == want[i], "byte %zu is %d, not %d", i, dst[i], want[i]);
    free(want);
}

typedef enum { WRITER_WRITES, WRITER_CLAIMS_AND_EXITS, WRITER_CLAIMS_AND_STOPS } writer_kind;

/* Forks the writer of job 1: it fills share_src with its own bytes, says whether it can write into
 * its parent, then (WRITER_WRITES) waits for the offer and writes chunks, or claims a chunk and
 * exits, or claims one and stops. */
static pid_t share_writer(share_test *t, writer_kind kind)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    TD_CHECK(pid >= 0);
    if (pid > 0)
        return pid;
    for (uint64_t i = 0; i < SHARE_BYTES; i++)
        share_src[i] = share_byte(i);
    static const uint64_t probe = 42;
    bool can = samehost_word_is(parent, (uint64_t)(uintptr_t)&probe, probe);
    atomic_store(&t->can_write, can ? 1 : 2);
    if (!can)
        _exit(0);
    while (!samehost_share_offered(&t->share, 1))
        sched_yield();
    if (kind == WRITER_WRITES) {
        samehost_span s[3];
        share_spans_at(s);
        atomic_store(&t->wrote, samehost_share_write(&t->share, 1, parent, s, 3));
        while (!atomic_load(&t->reader_done))
            sched_yield();
        _exit(0);
    }
    atomic_fetch_add(&t->share.claimed, 1);
    if (kind == WRITER_CLAIMS_AND_STOPS)
        for (;;)
            pause();
    _exit(0);
}

/* The share in memory this process and the writer it forks for kind share; skips the test where
 * the writer cannot write into this process. */
static share_test *share_start(writer_kind kind, pid_t *pid, int *pidfd)
{
    share_test *t = mmap(NULL, sizeof *t, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    TD_CHECK(t != MAP_FAILED);
    memset(t, 0, sizeof *t);
    *pid = share_writer(t, kind);
    *pidfd = samehost_pidfd_open(*pid);
    while (atomic_load(&t->can_write) == 0)
        sched_yield();
    if (atomic_load(&t->can_write) != 1) {
        waitpid(*pid, NULL, 0);
        if (*pidfd >= 0)
            close(*pidfd);
        munmap(t, sizeof *t);
        TD_SKIP(TD_SKIP_GENERIC, "process_vm_writev into another process is not permitted here");
    }
    return t;
}

static void share_finish(share_test *t, int pidfd)
{
    if (pidfd >= 0)
        close(pidfd);
    munmap(t, sizeof *t);
}

TD_TEST(shared_copy_by_both_sides)
{
    pid_t pid;
    int pidfd;
    share_test *t = share_start(WRITER_WRITES, &pid, &pidfd);
    samehost_span s[3];
    share_spans_at(s);
    uint64_t chunks = samehost_share_chunks(s, 3);
    TD_CHECK_EQ(chunks, 5u + 3u + 1u); /* 2 MiB + 777, 1 MiB + 3, 12345 bytes in chunks of 512 KiB */
    samehost_share_offer(&t->share, 1, share_dst);
    /* The writer is let take two chunks first, so that both sides certainly copy. */
    while (atomic_load(&t->share.claimed) < 2)
        sched_yield();
    uint64_t by_writer = 0;
    TD_CHECK_EQ(samehost_share_read(&t->share, pid, pidfd, share_dst, s, 3, TD_DEADLINE_NONE, &by_writer), 0);
    atomic_store(&t->reader_done, 1);
    int status;
    TD_CHECK_EQ(waitpid(pid, &status, 0), pid);
    TD_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    TD_CHECK(by_writer >= 2 && by_writer <= chunks);
    TD_CHECK_EQ(atomic_load(&t->wrote), by_writer);
    TD_CHECK(!samehost_share_offered(&t->share, 1)); /* the offer ended */
    share_check();
    share_finish(t, pidfd);
}

/* A writer that cannot write (here: the offered destination is not writable) leaves its chunk to
 * the reader, which reads it and the rest itself. */
TD_TEST(a_chunk_the_writer_could_not_write_is_read)
{
    pid_t pid;
    int pidfd;
    share_test *t = share_start(WRITER_WRITES, &pid, &pidfd);
    void *locked = mmap(NULL, SHARE_DST_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TD_CHECK(locked != MAP_FAILED);
    samehost_span s[3];
    share_spans_at(s);
    samehost_share_offer(&t->share, 1, locked);
    while (atomic_load(&t->share.failed) == 0)
        sched_yield();
    uint64_t by_writer = 0;
    TD_CHECK_EQ(samehost_share_read(&t->share, pid, pidfd, share_dst, s, 3, TD_DEADLINE_NONE, &by_writer), 0);
    atomic_store(&t->reader_done, 1);
    TD_CHECK_EQ(waitpid(pid, NULL, 0), pid);
    TD_CHECK_EQ(by_writer, 0u);
    TD_CHECK_EQ(atomic_load(&t->wrote), 0u);
    share_check();
    munmap(locked, SHARE_DST_BYTES);
    share_finish(t, pidfd);
}

/* A writer that ends holding a chunk ends the reader's wait (its pidfd), with ESRCH (the reader's
 * own reads of the ended writer fail alike); one that stops
 * holding it keeps the reader until the stall deadline, with ETIMEDOUT (the destination is then
 * never to be let go: here it is share_dst, a static buffer). */
TD_TEST(a_writer_that_ends_or_stops_holding_a_chunk, .params = "ends,stops")
{
    bool ends = strcmp(ctx->param, "ends") == 0;
    pid_t pid;
    int pidfd;
    share_test *t = share_start(ends ? WRITER_CLAIMS_AND_EXITS : WRITER_CLAIMS_AND_STOPS, &pid, &pidfd);
    if (ends && pidfd < 0) {
        waitpid(pid, NULL, 0);
        share_finish(t, pidfd);
        TD_SKIP(TD_SKIP_GENERIC, "no pidfd_open here");
    }
    samehost_span s[3];
    share_spans_at(s);
    samehost_share_offer(&t->share, 1, share_dst);
    while (atomic_load(&t->share.claimed) < 1)
        sched_yield();
    uint64_t by_writer = 7;
    int64_t start = clock_now_ns();
    int err = samehost_share_read(&t->share, pid, pidfd, share_dst, s, 3, start + 200 * 1000000LL, &by_writer);
    int64_t took_ms = (clock_now_ns() - start) / 1000000;
    TD_CHECK_EQ(err, ends ? ESRCH : ETIMEDOUT);
    TD_CHECK_EQ(by_writer, 0u);
    if (!ends)
        TD_CHECK_MSG(took_ms >= 199, "the wait ended after %lld ms, before the stall deadline", (long long)took_ms);
    if (!ends)
        kill(pid, SIGKILL);
    TD_CHECK_EQ(waitpid(pid, NULL, 0), pid);
    share_finish(t, pidfd);
}

TD_TEST_MAIN()
