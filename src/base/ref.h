/* Internal reference counting for shared objects (storages, tensors, values, futures, stores...).
 *
 * Embed a td_ref in the object, ref_init() it to 1 at creation, ref_inc() on retain, and free
 * the object when ref_dec() returns true. Acquire-release ordering makes every write of every
 * previous owner visible to the thread that frees. */
#ifndef TDIST_BASE_REF_H
#define TDIST_BASE_REF_H

#include <stdatomic.h>
#include <stdbool.h>

typedef struct td_ref {
    atomic_long count;
} td_ref;

static inline void ref_init(td_ref *r) { atomic_init(&r->count, 1); }
static inline void ref_inc(td_ref *r) { atomic_fetch_add_explicit(&r->count, 1, memory_order_relaxed); }
static inline bool ref_dec(td_ref *r)
{
    /* acq_rel on the decrement itself rather than a release decrement and an acquire fence: the
     * same instruction on x86, and ThreadSanitizer, which does not model fences, sees the order. */
    return atomic_fetch_sub_explicit(&r->count, 1, memory_order_acq_rel) == 1;
}
/* Increments unless the count already reached zero (for weak caches); true when it did. */
static inline bool ref_inc_not_zero(td_ref *r)
{
    long c = atomic_load_explicit(&r->count, memory_order_relaxed);
    while (c > 0) {
        if (atomic_compare_exchange_weak_explicit(&r->count, &c, c + 1, memory_order_acquire,
                                                  memory_order_relaxed))
            return true;
    }
    return false;
}
static inline long ref_count(td_ref *r) { return atomic_load_explicit(&r->count, memory_order_relaxed); }

#endif
