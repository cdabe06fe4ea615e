/* Stacks of a rank: on a fatal signal, and of every thread when the parent says a rank hung.
 *
 * The Python harness uses faulthandler for both. Here:
 *  - a fatal signal (SEGV, BUS, ILL, FPE, ABRT) prints the faulting thread's backtrace to stderr,
 *    then re-raises with the default action so that the parent sees the signal (-11 etc.);
 *  - for a hung rank, the listener thread sends a real-time signal to each thread of the process
 *    (tgkill, from /proc/self/task); each thread's handler records its own backtrace() into a slot,
 *    and the listener formats the slots with function names (symbols.c), thread names, and the
 *    step the thread last recorded with td_test_breadcrumb().
 * Handlers use only async-signal-safe calls; backtrace() is called once at install time so that it
 * loads libgcc_s outside any handler. */
#include <dirent.h>
#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/thread.h"
#include "testing/harness.h"

#define MAX_FRAMES 64
#define MAX_SLOTS 256
#define CRUMB_LEN 256

typedef struct dump_slot {
    atomic_int tid;
    atomic_int done;
    int nframes;
    int rank;
    void *frames[MAX_FRAMES];
    char crumb[CRUMB_LEN];
} dump_slot;

/* Two buffers so that the signal handler never reads the one being written. */
typedef struct crumb_state {
    char text[2][CRUMB_LEN];
    atomic_int active;
} crumb_state;

static dump_slot g_slots[MAX_SLOTS];
static pthread_mutex_t g_dump_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread crumb_state tl_crumb;
static __thread int tl_rank = -1;
static int g_rank = -1;
static char g_altstack[64 * 1024];

static pid_t my_tid(void) { return (pid_t)syscall(SYS_gettid); }

static int dump_signal(void) { return TD_STACK_DUMP_SIGNAL; }

void stacks_set_thread_rank(int rank) { tl_rank = rank; }

void td_test_breadcrumb(const char *fmt, ...)
{
    int next = 1 - atomic_load_explicit(&tl_crumb.active, memory_order_relaxed);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_crumb.text[next], CRUMB_LEN, fmt, ap);
    va_end(ap);
    atomic_store_explicit(&tl_crumb.active, next, memory_order_release);
}

static void on_dump_signal(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)si;
    (void)uc;
    int saved = errno;
    pid_t tid = my_tid();
    for (int i = 0; i < MAX_SLOTS; i++) {
        dump_slot *s = &g_slots[i];
        if (atomic_load(&s->tid) != tid || atomic_load(&s->done))
            continue;
        s->nframes = backtrace(s->frames, MAX_FRAMES);
        s->rank = tl_rank;
        memcpy(s->crumb, tl_crumb.text[atomic_load_explicit(&tl_crumb.active, memory_order_acquire)], CRUMB_LEN);
        s->crumb[CRUMB_LEN - 1] = '\0';
        atomic_store(&s->done, 1);
        break;
    }
    errno = saved;
}

/* ---- fatal signals -------------------------------------------------------------------------- */

static void put(const char *s) { (void)!write(STDERR_FILENO, s, strlen(s)); }

static void put_int(long v)
{
    char tmp[24];
    size_t n = sizeof tmp;
    tmp[--n] = '\0';
    bool neg = v < 0;
    unsigned long u = neg ? (unsigned long)-v : (unsigned long)v;
    do {
        tmp[--n] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (neg)
        tmp[--n] = '-';
    put(tmp + n);
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "signal";
    }
}

