/* libFuzzer target for tdist-shm-manager's message handling (src/mp/shm_manager_server.c, the
 * functions the daemon calls with each datagram): the input is what two clients of the abstract
 * socket send, as records [selector, length, bytes]. The selector's low bit picks the client and
 * 0x02 makes that client disconnect after its message (the daemon drops what it still holds).
 * Client 0 claims a pid no process can have (2147000000), so the names it creates are accepted
 * and no real segment is touched; client 1 is this process, so HOLD of other names goes through
 * the /proc/<pid>/maps check. When the target can move into a private mount namespace with an
 * empty /dev/shm (root, or user namespaces), each input also finds a real named segment
 * "tdist.2147000000.seg" with a refcount of 2, so a departed client's references are dropped in
 * its header and the name removed at 0 (this process maps it, so client 1 may hold it too). Must
 * never crash or leak, and must drop only references a client registered: the segment loses at
 * most as many references as the departing clients held on it. */
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "mp/shm_manager.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FAKE_PID 2147000000
#define SEG_NAME "tdist.2147000000.seg"

static bool g_private_shm;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=16m") == 0)
        g_private_shm = true;
    return 0;
}

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_shm_manager: %s\n", what);
        abort();
    }
}

/* Log lines are formatted (the format strings run) and discarded. */
static void quiet(const char *line) { (void)line; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    td_segment seg = TD_SEGMENT_INIT;
    if (g_private_shm && segment_create_as(SEG_NAME, TD_SHM_HEADER_SIZE, false, false, &seg) == TD_OK) {
        td_shm_header *h = seg.base;
        h->magic = TD_SHM_HEADER_MAGIC;
        atomic_store(&h->refcount, 2);
    }
    shmm_server server = {.known = TD_MAP_INIT, .log = quiet};
    shmm_client clients[2] = {{.fd = -1, .pid = FAKE_PID, .holds = TD_MAP_INIT},
                              {.fd = -1, .pid = getpid(), .holds = TD_MAP_INIT}};
    uintptr_t may_drop = 0; /* references on SEG_NAME that departing clients held */
    size_t off = 0;
    while (off + 2 <= size) {
        uint8_t sel = data[off], n = data[off + 1];
        off += 2;
        size_t len = n < size - off ? n : size - off;
        int i = sel & 1;
        shmm_client *c = &clients[i];
        shmm_verdict v = shmm_server_message(&server, c, data + off, len);
        check(v == SHMM_KEEP || v == SHMM_WELCOME || v == SHMM_CLOSE, "unknown verdict");
        off += len;
        if (v == SHMM_CLOSE || (sel & 2)) {
            /* It goes away (and the same process connects again). */
            may_drop += (uintptr_t)map_get_str(&c->holds, SEG_NAME);
            shmm_server_client_gone(&server, c);
            check(c->holds.len == 0, "a departed client still holds names");
        }
    }
    for (int i = 0; i < 2; i++) {
        may_drop += (uintptr_t)map_get_str(&clients[i].holds, SEG_NAME);
        shmm_server_client_gone(&server, &clients[i]);
    }
    if (seg.base) {
        int32_t left = atomic_load(&((td_shm_header *)seg.base)->refcount);
        check(left <= 2 && (uintptr_t)(2 - left) <= may_drop, "references dropped that no client held");
        segment_unmap(&seg);
    }
    shmm_server_sweep(&server);
    segment_unlink(SEG_NAME);
    return 0;
}
