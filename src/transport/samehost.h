/* The same-host layer: what the ranks of one host share and the primitives over it, written once
 * for everything that moves data between processes of one host: the shm transport's rings
 * (shm.c), the shm backend's direct collectives (backends/shm), the tcp transport's single-copy
 * path (tcp.c), and next RPC.
 *
 *   abstract UNIX-domain sockets   how processes of one host find each other (nothing in the file
 *                                  system, gone with their owner) and pass segments as fds
 *   doorbells                      a futex word in shared memory that a process sleeps on and its
 *                                  peers ring, only when someone sleeps there
 *   spinning                       how long a waiter polls before it sleeps, adapted to what
 *                                  spinning has been worth
 *   the segment set                the shared segments (tensor/segment.h) of the ranks of a host,
 *                                  with two pairs of slots and an arrival counter per rank: the
 *                                  memory that the direct collectives read and write
 *   writes a peer will read        copies through the caches or around them, whichever the
 *                                  placement of the two CPUs makes cheaper, measured as it runs
 *   single-copy reads              process_vm_readv straight from a peer's memory (the tcp
 *                                  transport's large messages, RPC's large payload parts)
 *   shared copies                  such a copy done by both processes at once, the writer
 *                                  writing chunks into the reader while the reader reads others
 *
 * Whoever owns the segments (today the shm transport, which creates, exchanges and watches them)
 * fills a samehost_set and hands it out through td_transport.samehost; the users of the set need
 * nothing else of the owner. */
#ifndef TDIST_TRANSPORT_SAMEHOST_H
#define TDIST_TRANSPORT_SAMEHOST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <tdist/status.h>

#include "transport/transport.h"

#define SAMEHOST_LINE 64

/* ---- abstract UNIX-domain sockets --------------------------------------------------------------- */

/* The abstract address of name (cut to fit). */
socklen_t samehost_unix_addr(const char *name, struct sockaddr_un *a);
/* A non-blocking listening socket on name, or -1 with errno. */
int samehost_unix_listen(const char *name, int backlog);
/* A blocking connection to name, or -1 with errno: a listening UNIX socket accepts at once or
 * refuses, so the connect never waits on a network. */
int samehost_unix_connect(const char *name);

/* A segment travels between processes as its fd on such a socket (SCM_RIGHTS). */
/* Sends len bytes in one message, with fd attached when fd >= 0, without blocking. Returns what
 * sendmsg returns (errno set when negative). */
ssize_t samehost_send_fd(int sock, const void *buf, size_t len, int fd);
/* Receives up to len bytes without blocking. The first fd that comes goes into *fd when that is
 * -1; any other is closed and sets *extra, as does a cut control message. Returns what recvmsg
 * returns (errno set when negative; fds are looked at only when it is positive). */
ssize_t samehost_recv_fd(int sock, void *buf, size_t len, int *fd, bool *extra);

/* Whether the process at the other end of UNIX-domain socket sock runs as this process's effective
 * uid, as the kernel recorded it when the connection was made (SO_PEERCRED). Memory is shared
 * only within one user: an abstract socket admits any local process, and a segment's fd hands
 * over all of it. *uid and *pid get the peer's ((uid_t)-1 and 0 when the kernel cannot say,
 * which counts as another user). */
bool samehost_peer_same_user(int sock, uid_t *uid, pid_t *pid);

/* ---- doorbells ---------------------------------------------------------------------------------
 * A process's doorbell: the futex word its sleeping threads wait on, and who sleeps. Waiting
 * threads (a poller, a direct collective) wait for bit SAMEHOST_BELL_WAITER; the owner's own
 * progress thread for SAMEHOST_BELL_IO. Writers ring only the bits of someone registered, so a
 * process that nobody waits on costs its peers no system call. */
typedef struct samehost_bell {
    _Alignas(SAMEHOST_LINE) _Atomic uint32_t seq;
    _Atomic uint32_t sleepers;      /* waiting threads asleep (or about to be) */
    _Atomic uint32_t io_registered; /* the progress thread wants wake-ups */
} samehost_bell;

enum { SAMEHOST_BELL_WAITER = 1, SAMEHOST_BELL_IO = 2, SAMEHOST_BELL_ALL = 3 };

/* Sleeps while *word == val, until the deadline (CLOCK_MONOTONIC ns, TD_DEADLINE_NONE: none) or a
 * wake of one of bits. The word may be shared with other processes. */
