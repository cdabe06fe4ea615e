/* Internal: the RPC agent's parts and how they share state (agent.c, channel.c, pool.c).
 *
 * An agent is one worker of an RPC world. It owns:
 *   - peers[world_size] (a dynamic group: RPC_DYNAMIC_MAX_ID slots, the members among them):
 *     each peer's worker info and its channel (one connection per pair of
 *     workers; none for itself: self-calls take the loopback path through the same encode and
 *     decode as remote ones);
 *   - one I/O thread (channel.c) that accepts connections on its TCP and UNIX-domain listeners,
 *     reads every channel with epoll, hands calls to the pool, completes replies, and on each tick
 *     (at most RPC_TICK_MS apart) fails expired calls and lets the pool grow when it is stuck;
 *   - the pool (pool.c): threads running the called functions, growing beyond its base size when
 *     every thread is blocked and work waits;
 *   - the pending calls: call id -> future, peer and deadline, under the agent's lock.
 *
 * Waiting (DESIGN.md: spin briefly, then sleep): over a socket an empty round trip passes four
 * threads (the callee's I/O thread, its pool thread, the caller's I/O thread, the caller), and a
 * sleep at each costs a wake-up of several microseconds; through lanes (below) two, the callee's
 * polling pool thread and the caller, and the I/O thread stops spinning while they poll. So the I/O thread polls its epoll set, an idle pool
 * thread (one at a time) polls the queue, and td_rpc_sync's caller polls its future (and the
 * lanes), as does a thread waiting on an rpc_async future over a lane (its driver, agent.c's
 * call_drive), each for the budget of its own samehost_spin before sleeping: the same-host layer's policy
 * (transport/samehost.h: cut short after spins that ended in long sleeps, yielding the core when
 * the workers outnumber the cores), with RPC's budget, TDIST_RPC_SPIN_US (50 us by default, 0: no
 * spinning): long enough to cover the other half of a round trip on one host, which the same-host
 * layer's 20 us is not.
 *
 * Locks: agent->mu guards the peers' state, the pending map and the counters it names; a channel's
 * send_mu serializes writes to its socket; the pool has its own. No lock is held while a future is
 * completed, while a function runs, or across blocking I/O except a channel's own send under its
 * send_mu. Nesting: only teardown takes a send_mu under agent->mu (to close the sockets); nothing
 * takes agent->mu under a send_mu, and pool->mu nests with neither. A lane channel's lane_mu is
 * held while the messages it completes are delivered (futures completed, whose callbacks go to the
 * executor; calls queued), so agent->mu, pool->mu and the RRef context's lock nest under it, and
 * channel_fail takes it before agent->mu; it is never taken under another of these. */
#ifndef TDIST_RPC_AGENT_IMPL_H
#define TDIST_RPC_AGENT_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tdist/future.h>
#include <tdist/rpc.h>
#include <tdist/store.h>

#include "base/map.h"
#include "base/ref.h"
#include "base/vec.h"
#include "net/auth.h"
#include "rpc/message.h"
#include "tensor/segment.h"
#include "transport/samehost.h"

#define RPC_TICK_MS 50                        /* the I/O thread's longest sleep */
#define RPC_MAX_PAYLOAD_DEFAULT (1ull << 30)  /* payloads above this are refused (TDIST_RPC_MAX_PAYLOAD) */
#define RPC_POOL_CAP 512                      /* the pool never grows beyond this many threads */
#define RPC_POOL_STALL_MS 5                   /* queued work with no taker: one more thread after this */
#define RPC_POOL_IDLE_EXIT_MS 2000            /* threads beyond the base size exit after this idle */
#define RPC_DYNAMIC_MAX_ID 1024              /* ids of a dynamic group's members are below this */
#define RPC_DYNAMIC_CONNECT_MS 1000           /* a newcomer's longest wait to reach one member */
#define RPC_HELLO_MS 10000                    /* an accepted connection's time to say hello */
#define RPC_AUTH_GRACE_MS 3000                /* joining: a refused worker's time to connect after all */
#define RPC_STAGE_BYTES 4096                  /* a channel's read-ahead buffer */
#define RPC_SPIN_US_DEFAULT 50                 /* the spin budget (TDIST_RPC_SPIN_US) */
#define RPC_PIECE_MIN_DEFAULT (256u << 10)     /* payload parts this large go as pieces (TDIST_RPC_CMA=0: none) */
#define RPC_LANE_CHANNELS 1024                 /* channels in lane mode per agent, at most */
#define RPC_SHARE_MIN (2 * SAMEHOST_SHARE_CHUNK) /* pieces this large in all: the sender helps copy them */
#define RPC_SHARE_STALL_MS 10000               /* a sender holding a chunk this long is given up */
#define RPC_HAND_MAX 8192                      /* messages this small may be handed to the I/O thread */
#define RPC_OUTBOX_MAX (256u << 10)            /* an outbox this full: senders write themselves */
#define RPC_OUTBOX_KEEP (64u << 10)            /* an emptied outbox larger than this is freed */
#define RPC_LONG_READ (64u << 10)              /* reads this large: the I/O thread stops polling meanwhile */

