/* libFuzzer target for the loader of tdist save files (src/tensor/serialize.c): the input is a file
 * someone gave us. Loaded as it is (no devices exist here, so a tensor saved on one fails with the
 * deserialize message before anything is allocated) and with map_location "cpu" (every tensor
 * rebuilt on the host); must never crash, leak or read out of bounds, and may fail only with
 * TD_ERR_INVALID. What loads must save and load again to an equal value. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <tdist/device.h>
#include <tdist/value.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_save_load: %s: %s\n", what, td_last_error());
        abort();
    }
}

static void load_once(const uint8_t *data, size_t size, const td_tensor_map_location *map)
{
    td_value *v = NULL;
    td_status st = td_value_load_bytes(data, size, map, &v);
    if (st != TD_OK) {
        check(st == TD_ERR_INVALID, "a load failed with a code other than TD_ERR_INVALID");
        check(v == NULL, "a failed load returned a value");
        return;
    }
    void *again = NULL;
    size_t len = 0;
    st = td_value_save_bytes(v, &again, &len);
    if (st == TD_OK) {
        td_value *back = NULL;
        td_tensor_map_location to_cpu = {.device = "cpu"};
        check(td_value_load_bytes(again, len, &to_cpu, &back) == TD_OK, "a saved value does not load");
        /* NaNs equal nothing but themselves (a dict's NaN key finds itself by identity, as in
         * Python), so a value may equal itself and not its copy: compare only when two loads
         * of the same bytes are equal. */
        td_value *twin = NULL;
        check(td_value_load_bytes(data, size, map, &twin) == TD_OK, "a second load of the same bytes failed");
        if (td_value_equal(v, twin))
            check(td_value_equal(v, back), "a value changed through save and load");
        td_value_release(twin);
        td_value_release(back);
        free(again);
    } else {
        /* the only values that cannot be saved again carry the reserved record tag or tensor keys */
        check(st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED, "saving a loaded value failed oddly");
    }
    td_value_release(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    load_once(data, size, NULL);
    td_tensor_map_location to_cpu = {.device = "cpu"};
    load_once(data, size, &to_cpu);
    return 0;
}
