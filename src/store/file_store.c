/* FileStore (tdist/store.h): c10d's store over a shared file, for processes on one host or a
 * shared file system.
 *
 * The file is an append-only log of records [u32 key_len][key][u32 value_len][value] in host byte
 * order. User keys are written as "/" + key; a delete is a record for "-/" + key with an empty
 * value; the internal counters "refcount/" and "cleanup/" have no prefix. Writers append under an
 * exclusive flock(2), readers replay the log from where they stopped into a cache under a shared
 * one. Each call opens the file anew (a handle may outlive a remove and re-create of the path), and
 * blocking calls poll every 10 ms. The handle mutex serializes this handle's calls, as c10d's
 * activeFileOpLock_ does; it is never held across the 10 ms sleeps. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/map.h"
#include "base/thread.h"
#include "store/store_impl.h"

#define POLL_NS (10 * 1000000)

static const char REG_PREFIX[] = "/";
static const char DEL_PREFIX[] = "-";
static const char CLEANUP_KEY[] = "cleanup/";
static const char REFCOUNT_KEY[] = "refcount/";

typedef struct fs_value {
    size_t len;
    char data[];
} fs_value;

typedef struct file_store {
    td_store base;
    pthread_mutex_t mu;
    char *path;
    int num_workers;
    off_t pos;    /* how far the log has been replayed into cache */
    td_map cache; /* stored key (prefixed) -> fs_value* */
} file_store;

static file_store *F(td_store *s) { return (file_store *)s; }

/* Timeouts count whole elapsed seconds, as c10d's FileStore does; comparing with >= keeps them from
 * firing early, so they fire within [t, t + 1 s]. */
static bool timed_out(int64_t start_ns, int64_t timeout_ms)
{
    if (timeout_ms <= 0)
        return false;
    int64_t whole_s = (clock_now_ns() - start_ns) / 1000000000;
    return whole_s * 1000 >= timeout_ms;
}

/* Opens the file; a missing file is waited for (a writer may be about to create it). */
static td_status open_file(file_store *f, int flags, int *fd)
{
    int64_t start = clock_now_ns();
    int64_t timeout = store_timeout_of(&f->base);
    for (;;) {
        int rc = open(f->path, flags | O_CLOEXEC, 0644);
        if (rc >= 0) {
            *fd = rc;
            return TD_OK;
        }
        if (errno == EINTR)
            continue;
        /* With O_CREAT, ENOENT means the directory is missing: no writer will fix that. */
        if (errno != ENOENT || (flags & O_CREAT) || timed_out(start, timeout))
            return error_errno(TD_ERR_IO, "FileStore: open(%s)", f->path);
        clock_sleep_ns(POLL_NS);
    }
}

static td_status lock_file(file_store *f, int fd, int op)
{
    while (flock(fd, op) != 0) {
        if (errno != EINTR)
            return error_errno(TD_ERR_IO, "FileStore: flock(%s)", f->path);
    }
    return TD_OK;
}

static td_status read_at(file_store *f, int fd, void *buf, size_t len, off_t off)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = pread(fd, p, len, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return error_errno(TD_ERR_IO, "FileStore: read(%s)", f->path);
        if (n == 0)
            return error_fmt(TD_ERR_IO, "FileStore: %s is shorter than expected (truncated by someone?)", f->path);
        p += n;
        len -= (size_t)n;
        off += n;
    }
    return TD_OK;
}

static td_status write_all(file_store *f, int fd, const void *buf, size_t len)
{
    const char *p = buf;
    if (lseek(fd, 0, SEEK_END) < 0)
        return error_errno(TD_ERR_IO, "FileStore: lseek(%s)", f->path);
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return error_errno(TD_ERR_IO, "FileStore: write(%s)", f->path);
        p += n;
        len -= (size_t)n;
    }
    return TD_OK;
}

