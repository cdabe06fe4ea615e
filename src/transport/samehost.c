/* The same-host layer (samehost.h): abstract UNIX-domain sockets, fds passed over them and the
 * check that a peer on one runs as this user, doorbells on shared futex words, the spinning policy of waiters, the arrivals of the segment set
 * that the direct collectives run on, and single-copy reads from a peer's memory. Its users are
 * the shm transport, the shm backend's direct collectives and the tcp transport's local path; it
 * knows none of them. */
#include "transport/samehost.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <unistd.h>

#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "transport/match.h"

#define SPIN_MIN_NS 2000
#define PAUSE_NS 2000 /* spin without yielding this long (unless ranks outnumber cores) */

/* ---- abstract UNIX-domain sockets --------------------------------------------------------------- */

socklen_t samehost_unix_addr(const char *name, struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t len = strlen(name);
    if (len > sizeof a->sun_path - 2)
        len = sizeof a->sun_path - 2;
    memcpy(a->sun_path + 1, name, len); /* abstract: leading NUL, nothing in the file system */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

int samehost_unix_listen(const char *name, int backlog)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un a;
    socklen_t len = samehost_unix_addr(name, &a);
    if (bind(fd, (struct sockaddr *)&a, len) != 0 || listen(fd, backlog) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int samehost_unix_connect(const char *name)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un a;
    socklen_t len = samehost_unix_addr(name, &a);
    if (connect(fd, (struct sockaddr *)&a, len) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

ssize_t samehost_send_fd(int sock, const void *buf, size_t len, int fd)
{
    struct iovec iov = {(void *)buf, len};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } cm;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&cm, 0, sizeof cm);
        mh.msg_control = cm.buf;
        mh.msg_controllen = sizeof cm.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    return sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

ssize_t samehost_recv_fd(int sock, void *buf, size_t len, int *fd, bool *extra)
{
    struct iovec iov = {buf, len};
    union {
        char buf[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } cm;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof cm.buf};
    ssize_t n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n <= 0)
        return n;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfd = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int got;
            memcpy(&got, CMSG_DATA(h) + i * sizeof(int), sizeof got);
            if (*fd < 0 && !*extra) {
                *fd = got;
            } else {
                close(got);
                *extra = true;
            }
        }
    }
    if (mh.msg_flags & MSG_CTRUNC)
        *extra = true;
    return n;
}

bool samehost_peer_same_user(int sock, uid_t *uid, pid_t *pid)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) {
        *uid = (uid_t)-1;
        *pid = 0;
        return false;
    }
    *uid = cred.uid;
    *pid = cred.pid;
    return cred.uid == geteuid();
}

/* ---- doorbells ---------------------------------------------------------------------------------- */