void samehost_futex_wait(_Atomic uint32_t *word, uint32_t val, int64_t deadline_ns, uint32_t bits);
/* Rings b for bits, whether or not anyone sleeps. */
void samehost_bell_ring(samehost_bell *b, uint32_t bits);
/* After publishing something b's owner may wait for: rings the bits of mask whose waiters are
 * registered. */
void samehost_bell_notify(samehost_bell *b, uint32_t mask);
/* A waiter's sleep on its own doorbell b, without losing a wake-up: registers as a sleeper, reads
 * the bell, looks once more (ready(ctx): whether what it waits for came meanwhile) and only if
 * not sleeps until a ring or the deadline; then unregisters. Returns whether it slept. */
bool samehost_bell_sleep(samehost_bell *b, bool (*ready)(void *ctx), void *ctx, int64_t deadline_ns);

/* ---- spinning ----------------------------------------------------------------------------------
 * A waiter polls for up to spin_ns (TDIST_SHM_SPIN_US), yielding the core when the ranks outnumber
 * the cores, then sleeps on its doorbell. The budget shrinks for exponentially more waits after
 * spins that ended in long sleeps (the peer is away computing, or shares the core). Its counters
 * are touched by whichever thread waits. */
typedef struct samehost_spin {
    int64_t spin_ns;
    _Atomic int skip, skip_next;
    bool oversubscribed; /* more ranks on this host than cores for them */
} samehost_spin;

/* The cores this process may run on (its affinity mask). */
int samehost_cpus_available(void);

/* From TDIST_SHM_SPIN_US and the cores this process may run on, for ranks processes of one host. */
td_status samehost_spin_init(samehost_spin *s, int ranks);
/* The spin budget of the next wait, in ns. */
int64_t samehost_spin_budget(samehost_spin *s);
/* How the wait that began at start_ns ended: slept or not. */
void samehost_spin_result(samehost_spin *s, bool slept, int64_t start_ns);
/* One step of a spin that has lasted spun_ns. */
void samehost_spin_pause(const samehost_spin *s, int64_t spun_ns);

/* ---- the segment set ---------------------------------------------------------------------------
 * A direct collective is a sequence of epochs, numbered the same on every rank
 * (samehost_next_epoch). In epoch e a rank (1) waits until every peer arrived at e-1, which means
 * that they are done reading what anyone wrote at e-2; (2) writes its contribution into its slots
 * of parity e % 2; (3) arrives at e; (4) waits for the peers it reads from to arrive at e and reads
 * their slots of parity e % 2. Each arrival carries a description of the operation, which the
 * waiter compares with its own, so ranks that disagree about a collective fail instead of mixing
 * their data. */

/* A rank's arrival counter, with a description of the operation per epoch parity (entry e % 2
 * holds epoch e's), all in one cache line that the peers poll. Lives in the rank's segment.
 * A rank that writes no slots in an epoch does not wait before it arrives, so it can be two
 * epochs ahead of a peer that is still reading its entry: entries are written and read like a
 * seqlock (desc_epoch cleared first and set last), and a reader that saw the entry change under
 * it does not compare it. */
typedef struct samehost_arrival {
    _Alignas(SAMEHOST_LINE) _Atomic uint64_t epoch;
    _Atomic uint64_t desc_epoch[2];
    _Atomic uint64_t what[2];
    _Atomic uint64_t count[2];
    _Atomic uint64_t writes_plan; /* rank 0's samehost_writes plan: period << 1 | around */
} samehost_arrival;

typedef struct samehost_desc {
    uint64_t what;  /* the caller's encoding of what runs (kind, dtype, reduce op, root) */
    uint64_t count; /* elements */
    uint64_t seq;   /* the collective's number, for the mismatch message (0: none); not compared */
    /* Names an operation given by (what, count) for the mismatch message: "all_reduce of 8
     * float32 elements". Not compared, not shared. */
    void (*describe)(uint64_t what, uint64_t count, char *out, size_t size);
} samehost_desc;

/* What of rank r's segment this process sees (mapped here). */
typedef struct samehost_member {
    samehost_bell *bell;
    samehost_arrival *arrival;
    char *small, *large;       /* two small and two large slots, 64-byte aligned */
    const _Atomic bool *gone;  /* it left in order (NULL: never, this rank) */
} samehost_member;

/* The owner's side of failure: the set's waits end when the owner has failed, and a wait that
 * fails makes the owner fail (so that every rank learns of it). */
