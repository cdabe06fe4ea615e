/* Saving and loading values with tensors on any device (torch.save / torch.load with
 * map_location, spec/cuda_multigpu.md section 8).
 *
 * A save file is a 16-byte header and one td_value codec message (codec.c): the saved value with
 * every tensor replaced by a TD_REC_SAVED_TENSOR record holding its location ("cuda:1", "sim:0",
 * "cpu" as NUL-padded ASCII in a fixed 16-byte field) and a host copy of its elements, so the codec
 * is reused as it is and the location is a literal that a test can patch in the bytes, as
 * PyTorch's test_load_nonexistent_device does; nothing checksums it. docs/protocols.md ("tdist
 * save files") has the layout.
 *
 * Loading decodes the message (the codec checks every length), then decides every tensor's target
 * (map_location's device, table, callback, else the saved location) and checks all of them
 * against the devices of this process before it allocates anything on a device; only then does it
 * rebuild the value with each tensor copied to its target. A tensor that appeared twice in the
 * saved value is one host tensor after decoding (the codec's memo) and one tensor after loading. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tdist/device.h>
#include <tdist/value.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/le.h"
#include "base/map.h"
#include "base/vec.h"

#define SAVE_MAGIC "TDSAVE\r\n"
#define SAVE_MAGIC_LEN 8
#define SAVE_VERSION 1
#define SAVE_HEADER 16
#define SAVE_LOCATION_LEN 16

static const td_device cpu_device = {TD_DEVICE_CPU, -1};

/* ---- saving ------------------------------------------------------------------------------- */

typedef struct saver {
    td_map memo; /* td_tensor * -> its TD_REC_SAVED_TENSOR record (a reference held here) */
} saver;

static void release_value(void *v) { td_value_release(v); }

static td_status saved_tensor(saver *s, td_tensor *t, td_value **out)
{
    td_value *rec = map_get(&s->memo, &t, sizeof t);
    if (rec) {
        *out = td_value_retain(rec);
        return TD_OK;
    }
    char location[SAVE_LOCATION_LEN] = {0};
    td_device d = td_tensor_device(t);
    char buf[32];
    td_device_str(d, buf, sizeof buf);
    if (strlen(buf) >= SAVE_LOCATION_LEN)
        return error_fmt(TD_ERR_INVALID, "td_value_save: location %s does not fit the file's %d-byte field", buf,
                         SAVE_LOCATION_LEN);
    memcpy(location, buf, strlen(buf));
    td_tensor *host = NULL;
    TD_TRY(td_tensor_to_device(t, cpu_device, false, &host));
    td_value *tv = td_value_tensor(host);
    td_tensor_release(host);
    rec = td_value_record_of(TD_REC_SAVED_TENSOR, 2, td_value_bytes(location, SAVE_LOCATION_LEN), tv);
    map_put(&s->memo, &t, sizeof t, td_value_retain(rec));
    *out = rec;
    return TD_OK;
}

/* What save_wrap and load_build do to each child of a container (depth: the child's). */
typedef td_status (*child_map_fn)(void *ctx, const td_value *child, int depth, td_value **out);

/* A new container (list, tuple, record or dict) with v's children replaced by fn's results and
 * dict keys kept; any other v is retained as it is. */
static td_status map_children(const td_value *v, int depth, child_map_fn fn, void *ctx, td_value **out)
{
    *out = NULL;
    td_value_kind kind = td_value_kind_of(v);
    size_t n = td_value_len(v);
    td_value *result = NULL;
    switch (kind) {
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD:
        result = kind == TD_VAL_LIST    ? td_value_list_new()
                 : kind == TD_VAL_TUPLE ? td_value_tuple_new(n)
                                        : td_value_record_new(td_value_record_tag(v), n);
        for (size_t i = 0; i < n; i++) {
            td_value *item = NULL;
            td_status st = fn(ctx, td_value_at(v, i), depth + 1, &item);
            if (st == TD_OK)
                st = kind == TD_VAL_LIST ? td_value_list_append(result, item) : td_value_set(result, i, item);
            if (st != TD_OK) {
                td_value_release(result);
                return st;
            }
        }
        break;
    case TD_VAL_DICT:
        result = td_value_dict_new();
        for (size_t i = 0; i < n; i++) {
            td_value *item = NULL;
            td_status st = fn(ctx, td_value_dict_value_at(v, i), depth + 1, &item);
            if (st == TD_OK)
                st = td_value_dict_set(result, td_value_retain(td_value_dict_key_at(v, i)), item);
            if (st != TD_OK) {
                td_value_release(result);
                return st;
            }
        }
        break;
    default:
        result = td_value_retain((td_value *)v);
        break;
    }
    *out = result;
    return TD_OK;
}

