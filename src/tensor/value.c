/* td_value, the IValue analogue: refcounted, dynamically typed values that object collectives,
 * RPC and process queues carry (tdist/value.h). This file holds the objects themselves: their
 * constructors and accessors, the containers (growable lists, fixed tuples and records,
 * insertion-ordered dicts with a hash index), equality, hashing and deep copy. The printed form
 * is in value_format.c and the wire form in codec.c; both read the layout in value_impl.h.
 *
 * Different kinds never compare equal (1, 1.0 and True are three different dict keys), which
 * keeps hashing simple and exact. Tensors compare by value in td_value_equal but by identity as
 * dict keys, as in IValue; td_value_hash hashes a tensor by dtype and shape, which fits both.
 * Recursion over a value stops at TD_VALUE_MAX_DEPTH, and release walks an explicit work list,
 * so neither a deep value nor a cycle built by hand overflows the stack. */
#include "tensor/value_impl.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/map.h"
#include "base/vec.h"

static const char *const kind_names[TD_VAL_KIND_COUNT] = {
    "none", "bool", "int", "double", "complex", "string", "bytes", "tensor", "list", "tuple", "dict", "record",
};

const char *td_value_kind_name(td_value_kind kind)
{
    return (unsigned)kind < TD_VAL_KIND_COUNT ? kind_names[kind] : "unknown";
}

/* ---- construction ------------------------------------------------------------------------- */

static td_value *new_value(td_value_kind kind)
{
    td_value *v = TD_NEW(td_value);
    ref_init(&v->ref);
    v->kind = kind;
    return v;
}

td_value *td_value_none(void) { return new_value(TD_VAL_NONE); }

td_value *td_value_bool(bool b)
{
    td_value *v = new_value(TD_VAL_BOOL);
    v->u.b = b;
    return v;
}

td_value *td_value_int(int64_t i)
{
    td_value *v = new_value(TD_VAL_INT);
    v->u.i = i;
    return v;
}

td_value *td_value_double(double d)
{
    td_value *v = new_value(TD_VAL_DOUBLE);
    v->u.d = d;
    return v;
}

td_value *td_value_complex(double re, double im)
{
    td_value *v = new_value(TD_VAL_COMPLEX);
    v->u.c.re = re;
    v->u.c.im = im;
    return v;
}

td_value *value_new_str(td_value_kind kind, const void *data, size_t len)
{
    td_value *v = new_value(kind);
    v->u.str.data = alloc_or_die(len + 1);
    if (len)
        memcpy(v->u.str.data, data, len);
    v->u.str.data[len] = '\0';
    v->u.str.len = len;
    return v;
}

td_value *td_value_string(const char *s) { return value_new_str(TD_VAL_STRING, s, s ? strlen(s) : 0); }
td_value *td_value_string_n(const char *s, size_t len) { return value_new_str(TD_VAL_STRING, s, s ? len : 0); }
td_value *td_value_bytes(const void *data, size_t len) { return value_new_str(TD_VAL_BYTES, data, data ? len : 0); }

td_value *td_value_tensor(td_tensor *t)
{
    if (!t)
        return td_value_none();
    td_value *v = new_value(TD_VAL_TENSOR);
    v->u.tensor = td_tensor_retain(t);
    return v;
}

td_value *td_value_list_new(void) { return new_value(TD_VAL_LIST); }

static td_value *new_fixed(td_value_kind kind, size_t len)
{
    td_value *v = new_value(kind);
    v->u.seq.items = TD_NEW_ARRAY(td_value *, len);
    for (size_t i = 0; i < len; i++)
        v->u.seq.items[i] = td_value_none();
    v->u.seq.len = v->u.seq.cap = len;
    return v;
}

td_value *td_value_tuple_new(size_t len) { return new_fixed(TD_VAL_TUPLE, len); }

td_value *td_value_record_new(uint32_t tag, size_t nfields)
{
    td_value *v = new_fixed(TD_VAL_RECORD, nfields);
    v->u.seq.tag = tag;
    return v;
}

td_value *td_value_dict_new(void)
{
    td_value *v = new_value(TD_VAL_DICT);
    v->u.dict = TD_NEW(td_value_dict);
    return v;
}

static void fill_from_args(td_value *v, size_t n, va_list ap)
{
    for (size_t i = 0; i < n; i++) {
        td_value *item = va_arg(ap, td_value *);
        td_value_release(v->u.seq.items[i]);
        v->u.seq.items[i] = item ? item : td_value_none();
    }
}