/* ---- channels (channel.c) -------------------------------------------------------------------- */

/* Single copy between two workers of one host (RPC_FLAG_PIECES, message.h): a small segment the
 * connector creates and passes with its hello, shared by the channel's two ends; side 0 is the
 * connector's, side 1 the listener's. Each side publishes a word of its memory (probe_addr, which
 * reads as probe_value); the other side reads it with process_vm_readv and sets its can_read when
 * that works (same user, no ptrace restriction). A side sends pieces only to a peer that can read
 * it, then waits, still under its send lock, until the peer has read them: the peer counts the
 * side's acked up and rings its bell. So the send returns once the peer holds the bytes, as a
 * blocking write does, and the I/O thread that acknowledges never waits on a lock or a socket.
 * While it waits the sender helps (TDIST_RPC_CMA_SHARE): for a message of RPC_SHARE_MIN bytes of
 * pieces and up the reader offers the copy through side[sender].share (transport/samehost.h,
 * shared copies), and the sender writes chunks of it into the reader's memory while the reader
 * reads the others, so the two cores copy at once. */
typedef struct rpc_cma_side {
    _Alignas(SAMEHOST_LINE) _Atomic uint64_t acked; /* this side's messages with pieces that the peer has read */
    samehost_bell bell;                             /* this side's sender sleeps here for acked */
    _Atomic uint64_t probe_addr, probe_value;       /* written once, before the other side looks */
    _Atomic uint32_t can_read;                      /* this side reads the other's memory */
    _Atomic uint32_t lane_reads;                    /* this side takes messages from its lane */
    samehost_share share;                           /* the copy of this side's message being read */
} rpc_cma_side;

/* Lanes (TDIST_RPC_LANES): when both sides set lane_reads before the hello's answer, every message
 * of the channel travels through lane[s] (written by side s, read by the other; a message's wire
 * bytes split into entries of at most SAMEHOST_LANE_MAX, read by the same stream parser as the
 * socket's bytes), and the socket carries only the hello, bells (a byte each: "look at your lane",
 * sent when the reader said it sleeps and nobody polls) and the end of the connection. A message
 * then costs no system call when a thread of the reader polls: its I/O thread, an idle pool thread
 * or a td_rpc_sync caller waiting for its reply, whichever takes the lane's reader lock first; the
 * writer waits for room on its side's bell. */
typedef struct rpc_cma {
    rpc_cma_side side[2];
    samehost_lane lane[2];
} rpc_cma;

