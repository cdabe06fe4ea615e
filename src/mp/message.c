/* mp messages (message.h): encoding a td_value into an envelope whose tensors travel as
 * shared-memory handles and whose queues and events travel as fds, the datagram send and receive
 * with SCM_RIGHTS, and the careful decoder. Queues (queue.c) and spawned processes' arguments
 * (process.c) use it; docs/protocols.md ("mp queue") has the format. */
#include "mp/message.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/le.h"
#include "base/map.h"
#include "mp/device_share.h"
#include "mp/share.h"
#include "tensor/handle.h"
#include "tensor/storage.h"
#include "tensor/strided.h"

/* ---- objects inside values ---------------------------------------------------------------- */

typedef struct object_ctx {
    const mp_object_class *cls;
    void *obj;
} object_ctx;

static const char object_kind = 0; /* the handles' kind (tensor/handle.h) */

static void object_release(void *p)
{
    object_ctx *c = p;
    c->cls->release(c->obj);
    free(c);
}

td_value *mp_object_value(const mp_object_class *cls, void *obj)
{
    object_ctx *c = TD_NEW(object_ctx);
    c->cls = cls;
    c->obj = cls->retain(obj);
    return td_value_record_of(TD_REC_MP_OBJECT, 2, td_value_int(cls->kind), value_handle_new(&object_kind, c, object_release));
}

static object_ctx *object_ctx_of(const td_value *v)
{
    if (!v || td_value_kind_of(v) != TD_VAL_RECORD || td_value_record_tag(v) != TD_REC_MP_OBJECT || td_value_len(v) != 2)
        return NULL;
    return value_handle_get(td_value_at(v, 1), &object_kind);
}

void *mp_object_of(const td_value *v, td_mp_object_kind kind)
{
    object_ctx *c = object_ctx_of(v);
    return c && c->cls->kind == kind ? c->obj : NULL;
}

/* ---- encoding ----------------------------------------------------------------------------- */

typedef struct enc {
    td_mp_msg *m;
    td_map tensors_memo;  /* td_tensor * -> index + 1 */
    td_map storages_memo; /* td_storage * -> index + 1 */
    td_map objects_memo;  /* object pointer -> index + 1 */
    td_value *storages, *tensors, *objects;
} enc;

static td_status add_fd(enc *e, int fd, int64_t *index)
{
    if (e->m->fds.len >= TD_MP_MSG_MAX_FDS)
        return error_fmt(TD_ERR_UNSUPPORTED,
                        "an mp message can carry at most %d file descriptors (the kernel's SCM_MAX_FD), and this one "
                        "needs more: each storage shared with the file_descriptor strategy, each queue (3) and each "
                        "event (1) takes some. Send fewer storages per message, or use the file_system strategy",
                        TD_MP_MSG_MAX_FDS);
    *index = (int64_t)e->m->fds.len;
    TD_VEC_PUSH(&e->m->fds, fd);
    return TD_OK;
}

static td_status enc_storage(enc *e, td_storage *s, int64_t *index)
{
    uintptr_t idx = (uintptr_t)map_get(&e->storages_memo, &s, sizeof s);
    if (idx) {
        *index = (int64_t)idx - 1;
        return TD_OK;
    }
    td_value *entry;
    if (s->device.type != TD_DEVICE_CPU) { /* device memory: by IPC handle (device_share.c) */
        TD_TRY(dshare_export(s, &entry));
        TD_VEC_PUSH(&e->m->device_storages, td_storage_retain(s));
        goto add;
    }
    td_shm_handle h;
    TD_TRY(shm_export(s, &h));
    if (h.kind == TD_SHM_NAMED) {
        TD_VEC_PUSH(&e->m->inflight, alloc_strdup(h.name));
        entry = td_value_tuple_of(3, td_value_int(TD_SHM_NAMED), td_value_int((int64_t)h.nbytes), td_value_string(h.name));
    } else if (h.kind == TD_SHM_FD) {
        int64_t fdi;
        TD_TRY(add_fd(e, h.fd, &fdi));
        entry = td_value_tuple_of(5, td_value_int(TD_SHM_FD), td_value_int((int64_t)h.nbytes), td_value_int(fdi),
                                  td_value_int((int64_t)h.dev), td_value_int((int64_t)h.ino));
    } else {
        entry = td_value_tuple_of(2, td_value_int(TD_SHM_EMPTY), td_value_int(0));
    }
add:
    TD_VEC_PUSH(&e->m->storages, td_storage_retain(s));
    td_value_list_append(e->storages, entry);
    *index = (int64_t)td_value_len(e->storages) - 1;
    map_put(&e->storages_memo, &s, sizeof s, (void *)(uintptr_t)(*index + 1));
    return TD_OK;
}

