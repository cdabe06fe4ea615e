/* Shared-memory segments in /dev/shm (segment.h): creation with reserved memory, opening by name
 * or fd, mapping, unlinking, and the "tdist.<pid>.<tag><n>" names. The mp layer's shared storages,
 * queues and events sit on these, and so does the shm process-group backend. */
#include "tensor/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"

static atomic_uint_fast64_t name_counter;

void segment_make_name(char out[TD_SEGMENT_NAME_MAX], const char *tag)
{
    unsigned long long n = (unsigned long long)atomic_fetch_add(&name_counter, 1);
    snprintf(out, TD_SEGMENT_NAME_MAX, TD_SEGMENT_PREFIX "%d.%s%llu", (int)getpid(), tag, n);
}

pid_t segment_name_pid(const char *name)
{
    size_t plen = strlen(TD_SEGMENT_PREFIX);
    if (!name || strncmp(name, TD_SEGMENT_PREFIX, plen) != 0)
        return -1;
    const char *p = name + plen;
    long pid = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 10) {
        pid = pid * 10 + (*p - '0');
        p++;
        digits++;
    }
    if (digits == 0 || *p != '.' || pid <= 0 || pid > 0x7fffffff)
        return -1;
    return (pid_t)pid;
}

bool segment_name_valid(const char *name)
{
    if (!name || segment_name_pid(name) < 0)
        return false;
    size_t len = strnlen(name, TD_SEGMENT_NAME_MAX);
    if (len >= TD_SEGMENT_NAME_MAX)
        return false;
    const char *rest = strchr(name + strlen(TD_SEGMENT_PREFIX), '.') + 1;
    if (!*rest)
        return false;
    for (const char *p = rest; *p; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return false;
    }
    return true;
}

/* "<strerror> (<errno>)", then a hint for the failures users can act on. */
static td_status seg_error(int err, const char *what)
{
    const char *hint = "";
    if (err == ENOSPC || err == ENOMEM)
        hint = ". /dev/shm is full or too small for this segment: free space there or make it larger "
               "(for Docker: --shm-size)";
    else if (err == EMFILE || err == ENFILE)
        hint = ". The process is out of file descriptors (under the file_descriptor sharing strategy each "
               "shared storage keeps one open): raise the limit (ulimit -n) or use the file_system strategy";
    td_status code = (err == ENOSPC || err == ENOMEM) ? TD_ERR_NOMEM : TD_ERR_IO;
    return error_fmt(code, "%s: %s (%d)%s", what, strerror(err), err, hint);
}

static td_status open_error(int err, const char *name)
{
    char what[160];
    snprintf(what, sizeof what, "unable to open shared memory object </%s> in read-write mode", name);
    return seg_error(err, what);
}

static td_status reserve(int fd, size_t size, const char *name)
{
    char what[160];
    if (ftruncate(fd, (off_t)size) != 0) {
        int err = errno;
        snprintf(what, sizeof what, "unable to resize file <%s> to the right size (%zu bytes)", name, size);
        return seg_error(err, what);
    }
    int rc;
    do
        rc = posix_fallocate(fd, 0, (off_t)size);
    while (rc == EINTR);
    /* Some filesystems cannot preallocate; the segment still works, only without the early check. */
    if (rc != 0 && rc != EINVAL && rc != EOPNOTSUPP) {
        snprintf(what, sizeof what, "unable to allocate shared memory(shm) for file <%s> (%zu bytes)", name, size);
        return seg_error(rc, what);
    }
    return TD_OK;
}

static td_status map(int fd, size_t size, const char *name, void **out)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        char what[160];
        snprintf(what, sizeof what, "unable to mmap %zu bytes from file <%s>", size, name);
        return seg_error(err, what);
    }
    *out = p;
    return TD_OK;
}