typedef struct rpc_channel {
    int fd;
    int peer;                 /* the peer's id; -1 until its hello arrived (accepted connections) */
    bool is_unix;
    int64_t opened_ns;        /* an accepted connection must send its hello within RPC_HELLO_MS */
    char where[64];           /* accepted: the peer's address, for the log of a refusal */
    /* Written by the I/O thread only. */
    size_t hello_have;        /* accepted, until bound: bytes of the hello read (into stage) */
    uint8_t hdr[RPC_HEADER_BYTES];
    size_t hdr_have;
    rpc_header header;
    td_storage *payload;      /* the message being read, once its header was read */
    uint64_t payload_have;
    /* Bytes read ahead of the message being read: small messages arrive with one recv each, and
     * a recv that leaves the stage part empty means the socket is drained (no recv for EAGAIN). */
    size_t stage_len, stage_off;
    bool drained;
    uint8_t stage[RPC_STAGE_BYTES];
    bool in_epoll;
    /* Single copy (same-host channels whose hello passed the segment; cma NULL otherwise). */
    td_segment cma_seg;
    rpc_cma *cma;
    int cma_side;             /* 0: this end connected, 1: it accepted */
    pid_t peer_pid;
    int peer_pidfd;           /* when this side reads pieces and shares their copy (-1: not) */
    int hello_fd;             /* accepted, until bound: the segment fd that came with the hello */
    rpc_pieces pieces;        /* the message being read, when it has RPC_FLAG_PIECES */
    uint8_t table[RPC_PIECES_WIRE_MAX];
    size_t table_have, table_need;
    /* Sends, from any thread. */
    pthread_mutex_t send_mu;
    uint64_t cma_sent;        /* under send_mu: this side's messages sent with pieces */
    samehost_lane_writer lane_w; /* under send_mu */
    /* Small messages handed to the I/O thread to write (channel.c, "Handing sends over"): bytes
     * [outbox_off, outbox_len) wait, under send_mu. */
    uint8_t *outbox;
    size_t outbox_off, outbox_len, outbox_cap;
    _Atomic bool outbox_listed;     /* on the agent's flush list */
    struct rpc_channel *flush_next; /* in it */
    bool out_watched;               /* I/O thread only: EPOLLOUT asked for, the outbox part written */
    /* Lanes: set before the channel is bound, then read-only. In lane mode the stream parser's
     * state above (hdr ... table) is under lane_mu, not the I/O thread's. */
    bool lanes;
    pthread_mutex_t lane_mu;
    samehost_lane_reader lane_r; /* under lane_mu */
    _Atomic bool dead;        /* failed or closed: no more sends, no more reads */
} rpc_channel;

/* ---- the pool (pool.c) ----------------------------------------------------------------------- */

typedef struct rpc_work {
    void (*fn)(void *arg);
    void (*drop)(void *arg); /* instead of fn, when the pool stops first (may be NULL) */
    void *arg;
    struct rpc_work *next;
} rpc_work;

typedef struct rpc_pool_thread {
    pthread_t thread;
    bool exited;
    struct rpc_pool *pool;
} rpc_pool_thread;

typedef struct rpc_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rpc_work *head, *tail;
    size_t queued;
    int base, cap;
    int nthreads, idle;
    int running;     /* threads running work and not blocked in a tdist wait (base/thread.h) */
    int waking;      /* threads signalled or started to take work that have not yet looked */
    int concurrency; /* running threads beyond which queued work waits for one to finish */
    uint64_t taken, taken_seen; /* dequeues, and their number at the last tick */
    int64_t stalled_since_ns;   /* when a tick first saw work waiting and none taken since (0: none) */
    bool stop;
    struct td_rpc_agent *lanes; /* the spinner polls its lanes (NULL: none) */
    int spinners;             /* idle threads polling for work instead of sleeping (at most one) */
    _Atomic size_t avail;     /* queued, for the spinner to poll without the lock */
    _Atomic bool stopping;    /* stop, likewise */
    samehost_spin spin;
    TD_VEC(rpc_pool_thread *) threads;
    const char *name;
} rpc_pool;

/* p->spin is left to the caller to set up (samehost_spin_init) before the first submit. */
void rpc_pool_init(rpc_pool *p, int base);
/* Queues fn(arg) to run on a pool thread (starting one while fewer than the base size exist and
 * none is free), or drop(arg) if the pool stops first. Fails only when the pool stopped (then
 * neither is run). */
td_status rpc_pool_submit(rpc_pool *p, void (*fn)(void *), void (*drop)(void *), void *arg);
/* From the I/O thread's tick, at least every RPC_POOL_STALL_MS while work is queued: wakes or
 * starts one more thread when work has waited RPC_POOL_STALL_MS with no thread taking any (every
 * thread is busy or blocked, e.g. in a long function or a nested call). */
void rpc_pool_tick(rpc_pool *p);
/* True on one of p's threads. */
bool rpc_pool_is_current(const rpc_pool *p);
/* Stops the pool: running work finishes, queued work is dropped (its drop runs instead); every
 * thread is joined. */
void rpc_pool_stop(rpc_pool *p);
void rpc_pool_destroy(rpc_pool *p);
void rpc_pool_counts(rpc_pool *p, int *nthreads, int *idle, size_t *queued);

/* ---- the agent (agent.c) --------------------------------------------------------------------- */

