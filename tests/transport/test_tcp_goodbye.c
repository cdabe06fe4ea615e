/* The tcp transport's goodbye at an orderly destroy, when the socket to the peer is full: the
 * messages a rank sent (complete once the socket took them) may still fill it while the peer, alive
 * and slow to read, has not read them. The goodbye must still follow them, or the peer takes the
 * end of the stream for a crash and aborts, failing receives whose messages had all arrived (the
 * rare "Connection to rank 0 lost: end of stream" of a ring broadcast under load). A FIN the
 * destroying rank still owes (the peer's single-copy send completes only at it) must go out too.
 *
 * Deterministic within one process: rank 0's transport runs over one end of a UNIX socketpair, and
 * nothing reads the other end until rank 0's destroy has begun, so the socket is as full as a
 * zero-length send finds it (16-byte frames either go whole or not at all). A helper thread starts
 * reading 200 ms later, so a destroy that does not wait for room has long given up on its goodbye
 * by then; one that waits returns once the reader has drained the socket. The delay only makes a
 * regression show; the case passes however late the reader comes (within the destroy's 10 s). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <tdist/testing.h>

#include "base/buf.h"
#include "base/clock.h"
#include "base/thread.h"
#include "transport/tcp.h"
#include "transport/tcp_proto.h"
#include "transport/transport.h"

#define FILL_TAG 7
#define READER_DELAY_MS 200

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Zero-length sends from t to peer 1 until the socket refuses one (it stays queued in *pending,
 * never written, and fails at the destroy). Returns how many went out. */
static int fill_socket(td_transport *t, td_xfer *pending)
{
    for (int n = 0; n < 1000000; n++) {
        TD_CHECK_OK(transport_isend1(t, 1, FILL_TAG, NULL, 0, TD_DEADLINE_NONE, pending));
        if (!xfer_done(pending))
            return n;
        TD_CHECK_OK(transport_wait(t, pending, TD_DEADLINE_NONE));
    }
    TD_FAIL("the socket took a million frames without filling up");
}

/* ---- a transport reads the goodbye -------------------------------------------------------------- */

typedef struct late_rank {
    int fd;
    td_transport *t;
    td_status st;
} late_rank;

/* Rank 1 comes late: its transport (whose I/O thread reads at once) starts after the delay. */
static void *late_rank_main(void *arg)
{
    late_rank *l = arg;
    sleep_ms(READER_DELAY_MS);
    int fds[2] = {l->fd, -1};
    l->st = tcp_transport_from_fds(1, 2, fds, NULL, &l->t);
    return NULL;
}

/* Every message rank 0 sent arrives, and then its close reads as a goodbye ("closed its end"),
 * not as a lost connection. */
TD_TEST(goodbye_behind_full_socket)
{
    int sv[2];
    TD_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    td_transport *t0 = NULL;
    int fds0[2] = {-1, sv[0]};
    TD_CHECK_OK(tcp_transport_from_fds(0, 2, fds0, NULL, &t0));
    td_xfer pending;
    memset(&pending, 0, sizeof pending);
    int sent = fill_socket(t0, &pending);
    TD_CHECK(sent > 0);

    late_rank l = {.fd = sv[1]};
    pthread_t th;
    TD_CHECK_OK(thread_start(&th, "td-late-rank", late_rank_main, &l));
    int64_t t_start = clock_now_ns();
    transport_destroy(t0);
    double waited = (double)(clock_now_ns() - t_start) / 1e9;
    thread_join(th);
    TD_CHECK_OK(l.st);
    TD_CHECK_MSG(waited < 8.0, "the destroy waited %.1f s for a peer that was reading", waited);

    /* The close first (a receive that only the close ends, refused at once if rank 1 has seen it
     * already), so that the messages below are taken only after rank 1 has seen it. */
    char byte;
    td_xfer last;
    memset(&last, 0, sizeof last);
    td_status st = transport_irecv1(l.t, 0, FILL_TAG + 1, &byte, 1, clock_now_ns() + 30 * 1000000000LL, &last);
    if (st == TD_OK)
        st = transport_wait(l.t, &last, TD_DEADLINE_NONE);
    TD_CHECK_ERR(st, TD_ERR_PEER_LOST, "closed its end");
    for (int i = 0; i < sent; i++) {
        st = transport_recv(l.t, 0, FILL_TAG, NULL, 0, clock_now_ns() + 30 * 1000000000LL);
        TD_CHECK_MSG(st == TD_OK, "message %d of %d sent before the destroy: %s: %s", i, sent, td_status_str(st),
                     td_last_error());
    }
    TD_CHECK_ERR(transport_recv(l.t, 0, FILL_TAG, NULL, 0, TD_DEADLINE_NONE), TD_ERR_PEER_LOST, "closed its end");
    transport_destroy(l.t);
}

/* ---- a raw peer reads the FIN and the goodbye --------------------------------------------------- */

typedef struct raw_reader {
    int fd;
    td_buf got;
} raw_reader;

static void *raw_reader_main(void *arg)
{
    raw_reader *r = arg;
    sleep_ms(READER_DELAY_MS);
    for (;;) {
        char b[4096];
        ssize_t n = read(r->fd, b, sizeof b);
        if (n <= 0)
            break;
        buf_append(&r->got, b, (size_t)n);
    }
    return NULL;
}

