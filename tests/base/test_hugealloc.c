/* Huge blocks and the cache of freed ones (base/hugealloc.h): reuse at the same rounded size, the
 * budget (TDIST_STORAGE_CACHE) with the oldest blocks given back first, the slot limit, the
 * setting's errors, tensor storages zeroed on reuse, and a fork while another thread allocates.
 * Each case runs in its own process, so the setting is read afresh in each. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tdist/tensor.h>
#include <tdist/testing.h>

#include "base/hugealloc.h"

#define MIB ((size_t)1 << 20)

static void *huge(size_t size)
{
    void *p = NULL;
    TD_CHECK_OK(huge_try_alloc(size, "a test block", &p));
    TD_CHECK(p != NULL);
    return p;
}

TD_TEST(huge_blocks_are_reused_at_their_rounded_size)
{
    TD_CHECK_EQ(huge_cache_bytes(), 0);
    void *p = huge(3 * MIB + 1); /* rounded to 4 MiB */
    TD_CHECK_EQ((uintptr_t)p % TD_HUGE_PAGE, 0);
    memset(p, 0xab, 3 * MIB + 1);
    huge_free(p, 3 * MIB + 1);
    TD_CHECK_EQ(huge_cache_bytes(), 4 * MIB);
    void *other = huge(6 * MIB); /* another size: a new block */
    TD_CHECK(other != p);
    TD_CHECK_EQ(huge_cache_bytes(), 4 * MIB);
    void *again = huge(4 * MIB);
    TD_CHECK(again == p);
    TD_CHECK_EQ(((unsigned char *)again)[3 * MIB], 0xab); /* not cleared: the caller's to do */
    TD_CHECK_EQ(huge_cache_bytes(), 0);
    huge_free(again, 4 * MIB);
    huge_free(other, 6 * MIB);
    TD_CHECK_EQ(huge_cache_bytes(), 10 * MIB);
    void *small = huge(1000); /* below a huge page: never kept */
    huge_free(small, 1000);
    huge_free(NULL, 4 * MIB);
    TD_CHECK_EQ(huge_cache_bytes(), 10 * MIB);
    TD_CHECK_EQ(huge_cache_release(), 10 * MIB);
    TD_CHECK_EQ(huge_cache_bytes(), 0);
}

TD_TEST(huge_cache_keeps_its_budget_oldest_out)
{
    setenv("TDIST_STORAGE_CACHE", "8M", 1);
    void *a = huge(2 * MIB), *b = huge(4 * MIB), *c = huge(4 * MIB), *big = huge(10 * MIB);
    huge_free(a, 2 * MIB);
    huge_free(b, 4 * MIB);
    TD_CHECK_EQ(huge_cache_bytes(), 6 * MIB);
    huge_free(c, 4 * MIB); /* 10 MiB would be over: a, the oldest, goes */
    TD_CHECK_EQ(huge_cache_bytes(), 8 * MIB);
    huge_free(big, 10 * MIB); /* larger than the whole budget: not kept, nothing evicted */
    TD_CHECK_EQ(huge_cache_bytes(), 8 * MIB);
    void *x = huge(4 * MIB), *y = huge(4 * MIB); /* b and c */
    TD_CHECK((x == c && y == b) || (x == b && y == c));
    TD_CHECK_EQ(huge_cache_bytes(), 0);
    huge_free(x, 4 * MIB);
    huge_free(y, 4 * MIB);
    TD_CHECK_EQ(huge_cache_release(), 8 * MIB);
}

TD_TEST(huge_cache_keeps_at_most_eight_blocks)
{
    setenv("TDIST_STORAGE_CACHE", "1G", 1);
    void *blocks[10];
    for (int i = 0; i < 10; i++)
        blocks[i] = huge(2 * MIB);
    for (int i = 0; i < 10; i++)
        huge_free(blocks[i], 2 * MIB);
    TD_CHECK_EQ(huge_cache_bytes(), 16 * MIB);
    TD_CHECK_EQ(huge_cache_release(), 16 * MIB);
}

TD_TEST(storage_cache_off)
{
    setenv("TDIST_STORAGE_CACHE", "0", 1);
    td_storage *s = NULL;
    TD_CHECK_OK(td_storage_new(4 * MIB, &s));
    td_storage_release(s);
    TD_CHECK_EQ(huge_cache_bytes(), 0);
}

TD_TEST(storage_cache_setting_is_checked)
{
    setenv("TDIST_STORAGE_CACHE", "lots", 1);
    td_storage *s = NULL;
    TD_CHECK_ERR(td_storage_new(4 * MIB, &s), TD_ERR_INVALID,
                 "TDIST_STORAGE_CACHE must be a size such as 4096, 64K or 16M, got 'lots'");
    TD_CHECK(s == NULL);
    TD_CHECK_OK(td_storage_new(4096, &s)); /* small storages never use the cache */
    td_storage_release(s);
}

TD_TEST(reused_storage_is_zeroed)
{
    td_storage *s = NULL;
    TD_CHECK_OK(td_storage_new(5 * MIB, &s));
    void *first = td_storage_data(s);
    memset(first, 0xff, 5 * MIB);
    td_storage_release(s);
    TD_CHECK_EQ(huge_cache_bytes(), 6 * MIB);
    TD_CHECK_OK(td_storage_new(5 * MIB, &s));
    TD_CHECK(td_storage_data(s) == first);
    const unsigned char *d = td_storage_data(s);
    size_t nonzero = 0;
    for (size_t i = 0; i < 5 * MIB; i++)
        nonzero += d[i] != 0;
    TD_CHECK_EQ(nonzero, 0);
    td_storage_release(s);
    TD_CHECK_EQ(huge_cache_release(), 6 * MIB);
}

/* A fork while another thread holds the cache's lock must not leave it held in the child. */
static atomic_bool churn_stop;

static void *churn(void *arg)
{
    (void)arg;
    while (!atomic_load(&churn_stop)) {
        void *p = NULL;
        if (huge_try_alloc(2 * MIB, "churn", &p) == TD_OK)
            huge_free(p, 2 * MIB);
    }
    return NULL;
}

TD_TEST(huge_cache_works_in_a_forked_child)
{
    /* The cache is set up before the churn starts: a fork while another thread is inside a
     * pthread_once leaves that once running forever in the child under ThreadSanitizer's
     * pthread_once (glibc's restarts it in the child). The lock, not the setup, is under test. */
    huge_free(huge(2 * MIB), 2 * MIB);
    pthread_t t;
    atomic_store(&churn_stop, false);
    TD_CHECK_EQ(pthread_create(&t, NULL, churn, NULL), 0);
    int bad = 0;
    for (int i = 0; i < 20; i++) {
        pid_t pid = fork();
        TD_CHECK(pid >= 0);
        if (pid == 0) {
            alarm(10); /* a lock copied held would hang here: SIGALRM ends the child */
            void *p = NULL;
            int ok = huge_try_alloc(2 * MIB, "child", &p) == TD_OK;
            if (ok)
                huge_free(p, 2 * MIB);
            _exit(ok ? 0 : 3);
        }
        int status = 0;
        TD_CHECK_EQ(waitpid(pid, &status, 0), pid);
        bad += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    atomic_store(&churn_stop, true);
    TD_CHECK_EQ(pthread_join(t, NULL), 0);
    TD_CHECK_EQ(bad, 0);
    huge_cache_release();
}