static td_value *int_tuple(int n, const int64_t *v)
{
    td_value *t = td_value_tuple_new((size_t)n);
    for (int i = 0; i < n; i++)
        td_value_set(t, (size_t)i, td_value_int(v[i]));
    return t;
}

/* The autograd metadata that travels: requires_grad and the kind (tensor/strided.h). Never .grad,
 * hooks or graph, which belong to this process's autograd; so a non-leaf, whose requires_grad
 * means a graph, is refused before anything of it is shared, with PyTorch's words. */
static td_status enc_grad_flags(const td_tensor *t, uint32_t *wire)
{
    uint32_t flags = tensor_grad_flags(t);
    if (flags & TENSOR_NON_LEAF)
        return error_fmt(TD_ERR_INVALID,
                         "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not "
                         "support crossing process boundaries.  If you just want to transfer the data, call detach() "
                         "on the tensor before serializing (e.g., putting it on the queue).");
    *wire = (flags & TENSOR_REQUIRES_GRAD ? MP_TENSOR_REQUIRES_GRAD : 0u) |
            (flags & TENSOR_PARAMETER ? MP_TENSOR_PARAMETER : 0u);
    return TD_OK;
}

static td_status enc_tensor(enc *e, td_tensor *t, td_value **out)
{
    uintptr_t idx = (uintptr_t)map_get(&e->tensors_memo, &t, sizeof t);
    if (!idx) {
        uint32_t flags = 0;
        TD_TRY(enc_grad_flags(t, &flags));
        int64_t sidx;
        TD_TRY(enc_storage(e, td_tensor_storage(t), &sidx));
        int nd = td_tensor_ndim(t);
        /* The flags field only when set: messages of plain tensors stay what they were. */
        td_value *entry = td_value_tuple_new(flags ? 6 : 5);
        td_value_set(entry, 0, td_value_int(sidx));
        td_value_set(entry, 1, td_value_int(td_tensor_offset(t)));
        td_value_set(entry, 2, td_value_int(td_tensor_dtype(t)));
        td_value_set(entry, 3, int_tuple(nd, td_tensor_sizes(t)));
        td_value_set(entry, 4, int_tuple(nd, td_tensor_strides(t)));
        if (flags)
            td_value_set(entry, 5, td_value_int(flags));
        td_value_list_append(e->tensors, entry);
        idx = td_value_len(e->tensors);
        map_put(&e->tensors_memo, &t, sizeof t, (void *)idx);
    }
    *out = td_value_record_of(TD_REC_MP_TENSOR, 1, td_value_int((int64_t)idx - 1));
    return TD_OK;
}

static td_status enc_object(enc *e, const td_value *v, object_ctx *c, td_value **out)
{
    uintptr_t idx = (uintptr_t)map_get(&e->objects_memo, &c->obj, sizeof c->obj);
    if (!idx) {
        const mp_object_class *cls = c->cls;
        int fds[MP_OBJECT_MAX_FDS];
        int64_t param = cls->wire(c->obj, fds);
        size_t at = 0, first_fd = cls->has_param ? 2 : 1;
        td_value *entry = td_value_tuple_new(first_fd + (size_t)cls->nfds);
        td_value_set(entry, at++, td_value_int(cls->kind));
        if (cls->has_param)
            td_value_set(entry, at++, td_value_int(param));
        for (int i = 0; i < cls->nfds; i++) {
            int64_t fi;
            td_status st = add_fd(e, fds[i], &fi);
            if (st != TD_OK) {
                td_value_release(entry);
                return st;
            }
            td_value_set(entry, at++, td_value_int(fi));
        }
        TD_VEC_PUSH(&e->m->objects, td_value_retain((td_value *)v));
        td_value_list_append(e->objects, entry);
        idx = td_value_len(e->objects);
        map_put(&e->objects_memo, &c->obj, sizeof c->obj, (void *)idx);
    }
    *out = td_value_record_of(TD_REC_MP_OBJECT, 1, td_value_int((int64_t)idx - 1));
    return TD_OK;
}

