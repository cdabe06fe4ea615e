/* Internal interfaces between the parts of the test harness (src/testing).
 *
 *   entry.c       the command line (td_test_main): CTest listing, running selected cases, ranks
 *   supervisor.c  the parent side: spawn ranks, poll, time out, reap, verdict (td_test_run)
 *   child.c       the rank side: run a body, report a failure or skip, check for leaks
 *   thread_ranks.c ranks as threads of one child process
 *   cases.c       case registry, skip table, the harness's log lines (both sides use it)
 *   ctl.c         the control-channel frames between parent and rank, and a rank's failed exit
 *   subtests.c    td_test_run_subtests (c10d's run_subtests) and the running combination's label
 *
 * Calls go down this list's dependency order: entry.c uses supervisor.c and child.c, child.c uses
 * thread_ranks.c, and all of them use cases.c, ctl.c and the helpers below.
 *   stacks.c      fatal-signal backtraces and the all-thread stack dump for hung ranks
 *   symbols.c     address -> function name from the loaded objects' ELF symbol tables
 *   leaks.c       fd and thread snapshots before / after a body
 *   pyfmt.c       Python-compatible number formatting for the verdict texts */
#ifndef TDIST_TESTING_HARNESS_H
#define TDIST_TESTING_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <tdist/testing.h>

#include "base/buf.h"

/* ---- control channel (docs/protocols.md, "Test harness control channel") ------------------- */

/* Frame: u32 payload length (little-endian), u8 type, payload bytes. */
enum {
    TD_CTL_GET_TRACEBACK = 1, /* parent -> rank: send the stacks of all your threads */
    TD_CTL_TRACEBACK = 2,     /* rank -> parent: text of the stacks */
    TD_CTL_ERROR = 3,         /* rank -> parent: the failure message, sent before exit code 10 */
    TD_CTL_PENDING = 4,       /* threaded rank -> parent: space-separated thread ranks still running */
    TD_CTL_CASE_DONE = 5,     /* suite rank -> parent: u32 (LE) index of the case it just passed */
    TD_CTL_CASE_ACK = 6,      /* parent -> suite rank: the report was read (the output before it too) */
};
#define TD_CTL_HEADER 5u
#define TD_CTL_MAX_PAYLOAD (64u << 20) /* a larger length is a protocol error */

/* Writes one whole frame on a blocking fd (retrying short writes and EINTR); serialized by a lock
 * so that frames from different threads never interleave. */
td_status ctl_send(int fd, uint8_t type, const void *data, size_t len);
/* Reads one whole frame from a blocking fd into *payload (cleared first); TD_ERR_CLOSED at EOF. */
td_status ctl_recv(int fd, uint8_t *type, td_buf *payload);
/* Parses the frames buffered in *in: calls on_frame for each complete one and consumes it.
 * Returns TD_ERR_INVALID (with a message) for a length above TD_CTL_MAX_PAYLOAD. */
td_status ctl_parse(td_buf *in, void (*on_frame)(void *arg, uint8_t type, const char *data, size_t len),
                       void *arg);

/* ---- registry (cases.c) ------------------------------------------------------------------- */

/* The registered cases, in registration order (linked by next). */
td_test_case *harness_cases(void);
/* Calls fn for each instance of c: ("", 0) for a plain case, else each parameter. */
void harness_for_each_param(const td_test_case *c, void (*fn)(void *, const td_test_case *, const char *, size_t),
                            void *arg);
/* "case" or "case/param" (a new string). */
char *harness_instance_name(const td_test_case *c, const char *param, size_t plen);

/* The registered case and parameter for an instance name ("case" or "case/param"); false when
 * none matches. *param points into the case's params or is "" (copy it: *param_len bytes). */
bool harness_find(const char *name, td_test_case **c, const char **param, size_t *param_len);
/* The case's per-test timeout in milliseconds (case, TDIST_TEST_TIMEOUT, 300 s). */
int64_t harness_timeout_ms(const td_test_case *c);
int harness_world_size(const td_test_case *c);
/* "<dir>/store" and "file://<dir>/store", the FileStore rendezvous of a test dir (new strings). */
char *harness_store_path(const char *dir);

/* The registered suite of that name (setup and teardown), or NULL. */
const td_test_suite *harness_find_suite(const char *name);

/* A selected instance of a case. */
typedef struct harness_instance {
    td_test_case *c;
    const char *name;  /* "case" or "case/param" */
    const char *param; /* "" when none */
} harness_instance;

/* How many instances from list[0] share one spawn: consecutive cases of the same suite and world
 * size (1 for a case without a suite). */
