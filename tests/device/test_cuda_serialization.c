/* Saving and loading with device remapping (spec/cuda_multigpu.md section 8), named after the
 * test_cuda_multigpu.py tests they port: a file patched from "cuda:0" to "cuda:9" fails with
 * PyTorch's message before anything is allocated (test_load_nonexistent_device), map_location as
 * a callback and as a table (test_multigpu_serialization_remap, _remap_dict), clone and dtype
 * conversions keeping the device (test_multigpu_storage_clone); and the rest of the format: nested
 * values with host tensors, views and a tensor saved twice, map_location to the cpu, the
 * "is_available() is False" message, and malformed files refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/device.h>
#include <tdist/testing.h>

#include "device_util.h"


static td_tensor *randn_on(td_device d, td_shape shape)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_empty_on(d, TD_FLOAT32, shape, NULL, &t));
    TD_CHECK_OK(td_tensor_normal_(t, 0.0, 1.0));
    return t;
}

static char *loc(td_device d, char *buf, size_t len) { return td_device_str(d, buf, len); }

/* "CUDA" / "SIM": how the deserialize message names a type. */
static const char *upper_name(td_device_type type) { return type == TD_DEVICE_CUDA ? "CUDA" : "SIM"; }

/* Replaces the occurrences of `from` by `to` (same length) in data, as bytes.replace; returns how
 * many it replaced; with only_nth >= 0, replaces that occurrence alone. */
static int replace_bytes(uint8_t *data, size_t len, const char *from, const char *to, int only_nth)
{
    size_t n = strlen(from);
    int seen = 0, replaced = 0;
    for (size_t i = 0; i + n <= len; i++) {
        if (memcmp(data + i, from, n) != 0)
            continue;
        if (only_nth < 0 || seen == only_nth) {
            memcpy(data + i, to, n);
            replaced++;
        }
        seen++;
        i += n - 1;
    }
    return replaced;
}

/* How many allocations the caching allocator of d has ever made (allocation.all.allocated). */
static int64_t allocations_made(td_device d)
{
    td_memory_stats stats;
    int64_t n = -1;
    TD_CHECK_OK(td_memory_stats_get(d, &stats));
    TD_CHECK_OK(td_memory_stats_lookup(&stats, "allocation.all.allocated", &n));
    return n;
}

static void path_in(td_test_ctx *ctx, const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", ctx->tmpdir, name);
}

/* test_load_nonexistent_device */
TD_TEST(test_load_nonexistent_device, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    int count = td_device_count(type);
    if (count >= 10)
        TD_SKIP(TD_SKIP_GENERIC, "device 9 exists");
    td_tensor *tensor = randn_on(dev(0), TD_SHAPE(2));
    void *data = NULL;
    size_t len = 0;
    td_value *v = td_value_tensor(tensor);
    TD_CHECK_OK(td_value_save_bytes(v, &data, &len));
    td_value_release(v);
    /* the file form writes the same bytes */
    char path[512];
    path_in(ctx, "tensor.tds", path, sizeof path);
    TD_CHECK_OK(td_tensor_save(tensor, path));
    FILE *f = fopen(path, "rb");
    TD_CHECK(f != NULL);
    uint8_t *file_bytes = malloc(len + 1);
    TD_CHECK_EQ(fread(file_bytes, 1, len + 1, f), len);
    fclose(f);
    TD_CHECK(memcmp(file_bytes, data, len) == 0);
    free(file_bytes);
    TD_CHECK_EQ(unlink(path), 0);
    char from[16], to[16], want[256];
    loc(dev(0), from, sizeof from);
    snprintf(to, sizeof to, "%s:9", td_device_type_name(type));
    TD_CHECK_EQ(replace_bytes(data, len, from, to, -1), 1);

    int64_t made = allocations_made(dev(0));
    td_value *out = NULL;
    snprintf(want, sizeof want,
             "Attempting to deserialize object on %s device 9 but torch.%s.device_count() is %d. Please use "
             "torch.load with map_location to map your storages to an existing device.",
             upper_name(type), td_device_type_name(type), count);
    TD_CHECK_ERR(td_value_load_bytes(data, len, NULL, &out), TD_ERR_INVALID, want);
    TD_CHECK(out == NULL);
    TD_CHECK_EQ(allocations_made(dev(0)), made);

    /* map_location to an existing device loads it, with its values */
    td_tensor_map_location to_cpu = {.device = "cpu"};
    TD_CHECK_OK(td_value_load_bytes(data, len, &to_cpu, &out));
    TD_CHECK_EQ(td_value_kind_of(out), TD_VAL_TENSOR);
    TD_CHECK_EQ(td_tensor_device(td_value_get_tensor(out)).type, TD_DEVICE_CPU);
    TD_CHECK(td_tensor_equal(td_value_get_tensor(out), tensor));
    td_value_release(out);
    free(data);

    /* two tensors, only the second patched: the check comes before any device allocation */
    td_tensor *second = randn_on(dev(0), TD_SHAPE(3));
    td_value *pair = td_value_list_new();
    TD_CHECK_OK(td_value_list_append(pair, td_value_tensor(tensor)));
    TD_CHECK_OK(td_value_list_append(pair, td_value_tensor(second)));
    TD_CHECK_OK(td_value_save_bytes(pair, &data, &len));
    td_value_release(pair);
    TD_CHECK_EQ(replace_bytes(data, len, from, to, 1), 1);
    made = allocations_made(dev(0));
    TD_CHECK_ERR(td_value_load_bytes(data, len, NULL, &out), TD_ERR_INVALID, "Attempting to deserialize object on");
    TD_CHECK_CONTAINS(td_last_error(), "device 9 but");
    TD_CHECK_EQ(allocations_made(dev(0)), made);
    /* unpatched, the same file allocates both tensors */
    TD_CHECK_EQ(replace_bytes(data, len, to, from, -1), 1);
    TD_CHECK_OK(td_value_load_bytes(data, len, NULL, &out));
    TD_CHECK_EQ(allocations_made(dev(0)), made + 2);
    TD_CHECK(td_tensor_equal(td_value_get_tensor(td_value_at(out, 1)), second));
    td_value_release(out);
    free(data);
    td_tensor_release(second);
    td_tensor_release(tensor);
    TD_CHECK_OK(td_device_synchronize(dev(0)));
    dev_teardown();
}