/* Dict keys stay as they are, so they must hold nothing the envelope replaces. */
static bool key_is_plain(const td_value *k)
{
    td_value_kind kind = td_value_kind_of(k);
    if (kind == TD_VAL_TENSOR)
        return false;
    if (kind == TD_VAL_TUPLE)
        for (size_t i = 0; i < td_value_len(k); i++)
            if (!key_is_plain(td_value_at(k, i)))
                return false;
    return true;
}

static td_status enc_value(enc *e, const td_value *v, int depth, td_value **out)
{
    /* The envelope adds two levels above the value. */
    if (depth > TD_VALUE_MAX_DEPTH - 2)
        return error_fmt(TD_ERR_INVALID, "mp message: value nested deeper than %d levels", TD_VALUE_MAX_DEPTH - 2);
    td_value_kind kind = td_value_kind_of(v);
    switch (kind) {
    case TD_VAL_TENSOR:
        return enc_tensor(e, td_value_get_tensor(v), out);
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD: {
        size_t n = td_value_len(v);
        if (kind == TD_VAL_RECORD) {
            uint32_t tag = td_value_record_tag(v);
            if (tag == TD_REC_MP_OBJECT) {
                object_ctx *c = object_ctx_of(v);
                if (!c)
                    return error_fmt(TD_ERR_INVALID, "mp message: a record with tag %u (TD_REC_MP_OBJECT) that does "
                                                    "not hold a queue or event",
                                    tag);
                return enc_object(e, v, c, out);
            }
            if (tag == TD_REC_MP_TENSOR)
                return error_fmt(TD_ERR_INVALID, "mp message: record tag %u is reserved for tdist's mp layer", tag);
        }
        td_value *c = kind == TD_VAL_LIST ? td_value_list_new()
                      : kind == TD_VAL_TUPLE ? td_value_tuple_new(n)
                                             : td_value_record_new(td_value_record_tag(v), n);
        for (size_t i = 0; i < n; i++) {
            td_value *item;
            td_status st = enc_value(e, td_value_at(v, i), depth + 1, &item);
            if (st != TD_OK) {
                td_value_release(c);
                return st;
            }
            if (kind == TD_VAL_LIST)
                td_value_list_append(c, item);
            else
                td_value_set(c, i, item);
        }
        *out = c;
        return TD_OK;
    }
    case TD_VAL_DICT: {
        td_value *d = td_value_dict_new();
        for (size_t i = 0; i < td_value_len(v); i++) {
            td_value *k = td_value_dict_key_at(v, i);
            if (!key_is_plain(k)) {
                td_value_release(d);
                return error_fmt(TD_ERR_UNSUPPORTED, "mp message: a dict keyed by tensors cannot be sent between "
                                                    "processes (tensor keys compare by identity)");
            }
            td_value *item;
            td_status st = enc_value(e, td_value_dict_value_at(v, i), depth + 1, &item);
            if (st != TD_OK) {
                td_value_release(d);
                return st;
            }
            td_value_dict_set(d, td_value_retain(k), item);
        }
        *out = d;
        return TD_OK;
    }
    default:
        *out = td_value_retain((td_value *)v); /* scalars and strings are never modified */
        return TD_OK;
    }
}


td_status mp_msg_encode(const td_value *v, td_mp_msg *m)
{
    memset(m, 0, sizeof *m);
    m->spill = (td_segment)TD_SEGMENT_INIT;
    if (!v)
        return error_fmt(TD_ERR_INVALID, "mp message: value is NULL");
    enc e = {.m = m, .storages = td_value_list_new(), .tensors = td_value_list_new(), .objects = td_value_list_new()};
    td_value *body = NULL;
    td_status st = enc_value(&e, v, 1, &body);
    map_free(&e.tensors_memo, NULL);
    map_free(&e.storages_memo, NULL);
    map_free(&e.objects_memo, NULL);
    if (st != TD_OK) {
        td_value_release(e.storages);
        td_value_release(e.tensors);
        td_value_release(e.objects);
        return st;
    }
    td_value *env = td_value_tuple_of(4, e.storages, e.tensors, e.objects, body);
    void *bytes = NULL;
    size_t len = 0;
    st = td_value_encode_bytes(env, &bytes, &len);
    td_value_release(env);
    if (st != TD_OK)
        return st;
    uint32_t flags = 0;
    if (len > TD_MP_MSG_INLINE_MAX - TD_MP_MSG_HEADER) {
        int64_t fi;
        st = segment_create("msg", len, true, true, &m->spill);
        if (st == TD_OK)
            st = add_fd(&e, m->spill.fd, &fi);
        if (st != TD_OK) {
            free(bytes);
            return st;
        }
        memcpy(m->spill.base, bytes, len);
        flags |= TD_MP_MSG_FLAG_SPILLED;
    }
    uint8_t *h = buf_extend(&m->data, TD_MP_MSG_HEADER);
    le_put(h, TD_MP_MSG_MAGIC, 4);
    le_put(h + 4, TD_MP_MSG_VERSION, 2);
    le_put(h + 6, flags, 2);
    le_put(h + 8, (uint64_t)m->fds.len, 4);
    le_put(h + 12, 0, 4);
    le_put(h + 16, (uint64_t)len, 8);
    if (!(flags & TD_MP_MSG_FLAG_SPILLED))
        buf_append(&m->data, bytes, len);
    free(bytes);
    return TD_OK;
}