typedef struct rpc_peer {
    td_worker_info info;
    rpc_channel *chan;  /* NULL for this worker and until connected */
    bool lost;          /* its channel failed or closed: calls to it fail at once */
    bool member;        /* in the group now (static: always; dynamic: joined and not left) */
    char lost_reason[256];
    /* Joining: when a hello claiming this id was refused for its proof of the secret, and why (in
     * this worker's words). Joining fails on it only if the worker still has not connected
     * RPC_AUTH_GRACE_MS later, so that an impostor's hello cannot fail a world's start. */
    int64_t auth_refused_ns;
    char auth_reason[256];
} rpc_peer;

typedef struct rpc_pending {
    uint64_t id;
    int peer;
    td_future *future;  /* the pending's own reference */
    struct rpc_prof_call *prof; /* the call's profiling event, or NULL (profiler.h) */
    int64_t deadline_ns;
    int64_t timeout_ms;
} rpc_pending;

struct td_rpc_agent {
    td_ref ref;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* channels joining; shutdown waiting for calls to end */
    td_worker_info self;
    int world_size;          /* static: the world's size; dynamic: the table's capacity (ids below it) */
    bool dynamic;            /* created with world_size < 0: members join and leave */
    rpc_peer *peers;         /* indexed by id; only `member` slots are in the group */
    td_store *store;         /* this world's namespace (a PrefixStore) */
    _Atomic int64_t default_timeout_ms;
    bool tcp_only;
    size_t piece_min;        /* same-host payload parts this large go as pieces (0: never; TDIST_RPC_CMA) */
    bool share_on;           /* readers of pieces share the copy with their sender (TDIST_RPC_CMA_SHARE) */
    uint64_t max_payload;
    uint64_t nonce;          /* what connecting peers must send in their hello */
    auth_key auth;           /* the job's secret as a key (net/auth.h), read once at creation */
    /* The connector nonces of the hellos whose proof checked (I/O thread only): a recorded hello
     * replayed to this agent (whose nonce stays the same) is refused, also for an id that a
     * dynamic group's member left free again. */
    TD_VEC(struct rpc_seen_nonce { uint8_t bytes[RPC_AUTH_NONCE_BYTES]; }) hello_nonces;
    char host_id[192];       /* base/host.h: equal ids mean the same host */
    int connected;           /* channels bound to a peer */

    int tcp_listen_fd, unix_listen_fd, epoll_fd, wake_fd;
    pthread_t io_thread;
    bool io_started;
    _Atomic bool io_stop;
    TD_VEC(rpc_channel *) channels; /* all of them, bound or not (freed with the agent) */
    bool lanes_on;           /* TDIST_RPC_LANES */
    bool hand_on;            /* small socket sends may be handed to the I/O thread (TDIST_RPC_HAND_SENDS) */
    bool driven;             /* its calls' futures have call_drive (agent.c), set before the first call */
    /* The bound channels in lane mode, append-only (a->mu) and read without a lock up to
     * lane_count; beyond RPC_LANE_CHANNELS a same-host channel keeps to its socket. */
    rpc_channel *lane_chans[RPC_LANE_CHANNELS];
    _Atomic size_t lane_count;
    _Atomic size_t lane_reserved; /* lane slots promised to channels being greeted */
    _Atomic int lane_pollers; /* threads in rpc_lanes_enter..leave (the I/O thread then need not spin) */
    _Atomic int socket_chans; /* channels ever bound not in lane mode (the I/O thread spins for them) */
    /* Handing sends over (channel.c): the channels whose outbox the I/O thread is to write, pushed
     * by senders and taken whole by it; io_polling is true while it will look at them soon. */
    struct rpc_channel *_Atomic flush_list;
    _Atomic bool io_polling;

    td_map pending;          /* call id (8 bytes) -> rpc_pending */
    int64_t next_deadline_ns;
    td_map gather_seqs;      /* _all_gather: sorted name set -> calls made over it */
    _Atomic uint64_t next_call_id;

