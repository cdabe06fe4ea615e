/* Internal allocation of large buffers on transparent huge pages.
 *
 * Buffers of 2 MiB and more are aligned to 2 MiB and marked MADV_HUGEPAGE, so that the kernel backs
 * them with huge pages where it allows it (THP "madvise" mode, the common default). Copies between
 * processes (process_vm_readv pins the pages it reads) and the reduce loops then walk one page
 * table entry per 2 MiB instead of 512: at 16 MiB this halves the kernel time of an all_reduce
 * between ranks of one host. Smaller buffers are 64-byte aligned. Free with huge_free (which keeps
 * freed huge blocks for reuse, up to TDIST_STORAGE_CACHE bytes per process) or free(). */
#ifndef TDIST_BASE_HUGEALLOC_H
#define TDIST_BASE_HUGEALLOC_H

#include <stddef.h>

#include <tdist/status.h>

#define TD_HUGE_PAGE ((size_t)2 << 20)

/* As alloc_try_aligned (base/alloc.h); `what` names the buffer in the error. */
td_status huge_try_alloc(size_t size, const char *what, void **out);
/* Frees a block of huge_try_alloc(size): a huge one is kept for the next request of its size. */
void huge_free(void *p, size_t size);
/* Gives every kept block back to the system; returns their bytes. */
size_t huge_cache_release(void);
/* Bytes of the kept blocks. */
size_t huge_cache_bytes(void);

#endif
