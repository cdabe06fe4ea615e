/* libFuzzer target for the RPC message envelope (src/rpc/message.c): the input is what a peer
 * sends, a header and the bytes after it. The header is read against a payload limit; when it is
 * accepted it must write back to the same bytes, and the payload (the header's payload_len bytes
 * of what follows, when there are that many) is decoded as views of a storage, then taken apart as
 * the header's type says, and a call's arguments are bound as a function would bind them; a control
 * message of a hello's or an answer's size is read as one (rpc_hello_read, rpc_answer_read), which
 * must write back the same bytes when it accepts them. A message with RPC_FLAG_PIECES has its piece
 * table read as the I/O thread reads it (rpc_pieces_count, rpc_pieces_read): an accepted table
 * writes back the same bytes, and the stream's bytes placed around its pieces (rpc_pieces_place)
 * cover exactly the payload's other bytes; the payload is then built as the receiver builds it
 * (the stream's bytes in the gaps, the pieces, which a real receiver reads from the sender's
 * memory, filled with a pattern) and decoded. Nothing
 * may crash, leak or read out of bounds, and every failure is TD_ERR_INVALID (a failed binding is
 * the function's TypeError, TD_ERR_REMOTE). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/rpc.h>
#include <tdist/value.h>

#include "rpc/message.h"
#include "rpc/registry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_PAYLOAD (1u << 20)

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_rpc_message: %s: %s\n", what, td_last_error());
        abort();
    }
}

static void check_call(const td_value *payload)
{
    const char *fn;
    const td_value *args, *kwargs;
    td_status st = rpc_call_parts(payload, &fn, &args, &kwargs);
    check(st == TD_OK || st == TD_ERR_INVALID, "rpc_call_parts returned an unexpected status");
    if (st != TD_OK)
        return;
    /* What a callee does next: rebuild nothing, bind the arguments. */
    const td_value *bound[3];
    st = td_rpc_bind(fn, "a,b,c=x", args, kwargs, bound);
    check(st == TD_OK || st == TD_ERR_REMOTE, "td_rpc_bind returned an unexpected status");
    /* A call payload built from the parts is the same value. */
    td_value *again;
    check(rpc_call_payload(fn, args, kwargs, &again) == TD_OK, "rebuilding a decoded call failed");
    char *a = td_value_format(payload), *b = td_value_format(again);
    check(strcmp(a, b) == 0, "rebuilding a decoded call changed it");
    free(a);
    free(b);
    td_value_release(again);
}

/* The hello and its answer are raw bytes, not td_values: what the listener and the connector read
 * before anything else. */
static void check_control(const rpc_header *h, const uint8_t *payload)
{
    td_status st;
    if (h->payload_len == RPC_HELLO_PAYLOAD) {
        rpc_hello hello;
        uint8_t again[RPC_HELLO_PAYLOAD];
        st = rpc_hello_read(payload, &hello);
        check(st == TD_OK || st == TD_ERR_INVALID, "rpc_hello_read returned an unexpected status");
        if (st == TD_OK) {
            rpc_hello_write(&hello, again);
            check(memcmp(again, payload, sizeof again) == 0, "an accepted hello does not write back the same bytes");
        }
    } else if (h->payload_len == RPC_ANSWER_PAYLOAD) {
        rpc_answer ans;
        uint8_t again[RPC_ANSWER_PAYLOAD];
        st = rpc_answer_read(payload, &ans);
        check(st == TD_OK || st == TD_ERR_INVALID, "rpc_answer_read returned an unexpected status");
        if (st == TD_OK) {
            rpc_answer_write(&ans, again);
            check(memcmp(again, payload, sizeof again) == 0, "an accepted answer does not write back the same bytes");
        }
    }
}

/* Reads the piece table at *data (size bytes left) for a payload of payload_len bytes as the I/O
 * thread does, checks what it accepts, and builds the payload from the bytes after it into out.
 * False when the table is refused or the input ends first. */