static td_status save_wrap(saver *s, const td_value *v, int depth, td_value **out);

static td_status save_child(void *ctx, const td_value *child, int depth, td_value **out)
{
    return save_wrap(ctx, child, depth, out);
}

/* v with its tensors replaced by saved-tensor records. */
static td_status save_wrap(saver *s, const td_value *v, int depth, td_value **out)
{
    *out = NULL;
    if (depth > TD_VALUE_MAX_DEPTH)
        return error_fmt(TD_ERR_INVALID, "td_value_save: value nested deeper than %d levels (a cycle?)",
                         TD_VALUE_MAX_DEPTH);
    td_value_kind kind = td_value_kind_of(v);
    if (kind == TD_VAL_TENSOR)
        return saved_tensor(s, td_value_get_tensor(v), out);
    if (kind == TD_VAL_RECORD && td_value_record_tag(v) == TD_REC_SAVED_TENSOR)
        return error_set(TD_ERR_INVALID, "td_value_save: records with the tag TD_REC_SAVED_TENSOR are "
                                         "reserved for save files");
    if (kind == TD_VAL_DICT) {
        for (size_t i = 0, n = td_value_len(v); i < n; i++) {
            if (td_value_kind_of(td_value_dict_key_at(v, i)) == TD_VAL_TENSOR)
                return error_set(TD_ERR_UNSUPPORTED, "td_value_save: tensors as dict keys are not supported");
        }
    }
    return map_children(v, depth, save_child, s, out);
}

static void put_header(uint8_t *h)
{
    memcpy(h, SAVE_MAGIC, SAVE_MAGIC_LEN);
    le_put(h + 8, SAVE_VERSION, 4);
    le_put(h + 12, 0, 4);
}

/* The codec's message of the wrapped value. */
static td_status save_encode(const td_value *v, td_encoded **out)
{
    if (!v)
        return error_set(TD_ERR_INVALID, "td_value_save: value is NULL");
    saver s = {TD_MAP_INIT};
    td_value *wrapped = NULL;
    td_status st = save_wrap(&s, v, 1, &wrapped);
    map_free(&s.memo, release_value);
    if (st != TD_OK)
        return st;
    st = td_value_encode(wrapped, out);
    td_value_release(wrapped);
    return st;
}

td_status td_value_save_bytes(const td_value *v, void **data, size_t *len)
{
    if (!data || !len)
        return error_set(TD_ERR_INVALID, "td_value_save_bytes: data and len must not be NULL");
    td_encoded *enc = NULL;
    TD_TRY(save_encode(v, &enc));
    size_t total = SAVE_HEADER + td_encoded_size(enc);
    void *buf = NULL;
    td_status st = alloc_try(total, "a save file", &buf);
    if (st == TD_OK) {
        put_header(buf);
        td_encoded_flatten(enc, (uint8_t *)buf + SAVE_HEADER);
        *data = buf;
        *len = total;
    }
    td_encoded_free(enc);
    return st;
}

static td_status write_all(int fd, const void *data, size_t len, const char *path)
{
    const uint8_t *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return error_errno(TD_ERR_IO, "td_value_save: writing %s", path);
        p += n;
        len -= (size_t)n;
    }
    return TD_OK;
}