static void cache_put(file_store *f, const char *key, size_t key_len, const void *data, size_t len)
{
    fs_value *v = alloc_or_die(sizeof *v + len + 1);
    v->len = len;
    if (len)
        memcpy(v->data, data, len);
    v->data[len] = '\0';
    free(map_put(&f->cache, key, key_len, v));
}

/* One length-prefixed field of a log record (a 4-byte length, then the bytes) at *off; false when
 * the log ends inside it. */
static bool take_field(const char *buf, size_t len, size_t *off, const char **field, uint32_t *flen)
{
    if (len - *off < 4)
        return false;
    memcpy(flen, buf + *off, 4);
    *off += 4;
    if (len - *off < *flen)
        return false;
    *field = buf + *off;
    *off += *flen;
    return true;
}

/* Replays the records appended since pos into the cache. The file's lengths are checked against its
 * size: a record that runs past the end means a corrupt (or foreign) file. */
static td_status refresh(file_store *f, int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return error_errno(TD_ERR_IO, "FileStore: fstat(%s)", f->path);
    if (st.st_size == f->pos)
        return TD_OK;
    if (st.st_size < f->pos) {
        /* The file was removed and re-created by a later job: start over. */
        map_free(&f->cache, free);
        f->pos = 0;
    }
    size_t len = (size_t)(st.st_size - f->pos);
    char *buf = NULL;
    TD_TRY(alloc_try(len ? len : 1, "FileStore log", (void **)&buf));
    td_status s = read_at(f, fd, buf, len, f->pos);
    size_t off = 0;
    while (s == TD_OK && off < len) {
        const char *key, *val;
        uint32_t klen, vlen;
        if (!take_field(buf, len, &off, &key, &klen) || !take_field(buf, len, &off, &val, &vlen))
            goto corrupt;
        if (klen >= 1 && key[0] == DEL_PREFIX[0])
            free(map_remove(&f->cache, key + 1, klen - 1));
        else
            cache_put(f, key, klen, val, vlen);
    }
    free(buf);
    if (s == TD_OK)
        f->pos = st.st_size;
    return s;
corrupt:
    free(buf);
    return error_fmt(TD_ERR_IO, "FileStore: %s is corrupt at offset %lld (not a FileStore file, or truncated)",
                    f->path, (long long)(f->pos + (off_t)off));
}

static void put_record(td_buf *b, const char *prefix, const char *key, size_t key_len, const void *val, size_t len)
{
    uint32_t klen = (uint32_t)(strlen(prefix) + key_len), vlen = (uint32_t)len;
    buf_append(b, &klen, 4);
    buf_append_str(b, prefix);
    buf_append(b, key, key_len);
    buf_append(b, &vlen, 4);
    buf_append(b, val, len);
}

static td_status check_sizes(const char *key, size_t len)
{
    if (strlen(key) > UINT32_MAX - 2 || len > UINT32_MAX)
        return error_fmt(TD_ERR_INVALID, "FileStore: key '%.64s' or its value (%zu bytes) exceeds 4 GiB", key, len);
    return TD_OK;
}

static char *reg_key(const char *key, size_t *len)
{
    *len = strlen(key) + 1;
    char *k = alloc_or_die(*len + 1);
    k[0] = REG_PREFIX[0];
    memcpy(k + 1, key, *len);
    return k;
}

static fs_value *cached(file_store *f, const char *key)
{
    size_t n;
    char *k = reg_key(key, &n);
    fs_value *v = map_get(&f->cache, k, n);
    free(k);
    return v;
}

/* An operation under an exclusive lock: open (creating unless no_create), lock, replay. The caller
 * runs its step with f->mu held, then calls end_exclusive. */
static td_status begin_locked(file_store *f, int flags, int lock_op, int *fd)
{
    pthread_mutex_lock(&f->mu);
    td_status s = open_file(f, flags, fd);
    if (s == TD_OK) {
        s = lock_file(f, *fd, lock_op);
        if (s == TD_OK)
            s = refresh(f, *fd);
        if (s != TD_OK)
            close(*fd);
    }
    if (s != TD_OK)
        pthread_mutex_unlock(&f->mu);
    return s;
}