void samehost_futex_wait(_Atomic uint32_t *word, uint32_t val, int64_t deadline_ns, uint32_t bits)
{
    struct timespec ts, *tsp = NULL;
    if (deadline_ns != TD_DEADLINE_NONE) {
        ts.tv_sec = deadline_ns / 1000000000;
        ts.tv_nsec = deadline_ns % 1000000000;
        tsp = &ts;
    }
    /* Not FUTEX_PRIVATE: the word is in memory shared with other processes. The timeout of
     * FUTEX_WAIT_BITSET is absolute, on CLOCK_MONOTONIC. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET, val, tsp, NULL, bits);
}

void samehost_bell_ring(samehost_bell *b, uint32_t bits)
{
    atomic_fetch_add(&b->seq, 1);
    syscall(SYS_futex, (uint32_t *)&b->seq, FUTEX_WAKE_BITSET, INT_MAX, NULL, NULL, bits);
}

void samehost_bell_notify(samehost_bell *b, uint32_t mask)
{
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t bits = 0;
    if ((mask & SAMEHOST_BELL_WAITER) && atomic_load_explicit(&b->sleepers, memory_order_relaxed))
        bits |= SAMEHOST_BELL_WAITER;
    if ((mask & SAMEHOST_BELL_IO) && atomic_load_explicit(&b->io_registered, memory_order_relaxed))
        bits |= SAMEHOST_BELL_IO;
    if (bits)
        samehost_bell_ring(b, bits);
}

bool samehost_bell_sleep(samehost_bell *b, bool (*ready)(void *ctx), void *ctx, int64_t deadline_ns)
{
    atomic_fetch_add(&b->sleepers, 1);
    uint32_t seq = atomic_load(&b->seq);
    bool sleep = !ready(ctx);
    if (sleep)
        samehost_futex_wait(&b->seq, seq, deadline_ns, SAMEHOST_BELL_WAITER);
    atomic_fetch_sub(&b->sleepers, 1);
    return sleep;
}

/* ---- spinning ----------------------------------------------------------------------------------- */

int samehost_cpus_available(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return (int)sysconf(_SC_NPROCESSORS_ONLN);
    return CPU_COUNT(&set);
}

td_status samehost_spin_init(samehost_spin *s, int ranks)
{
    int64_t spin_us = 20;
    TD_TRY(env_get_int("TDIST_SHM_SPIN_US", 20, 0, 1000000, &spin_us));
    s->spin_ns = spin_us * 1000;
    atomic_store(&s->skip, 0);
    atomic_store(&s->skip_next, 0);
    s->oversubscribed = ranks > samehost_cpus_available();
    return TD_OK;
}

int64_t samehost_spin_budget(samehost_spin *s)
{
    int skip = atomic_load_explicit(&s->skip, memory_order_relaxed);
    if (skip > 0) {
        atomic_store_explicit(&s->skip, skip - 1, memory_order_relaxed);
        return s->spin_ns < SPIN_MIN_NS ? s->spin_ns : SPIN_MIN_NS;
    }
    return s->spin_ns;
}

/* A sleep that ended soon after the spin gave up (within NEAR_MISS spin budgets, wake-up included)
 * was a near miss: the peer was only briefly held up (an interrupt, the host preempting its CPU),
 * and spinning a little longer would have saved the sleep and the peer's doorbell. When the ranks
 * have a core each, spinning takes nothing from them, so a near miss keeps the full budget;
 * otherwise a sleep of any length cuts it short for exponentially more waits. Without this, one
 * preemption can put both ranks of a ping-pong into a cycle of sleeps and doorbells, each wake-up
 * late enough for the other to miss its short spin (docs/performance.md). */
#define NEAR_MISS 10
void samehost_spin_result(samehost_spin *s, bool slept, int64_t start_ns)
{
    if (slept && !s->oversubscribed && clock_now_ns() - start_ns < NEAR_MISS * s->spin_ns)
        slept = false;
    if (!slept) {
        atomic_store_explicit(&s->skip_next, 0, memory_order_relaxed);
        return;
    }
    int next = atomic_load_explicit(&s->skip_next, memory_order_relaxed);
    next = next ? next * 2 : 1;
    if (next > 64)
        next = 64;
    atomic_store_explicit(&s->skip_next, next, memory_order_relaxed);
    atomic_store_explicit(&s->skip, next, memory_order_relaxed);
}

/* A pause while the peer is likely just about to answer, then the core is given up between polls
 * (another thread, maybe the peer, may need it). With more ranks than cores, yield from the
 * start. */
void samehost_spin_pause(const samehost_spin *s, int64_t spun_ns)
{
    if (s->oversubscribed || spun_ns > PAUSE_NS) {
        sched_yield();
        return;
    }
    for (int i = 0; i < 16; i++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
    }
}

/* ---- the segment set ---------------------------------------------------------------------------- */

static int set_grank(const samehost_set *set, int r) { return set->global_ranks ? set->global_ranks[r] : r; }

static bool member_gone(const samehost_set *set, int r)
{
    const _Atomic bool *gone = set->members[r].gone;
    return gone && atomic_load(gone);
}

static bool owner_failed(const samehost_set *set)
{
    return atomic_load_explicit(set->owner.failed, memory_order_acquire) != 0;
}

void samehost_arrive(samehost_set *set, uint64_t e, const samehost_desc *d)
{
    samehost_arrival *a = set->members[set->rank].arrival;
    int k = (int)(e & 1);
    atomic_store_explicit(&a->desc_epoch[k], 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&a->what[k], d ? d->what : 0, memory_order_relaxed);
    atomic_store_explicit(&a->count[k], d ? d->count : 0, memory_order_relaxed);
    atomic_store_explicit(&a->desc_epoch[k], e, memory_order_release);
    atomic_store_explicit(&a->epoch, e, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    for (int r = 0; r < set->size; r++) {
        samehost_bell *b = set->members[r].bell;
        if (r != set->rank && atomic_load_explicit(&b->sleepers, memory_order_relaxed))
            samehost_bell_ring(b, SAMEHOST_BELL_WAITER);
    }
}

/* 1: arrived (and described as d), 0: not yet, -1: failed (error set, owner failed). */
static int check_member(samehost_set *set, int r, uint64_t e, const samehost_desc *d)
{
    const samehost_arrival *a = set->members[r].arrival;
    uint64_t got = atomic_load_explicit(&a->epoch, memory_order_acquire);
    if (got < e)
        return 0;
    if (d) {
        int k = (int)(e & 1);
        uint64_t de = atomic_load_explicit(&a->desc_epoch[k], memory_order_acquire);
        uint64_t what = atomic_load_explicit(&a->what[k], memory_order_relaxed);
        uint64_t count = atomic_load_explicit(&a->count[k], memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        bool intact = atomic_load_explicit(&a->desc_epoch[k], memory_order_relaxed) == de;
        if (de == e && intact && (what != d->what || count != d->count)) {
            char mine[96], theirs[96], msg[TD_XFER_ERROR_MAX + 64];
            d->describe(d->what, d->count, mine, sizeof mine);
            d->describe(what, count, theirs, sizeof theirs);
            td_coll_mismatch_format(msg, sizeof msg, d->seq, set_grank(set, set->rank), mine, set_grank(set, r),
                                    theirs);
            set->owner.abort(set->owner.arg, TD_ERR_INVALID, msg);
            error_set(TD_ERR_INVALID, msg);
            return -1;
        }
    }
    return 1;
}

/* 1 when every awaited member arrived, 0 not yet, -1 failed. *missing: one that has not. */
static int check_arrivals(samehost_set *set, int r, uint64_t e, const samehost_desc *d, int *missing)
{
    if (r >= 0)
        return (*missing = r), check_member(set, r, e, d);
    int result = 1;
    for (int q = 0; q < set->size; q++) {
        if (q == set->rank)
            continue;
        int c = check_member(set, q, e, d);
        if (c < 0)
            return -1;
        if (c == 0) {
            *missing = q;
            result = 0;
            if (!d)
                return 0;
        }
    }
    return result;
}

/* samehost_wait_arrival's last look before it sleeps. */
typedef struct arrival_wait {
    samehost_set *set;
    int r;
    uint64_t e;
    const samehost_desc *d;
    int *missing;
    int result; /* check_arrivals' */
} arrival_wait;

static bool arrival_ready(void *p)
{
    arrival_wait *w = p;
    w->result = check_arrivals(w->set, w->r, w->e, w->d, w->missing);
    return w->result != 0 || owner_failed(w->set) || member_gone(w->set, *w->missing);
}

td_status samehost_wait_arrival(samehost_set *set, int r, uint64_t e, const samehost_desc *d, int64_t deadline_ns)
{
    int missing = r;
    if (owner_failed(set))
        return set->owner.failure(set->owner.arg);
    int c = check_arrivals(set, r, e, d, &missing);
    if (c != 0)
        return c > 0 ? TD_OK : TD_ERR_INVALID;
    samehost_bell *bell = set->members[set->rank].bell;
    int64_t start = clock_now_ns();
    int64_t spin_end = start + samehost_spin_budget(set->spin);
    bool slept = false;
    for (;;) {
        if (owner_failed(set) || member_gone(set, missing) || deadline_passed(deadline_ns))
            break;
        int64_t now = clock_now_ns();
        if (now < spin_end) {
            samehost_spin_pause(set->spin, now - start);
        } else {
            arrival_wait w = {set, r, e, d, &missing, 0};
            slept |= samehost_bell_sleep(bell, arrival_ready, &w, deadline_ns);
            if (w.result < 0)
                return TD_ERR_INVALID;
        }
        c = check_arrivals(set, r, e, d, &missing);
        if (c != 0) {
            samehost_spin_result(set->spin, slept, start);
            return c > 0 ? TD_OK : TD_ERR_INVALID;
        }
    }
    /* A peer that arrived before it left (or before the owner failed) still counts. */
    c = check_arrivals(set, r, e, d, &missing);
    if (c != 0)
        return c > 0 ? TD_OK : TD_ERR_INVALID;
    return set->owner.wait_failed(set->owner.arg, missing, e, deadline_ns, start);
}

/* ---- writes a peer will read -------------------------------------------------------------------- */

_Static_assert(sizeof(samehost_arrival) == SAMEHOST_LINE, "an arrival is one cache line");

td_status samehost_writes_init(samehost_writes *w)
{
    *w = (samehost_writes){.forced = -1};
    const char *v = env_get_str("TDIST_SHM_WRITES", NULL);
    if (!v || !strcmp(v, "auto"))
        return TD_OK;
    if (strcmp(v, "cached") != 0 && strcmp(v, "around") != 0)
        return error_fmt(TD_ERR_INVALID, "TDIST_SHM_WRITES must be auto, cached or around, got '%s'", v);
    w->forced = !strcmp(v, "around");
    return TD_OK;
}

bool samehost_writes_begin(samehost_set *set, size_t bytes)
{
    samehost_writes *w = &set->writes;
    w->timed = false;
    if (w->forced >= 0)
        return w->stream = w->forced;
    if (bytes < SAMEHOST_TUNED_MIN)
        return w->stream = false;
    uint64_t j = w->chunks++;
    if (j < SAMEHOST_WARM_UP)
        return w->stream = false;
    w->timed = set->rank == 0;
    if (j < SAMEHOST_WARM_UP + 2 * SAMEHOST_TRIALS)
        return w->stream = (j - SAMEHOST_WARM_UP) & 1; /* the trials, on every rank alike */
    uint64_t plan = atomic_load_explicit(&set->members[0].arrival->writes_plan, memory_order_relaxed);
    uint64_t period = plan >> 1;
    bool best = plan & 1;
    w->stream = period && j % period == period - 1 ? !best : best;
    return w->stream;
}

/* Rank 0: each way's cost per byte, and the plan that follows from them. A slow sample moves the
 * figure a quarter of the way and at most to twice what it was (a chunk during which a rank lost
 * its CPU should not condemn its way for long); a fast one replaces it (samehost.h says why). */
void samehost_writes_end(samehost_set *set, size_t bytes, int64_t ns)
{
    samehost_writes *w = &set->writes;
    if (!w->timed || ns <= 0)
        return;
    double c = (double)ns / (double)bytes, *avg = &w->cost[w->stream];
    if (*avg == 0 || c < *avg)
        *avg = c;
    else
        *avg += ((c > 2 * *avg ? 2 * *avg : c) - *avg) * 0.25;
    if (w->cost[0] == 0 || w->cost[1] == 0)
        return;
    bool best = w->cost[1] < w->cost[0];
    double ratio = best ? w->cost[0] / w->cost[1] : w->cost[1] / w->cost[0];
    uint64_t period = ratio > 1.3 ? SAMEHOST_EXPLORE_FAR : SAMEHOST_EXPLORE;
    atomic_store_explicit(&set->members[0].arrival->writes_plan, period << 1 | best, memory_order_relaxed);
}

void samehost_copy(void *dst, const void *src, size_t n, bool stream)
{
#if defined(__SSE2__)
    if (stream && n >= 256) {
        char *d = dst;
        const char *p = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, p, head);
        d += head;
        p += head;
        n -= head;
        size_t body = n & ~(size_t)63;
        for (size_t i = 0; i < body; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(p + i)), b = _mm_loadu_si128((const __m128i *)(p + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(p + i + 32)), e = _mm_loadu_si128((const __m128i *)(p + i + 48));
            _mm_stream_si128((__m128i *)(d + i), a);
            _mm_stream_si128((__m128i *)(d + i + 16), b);
            _mm_stream_si128((__m128i *)(d + i + 32), c);
            _mm_stream_si128((__m128i *)(d + i + 48), e);
        }
        memcpy(d + body, p + body, n - body);
        return;
    }
#endif
    (void)stream;
    memcpy(dst, src, n);
}

void samehost_copy_done(bool stream)
{
#if defined(__SSE2__)
    if (stream)
        _mm_sfence();
#endif
    (void)stream;
}

/* ---- single-copy reads -------------------------------------------------------------------------- */

/* One process_vm_readv, retried on EINTR: the bytes it read, or 0 with *err the errno of a failed
 * read (EFAULT for a read of nothing). */
static size_t read_some(pid_t pid, const struct iovec *local, int nlocal, const struct iovec *remote, int nremote,
                        int *err)
{
    ssize_t got;
    do
        got = process_vm_readv(pid, local, (unsigned long)nlocal, remote, (unsigned long)nremote, 0);
    while (got < 0 && errno == EINTR);
    *err = got < 0 ? errno : got == 0 ? EFAULT : 0;
    return got > 0 ? (size_t)got : 0;
}

int samehost_read_into(pid_t pid, td_xfer *x, const uint64_t *addr, const uint64_t *len, int n)
{
    size_t total = x->total, done_bytes = 0;
    while (done_bytes < total) {
        struct iovec local[TD_XFER_MAX_IOV], remote[SAMEHOST_READ_MAX_PIECES];
        int local_count = xfer_iov_from(x, done_bytes, total - done_bytes, local, TD_XFER_MAX_IOV);
        int remote_count = 0;
        size_t skip = done_bytes;
        for (int i = 0; i < n; i++) {
            if (skip >= len[i]) {
                skip -= len[i];
                continue;
            }
            remote[remote_count].iov_base = (void *)(uintptr_t)(addr[i] + skip);
            remote[remote_count].iov_len = len[i] - skip;
            remote_count++;
            skip = 0;
        }
        int err;
        size_t got = read_some(pid, local, local_count, remote, remote_count, &err);
        if (err)
            return err;
        done_bytes += got;
    }
    return 0;
}

int samehost_read_span(pid_t pid, void *dst, uint64_t addr, size_t len)
{
    size_t done_bytes = 0;
    while (done_bytes < len) {
        struct iovec local = {(char *)dst + done_bytes, len - done_bytes};
        struct iovec remote = {(void *)(uintptr_t)(addr + done_bytes), len - done_bytes};
        int err;
        done_bytes += read_some(pid, &local, 1, &remote, 1, &err);
        if (err)
            return err;
    }
    return 0;
}

bool samehost_word_is(pid_t pid, uint64_t addr, uint64_t value)
{
    uint64_t got = 0;
    struct iovec local = {&got, sizeof got}, remote = {(void *)(uintptr_t)addr, sizeof got};
    return process_vm_readv(pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof got && got == value;
}

static size_t write_some(pid_t pid, const struct iovec *local, const struct iovec *remote, int *err)
{
    ssize_t put;
    do
        put = process_vm_writev(pid, local, 1, remote, 1, 0);
    while (put < 0 && errno == EINTR);
    *err = put < 0 ? errno : put == 0 ? EFAULT : 0;
    return put > 0 ? (size_t)put : 0;
}

int samehost_write_span(pid_t pid, uint64_t addr, const void *src, size_t len)
{
    size_t done_bytes = 0;
    while (done_bytes < len) {
        struct iovec local = {(char *)(uintptr_t)src + done_bytes, len - done_bytes};
        struct iovec remote = {(void *)(uintptr_t)(addr + done_bytes), len - done_bytes};
        int err;
        done_bytes += write_some(pid, &local, &remote, &err);
        if (err)
            return err;
    }
    return 0;
}

int samehost_pidfd_open(pid_t pid)
{
#ifdef SYS_pidfd_open
    return pid > 0 ? (int)syscall(SYS_pidfd_open, pid, 0) : -1;
#else
    (void)pid;
    return -1;
#endif
}

bool samehost_pidfd_ended(int pidfd)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return pidfd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL));
}

