/* libFuzzer target for the test harness's control-channel parser (src/testing/ctl.c): the input is
 * what a rank wrote on its channel, fed to ctl_parse in chunks of varying size as the parent's
 * non-blocking reads would deliver it. Must never crash or read out of bounds; every frame handed
 * over lies within what was fed, and a failure is TD_ERR_INVALID. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "testing/harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct seen {
    size_t bytes;
    size_t frames;
} seen;

static void on_frame(void *arg, uint8_t type, const char *payload, size_t len)
{
    seen *s = arg;
    (void)type;
    volatile char sink = 0;
    for (size_t i = 0; i < len; i++)
        sink ^= payload[i];
    (void)sink;
    s->bytes += len + TD_CTL_HEADER;
    s->frames++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    td_buf in = TD_BUF_INIT;
    seen s = {0, 0};
    size_t off = 0, step = size ? (size_t)data[0] % 13 + 1 : 1;
    while (off < size) {
        size_t n = size - off < step ? size - off : step;
        buf_append(&in, data + off, n);
        off += n;
        td_status st = ctl_parse(&in, on_frame, &s);
        if (st != TD_OK) {
            if (st != TD_ERR_INVALID)
                abort();
            break;
        }
        if (s.bytes + in.len != off)
            abort(); /* consumed frames plus what is buffered is exactly what was fed */
    }
    buf_free(&in);
    return 0;
}
