/* The Store interface over all four stores (spec/c10d.md C4, C5): every case runs once per store,
 * ctx->param = tcp, file, hash or prefix (a PrefixStore over a TCPStore), and tcp_inet (the
 * TCPStore again with its same-host socket off, so its TCP path is covered too). Single-process cases use
 * one handle; the cross-process cases (world size 4) run one worker per rank process for the
 * stores processes can share, and four threads of one process over a HashStore, which lives in one
 * process by design. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/store.h>
#include <tdist/testing.h>

#include "util.h"

#define STORES "tcp,file,hash,prefix,tcp_inet"

static void check_get(td_store *s, const char *key, const void *want, size_t want_len)
{
    void *v = NULL;
    size_t n = 0;
    TD_CHECK_OK(td_store_get(s, key, &v, &n));
    TD_CHECK_EQ(n, want_len);
    TD_CHECK(memcmp(v, want, n) == 0);
    TD_CHECK_EQ(((char *)v)[n], 0);
    free(v);
}

TD_TEST(set_get_round_trip, .params = STORES, .timeout_s = 60)
{
    td_store *s = open_param_store(ctx);
    TD_CHECK_OK(td_store_set_str(s, "key0", "value0"));
    check_get(s, "key0", "value0", 6);
    TD_CHECK_OK(td_store_set_str(s, "key0", "v"));
    check_get(s, "key0", "v", 1);
    /* Empty and binary values, and a key with spaces and slashes. */
    TD_CHECK_OK(td_store_set(s, "empty", "", 0));
    check_get(s, "empty", "", 0);
    unsigned char bin[256];
    for (int i = 0; i < 256; i++)
        bin[i] = (unsigned char)(255 - i);
    TD_CHECK_OK(td_store_set(s, "a key/with //slashes", bin, sizeof bin));
    check_get(s, "a key/with //slashes", bin, sizeof bin);
    /* A large value. */
    size_t big = (size_t)3 << 20;
    unsigned char *b = malloc(big);
    for (size_t i = 0; i < big; i++)
        b[i] = (unsigned char)(i * 7 + (i >> 12));
    TD_CHECK_OK(td_store_set(s, "big", b, big));
    check_get(s, "big", b, big);
    free(b);
    td_store_release(s);
}

/* c10d's StoreTestBase._test_set_get_check: five user keys, plus the store's internal ones. */
TD_TEST(add_and_num_keys, .params = STORES, .timeout_s = 60)
{
    td_store *s = open_param_store(ctx);
    int64_t v = 0;
    TD_CHECK_OK(td_store_add(s, "key", 1, &v));
    TD_CHECK_EQ(v, 1);
    TD_CHECK_OK(td_store_add(s, "key", 2, &v));
    TD_CHECK_OK(td_store_add(s, "key", 3, &v));
    TD_CHECK_EQ(v, 6);
    TD_CHECK_OK(td_store_set_str(s, "key0", "value0"));
    TD_CHECK_OK(td_store_add(s, "key3", 1, NULL));
    TD_CHECK_OK(td_store_set_str(s, "key1", "value1"));
    TD_CHECK_OK(td_store_add(s, "key3", 2, NULL));
    TD_CHECK_OK(td_store_set_str(s, "key2", "value2"));
    for (int i = 3; i <= 6; i++)
        TD_CHECK_OK(td_store_add(s, "key3", i, &v));
    TD_CHECK_EQ(v, 21);
    int64_t n = -1;
    TD_CHECK_OK(td_store_num_keys(s, &n));
    TD_CHECK_EQ(n, 5 + param_internal_keys(ctx));
    char *t = get_str(s, "key");
    TD_CHECK_STR_EQ(t, "6");
    free(t);
    t = get_str(s, "key3");
    TD_CHECK_STR_EQ(t, "21");
    free(t);
    /* Negative deltas, and counters set as text. */
    TD_CHECK_OK(td_store_add(s, "key", -10, &v));
    TD_CHECK_EQ(v, -4);
    TD_CHECK_OK(td_store_set_str(s, "text", "41"));
    TD_CHECK_OK(td_store_add(s, "text", 1, &v));
    TD_CHECK_EQ(v, 42);
    TD_CHECK_OK(td_store_set_str(s, "word", "forty"));
    TD_CHECK_ERR(td_store_add(s, "word", 1, &v), TD_ERR_INVALID, "is not a decimal integer");
    /* The store still works after a refused add. */
    t = get_str(s, "word");
    TD_CHECK_STR_EQ(t, "forty");
    free(t);
    td_store_release(s);
}

