/* The td_value wire format: td_value_encode and td_value_decode (tdist/value.h), the form in
 * which object collectives, RPC messages and process queues carry values. The exact layout is in
 * docs/protocols.md ("td_value codec"): a 32-byte header, a structure section with the value tree
 * as tagged nodes, a table of tensor buffers, and the buffers themselves at 64-byte aligned
 * offsets, so a receiver can view tensors straight in the message (td_value_decode_storage).
 *
 * Encoding copies no tensor data in the common cases: the result is a list of iovecs for writev
 * that point into the tensors' storages. A contiguous tensor sends its elements; a non-contiguous
 * view keeps its layout (PyTorch's RPC returns a narrowed view still non-contiguous) by sending the
 * span of storage from its first to its last element along with its strides, unless that span is
 * mostly bytes the view skips or the view repeats it too often, in which case the view is packed
 * once, as PyTorch's RPC clones sparse views. A td_tensor reached twice is sent once and decodes
 * as one tensor (a memo of tensor identities).
 *
 * Decoding reads bytes from a peer: every read is bounds-checked, every count and length is
 * checked against the bytes left before anything is allocated for it, each buffer may back only
 * one tensor (so a small message cannot claim many copies of a large buffer), a strided view must
 * end exactly at its buffer's end and repeat it at most CODEC_MAX_REPEAT times, nesting is bounded
 * by TD_VALUE_MAX_DEPTH, and every failure is TD_ERR_INVALID naming the problem and its byte
 * offset, with everything built so far released. */
#include "tensor/codec.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/error.h"
#include "base/le.h"
#include "base/map.h"
#include "base/vec.h"
#include "tensor/value_impl.h"