int harness_batch_len(const harness_instance *list, int n);
/* Runs one batch (harness_batch_len) under the supervisor: one result per instance. */
void harness_supervise(const harness_instance *list, int n, td_test_result *results);
/* True when TDIST_TEST_SANDCASTLE says skips pass. */
bool harness_sandcastle(void);
/* One harness log line: to stderr and, when log is not NULL, appended to it. */
void harness_log(td_buf *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A routine line (process started, listener started): appended to log, and printed to stderr only
 * with TDIST_TEST_VERBOSE=1. */
void harness_note(td_buf *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- child side --------------------------------------------------------------------------- */

typedef struct td_harness_child_args {
    const char *name; /* instance name, "case" or "case/param" */
    int rank;
    int world_size;
    const char *dir;
    int ctl_fd; /* -1: started by an external launcher (--td-external), no supervisor */
    const char *suite_cases; /* a suite's batch: its instance names, comma-separated (NULL: name) */
} td_harness_child_args;

/* The whole life of a rank process (or of the threaded child); returns main's exit code. */
int harness_child_main(const td_harness_child_args *a);
/* Threaded mode: runs c's world_size threads in this process and reports per c10d's threaded
 * decision table; returns main's exit code (or never returns, on failure or skip). */
int harness_threaded_main(td_test_case *c, const td_test_ctx *proto, int ctl_fd);

/* The rank's end of the control channel (ctl.c), shared by child.c and thread_ranks.c: child.c attaches
 * the rank and its channel (fd -1 under an external launcher) before running a case. */
void harness_ctl_attach(int rank, int fd);
int harness_ctl_fd(void);
/* Ends the process with a failure: logs, sends the message on the control channel, _exit(10). */
void harness_fail_process(const char *message) __attribute__((noreturn));
/* Threaded mode hooks, set by thread_ranks.c: return only when the calling thread is not a rank. */
void harness_threaded_fail(char *message); /* takes message when it does not return */
void harness_threaded_skip(int code, const char *reason);
bool harness_threaded_aborted(void);
void harness_threaded_add_hook(void (*fn)(void *), void *arg);
void harness_threaded_remove_hook(void (*fn)(void *), void *arg);
/* Appends "ranks still running" for a traceback request in threaded mode; false in process mode. */
bool harness_threaded_pending(td_buf *out);

/* ---- subtests (subtests.c) ----------------------------------------------------------------- */

/* The label of the subtest the calling thread is running ("dtype=f32, size=4"), NULL outside one. */
const char *harness_subtest_label(void);

/* ---- leak checks ------------------------------------------------------------------------- */

typedef struct td_leak_snapshot {
    int *fds;
    size_t nfds;
    pid_t *tids;
    size_t ntids;
} td_leak_snapshot;

void leak_snapshot_take(td_leak_snapshot *s);
/* How long the check waits for threads and fds being torn down: a tenth of the case's timeout,
 * between 0.2 and 2 seconds. */
int64_t leak_grace_ms(const td_test_case *c);
/* NULL when nothing leaked, else a message naming the fds (with their targets) and threads; waits
 * up to grace_ms for threads and fds that are being closed. */
char *leak_check(const td_leak_snapshot *before, int64_t grace_ms);
void leak_snapshot_free(td_leak_snapshot *s);

/* ---- stacks and symbols ------------------------------------------------------------------ */

/* Loads the symbol tables of the loaded objects (after this, td_symbols_format is async-signal
 * safe). Idempotent. */
void symbols_init(void);
/* " in func+0x1c (/path/obj)" for addr, written into out (always NUL-terminated); signal safe. */
void symbols_describe(uintptr_t addr, char *out, size_t size);

/* Installs the fatal-signal backtrace handlers and the stack-dump signal handler. */
void stacks_install(int rank, bool threaded);
/* Appends the stacks of every thread of this process except the caller (with names, rank
 * breadcrumbs and the current step), as for a hung rank. */
void stacks_dump_all(td_buf *out);
/* The rank shown with the calling thread's stack (threaded mode: each rank thread). */
void stacks_set_thread_rank(int rank);
/* Appends the calling thread's stack, skipping `skip` innermost frames. */
void stacks_dump_self(td_buf *out, int skip);

/* ---- formatting -------------------------------------------------------------------------- */

/* A double as Python's repr() prints it ("2.0", "0.5012345", "1e-05"). */
void pyfmt_float(double v, char *out, size_t size);
/* A timeout in seconds as the harness prints it: "2" for whole seconds, else the float repr. */
void pyfmt_seconds_ms(int64_t ms, char *out, size_t size);

#endif