TD_TEST(compare_set_truth_table, .params = STORES, .timeout_s = 60)
{
    td_store *s = open_param_store(ctx);
    void *v;
    size_t n;
    /* absent, expected empty -> set, returns desired */
    TD_CHECK_OK(td_store_compare_set(s, "cs", "", 0, "first", 5, &v, &n));
    TD_CHECK(n == 5 && memcmp(v, "first", 5) == 0);
    free(v);
    check_get(s, "cs", "first", 5);
    /* absent, expected non-empty -> no write, returns expected */
    TD_CHECK_OK(td_store_compare_set(s, "absent", "exp", 3, "des", 3, &v, &n));
    TD_CHECK(n == 3 && memcmp(v, "exp", 3) == 0);
    free(v);
    bool ready = true;
    const char *k[] = {"absent"};
    TD_CHECK_OK(td_store_check(s, k, 1, &ready));
    TD_CHECK(!ready);
    /* present and equal -> set, returns desired */
    TD_CHECK_OK(td_store_compare_set(s, "cs", "first", 5, "second", 6, &v, &n));
    TD_CHECK(n == 6 && memcmp(v, "second", 6) == 0);
    free(v);
    check_get(s, "cs", "second", 6);
    /* present, different -> no write, returns current */
    TD_CHECK_OK(td_store_compare_set(s, "cs", "first", 5, "third", 5, &v, &n));
    TD_CHECK(n == 6 && memcmp(v, "second", 6) == 0);
    free(v);
    check_get(s, "cs", "second", 6);
    /* present and expected empty (but the value is not) -> returns current */
    TD_CHECK_OK(td_store_compare_set(s, "cs", "", 0, "x", 1, &v, &n));
    TD_CHECK(n == 6 && memcmp(v, "second", 6) == 0);
    free(v);
    td_store_release(s);
}

TD_TEST(delete_and_check, .params = STORES, .timeout_s = 60)
{
    td_store *s = open_param_store(ctx);
    const char *keys[] = {"d1", "d2"};
    bool ready = true, deleted = false;
    TD_CHECK_OK(td_store_check(s, keys, 2, &ready));
    TD_CHECK(!ready);
    TD_CHECK_OK(td_store_set_str(s, "d1", "1"));
    TD_CHECK_OK(td_store_check(s, keys, 1, &ready));
    TD_CHECK(ready);
    TD_CHECK_OK(td_store_check(s, keys, 2, &ready));
    TD_CHECK(!ready);
    TD_CHECK_OK(td_store_set_str(s, "d2", "2"));
    TD_CHECK_OK(td_store_check(s, keys, 2, &ready));
    TD_CHECK(ready);
    int64_t n0, n1;
    TD_CHECK_OK(td_store_num_keys(s, &n0));
    TD_CHECK_OK(td_store_delete_key(s, "d1", &deleted));
    TD_CHECK(deleted);
    TD_CHECK_OK(td_store_delete_key(s, "d1", &deleted));
    TD_CHECK(!deleted);
    TD_CHECK_OK(td_store_num_keys(s, &n1));
    TD_CHECK_EQ(n1, n0 - 1);
    TD_CHECK_OK(td_store_check(s, keys, 2, &ready));
    TD_CHECK(!ready);
    /* A deleted key can be set again, and add starts over from 0. */
    TD_CHECK_OK(td_store_add(s, "d1", 5, NULL));
    char *t = get_str(s, "d1");
    TD_CHECK_STR_EQ(t, "5");
    free(t);
    td_store_release(s);
}