/* ---- shared copies ------------------------------------------------------------------------------ */

/* The reader ends an offer by swapping this into claimed: every later claim is past the end. */
#define SHARE_CLOSED (UINT64_C(1) << 62)
#define SHARE_CHECK_NS 1000000 /* how often a reader waiting for the writer's chunks looks at its pidfd */

static uint64_t span_chunks(const samehost_span *s) { return (s->len + SAMEHOST_SHARE_CHUNK - 1) / SAMEHOST_SHARE_CHUNK; }

uint64_t samehost_share_chunks(const samehost_span *s, int n)
{
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        total += span_chunks(&s[i]);
    return total;
}

/* Chunk k of the copy of s[0..n): the span's chunks in order, each SAMEHOST_SHARE_CHUNK bytes but
 * a span's last. */
static samehost_span share_chunk(const samehost_span *s, int n, uint64_t k)
{
    for (int i = 0; i < n; i++) {
        uint64_t c = span_chunks(&s[i]);
        if (k < c) {
            uint64_t at = k * SAMEHOST_SHARE_CHUNK;
            uint64_t len = s[i].len - at < SAMEHOST_SHARE_CHUNK ? s[i].len - at : SAMEHOST_SHARE_CHUNK;
            return (samehost_span){s[i].offset + at, s[i].addr + at, len};
        }
        k -= c;
    }
    return (samehost_span){0, 0, 0};
}