td_status td_value_save(const td_value *v, const char *path)
{
    if (!path)
        return error_set(TD_ERR_INVALID, "td_value_save: path is NULL");
    td_encoded *enc = NULL;
    TD_TRY(save_encode(v, &enc));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        td_status st = error_errno(TD_ERR_IO, "td_value_save: open(%s)", path);
        td_encoded_free(enc);
        return st;
    }
    uint8_t header[SAVE_HEADER];
    put_header(header);
    td_status st = write_all(fd, header, sizeof header, path);
    size_t niov = 0;
    const struct iovec *iov = td_encoded_iov(enc, &niov);
    for (size_t i = 0; st == TD_OK && i < niov; i++)
        st = write_all(fd, iov[i].iov_base, iov[i].iov_len, path);
    if (close(fd) != 0 && st == TD_OK)
        st = error_errno(TD_ERR_IO, "td_value_save: closing %s", path);
    if (st != TD_OK)
        unlink(path); /* no half-written file */
    td_encoded_free(enc);
    return st;
}

td_status td_tensor_save(const td_tensor *t, const char *path)
{
    if (!t)
        return error_set(TD_ERR_INVALID, "td_tensor_save: tensor is NULL");
    td_value *v = td_value_tensor((td_tensor *)t);
    td_status st = td_value_save(v, path);
    td_value_release(v);
    return st;
}

/* ---- loading ------------------------------------------------------------------------------ */

typedef struct loader {
    const td_tensor_map_location *map;
    td_map targets;            /* record pointer -> index + 1 into target_list */
    TD_VEC(td_device) target_list;
    td_map built;              /* (host tensor pointer, target) -> the loaded tensor (a reference) */
} loader;

static void release_tensor(void *t) { td_tensor_release(t); }

/* "cuda" (no index) as a target is the current device, as PyTorch's validate_cuda_device reads it. */
static td_status parse_target(const char *spec, const char *what, td_device *out)
{
    td_status st = td_device_parse(spec, out);
    if (st != TD_OK)
        return error_prefix(st, "map_location %s", what);
    if (out->type != TD_DEVICE_CPU && out->index < 0)
        out->index = td_device_current(out->type);
    return TD_OK;
}

/* PyTorch's validate_cuda_device, for every accelerator type. */
static td_status check_target(td_device d)
{
    if (d.type == TD_DEVICE_CPU)
        return TD_OK;
    const char *name = td_device_type_name(d.type);
    char upper[16] = {0};
    for (size_t i = 0; name[i] && i + 1 < sizeof upper; i++)
        upper[i] = (char)(name[i] >= 'a' && name[i] <= 'z' ? name[i] - 'a' + 'A' : name[i]);
    int count = td_device_count(d.type);
    char msg[384];
    if (count == 0) {
        snprintf(msg, sizeof msg,
                 "Attempting to deserialize object on a %s device but torch.%s.is_available() is False. If you are "
                 "running on a CPU-only machine, please use torch.load with map_location=torch.device('cpu') to map "
                 "your storages to the CPU.",
                 upper, name);
        return error_set_typed(TD_ERR_INVALID, "RuntimeError", msg);
    }
    if (d.index < 0 || d.index >= count) {
        snprintf(msg, sizeof msg,
                 "Attempting to deserialize object on %s device %d but torch.%s.device_count() is %d. Please use "
                 "torch.load with map_location to map your storages to an existing device.",
                 upper, d.index, name, count);
        return error_set_typed(TD_ERR_INVALID, "RuntimeError", msg);
    }
    return TD_OK;
}

