/* libFuzzer target for the td_value codec's decoder (src/tensor/codec.c): the input is a message
 * from a peer. Both decode paths run on it (copying, and zero-copy views of a storage holding
 * it); must never crash, leak or read out of bounds, and may fail only with TD_ERR_INVALID. What
 * decodes must encode again and decode again to the same value. */
#include <math.h>
#include <stdbool.h>
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

/* Whether v holds a NaN anywhere (NaN equals nothing, so such a value never equals its copy). */
static bool has_nan(const td_value *v)
{
    switch (td_value_kind_of(v)) {
    case TD_VAL_DOUBLE:
        return isnan(td_value_get_double(v));
    case TD_VAL_COMPLEX: {
        double re, im;
        td_value_get_complex(v, &re, &im);
        return isnan(re) || isnan(im);
    }
    case TD_VAL_TENSOR: {
        td_tensor *t = td_value_get_tensor(v);
        td_dtype dt = td_tensor_dtype(t);
        if (!td_dtype_is_floating(dt) && !td_dtype_is_complex(dt))
            return false;
        size_t nbytes = td_tensor_nbytes(t), es = td_dtype_size(dt);
        unsigned char *buf = malloc(nbytes ? nbytes : 1);
        check(td_tensor_read(t, buf, nbytes) == TD_OK, "reading a decoded tensor failed");
        bool nan = false;
        size_t step = td_dtype_is_complex(dt) ? es / 2 : es;
        for (size_t off = 0; off < nbytes && !nan; off += step) {
            uint16_t h;
            float f;
            double d;
            if (step == 2) {
                memcpy(&h, buf + off, 2);
                nan = isnan(dt == TD_FLOAT16 ? td_half_to_float(h) : td_bfloat16_to_float(h));
            } else if (step == 4) {
                memcpy(&f, buf + off, 4);
                nan = isnan(f);
            } else {
                memcpy(&d, buf + off, 8);
                nan = isnan(d);
            }
        }
        free(buf);
        return nan;
    }
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD:
        for (size_t i = 0; i < td_value_len(v); i++)
            if (has_nan(td_value_at(v, i)))
                return true;
        return false;
    case TD_VAL_DICT:
        for (size_t i = 0; i < td_value_len(v); i++)
            if (has_nan(td_value_dict_key_at(v, i)) || has_nan(td_value_dict_value_at(v, i)))
                return true;
        return false;
    default:
        return false;
    }
}

/* Encoding what was decoded is canonical: encoding its decoded copy gives the same bytes, and the
 * copy prints the same and (NaN aside, which equals nothing) compares equal. */
static void check_reencodes(const td_value *v)
{
    void *msg, *msg2;
    size_t len, len2;
    check(td_value_encode_bytes(v, &msg, &len) == TD_OK, "re-encoding a decoded value failed");
    td_value *again;
    check(td_value_decode(msg, len, &again) == TD_OK, "decoding a re-encoded value failed");
    check(td_value_encode_bytes(again, &msg2, &len2) == TD_OK, "encoding a second time failed");
    check(len == len2 && memcmp(msg, msg2, len) == 0, "a second round trip changed the bytes");
    char *a = td_value_format(v), *b = td_value_format(again);
    check(strcmp(a, b) == 0, "a round trip changed the printed value");
    if (!has_nan(v))
        check(td_value_equal(v, again), "a round trip changed the value");
    free(a);
    free(b);
    td_value_release(again);
    free(msg);
    free(msg2);
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