void mp_msg_free(td_mp_msg *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->inflight.len; i++) {
        if (!m->sent)
            shm_abandon(m->inflight.items[i]);
        free(m->inflight.items[i]);
    }
    TD_VEC_FREE(&m->inflight);
    for (size_t i = 0; i < m->device_storages.len; i++) {
        if (!m->sent && m->device_storages.items[i]->nbytes)
            dshare_abandon(m->device_storages.items[i]);
        td_storage_release(m->device_storages.items[i]);
    }
    TD_VEC_FREE(&m->device_storages);
    for (size_t i = 0; i < m->storages.len; i++)
        td_storage_release(m->storages.items[i]);
    TD_VEC_FREE(&m->storages);
    for (size_t i = 0; i < m->objects.len; i++)
        td_value_release(m->objects.items[i]);
    TD_VEC_FREE(&m->objects);
    TD_VEC_FREE(&m->fds);
    if (m->spill.base)
        segment_unmap(&m->spill);
    buf_free(&m->data);
}

td_status mp_msg_send(int sock, td_mp_msg *m, bool nonblock, int64_t deadline_ns)
{
    struct iovec iov = {.iov_base = m->data.data, .iov_len = m->data.len};
    union {
        char buf[CMSG_SPACE(sizeof(int) * TD_MP_MSG_MAX_FDS)];
        struct cmsghdr align;
    } cbuf;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (m->fds.len) {
        size_t n = sizeof(int) * m->fds.len;
        memset(cbuf.buf, 0, sizeof cbuf.buf);
        mh.msg_control = cbuf.buf;
        mh.msg_controllen = CMSG_SPACE(n);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(n);
        memcpy(CMSG_DATA(c), m->fds.items, n);
    }
    for (;;) {
        ssize_t w = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w >= 0) {
            m->sent = true;
            return TD_OK;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (nonblock)
                return error_fmt(TD_ERR_TIMEOUT, "the queue's socket is full");
            struct pollfd p = {.fd = sock, .events = POLLOUT};
            int r = poll(&p, 1, deadline_poll_ms(deadline_ns));
            if (r == 0)
                return error_fmt(TD_ERR_TIMEOUT, "timed out waiting for room in the queue");
            continue;
        }
        if (errno == ETOOMANYREFS) {
            /* Too many of this user's fds are in flight (the kernel bounds them by RLIMIT_NOFILE):
             * wait for readers to take some, as for a full socket. */
            if (nonblock)
                return error_fmt(TD_ERR_TIMEOUT, "too many file descriptors in flight");
            if (deadline_passed(deadline_ns))
                return error_fmt(TD_ERR_TIMEOUT, "timed out waiting for readers to take the file descriptors in flight");
            clock_sleep_ms(1);
            continue;
        }
        if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)
            return error_fmt(TD_ERR_PEER_LOST, "the receiving end of the queue is closed in every process");
        return error_errno(TD_ERR_IO, "sending an mp message of %zu bytes and %zu fds", m->data.len, m->fds.len);
    }
}

/* ---- receiving ---------------------------------------------------------------------------- */

static void close_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

void mp_rmsg_free(td_mp_rmsg *r)
{
    close_fds(r->fds, r->nfds);
    r->nfds = 0;
    free(r->data);
    r->data = NULL;
}

