/* The control channel between the harness parent and a rank (c10d's Connection pipe, in C).
 *
 * A socketpair per rank carries small framed messages: the parent asks a hung rank for its stacks,
 * the rank answers with them, and a failing rank sends its message before exiting with code 10.
 * Frames are u32 little-endian payload length + u8 type + payload (docs/protocols.md). The parent
 * reads non-blocking and parses with ctl_parse, which refuses lengths above TD_CTL_MAX_PAYLOAD;
 * ranks read and write blocking. A rank ends a failed case here too (harness_fail_process):
 * its message goes on the channel before exit code 10. */
#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/error.h"
#include "testing/harness.h"

/* Held across the writes of one frame, on purpose: a rank's listener thread (answering a traceback
 * request) and a failing body may send at the same time, and their frames must not interleave. The
 * parent reads every channel continuously, so a write under the lock always finishes. */
static pthread_mutex_t g_send_lock = PTHREAD_MUTEX_INITIALIZER;

static td_status write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == ENOTSOCK)
            n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return error_errno(TD_ERR_IO, "writing to the harness control channel");
        }
        p += n;
        len -= (size_t)n;
    }
    return TD_OK;
}

td_status ctl_send(int fd, uint8_t type, const void *data, size_t len)
{
    if (len > TD_CTL_MAX_PAYLOAD)
        len = TD_CTL_MAX_PAYLOAD;
    unsigned char hdr[TD_CTL_HEADER];
    uint32_t n = (uint32_t)len;
    hdr[0] = (unsigned char)(n & 0xff);
    hdr[1] = (unsigned char)((n >> 8) & 0xff);
    hdr[2] = (unsigned char)((n >> 16) & 0xff);
    hdr[3] = (unsigned char)((n >> 24) & 0xff);
    hdr[4] = type;
    pthread_mutex_lock(&g_send_lock);
    td_status s = write_all(fd, hdr, sizeof hdr);
    if (s == TD_OK && len > 0)
        s = write_all(fd, data, len);
    pthread_mutex_unlock(&g_send_lock);
    return s;
}

static td_status read_all(int fd, void *data, size_t len, bool *eof_at_start)
{
    char *p = data;
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, p + got, len - got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return error_errno(TD_ERR_IO, "reading the harness control channel");
        }
        if (n == 0) {
            if (eof_at_start)
                *eof_at_start = got == 0;
            return error_fmt(TD_ERR_CLOSED, "the harness control channel was closed");
        }
        got += (size_t)n;
    }
    return TD_OK;
}

td_status ctl_recv(int fd, uint8_t *type, td_buf *payload)
{
    unsigned char hdr[TD_CTL_HEADER];
    buf_clear(payload);
    TD_TRY(read_all(fd, hdr, sizeof hdr, NULL));
    uint32_t n = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
    if (n > TD_CTL_MAX_PAYLOAD)
        return error_fmt(TD_ERR_INVALID, "harness control frame of %u bytes exceeds the limit of %u", n,
                        TD_CTL_MAX_PAYLOAD);
    *type = hdr[4];
    if (n > 0) {
        TD_TRY(buf_try_reserve(payload, n));
        TD_TRY(read_all(fd, buf_extend(payload, n), n, NULL));
    }
    return TD_OK;
}

td_status ctl_parse(td_buf *in, void (*on_frame)(void *arg, uint8_t type, const char *data, size_t len),
                       void *arg)
{
    size_t off = 0;
    td_status s = TD_OK;
    while (in->len - off >= TD_CTL_HEADER) {
        const unsigned char *h = (const unsigned char *)in->data + off;
        uint32_t n = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
        if (n > TD_CTL_MAX_PAYLOAD) {
            s = error_fmt(TD_ERR_INVALID, "harness control frame of %u bytes exceeds the limit of %u", n,
                         TD_CTL_MAX_PAYLOAD);
            break;
        }
        if (in->len - off - TD_CTL_HEADER < n)
            break;
        on_frame(arg, h[4], (const char *)h + TD_CTL_HEADER, n);
        off += TD_CTL_HEADER + n;
    }
    buf_consume(in, off);
    return s;
}

/* ---- the rank's end ------------------------------------------------------------------------ */

/* The rank this process runs and its channel (-1 under an external launcher), once the child side
 * has attached; before that a failure just prints and exits (a tool, or the parent itself). */
static struct {
    bool active;
    int rank;
    int fd;
} g_rank = {.fd = -1};

#define LOGGED_MESSAGE_MAX (64u << 10)

void harness_ctl_attach(int rank, int fd)
{
    g_rank.rank = rank;
    g_rank.fd = fd;
    g_rank.active = true;
}

int harness_ctl_fd(void) { return g_rank.fd; }

void harness_fail_process(const char *message)
{
    if (!g_rank.active) {
        fprintf(stderr, "%s\n", message);
        fflush(stdout);
        fflush(stderr);
        _exit(TD_TEST_ERROR_EXIT_CODE);
    }
    size_t len = strlen(message);
    td_buf stack = TD_BUF_INIT;
    stacks_dump_self(&stack, 1);
    harness_log(NULL, "Caught exception: \n%.*s%s\nat:\n%s exiting process %d with exit code: %d",
                   (int)(len > LOGGED_MESSAGE_MAX ? LOGGED_MESSAGE_MAX : len), message,
                   len > LOGGED_MESSAGE_MAX ? "... (cut here; the parent gets all of it)" : "",
                   stack.data ? stack.data : "", g_rank.rank, TD_TEST_ERROR_EXIT_CODE);
    buf_free(&stack);
    /* Under an external launcher there is no parent to tell: the message above is the report. */
    if (g_rank.fd >= 0 && ctl_send(g_rank.fd, TD_CTL_ERROR, message, len) != TD_OK)
        harness_log(NULL, "could not send the failure to the parent: %s", td_last_error());
    fflush(stdout);
    fflush(stderr);
    _exit(TD_TEST_ERROR_EXIT_CODE);
}
