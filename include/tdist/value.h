/* tdist/value.h: td_value, the IValue analogue, and its binary codec.
 *
 * A td_value is a refcounted, dynamically typed value: none, bool, int (int64), double, complex,
 * string, bytes, tensor, list, tuple, dict, or a tagged record. Object collectives, RPC arguments
 * and results, and inter-process queues all carry td_values.
 *
 * Ownership: constructors return a new reference. Container setters (td_value_list_append,
 * td_value_tuple_set, td_value_dict_set, record fields) TAKE the references they are given, so
 * values nest without temporaries:
 *     td_value *v = td_value_list_new();
 *     td_value_list_append(v, td_value_int(3));
 *     td_value_list_append(v, td_value_string("three"));
 *     ...; td_value_release(v);
 * Getters that return a td_value * (td_value_at, td_value_dict_get, ...) return a BORROWED pointer,
 * valid while the container lives and is not modified. Small constructors never fail (they abort
 * on out-of-memory, as glib does); anything sized by input returns a td_status. A setter that
 * fails (wrong kind, index out of range, unhashable key) still takes, and releases, what it was
 * given. Values are not locked: share them read-only between threads, or lock around changes.
 */
#ifndef TDIST_VALUE_H
#define TDIST_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/uio.h>

#include <tdist/status.h>
#include <tdist/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum td_value_kind {
    TD_VAL_NONE = 0,
    TD_VAL_BOOL,
    TD_VAL_INT,
    TD_VAL_DOUBLE,
    TD_VAL_COMPLEX,
    TD_VAL_STRING,
    TD_VAL_BYTES,
    TD_VAL_TENSOR,
    TD_VAL_LIST,
    TD_VAL_TUPLE,
    TD_VAL_DICT,
    TD_VAL_RECORD,
    TD_VAL_KIND_COUNT
} td_value_kind;

/* Record tags reserved for the layers above: a record is a tag plus a tuple of fields. */
typedef enum td_record_tag {
    TD_REC_WORKER_INFO = 1, /* (name: string, id: int) */
    TD_REC_RREF = 2,        /* (owner id: int, rref id: (int, int), fork id: (int, int), type: string) */
    TD_REC_ERROR = 3,       /* (type name: string, message: string) */
    TD_REC_DEVICE = 4,      /* (type: int td_device_type, index: int) */
    TD_REC_MP_OBJECT = 5,   /* tdist/mp.h: a queue or event (td_mp_queue_value) */
    TD_REC_MP_TENSOR = 6,   /* mp queue messages only: a tensor sent by shared-memory handle */
    TD_REC_SAVED_TENSOR = 7, /* td_value_save files only: (location: 16 bytes, "cuda:0" NUL-padded, tensor) */
    TD_REC_USER = 1000,     /* tags from here up are free for applications */
} td_record_tag;

typedef struct td_value td_value;

TD_API const char *td_value_kind_name(td_value_kind kind); /* "none", "bool", "int", ... */

/* Constructors (new references). */
TD_API td_value *td_value_none(void);
TD_API td_value *td_value_bool(bool b);
TD_API td_value *td_value_int(int64_t i);
TD_API td_value *td_value_double(double d);
TD_API td_value *td_value_complex(double re, double im);
TD_API td_value *td_value_string(const char *s);              /* copies a NUL-terminated string */
TD_API td_value *td_value_string_n(const char *s, size_t len); /* copies len bytes (UTF-8 not checked) */
TD_API td_value *td_value_bytes(const void *data, size_t len); /* copies */
TD_API td_value *td_value_tensor(td_tensor *t);               /* retains t */
TD_API td_value *td_value_list_new(void);
TD_API td_value *td_value_tuple_new(size_t len);               /* elements start as none */
TD_API td_value *td_value_dict_new(void);
TD_API td_value *td_value_record_new(uint32_t tag, size_t nfields); /* fields start as none */
/* A tuple from n values, taking them: td_value_tuple_of(2, td_value_int(1), td_value_string("a")). */
TD_API td_value *td_value_tuple_of(size_t n, ...);
TD_API td_value *td_value_error(const char *type_name, const char *message); /* TD_REC_ERROR */
/* A record from n field values, taking them (as td_value_tuple_of). */
TD_API td_value *td_value_record_of(uint32_t tag, size_t n, ...);
TD_API td_value *td_value_worker_info(const char *name, int64_t id); /* TD_REC_WORKER_INFO */
TD_API td_value *td_value_device(td_device device);                 /* TD_REC_DEVICE */

/* Containers nest at most this deep in the codec, printing, equality, hashing and deep copy (the
 * top-level value is depth 1). Deeper values cannot be encoded or copied (TD_ERR_INVALID). */
#define TD_VALUE_MAX_DEPTH 512

TD_API td_value *td_value_retain(td_value *v);
TD_API void td_value_release(td_value *v);

