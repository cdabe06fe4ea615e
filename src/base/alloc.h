/* Internal allocation helpers.
 *
 * Two kinds of allocation, by who decides the size:
 *  - small bookkeeping (objects, nodes, names): td_malloc & co. abort the process with a message on
 *    failure, as handling NOMEM at every small allocation would bury the code in dead paths;
 *  - sizes that come from users or peers (tensors, messages, buffers): td_try_malloc returns
 *    TD_ERR_NOMEM with a message naming the size, so a large request fails cleanly. */
#ifndef TDIST_BASE_ALLOC_H
#define TDIST_BASE_ALLOC_H

#include <stddef.h>

#include <tdist/status.h>

void *td_malloc(size_t size);
void *td_calloc(size_t count, size_t size);
void *td_realloc(void *ptr, size_t size);
char *td_strdup(const char *s);
char *td_strndup(const char *s, size_t n);
/* printf into a new string. */
char *td_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Fallible: *out is the new block; `what` names it in the error ("tensor storage of 1.5 GiB"). */
td_status td_try_malloc(size_t size, const char *what, void **out);
/* Aligned to `align` (a power of two, >= sizeof(void *)); free with free(). */
td_status td_try_aligned_alloc(size_t align, size_t size, const char *what, void **out);

#define TD_NEW(type) ((type *)td_calloc(1, sizeof(type)))
#define TD_NEW_ARRAY(type, n) ((type *)td_calloc((n), sizeof(type)))

#endif