typedef struct samehost_owner {
    void *arg;
    const _Atomic int *failed; /* nonzero once the owner has failed (read without its lock) */
    /* The failure's status, with td_last_error() set to its message. */
    td_status (*failure)(void *arg);
    /* Fails the owner with (status, message). */
    void (*abort)(void *arg, td_status status, const char *message);
    /* A wait for rank missing at epoch e, started at start_ns, ended without it: the owner fails
     * (the peer left, or the deadline passed) and returns its failure. */
    td_status (*wait_failed)(void *arg, int missing, uint64_t e, int64_t deadline_ns, int64_t start_ns);
} samehost_owner;

/* ---- writes a peer will read -------------------------------------------------------------------
 * Data written into a slot is read next by another CPU. When the two CPUs share a cache, stores
 * through the cache are cheapest: the peer reads the lines from the shared cache. When the host has
 * put them apart (a virtual machine's two vCPUs on different core complexes: a cache line's round
 * trip between them takes 500 ns instead of 70-280), each such store first has to take the line
 * back from the peer's cache, and streaming stores that go around the caches make the same
 * all_reduce 1.3-1.7x faster, while they make it 1.7x slower on CPUs that share a cache
 * (docs/performance.md, "The 4-32 MiB sweep"). The placement changes while a job runs, so the ranks
 * measure: every rank numbers the tuned chunks alike and writes chunk j the way rank 0's plan says
 * (the cheaper way, and how often to take the other one to keep both figures current); rank 0
 * times its work on each chunk, waits left out (its writes, and its reads of what the others wrote
 * the same way, which is where streamed writes cost: the reader then finds the lines in memory,
 * not in a cache), per byte, and updates the plan. The plan is advice: a rank that reads an old
 * one writes a chunk the other way, which costs time and nothing else.
 * A figure is kept optimistic: a sample faster than it replaces it (nothing makes a chunk look
 * faster than its way can be), a slower one moves it only part of the way. A figure too low is
 * corrected at once, since the way it favours is then timed on every chunk; one too high would only
 * be corrected by the rare chunk that tries the other way. So the first figures are the better of
 * a few trials, taken by every rank on the same chunks. */
#define SAMEHOST_EXPLORE 16       /* take the other way for one chunk in this many ... */
#define SAMEHOST_EXPLORE_FAR 256  /* ... or in this many when it costs over 1.3x the chosen way */
#define SAMEHOST_TUNED_MIN ((size_t)256 << 10) /* smaller chunks always go through the caches */
#define SAMEHOST_WARM_UP 8 /* the first tuned chunks (first touches of the slots) go through them, untimed */
#define SAMEHOST_TRIALS 3  /* then each way this many times, alternating, through the caches first */
typedef struct samehost_writes {
    int forced;       /* TDIST_SHM_WRITES: -1 auto (measured), 0 through the caches, 1 around them */
    double cost[2];   /* rank 0: work ns per byte of a chunk through the caches [0], around them [1] */
    uint64_t chunks;  /* tuned chunks begun (the same count on every rank) */
    bool stream;      /* the current chunk's way */
    bool timed;       /* rank 0 learns from the current chunk: the caller times its work */
} samehost_writes;

typedef struct samehost_set samehost_set;
/* From TDIST_SHM_WRITES (auto, cached or around; a rank's own choice, not checked across ranks). */
td_status samehost_writes_init(samehost_writes *w);
/* Begins a chunk of bytes: whether its slot writes go around the caches. When it sets
 * set->writes.timed, the caller times its work on the chunk for samehost_writes_end. */
bool samehost_writes_begin(samehost_set *set, size_t bytes);
/* The timed chunk of bytes took ns of work (samehost_writes_begin to here, waits left out). */
void samehost_writes_end(samehost_set *set, size_t bytes, int64_t ns);
/* Copies n bytes to dst, around the caches when stream (then samehost_copy_done before anyone is
 * told that they are there). */
void samehost_copy(void *dst, const void *src, size_t n, bool stream);
/* Orders the streamed copies before the stores that follow (an arrival). */
void samehost_copy_done(bool stream);

struct samehost_set {
    int rank, size;
    const int *global_ranks;   /* size entries, for messages; NULL: the group ranks */
    size_t small_bytes, slot_bytes;
    samehost_member *members;  /* size entries; members[rank] is this process */
    uint64_t epoch;            /* the last epoch begun; every direct collective shares it */
    samehost_spin *spin;
    samehost_owner owner;
    samehost_writes writes;    /* how this rank writes its slots (one collective at a time) */
};