/* Inspection. Accessors on the wrong kind return a zero value; check the kind first. */
TD_API td_value_kind td_value_kind_of(const td_value *v);
TD_API bool td_value_get_bool(const td_value *v);
TD_API int64_t td_value_get_int(const td_value *v);
TD_API double td_value_get_double(const td_value *v);
TD_API void td_value_get_complex(const td_value *v, double *re, double *im);
/* String and bytes contents (borrowed; strings are NUL-terminated). len may be NULL. */
TD_API const char *td_value_get_string(const td_value *v, size_t *len);
TD_API const void *td_value_get_bytes(const td_value *v, size_t *len);
TD_API td_tensor *td_value_get_tensor(const td_value *v); /* borrowed */
TD_API uint32_t td_value_record_tag(const td_value *v);

/* Sequences: list, tuple, record (its fields), dict (its entries), string and bytes (for len). */
TD_API size_t td_value_len(const td_value *v);
TD_API td_value *td_value_at(const td_value *v, size_t i); /* list / tuple / record; borrowed */
TD_API td_status td_value_list_append(td_value *list, td_value *item); /* takes item */
TD_API td_status td_value_set(td_value *seq, size_t i, td_value *item); /* list/tuple/record; takes item */

/* Dicts keep insertion order, like Python's. Keys must be hashable: none, bool, int, double,
 * complex, string, bytes, tensor (by identity, as IValue) or a tuple of hashables. */
TD_API td_status td_value_dict_set(td_value *dict, td_value *key, td_value *value); /* takes both */
TD_API td_value *td_value_dict_get(const td_value *dict, const td_value *key);       /* borrowed or NULL */
TD_API td_value *td_value_dict_get_str(const td_value *dict, const char *key);
TD_API td_status td_value_dict_set_str(td_value *dict, const char *key, td_value *value); /* takes value */
TD_API td_value *td_value_dict_key_at(const td_value *dict, size_t i);
TD_API td_value *td_value_dict_value_at(const td_value *dict, size_t i);

/* Whole values. equal: same kind and contents, tensors by td_tensor_equal, doubles by ==. hash:
 * consistent with equal for hashable kinds. deep_copy clones tensors and containers.
 * Different kinds are never equal: 1, 1.0 and True are three distinct dict keys (simpler than
 * Python's numeric tower, and exact). Dicts compare as sets of entries, whatever their order. As
 * dict keys, tensors compare by identity (as IValue keys do); a key must not change while it is
 * in a dict. */
TD_API bool td_value_equal(const td_value *a, const td_value *b);
TD_API uint64_t td_value_hash(const td_value *v);
TD_API bool td_value_is_hashable(const td_value *v);
TD_API td_status td_value_deep_copy(const td_value *v, td_value **out);
/* Python-like printed form: "[1, 'a', (2.5, None), {'k': tensor([1, 2])}]". malloc'd. */
TD_API char *td_value_format(const td_value *v);
TD_API void td_value_print(FILE *f, const td_value *v);

/* ---- codec -------------------------------------------------------------------------------- *
 * The wire form of a value (docs/protocols.md) is a header and structure section followed by a
 * table of tensor buffers. Encoding copies no tensor data: td_encoded lists the pieces as iovecs
 * that point into the tensors' storages, ready for writev/sendmsg. A contiguous view sends only
 * its elements; a non-contiguous one sends the span of its storage that it covers, with its
 * strides, and arrives as a view with those strides (a view mostly made of skipped or repeated
 * bytes is packed once instead, into a buffer the td_encoded owns, and arrives contiguous).
 * Decoding validates every length and count against the input before allocating anything. */

typedef struct td_encoded td_encoded;

TD_API td_status td_value_encode(const td_value *v, td_encoded **out);
/* Total size in bytes of the encoded message. */
TD_API size_t td_encoded_size(const td_encoded *e);
/* The message as a list of byte ranges, in order (borrowed; valid while e lives). */
TD_API const struct iovec *td_encoded_iov(const td_encoded *e, size_t *count);
/* Copies the whole message into dst (td_encoded_size bytes). */
TD_API void td_encoded_flatten(const td_encoded *e, void *dst);
TD_API void td_encoded_free(td_encoded *e);
/* Encode straight to one contiguous malloc'd buffer. */
TD_API td_status td_value_encode_bytes(const td_value *v, void **data, size_t *len);

/* Decodes a message held in len bytes at data. Tensors get their own storages (copied). */
TD_API td_status td_value_decode(const void *data, size_t len, td_value **out);
/* Zero-copy: the message sits in `message` (bytes [0, nbytes) of that storage); decoded tensors are
 * views into it, and keep it alive. */
TD_API td_status td_value_decode_storage(td_storage *message, td_value **out);

#ifdef __cplusplus
}
#endif
#endif