/* The saved location of a record, checked: ASCII NUL-terminated within its field, a device. */
static td_status record_location(const td_value *rec, char location[SAVE_LOCATION_LEN], td_device *saved)
{
    if (td_value_len(rec) != 2 || td_value_kind_of(td_value_at(rec, 0)) != TD_VAL_BYTES ||
        td_value_kind_of(td_value_at(rec, 1)) != TD_VAL_TENSOR)
        return error_set(TD_ERR_INVALID, "td_value_load: malformed save file: a saved tensor record is not "
                                         "(location, tensor)");
    size_t len = 0;
    const char *bytes = td_value_get_bytes(td_value_at(rec, 0), &len);
    if (len != SAVE_LOCATION_LEN || !memchr(bytes, '\0', len))
        return error_fmt(TD_ERR_INVALID,
                         "td_value_load: malformed save file: a tensor's location is not a NUL-terminated string in "
                         "%d bytes",
                         SAVE_LOCATION_LEN);
    memcpy(location, bytes, SAVE_LOCATION_LEN);
    td_status st = td_device_parse(location, saved);
    if (st != TD_OK)
        return error_prefix(st, "td_value_load: malformed save file: tensor location");
    if (saved->type != TD_DEVICE_CPU && saved->index < 0)
        return error_fmt(TD_ERR_INVALID, "td_value_load: malformed save file: tensor location '%s' has no device index",
                         location);
    return TD_OK;
}

static td_status decide_target(loader *l, const char *location, td_device saved, td_device *out)
{
    const td_tensor_map_location *map = l->map;
    *out = saved;
    if (!map)
        return TD_OK;
    if (map->device)
        return parse_target(map->device, map->device, out);
    if (map->table) {
        for (size_t i = 0; i < map->table_len; i++) {
            if (map->table[i].from && strcmp(map->table[i].from, location) == 0) {
                if (!map->table[i].to)
                    return error_fmt(TD_ERR_INVALID, "map_location: the entry for %s has no target", location);
                return parse_target(map->table[i].to, map->table[i].to, out);
            }
        }
        return TD_OK;
    }
    if (map->fn) {
        td_device target = saved;
        if (map->fn(location, map->user, &target)) {
            if (target.type != TD_DEVICE_CPU && target.index < 0)
                target.index = td_device_current(target.type);
            *out = target;
        }
    }
    return TD_OK;
}

/* Pass 1: every saved tensor's target, checked; nothing is allocated on a device. */
static td_status load_plan(loader *l, const td_value *v, int depth)
{
    if (depth > TD_VALUE_MAX_DEPTH)
        return error_fmt(TD_ERR_INVALID, "td_value_load: value nested deeper than %d levels", TD_VALUE_MAX_DEPTH);
    td_value_kind kind = td_value_kind_of(v);
    size_t n = td_value_len(v);
    if (kind == TD_VAL_RECORD && td_value_record_tag(v) == TD_REC_SAVED_TENSOR) {
        if (map_get(&l->targets, &v, sizeof v))
            return TD_OK;
        char location[SAVE_LOCATION_LEN];
        td_device saved, target;
        TD_TRY(record_location(v, location, &saved));
        TD_TRY(decide_target(l, location, saved, &target));
        TD_TRY(check_target(target));
        TD_VEC_PUSH(&l->target_list, target);
        map_put(&l->targets, &v, sizeof v, (void *)(uintptr_t)l->target_list.len);
        return TD_OK;
    }
    if (kind == TD_VAL_LIST || kind == TD_VAL_TUPLE || kind == TD_VAL_RECORD) {
        for (size_t i = 0; i < n; i++)
            TD_TRY(load_plan(l, td_value_at(v, i), depth + 1));
    } else if (kind == TD_VAL_DICT) {
        for (size_t i = 0; i < n; i++)
            TD_TRY(load_plan(l, td_value_dict_value_at(v, i), depth + 1));
    }
    return TD_OK;
}

static td_status load_tensor(loader *l, const td_value *rec, td_value **out)
{
    uintptr_t idx = (uintptr_t)map_get(&l->targets, &rec, sizeof rec);
    td_device target = l->target_list.items[idx - 1];
    td_tensor *host = td_value_get_tensor(td_value_at(rec, 1));
    struct {
        td_tensor *host;
        td_device target;
    } key;
    memset(&key, 0, sizeof key);
    key.host = host;
    key.target = target;
    td_tensor *t = map_get(&l->built, &key, sizeof key);
    if (t) {
        *out = td_value_tensor(t);
        return TD_OK;
    }
    if (target.type == TD_DEVICE_CPU)
        t = td_tensor_retain(host);
    else
        TD_TRY(td_tensor_to_device(host, target, false, &t));
    map_put(&l->built, &key, sizeof key, t);
    *out = td_value_tensor(t);
    return TD_OK;
}

