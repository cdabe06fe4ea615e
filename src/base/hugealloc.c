/* Large buffers on transparent huge pages (hugealloc.h): used for the collective layer's scratch
 * and for tensor storages, and meant for anything large that other processes read or the reduce
 * kernels stream through.
 *
 * Freed huge blocks are kept for reuse, up to a budget per process (TDIST_STORAGE_CACHE, 128 MiB by
 * default): a fresh block costs a page fault and the kernel's clearing of every page on its first
 * touch, which for a 16 MiB tensor received over RPC cost twice the copy that fills it. A block is
 * reused only for a request of its own rounded size; past the budget the oldest blocks go back to
 * the system. Under AddressSanitizer a kept block is poisoned, so a use after free still reports. */
#include "base/hugealloc.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define HUGE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HUGE_ASAN 1
#endif
#endif
#ifdef HUGE_ASAN
#include <sanitizer/asan_interface.h>
#define HUGE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define HUGE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define HUGE_POISON(p, n) ((void)(p), (void)(n))
#define HUGE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define HUGE_CACHE_SLOTS 8
#define HUGE_CACHE_DEFAULT ((uint64_t)128 << 20)

typedef struct huge_block {
    void *p;
    size_t size; /* rounded to TD_HUGE_PAGE */
} huge_block;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static huge_block cache[HUGE_CACHE_SLOTS]; /* oldest first, under cache_mu */
static size_t cache_len, cache_bytes;
static uint64_t cache_budget;
static td_status cache_setting = TD_OK; /* a bad TDIST_STORAGE_CACHE fails every huge allocation */
static char cache_setting_error[256];
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

/* A fork copies the cache with the memory; the lock must not be copied held. */
static void cache_lock(void) { pthread_mutex_lock(&cache_mu); }
static void cache_unlock(void) { pthread_mutex_unlock(&cache_mu); }

static void cache_init(void)
{
    const char *v = env_get_str("TDIST_STORAGE_CACHE", NULL);
    cache_budget = HUGE_CACHE_DEFAULT;
    td_status st = v ? env_parse_size("TDIST_STORAGE_CACHE", v, &cache_budget) : TD_OK;
    if (st != TD_OK) {
        cache_setting = st;
        snprintf(cache_setting_error, sizeof cache_setting_error, "%s", td_last_error());
        cache_budget = 0;
    }
    (void)pthread_atfork(cache_lock, cache_unlock, cache_unlock);
}

static size_t round_huge(size_t size) { return (size + TD_HUGE_PAGE - 1) & ~(TD_HUGE_PAGE - 1); }

/* cache_mu held: takes the i-th kept block out, keeping the others in order. */
static huge_block cache_remove(size_t i)
{
    huge_block b = cache[i];
    cache_bytes -= b.size;
    for (size_t j = i + 1; j < cache_len; j++)
        cache[j - 1] = cache[j];
    cache_len--;
    return b;
}

/* A kept block of exactly `rounded` bytes, or NULL. */
static void *cache_take(size_t rounded)
{
    void *p = NULL;
    pthread_mutex_lock(&cache_mu);
    for (size_t i = cache_len; i-- > 0;) { /* the newest first: its pages are the likeliest cached */
        if (cache[i].size == rounded) {
            p = cache_remove(i).p;
            break;
        }
    }
    pthread_mutex_unlock(&cache_mu);
    if (p)
        HUGE_UNPOISON(p, rounded);
    return p;
}

td_status huge_try_alloc(size_t size, const char *what, void **out)
{
    if (size < TD_HUGE_PAGE)
        return alloc_try_aligned(64, size ? size : 64, what, out);
    pthread_once(&cache_once, cache_init);
    if (cache_setting != TD_OK)
        return error_fmt(cache_setting, "%s", cache_setting_error);
    size_t rounded = round_huge(size);
    if ((*out = cache_take(rounded)) != NULL)
        return TD_OK;
    TD_TRY(alloc_try_aligned(TD_HUGE_PAGE, rounded, what, out));
    /* Advice only: where huge pages are off or unavailable, the buffer works the same. */
    madvise(*out, rounded, MADV_HUGEPAGE);
    return TD_OK;
}

void huge_free(void *p, size_t size)
{
    if (!p)
        return;
    if (size < TD_HUGE_PAGE) {
        free(p);
        return;
    }
    pthread_once(&cache_once, cache_init);
    size_t rounded = round_huge(size);
    if (rounded > cache_budget) {
        free(p);
        return;
    }
    huge_block evicted[HUGE_CACHE_SLOTS];
    size_t n_evicted = 0;
    HUGE_POISON(p, rounded);
    pthread_mutex_lock(&cache_mu);
    while (cache_len > 0 && (cache_len == HUGE_CACHE_SLOTS || cache_bytes + rounded > cache_budget))
        evicted[n_evicted++] = cache_remove(0); /* the oldest */
    cache[cache_len++] = (huge_block){p, rounded};
    cache_bytes += rounded;
    pthread_mutex_unlock(&cache_mu);
    for (size_t i = 0; i < n_evicted; i++) {
        HUGE_UNPOISON(evicted[i].p, evicted[i].size);
        free(evicted[i].p);
    }
}

size_t huge_cache_release(void)
{
    huge_block all[HUGE_CACHE_SLOTS];
    pthread_mutex_lock(&cache_mu);
    size_t n = cache_len, bytes = cache_bytes;
    for (size_t i = 0; i < n; i++)
        all[i] = cache[i];
    cache_len = 0;
    cache_bytes = 0;
    pthread_mutex_unlock(&cache_mu);
    for (size_t i = 0; i < n; i++) {
        HUGE_UNPOISON(all[i].p, all[i].size);
        free(all[i].p);
    }
    return bytes;
}

size_t huge_cache_bytes(void)
{
    pthread_mutex_lock(&cache_mu);
    size_t bytes = cache_bytes;
    pthread_mutex_unlock(&cache_mu);
    return bytes;
}