td_status mp_msg_recv(int sock, int64_t deadline_ns, td_mp_rmsg *r)
{
    memset(r, 0, sizeof *r);
    union {
        char buf[CMSG_SPACE(sizeof(int) * TD_MP_MSG_MAX_FDS)];
        struct cmsghdr align;
    } cbuf;
    char *data = alloc_or_die(TD_MP_MSG_INLINE_MAX);
    for (;;) {
        struct iovec iov = {.iov_base = data, .iov_len = TD_MP_MSG_INLINE_MAX};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf, .msg_controllen = sizeof cbuf.buf};
        ssize_t n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {.fd = sock, .events = POLLIN};
            int pr = poll(&p, 1, deadline_poll_ms(deadline_ns));
            if (pr == 0) {
                free(data);
                return error_fmt(TD_ERR_TIMEOUT, "no message came");
            }
            continue; /* another reader may have taken it: wait again */
        }
        if (n < 0) {
            free(data);
            return error_errno(TD_ERR_IO, "receiving an mp message");
        }
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < k; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (r->nfds < TD_MP_MSG_MAX_FDS)
                    r->fds[r->nfds++] = fd;
                else
                    close(fd);
            }
        }
        if (n == 0 && r->nfds == 0) {
            free(data);
            return error_fmt(TD_ERR_PEER_LOST, "the queue's sending end is closed in every process");
        }
        if (mh.msg_flags & MSG_CTRUNC) {
            free(data);
            mp_rmsg_free(r);
            return error_fmt(TD_ERR_IO, "an mp message arrived without some of its file descriptors: this process "
                                       "is out of file descriptors (under the file_descriptor strategy each shared "
                                       "storage keeps one open). Raise the limit (ulimit -n) or use the file_system "
                                       "strategy. The message was dropped");
        }
        if (mh.msg_flags & MSG_TRUNC) {
            free(data);
            mp_rmsg_free(r);
            return error_fmt(TD_ERR_INVALID, "an mp message longer than %u bytes was truncated and dropped",
                            TD_MP_MSG_INLINE_MAX);
        }
        r->data = data;
        r->len = (size_t)n;
        return TD_OK;
    }
}

/* ---- decoding ----------------------------------------------------------------------------- */

typedef struct dec {
    const mp_object_class *const *classes; /* what objects may be rebuilt */
    int *fds;
    int nfds;
    bool *used;
    td_storage **storages;
    size_t nstorages;
    td_tensor **tensors;
    size_t ntensors;
    td_value **objects;
    size_t nobjects;
} dec;

static td_status bad(const char *what) { return error_fmt(TD_ERR_INVALID, "invalid mp message: %s", what); }

static bool get_int(const td_value *t, size_t i, int64_t *out)
{
    if (i >= td_value_len(t))
        return false;
    const td_value *v = td_value_at(t, i);
    if (td_value_kind_of(v) != TD_VAL_INT)
        return false;
    *out = td_value_get_int(v);
    return true;
}

static bool is_seq(const td_value *v)
{
    td_value_kind k = td_value_kind_of(v);
    return k == TD_VAL_LIST || k == TD_VAL_TUPLE;
}

/* Takes fd number `index` out of the message (each may be used once). */
static td_status take_fd(dec *d, int64_t index, int *fd)
{
    if (index < 0 || index >= d->nfds || d->used[index])
        return bad("a file descriptor index is out of range or used twice");
    d->used[index] = true;
    *fd = d->fds[index];
    d->fds[index] = -1;
    return TD_OK;
}

static td_status dec_storage(dec *d, const td_value *e, td_storage **out)
{
    int64_t kind, nbytes;
    if (td_value_kind_of(e) != TD_VAL_TUPLE || !get_int(e, 0, &kind) || !get_int(e, 1, &nbytes) || nbytes < 0)
        return bad("a storage entry is not (kind, nbytes, ...)");
    if (kind == TD_SHM_EMPTY && td_value_len(e) == 4 && nbytes == 0)
        return dshare_import_empty(e, out);
    if (kind == TD_SHM_DEVICE)
        return dshare_import(e, out);
    if (kind == TD_SHM_EMPTY) {
        if (td_value_len(e) != 2 || nbytes != 0)
            return bad("an empty storage entry has a size");
        return td_storage_new(0, out);
    }
    if (kind == TD_SHM_FD) {
        int64_t fi;
        if (td_value_len(e) != 5 || !get_int(e, 2, &fi) || nbytes == 0)
            return bad("an fd storage entry is not (1, nbytes, fd index, dev, ino)");
        int fd;
        TD_TRY(take_fd(d, fi, &fd));
        return shm_import_fd(fd, (size_t)nbytes, out);
    }
    if (kind == TD_SHM_NAMED) {
        const td_value *nv = td_value_len(e) == 3 ? td_value_at(e, 2) : NULL;
        if (!nv || td_value_kind_of(nv) != TD_VAL_STRING || nbytes == 0)
            return bad("a named storage entry is not (2, nbytes, name)");
        return shm_import_named(td_value_get_string(nv, NULL), (size_t)nbytes, out);
    }
    return bad("unknown storage kind");
}

