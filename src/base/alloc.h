/* Internal allocation helpers.
 *
 * Two kinds of allocation, by who decides the size:
 *  - small bookkeeping (objects, nodes, names): alloc_or_die & co. abort the process with a message on
 *    failure, as handling NOMEM at every small allocation would bury the code in dead paths;
 *  - sizes that come from users or peers (tensors, messages, buffers): alloc_try returns
 *    TD_ERR_NOMEM with a message naming the size, so a large request fails cleanly. */
#ifndef TDIST_BASE_ALLOC_H
#define TDIST_BASE_ALLOC_H

#include <stddef.h>

#include <tdist/status.h>

void *alloc_or_die(size_t size);
void *alloc_zeroed(size_t count, size_t size);
void *alloc_resize(void *ptr, size_t size);
char *alloc_strdup(const char *s);
char *alloc_strndup(const char *s, size_t n);
/* printf into a new string. */
char *alloc_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Fallible: *out is the new block; `what` names it in the error ("tensor storage of 1.5 GiB"). */
td_status alloc_try(size_t size, const char *what, void **out);
/* Aligned to `align` (a power of two, >= sizeof(void *)); free with free(). */
td_status alloc_try_aligned(size_t align, size_t size, const char *what, void **out);

#define TD_NEW(type) ((type *)alloc_zeroed(1, sizeof(type)))
#define TD_NEW_ARRAY(type, n) ((type *)alloc_zeroed((n), sizeof(type)))

#endif