void samehost_share_offer(samehost_share *sh, uint64_t job, void *dst)
{
    atomic_store_explicit(&sh->failed, 0, memory_order_relaxed);
    atomic_store_explicit(&sh->written, 0, memory_order_relaxed);
    atomic_store_explicit(&sh->claimed, 0, memory_order_relaxed);
    atomic_store_explicit(&sh->dst, (uint64_t)(uintptr_t)dst, memory_order_relaxed);
    atomic_store_explicit(&sh->job, job, memory_order_release);
}

bool samehost_share_offered(const samehost_share *sh, uint64_t job)
{
    return job != 0 && atomic_load_explicit(&sh->job, memory_order_acquire) == job;
}

int samehost_share_read(samehost_share *sh, pid_t pid, int pidfd, void *dst, const samehost_span *s, int n,
                        int64_t stall_deadline_ns, uint64_t *by_writer)
{
    uint64_t total = samehost_share_chunks(s, n), mine = 0;
    int err = 0;
    *by_writer = 0;
    for (;;) {
        uint64_t k = atomic_fetch_add(&sh->claimed, 1);
        if (k >= total)
            break;
        mine++;
        samehost_span c = share_chunk(s, n, k);
        err = samehost_read_span(pid, (char *)dst + c.offset, c.addr, (size_t)c.len);
        if (err)
            break;
    }
    /* The end of the offer: what the writer claimed before this it writes; nothing after. */
    uint64_t claimed = atomic_exchange(&sh->claimed, SHARE_CLOSED);
    claimed = claimed < total ? claimed : total;
    uint64_t theirs = claimed > mine ? claimed - mine : 0;
    /* The writer's last chunk is a copy of at most SAMEHOST_SHARE_CHUNK: the same-host spin (pause,
     * then yield) until it is written, looking at the writer's end now and then. */
    static const samehost_spin wait_spin = {.spin_ns = 0};
    int64_t start = clock_now_ns(), next_check = start + SHARE_CHECK_NS;
    bool ended = false;
    while (atomic_load_explicit(&sh->written, memory_order_acquire) < theirs) {
        int64_t now = clock_now_ns();
        samehost_spin_pause(&wait_spin, now - start);
        if (now < next_check)
            continue;
        next_check = now + SHARE_CHECK_NS;
        if (samehost_pidfd_ended(pidfd)) {
            ended = atomic_load_explicit(&sh->written, memory_order_acquire) < theirs;
            break;
        }
        if (now >= stall_deadline_ns)
            return ETIMEDOUT;
    }
    atomic_store_explicit(&sh->job, 0, memory_order_relaxed);
    uint64_t written = atomic_load_explicit(&sh->written, memory_order_relaxed);
    uint64_t failed = atomic_load_explicit(&sh->failed, memory_order_relaxed);
    *by_writer = written < theirs ? written : theirs;
    if (failed > 0 && *by_writer > 0)
        (*by_writer)--;
    if (err)
        return err;
    if (ended)
        return ESRCH;
    if (failed > 0) {
        if (failed > total)
            return EPROTO; /* nonsense from the writer */
        samehost_span c = share_chunk(s, n, failed - 1);
        return samehost_read_span(pid, (char *)dst + c.offset, c.addr, (size_t)c.len);
    }
    return 0;
}

