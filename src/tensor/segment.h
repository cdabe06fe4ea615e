/* Internal: shared-memory segments, the primitive under shared storages (the tensor layer owns
 * them so that mp, the shared-memory process-group backend and the device layer can all use them).
 *
 * A segment is a tmpfs object in /dev/shm mapped MAP_SHARED. Every name is
 * "tdist.<creator pid>.<tag><n>", the convention the test harness and the leak checker rely on
 * (a crashed creator's leftovers are recognisable by pid). Creation reserves the memory with
 * posix_fallocate, so a full /dev/shm fails at once with ENOSPC instead of a SIGBUS on first
 * touch. Two forms:
 *  - unlinked: the name is removed right after creation and the fd is kept; the segment lives
 *    while an fd or a mapping of it does, and is passed between processes by fd (SCM_RIGHTS or
 *    inheritance). Nothing is ever left in /dev/shm, even after a crash.
 *  - named: the name stays until someone calls segment_unlink; other processes open it by name.
 * All fds are O_CLOEXEC. Messages use PyTorch's words ("unable to mmap 100 bytes from file ..."). */
#ifndef TDIST_TENSOR_SEGMENT_H
#define TDIST_TENSOR_SEGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <tdist/status.h>

#define TD_SEGMENT_NAME_MAX 64
#define TD_SEGMENT_PREFIX "tdist."

typedef struct td_segment {
    void *base;  /* the mapping */
    size_t size; /* bytes mapped */
    int fd;      /* -1 when not kept */
    char name[TD_SEGMENT_NAME_MAX]; /* "" for an unlinked segment */
} td_segment;

#define TD_SEGMENT_INIT {NULL, 0, -1, ""}

/* A fresh name "tdist.<pid>.<tag><n>" (tag: a few letters saying what it is for). */
void segment_make_name(char out[TD_SEGMENT_NAME_MAX], const char *tag);
/* Whether name has the form above (letters, digits, '_', '-', '.' after the pid; no '/'). */
bool segment_name_valid(const char *name);
/* The creator pid in a valid name, else -1. */
pid_t segment_name_pid(const char *name);

/* Creates a segment of size (> 0) bytes. unlinked: see above (fd kept). Named: the name stays and
 * the fd is kept only when keep_fd. On failure nothing is left behind. */
td_status segment_create(const char *tag, size_t size, bool unlinked, bool keep_fd, td_segment *out);
/* The same with a name made by segment_make_name (to register it somewhere before creating). */
td_status segment_create_as(const char *name, size_t size, bool unlinked, bool keep_fd, td_segment *out);
/* Maps the whole of an existing named segment, which must hold at least min_size bytes. */
td_status segment_open(const char *name, size_t min_size, td_segment *out);
/* Maps size bytes of the segment behind fd (received from another process), which must be at
 * least that large. Takes the fd on success (closed by segment_unmap); not on failure. */
td_status segment_map_fd(int fd, size_t size, td_segment *out);
/* Unmaps and closes the fd; leaves the name. */
void segment_unmap(td_segment *seg);
/* Removes a named segment's name: TD_OK, or TD_ERR_NOT_FOUND when already gone. */
td_status segment_unlink(const char *name);

#endif