static td_status load_child(void *ctx, const td_value *child, int depth, td_value **out);

/* Pass 2: the value with every saved tensor on its target. */
static td_status load_build(loader *l, const td_value *v, td_value **out)
{
    *out = NULL;
    if (td_value_kind_of(v) == TD_VAL_RECORD && td_value_record_tag(v) == TD_REC_SAVED_TENSOR)
        return load_tensor(l, v, out);
    return map_children(v, 0, load_child, l, out);
}

static td_status load_child(void *ctx, const td_value *child, int depth, td_value **out)
{
    (void)depth;
    return load_build(ctx, child, out);
}

td_status td_value_load_bytes(const void *data, size_t len, const td_tensor_map_location *map, td_value **out)
{
    if (!data || !out)
        return error_set(TD_ERR_INVALID, "td_value_load_bytes: data and out must not be NULL");
    *out = NULL;
    const uint8_t *p = data;
    if (len < SAVE_HEADER || memcmp(p, SAVE_MAGIC, SAVE_MAGIC_LEN) != 0)
        return error_set(TD_ERR_INVALID, "td_value_load: not a tdist save file (no TDSAVE header)");
    uint32_t version = (uint32_t)le_get(p + 8, 4);
    if (version != SAVE_VERSION)
        return error_fmt(TD_ERR_INVALID, "td_value_load: unsupported save file version %u (this build reads version %d)",
                         version, SAVE_VERSION);
    td_value *decoded = NULL;
    td_status st = td_value_decode(p + SAVE_HEADER, len - SAVE_HEADER, &decoded);
    if (st != TD_OK)
        return error_prefix(st, "td_value_load: malformed save file");
    loader l = {.map = map, .targets = TD_MAP_INIT, .built = TD_MAP_INIT};
    st = load_plan(&l, decoded, 1);
    if (st == TD_OK)
        st = load_build(&l, decoded, out);
    map_free(&l.built, release_tensor);
    map_free(&l.targets, NULL);
    TD_VEC_FREE(&l.target_list);
    td_value_release(decoded);
    return st;
}

td_status td_value_load(const char *path, const td_tensor_map_location *map, td_value **out)
{
    if (!path || !out)
        return error_set(TD_ERR_INVALID, "td_value_load: path and out must not be NULL");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return error_errno(TD_ERR_IO, "td_value_load: open(%s)", path);
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        td_status st = error_errno(TD_ERR_IO, "td_value_load: fstat(%s)", path);
        close(fd);
        return st;
    }
    size_t size = (size_t)sb.st_size;
    void *buf = NULL;
    td_status st = alloc_try(size ? size : 1, "a save file", &buf);
    size_t got = 0;
    while (st == TD_OK && got < size) {
        ssize_t n = read(fd, (uint8_t *)buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            st = error_errno(TD_ERR_IO, "td_value_load: reading %s", path);
        else if (n == 0)
            st = error_fmt(TD_ERR_IO, "td_value_load: %s ended after %zu of its %zu bytes", path, got, size);
        else
            got += (size_t)n;
    }
    close(fd);
    if (st == TD_OK)
        st = td_value_load_bytes(buf, size, map, out);
    free(buf);
    return st;
}

td_status td_tensor_load(const char *path, const td_tensor_map_location *map, td_tensor **out)
{
    if (!out)
        return error_set(TD_ERR_INVALID, "td_tensor_load: out is NULL");
    *out = NULL;
    td_value *v = NULL;
    TD_TRY(td_value_load(path, map, &v));
    if (td_value_kind_of(v) != TD_VAL_TENSOR) {
        td_status st = error_fmt(TD_ERR_INVALID, "td_tensor_load: %s holds a value of kind %s, not a tensor", path,
                                 td_value_kind_name(td_value_kind_of(v)));
        td_value_release(v);
        return st;
    }
    *out = td_tensor_retain(td_value_get_tensor(v));
    td_value_release(v);
    return TD_OK;
}