td_value *td_value_tuple_of(size_t n, ...)
{
    td_value *v = td_value_tuple_new(n);
    va_list ap;
    va_start(ap, n);
    fill_from_args(v, n, ap);
    va_end(ap);
    return v;
}

td_value *td_value_record_of(uint32_t tag, size_t n, ...)
{
    td_value *v = td_value_record_new(tag, n);
    va_list ap;
    va_start(ap, n);
    fill_from_args(v, n, ap);
    va_end(ap);
    return v;
}

td_value *td_value_error(const char *type_name, const char *message)
{
    return td_value_record_of(TD_REC_ERROR, 2, td_value_string(type_name), td_value_string(message));
}

td_value *td_value_worker_info(const char *name, int64_t id)
{
    return td_value_record_of(TD_REC_WORKER_INFO, 2, td_value_string(name), td_value_int(id));
}

td_value *td_value_device(td_device device)
{
    return td_value_record_of(TD_REC_DEVICE, 2, td_value_int(device.type), td_value_int(device.index));
}

/* ---- lifetime ----------------------------------------------------------------------------- */

td_value *td_value_retain(td_value *v)
{
    if (v)
        ref_inc(&v->ref);
    return v;
}

typedef TD_VEC(td_value *) value_stack;

/* Drops one reference to a child of a value being freed: leaves are freed at once, containers
 * are queued so that freeing never recurses. */
static void drop_child(td_value *c, value_stack *work);

static void free_one(td_value *v, value_stack *work)
{
    switch (v->kind) {
    case TD_VAL_STRING:
    case TD_VAL_BYTES:
        free(v->u.str.data);
        break;
    case TD_VAL_TENSOR:
        td_tensor_release(v->u.tensor);
        break;
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD:
        for (size_t i = 0; i < v->u.seq.len; i++)
            drop_child(v->u.seq.items[i], work);
        free(v->u.seq.items);
        break;
    case TD_VAL_DICT: {
        td_value_dict *d = v->u.dict;
        for (size_t i = 0; i < d->len; i++) {
            drop_child(d->entries[i].key, work);
            drop_child(d->entries[i].value, work);
        }
        free(d->entries);
        free(d->slots);
        free(d);
        break;
    }
    default:
        break;
    }
    free(v);
}

static void drop_child(td_value *c, value_stack *work)
{
    if (!c || !ref_dec(&c->ref))
        return;
    switch (c->kind) {
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD:
    case TD_VAL_DICT:
        TD_VEC_PUSH(work, c);
        break;
    default:
        free_one(c, work);
    }
}

void td_value_release(td_value *v)
{
    if (!v || !ref_dec(&v->ref))
        return;
    value_stack work = {0};
    free_one(v, &work);
    while (work.len)
        free_one(work.items[--work.len], &work);
    TD_VEC_FREE(&work);
}

/* ---- inspection --------------------------------------------------------------------------- */

td_value_kind td_value_kind_of(const td_value *v) { return v ? v->kind : TD_VAL_NONE; }
bool td_value_get_bool(const td_value *v) { return v && v->kind == TD_VAL_BOOL && v->u.b; }
int64_t td_value_get_int(const td_value *v) { return v && v->kind == TD_VAL_INT ? v->u.i : 0; }
double td_value_get_double(const td_value *v) { return v && v->kind == TD_VAL_DOUBLE ? v->u.d : 0.0; }

void td_value_get_complex(const td_value *v, double *re, double *im)
{
    bool ok = v && v->kind == TD_VAL_COMPLEX;
    if (re)
        *re = ok ? v->u.c.re : 0.0;
    if (im)
        *im = ok ? v->u.c.im : 0.0;
}

static const char *get_str(const td_value *v, td_value_kind kind, size_t *len)
{
    bool ok = v && v->kind == kind;
    if (len)
        *len = ok ? v->u.str.len : 0;
    return ok ? v->u.str.data : (kind == TD_VAL_STRING ? "" : NULL);
}

const char *td_value_get_string(const td_value *v, size_t *len) { return get_str(v, TD_VAL_STRING, len); }
const void *td_value_get_bytes(const td_value *v, size_t *len) { return get_str(v, TD_VAL_BYTES, len); }
td_tensor *td_value_get_tensor(const td_value *v) { return v && v->kind == TD_VAL_TENSOR ? v->u.tensor : NULL; }
uint32_t td_value_record_tag(const td_value *v) { return v && v->kind == TD_VAL_RECORD ? v->u.seq.tag : 0; }