static void end_locked(file_store *f, int fd)
{
    close(fd); /* releases the flock */
    pthread_mutex_unlock(&f->mu);
}

/* add on a raw (already prefixed or internal) key, with the file already locked (begin_locked). */
static td_status add_locked(file_store *f, int fd, const char *raw, size_t raw_len, const char *shown,
                            int64_t delta, int64_t *result)
{
    fs_value *v = map_get(&f->cache, raw, raw_len);
    int64_t cur = 0, next = 0;
    td_status s = v ? store_parse_counter(shown, v->data, v->len, &cur) : TD_OK;
    if (s == TD_OK)
        s = store_counter_add(shown, cur, delta, &next);
    if (s == TD_OK) {
        char text[24];
        size_t n = store_format_counter(next, text);
        td_buf b = TD_BUF_INIT;
        put_record(&b, "", raw, raw_len, text, n);
        s = write_all(f, fd, b.data, b.len);
        buf_free(&b);
        *result = next;
    }
    return s;
}

static td_status add_raw(file_store *f, const char *raw, size_t raw_len, const char *shown, int64_t delta,
                         int64_t *result)
{
    int fd;
    TD_TRY(begin_locked(f, O_RDWR | O_CREAT, LOCK_EX, &fd));
    td_status s = add_locked(f, fd, raw, raw_len, shown, delta, result);
    end_locked(f, fd);
    return s;
}

static td_status fs_set(td_store *s, const char *key, const void *value, size_t len)
{
    file_store *f = F(s);
    TD_TRY(check_sizes(key, len));
    td_buf b = TD_BUF_INIT;
    put_record(&b, REG_PREFIX, key, strlen(key), value, len);
    int fd;
    td_status st = begin_locked(f, O_RDWR | O_CREAT, LOCK_EX, &fd);
    if (st == TD_OK) {
        st = write_all(f, fd, b.data, b.len);
        end_locked(f, fd);
    }
    buf_free(&b);
    return st;
}

/* Polls until every key is in the log. On success returns with f->mu held and *fd open and locked
 * shared, so the caller can copy values out before anyone else changes the cache. */
static td_status wait_keys(file_store *f, const char *const *keys, size_t n, int64_t timeout_ms, bool is_get,
                           int *fd)
{
    int64_t start = clock_now_ns();
    for (;;) {
        TD_TRY(begin_locked(f, O_RDONLY, LOCK_SH, fd));
        size_t missing = n;
        for (size_t i = 0; i < n; i++) {
            if (!cached(f, keys[i])) {
                missing = i;
                break;
            }
        }
        if (missing == n)
            return TD_OK;
        end_locked(f, *fd);
        if (timed_out(start, timeout_ms)) {
            if (is_get)
                return error_fmt(TD_ERR_TIMEOUT, "Timeout waiting for key: %s after %lld ms", keys[missing],
                                (long long)timeout_ms);
            return error_fmt(TD_ERR_TIMEOUT, "Wait timeout");
        }
        clock_sleep_ns(POLL_NS);
    }
}

static td_status fs_get(td_store *s, const char *key, void **value, size_t *len)
{
    file_store *f = F(s);
    int fd;
    TD_TRY(wait_keys(f, &key, 1, store_timeout_of(s), true, &fd));
    fs_value *v = cached(f, key);
    td_status st = store_copy_out(v->data, v->len, value, len);
    end_locked(f, fd);
    return st;
}

