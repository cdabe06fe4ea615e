/* libFuzzer target for the tcp transport's frame parser and matching (src/transport/tcp.c): the
 * input is the byte stream a peer sends. A transport of two ranks runs over a socketpair whose
 * other end the fuzzer writes: the first bytes choose the receives posted (tags 0 to 3, sizes
 * below 4 KiB, one of them any-source), the rest is written as the peer's stream and then closed.
 * The engine must take each message to its receive, an unexpected buffer or the bin, fail what
 * cannot complete (length mismatches, a stream that ends or lies) with a message, and never read
 * or write outside its buffers, leak, or hang. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "transport/tcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NRECV 4
#define STREAM_MAX (64 * 1024)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 + 2 * NRECV)
        return 0;
    uint8_t plan = data[0];
    size_t sizes[NRECV];
    for (int i = 0; i < NRECV; i++)
        sizes[i] = (size_t)(data[1 + 2 * i] | (data[2 + 2 * i] << 8)) % 4096;
    const uint8_t *stream = data + 1 + 2 * NRECV;
    size_t slen = size - 1 - 2 * NRECV;
    if (slen > STREAM_MAX)
        slen = STREAM_MAX;

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return 0;
    int fds[2] = {-1, sv[0]};
    td_transport *t = NULL;
    if (tcp_transport_from_fds(0, 2, fds, NULL, &t) != TD_OK) {
        close(sv[1]);
        return 0;
    }
    uint8_t *bufs[NRECV];
    td_xfer xs[NRECV + 1];
    bool posted[NRECV + 1] = {false};
    int64_t dl = clock_now_ns() + 30 * 1000000LL;
    for (int i = 0; i < NRECV; i++) {
        bufs[i] = malloc(sizes[i] + 1);
        xs[i].on_done = NULL;
        int peer = (plan & 1) && i == NRECV - 1 ? TD_TRANSPORT_ANY : 1;
        posted[i] = transport_irecv1(t, peer, (uint64_t)i, bufs[i], sizes[i], dl, &xs[i]) == TD_OK;
    }
    /* A send of ours goes out while the stream comes in. */
    xs[NRECV].on_done = NULL;
    posted[NRECV] = transport_isend1(t, 1, 7, data, size < 100 ? size : 100, dl, &xs[NRECV]) == TD_OK;
    size_t off = 0;
    while (off < slen) {
        ssize_t n = write(sv[1], stream + off, slen - off);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    if (!(plan & 2))
        shutdown(sv[1], SHUT_WR); /* else the stream just stops, and the deadline ends the waits */
    for (int i = 0; i <= NRECV; i++) {
        if (!posted[i])
            continue;
        td_status s = transport_wait(t, &xs[i], dl);
        if (s != TD_OK && !xs[i].error[0]) {
            fprintf(stderr, "fuzz_tcp_frames: a failure without a message\n");
            abort();
        }
    }
    transport_destroy(t);
    close(sv[1]);
    for (int i = 0; i < NRECV; i++)
        free(bufs[i]);
    return 0;
}