typedef struct remap_seen {
    td_device_type type;
    int calls;
    char locations[4][16];
} remap_seen;

/* gpu_remap: "cuda:1" goes to device 0, anything else to its default (None). */
static bool gpu_remap(const char *location, void *user, td_device *target)
{
    remap_seen *seen = user;
    if (seen->calls < 4)
        snprintf(seen->locations[seen->calls], sizeof seen->locations[0], "%s", location);
    seen->calls++;
    char one[16];
    snprintf(one, sizeof one, "%s:1", td_device_type_name(seen->type));
    if (strcmp(location, one) == 0) {
        target->type = seen->type;
        target->index = 0;
        return true;
    }
    return false;
}

static td_value *two_device_list(td_tensor **x)
{
    td_value *list = td_value_list_new();
    for (int i = 0; i < 2; i++) {
        td_tensor *host = NULL;
        TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(4, 4), &host));
        for (int64_t r = 0; r < 4; r++)
            for (int64_t c = 0; c < 4; c++) {
                int64_t idx[2] = {r, c};
                TD_CHECK_OK(td_tensor_set_f64(host, idx, (double)(i * 100 + r * 4 + c) * 0.25));
            }
        TD_CHECK_OK(td_tensor_to_device(host, dev(i), false, &x[i]));
        td_tensor_release(host);
        TD_CHECK_OK(td_value_list_append(list, td_value_tensor(x[i])));
    }
    return list;
}

static void check_all_on_device0(td_value *copy, td_tensor **x)
{
    TD_CHECK_EQ(td_value_kind_of(copy), TD_VAL_LIST);
    TD_CHECK_EQ(td_value_len(copy), 2);
    for (size_t i = 0; i < 2; i++) {
        td_tensor *c = td_value_get_tensor(td_value_at(copy, i));
        TD_CHECK(c != NULL);
        TD_CHECK(td_tensor_equal(c, x[i]));
        TD_CHECK_EQ(td_tensor_dtype(c), td_tensor_dtype(x[i]));
        TD_CHECK_EQ(td_tensor_device(c).type, td_tensor_device(x[i]).type);
        TD_CHECK_EQ(td_tensor_device(c).index, 0);
    }
}