static td_status fs_multi_get(td_store *s, const char *const *keys, size_t n, void **values, size_t *lens)
{
    file_store *f = F(s);
    int fd;
    TD_TRY(wait_keys(f, keys, n, store_timeout_of(s), true, &fd));
    td_status st = TD_OK;
    for (size_t i = 0; st == TD_OK && i < n; i++) {
        fs_value *v = cached(f, keys[i]);
        st = store_copy_out(v->data, v->len, &values[i], &lens[i]);
    }
    end_locked(f, fd);
    return st;
}

static td_status fs_wait(td_store *s, const char *const *keys, size_t n, int64_t timeout_ms)
{
    file_store *f = F(s);
    int fd;
    TD_TRY(wait_keys(f, keys, n, timeout_ms, false, &fd));
    end_locked(f, fd);
    return TD_OK;
}

static td_status fs_add(td_store *s, const char *key, int64_t delta, int64_t *result)
{
    size_t n;
    char *k = reg_key(key, &n);
    td_status st = add_raw(F(s), k, n, key, delta, result);
    free(k);
    return st;
}

static td_status fs_compare_set(td_store *s, const char *key, const void *expected, size_t expected_len,
                                const void *desired, size_t desired_len, void **value, size_t *len)
{
    file_store *f = F(s);
    TD_TRY(check_sizes(key, desired_len));
    int fd;
    TD_TRY(begin_locked(f, O_RDWR | O_CREAT, LOCK_EX, &fd));
    fs_value *v = cached(f, key);
    bool write;
    const void *res;
    size_t res_len;
    store_compare_set_decide(v != NULL, v ? v->data : NULL, v ? v->len : 0, expected, expected_len, desired,
                                desired_len, &write, &res, &res_len);
    td_status st = store_copy_out(res, res_len, value, len);
    if (st == TD_OK && write) {
        td_buf b = TD_BUF_INIT;
        put_record(&b, REG_PREFIX, key, strlen(key), desired, desired_len);
        st = write_all(f, fd, b.data, b.len);
        buf_free(&b);
        if (st != TD_OK) {
            free(*value);
            *value = NULL;
        }
    }
    end_locked(f, fd);
    return st;
}

static td_status fs_delete_key(td_store *s, const char *key, bool *deleted)
{
    file_store *f = F(s);
    int fd;
    TD_TRY(begin_locked(f, O_RDWR, LOCK_EX, &fd));
    td_status st = TD_OK;
    *deleted = cached(f, key) != NULL;
    if (*deleted) {
        td_buf b = TD_BUF_INIT;
        put_record(&b, "-/", key, strlen(key), "", 0);
        st = write_all(f, fd, b.data, b.len);
        buf_free(&b);
    }
    end_locked(f, fd);
    return st;
}

static td_status fs_check(td_store *s, const char *const *keys, size_t n, bool *ready)
{
    file_store *f = F(s);
    int fd;
    TD_TRY(begin_locked(f, O_RDONLY, LOCK_SH, &fd));
    *ready = true;
    for (size_t i = 0; i < n && *ready; i++)
        *ready = cached(f, keys[i]) != NULL;
    end_locked(f, fd);
    return TD_OK;
}

static td_status fs_num_keys(td_store *s, int64_t *count)
{
    file_store *f = F(s);
    int fd;
    TD_TRY(begin_locked(f, O_RDONLY, LOCK_SH, &fd));
    *count = (int64_t)f->cache.len;
    end_locked(f, fd);
    return TD_OK;
}

static td_status fs_append(td_store *s, const char *key, const void *value, size_t len)
{
    file_store *f = F(s);
    int fd;
    TD_TRY(begin_locked(f, O_RDWR | O_CREAT, LOCK_EX, &fd));
    fs_value *v = cached(f, key);
    size_t old = v ? v->len : 0;
    td_status st = check_sizes(key, old + len < old ? SIZE_MAX : old + len);
    if (st == TD_OK) {
        td_buf b = TD_BUF_INIT;
        uint32_t klen = (uint32_t)(strlen(key) + 1), vlen = (uint32_t)(old + len);
        buf_append(&b, &klen, 4);
        buf_append_str(&b, REG_PREFIX);
        buf_append_str(&b, key);
        buf_append(&b, &vlen, 4);
        if (old)
            buf_append(&b, v->data, old);
        buf_append(&b, value, len);
        st = write_all(f, fd, b.data, b.len);
        buf_free(&b);
    }
    end_locked(f, fd);
    return st;
}