TD_TEST(append_multi_get_multi_set, .params = STORES, .timeout_s = 60)
{
    td_store *s = open_param_store(ctx);
    TD_CHECK_OK(td_store_append(s, "log", "ab", 2));
    TD_CHECK_OK(td_store_append(s, "log", "cd", 2));
    TD_CHECK_OK(td_store_append(s, "log", "", 0));
    check_get(s, "log", "abcd", 4);
    for (int i = 0; i < 200; i++)
        TD_CHECK_OK(td_store_append(s, "many", "x", 1));
    void *v;
    size_t n;
    TD_CHECK_OK(td_store_get(s, "many", &v, &n));
    TD_CHECK_EQ(n, 200);
    free(v);
    const char *keys[] = {"m1", "m2", "m3"};
    const void *vals[] = {"one", "", "three"};
    size_t lens[] = {3, 0, 5};
    TD_CHECK_OK(td_store_multi_set(s, keys, vals, lens, 3));
    void *out[3];
    size_t outl[3];
    TD_CHECK_OK(td_store_multi_get(s, keys, 3, out, outl));
    for (int i = 0; i < 3; i++) {
        TD_CHECK_EQ(outl[i], lens[i]);
        TD_CHECK(memcmp(out[i], vals[i], lens[i]) == 0);
        free(out[i]);
    }
    check_get(s, "m3", "three", 5);
    td_store_release(s);
}

TD_TEST(get_timeout_message, .params = STORES, .timeout_s = 60)
{
    td_store *s = open_param_store(ctx);
    TD_CHECK_EQ(td_store_get_timeout(s), TD_STORE_DEFAULT_TIMEOUT_MS);
    TD_CHECK_OK(td_store_set_timeout(s, 1000));
    TD_CHECK_EQ(td_store_get_timeout(s), 1000);
    char buf[256];
    const char *msg = param_get_timeout_msg(ctx, "missing", 1000, buf, sizeof buf);
    void *v = NULL;
    size_t n;
    double t0 = now_s();
    TD_CHECK_ERR(td_store_get(s, "missing", &v, &n), TD_ERR_TIMEOUT, msg);
    double dt = now_s() - t0;
    TD_CHECK_STR_EQ(td_last_error(), msg);
    TD_CHECK_MSG(dt >= 1.0 && dt <= 2.0, "get timed out after %.3f s, expected within [1, 2] s", dt);
    TD_CHECK(v == NULL);
    /* The handle keeps working after a timeout (a TCPStore cancelled its request on the server). */
    TD_CHECK_OK(td_store_set_str(s, "missing", "here"));
    char *t = get_str(s, "missing");
    TD_CHECK_STR_EQ(t, "here");
    free(t);
    td_store_release(s);
}

TD_TEST(wait_timeout_message, .params = STORES, .timeout_s = 60)
{
    td_store *s = open_param_store(ctx);
    const char *keys[] = {"w1", "w2"};
    TD_CHECK_OK(td_store_set_str(s, "w1", "x"));
    /* An explicit timeout overrides the store's. */
    double t0 = now_s();
    TD_CHECK_ERR(td_store_wait(s, keys, 2, 1000), TD_ERR_TIMEOUT, param_wait_timeout_msg(ctx));
    double dt = now_s() - t0;
    TD_CHECK_STR_EQ(td_last_error(), param_wait_timeout_msg(ctx));
    TD_CHECK_MSG(dt >= 1.0 && dt <= 2.0, "wait timed out after %.3f s, expected within [1, 2] s", dt);
    /* The store's own timeout applies with TD_STORE_TIMEOUT_DEFAULT. */
    TD_CHECK_OK(td_store_set_timeout(s, 1000));
    t0 = now_s();
    TD_CHECK_ERR(td_store_wait(s, keys, 2, TD_STORE_TIMEOUT_DEFAULT), TD_ERR_TIMEOUT, param_wait_timeout_msg(ctx));
    dt = now_s() - t0;
    TD_CHECK_MSG(dt >= 1.0 && dt <= 2.0, "wait timed out after %.3f s, expected within [1, 2] s", dt);
    TD_CHECK_OK(td_store_set_str(s, "w2", "y"));
    TD_CHECK_OK(td_store_wait(s, keys, 2, TD_STORE_TIMEOUT_DEFAULT));
    TD_CHECK_OK(td_store_wait(s, keys, 0, 1));
    TD_CHECK_ERR(td_store_set_timeout(s, -5), TD_ERR_INVALID, "timeout");
    td_store_release(s);
}

