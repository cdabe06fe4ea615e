/* libFuzzer target for the TCPStore server's request handling (src/store/store_proto.c,
 * tcp_core.c) and the client's reply parsers.
 *
 * The input drives three things:
 *  1. store_parse_request over the raw bytes, as one request stream (small limits, so the
 *     limit checks are reached);
 *  2. the server's state machine with three fake connections: the input is cut into chunks, each
 *     fed to one connection and processed (parking, waking, cancelling, refusing), with the
 *     connection dropped and replaced when the core rejects its bytes, and output drained at
 *     random points;
 *  3. store_check_reply_header and store_parse_values over the same bytes.
 * Every connection's first chunk is prefixed with a valid HELLO half of the time, so the fuzzer
 * gets past the handshake into the commands. A chunk whose control byte has bits 0x1c set is not
 * sent as it is but describes a large request the target builds (SET or APPEND of a value up to
 * about 1 MiB, MULTI_GET or MULTI_SET of up to 8191 copies of one key): the core runs with a
 * 1 MiB value limit and a 4 MiB reply limit, so a small input reaches large values, replies over
 * the limit (refused with an ERROR) and large queued output. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/buf.h"
#include "base/vec.h"
#include "store/tcp_core.h"
#include "store/store_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const td_store_limits kLimits = {.max_key = 64, .max_value = 4096};
/* The core's: values up to 1 MiB, replies up to 4 MiB. */
static const td_store_limits kCoreLimits = {.max_key = 64, .max_value = 1 << 20};
#define CORE_MAX_REPLY ((uint64_t)4 << 20)
#define BIG_CHUNK 0x1c

static void parse_stream(const uint8_t *data, size_t size)
{
    td_store_slice_vec ks = {0}, vs = {0};
    size_t off = 0;
    while (off < size) {
        td_store_request req;
        size_t used = 0, frame = 0;
        if (store_parse_request(data + off, size - off, &kLimits, &ks, &vs, &req, &used, &frame) != TD_OK ||
            used == 0)
            break;
        /* Touch every slice the parser returned: ASan checks they lie inside the input. */
        volatile uint8_t sink = 0;
        if (req.key.len)
            sink ^= req.key.data[req.key.len - 1];
        if (req.value.len)
            sink ^= req.value.data[req.value.len - 1];
        for (size_t i = 0; i < req.nkeys; i++)
            if (req.keys[i].len)
                sink ^= req.keys[i].data[req.keys[i].len - 1];
        (void)sink;
        off += used;
    }
    TD_VEC_FREE(&ks);
    TD_VEC_FREE(&vs);
}

static void add_hello(td_buf *in)
{
    uint8_t nonce[AUTH_NONCE_LEN];
    memset(nonce, 0x5a, sizeof nonce);
    store_put_hello(in, TD_STORE_PROTO_MAGIC, TD_STORE_PROTO_VERSION, nonce, AUTH_NONCE_LEN);
}

/* Appends the large request that g (n bytes) describes: g[0] the command, g[1] the key's byte,
 * g[2..3] a size (KiB of value, or a count of keys), g[4] the value's byte. */
static void add_big(td_buf *in, const uint8_t *g, size_t n)
{
    if (n < 5)
        return;
    static const uint8_t cmds[] = {TD_STORE_CMD_SET, TD_STORE_CMD_APPEND, TD_STORE_CMD_MULTI_GET,
                                   TD_STORE_CMD_MULTI_SET, TD_STORE_CMD_COMPARE_SET};
    uint8_t cmd = cmds[g[0] % sizeof cmds];
    char key[2] = {'k', (char)g[1]};
    size_t amount = (size_t)(g[2] | (g[3] << 8));
    size_t off = store_msg_begin(in, cmd);
    if (cmd == TD_STORE_CMD_MULTI_GET || cmd == TD_STORE_CMD_MULTI_SET) {
        size_t count = amount % 8192;
        buf_put_u32(in, (uint32_t)count);
        for (size_t i = 0; i < count; i++) {
            store_put_key(in, NULL, key, sizeof key);
            if (cmd == TD_STORE_CMD_MULTI_SET)
                store_put_value(in, &g[4], 1);
        }
    } else {
        /* Up to 1100 KiB: a little over the value limit, which the parser refuses. */
        size_t len = (amount % 1101) * 1024;
        store_put_key(in, NULL, key, sizeof key);
        if (cmd == TD_STORE_CMD_COMPARE_SET)
            store_put_value(in, "", 0);
        buf_put_u64(in, (uint64_t)len);
        memset(buf_extend(in, len), g[4], len);
    }
    store_msg_end(in, off);
}

static void drive_core(const uint8_t *data, size_t size)
{
    /* With a secret, the fuzzer's connections stop at AUTH (it cannot make a proof): that mode
     * drives the handshake's refusals; without one, everything after HELLO. */
    auth_key key;
    auth_key_init(size > 0 && (data[0] & 1) ? "tk" : "", &key);
    td_store_core *core = store_core_new(&kCoreLimits, &key);
    store_core_set_max_reply(core, CORE_MAX_REPLY);
    td_store_conn *conns[3];
    bool fresh[3];
    for (int i = 0; i < 3; i++) {
        conns[i] = store_core_attach(core, NULL);
        fresh[i] = true;
    }
    size_t off = size > 0 ? 1 : 0;
    while (off + 2 <= size) {
        uint8_t ctl = data[off], n = data[off + 1];
        off += 2;
        size_t len = n < size - off ? n : size - off;
        int i = ctl % 3;
        td_buf *in = store_conn_input(conns[i]);
        if (fresh[i] && (ctl & 0x40))
            add_hello(in);
        fresh[i] = false;
        if ((ctl & BIG_CHUNK) == BIG_CHUNK)
            add_big(in, data + off, len);
        else
            buf_append(in, data + off, len);
        off += len;
        if (store_core_process(core, conns[i]) != TD_OK || (ctl & 0x80)) {
            /* Rejected (or the client hung up): the server drops the connection. */
            store_core_detach(core, conns[i]);
            conns[i] = store_core_attach(core, NULL);
            fresh[i] = true;
        }
        td_store_conn *d;
        while ((d = store_core_pop_dirty(core))) {
            if (ctl & 0x20)
                continue; /* leave some output queued */
            size_t olen;
            store_conn_output(d, &olen);
            store_conn_output_done(d, olen);
        }
    }
    store_core_free(core);
}

static void parse_replies(const uint8_t *data, size_t size)
{
    if (size < TD_STORE_HEADER_LEN)
        return;
    uint8_t kind;
    uint64_t len;
    if (store_check_reply_header(data, 1 << 20, &kind, &len) != TD_OK)
        return;
    const uint8_t *body = data + TD_STORE_HEADER_LEN;
    size_t have = size - TD_STORE_HEADER_LEN;
    if (len > have)
        return;
    td_store_slice vals[8];
    size_t n = have > 4 ? body[0] % 9 : 0;
    store_parse_values(body, (size_t)len, n, vals);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse_stream(data, size);
    drive_core(data, size);
    parse_replies(data, size);
    return 0;
}