static bool is_seq(const td_value *v)
{
    return v && (v->kind == TD_VAL_LIST || v->kind == TD_VAL_TUPLE || v->kind == TD_VAL_RECORD);
}

size_t td_value_len(const td_value *v)
{
    if (!v)
        return 0;
    switch (v->kind) {
    case TD_VAL_STRING:
    case TD_VAL_BYTES:
        return v->u.str.len;
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD:
        return v->u.seq.len;
    case TD_VAL_DICT:
        return v->u.dict->len;
    default:
        return 0;
    }
}

td_value *td_value_at(const td_value *v, size_t i)
{
    return is_seq(v) && i < v->u.seq.len ? v->u.seq.items[i] : NULL;
}

/* ---- sequences ---------------------------------------------------------------------------- */

void value_seq_reserve(td_value *list, size_t n)
{
    TD_VEC_RESERVE(&list->u.seq, list->u.seq.len + n);
}

td_status td_value_list_append(td_value *list, td_value *item)
{
    if (!item) {
        return error_fmt(TD_ERR_INVALID, "td_value_list_append: item is NULL");
    }
    if (!list || list->kind != TD_VAL_LIST) {
        td_value_release(item);
        return error_fmt(TD_ERR_INVALID, "td_value_list_append: expected a list, got %s",
                        list ? td_value_kind_name(list->kind) : "NULL");
    }
    TD_VEC_PUSH(&list->u.seq, item);
    return TD_OK;
}

td_status td_value_set(td_value *seq, size_t i, td_value *item)
{
    if (!item)
        return error_fmt(TD_ERR_INVALID, "td_value_set: item is NULL");
    if (!is_seq(seq)) {
        td_value_release(item);
        return error_fmt(TD_ERR_INVALID, "td_value_set: expected a list, tuple or record, got %s",
                        seq ? td_value_kind_name(seq->kind) : "NULL");
    }
    if (i >= seq->u.seq.len) {
        td_value_release(item);
        return error_fmt(TD_ERR_INVALID, "%s index %zu out of range (length %zu)", td_value_kind_name(seq->kind), i,
                        seq->u.seq.len);
    }
    td_value *old = seq->u.seq.items[i];
    seq->u.seq.items[i] = item;
    td_value_release(old);
    return TD_OK;
}

/* ---- hashing and equality ----------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t kind_seed(td_value_kind kind) { return 0x9e3779b97f4a7c15ull * ((uint64_t)kind + 1); }

static uint64_t hash_double(double d)
{
    if (d == 0.0)
        d = 0.0; /* -0.0 == 0.0 */
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return mix64(bits);
}

static uint64_t hash_impl(const td_value *v, bool key_mode, int depth)
{
    if (!v)
        return 0;
    uint64_t h = kind_seed(v->kind);
    if (depth > TD_VALUE_MAX_DEPTH)
        return h;
    switch (v->kind) {
    case TD_VAL_NONE:
        return mix64(h);
    case TD_VAL_BOOL:
        return mix64(h + (uint64_t)v->u.b);
    case TD_VAL_INT:
        return mix64(h + mix64((uint64_t)v->u.i));
    case TD_VAL_DOUBLE:
        return mix64(h + hash_double(v->u.d));
    case TD_VAL_COMPLEX:
        return mix64(h + hash_double(v->u.c.re) * 31 + hash_double(v->u.c.im));
    case TD_VAL_STRING:
    case TD_VAL_BYTES:
        return map_hash_bytes(v->u.str.data, v->u.str.len, h);
    case TD_VAL_TENSOR: {
        const td_tensor *t = v->u.tensor;
        if (key_mode)
            return mix64(h + (uint64_t)(uintptr_t)t);
        h = mix64(h + (uint64_t)td_tensor_dtype(t));
        int nd = td_tensor_ndim(t);
        const int64_t *sizes = td_tensor_sizes(t);
        for (int i = 0; i < nd; i++)
            h = mix64(h * 31 + (uint64_t)sizes[i]);
        return mix64(h + (uint64_t)nd);
    }
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD:
        h += v->u.seq.tag;
        for (size_t i = 0; i < v->u.seq.len; i++)
            h = mix64(h * 31 + hash_impl(v->u.seq.items[i], key_mode, depth + 1));
        return mix64(h + v->u.seq.len);
    case TD_VAL_DICT: {
        /* Order-insensitive, as dict equality is. */
        const td_value_dict *d = v->u.dict;
        for (size_t i = 0; i < d->len; i++)
            h += mix64(hash_impl(d->entries[i].key, key_mode, depth + 1) * 31 +
                       hash_impl(d->entries[i].value, key_mode, depth + 1));
        return mix64(h + d->len);
    }
    default:
        return h;
    }
}