TD_TEST(prefix_isolation, .params = STORES, .timeout_s = 60)
{
    td_store *s = open_param_store(ctx);
    td_store *a = NULL, *b = NULL;
    TD_CHECK_OK(td_prefix_store_create("a", s, &a));
    TD_CHECK_OK(td_prefix_store_create("b", s, &b));
    int64_t base = 0;
    TD_CHECK_OK(td_store_num_keys(s, &base));
    TD_CHECK_OK(td_store_set_str(a, "k", "from a"));
    TD_CHECK_OK(td_store_set_str(b, "k", "from b"));
    TD_CHECK_OK(td_store_add(a, "n", 1, NULL));
    TD_CHECK_OK(td_store_add(b, "n", 10, NULL));
    char *t = get_str(a, "k");
    TD_CHECK_STR_EQ(t, "from a");
    free(t);
    t = get_str(b, "k");
    TD_CHECK_STR_EQ(t, "from b");
    free(t);
    t = get_str(s, "a/k");
    TD_CHECK_STR_EQ(t, "from a");
    free(t);
    t = get_str(b, "n");
    TD_CHECK_STR_EQ(t, "10");
    free(t);
    bool ready = true;
    const char *k[] = {"k"};
    td_store *c = NULL;
    TD_CHECK_OK(td_prefix_store_create("c", s, &c));
    TD_CHECK_OK(td_store_check(c, k, 1, &ready));
    TD_CHECK(!ready);
    /* num_keys is not filtered: every prefix sees the base store's total. */
    int64_t na = 0, nb = 0;
    TD_CHECK_OK(td_store_num_keys(a, &na));
    TD_CHECK_OK(td_store_num_keys(b, &nb));
    TD_CHECK_EQ(na, base + 4);
    TD_CHECK_EQ(nb, base + 4);
    /* c10d nests them: default_pg/0//key. */
    td_store *pg = NULL, *sub = NULL;
    TD_CHECK_OK(td_prefix_store_create("default_pg", s, &pg));
    TD_CHECK_OK(td_prefix_store_create("0/", pg, &sub));
    TD_CHECK_OK(td_store_set_str(sub, "key", "nested"));
    t = get_str(s, "default_pg/0//key");
    TD_CHECK_STR_EQ(t, "nested");
    free(t);
    /* The timeout is the base's. */
    TD_CHECK_OK(td_store_set_timeout(sub, 1234));
    TD_CHECK_EQ(td_store_get_timeout(s), td_store_get_timeout(sub));
    td_store_release(sub);
    td_store_release(pg);
    td_store_release(c);
    td_store_release(a);
    td_store_release(b);
    td_store_release(s);
}

TD_TEST(invalid_arguments, .params = STORES, .timeout_s = 60)
{
    td_store *s = open_param_store(ctx);
    void *v;
    TD_CHECK_ERR(td_store_set(s, NULL, "x", 1), TD_ERR_INVALID, "key is NULL");
    TD_CHECK_ERR(td_store_set(s, "k", NULL, 1), TD_ERR_INVALID, "value is NULL");
    TD_CHECK_ERR(td_store_get(s, "k", NULL, NULL), TD_ERR_INVALID, NULL);
    TD_CHECK_ERR(td_store_get(NULL, "k", &v, NULL), TD_ERR_INVALID, "store is NULL");
    const char *keys[] = {"a", NULL};
    bool ready;
    TD_CHECK_ERR(td_store_check(s, keys, 2, &ready), TD_ERR_INVALID, "keys[1] is NULL");
    TD_CHECK_ERR(td_store_wait(s, keys, 1, -7), TD_ERR_INVALID, "timeout");
    td_store_release(NULL);
    TD_CHECK(td_store_retain(s) == s);
    td_store_release(s);
    td_store_release(s);
}