    /* Counters (agent->mu for client_*, atomics for the rest). */
    int64_t client_active;   /* calls made and not yet completed with their callbacks run */
    int64_t calls_started, calls_done;
    _Atomic int64_t server_active, server_active_async;
    _Atomic uint64_t pieces_received; /* messages whose large parts this worker read single-copy */
    _Atomic uint64_t share_chunks_in;  /* chunks of those that their senders wrote into this worker */
    _Atomic uint64_t share_chunks_out; /* chunks this worker wrote into its peers while it waited */
    _Atomic uint64_t lane_rings;      /* bells this worker rang for a peer sleeping on its lane */
    _Atomic uint64_t caller_takes;    /* polls by callers waiting for a reply that took lane messages */
    _Atomic uint64_t sends_handed;    /* messages handed to the I/O thread to write */
    _Atomic uint64_t io_writes;       /* writes of the I/O thread that sent handed messages */
    _Atomic uint64_t io_write_full;   /* of those, the ones that found the socket full (EPOLLOUT then) */

    rpc_pool pool;
    samehost_spin spin_io;   /* the I/O thread's, polling epoll before it sleeps */
    samehost_spin spin_call; /* td_rpc_sync's callers', polling the reply's future */
    samehost_spin spin_acked; /* senders of pieces', polling for the peer's acknowledgement */
    bool executor_held;
    bool ready;              /* created: every worker known and connected (a->mu) */
    struct incoming *early;  /* calls that came before (a->mu; agent.c's) */
    _Atomic bool closing;    /* shutdown began: new calls fail */
    bool torn_down;
    int generation;          /* this process's agent number (names its UNIX socket) */
    struct rpc_rref_ctx *rrefs; /* RRefs owned, pending and forked (rref.c) */
    struct dist_ag_state *_Atomic dist_autograd; /* distributed autograd's contexts (src/autograd/dist_*.c) */
    bool ignore_rref_leak;
};

/* ---- agent.c entry points the I/O thread calls ------------------------------------------------ */

/* A whole message arrived from peer (its id; the agent's own for loopback). Takes payload (may be
 * NULL for an empty one). */
void rpc_agent_deliver(td_rpc_agent *a, int peer, const rpc_header *h, td_storage *payload);
/* A channel failed or closed: fails every call pending on its peer. reason is the cause. */
void rpc_agent_channel_failed(td_rpc_agent *a, rpc_channel *ch, const char *reason);
/* The tick: fails expired calls. */
void rpc_agent_expire(td_rpc_agent *a);
void rpc_agent_retain(td_rpc_agent *a);
void rpc_agent_release(td_rpc_agent *a);

/* ---- agent.c entry points for the layers over calls (rref.c) ----------------------------------- */

extern const char rpc_not_initialized[]; /* "RPC has not been initialized. Call ...init_rpc first." */

/* The call a function serves (tdist/rpc.h). */
struct td_rpc_call {
    td_rpc_agent *agent;
    td_worker_info caller;
    void *arg;
};

/* The agent to use: agent retained, or the default agent's (fails as "RPC has not been
 * initialized..."); the caller drops it with rpc_agent_release. */
td_status rpc_agent_get(td_rpc_agent *agent, td_rpc_agent **out);
/* The id of the worker `to` names. */
td_status rpc_agent_resolve(td_rpc_agent *a, const td_rpc_dest *to, int *peer);
/* The one way a call travels (td_rpc_async is this after resolving): encodes fn(args, kwargs) with
 * the RRefs it holds forked for peer, registers it pending and sends it. extra, when not NULL,
 * gives the header's flags and RRef ids (td_rpc_remote). *future: a new reference. */
td_status rpc_agent_call(td_rpc_agent *a, int peer, const char *fn, const td_value *args, const td_value *kwargs,
                         int64_t timeout_ms, const rpc_header *extra, td_future **future);
/* In extra->flags only, never on the wire: a message of the RPC layer's own protocol (the RRef
 * layer's fork, accept and delete), which carries no distributed autograd context even when the
 * thread sending it is in one (PyTorch sends these without autograd information too). */
#define RPC_CALL_PROTOCOL (1u << 15)

/* ---- distributed autograd's hooks ------------------------------------------------------------
 * Distributed autograd (src/autograd/dist_autograd.c) sets rpc_autograd in dist_ag_install, which
 * every agent's creation calls (so a static link always takes it in, even into a worker that never
 * calls td_dist_autograd_* itself but serves calls made in a context); the call path calls through
 * the table and names no other autograd symbol. Wire form: docs/autograd.md, "Distributed
 * autograd". */