/* Gives back the in-flight references of named entries, and the counter references of device
 * entries, from `from` on (a failed decode). */
static void abandon_from(const td_value *storages, size_t from)
{
    for (size_t i = from; i < td_value_len(storages); i++) {
        const td_value *e = td_value_at(storages, i);
        int64_t kind;
        if (td_value_kind_of(e) == TD_VAL_TUPLE && get_int(e, 0, &kind) && kind == TD_SHM_DEVICE)
            dshare_abandon_entry(e);
        else if (td_value_kind_of(e) == TD_VAL_TUPLE && get_int(e, 0, &kind) && kind == TD_SHM_NAMED &&
            td_value_len(e) == 3 && td_value_kind_of(td_value_at(e, 2)) == TD_VAL_STRING) {
            const char *name = td_value_get_string(td_value_at(e, 2), NULL);
            if (segment_name_valid(name))
                shm_abandon(name);
        }
    }
}

static td_status int_list(const td_value *v, int64_t *out, int *n)
{
    if (td_value_kind_of(v) != TD_VAL_TUPLE || td_value_len(v) > TD_MAX_DIMS)
        return bad("tensor sizes or strides are not a tuple of at most 16 ints");
    *n = (int)td_value_len(v);
    for (int i = 0; i < *n; i++)
        if (!get_int(v, (size_t)i, &out[i]))
            return bad("tensor sizes or strides are not ints");
    return TD_OK;
}

static td_status dec_tensor(dec *d, const td_value *e, td_tensor **out)
{
    int64_t sidx, offset, dtype, flags = 0;
    size_t arity = td_value_kind_of(e) == TD_VAL_TUPLE ? td_value_len(e) : 0;
    if ((arity != 5 && arity != 6) || !get_int(e, 0, &sidx) || !get_int(e, 1, &offset) || !get_int(e, 2, &dtype) ||
        (arity == 6 && !get_int(e, 5, &flags)))
        return bad("a tensor entry is not (storage, offset, dtype, sizes, strides[, autograd flags])");
    if (arity == 6 && (flags <= 0 || flags > (MP_TENSOR_REQUIRES_GRAD | MP_TENSOR_PARAMETER)))
        return bad("a tensor's autograd flags are not 1 (requires_grad), 2 (Parameter) or 3 (both)");
    if (sidx < 0 || (uint64_t)sidx >= d->nstorages)
        return bad("a tensor names a storage that is not in the message");
    if (dtype < 0 || dtype >= TD_DTYPE_COUNT)
        return bad("a tensor has an unknown dtype");
    int64_t sizes[TD_MAX_DIMS], strides[TD_MAX_DIMS];
    int nd, ns;
    TD_TRY(int_list(td_value_at(e, 3), sizes, &nd));
    TD_TRY(int_list(td_value_at(e, 4), strides, &ns));
    if (nd != ns)
        return bad("a tensor has as many strides as sizes");
    for (int i = 0; i < nd; i++)
        if (sizes[i] < 0)
            return bad("a tensor has a negative size");
    bool differentiable = td_dtype_is_floating((td_dtype)dtype) || td_dtype_is_complex((td_dtype)dtype);
    if ((flags & MP_TENSOR_REQUIRES_GRAD) && !differentiable)
        return bad("a tensor that requires grad has a dtype that cannot (only floating point and complex ones can)");
    /* td_tensor_from_storage checks the view against the storage with overflow checks. */
    TD_TRY(td_tensor_from_storage(d->storages[sidx], offset, (td_dtype)dtype, td_shape_of(nd, sizes), strides, out));
    /* All flags at once, before anyone sees the tensor: no transient state (an int64 Parameter
     * briefly requiring grad) for a check to trip on. */
    tensor_init_grad_flags(*out, (flags & MP_TENSOR_REQUIRES_GRAD ? TENSOR_REQUIRES_GRAD : 0u) |
                                     (flags & MP_TENSOR_PARAMETER ? TENSOR_PARAMETER : 0u));
    return TD_OK;
}