uint64_t samehost_share_write(samehost_share *sh, uint64_t job, pid_t pid, const samehost_span *s, int n)
{
    if (!samehost_share_offered(sh, job))
        return 0;
    uint64_t total = samehost_share_chunks(s, n), wrote = 0;
    uint64_t dst = atomic_load_explicit(&sh->dst, memory_order_relaxed);
    for (;;) {
        uint64_t k = atomic_fetch_add(&sh->claimed, 1);
        if (k >= total)
            break;
        samehost_span c = share_chunk(s, n, k);
        int err = samehost_write_span(pid, dst + c.offset, (const void *)(uintptr_t)c.addr, (size_t)c.len);
        if (err) {
            uint64_t none = 0;
            atomic_compare_exchange_strong(&sh->failed, &none, k + 1);
            atomic_fetch_add_explicit(&sh->written, 1, memory_order_release);
            break;
        }
        wrote++;
        atomic_fetch_add_explicit(&sh->written, 1, memory_order_release);
    }
    return wrote;
}

/* ---- lanes ------------------------------------------------------------------------------------ */

static size_t lane_span(size_t n) { return SAMEHOST_LANE_ENTRY + ((n + 7) & ~(size_t)7); }

static void lane_word_put(uint8_t *at, uint32_t len, uint32_t kind)
{
    memcpy(at, &len, 4);
    memcpy(at + 4, &kind, 4);
}