/* ---- cross-process ------------------------------------------------------------------------------- */

static void blocking_get_worker(td_test_ctx *ctx, td_store *s, int rank, int world)
{
    if (rank == 0) {
        sleep_s(0.3);
        TD_CHECK_OK(td_store_set_str(s, "released", "by rank 0"));
        return;
    }
    double t0 = now_s();
    char *t = get_str(s, "released");
    TD_CHECK_STR_EQ(t, "by rank 0");
    free(t);
    TD_CHECK(now_s() - t0 >= 0.1);
}

TD_TEST(blocking_get_released_by_set, .params = STORES, .world_size = 4, .timeout_s = 90)
{
    run_workers(ctx, blocking_get_worker);
}

#define ADDS 200

static void add_worker(td_test_ctx *ctx, td_store *s, int rank, int world)
{
    int64_t last = 0, prev = 0;
    for (int i = 0; i < ADDS; i++) {
        TD_CHECK_OK(td_store_add(s, "sum", rank + 1, &last));
        TD_CHECK(last > prev); /* every add sees at least its own increments */
        prev = last;
    }
    store_barrier(s, "added", world);
    char *t = get_str(s, "sum");
    int64_t want = (int64_t)ADDS * world * (world + 1) / 2;
    TD_CHECK_EQ(strtoll(t, NULL, 10), want);
    free(t);
}

TD_TEST(add_from_four_sums_exactly, .params = STORES, .world_size = 4, .timeout_s = 120)
{
    run_workers(ctx, add_worker);
}

static void multi_wait_worker(td_test_ctx *ctx, td_store *s, int rank, int world)
{
    /* Every rank waits for every rank's key; each sets its own after a stagger. */
    char mine[32];
    snprintf(mine, sizeof mine, "ready/%d", rank);
    const char *keys[4] = {"ready/0", "ready/1", "ready/2", "ready/3"};
    TD_CHECK(world == 4);
    sleep_s(0.05 * rank);
    TD_CHECK_OK(td_store_set_str(s, mine, "1"));
    TD_CHECK_OK(td_store_wait(s, keys, 4, 30000));
    bool ready = false;
    TD_CHECK_OK(td_store_check(s, keys, 4, &ready));
    TD_CHECK(ready);
    void *vals[4];
    size_t lens[4];
    TD_CHECK_OK(td_store_multi_get(s, keys, 4, vals, lens));
    for (int i = 0; i < 4; i++) {
        TD_CHECK(lens[i] == 1 && ((char *)vals[i])[0] == '1');
        free(vals[i]);
    }
}

TD_TEST(multi_key_wait, .params = STORES, .world_size = 4, .timeout_s = 90)
{
    run_workers(ctx, multi_wait_worker);
}

static void compare_set_race_worker(td_test_ctx *ctx, td_store *s, int rank, int world)
{
    /* Exactly one rank wins a compare_set from "absent". */
    char me[16];
    snprintf(me, sizeof me, "rank%d", rank);
    void *v;
    size_t n;
    TD_CHECK_OK(td_store_compare_set(s, "leader", "", 0, me, strlen(me), &v, &n));
    if (n == strlen(me) && memcmp(v, me, n) == 0)
        TD_CHECK_OK(td_store_add(s, "winners", 1, NULL));
    free(v);
    store_barrier(s, "cs_done", world);
    char *t = get_str(s, "winners");
    TD_CHECK_STR_EQ(t, "1");
    free(t);
}

TD_TEST(compare_set_one_winner, .params = STORES, .world_size = 4, .timeout_s = 90)
{
    run_workers(ctx, compare_set_race_worker);
}

TD_TEST_MAIN()