static td_status dec_object(dec *d, const td_value *e, td_value **out)
{
    int64_t kind;
    if (td_value_kind_of(e) != TD_VAL_TUPLE || !get_int(e, 0, &kind))
        return bad("an object entry is not (kind, ...)");
    const mp_object_class *cls = NULL;
    for (const mp_object_class *const *c = d->classes; c && *c && !cls; c++)
        if ((int64_t)(*c)->kind == kind)
            cls = *c;
    if (!cls)
        return bad("unknown object kind");
    size_t first_fd = cls->has_param ? 2 : 1;
    int64_t param = 0, fi[MP_OBJECT_MAX_FDS];
    bool ok = td_value_len(e) == first_fd + (size_t)cls->nfds && (!cls->has_param || (get_int(e, 1, &param) && param >= 0));
    for (int i = 0; ok && i < cls->nfds; i++)
        ok = get_int(e, first_fd + (size_t)i, &fi[i]);
    if (!ok)
        return bad(cls->entry_form);
    int fds[MP_OBJECT_MAX_FDS];
    for (int i = 0; i < cls->nfds; i++) {
        td_status st = take_fd(d, fi[i], &fds[i]);
        if (st != TD_OK) {
            close_fds(fds, i); /* taken from the message: no longer its to close */
            return st;
        }
    }
    void *obj;
    TD_TRY(cls->from_wire(param, fds, &obj));
    *out = mp_object_value(cls, obj);
    cls->release(obj);
    return TD_OK;
}

/* The replacement for a placeholder record (a new reference), NULL when v is not one. */
static td_status placeholder(dec *d, const td_value *v, td_value **out)
{
    *out = NULL;
    if (td_value_kind_of(v) != TD_VAL_RECORD)
        return TD_OK;
    uint32_t tag = td_value_record_tag(v);
    if (tag != TD_REC_MP_TENSOR && tag != TD_REC_MP_OBJECT)
        return TD_OK;
    int64_t idx;
    if (td_value_len(v) != 1 || !get_int(v, 0, &idx) || idx < 0)
        return bad("a tensor or object reference is not (index)");
    if (tag == TD_REC_MP_TENSOR) {
        if ((uint64_t)idx >= d->ntensors)
            return bad("a tensor reference is out of range");
        *out = td_value_tensor(d->tensors[idx]);
    } else {
        if ((uint64_t)idx >= d->nobjects)
            return bad("an object reference is out of range");
        *out = td_value_retain(d->objects[idx]);
    }
    return TD_OK;
}

/* Replaces the placeholders inside v (a freshly decoded value only this decoder holds). */
static td_status fix(dec *d, td_value *v)
{
    td_value_kind kind = td_value_kind_of(v);
    if (kind == TD_VAL_LIST || kind == TD_VAL_TUPLE || kind == TD_VAL_RECORD) {
        for (size_t i = 0; i < td_value_len(v); i++) {
            td_value *item = td_value_at(v, i), *rep;
            TD_TRY(placeholder(d, item, &rep));
            if (rep)
                td_value_set(v, i, rep);
            else
                TD_TRY(fix(d, item));
        }
    } else if (kind == TD_VAL_DICT) {
        for (size_t i = 0; i < td_value_len(v); i++) {
            td_value *item = td_value_dict_value_at(v, i), *rep;
            TD_TRY(placeholder(d, item, &rep));
            if (rep)
                TD_TRY(td_value_dict_set(v, td_value_retain(td_value_dict_key_at(v, i)), rep));
            else
                TD_TRY(fix(d, item));
        }
    }
    return TD_OK;
}

