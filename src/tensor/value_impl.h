/* Internal layout of td_value, shared by value.c (objects, containers, equality, hashing),
 * value_format.c (printed form) and codec.c (wire form). Nothing outside the tensor layer
 * includes this: everyone else goes through tdist/value.h. */
#ifndef TDIST_TENSOR_VALUE_IMPL_H
#define TDIST_TENSOR_VALUE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/value.h>

#include "base/ref.h"

typedef struct td_dict_entry {
    td_value *key;
    td_value *value;
    uint64_t hash; /* value_key_hash(key), kept so that growing the index never rehashes keys */
} td_dict_entry;

/* Entries in insertion order plus an open-addressing index over them. Nothing is ever removed,
 * so the index needs no tombstones. */
typedef struct td_value_dict {
    td_dict_entry *entries;
    size_t len;
    size_t cap;
    size_t *slots;   /* entry index + 1; 0 marks an empty slot */
    size_t nslots;   /* a power of two, at least 2 * len */
    bool tensor_keys; /* some key holds a tensor (equality then needs a by-value scan) */
} td_value_dict;

struct td_value {
    td_ref ref;
    td_value_kind kind;
    union {
        bool b;
        int64_t i;
        double d;
        struct {
            double re, im;
        } c;
        struct {
            char *data; /* NUL-terminated for strings and bytes alike */
            size_t len;
        } str;
        td_tensor *tensor;
        struct {
            td_value **items;
            size_t len;
            size_t cap;
            uint32_t tag; /* records only */
        } seq;            /* list, tuple, record */
        td_value_dict *dict;
    } u;
};

/* The hash a dict uses for its keys: td_value_hash, except that tensors count by identity, as
 * dict keys compare them (IValue does the same). */
uint64_t value_key_hash(const td_value *key);
/* Dict key equality: td_value_equal with tensors by identity. */
bool value_key_equal(const td_value *a, const td_value *b);
/* A string or bytes value over len bytes, copied (bytes may hold NULs). */
td_value *value_new_str(td_value_kind kind, const void *data, size_t len);
/* Inserts key -> value (taking both) when the key is new; when it is not, returns false and
 * leaves both to the caller. The key must be hashable. */
bool value_dict_insert_new(td_value *dict, td_value *key, td_value *value);
/* Makes room for n more entries, for decoders that know the count. */
void value_dict_reserve(td_value *dict, size_t n);
void value_seq_reserve(td_value *list, size_t n);

#endif