/* test_multigpu_serialization_remap */
TD_TEST(test_multigpu_serialization_remap, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 2);
    td_tensor *x[2];
    td_value *list = two_device_list(x);
    char path[512];
    path_in(ctx, "remap.tds", path, sizeof path);
    TD_CHECK_OK(td_value_save(list, path));
    remap_seen seen = {.type = type};
    td_tensor_map_location map = {.fn = gpu_remap, .user = &seen};
    td_value *copy = NULL;
    TD_CHECK_OK(td_value_load(path, &map, &copy));
    check_all_on_device0(copy, x);
    TD_CHECK_EQ(seen.calls, 2);
    char l0[16], l1[16];
    TD_CHECK_STR_EQ(seen.locations[0], loc(dev(0), l0, sizeof l0));
    TD_CHECK_STR_EQ(seen.locations[1], loc(dev(1), l1, sizeof l1));
    td_value_release(copy);

    /* without map_location each tensor returns to its own device */
    TD_CHECK_OK(td_value_load(path, NULL, &copy));
    for (size_t i = 0; i < 2; i++) {
        td_tensor *c = td_value_get_tensor(td_value_at(copy, i));
        TD_CHECK_EQ(td_tensor_device(c).index, (int)i);
        TD_CHECK(td_tensor_equal(c, x[i]));
    }
    td_value_release(copy);
    TD_CHECK_EQ(unlink(path), 0);
    td_value_release(list);
    td_tensor_release(x[1]);
    td_tensor_release(x[0]);
    dev_finish();
}

/* test_multigpu_serialization_remap_dict */
TD_TEST(test_multigpu_serialization_remap_dict, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_tensor *x[2];
    td_value *list = two_device_list(x);
    char path[512], l0[16], l1[16];
    path_in(ctx, "remap_dict.tds", path, sizeof path);
    TD_CHECK_OK(td_value_save(list, path));
    td_map_location_entry entries[] = {{loc(dev(1), l1, sizeof l1), loc(dev(0), l0, sizeof l0)}};
    td_tensor_map_location map = {.table = entries, .table_len = 1};
    td_value *copy = NULL;
    TD_CHECK_OK(td_value_load(path, &map, &copy));
    check_all_on_device0(copy, x);
    td_value_release(copy);

    /* a table mapping a location to a device that does not exist fails with the same message */
    char missing[16];
    snprintf(missing, sizeof missing, "%s:%d", td_device_type_name(dev(0).type), td_device_count(dev(0).type));
    entries[0].to = missing;
    TD_CHECK_ERR(td_value_load(path, &map, &copy), TD_ERR_INVALID, "Attempting to deserialize object on");
    TD_CHECK_EQ(unlink(path), 0);
    td_value_release(list);
    td_tensor_release(x[1]);
    td_tensor_release(x[0]);
    dev_finish();
}

/* test_multigpu_storage_clone: a clone and every dtype conversion stay on the device (cuda:1). */
TD_TEST(test_multigpu_storage_clone, DEV_CASE)
{
    dev_setup(ctx, 2);
    td_tensor *x = randn_on(dev(1), TD_SHAPE(4, 4));
    td_tensor *y = NULL;
    TD_CHECK_OK(td_tensor_clone(x, &y));
    TD_CHECK_EQ(td_tensor_device(y).index, td_tensor_device(x).index);
    TD_CHECK_EQ(td_storage_device(td_tensor_storage(y)).index, 1);
    TD_CHECK(td_tensor_storage(y) != td_tensor_storage(x));
    TD_CHECK(td_tensor_equal(x, y));
    /* byte, char, short, int, long, half, double */
    static const td_dtype dtypes[] = {TD_UINT8, TD_INT8, TD_INT16, TD_INT32, TD_INT64, TD_FLOAT16, TD_FLOAT64};
    double x00 = dev_get(x, 0);
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        td_tensor *c = NULL;
        TD_CHECK_OK(td_tensor_to(x, dtypes[i], &c));
        TD_CHECK_EQ(td_tensor_device(c).type, td_tensor_device(x).type);
        TD_CHECK_EQ(td_tensor_device(c).index, td_tensor_device(x).index);
        TD_CHECK_EQ(td_storage_device(td_tensor_storage(c)).index, 1);
        TD_CHECK_EQ(td_tensor_dtype(c), dtypes[i]);
        if (dtypes[i] == TD_FLOAT64)
            TD_CHECK_EQ(dev_get(c, 0) == x00, 1);
        td_tensor_release(c);
    }
    td_tensor_release(y);
    td_tensor_release(x);
    TD_CHECK_OK(td_device_synchronize(dev(1)));
    dev_teardown();
}