static int with_pieces(const uint8_t *data, size_t size, uint64_t payload_len, td_storage **out)
{
    if (size < RPC_PIECES_HEAD)
        return 0;
    uint32_t count = 0;
    td_status st = rpc_pieces_count(data, &count);
    check(st == TD_OK || st == TD_ERR_INVALID, "rpc_pieces_count returned an unexpected status");
    if (st != TD_OK)
        return 0;
    size_t table = RPC_PIECES_HEAD + (size_t)count * RPC_PIECE_BYTES;
    if (size < table)
        return 0;
    rpc_pieces p;
    st = rpc_pieces_read(data + RPC_PIECES_HEAD, count, payload_len, &p);
    check(st == TD_OK || st == TD_ERR_INVALID, "rpc_pieces_read returned an unexpected status");
    if (st != TD_OK)
        return 0;
    uint8_t again[RPC_PIECES_WIRE_MAX];
    check(rpc_pieces_write(&p, again) == table && memcmp(again, data, table) == 0,
          "an accepted piece table does not write back the same bytes");
    check(p.bytes <= payload_len, "the pieces are longer than the payload");
    uint64_t inline_total = payload_len - p.bytes;
    if (size - table < inline_total)
        return 0;
    if (td_storage_new((size_t)payload_len, out) != TD_OK)
        return 0;
    uint8_t *base = td_storage_data(*out);
    for (uint32_t i = 0; i < p.count; i++)
        memset(base + p.piece[i].offset, 0xA5, (size_t)p.piece[i].len);
    for (uint64_t done = 0; done < inline_total;) {
        uint64_t room = 0, at = rpc_pieces_place(&p, payload_len, done, &room);
        check(room > 0 && at < payload_len && room <= payload_len - at, "a stream byte placed outside the payload");
        for (uint32_t i = 0; i < p.count; i++)
            check(at + room <= p.piece[i].offset || at >= p.piece[i].offset + p.piece[i].len,
                  "a stream byte placed inside a piece");
        if (room > inline_total - done)
            room = inline_total - done;
        memcpy(base + at, data + table + done, (size_t)room);
        done += room;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < RPC_HEADER_BYTES)
        return 0;
    rpc_header h;
    td_status st = rpc_header_read(data, MAX_PAYLOAD, &h);
    check(st == TD_OK || st == TD_ERR_INVALID, "rpc_header_read returned an unexpected status");
    if (st != TD_OK)
        return 0;
    uint8_t again[RPC_HEADER_BYTES];
    rpc_header_write(&h, again);
    check(memcmp(again, data, RPC_HEADER_BYTES) == 0, "an accepted header does not write back the same bytes");

    size_t rest = size - RPC_HEADER_BYTES;
    td_storage *s;
    if (h.flags & RPC_FLAG_PIECES) {
        if (!with_pieces(data + RPC_HEADER_BYTES, rest, h.payload_len, &s))
            return 0;
    } else {
        if (h.payload_len > rest)
            return 0;
        if (h.type == RPC_MSG_CONTROL)
            check_control(&h, data + RPC_HEADER_BYTES);
        if (td_storage_new(rest, &s) != TD_OK)
            return 0;
        if (rest)
            memcpy(td_storage_data(s), data + RPC_HEADER_BYTES, rest);
    }
    td_value *v = NULL;
    st = rpc_payload_decode(&h, s, &v);
    td_storage_release(s);
    check(st == TD_OK || st == TD_ERR_INVALID, "rpc_payload_decode returned an unexpected status");
    if (st != TD_OK)
        return 0;
    check(h.payload_len != 0 || v == NULL, "an empty payload decoded to a value");
    if (h.type == RPC_MSG_CALL) {
        check_call(v);
    } else if (h.type == RPC_MSG_ERROR) {
        const char *type, *message;
        st = rpc_error_parts(v, &type, &message);
        check(st == TD_OK || st == TD_ERR_INVALID, "rpc_error_parts returned an unexpected status");
    }
    td_value_release(v);
    return 0;
}