static void put_varint(td_buf *b, uint64_t v)
{
    uint8_t tmp[10];
    int n = 0;
    while (v >= 0x80) {
        tmp[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    tmp[n++] = (uint8_t)v;
    buf_append(b, tmp, (size_t)n);
}

static uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }
static int64_t unzigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

static size_t align_up(size_t v) { return (v + TD_VALUE_CODEC_ALIGN - 1) & ~(size_t)(TD_VALUE_CODEC_ALIGN - 1); }

/* ---- encoding ----------------------------------------------------------------------------- */

struct td_encoded {
    td_buf head; /* header, structure section and buffer table */
    struct iovec *iov;
    size_t niov;
    size_t total;
    td_tensor **tensors; /* retained: the iovecs point into their storages */
    size_t ntensors;
    void **packed; /* buffers owned here, for the non-contiguous views */
    size_t npacked;
};

typedef struct encoder {
    td_buf s;
    td_map memo; /* td_tensor * -> its index + 1 */
    TD_VEC(td_tensor *) tensors;
} encoder;

static const char pad_zeros[TD_VALUE_CODEC_ALIGN];

static void put_f64(td_buf *b, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    le_put(buf_extend(b, 8), bits, 8);
}

/* A view whose covering span is at least this many bytes and at least twice its elements' bytes
 * is packed rather than sent with its strides: PyTorch's RPC clones such views before sending
 * (cloneSparseTensors in torch/csrc/distributed/rpc/utils.cpp, with the same two bounds), so that
 * a column of a large matrix does not cost the whole matrix. */
#define CODEC_SPAN_MIN_PACK_BYTES ((size_t)8 * 1024)
#define CODEC_SPAN_MIN_PACK_MULTIPLE 2
/* A strided view may describe at most this many times the bytes of its span (an expanded view
 * repeats its elements). The reader refuses more, so that a few bytes from a peer cannot stand
 * for a tensor whose every later use (comparing, copying, adding) costs terabytes; the writer
 * packs such views instead, which costs what sending them always cost. */
#define CODEC_MAX_REPEAT 1024

/* Whether t travels with its strides, and the bytes its buffer then holds: the span from element
 * 0 (strides are never negative, so element 0 is the lowest) to the highest element. Otherwise
 * the buffer holds the elements in row-major order. */
static bool send_strided(const td_tensor *t, size_t *span_bytes)
{
    size_t nbytes = td_tensor_nbytes(t);
    *span_bytes = nbytes;
    if (nbytes == 0 || td_tensor_is_contiguous(t))
        return false;
    const int64_t *sizes = td_tensor_sizes(t), *strides = td_tensor_strides(t);
    /* A valid tensor lies inside its storage, so this sum fits in int64 and the byte count in size_t. */
    int64_t last = 0;
    for (int i = 0; i < td_tensor_ndim(t); i++)
        last += (sizes[i] - 1) * strides[i];
    size_t span = ((size_t)last + 1) * td_dtype_size(td_tensor_dtype(t));
    if (span >= CODEC_SPAN_MIN_PACK_BYTES && span / CODEC_SPAN_MIN_PACK_MULTIPLE >= nbytes)
        return false;
    if (nbytes / CODEC_MAX_REPEAT > span || (nbytes / CODEC_MAX_REPEAT == span && nbytes % CODEC_MAX_REPEAT))
        return false;
    *span_bytes = span;
    return true;
}

static td_status encode_tensor(encoder *e, td_tensor *t)
{
    uintptr_t idx = (uintptr_t)map_get(&e->memo, &t, sizeof t);
    if (idx) {
        buf_put_u8(&e->s, TD_VTAG_TENSOR_REF);
        put_varint(&e->s, idx - 1);
        return TD_OK;
    }
    td_device dev = td_storage_device(td_tensor_storage(t));
    if (dev.type == TD_DEVICE_CUDA)
        return error_fmt(TD_ERR_UNSUPPORTED,
                        "td_value_encode: a tensor on cuda:%d cannot be encoded; copy it to the CPU first",
                        dev.index);
    int nd = td_tensor_ndim(t);
    const int64_t *sizes = td_tensor_sizes(t), *strides = td_tensor_strides(t);
    size_t span;
    bool strided = send_strided(t, &span);
    buf_put_u8(&e->s, strided ? TD_VTAG_TENSOR_STRIDED : TD_VTAG_TENSOR);
    buf_put_u8(&e->s, (uint8_t)td_tensor_dtype(t));
    buf_put_u8(&e->s, (uint8_t)nd);
    for (int i = 0; i < nd; i++)
        put_varint(&e->s, (uint64_t)sizes[i]);
    if (strided) {
        for (int i = 0; i < nd; i++)
            put_varint(&e->s, (uint64_t)strides[i]);
        put_varint(&e->s, 0); /* offset of element 0 in the span: it starts the span */
    }
    put_varint(&e->s, e->tensors.len); /* buffer index */
    buf_put_u8(&e->s, (uint8_t)dev.type);
    put_varint(&e->s, zigzag(dev.index));
    TD_VEC_PUSH(&e->tensors, td_tensor_retain(t));
    map_put(&e->memo, &t, sizeof t, (void *)(uintptr_t)e->tensors.len);
    return TD_OK;
}

static td_status encode_value(encoder *e, const td_value *v, int depth)
{
    if (depth > TD_VALUE_MAX_DEPTH)
        return error_fmt(TD_ERR_INVALID, "td_value_encode: value nested deeper than %d levels (a cycle?)",
                        TD_VALUE_MAX_DEPTH);
    td_buf *s = &e->s;
    switch (v->kind) {
    case TD_VAL_NONE:
        buf_put_u8(s, TD_VTAG_NONE);
        return TD_OK;
    case TD_VAL_BOOL:
        buf_put_u8(s, v->u.b ? TD_VTAG_TRUE : TD_VTAG_FALSE);
        return TD_OK;
    case TD_VAL_INT:
        buf_put_u8(s, TD_VTAG_INT);
        put_varint(s, zigzag(v->u.i));
        return TD_OK;
    case TD_VAL_DOUBLE:
        buf_put_u8(s, TD_VTAG_DOUBLE);
        put_f64(s, v->u.d);
        return TD_OK;
    case TD_VAL_COMPLEX:
        buf_put_u8(s, TD_VTAG_COMPLEX);
        put_f64(s, v->u.c.re);
        put_f64(s, v->u.c.im);
        return TD_OK;
    case TD_VAL_STRING:
    case TD_VAL_BYTES:
        buf_put_u8(s, v->kind == TD_VAL_STRING ? TD_VTAG_STRING : TD_VTAG_BYTES);
        put_varint(s, v->u.str.len);
        buf_append(s, v->u.str.data, v->u.str.len);
        return TD_OK;
    case TD_VAL_TENSOR:
        return encode_tensor(e, v->u.tensor);
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD:
        buf_put_u8(s, v->kind == TD_VAL_LIST ? TD_VTAG_LIST : v->kind == TD_VAL_TUPLE ? TD_VTAG_TUPLE : TD_VTAG_RECORD);
        if (v->kind == TD_VAL_RECORD)
            put_varint(s, v->u.seq.tag);
        put_varint(s, v->u.seq.len);
        for (size_t i = 0; i < v->u.seq.len; i++)
            TD_TRY(encode_value(e, v->u.seq.items[i], depth + 1));
        return TD_OK;
    case TD_VAL_DICT: {
        const td_value_dict *d = v->u.dict;
        buf_put_u8(s, TD_VTAG_DICT);
        put_varint(s, d->len);
        for (size_t i = 0; i < d->len; i++) {
            TD_TRY(encode_value(e, d->entries[i].key, depth + 1));
            TD_TRY(encode_value(e, d->entries[i].value, depth + 1));
        }
        return TD_OK;
    }
    default:
        return error_fmt(TD_ERR_INTERNAL, "td_value_encode: bad value kind %d", (int)v->kind);
    }
}

void td_encoded_free(td_encoded *e)
{
    if (!e)
        return;
    buf_free(&e->head);
    free(e->iov);
    for (size_t i = 0; i < e->ntensors; i++)
        td_tensor_release(e->tensors[i]);
    free(e->tensors);
    for (size_t i = 0; i < e->npacked; i++)
        free(e->packed[i]);
    free(e->packed);
    free(e);
}

/* Lays out the buffers after the table and builds the iovecs; packs the views send_strided
 * declines. */
static td_status finish_encoding(td_encoded *out)
{
    size_t n = out->ntensors;
    size_t table_at = out->head.len;
    buf_extend(&out->head, n * TD_VALUE_CODEC_TABLE_ENTRY);
    out->iov = TD_NEW_ARRAY(struct iovec, 1 + 2 * n);
    out->niov = 1; /* iov[0], the head, is filled last: appending the table may have moved it */
    out->packed = TD_NEW_ARRAY(void *, n);
    size_t pos = out->head.len;
    for (size_t i = 0; i < n; i++) {
        td_tensor *t = out->tensors[i];
        size_t nbytes;
        bool strided = send_strided(t, &nbytes);
        size_t off = align_up(pos);
        if (off < pos || nbytes > SIZE_MAX - off)
            return error_fmt(TD_ERR_INVALID, "td_value_encode: message size overflows");
        const void *src = NULL;
        if (nbytes && (strided || td_tensor_is_contiguous(t))) {
            src = td_tensor_data(t);
        } else if (nbytes) {
            void *p;
            TD_TRY(alloc_try(nbytes, "a packed copy of a non-contiguous tensor", &p));
            out->packed[out->npacked++] = p;
            TD_TRY(td_tensor_read(t, p, nbytes));
            src = p;
        }
        if (off > pos)
            out->iov[out->niov++] = (struct iovec){(void *)pad_zeros, off - pos};
        if (nbytes)
            out->iov[out->niov++] = (struct iovec){(void *)src, nbytes};
        uint8_t *entry = (uint8_t *)out->head.data + table_at + i * TD_VALUE_CODEC_TABLE_ENTRY;
        le_put(entry, off, 8);
        le_put(entry + 8, nbytes, 8);
        pos = off + nbytes;
    }
    out->total = pos;
    out->iov[0] = (struct iovec){out->head.data, out->head.len};
    le_put((uint8_t *)out->head.data + 24, out->total, 8);
    return TD_OK;
}

td_status td_value_encode(const td_value *v, td_encoded **out)
{
    if (!v || !out)
        return error_fmt(TD_ERR_INVALID, "td_value_encode: NULL argument");
    encoder e = {.s = TD_BUF_INIT, .memo = TD_MAP_INIT};
    buf_extend(&e.s, TD_VALUE_CODEC_HEADER_SIZE);
    td_status st = encode_value(&e, v, 1);
    map_free(&e.memo, NULL);
    td_encoded *enc = TD_NEW(td_encoded);
    enc->head = e.s;
    enc->tensors = e.tensors.items;
    enc->ntensors = e.tensors.len;
    if (st == TD_OK && enc->ntensors > UINT32_MAX)
        st = error_fmt(TD_ERR_INVALID, "td_value_encode: more than %u tensors in one value", UINT32_MAX);
    if (st == TD_OK) {
        uint8_t *h = (uint8_t *)enc->head.data;
        memset(h, 0, TD_VALUE_CODEC_HEADER_SIZE);
        le_put(h, TD_VALUE_CODEC_MAGIC, 4);
        le_put(h + 4, TD_VALUE_CODEC_VERSION, 2);
        le_put(h + 8, enc->head.len - TD_VALUE_CODEC_HEADER_SIZE, 8);
        le_put(h + 16, enc->ntensors, 4);
        st = finish_encoding(enc);
    }
    if (st != TD_OK) {
        td_encoded_free(enc);
        return st;
    }
    *out = enc;
    return TD_OK;
}

size_t td_encoded_size(const td_encoded *e) { return e ? e->total : 0; }

const struct iovec *td_encoded_iov(const td_encoded *e, size_t *count)
{
    if (count)
        *count = e ? e->niov : 0;
    return e ? e->iov : NULL;
}

void td_encoded_flatten(const td_encoded *e, void *dst)
{
    char *p = dst;
    for (size_t i = 0; i < e->niov; i++) {
        memcpy(p, e->iov[i].iov_base, e->iov[i].iov_len);
        p += e->iov[i].iov_len;
    }
}

td_status td_value_encode_bytes(const td_value *v, void **data, size_t *len)
{
    if (!data || !len)
        return error_fmt(TD_ERR_INVALID, "td_value_encode_bytes: NULL argument");
    td_encoded *e;
    TD_TRY(td_value_encode(v, &e));
    void *p;
    td_status st = alloc_try(e->total, "an encoded td_value", &p);
    if (st == TD_OK) {
        td_encoded_flatten(e, p);
        *data = p;
        *len = e->total;
    }
    td_encoded_free(e);
    return st;
}

/* ---- decoding ----------------------------------------------------------------------------- */

typedef struct decoder {
    const uint8_t *msg;
    size_t len;
    size_t pos;     /* next structure byte */
    size_t end;     /* end of the structure section */
    size_t table;   /* offset of the buffer table */
    size_t nbuf;
    uint8_t *used;  /* per buffer: claimed by a tensor already */
    td_storage *storage; /* zero-copy source, or NULL to copy */
    TD_VEC(td_tensor *) memo;
} decoder;

static td_status fail_at(size_t at, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static td_status fail_at(size_t at, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return error_fmt(TD_ERR_INVALID, "invalid td_value message at byte %zu: %s", at, what);
}

static td_status read_u8(decoder *d, uint8_t *v, const char *what)
{
    if (d->pos >= d->end)
        return fail_at(d->pos, "truncated %s (the structure section ends at byte %zu)", what, d->end);
    *v = d->msg[d->pos++];
    return TD_OK;
}

static td_status read_varint(decoder *d, uint64_t *v, const char *what)
{
    size_t start = d->pos;
    uint64_t r = 0;
    for (int shift = 0;; shift += 7) {
        if (d->pos >= d->end)
            return fail_at(start, "truncated %s (the structure section ends at byte %zu)", what, d->end);
        uint8_t b = d->msg[d->pos++];
        if (shift == 63 && b > 1) /* also catches a continuation bit on the tenth byte */
            return fail_at(start, "%s does not fit in 64 bits", what);
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
    }
    *v = r;
    return TD_OK;
}

static td_status read_f64(decoder *d, double *v, const char *what)
{
    if (d->end - d->pos < 8)
        return fail_at(d->pos, "truncated %s (the structure section ends at byte %zu)", what, d->end);
    uint64_t bits = le_get(d->msg + d->pos, 8);
    memcpy(v, &bits, sizeof *v);
    d->pos += 8;
    return TD_OK;
}

/* Reads a strided node's strides and span offset, between its sizes and its buffer index. */
static td_status read_layout(decoder *d, int ndim, int64_t *strides, int64_t *offset)
{
    uint64_t u;
    for (int i = 0; i < ndim; i++) {
        size_t stride_at = d->pos;
        TD_TRY(read_varint(d, &u, "tensor stride"));
        if (u > INT64_MAX)
            return fail_at(stride_at, "tensor stride %llu is too large", (unsigned long long)u);
        strides[i] = (int64_t)u;
    }
    size_t offset_at = d->pos;
    TD_TRY(read_varint(d, &u, "tensor offset"));
    if (u > INT64_MAX)
        return fail_at(offset_at, "tensor offset %llu is too large", (unsigned long long)u);
    *offset = (int64_t)u;
    return TD_OK;
}

/* The bytes a strided view needs, from the span start to its last element, or false when that
 * overflows. sizes are all at least 1 here. */
static bool strided_need(int ndim, const int64_t *sizes, const int64_t *strides, int64_t offset, size_t esize,
                         uint64_t *need)
{
    int64_t last = offset, term;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(sizes[i] - 1, strides[i], &term) || __builtin_add_overflow(last, term, &last))
            return false;
    return !__builtin_mul_overflow((uint64_t)last + 1, (uint64_t)esize, need);
}

static td_status decode_tensor(decoder *d, size_t at, bool strided, td_value **out)
{
    uint8_t dtype = 0, ndim = 0, devtype = 0;
    uint64_t u, bufidx, devidx;
    int64_t sizes[TD_MAX_DIMS], strides[TD_MAX_DIMS], offset = 0;
    TD_TRY(read_u8(d, &dtype, "tensor dtype"));
    if (!td_dtype_is_valid(dtype))
        return fail_at(d->pos - 1, "invalid tensor dtype %u", dtype);
    TD_TRY(read_u8(d, &ndim, "tensor ndim"));
    if (ndim > TD_MAX_DIMS)
        return fail_at(d->pos - 1, "tensor has %u dimensions, more than TD_MAX_DIMS (%d)", ndim, TD_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        size_t size_at = d->pos;
        TD_TRY(read_varint(d, &u, "tensor size"));
        if (u > INT64_MAX)
            return fail_at(size_at, "tensor size %llu is too large", (unsigned long long)u);
        sizes[i] = (int64_t)u;
        /* Zero sizes are skipped so that no shape's other sizes can overflow its strides. */
        if (u && (__builtin_mul_overflow(numel, u, &numel) || numel > INT64_MAX))
            return fail_at(size_at, "tensor shape's element count overflows");
    }
    for (int i = 0; i < ndim; i++)
        if (sizes[i] == 0)
            numel = 0;
    if (strided) {
        TD_TRY(read_layout(d, ndim, strides, &offset));
        /* The writer sends empty tensors as plain nodes; refusing them here keeps every strided
         * view's sizes at least 1 for the bounds check below. */
        if (numel == 0)
            return fail_at(at, "strided tensor node with no elements");
    }
    size_t idx_at = d->pos;
    TD_TRY(read_varint(d, &bufidx, "tensor buffer index"));
    if (bufidx >= d->nbuf)
        return fail_at(idx_at, "tensor buffer index %llu out of range (the message has %zu buffers)",
                       (unsigned long long)bufidx, d->nbuf);
    if (d->used[bufidx])
        return fail_at(idx_at, "buffer %llu backs a second tensor", (unsigned long long)bufidx);
    TD_TRY(read_u8(d, &devtype, "tensor device type"));
    if (devtype > TD_DEVICE_SIM)
        return fail_at(d->pos - 1, "invalid tensor device type %u", devtype);
    size_t dev_at = d->pos;
    TD_TRY(read_varint(d, &devidx, "tensor device index"));
    int64_t di = unzigzag(devidx);
    if (di < -1 || di > INT32_MAX)
        return fail_at(dev_at, "invalid tensor device index %lld", (long long)di);

    const uint8_t *entry = d->msg + d->table + bufidx * TD_VALUE_CODEC_TABLE_ENTRY;
    size_t off = (size_t)le_get(entry, 8), blen = (size_t)le_get(entry + 8, 8);
    size_t esize = td_dtype_size((td_dtype)dtype);
    uint64_t nbytes;
    if (strided) {
        /* The view must end exactly at its buffer's end: it stays inside what was received, and
         * the buffer holds no bytes the view cannot reach past its last element. */
        if (!strided_need(ndim, sizes, strides, offset, esize, &nbytes))
            return fail_at(at, "strided %s tensor's last element overflows (offset %lld)",
                           td_dtype_name((td_dtype)dtype), (long long)offset);
        if (nbytes != blen)
            return fail_at(at, "strided %s tensor at offset %lld needs %llu bytes of span but buffer %llu holds %zu",
                           td_dtype_name((td_dtype)dtype), (long long)offset, (unsigned long long)nbytes,
                           (unsigned long long)bufidx, blen);
        uint64_t elems, limit;
        if (__builtin_mul_overflow((uint64_t)blen, (uint64_t)CODEC_MAX_REPEAT, &limit))
            limit = UINT64_MAX;
        if (__builtin_mul_overflow(numel, (uint64_t)esize, &elems) || elems > limit)
            return fail_at(at, "strided tensor of %llu %s elements repeats its %zu-byte span more than %d times",
                           (unsigned long long)numel, td_dtype_name((td_dtype)dtype), blen, CODEC_MAX_REPEAT);
    } else if (__builtin_mul_overflow(numel, (uint64_t)esize, &nbytes) || nbytes != blen) {
        return fail_at(at, "tensor of %llu %s elements needs %llu bytes but buffer %llu holds %zu",
                       (unsigned long long)numel, td_dtype_name((td_dtype)dtype),
                       (unsigned long long)numel * esize, (unsigned long long)bufidx, blen);
    }
    d->used[bufidx] = 1;

    td_shape shape = td_shape_of(ndim, sizes);
    td_tensor *t = NULL;
    td_status st;
    if (strided && d->storage) {
        st = td_tensor_from_storage(d->storage, (int64_t)(off / esize) + offset, (td_dtype)dtype, shape, strides, &t);
    } else if (strided) {
        td_storage *span = NULL;
        st = td_storage_new(blen, &span);
        if (st == TD_OK) {
            memcpy(td_storage_data(span), d->msg + off, blen);
            st = td_tensor_from_storage(span, offset, (td_dtype)dtype, shape, strides, &t);
            td_storage_release(span);
        }
    } else if (d->storage && numel) {
        st = td_tensor_from_storage(d->storage, (int64_t)(off / esize), (td_dtype)dtype, shape, NULL, &t);
    } else if (numel) {
        st = td_tensor_from_buffer((td_dtype)dtype, shape, d->msg + off, &t);
    } else {
        st = td_tensor_empty((td_dtype)dtype, shape, &t);
    }
    if (st != TD_OK)
        return error_prefix(st, "decoding the tensor at byte %zu", at);
    TD_VEC_PUSH(&d->memo, t);
    *out = td_value_tensor(t);
    return TD_OK;
}

static td_status decode_value(decoder *d, int depth, td_value **out);

static td_status decode_count(decoder *d, const char *what, size_t min_bytes, uint64_t *n)
{
    size_t at = d->pos;
    char label[64];
    snprintf(label, sizeof label, "%s length", what);
    TD_TRY(read_varint(d, n, label));
    if (*n > (d->end - d->pos) / min_bytes)
        return fail_at(at, "%s of %llu %s cannot fit in the %zu bytes left in the structure section", what,
                       (unsigned long long)*n, min_bytes == 1 ? "items" : "entries", d->end - d->pos);
    return TD_OK;
}

static td_status decode_seq(decoder *d, td_value_kind kind, int depth, td_value **out)
{
    uint32_t tag = 0;
    if (kind == TD_VAL_RECORD) {
        size_t at = d->pos;
        uint64_t t;
        TD_TRY(read_varint(d, &t, "record tag"));
        if (t > UINT32_MAX)
            return fail_at(at, "record tag %llu does not fit in 32 bits", (unsigned long long)t);
        tag = (uint32_t)t;
    }
    uint64_t n;
    TD_TRY(decode_count(d, td_value_kind_name(kind), 1, &n));
    td_value *v = td_value_list_new();
    v->kind = kind;
    v->u.seq.tag = tag;
    value_seq_reserve(v, n);
    for (uint64_t i = 0; i < n; i++) {
        td_status st = decode_value(d, depth + 1, &v->u.seq.items[i]);
        if (st != TD_OK) {
            td_value_release(v);
            return st;
        }
        v->u.seq.len++;
    }
    *out = v;
    return TD_OK;
}

static td_status decode_dict(decoder *d, int depth, td_value **out)
{
    uint64_t n;
    TD_TRY(decode_count(d, "dict", 2, &n));
    td_value *v = td_value_dict_new();
    value_dict_reserve(v, n);
    for (uint64_t i = 0; i < n; i++) {
        size_t at = d->pos;
        td_value *key = NULL, *val = NULL;
        td_status st = decode_value(d, depth + 1, &key);
        if (st == TD_OK && !td_value_is_hashable(key))
            st = fail_at(at, "unhashable dict key of type %s", td_value_kind_name(key->kind));
        if (st == TD_OK)
            st = decode_value(d, depth + 1, &val);
        if (st == TD_OK && !value_dict_insert_new(v, key, val))
            st = fail_at(at, "duplicate dict key");
        if (st != TD_OK) {
            td_value_release(key);
            td_value_release(val);
            td_value_release(v);
            return st;
        }
    }
    *out = v;
    return TD_OK;
}

static td_status decode_value(decoder *d, int depth, td_value **out)
{
    size_t at = d->pos;
    uint8_t tag = 0;
    TD_TRY(read_u8(d, &tag, "value tag"));
    switch (tag) {
    case TD_VTAG_NONE:
        *out = td_value_none();
        return TD_OK;
    case TD_VTAG_FALSE:
    case TD_VTAG_TRUE:
        *out = td_value_bool(tag == TD_VTAG_TRUE);
        return TD_OK;
    case TD_VTAG_INT: {
        uint64_t u;
        TD_TRY(read_varint(d, &u, "int"));
        *out = td_value_int(unzigzag(u));
        return TD_OK;
    }
    case TD_VTAG_DOUBLE: {
        double x;
        TD_TRY(read_f64(d, &x, "double"));
        *out = td_value_double(x);
        return TD_OK;
    }
    case TD_VTAG_COMPLEX: {
        double re, im;
        TD_TRY(read_f64(d, &re, "complex"));
        TD_TRY(read_f64(d, &im, "complex"));
        *out = td_value_complex(re, im);
        return TD_OK;
    }
    case TD_VTAG_STRING:
    case TD_VTAG_BYTES: {
        uint64_t n;
        TD_TRY(decode_count(d, tag == TD_VTAG_STRING ? "string" : "bytes", 1, &n));
        *out = value_new_str(tag == TD_VTAG_STRING ? TD_VAL_STRING : TD_VAL_BYTES, d->msg + d->pos, (size_t)n);
        d->pos += (size_t)n;
        return TD_OK;
    }
    case TD_VTAG_TENSOR:
    case TD_VTAG_TENSOR_STRIDED:
        return decode_tensor(d, at, tag == TD_VTAG_TENSOR_STRIDED, out);
    case TD_VTAG_TENSOR_REF: {
        uint64_t i;
        TD_TRY(read_varint(d, &i, "tensor reference"));
        if (i >= d->memo.len)
            return fail_at(at, "reference to tensor %llu, but only %zu tensors came before it",
                           (unsigned long long)i, d->memo.len);
        *out = td_value_tensor(d->memo.items[i]);
        return TD_OK;
    }
    case TD_VTAG_LIST:
    case TD_VTAG_TUPLE:
    case TD_VTAG_DICT:
    case TD_VTAG_RECORD:
        if (depth >= TD_VALUE_MAX_DEPTH)
            return fail_at(at, "values nested deeper than %d levels", TD_VALUE_MAX_DEPTH);
        if (tag == TD_VTAG_DICT)
            return decode_dict(d, depth, out);
        return decode_seq(d, tag == TD_VTAG_LIST ? TD_VAL_LIST : tag == TD_VTAG_TUPLE ? TD_VAL_TUPLE : TD_VAL_RECORD,
                          depth, out);
    default:
        return fail_at(at, "unknown value tag 0x%02x", tag);
    }
}

/* The header's first fields, which a reader checks before it knows the message length. */
static td_status check_magic_version(const uint8_t *h, size_t len)
{
    if (len < TD_VALUE_CODEC_HEADER_SIZE)
        return fail_at(0, "the message has %zu bytes, fewer than the %d-byte header", len, TD_VALUE_CODEC_HEADER_SIZE);
    uint32_t magic = (uint32_t)le_get(h, 4);
    if (magic != TD_VALUE_CODEC_MAGIC)
        return fail_at(0, "bad magic 0x%08x (not a td_value message)", magic);
    unsigned version = (unsigned)le_get(h + 4, 2);
    if (version != TD_VALUE_CODEC_VERSION)
        return error_fmt(TD_ERR_INVALID, "unsupported td_value codec version %u (this build reads version %d)", version,
                        TD_VALUE_CODEC_VERSION);
    return TD_OK;
}

/* Validates the header and the buffer table against len; fills the section bounds. */
static td_status parse_header(decoder *d)
{
    const uint8_t *h = d->msg;
    TD_TRY(check_magic_version(h, d->len));
    unsigned flags = (unsigned)le_get(h + 6, 2);
    if (flags)
        return fail_at(6, "unknown flags 0x%04x", flags);
    uint64_t total = le_get(h + 24, 8);
    if (total != d->len)
        return fail_at(24, "the header declares %llu bytes but the message has %zu", (unsigned long long)total, d->len);
    uint64_t slen = le_get(h + 8, 8);
    size_t room = d->len - TD_VALUE_CODEC_HEADER_SIZE;
    if (slen > room)
        return fail_at(8, "structure section of %llu bytes exceeds the %zu bytes after the header",
                       (unsigned long long)slen, room);
    uint32_t nbuf = (uint32_t)le_get(h + 16, 4);
    if (le_get(h + 20, 4))
        return fail_at(20, "reserved header field is not zero");
    room -= (size_t)slen;
    if (nbuf > room / TD_VALUE_CODEC_TABLE_ENTRY)
        return fail_at(16, "buffer table of %u entries exceeds the %zu bytes after the structure section", nbuf,
                       room);
    d->pos = TD_VALUE_CODEC_HEADER_SIZE;
    d->end = d->pos + (size_t)slen;
    d->table = d->end;
    d->nbuf = nbuf;
    size_t prev_end = d->table + (size_t)nbuf * TD_VALUE_CODEC_TABLE_ENTRY;
    for (size_t i = 0; i < nbuf; i++) {
        size_t at = d->table + i * TD_VALUE_CODEC_TABLE_ENTRY;
        uint64_t off = le_get(d->msg + at, 8), blen = le_get(d->msg + at + 8, 8);
        if (off % TD_VALUE_CODEC_ALIGN)
            return fail_at(at, "buffer %zu offset %llu is not a multiple of %d", i, (unsigned long long)off,
                           TD_VALUE_CODEC_ALIGN);
        if (off < prev_end || off > d->len)
            return fail_at(at, "buffer %zu offset %llu is outside [%zu, %zu]", i, (unsigned long long)off, prev_end,
                           d->len);
        if (blen > d->len - off)
            return fail_at(at + 8, "buffer %zu of %llu bytes at offset %llu runs past the message end (%zu)", i,
                           (unsigned long long)blen, (unsigned long long)off, d->len);
        prev_end = (size_t)(off + blen);
    }
    if (prev_end != d->len)
        return fail_at(prev_end, "%zu unused bytes after the last buffer", d->len - prev_end);
    return TD_OK;
}

static td_status decode_message(const void *data, size_t len, td_storage *storage, td_value **out)
{
    if (!out || (!data && len))
        return error_fmt(TD_ERR_INVALID, "td_value_decode: NULL argument");
    decoder d = {.msg = data, .len = len, .storage = storage};
    td_status st = parse_header(&d);
    td_value *v = NULL;
    if (st == TD_OK) {
        d.used = TD_NEW_ARRAY(uint8_t, d.nbuf);
        st = decode_value(&d, 1, &v);
    }
    if (st == TD_OK && d.pos != d.end)
        st = fail_at(d.pos, "%zu bytes left over in the structure section", d.end - d.pos);
    for (size_t i = 0; st == TD_OK && i < d.nbuf; i++)
        if (!d.used[i])
            st = fail_at(d.table + i * TD_VALUE_CODEC_TABLE_ENTRY, "buffer %zu backs no tensor", i);
    for (size_t i = 0; i < d.memo.len; i++)
        td_tensor_release(d.memo.items[i]);
    TD_VEC_FREE(&d.memo);
    free(d.used);
    if (st != TD_OK) {
        td_value_release(v);
        return st;
    }
    *out = v;
    return TD_OK;
}

td_status td_value_decode(const void *data, size_t len, td_value **out)
{
    return decode_message(data, len, NULL, out);
}

td_status td_value_decode_storage(td_storage *message, td_value **out)
{
    if (!message)
        return error_fmt(TD_ERR_INVALID, "td_value_decode_storage: NULL storage");
    return decode_message(td_storage_data(message), td_storage_nbytes(message), message, out);
}

td_status value_codec_message_size(const void *data, size_t len, size_t *total)
{
    const uint8_t *h = data;
    TD_TRY(check_magic_version(h, len));
    uint64_t t = le_get(h + 24, 8);
    if (t < TD_VALUE_CODEC_HEADER_SIZE || t > SIZE_MAX)
        return fail_at(24, "declared message length %llu is invalid", (unsigned long long)t);
    *total = (size_t)t;
    return TD_OK;
}