/* Rank r's (r may be this rank) small or large slot of parity e % 2. */
static inline char *samehost_small(const samehost_set *set, int r, uint64_t e)
{
    return set->members[r].small + (e & 1) * set->small_bytes;
}
static inline char *samehost_slot(const samehost_set *set, int r, uint64_t e)
{
    return set->members[r].large + (e & 1) * set->slot_bytes;
}
static inline uint64_t samehost_next_epoch(samehost_set *set) { return ++set->epoch; }
/* Publishes this rank's arrival at epoch e (after its writes), waking peers that sleep. */
void samehost_arrive(samehost_set *set, uint64_t e, const samehost_desc *d);
/* Waits until peer r (or every peer, r = -1) arrived at e or later. d (may be NULL) is checked
 * against the peer's description of e. Fails, failing the owner, on a mismatch (TD_ERR_INVALID),
 * at the deadline (TD_ERR_TIMEOUT), when the owner fails (a peer died: TD_ERR_PEER_LOST), or when
 * r has left. */
td_status samehost_wait_arrival(samehost_set *set, int r, uint64_t e, const samehost_desc *d, int64_t deadline_ns);

/* ---- lanes -------------------------------------------------------------------------------------
 * A lane: a ring of variable-size messages from one writer to one reader of another process, in a
 * segment both map, for messages that should cost no system call. An entry is a 4-byte length, a
 * 4-byte kind (the user's; SAMEHOST_LANE_PAD is the lane's own filler at the ring's end) and the
 * bytes, padded to 8; an entry never wraps. head (bytes ever published) is the writer's, tail
 * (bytes ever consumed) the reader's; each side keeps its own copy and reads the other's as a
 * peer's word, never trusted: a reader refuses a head more than the ring ahead of its tail or an
 * entry that does not fit what was published (SAMEHOST_LANE_CORRUPT), a writer a tail beyond its
 * head. Serializing writers, and readers, is the user's (one lock per side). Wake-ups are the
 * user's too; the lane only carries the words a writer needs to decide whether to ring: the
 * reader's `asleep` (its last resort sleeps elsewhere and wants a ring) and `pollers` (threads
 * polling the lane now, so no ring is needed). A writer waiting for room waits on the user's
 * doorbell, which the reader rings after it consumed (samehost_bell_notify). */
#define SAMEHOST_LANE_BYTES ((size_t)64 << 10)
#define SAMEHOST_LANE_ENTRY 8u                               /* an entry's length and kind */
#define SAMEHOST_LANE_MAX (SAMEHOST_LANE_BYTES / 4)          /* the largest entry's bytes */
#define SAMEHOST_LANE_PAD UINT32_MAX
#define SAMEHOST_LANE_CORRUPT (-1)
typedef struct samehost_lane {
    _Alignas(SAMEHOST_LINE) _Atomic uint64_t head;
    _Alignas(SAMEHOST_LINE) _Atomic uint64_t tail;
    _Alignas(SAMEHOST_LINE) _Atomic uint32_t asleep, pollers;
    _Alignas(SAMEHOST_LINE) uint8_t ring[SAMEHOST_LANE_BYTES];
} samehost_lane;

/* The writer's side: its own head. */
typedef struct samehost_lane_writer {
    samehost_lane *lane;
    uint64_t head;
} samehost_lane_writer;

/* Room for an entry of n bytes (at most SAMEHOST_LANE_MAX) of kind: where to write them, or NULL
 * when the lane is full for now (*corrupt set when the reader's tail makes no sense). Nothing is
 * visible to the reader before samehost_lane_publish. */
void *samehost_lane_reserve(samehost_lane_writer *w, uint32_t kind, size_t n, bool *corrupt);
/* Publishes the entry reserved last; returns whether the reader wants a ring (asleep and no
 * poller), read after the publication with a full fence, so that a reader that goes to sleep after
 * it looks once more and sees the entry. */
bool samehost_lane_publish(samehost_lane_writer *w);

/* The reader's side: its own tail. */
typedef struct samehost_lane_reader {
    samehost_lane *lane;
    uint64_t tail;
    size_t span; /* of the entry samehost_lane_next returned (the ring's length word may change) */
} samehost_lane_reader;

/* The next entry: 1 with *kind, *data (inside the ring, to be copied out before consuming: the
 * writer may reuse it after) and *n set; 0 when none is published; SAMEHOST_LANE_CORRUPT. */
int samehost_lane_next(samehost_lane_reader *r, uint32_t *kind, const uint8_t **data, size_t *n);
/* Consumes the entry samehost_lane_next returned (publishes the tail). */
void samehost_lane_consume(samehost_lane_reader *r);
/* Whether an entry (or a corrupt head) is there, without reading it: from any thread, without
 * the readers' lock (it compares the published words). */
