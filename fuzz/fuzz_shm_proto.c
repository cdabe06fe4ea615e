/* libFuzzer target for the shm transport's parsers (src/transport/shm_proto.c): the input is what
 * a peer (or a stranger that connected to the abstract socket) sent as a hello, as control frames
 * on the pair socket, or wrote as a ring header or segment header. Each parser must stay inside
 * the bytes it got, accept only what its limits allow, and what it accepts must encode back to the
 * same bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/shm_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_shm_proto: %s\n", what);
        abort();
    }
}

static void hello(const uint8_t *data, size_t size)
{
    td_shm_hello h;
    const char *why = NULL;
    bool prefix_ok = true;
    for (size_t n = 0; n <= size && n <= TD_SHM_HELLO_SIZE; n++) {
        const char *pwhy = NULL;
        bool ok_now = shm_hello_prefix_ok(data, n, &pwhy);
        check(ok_now || pwhy != NULL, "a prefix refused without a reason");
        check(ok_now || !prefix_ok || n >= 4, "a prefix refused before its magic is in");
        check(!ok_now || prefix_ok, "a refused prefix accepted again with more bytes");
        prefix_ok = ok_now;
        if (!shm_hello_parse(data, n, &h, &why)) {
            check(why != NULL, "a refusal without a reason");
            continue;
        }
        check(n == TD_SHM_HELLO_SIZE, "a hello of another size accepted");
        check(prefix_ok, "a hello accepted whose start was refused");
        check(h.msg_len <= TD_SHM_HELLO_MSG_MAX, "message over its limit");
        uint8_t again[TD_SHM_HELLO_SIZE];
        shm_hello_encode(again, &h);
        /* Bytes after the message are padding, written as zeros. */
        size_t used = TD_SHM_HELLO_MSG_AT + h.msg_len;
        check(memcmp(again, data, used) == 0, "hello round trip");
    }
}

static void control(const uint8_t *data, size_t size)
{
    size_t off = 0;
    while (off <= size) {
        td_shm_control c;
        size_t used = 0;
        td_shm_parse r = shm_control_parse(data + off, size - off, &c, &used);
        if (r != TD_SHM_PARSE_OK)
            return;
        check(used >= TD_SHM_CTRL_HDR && used <= size - off && used <= TD_SHM_CTRL_MAX, "frame size out of range");
        check(c.type == TD_SHM_CTRL_BYE || (c.type == TD_SHM_CTRL_ABORT && c.status < 0), "bad frame accepted");
        char msg[TD_SHM_CTRL_MSG_MAX + 1];
        memcpy(msg, c.msg ? c.msg : "", c.msg_len);
        msg[c.msg_len] = '\0';
        if (strlen(msg) == c.msg_len) {
            uint8_t again[TD_SHM_CTRL_MAX];
            size_t len = shm_control_encode(again, c.type, c.status, c.type == TD_SHM_CTRL_ABORT ? msg : NULL);
            check(len == used && memcmp(again, data + off, used) == 0, "control round trip");
        }
        off += used;
    }
}

static void headers(const uint8_t *data, size_t size)
{
    if (size >= TD_SHM_MSG_HDR) {
        uint64_t tag, len;
        if (shm_msg_parse(data, &tag, &len))
            check(len <= TD_SHM_MAX_MESSAGE, "over-long message accepted");
    }
    if (size >= sizeof(td_shm_seg_header)) {
        td_shm_seg_header h;
        memcpy(&h, data, sizeof h);
        td_shm_layout l = {UINT64_C(1) << 18, UINT64_C(1) << 16, UINT64_C(1) << 20};
        const char *why = NULL;
        if (!shm_seg_header_check(&h, 1, 4, 1 << 22, &l, &why))
            check(why != NULL, "a refusal without a reason");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hello(data, size);
    control(data, size);
    headers(data, size);
    return 0;
}