static td_status decode_env(dec *d, const td_value *env, td_value **out)
{
    if (td_value_kind_of(env) != TD_VAL_TUPLE || td_value_len(env) != 4)
        return bad("the envelope is not (storages, tensors, objects, value)");
    const td_value *storages = td_value_at(env, 0), *tensors = td_value_at(env, 1), *objects = td_value_at(env, 2);
    if (!is_seq(storages) || !is_seq(tensors) || !is_seq(objects)) {
        abandon_from(storages, 0);
        return bad("the envelope's tables are not lists");
    }
    d->storages = TD_NEW_ARRAY(td_storage *, td_value_len(storages) + 1);
    for (size_t i = 0; i < td_value_len(storages); i++) {
        td_status st = dec_storage(d, td_value_at(storages, i), &d->storages[i]);
        if (st != TD_OK) {
            abandon_from(storages, i + 1);
            return st;
        }
        d->nstorages++;
    }
    d->tensors = TD_NEW_ARRAY(td_tensor *, td_value_len(tensors) + 1);
    for (size_t i = 0; i < td_value_len(tensors); i++) {
        TD_TRY(dec_tensor(d, td_value_at(tensors, i), &d->tensors[i]));
        d->ntensors++;
    }
    d->objects = TD_NEW_ARRAY(td_value *, td_value_len(objects) + 1);
    for (size_t i = 0; i < td_value_len(objects); i++) {
        TD_TRY(dec_object(d, td_value_at(objects, i), &d->objects[i]));
        d->nobjects++;
    }
    td_value *body = td_value_at(env, 3), *rep;
    TD_TRY(placeholder(d, body, &rep));
    if (rep) {
        *out = rep;
        return TD_OK;
    }
    body = td_value_retain(body);
    td_status st = fix(d, body);
    if (st != TD_OK) {
        td_value_release(body);
        return st;
    }
    *out = body;
    return TD_OK;
}

static td_status decode_body(const void *data, size_t len, int *fds, int nfds, const mp_object_class *const *classes,
                             td_value **out)
{
    td_value *env = NULL;
    td_status st = td_value_decode(data, len, &env);
    if (st != TD_OK)
        return error_prefix(st, "invalid mp message");
    dec d = {.classes = classes, .fds = fds, .nfds = nfds, .used = TD_NEW_ARRAY(bool, (size_t)nfds + 1)};
    st = decode_env(&d, env, out);
    for (size_t i = 0; i < d.nstorages; i++)
        td_storage_release(d.storages[i]);
    for (size_t i = 0; i < d.ntensors; i++)
        td_tensor_release(d.tensors[i]);
    for (size_t i = 0; i < d.nobjects; i++)
        td_value_release(d.objects[i]);
    free(d.storages);
    free(d.tensors);
    free(d.objects);
    free(d.used);
    td_value_release(env);
    return st;
}

td_status mp_msg_decode_bytes(const void *data, size_t len, int *fds, int nfds, const mp_object_class *const *classes,
                                 td_value **out)
{
    *out = NULL;
    td_status st;
    const uint8_t *h = data;
    if (len < TD_MP_MSG_HEADER || le_get(h, 4) != TD_MP_MSG_MAGIC) {
        st = bad("no mp message header");
    } else if (le_get(h + 4, 2) != TD_MP_MSG_VERSION) {
        st = error_fmt(TD_ERR_INVALID, "unsupported mp message version %u (this build reads version %d)",
                      (unsigned)le_get(h + 4, 2), TD_MP_MSG_VERSION);
    } else {
        uint32_t flags = (uint32_t)le_get(h + 6, 2);
        uint64_t nf = le_get(h + 8, 4), body_len = le_get(h + 16, 8);
        if ((flags & ~TD_MP_MSG_FLAG_SPILLED) || le_get(h + 12, 4) != 0)
            st = bad("unknown header flags");
        else if (nf != (uint64_t)nfds)
            st = bad("the number of attached file descriptors differs from the header's");
        else if (!(flags & TD_MP_MSG_FLAG_SPILLED))
            st = body_len == len - TD_MP_MSG_HEADER ? decode_body(h + TD_MP_MSG_HEADER, (size_t)body_len, fds, nfds, classes, out)
                                                    : bad("the body length differs from the datagram's");
        else if (nfds < 1 || body_len == 0 || body_len > TD_MP_MSG_MAX_SPILL || len != TD_MP_MSG_HEADER)
            st = bad("a spilled body without its segment, or of a bad size");
        else {
            td_segment seg;
            st = segment_map_fd(fds[nfds - 1], (size_t)body_len, &seg);
            if (st == TD_OK) {
                fds[nfds - 1] = -1; /* the segment took it */
                st = decode_body(seg.base, (size_t)body_len, fds, nfds - 1, classes, out);
                segment_unmap(&seg);
            }
        }
    }
    close_fds(fds, nfds);
    for (int i = 0; i < nfds; i++)
        fds[i] = -1;
    return st;
}

td_status mp_msg_decode(td_mp_rmsg *r, const mp_object_class *const *classes, td_value **out)
{
    td_status st = mp_msg_decode_bytes(r->data, r->len, r->fds, r->nfds, classes, out);
    mp_rmsg_free(r);
    return st;
}