typedef struct rpc_autograd_hooks {
    /* Caller, before encoding: when this thread is in a context, replaces *payload (taken) by its
     * wrapped form and sets RPC_FLAG_AUTOGRAD and the ids in *h. */
    td_status (*call_out)(td_rpc_agent *a, int peer, td_value **payload, rpc_header *h);
    /* Callee, a call with RPC_FLAG_AUTOGRAD: *inner (borrowed from payload) is the call's own
     * payload; *scope (for serve_exit) makes the context current while the function runs. */
    td_status (*serve_in)(td_rpc_agent *a, int peer, const rpc_header *h, const td_value *payload,
                          const td_value **inner, void **scope);
    void (*serve_exit)(void *scope);
    /* Callee, the reply to a call with RPC_FLAG_AUTOGRAD: *value (taken, may be NULL) becomes its
     * wrapped form; reply gets the flag and ids. */
    td_status (*reply_out)(td_rpc_agent *a, int peer, const rpc_header *call, td_value **value, rpc_header *reply);
    /* Caller, a reply with RPC_FLAG_AUTOGRAD: unwraps *value (taken, replaced). */
    td_status (*reply_in)(td_rpc_agent *a, int peer, const rpc_header *h, td_value **value);
    void (*debug_info)(td_rpc_agent *a, td_value *info);
    void (*agent_free)(td_rpc_agent *a); /* the agent's last reference went */
    /* peer was just marked lost (called once per peer, from the thread that noticed, often the I/O
     * thread: it must not wait on calls). */
    void (*peer_lost)(td_rpc_agent *a, int peer);
} rpc_autograd_hooks;
extern const rpc_autograd_hooks *_Atomic rpc_autograd;
void dist_ag_install(void);

/* ---- channel.c ----------------------------------------------------------------------------- */

/* Opens the listeners and the epoll set; publishes nothing (the caller formats the address). */
td_status rpc_io_open(td_rpc_agent *a, const char *listen_host, char *addr_out, size_t addr_size,
                      char *unix_name_out, size_t unix_size);
td_status rpc_io_start(td_rpc_agent *a);
/* Connects to peer id, sends the hello with the peer's nonce and this worker's proof of the secret,
 * and reads the answer (checking the peer's proof); registers the channel. *auth_refused (may be
 * NULL) tells a failure of authentication (the secrets disagree) from one of reaching the peer. */
td_status rpc_io_connect(td_rpc_agent *a, int peer, const char *addr, const char *host_id, const char *unix_name,
                         uint64_t nonce, int64_t deadline_ns, bool *auth_refused);
/* Stops and joins the I/O thread, then shuts every channel down (fds closed later, by
 * rpc_io_close, once no thread can send). */
void rpc_io_stop(td_rpc_agent *a);
/* Closes the listeners and the channels' sockets (the epoll and wake fds: rpc_io_free, at the
 * agent's last reference). */
void rpc_io_close(td_rpc_agent *a);
void rpc_io_free(td_rpc_agent *a);
void rpc_io_wake(td_rpc_agent *a);
/* True on a's I/O thread (which must not block on a send of its own). */
bool rpc_io_is_current(const td_rpc_agent *a);
/* Sends a message on ch under its send lock; on failure fails the channel. hand: a small message
 * may be handed to the I/O thread to write with others (the call returns before it is written; a
 * failure then fails the channel later). Messages sent on a channel keep their order either way. */
td_status rpc_channel_send(td_rpc_agent *a, rpc_channel *ch, const rpc_outgoing *m, bool hand, int64_t deadline_ns);
/* Delivers a message to this agent itself through its wire form (copies the payload). */
td_status rpc_loopback_send(td_rpc_agent *a, const rpc_outgoing *m);
void rpc_channel_free(rpc_channel *ch);
/* Wakes a sender of ch that waits for the peer to read its pieces (the channel failed). */
void rpc_channel_wake_sender(rpc_channel *ch);
/* Polling the lanes (any thread of the agent): enter counts this thread as a poller on the first n
 * lanes (returns n: the count to leave with), so writers need not ring; poll takes and delivers
 * what they hold (true when it took anything); leave stops counting and takes what came meanwhile. */
size_t rpc_lanes_enter(td_rpc_agent *a);
bool rpc_lanes_poll(td_rpc_agent *a);
void rpc_lanes_leave(td_rpc_agent *a, size_t n);

#endif