/* A nested value round-trips: scalars, strings, a host tensor, a non-contiguous device view, and
 * one device tensor saved twice, which loads as one tensor; map_location "cpu" brings everything
 * to the host. */
TD_TEST(test_serialization_nested_values, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_tensor *a = randn_on(dev(0), TD_SHAPE(3, 5));
    td_tensor *view = NULL;
    TD_CHECK_OK(td_tensor_transpose(a, 0, 1, &view));
    td_tensor *host = dev_host_arange(TD_INT64, TD_SHAPE(6), 2.0);
    td_tensor *empty = NULL;
    TD_CHECK_OK(td_tensor_empty_on(dev(0), TD_FLOAT64, TD_SHAPE(0, 4), NULL, &empty));
    td_value *d = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(d, "weights", td_value_tensor(a)));
    TD_CHECK_OK(td_value_dict_set_str(d, "again", td_value_tensor(a)));
    TD_CHECK_OK(td_value_dict_set_str(d, "view", td_value_tensor(view)));
    TD_CHECK_OK(td_value_dict_set_str(
        d, "meta", td_value_tuple_of(4, td_value_int(7), td_value_string("cuda:0 in a string"), td_value_none(),
                                     td_value_tensor(host))));
    TD_CHECK_OK(td_value_dict_set_str(d, "empty", td_value_tensor(empty)));
    char path[512];
    path_in(ctx, "nested.tds", path, sizeof path);
    TD_CHECK_OK(td_value_save(d, path));

    td_value *back = NULL;
    TD_CHECK_OK(td_value_load(path, NULL, &back));
    td_tensor *w = td_value_get_tensor(td_value_dict_get_str(back, "weights"));
    td_tensor *w2 = td_value_get_tensor(td_value_dict_get_str(back, "again"));
    td_tensor *v = td_value_get_tensor(td_value_dict_get_str(back, "view"));
    TD_CHECK(w != NULL && w == w2);
    TD_CHECK(td_device_equal(td_tensor_device(w), dev(0)));
    TD_CHECK(td_tensor_equal(w, a));
    TD_CHECK(td_device_equal(td_tensor_device(v), dev(0)));
    TD_CHECK(td_tensor_equal(v, view));
    TD_CHECK_EQ(td_tensor_ndim(v), 2);
    TD_CHECK_EQ(td_tensor_sizes(v)[0], 5);
    td_value *meta = td_value_dict_get_str(back, "meta");
    TD_CHECK_EQ(td_value_get_int(td_value_at(meta, 0)), 7);
    TD_CHECK_STR_EQ(td_value_get_string(td_value_at(meta, 1), NULL), "cuda:0 in a string");
    TD_CHECK_EQ(td_value_kind_of(td_value_at(meta, 2)), TD_VAL_NONE);
    td_tensor *h = td_value_get_tensor(td_value_at(meta, 3));
    TD_CHECK_EQ(td_tensor_device(h).type, TD_DEVICE_CPU);
    TD_CHECK(td_tensor_equal(h, host));
    td_tensor *e = td_value_get_tensor(td_value_dict_get_str(back, "empty"));
    TD_CHECK(td_device_equal(td_tensor_device(e), dev(0)));
    TD_CHECK_EQ(td_tensor_numel(e), 0);
    TD_CHECK_EQ(td_tensor_dtype(e), TD_FLOAT64);
    td_value_release(back);

    /* map_location="cpu": everything on the host, the values unchanged */
    td_tensor_map_location to_cpu = {.device = "cpu"};
    TD_CHECK_OK(td_value_load(path, &to_cpu, &back));
    w = td_value_get_tensor(td_value_dict_get_str(back, "weights"));
    TD_CHECK_EQ(td_tensor_device(w).type, TD_DEVICE_CPU);
    TD_CHECK(td_tensor_equal(w, a));
    /* ... and the host tensor to a device with a table entry for "cpu" */
    td_value_release(back);
    char d0[16];
    td_map_location_entry cpu_to_dev[] = {{"cpu", loc(dev(0), d0, sizeof d0)}};
    td_tensor_map_location map = {.table = cpu_to_dev, .table_len = 1};
    TD_CHECK_OK(td_value_load(path, &map, &back));
    h = td_value_get_tensor(td_value_at(td_value_dict_get_str(back, "meta"), 3));
    TD_CHECK(td_device_equal(td_tensor_device(h), dev(0)));
    TD_CHECK(td_tensor_equal(h, host));
    td_value_release(back);

    /* td_tensor_save / td_tensor_load */
    TD_CHECK_OK(td_tensor_save(view, path));
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_load(path, NULL, &t));
    TD_CHECK(td_tensor_equal(t, view));
    td_tensor_release(t);
    TD_CHECK_OK(td_value_save(meta = td_value_int(3), path));
    td_value_release(meta);
    TD_CHECK_ERR(td_tensor_load(path, NULL, &t), TD_ERR_INVALID, "holds a value of kind int, not a tensor");
    TD_CHECK_EQ(unlink(path), 0);

    td_value_release(d);
    td_tensor_release(empty);
    td_tensor_release(host);
    td_tensor_release(view);
    td_tensor_release(a);
    TD_CHECK_OK(td_device_synchronize(dev(0)));
    dev_teardown();
}