uint64_t td_value_hash(const td_value *v) { return hash_impl(v, false, 1); }
uint64_t value_key_hash(const td_value *key) { return hash_impl(key, true, 1); }

static bool eq_impl(const td_value *a, const td_value *b, bool key_mode, int depth);

static bool has_tensor(const td_value *v, int depth)
{
    if (v->kind == TD_VAL_TENSOR)
        return true;
    if (v->kind != TD_VAL_TUPLE || depth > TD_VALUE_MAX_DEPTH)
        return false;
    for (size_t i = 0; i < v->u.seq.len; i++)
        if (has_tensor(v->u.seq.items[i], depth + 1))
            return true;
    return false;
}

static size_t dict_find(const td_value_dict *d, const td_value *key, uint64_t h, size_t *slot)
{
    *slot = SIZE_MAX;
    if (!d->nslots)
        return SIZE_MAX;
    size_t mask = d->nslots - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        size_t s = d->slots[i];
        if (!s) {
            *slot = i;
            return SIZE_MAX;
        }
        const td_dict_entry *e = &d->entries[s - 1];
        if (e->hash == h && value_key_equal(e->key, key))
            return s - 1;
    }
}

static bool dict_equal(const td_value_dict *a, const td_value_dict *b, bool key_mode, int depth)
{
    if (a->len != b->len)
        return false;
    /* Same order (what a round trip or a copy gives): one pass. */
    size_t i = 0;
    while (i < a->len && eq_impl(a->entries[i].key, b->entries[i].key, key_mode, depth) &&
           eq_impl(a->entries[i].value, b->entries[i].value, key_mode, depth))
        i++;
    if (i == a->len)
        return true;
    for (i = 0; i < a->len; i++) {
        const td_dict_entry *e = &a->entries[i];
        const td_value *other = NULL;
        if (!key_mode && (a->tensor_keys || b->tensor_keys)) {
            /* Tensor keys are indexed by identity but compared by value here: scan. */
            for (size_t j = 0; j < b->len && !other; j++)
                if (eq_impl(e->key, b->entries[j].key, false, depth))
                    other = b->entries[j].value;
        } else {
            size_t slot, j = dict_find(b, e->key, e->hash, &slot);
            if (j != SIZE_MAX)
                other = b->entries[j].value;
        }
        if (!other || !eq_impl(e->value, other, key_mode, depth))
            return false;
    }
    return true;
}

static bool eq_impl(const td_value *a, const td_value *b, bool key_mode, int depth)
{
    if (key_mode && a == b)
        return true; /* a NaN key still finds itself, as in Python */
    if (!a || !b)
        return a == b;
    if (a->kind != b->kind || depth > TD_VALUE_MAX_DEPTH)
        return false;
    switch (a->kind) {
    case TD_VAL_NONE:
        return true;
    case TD_VAL_BOOL:
        return a->u.b == b->u.b;
    case TD_VAL_INT:
        return a->u.i == b->u.i;
    case TD_VAL_DOUBLE:
        return a->u.d == b->u.d;
    case TD_VAL_COMPLEX:
        return a->u.c.re == b->u.c.re && a->u.c.im == b->u.c.im;
    case TD_VAL_STRING:
    case TD_VAL_BYTES:
        return a->u.str.len == b->u.str.len && memcmp(a->u.str.data, b->u.str.data, a->u.str.len) == 0;
    case TD_VAL_TENSOR:
        return key_mode ? a->u.tensor == b->u.tensor : td_tensor_equal(a->u.tensor, b->u.tensor);
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD:
        if (a->u.seq.tag != b->u.seq.tag || a->u.seq.len != b->u.seq.len)
            return false;
        for (size_t i = 0; i < a->u.seq.len; i++)
            if (!eq_impl(a->u.seq.items[i], b->u.seq.items[i], key_mode, depth + 1))
                return false;
        return true;
    case TD_VAL_DICT:
        return dict_equal(a->u.dict, b->u.dict, key_mode, depth + 1);
    default:
        return false;
    }
}

bool td_value_equal(const td_value *a, const td_value *b) { return eq_impl(a, b, false, 1); }
bool value_key_equal(const td_value *a, const td_value *b) { return eq_impl(a, b, true, 1); }

