/* torchrun's error file: where a failing worker leaves the reason for its launcher's summary.
 *
 * tdrun and torchrun give each worker a path in TORCHELASTIC_ERROR_FILE and, when the worker
 * fails, print what it wrote there as the failure's traceback (torchrun's JSON: {"message":
 * {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}). Python programs get it
 * from @record; a C program calls td_record_error before it exits. The library also records on its
 * own the first failure of a process group (a peer lost, the watchdog's timeout, an abort): the
 * process that then exits non-zero shows that reason instead of "wrote no error file". The
 * library's own record never replaces a file that exists (the program's record, or an earlier
 * failure, is the better root cause); td_record_error replaces what is there. Without the
 * variable nothing is written. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/errfile.h"
#include "base/error.h"

static td_status errfile_write(const char *message, bool replace)
{
    const char *path = getenv("TORCHELASTIC_ERROR_FILE");
    if (!path || !*path)
        return TD_OK;
    td_buf json = TD_BUF_INIT;
    buf_append_str(&json, "{\"message\": {\"message\": ");
    buf_put_json(&json, message);
    buf_append_str(&json, ", \"extraInfo\": {\"py_callstack\": ");
    buf_put_json(&json, message);
    buf_printf(&json, ", \"timestamp\": \"%lld\"}}}\n", (long long)time(NULL));
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (replace ? O_TRUNC : O_EXCL), 0644);
    td_status st = TD_OK;
    if (fd < 0) {
        st = (!replace && errno == EEXIST) ? TD_OK : error_errno(TD_ERR_IO, "writing the error file %s", path);
    } else {
        size_t off = 0;
        while (off < json.len) {
            ssize_t n = write(fd, json.data + off, json.len - off);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                st = error_errno(TD_ERR_IO, "writing the error file %s", path);
                break;
            }
            off += (size_t)n;
        }
        close(fd);
    }
    buf_free(&json);
    return st;
}

void errfile_record(const char *message)
{
    /* A failure to record must not replace the failure being recorded. */
    char *saved = alloc_strdup(td_last_error());
    char *type = error_type() ? alloc_strdup(error_type()) : NULL;
    (void)errfile_write(message, false);
    error_set_typed(TD_OK, type, saved);
    free(saved);
    free(type);
}

td_status td_record_error(const char *fmt, ...)
{
    if (!fmt)
        return error_fmt(TD_ERR_INVALID, "td_record_error: fmt is NULL");
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    if (vasprintf(&msg, fmt, ap) < 0)
        msg = NULL;
    va_end(ap);
    if (!msg)
        return error_fmt(TD_ERR_NOMEM, "td_record_error: formatting the message failed");
    td_status st = errfile_write(msg, true);
    free(msg);
    return st;
}