/* A location of a type this machine has no device of: PyTorch's is_available() message (a sim
 * file patched to "cuda:0" where there is no GPU), and malformed files refused. */
TD_TEST(test_serialization_bad_files, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_tensor *t = randn_on(dev(0), TD_SHAPE(5));
    td_value *v = td_value_tensor(t);
    uint8_t *data = NULL;
    size_t len = 0;
    TD_CHECK_OK(td_value_save_bytes(v, (void **)&data, &len));
    char here[16];
    loc(dev(0), here, sizeof here);
    uint8_t *field = memmem(data, len, here, strlen(here));
    TD_CHECK(field != NULL);
    td_value *out = NULL;

    /* the whole 16-byte field rewritten as "cuda:0" */
    uint8_t *patched = malloc(len);
    memcpy(patched, data, len);
    memset(patched + (field - data), 0, 16);
    memcpy(patched + (field - data), "cuda:0", 6);
    int cuda = td_device_count(TD_DEVICE_CUDA);
    if (cuda == 0) {
        TD_CHECK_ERR(td_value_load_bytes(patched, len, NULL, &out), TD_ERR_INVALID,
                     "Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False. If "
                     "you are running on a CPU-only machine, please use torch.load with "
                     "map_location=torch.device('cpu') to map your storages to the CPU.");
    } else {
        TD_CHECK_OK(td_value_load_bytes(patched, len, NULL, &out));
        td_device c0 = {TD_DEVICE_CUDA, 0};
        TD_CHECK(td_device_equal(td_tensor_device(td_value_get_tensor(out)), c0));
        TD_CHECK(td_tensor_equal(td_value_get_tensor(out), t));
        td_value_release(out);
        out = NULL;
        TD_CHECK_OK(td_device_synchronize(c0));
    }
    /* no NUL in the field */
    memset(patched + (field - data), 'x', 16);
    TD_CHECK_ERR(td_value_load_bytes(patched, len, NULL, &out), TD_ERR_INVALID, "not a NUL-terminated string");
    /* not a device */
    memset(patched + (field - data), 0, 16);
    memcpy(patched + (field - data), "tpu:0", 5);
    TD_CHECK_ERR(td_value_load_bytes(patched, len, NULL, &out), TD_ERR_INVALID, "malformed save file: tensor location");
    /* header, version, truncation */
    memcpy(patched, data, len);
    patched[0] = 'X';
    TD_CHECK_ERR(td_value_load_bytes(patched, len, NULL, &out), TD_ERR_INVALID, "not a tdist save file");
    memcpy(patched, data, len);
    patched[8] = 2;
    TD_CHECK_ERR(td_value_load_bytes(patched, len, NULL, &out), TD_ERR_INVALID,
                 "unsupported save file version 2 (this build reads version 1)");
    for (size_t cut = 0; cut < len; cut += (cut < 64 ? 1 : 61))
        TD_CHECK_ERR(td_value_load_bytes(data, cut, NULL, &out), TD_ERR_INVALID, "td_value_load");
    TD_CHECK(out == NULL);
    char path[512];
    path_in(ctx, "missing.tds", path, sizeof path);
    TD_CHECK_ERR(td_value_load(path, NULL, &out), TD_ERR_IO, "td_value_load: open(");
    free(patched);
    free(data);
    td_value_release(v);
    td_tensor_release(t);
    TD_CHECK_OK(td_device_synchronize(dev(0)));
    dev_teardown();
}

TD_TEST_MAIN()