static td_status fs_multi_set(td_store *s, const char *const *keys, const void *const *values, const size_t *lens,
                              size_t n)
{
    file_store *f = F(s);
    td_buf b = TD_BUF_INIT;
    for (size_t i = 0; i < n; i++) {
        td_status st = check_sizes(keys[i], lens[i]);
        if (st != TD_OK) {
            buf_free(&b);
            return st;
        }
        put_record(&b, REG_PREFIX, keys[i], strlen(keys[i]), values[i], lens[i]);
    }
    int fd;
    td_status st = begin_locked(f, O_RDWR | O_CREAT, LOCK_EX, &fd);
    if (st == TD_OK) {
        st = write_all(f, fd, b.data, b.len);
        end_locked(f, fd);
    }
    buf_free(&b);
    return st;
}

static void fs_destroy(td_store *s)
{
    file_store *f = F(s);
    /* As c10d: count this handle out; the last of num_workers handles removes the file. A file that
     * is already gone (someone cleaned the directory) is left alone. */
    if (access(f->path, F_OK) == 0) {
        /* Both counts move under one lock: with two separate adds, handles closing at the same
         * moment could each see only one of the limits reached, and nobody would remove the file. */
        int64_t finished = 0, refs = 1;
        int fd;
        td_status st = begin_locked(f, O_RDWR | O_CREAT, LOCK_EX, &fd);
        if (st == TD_OK) {
            st = add_locked(f, fd, CLEANUP_KEY, strlen(CLEANUP_KEY), CLEANUP_KEY, 1, &finished);
            if (st == TD_OK)
                st = add_locked(f, fd, REFCOUNT_KEY, strlen(REFCOUNT_KEY), REFCOUNT_KEY, -1, &refs);
            if (st == TD_OK && refs == 0 && f->num_workers >= 0 && finished >= f->num_workers)
                unlink(f->path);
            end_locked(f, fd);
        }
        if (st != TD_OK)
            TD_LOG_WARN("FileStore: could not count this handle out of %s: %s", f->path, td_last_error());
    }
    map_free(&f->cache, free);
    pthread_mutex_destroy(&f->mu);
    free(f->path);
    free(f);
}

static const td_store_ops file_store_ops = {
    .kind = "FileStore",
    .set = fs_set,
    .get = fs_get,
    .add = fs_add,
    .compare_set = fs_compare_set,
    .delete_key = fs_delete_key,
    .check = fs_check,
    .num_keys = fs_num_keys,
    .wait = fs_wait,
    .append = fs_append,
    .multi_get = fs_multi_get,
    .multi_set = fs_multi_set,
    .destroy = fs_destroy,
};

td_status td_file_store_create(const char *path, int num_workers, td_store **store)
{
    if (!path || !*path || !store)
        return error_fmt(TD_ERR_INVALID, "td_file_store_create: path and store must be given");
    file_store *f = TD_NEW(file_store);
    store_init(&f->base, &file_store_ops, TD_STORE_DEFAULT_TIMEOUT_MS);
    thread_mutex_init(&f->mu);
    f->path = alloc_strdup(path);
    f->num_workers = num_workers;
    int64_t refs;
    td_status s = add_raw(f, REFCOUNT_KEY, strlen(REFCOUNT_KEY), REFCOUNT_KEY, 1, &refs);
    if (s != TD_OK) {
        map_free(&f->cache, free);
        pthread_mutex_destroy(&f->mu);
        free(f->path);
        free(f);
        return s;
    }
    *store = &f->base;
    return TD_OK;
}