bool samehost_lane_ready(const samehost_lane_reader *r);

/* ---- single-copy reads ------------------------------------------------------------------------- */

#define SAMEHOST_READ_MAX_PIECES 4
/* Copies the n (at most SAMEHOST_READ_MAX_PIECES) pieces (addr, len) of process pid's memory,
 * x->total bytes in all, into x's buffers. Returns 0, or the errno of the failed read (EFAULT for
 * a short one). */
int samehost_read_into(pid_t pid, td_xfer *x, const uint64_t *addr, const uint64_t *len, int n);
/* Copies len bytes at addr in process pid's memory to dst. Returns 0, or the errno of the failed
 * read (EFAULT for a short one). */
int samehost_read_span(pid_t pid, void *dst, uint64_t addr, size_t len);
/* Whether the 8-byte word at addr in process pid reads as value (false, errno set, when it cannot
 * be read). */
bool samehost_word_is(pid_t pid, uint64_t addr, uint64_t value);
/* Copies len bytes at src into process pid's memory at addr (process_vm_writev). Returns 0, or the
 * errno of the failed write (EFAULT for a short one). */
int samehost_write_span(pid_t pid, uint64_t addr, const void *src, size_t len);

/* A pidfd for process pid (-1 when the kernel gives none), and whether the process it names has
 * ended, every thread of it (a pidfd reads as ready then). */
int samehost_pidfd_open(pid_t pid);
bool samehost_pidfd_ended(int pidfd);

/* ---- shared copies -----------------------------------------------------------------------------
 * A copy of spans of a writer process's memory into a reader's, which both processes do at once
 * when the writer would only wait for the reader otherwise (RPC's large payload parts: the sender
 * holds them until the peer has read them). The reader offers the copy (a job number both know,
 * and its destination); then both claim chunks of SAMEHOST_SHARE_CHUNK from one counter, the
 * reader reading its chunks with process_vm_readv, the writer writing its own with
 * process_vm_writev. Before the reader uses or lets the destination go it ends the offer: no more
 * claims, and it waits until every chunk the writer claimed is written, or the writer's process
 * has ended. A chunk the writer could not write the reader reads itself. Nothing the writer puts
 * in the share is trusted beyond that wait; nothing the reader puts there makes the writer touch
 * its own memory beyond its spans. */
#define SAMEHOST_SHARE_CHUNK (512u << 10)

typedef struct samehost_span {
    uint64_t offset; /* in the reader's destination */
    uint64_t addr;   /* in the writer's memory */
    uint64_t len;
} samehost_span;

typedef struct samehost_share {
    _Alignas(SAMEHOST_LINE) _Atomic uint64_t job; /* the job on offer (0: none), published last */
    _Atomic uint64_t dst;                         /* the reader's destination */
    _Atomic uint64_t failed;                      /* 1 + the first chunk the writer could not write */
    _Alignas(SAMEHOST_LINE) _Atomic uint64_t claimed; /* chunks claimed, by either side */
    _Alignas(SAMEHOST_LINE) _Atomic uint64_t written; /* chunks the writer is done with */
} samehost_share;

/* The chunks of a copy of the spans s[0..n). */
uint64_t samehost_share_chunks(const samehost_span *s, int n);

/* Reader: offers job (non-zero, different from the last) into dst. */
void samehost_share_offer(samehost_share *sh, uint64_t job, void *dst);
/* Reader, after offering: reads chunks from process pid until none is left, ends the offer and
 * waits for the writer's chunks (pidfd, the writer's: its end ends the wait), then reads any the
 * writer could not write. Returns 0; the errno of a failed read (the destination may be let go);
 * or ETIMEDOUT when the writer still held a chunk at stall_deadline_ns (the destination must then
 * never be used or let go: the writer may still write into it). *by_writer: the chunks the writer
 * wrote. */
int samehost_share_read(samehost_share *sh, pid_t pid, int pidfd, void *dst, const samehost_span *s, int n,
                        int64_t stall_deadline_ns, uint64_t *by_writer);
/* Writer: whether the reader offers job. */
bool samehost_share_offered(const samehost_share *sh, uint64_t job);
/* Writer, when job is on offer: writes chunks into process pid until none is left to claim.
 * Returns the chunks it wrote. */
uint64_t samehost_share_write(samehost_share *sh, uint64_t job, pid_t pid, const samehost_span *s, int n);

#endif
