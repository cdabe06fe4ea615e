/* libFuzzer target for the td_value codec's decoder (src/tensor/codec.c): the input is a message
 * from a peer. Both decode paths run on it (copying, and zero-copy views of a storage holding
 * it); must never crash, leak or read out of bounds, and may fail only with TD_ERR_INVALID. What
 * decodes must encode again, and decode again to an equal value. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/value.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_value_decode: %s: %s\n", what, td_last_error());
        abort();
    }
}

static void check_reencodes(const td_value *v)
{
    void *msg;
    size_t len;
    check(td_value_encode_bytes(v, &msg, &len) == TD_OK, "re-encoding a decoded value failed");
    td_value *again;
    check(td_value_decode(msg, len, &again) == TD_OK, "decoding a re-encoded value failed");
    /* NaN never equals itself, so only a value that equals itself must equal its round trip. */
    if (td_value_equal(v, v))
        check(td_value_equal(v, again), "a round trip changed the value");
    td_value_release(again);
    free(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    td_value *v = NULL;
    td_status st = td_value_decode(data, size, &v);
    check(st == TD_OK || st == TD_ERR_INVALID, "td_value_decode returned an unexpected status");
    if (st == TD_OK) {
        check_reencodes(v);
        td_value_release(v);
    }

    td_storage *s;
    if (td_storage_new(size, &s) != TD_OK)
        return 0;
    if (size)
        memcpy(td_storage_data(s), data, size);
    st = td_value_decode_storage(s, &v);
    td_storage_release(s);
    check(st == TD_OK || st == TD_ERR_INVALID, "td_value_decode_storage returned an unexpected status");
    if (st == TD_OK) {
        check_reencodes(v);
        td_value_release(v);
    }
    return 0;
}
