/* libFuzzer target for the rank entries the transports' set-up reads back from the store
 * (src/transport/peer_rendezvous.c rdv_read, then tcp_entry_parse in tcp_proto.c and
 * shm_entry_parse in shm_proto.c, as tcp_connect.c and shm_connect.c call them): the input is the
 * value another process (or anyone who can write the store) left under a rank's address key. It
 * goes into a HashStore under the key rdv_read waits for, and is read back with each transport's
 * buffer size and decoded. Each step must stay inside its buffers, fail with a message naming the
 * rank, and leak nothing; what it accepts must fit its fields. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/store.h>

#include "base/error.h"
#include "transport/peer_rendezvous.h"
#include "transport/shm_proto.h"
#include "transport/tcp_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static td_store *g_store;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    setenv("TDIST_RDZV_PROGRESS", "0", 1); /* one wait, no progress warnings */
    if (td_hash_store_create(&g_store) != TD_OK)
        abort();
    return 0;
}

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_rdv_address: %s\n", what);
        abort();
    }
}

/* Reads rank 1's entry as rank 0 of a group of 2 would, into a text buffer of `bytes`. */
static td_status read_entry(const char *prefix, const char *what, size_t bytes, char *text)
{
    td_transport_setup o = {.store = g_store, .rank = 0, .size = 2, .timeout_ms = 1000};
    td_rdv v;
    static const auth_key no_secret = {.on = false};
    rdv_init(&v, &o, what, prefix, 64, 64, &no_secret);
    td_status st = rdv_read(&v, 1, what, text, bytes);
    check(st == TD_OK || st == TD_ERR_INVALID, "reading an entry that is there failed otherwise");
    if (st != TD_OK)
        check(strstr(td_last_error(), "rank 1") != NULL, "a refusal that does not name the rank");
    else
        check(strlen(text) < bytes, "text longer than its buffer");
    rdv_free(&v, false);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Both transports' keys, as rdv_read builds them (generation 0). */
    td_transport_setup o = {.store = g_store, .rank = 0, .size = 2, .timeout_ms = 1000};
    td_rdv v;
    char key[256], text[513];
    const char *prefixes[2] = {"tcp/", "shm/"};
    for (int i = 0; i < 2; i++) {
        static const auth_key no_secret = {.on = false};
        rdv_init(&v, &o, "fuzz", prefixes[i], 64, 64, &no_secret);
        rdv_entry_key(&v, 1, key, sizeof key);
        rdv_free(&v, false);
        if (td_store_set(g_store, key, data, size) != TD_OK)
            abort();
    }

    if (read_entry("tcp/", "tcp address", 513, text) == TD_OK) {
        td_tcp_entry e;
        if (tcp_entry_parse(text, 1, &e) == TD_OK) {
            check(e.host != NULL && e.port >= 0 && e.port <= 65535, "an accepted address without a host or port");
            check(strlen(e.host_id) < sizeof e.host_id && strlen(e.unix_name) < sizeof e.unix_name, "fields overrun");
            tcp_entry_free(&e);
        } else {
            check(strstr(td_last_error(), "rank 1") != NULL, "a refusal that does not name the rank");
        }
    }
    if (read_entry("shm/", "shm transport address", 512, text) == TD_OK) {
        td_shm_entry e;
        if (shm_entry_parse(text, 1, &e) == TD_OK)
            check(strlen(e.host_id) < sizeof e.host_id && strlen(e.sock_name) < sizeof e.sock_name, "fields overrun");
        else
            check(strstr(td_last_error(), "rank 1") != NULL, "a refusal that does not name the rank");
    }
    return 0;
}