/* A frame from the raw bytes at *off: its tag and payload. False at the end. */
static bool next_frame(const td_buf *b, size_t *off, uint64_t *tag, const uint8_t **payload, uint64_t *len)
{
    if (*off == b->len)
        return false;
    TD_CHECK_MSG(b->len - *off >= TD_TCP_HDR_SIZE, "a partial frame header at byte %zu of %zu", *off, b->len);
    tcp_header_decode((const uint8_t *)b->data + *off, tag, len);
    *off += TD_TCP_HDR_SIZE;
    TD_CHECK_MSG(b->len - *off >= *len, "a partial frame of %llu bytes at byte %zu of %zu", (unsigned long long)*len,
                 *off, b->len);
    *payload = (const uint8_t *)b->data + *off;
    *off += *len;
    return true;
}

/* Rank 0 takes a single-copy (RTS) message from a raw rank 1 while its socket to rank 1 is full,
 * so its FIN stays queued; the destroy still writes the FIN, then the goodbye. */
TD_TEST(goodbye_keeps_owed_fin)
{
    static uint64_t probe = 0x1234567890abcdefULL;
    uint64_t seen = 0;
    struct iovec l = {&seen, sizeof seen}, rm = {&probe, sizeof probe};
    if (process_vm_readv(getpid(), &l, 1, &rm, 1, 0) != (ssize_t)sizeof seen || seen != probe)
        TD_SKIP(TD_SKIP_GENERIC, "process_vm_readv of this process is not permitted here");

    int sv[2];
    TD_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    td_tcp_peer_info info[2] = {{0}, {.pid = getpid(), .cma_recv = true}};
    td_transport *t0 = NULL;
    int fds0[2] = {-1, sv[0]};
    TD_CHECK_OK(tcp_transport_from_fds_ex(0, 2, fds0, NULL, info, &t0));
    td_xfer pending;
    memset(&pending, 0, sizeof pending);
    int sent = fill_socket(t0, &pending);
    TD_CHECK(sent > 0);

    /* Rank 1's RTS, naming a message in this process's memory. */
    enum { N = 100000 };
    static uint8_t src[N], dst[N];
    for (size_t i = 0; i < N; i++)
        src[i] = (uint8_t)(i * 7 + 3);
    static uint64_t guard = 0x600dULL;
    const uint64_t tag = (UINT64_C(1) << 63) | 5, cookie = 42;
    uint64_t addr = (uint64_t)(uintptr_t)src, len = N;
    uint8_t frame[TD_TCP_HDR_SIZE + TD_TCP_RTS_MAX];
    size_t plen = tcp_rts_encode(frame + TD_TCP_HDR_SIZE, tag, cookie, (uint64_t)(uintptr_t)&guard, guard, NULL,
                                 &addr, &len, 1);
    tcp_header_encode(frame, TD_TAG_RESERVED, plen);
    td_xfer rx;
    memset(&rx, 0, sizeof rx);
    TD_CHECK_OK(transport_irecv1(t0, 1, tag, dst, N, TD_DEADLINE_NONE, &rx));
    TD_CHECK(write(sv[1], frame, TD_TCP_HDR_SIZE + plen) == (ssize_t)(TD_TCP_HDR_SIZE + plen));
    TD_CHECK_OK(transport_wait(t0, &rx, TD_DEADLINE_NONE));
    TD_CHECK(memcmp(src, dst, N) == 0);

    raw_reader r = {.fd = sv[1], .got = TD_BUF_INIT};
    pthread_t th;
    TD_CHECK_OK(thread_start(&th, "td-raw-reader", raw_reader_main, &r));
    transport_destroy(t0);
    thread_join(th);
    close(sv[1]);

    size_t off = 0;
    uint64_t ftag, flen;
    const uint8_t *payload;
    for (int i = 0; i < sent; i++) {
        TD_CHECK_MSG(next_frame(&r.got, &off, &ftag, &payload, &flen), "the stream ended after %d of %d messages", i,
                     sent);
        TD_CHECK_MSG(ftag == FILL_TAG && flen == 0, "frame %d: tag %llu, %llu bytes", i, (unsigned long long)ftag,
                     (unsigned long long)flen);
    }
    td_tcp_control c;
    TD_CHECK_MSG(next_frame(&r.got, &off, &ftag, &payload, &flen), "the stream ended before the FIN");
    TD_CHECK(ftag == TD_TAG_RESERVED && tcp_control_parse(payload, flen, TD_TCP_MAX_MESSAGE, &c));
    TD_CHECK_EQ(c.type, TD_TCP_CTRL_FIN);
    TD_CHECK_EQ(c.cookie, cookie);
    TD_CHECK_EQ(c.status, TD_OK);
    TD_CHECK_MSG(next_frame(&r.got, &off, &ftag, &payload, &flen), "the stream ended before the goodbye");
    TD_CHECK(ftag == TD_TAG_RESERVED && tcp_control_parse(payload, flen, TD_TCP_MAX_MESSAGE, &c));
    TD_CHECK_EQ(c.type, TD_TCP_CTRL_BYE);
    TD_CHECK_MSG(!next_frame(&r.got, &off, &ftag, &payload, &flen), "bytes after the goodbye");
    buf_free(&r.got);
}

TD_TEST_MAIN()