void *samehost_lane_reserve(samehost_lane_writer *w, uint32_t kind, size_t n, bool *corrupt)
{
    *corrupt = false;
    if (n > SAMEHOST_LANE_MAX)
        return NULL;
    uint64_t tail = atomic_load_explicit(&w->lane->tail, memory_order_acquire);
    if (tail > w->head || w->head - tail > SAMEHOST_LANE_BYTES) {
        *corrupt = true;
        return NULL;
    }
    size_t at = (size_t)(w->head % SAMEHOST_LANE_BYTES), span = lane_span(n);
    size_t to_end = SAMEHOST_LANE_BYTES - at;
    size_t need = span <= to_end ? span : to_end + span; /* a filler to the end first */
    if (SAMEHOST_LANE_BYTES - (size_t)(w->head - tail) < need)
        return NULL;
    if (span > to_end) {
        lane_word_put(w->lane->ring + at, (uint32_t)(to_end - SAMEHOST_LANE_ENTRY), SAMEHOST_LANE_PAD);
        w->head += to_end;
        at = 0;
    }
    lane_word_put(w->lane->ring + at, (uint32_t)n, kind);
    w->head += span;
    return w->lane->ring + at + SAMEHOST_LANE_ENTRY;
}

bool samehost_lane_publish(samehost_lane_writer *w)
{
    atomic_store_explicit(&w->lane->head, w->head, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    return atomic_load_explicit(&w->lane->asleep, memory_order_relaxed) &&
           !atomic_load_explicit(&w->lane->pollers, memory_order_relaxed);
}

bool samehost_lane_ready(const samehost_lane_reader *r)
{
    /* The published tail, not the reader's copy: any thread may ask, without the reader's lock. */
    return atomic_load_explicit(&r->lane->head, memory_order_acquire) !=
           atomic_load_explicit(&r->lane->tail, memory_order_relaxed);
}

int samehost_lane_next(samehost_lane_reader *r, uint32_t *kind, const uint8_t **data, size_t *n)
{
    for (;;) {
        uint64_t head = atomic_load_explicit(&r->lane->head, memory_order_acquire);
        if (head == r->tail) {
            /* The published tail is the reader's word, but in the peer's reach: put it right. */
            if (atomic_load_explicit(&r->lane->tail, memory_order_relaxed) != r->tail)
                atomic_store_explicit(&r->lane->tail, r->tail, memory_order_release);
            return 0;
        }
        if (head < r->tail || head - r->tail > SAMEHOST_LANE_BYTES)
            return SAMEHOST_LANE_CORRUPT;
        size_t at = (size_t)(r->tail % SAMEHOST_LANE_BYTES);
        size_t avail = (size_t)(head - r->tail), to_end = SAMEHOST_LANE_BYTES - at;
        if (avail < SAMEHOST_LANE_ENTRY || to_end < SAMEHOST_LANE_ENTRY)
            return SAMEHOST_LANE_CORRUPT; /* entries are whole and 8-aligned */
        uint32_t len, k;
        memcpy(&len, r->lane->ring + at, 4);
        memcpy(&k, r->lane->ring + at + 4, 4);
        if (len > SAMEHOST_LANE_MAX && k != SAMEHOST_LANE_PAD)
            return SAMEHOST_LANE_CORRUPT;
        size_t span = lane_span(len);
        if (span > avail || span > to_end)
            return SAMEHOST_LANE_CORRUPT;
        if (k == SAMEHOST_LANE_PAD) {
            if (span != to_end)
                return SAMEHOST_LANE_CORRUPT;
            r->tail += span; /* the filler is the reader's to skip, published at once (see ready) */
            atomic_store_explicit(&r->lane->tail, r->tail, memory_order_release);
            continue;
        }
        *kind = k;
        *data = r->lane->ring + at + SAMEHOST_LANE_ENTRY;
        *n = len;
        r->span = span;
        return 1;
    }
}

void samehost_lane_consume(samehost_lane_reader *r)
{
    r->tail += r->span;
    r->span = 0;
    atomic_store_explicit(&r->lane->tail, r->tail, memory_order_release);
}
