/* libFuzzer target for the RPC message envelope (src/rpc/message.c): the input is what a peer
 * sends, a header and the bytes after it. The header is read against a payload limit; when it is
 * accepted it must write back to the same bytes, and the payload (the header's payload_len bytes
 * of what follows, when there are that many) is decoded as views of a storage, then taken apart as
 * the header's type says, and a call's arguments are bound as a function would bind them; a control
 * message of a hello's or an answer's size is read as one (rpc_hello_read, rpc_answer_read), which
 * must write back the same bytes when it accepts them. Nothing
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
    if (h.payload_len > rest)
        return 0;
    if (h.type == RPC_MSG_CONTROL)
        check_control(&h, data + RPC_HEADER_BYTES);
    td_storage *s;
    if (td_storage_new(rest, &s) != TD_OK)
        return 0;
    if (rest)
        memcpy(td_storage_data(s), data + RPC_HEADER_BYTES, rest);
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