td_status segment_create(const char *tag, size_t size, bool unlinked, bool keep_fd, td_segment *out)
{
    char name[TD_SEGMENT_NAME_MAX];
    segment_make_name(name, tag);
    return segment_create_as(name, size, unlinked, keep_fd, out);
}

td_status segment_create_as(const char *name, size_t size, bool unlinked, bool keep_fd, td_segment *out)
{
    if (size == 0)
        return error_fmt(TD_ERR_INVALID, "a shared-memory segment cannot be empty (mmap of 0 bytes)");
    td_segment seg = TD_SEGMENT_INIT;
    snprintf(seg.name, sizeof seg.name, "%s", name);
    int fd = shm_open(seg.name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return open_error(errno, seg.name);
    if (unlinked)
        shm_unlink(seg.name);
    td_status st = reserve(fd, size, seg.name);
    if (st == TD_OK)
        st = map(fd, size, seg.name, &seg.base);
    if (st != TD_OK) {
        close(fd);
        if (!unlinked)
            shm_unlink(seg.name);
        return st;
    }
    seg.size = size;
    if (unlinked) {
        seg.name[0] = '\0';
        seg.fd = fd;
    } else if (keep_fd) {
        seg.fd = fd;
    } else {
        close(fd);
    }
    *out = seg;
    return TD_OK;
}

td_status segment_open(const char *name, size_t min_size, td_segment *out)
{
    if (!segment_name_valid(name))
        return error_fmt(TD_ERR_INVALID, "'%s' is not a tdist shared-memory segment name", name ? name : "(null)");
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == ENOENT)
            return error_fmt(TD_ERR_NOT_FOUND,
                            "unable to open shared memory object </%s> in read-write mode: %s (%d). The segment was "
                            "removed: every process holding it let go (or crashed) before this one opened it",
                            name, strerror(ENOENT), ENOENT);
        return open_error(errno, name);
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < min_size || st.st_size == 0) {
        close(fd);
        return error_fmt(TD_ERR_INVALID, "shared memory object </%s> holds %lld bytes, expected at least %zu", name,
                        (long long)st.st_size, min_size);
    }
    td_segment seg = TD_SEGMENT_INIT;
    snprintf(seg.name, sizeof seg.name, "%s", name);
    td_status s = map(fd, (size_t)st.st_size, name, &seg.base);
    close(fd);
    if (s != TD_OK)
        return s;
    seg.size = (size_t)st.st_size;
    *out = seg;
    return TD_OK;
}

td_status segment_map_fd(int fd, size_t size, td_segment *out)
{
    if (size == 0)
        return error_fmt(TD_ERR_INVALID, "a shared-memory segment cannot be empty (mmap of 0 bytes)");
    struct stat st;
    if (fstat(fd, &st) != 0)
        return error_errno(TD_ERR_IO, "fstat of a received shared-memory fd");
    if ((size_t)st.st_size < size)
        return error_fmt(TD_ERR_INVALID, "received shared-memory fd holds %lld bytes, the message says %zu",
                        (long long)st.st_size, size);
    td_segment seg = TD_SEGMENT_INIT;
    char what[32];
    snprintf(what, sizeof what, "fd %d", fd);
    TD_TRY(map(fd, size, what, &seg.base));
    seg.size = size;
    seg.fd = fd;
    *out = seg;
    return TD_OK;
}

void segment_unmap(td_segment *seg)
{
    if (seg->base)
        munmap(seg->base, seg->size);
    if (seg->fd >= 0)
        close(seg->fd);
    seg->base = NULL;
    seg->size = 0;
    seg->fd = -1;
}

td_status segment_unlink(const char *name)
{
    if (shm_unlink(name) == 0)
        return TD_OK;
    if (errno == ENOENT)
        return error_fmt(TD_ERR_NOT_FOUND, "could not unlink the shared memory file %s : %s (%d)", name,
                        strerror(errno), errno);
    return error_errno(TD_ERR_IO, "could not unlink the shared memory file %s", name);
}
