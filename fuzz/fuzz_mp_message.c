/* libFuzzer target for the mp message decoder (src/mp/message.c): the input is one datagram from
 * another process of the job, with no file descriptors attached (so every fd reference must be
 * refused). Must never crash, leak or read out of bounds; any failure is TD_ERR_INVALID,
 * TD_ERR_NOT_FOUND (a named segment that does not exist) or TD_ERR_IO. Inputs naming file_system
 * segments would open real ones, so the target first moves into a private mount namespace with an
 * empty /dev/shm when it can (run it as root, or where user namespaces are allowed). */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>

#include "mp/message.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0)
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=16m");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fds[1];
    td_value *out = NULL;
    td_status st = mp_msg_decode_bytes(data, size, fds, 0, mp_object_classes, &out);
    if (st == TD_OK) {
        td_value_release(out);
    } else if (st != TD_ERR_INVALID && st != TD_ERR_NOT_FOUND && st != TD_ERR_IO) {
        fprintf(stderr, "fuzz_mp_message: unexpected %s: %s\n", td_status_str(st), td_last_error());
        abort();
    }
    return 0;
}