static bool hashable_impl(const td_value *v, int depth)
{
    if (!v)
        return false;
    switch (v->kind) {
    case TD_VAL_NONE:
    case TD_VAL_BOOL:
    case TD_VAL_INT:
    case TD_VAL_DOUBLE:
    case TD_VAL_COMPLEX:
    case TD_VAL_STRING:
    case TD_VAL_BYTES:
    case TD_VAL_TENSOR:
        return true;
    case TD_VAL_TUPLE:
        if (depth >= TD_VALUE_MAX_DEPTH)
            return false;
        for (size_t i = 0; i < v->u.seq.len; i++)
            if (!hashable_impl(v->u.seq.items[i], depth + 1))
                return false;
        return true;
    default:
        return false;
    }
}

bool td_value_is_hashable(const td_value *v) { return hashable_impl(v, 1); }

/* ---- dicts -------------------------------------------------------------------------------- */

static void dict_rehash(td_value_dict *d, size_t want_entries)
{
    size_t n = 8;
    while (n < 2 * want_entries)
        n *= 2;
    if (n <= d->nslots)
        return;
    free(d->slots);
    d->slots = TD_NEW_ARRAY(size_t, n);
    d->nslots = n;
    for (size_t i = 0; i < d->len; i++) {
        size_t j = d->entries[i].hash & (n - 1);
        while (d->slots[j])
            j = (j + 1) & (n - 1);
        d->slots[j] = i + 1;
    }
}

void value_dict_reserve(td_value *dict, size_t n)
{
    td_value_dict *d = dict->u.dict;
    if (d->len + n > d->cap) {
        d->cap = d->len + n;
        d->entries = alloc_resize(d->entries, d->cap * sizeof *d->entries);
    }
    dict_rehash(d, d->len + n);
}

/* Looks key up; when it is absent, appends it (taking key and value) and returns true. */
static bool dict_insert(td_value_dict *d, td_value *key, td_value *value, uint64_t h, size_t *found)
{
    size_t slot;
    size_t j = dict_find(d, key, h, &slot);
    if (j != SIZE_MAX) {
        *found = j;
        return false;
    }
    if (2 * (d->len + 1) > d->nslots) {
        dict_rehash(d, d->len + 1 > 4 ? 2 * d->len : 4);
        dict_find(d, key, h, &slot);
    }
    if (d->len == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 4;
        d->entries = alloc_resize(d->entries, d->cap * sizeof *d->entries);
    }
    d->entries[d->len] = (td_dict_entry){key, value, h};
    d->slots[slot] = ++d->len;
    if (!d->tensor_keys && has_tensor(key, 1))
        d->tensor_keys = true;
    return true;
}

bool value_dict_insert_new(td_value *dict, td_value *key, td_value *value)
{
    size_t found;
    return dict_insert(dict->u.dict, key, value, value_key_hash(key), &found);
}

td_status td_value_dict_set(td_value *dict, td_value *key, td_value *value)
{
    td_status st = TD_OK;
    if (!key || !value)
        st = error_fmt(TD_ERR_INVALID, "td_value_dict_set: %s is NULL", key ? "value" : "key");
    else if (!dict || dict->kind != TD_VAL_DICT)
        st = error_fmt(TD_ERR_INVALID, "td_value_dict_set: expected a dict, got %s",
                      dict ? td_value_kind_name(dict->kind) : "NULL");
    else if (!td_value_is_hashable(key))
        st = error_fmt(TD_ERR_INVALID, "unhashable type: '%s'", td_value_kind_name(key->kind));
    if (st != TD_OK) {
        td_value_release(key);
        td_value_release(value);
        return st;
    }
    size_t found;
    if (!dict_insert(dict->u.dict, key, value, value_key_hash(key), &found)) {
        /* Python keeps the first key object and its place, and replaces the value. */
        td_dict_entry *e = &dict->u.dict->entries[found];
        td_value *old = e->value;
        e->value = value;
        td_value_release(old);
        td_value_release(key);
    }
    return TD_OK;
}

td_status td_value_dict_set_str(td_value *dict, const char *key, td_value *value)
{
    return td_value_dict_set(dict, td_value_string(key), value);
}

td_value *td_value_dict_get(const td_value *dict, const td_value *key)
{
    if (!dict || dict->kind != TD_VAL_DICT || !key || !td_value_is_hashable(key))
        return NULL;
    size_t slot, j = dict_find(dict->u.dict, key, value_key_hash(key), &slot);
    return j == SIZE_MAX ? NULL : dict->u.dict->entries[j].value;
}

