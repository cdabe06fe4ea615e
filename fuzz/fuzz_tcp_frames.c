/* libFuzzer target for the tcp transport's frame parser and matching (src/transport/tcp.c): the
 * input is the byte stream a peer sends. A transport of two ranks runs over a socketpair whose
 * other end the fuzzer writes: the first bytes choose the receives posted (tags 0 to 3, sizes
 * below 4 KiB, one of them any-source), the rest is written as the peer's stream and then closed.
 * The engine must take each message to its receive, an unexpected buffer or the bin, fail what
 * cannot complete (length mismatches, a stream that ends or lies) with a message, and never read
 * or write outside its buffers, leak, or hang.
 *
 * Single-copy transfers: when plan bit 0x04 is set, the peer agreed to them in the handshake and
 * is this very process (pid = getpid()), so an RTS's address list is read with process_vm_readv
 * (samehost_read_into) and its guard word checked, as for a real peer on the host. The stream is
 * then a list of records: [even type, n, n raw bytes], or an RTS the target encodes from
 * [odd type, tag, pieces, then per piece a 16-bit offset and length into a source buffer of its
 * own], where type 0x02 aims the pieces at unmapped addresses, 0x04 names a guard word that does
 * not hold its value (a sender that aborted) and 0x08 also sends a FIN for a cookie. Each input
 * also runs the single-copy probe's parser (tcp_probe_parse) and its read of the named word. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_xfers.h"
#include "transport/samehost.h"
#include "transport/tcp.h"
#include "transport/tcp_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NRECV FUZZ_NRECV
#define STREAM_MAX (64 * 1024)
#define SOURCE_SIZE (64 * 1024)

static uint8_t g_source[SOURCE_SIZE]; /* what RTS pieces name: this process's memory */
static uint64_t g_guard = UINT64_C(0x5eed5eed5eed5eed);

/* The stream of a single-copy peer: raw records copied, RTS records encoded (see the top). */
static void cma_stream(const uint8_t *in, size_t n, uint8_t *out, size_t *out_len)
{
    size_t off = 0, len = 0;
    while (off + 2 <= n && len + TD_TCP_HDR_SIZE + TD_TCP_RTS_MAX + 64 <= STREAM_MAX) {
        uint8_t type = in[off];
        if (!(type & 1)) {
            size_t k = in[off + 1] < n - off - 2 ? in[off + 1] : n - off - 2;
            memcpy(out + len, in + off + 2, k);
            len += k;
            off += 2 + k;
            continue;
        }
        if (off + 3 > n)
            break;
        uint8_t tag = in[off + 1] % 4;
        int pieces = in[off + 2] % (TD_TCP_RTS_MAX_IOV + 1);
        off += 3;
        uint64_t addr[TD_TCP_RTS_MAX_IOV], plen[TD_TCP_RTS_MAX_IOV];
        for (int i = 0; i < pieces; i++) {
            uint16_t po = 0, pl = 0;
            if (off + 4 <= n) {
                po = (uint16_t)(in[off] | in[off + 1] << 8);
                pl = (uint16_t)(in[off + 2] | in[off + 3] << 8) % 4096;
                off += 4;
            }
            if ((size_t)po + pl > SOURCE_SIZE)
                po = (uint16_t)(SOURCE_SIZE - pl);
            addr[i] = type & 2 ? UINT64_C(0x10) + po : (uint64_t)(uintptr_t)(g_source + po);
            plen[i] = pl;
        }
        uint64_t guard_value = type & 4 ? ~g_guard : g_guard;
        uint8_t *f = out + len;
        size_t pn = tcp_rts_encode(f + TD_TCP_HDR_SIZE, tag, in[off - 1], (uint64_t)(uintptr_t)&g_guard, guard_value,
                                   NULL, addr, plen, pieces);
        tcp_header_encode(f, TD_TAG_RESERVED, pn);
        len += TD_TCP_HDR_SIZE + pn;
        if (type & 8) {
            f = out + len;
            pn = tcp_fin_encode(f + TD_TCP_HDR_SIZE, tag, TD_OK);
            tcp_header_encode(f, TD_TAG_RESERVED, pn);
            len += TD_TCP_HDR_SIZE + pn;
        }
    }
    *out_len = len;
}

/* The single-copy probe as tcp_connect.c reads it: its parser, then the read of the named word
 * in the peer (this process). Reads only. */
static void probe(const uint8_t *data, size_t size)
{
    uint8_t m[TD_TCP_CMA_PROBE_SIZE] = {0};
    memcpy(m, data, size < sizeof m ? size : sizeof m);
    if (size > 0 && (data[0] & 1)) /* aim it at a word that exists */
        memcpy(m + 8, &(uint64_t){(uint64_t)(uintptr_t)&g_guard}, 8);
    uint64_t addr, value;
    if (tcp_probe_parse(m, &addr, &value))
        (void)samehost_word_is(getpid(), addr, value);
}

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
    probe(stream, slen);
    bool cma = plan & 4;
    uint8_t *built = NULL;
    if (cma) {
        if (g_source[1] == 0)
            for (size_t i = 0; i < SOURCE_SIZE; i++)
                g_source[i] = (uint8_t)(i * 131 + 7);
        built = malloc(STREAM_MAX);
        cma_stream(stream, slen, built, &slen);
        stream = built;
    }

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        free(built);
        return 0;
    }
    int fds[2] = {-1, sv[0]};
    td_tcp_peer_info info[2] = {{0}, {.pid = getpid(), .cma_send = (plan & 8) != 0, .cma_recv = true}};
    td_transport *t = NULL;
    if (tcp_transport_from_fds_ex(0, 2, fds, NULL, cma ? info : NULL, &t) != TD_OK) {
        close(sv[1]);
        free(built);
        return 0;
    }
    /* A send of ours goes out while the stream comes in. */
    fuzz_xfers f;
    fuzz_xfers_post(&f, t, sizes, plan & 1, data, size < 100 ? size : 100);
    size_t off = 0;
    while (off < slen) {
        ssize_t n = write(sv[1], stream + off, slen - off);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    if (!(plan & 2))
        shutdown(sv[1], SHUT_WR); /* else the stream just stops, and the deadline ends the waits */
    fuzz_xfers_wait(&f, t, "fuzz_tcp_frames");
    transport_destroy(t);
    close(sv[1]);
    fuzz_xfers_free(&f);
    free(built);
    return 0;
}
