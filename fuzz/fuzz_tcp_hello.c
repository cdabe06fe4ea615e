/* libFuzzer target for the tcp transport's handshake parsers (src/transport/tcp_proto.c): the
 * input is what a connecting stranger (hello) or a listening peer (reply) sent. Each parser runs
 * on every prefix of the input, as the bytes would trickle in; it must never read outside them,
 * must ask for more only up to its limit, and what it accepts must encode back to the same bytes
 * (a hello of another version is complete after its fixed part; an answer's proof trails its
 * message).
 * The control-frame parser (goodbye, abort, RTS, FIN) runs on the same bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/tcp_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_tcp_hello: %s\n", what);
        abort();
    }
}

static void hello(const uint8_t *data, size_t size)
{
    for (size_t n = 0; n <= size; n++) {
        td_tcp_hello h;
        size_t need = 0;
        const char *why = NULL;
        td_tcp_parse r = tcp_hello_parse(data, n, &h, &need, &why);
        if (r == TD_TCP_PARSE_BAD) {
            check(why != NULL, "a refusal without a reason");
            return;
        }
        if (r == TD_TCP_PARSE_MORE) {
            check(need > n && need <= TD_TCP_HELLO_MAX, "asks for more than a hello can hold");
            continue;
        }
        check(need <= n, "complete before its bytes are in");
        if (h.version != TD_TCP_VERSION) {
            check(need == TD_TCP_HELLO_FIXED && h.group_len == 0, "another version's hello read past its fixed part");
            return;
        }
        volatile char sink = 0;
        if (h.group_len)
            sink ^= h.group[h.group_len - 1];
        sink ^= (char)(h.conn_nonce[AUTH_NONCE_LEN - 1] ^ h.proof[AUTH_MAC_LEN - 1]);
        (void)sink;
        uint8_t *again = malloc(TD_TCP_HELLO_MAX);
        size_t len = tcp_hello_encode(again, &h);
        check(len == need, "re-encoded hello has another size");
        check(memcmp(again, data, len) == 0, "hello round trip");
        free(again);
        return;
    }
}

static void reply(const uint8_t *data, size_t size)
{
    for (size_t n = 0; n <= size; n++) {
        td_tcp_reply rep;
        size_t need = 0;
        const char *why = NULL;
        td_tcp_parse r = tcp_reply_parse(data, n, &rep, &need, &why);
        if (r == TD_TCP_PARSE_BAD) {
            check(why != NULL, "a bad answer without a reason");
            return;
        }
        if (r == TD_TCP_PARSE_MORE) {
            check(need > n && need <= TD_TCP_REPLY_MAX, "asks for more than an answer can hold");
            continue;
        }
        check(need <= n, "complete before its bytes are in");
        volatile char sink = 0;
        if (rep.msg_len)
            sink ^= rep.msg[rep.msg_len - 1];
        (void)sink;
        if (rep.version != TD_TCP_VERSION) {
            check(need == TD_TCP_REPLY_FIXED + rep.msg_len, "another version's answer read past its message");
            return;
        }
        check(need == TD_TCP_REPLY_FIXED + rep.msg_len + AUTH_MAC_LEN, "an answer without its proof");
        char *msg = malloc(rep.msg_len + 1);
        memcpy(msg, rep.msg, rep.msg_len);
        msg[rep.msg_len] = '\0';
        /* A message with a NUL inside encodes shorter; otherwise the answer is the input again. */
        if (strlen(msg) == rep.msg_len) {
            uint8_t again[TD_TCP_REPLY_MAX];
            size_t len = tcp_reply_encode(again, (int)rep.rank, rep.status, rep.flags, msg, rep.proof);
            check(len == need && memcmp(again, data, len) == 0, "answer round trip");
        }
        free(msg);
        return;
    }
}

static void control(const uint8_t *data, size_t size)
{
    if (size > TD_TCP_CTRL_MAX)
        size = TD_TCP_CTRL_MAX;
    td_tcp_control c;
    if (!tcp_control_parse(data, size, UINT64_C(1) << 40, &c))
        return;
    check(c.type >= TD_TCP_CTRL_BYE && c.type <= TD_TCP_CTRL_FIN, "unknown control type accepted");
    if (c.type == TD_TCP_CTRL_RTS) {
        uint64_t sum = 0;
        for (int i = 0; i < c.iovcnt; i++)
            sum += c.len[i];
        check(c.iovcnt <= TD_TCP_RTS_MAX_IOV && sum == c.total, "RTS pieces do not add up");
        uint8_t again[TD_TCP_RTS_MAX];
        size_t len = tcp_rts_encode(again, c.tag, c.cookie, c.guard_addr, c.guard_value, &c.desc, c.addr, c.len,
                                    c.iovcnt);
        check(len == size && memcmp(again, data, size) == 0, "RTS round trip");
    }
    if (c.type == TD_TCP_CTRL_ABORT) {
        check(c.status < 0 && c.msg_len <= TD_TCP_CTRL_MSG_MAX, "abort fields out of range");
        char *msg = malloc(c.msg_len + 1);
        memcpy(msg, c.msg, c.msg_len);
        msg[c.msg_len] = '\0';
        uint8_t frame[TD_TCP_CTRL_FRAME_MAX];
        size_t len = tcp_control_encode(frame, c.type, c.status, msg);
        /* A message with a NUL inside encodes shorter; otherwise the frame is the input again. */
        if (strlen(msg) == c.msg_len)
            check(len == TD_TCP_HDR_SIZE + size && memcmp(frame + TD_TCP_HDR_SIZE, data, size) == 0,
                  "abort round trip");
        free(msg);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hello(data, size);
    reply(data, size);
    control(data, size);
    return 0;
}
