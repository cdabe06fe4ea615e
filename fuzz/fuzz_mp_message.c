/* libFuzzer target for the mp message decoder (src/mp/message.c): the input is one datagram from
 * another process of the job and the descriptors that came with it. Its first byte chooses the
 * kind of each descriptor (two bits per fd, in turn): a 64 KiB memfd (what fd storages, events
 * and spilled bodies travel as), a /dev/null dup, one end of a socketpair (what queues travel
 * as) or an eventfd; the rest is the datagram, with as many real open descriptors attached as its
 * header announces (at most 8; none when it announces more, so every fd reference is refused).
 * So descriptor-carrying entries (fd storages, queues, events, spilled bodies) are decoded, not
 * only refused. Must never crash, leak memory or descriptors (every attached fd is closed by the
 * decoder or by the value it built, once released) or read out of bounds; any failure is
 * TD_ERR_INVALID, TD_ERR_NOT_FOUND (a named segment that does not exist) or TD_ERR_IO. Inputs
 * naming file_system segments would open real ones, so the target first moves into a private
 * mount namespace with an empty /dev/shm when it can (run it as root, or where user namespaces
 * are allowed). */
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mp/message.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_FDS 8

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0)
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=16m");
    return 0;
}

static int make_fd(int kind)
{
    switch (kind) {
    case 0: {
        int fd = memfd_create("fuzz_mp_message", MFD_CLOEXEC);
        if (fd >= 0 && ftruncate(fd, 64 << 10) != 0) {
            close(fd);
            fd = -1;
        }
        return fd;
    }
    case 1:
        return open("/dev/null", O_RDWR | O_CLOEXEC);
    case 2: {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
            return -1;
        close(sv[1]);
        return sv[0];
    }
    default:
        return eventfd(0, EFD_CLOEXEC);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t kinds = data[0];
    data++;
    size--;
    int nfds = 0;
    if (size >= TD_MP_MSG_HEADER) {
        uint32_t announced = (uint32_t)data[8] | (uint32_t)data[9] << 8 | (uint32_t)data[10] << 16 |
                             (uint32_t)data[11] << 24;
        nfds = announced <= MAX_FDS ? (int)announced : 0;
    }
    int fds[MAX_FDS], mine[MAX_FDS];
    for (int i = 0; i < nfds; i++) {
        fds[i] = mine[i] = make_fd((kinds >> (2 * (i % 4))) & 3);
        if (fds[i] < 0) {
            for (int k = 0; k < i; k++)
                close(fds[k]);
            return 0;
        }
    }
    td_value *out = NULL;
    td_status st = mp_msg_decode_bytes(data, size, fds, nfds, mp_object_classes, &out);
    if (st == TD_OK) {
        td_value_release(out);
    } else if (st != TD_ERR_INVALID && st != TD_ERR_NOT_FOUND && st != TD_ERR_IO) {
        fprintf(stderr, "fuzz_mp_message: unexpected %s: %s\n", td_status_str(st), td_last_error());
        abort();
    }
    /* Every descriptor handed over is closed now (nothing else opens any meanwhile). */
    for (int i = 0; i < nfds; i++) {
        if (fcntl(mine[i], F_GETFD) != -1) {
            fprintf(stderr, "fuzz_mp_message: attached fd %d (kind %d) left open\n", i, (kinds >> (2 * (i % 4))) & 3);
            abort();
        }
    }
    return 0;
}