static void on_fatal(int sig, siginfo_t *si, void *uc)
{
    (void)si;
    (void)uc;
    put("Fatal signal ");
    put_int(sig);
    put(" (");
    put(signal_name(sig));
    put(") in rank ");
    put_int(tl_rank >= 0 ? tl_rank : g_rank);
    put(", pid ");
    put_int(getpid());
    put(", thread ");
    put_int(my_tid());
    put("; stack (most recent call first):\n");
    void *frames[MAX_FRAMES];
    int n = backtrace(frames, MAX_FRAMES);
    char line[512];
    for (int i = 1; i < n; i++) {
        symbols_describe((uintptr_t)frames[i] - (i > 1), line, sizeof line);
        put("  #");
        put_int(i - 1);
        put(line[0] ? line : " ?");
        put("\n");
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

void stacks_install(int rank, bool threaded)
{
    (void)threaded;
    g_rank = rank;
    void *warm[4];
    (void)backtrace(warm, 4);
    symbols_init();

    stack_t cur;
    if (sigaltstack(NULL, &cur) == 0 && (cur.ss_flags & SS_DISABLE)) {
        stack_t ss = {.ss_sp = g_altstack, .ss_size = sizeof g_altstack, .ss_flags = 0};
        sigaltstack(&ss, NULL);
    }
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (size_t i = 0; i < sizeof fatal / sizeof *fatal; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fatal;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(fatal[i], &sa, NULL);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_dump_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(dump_signal(), &sa, NULL);
}

/* ---- formatting ----------------------------------------------------------------------------- */

static void append_frames(td_buf *out, void *const *frames, int n, int skip)
{
    char line[512];
    for (int i = skip; i < n; i++) {
        /* A return address points after the call: look up the byte before it. */
        symbols_describe((uintptr_t)frames[i] - (i > 0), line, sizeof line);
        buf_printf(out, "    #%d %p%s\n", i - skip, frames[i], line);
    }
}

void stacks_dump_self(td_buf *out, int skip)
{
    symbols_init();
    void *frames[MAX_FRAMES];
    int n = backtrace(frames, MAX_FRAMES);
    append_frames(out, frames, n, skip + 1);
}

static bool read_small(const char *path, char *out, size_t size)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    size_t n = fread(out, 1, size - 1, f);
    fclose(f);
    out[n] = '\0';
    while (n > 0 && out[n - 1] == '\n')
        out[--n] = '\0';
    return true;
}

static bool blocks_signal(pid_t tid, int sig)
{
    char path[64], text[4096];
    snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tid);
    if (!read_small(path, text, sizeof text))
        return false;
    const char *p = strstr(text, "SigBlk:");
    if (!p)
        return false;
    unsigned long long mask = strtoull(p + 7, NULL, 16);
    return (mask >> (sig - 1)) & 1;
}

void stacks_dump_all(td_buf *out)
{
    symbols_init();
    /* One dump at a time shares the slots; a second caller does not wait for the first. */
    if (pthread_mutex_trylock(&g_dump_lock) != 0) {
        buf_printf(out, "(another stack dump is in progress)\n");
        return;
    }
    pid_t self = my_tid(), pid = getpid();
    pid_t tids[MAX_SLOTS];
    bool blocked[MAX_SLOTS];
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) && n < MAX_SLOTS) {
            pid_t t = (pid_t)atoi(e->d_name);
            if (t > 0 && t != self)
                tids[n++] = t;
        }
        closedir(d);
    }
    /* The main thread first, as faulthandler prints the current thread first. */
    for (int i = 1; i < n; i++)
        if (tids[i] == pid) {
            tids[i] = tids[0];
            tids[0] = pid;
        }
    int sig = dump_signal();
    for (int i = 0; i < n; i++) {
        atomic_store(&g_slots[i].done, 0);
        atomic_store(&g_slots[i].tid, tids[i]);
        blocked[i] = blocks_signal(tids[i], sig);
        if (!blocked[i] && syscall(SYS_tgkill, pid, tids[i], sig) != 0)
            blocked[i] = true; /* the thread is gone */
    }
    int64_t deadline = clock_now_ns() + 2000 * 1000000LL;
    for (;;) {
        bool all = true;
        for (int i = 0; i < n; i++)
            if (!blocked[i] && !atomic_load(&g_slots[i].done))
                all = false;
        if (all || clock_now_ns() >= deadline)
            break;
        clock_sleep_ms(2);
    }
    for (int i = 0; i < n; i++) {
        char path[64], name[64], stat[256] = "";
        thread_name_of(tids[i], name, sizeof name);
        snprintf(path, sizeof path, "/proc/self/task/%d/wchan", (int)tids[i]);
        read_small(path, stat, sizeof stat);
        dump_slot *s = &g_slots[i];
        bool done = !blocked[i] && atomic_load(&s->done);
        buf_printf(out, "Thread %d (%s)%s", (int)tids[i], name, tids[i] == pid ? " [main thread]" : "");
        if (done && s->rank >= 0)
            buf_printf(out, " [rank %d]", s->rank);
        buf_printf(out, " (most recent call first):\n");
        if (done) {
            if (s->crumb[0])
                buf_printf(out, "    last step: %s\n", s->crumb);
            /* frames 0 and 1 are the handler and the kernel's signal trampoline */
            append_frames(out, s->frames, s->nframes, 2);
        } else {
            buf_printf(out, "    (no stack: %s; kernel wait channel: %s)\n",
                          blocked[i] ? "the thread blocks the stack-dump signal or has exited"
                                     : "the thread did not answer within 2 seconds",
                          stat[0] ? stat : "?");
        }
        atomic_store(&s->tid, 0);
    }
    pthread_mutex_unlock(&g_dump_lock);
}