td_value *td_value_dict_get_str(const td_value *dict, const char *key)
{
    if (!dict || dict->kind != TD_VAL_DICT || !key)
        return NULL;
    /* Probe with a stack value: no allocation per lookup. */
    td_value probe = {.kind = TD_VAL_STRING};
    probe.u.str.data = (char *)key;
    probe.u.str.len = strlen(key);
    size_t slot, j = dict_find(dict->u.dict, &probe, value_key_hash(&probe), &slot);
    return j == SIZE_MAX ? NULL : dict->u.dict->entries[j].value;
}

td_value *td_value_dict_key_at(const td_value *dict, size_t i)
{
    return dict && dict->kind == TD_VAL_DICT && i < dict->u.dict->len ? dict->u.dict->entries[i].key : NULL;
}

td_value *td_value_dict_value_at(const td_value *dict, size_t i)
{
    return dict && dict->kind == TD_VAL_DICT && i < dict->u.dict->len ? dict->u.dict->entries[i].value : NULL;
}

/* ---- deep copy ---------------------------------------------------------------------------- */

static void release_tensor_cb(void *t) { td_tensor_release(t); }

/* memo maps each source tensor to its clone, so that a tensor seen twice is cloned once and the
 * copy keeps the sharing (and dict keys stay distinct). */
static td_status copy_impl(const td_value *v, td_map *memo, int depth, td_value **out)
{
    if (depth > TD_VALUE_MAX_DEPTH)
        return error_fmt(TD_ERR_INVALID, "td_value_deep_copy: value nested deeper than %d levels (a cycle?)",
                        TD_VALUE_MAX_DEPTH);
    switch (v->kind) {
    case TD_VAL_NONE:
    case TD_VAL_BOOL:
    case TD_VAL_INT:
    case TD_VAL_DOUBLE:
    case TD_VAL_COMPLEX: {
        td_value *c = new_value(v->kind);
        c->u = v->u;
        *out = c;
        return TD_OK;
    }
    case TD_VAL_STRING:
    case TD_VAL_BYTES:
        *out = value_new_str(v->kind, v->u.str.data, v->u.str.len);
        return TD_OK;
    case TD_VAL_TENSOR: {
        td_tensor *t = v->u.tensor;
        td_tensor *clone = map_get(memo, &t, sizeof t);
        if (!clone) {
            TD_TRY(td_tensor_clone(t, &clone));
            map_put(memo, &t, sizeof t, clone);
        }
        *out = td_value_tensor(clone);
        return TD_OK;
    }
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD: {
        td_value *c = new_value(v->kind);
        c->u.seq.tag = v->u.seq.tag;
        c->u.seq.items = TD_NEW_ARRAY(td_value *, v->u.seq.len);
        c->u.seq.cap = v->u.seq.len;
        for (size_t i = 0; i < v->u.seq.len; i++) {
            td_status st = copy_impl(v->u.seq.items[i], memo, depth + 1, &c->u.seq.items[i]);
            if (st != TD_OK) {
                td_value_release(c);
                return st;
            }
            c->u.seq.len++;
        }
        *out = c;
        return TD_OK;
    }
    case TD_VAL_DICT: {
        const td_value_dict *d = v->u.dict;
        td_value *c = td_value_dict_new();
        value_dict_reserve(c, d->len);
        for (size_t i = 0; i < d->len; i++) {
            td_value *k = NULL, *val = NULL;
            td_status st = copy_impl(d->entries[i].key, memo, depth + 1, &k);
            if (st == TD_OK)
                st = copy_impl(d->entries[i].value, memo, depth + 1, &val);
            if (st == TD_OK && !value_dict_insert_new(c, k, val))
                st = error_fmt(TD_ERR_INTERNAL, "td_value_deep_copy: copied dict keys collided");
            if (st != TD_OK) {
                td_value_release(k);
                td_value_release(val);
                td_value_release(c);
                return st;
            }
        }
        *out = c;
        return TD_OK;
    }
    default:
        return error_fmt(TD_ERR_INTERNAL, "td_value_deep_copy: bad kind %d", (int)v->kind);
    }
}

td_status td_value_deep_copy(const td_value *v, td_value **out)
{
    if (!v || !out)
        return error_fmt(TD_ERR_INVALID, "td_value_deep_copy: NULL argument");
    td_map memo = TD_MAP_INIT;
    td_status st = copy_impl(v, &memo, 1, out);
    map_free(&memo, release_tensor_cb);
    return st;
}
