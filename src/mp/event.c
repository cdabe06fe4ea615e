/* td_mp_event: multiprocessing.Event over one word of shared memory and a futex. The word lives
 * in an unlinked segment, so a forked child shares it by inheritance and a spawned one (or any
 * receiver of a queue message) by its fd. Waiting sleeps in FUTEX_WAIT (not the private variant:
 * the word is shared between processes) with an absolute CLOCK_MONOTONIC deadline. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <tdist/mp.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/ref.h"
#include "mp/message.h"
#include "tensor/segment.h"

#define EVENT_MAGIC 0x56454454u /* "TDEV" */

typedef struct event_word {
    _Atomic uint32_t flag;
    uint32_t magic;
} event_word;

struct td_mp_event {
    td_ref ref;
    td_segment seg;
    event_word *w;
};

static td_status event_on(td_segment seg, td_mp_event **out)
{
    td_mp_event *e = TD_NEW(td_mp_event);
    ref_init(&e->ref);
    e->seg = seg;
    e->w = seg.base;
    *out = e;
    return TD_OK;
}

td_status td_mp_event_new(td_mp_event **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_mp_event_new: out is NULL");
    td_segment seg;
    TD_TRY(segment_create("ev", sizeof(event_word), true, true, &seg));
    ((event_word *)seg.base)->magic = EVENT_MAGIC;
    return event_on(seg, out);
}

static int64_t event_wire(void *obj, int *fds)
{
    fds[0] = ((td_mp_event *)obj)->seg.fd;
    return 0;
}

static td_status event_from_fd(int fd, td_mp_event **out)
{
    td_segment seg;
    td_status st = segment_map_fd(fd, sizeof(event_word), &seg);
    if (st != TD_OK) {
        close(fd);
        return st;
    }
    if (((event_word *)seg.base)->magic != EVENT_MAGIC) {
        segment_unmap(&seg);
        return error_fmt(TD_ERR_INVALID, "invalid mp message: an event's fd is not a tdist event");
    }
    return event_on(seg, out);
}

static td_status event_from_wire(int64_t param, const int *fds, void **obj)
{
    (void)param;
    td_mp_event *e = NULL;
    td_status st = event_from_fd(fds[0], &e);
    *obj = e;
    return st;
}

td_mp_event *td_mp_event_retain(td_mp_event *e)
{
    if (e)
        ref_inc(&e->ref);
    return e;
}

void td_mp_event_release(td_mp_event *e)
{
    if (!e || !ref_dec(&e->ref))
        return;
    segment_unmap(&e->seg);
    free(e);
}

static void *event_retain(void *obj) { return td_mp_event_retain(obj); }
static void event_release(void *obj) { td_mp_event_release(obj); }

const mp_object_class mp_event_class = {
    .kind = TD_MP_OBJ_EVENT,
    .nfds = 1,
    .entry_form = "an event entry is not (2, fd)",
    .retain = event_retain,
    .release = event_release,
    .wire = event_wire,
    .from_wire = event_from_wire,
};

td_value *td_mp_event_value(td_mp_event *e) { return mp_object_value(&mp_event_class, e); }
td_mp_event *td_mp_value_event(const td_value *v) { return mp_object_of(v, TD_MP_OBJ_EVENT); }

void td_mp_event_set(td_mp_event *e)
{
    atomic_store(&e->w->flag, 1);
    syscall(SYS_futex, &e->w->flag, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void td_mp_event_clear(td_mp_event *e) { atomic_store(&e->w->flag, 0); }

bool td_mp_event_is_set(td_mp_event *e) { return atomic_load(&e->w->flag) != 0; }

td_status td_mp_event_wait(td_mp_event *e, int64_t timeout_ms)
{
    int64_t deadline = timeout_ms == TD_MP_NO_WAIT ? clock_now_ns() : deadline_after_ms(timeout_ms);
    while (!atomic_load(&e->w->flag)) {
        if (deadline_passed(deadline))
            return error_fmt(TD_ERR_TIMEOUT, "td_mp_event_wait: the event was not set within %lld ms",
                            (long long)timeout_ms);
        struct timespec ts = deadline_timespec(deadline);
        syscall(SYS_futex, &e->w->flag, FUTEX_WAIT_BITSET, 0, deadline == TD_DEADLINE_NONE ? NULL : &ts, NULL,
                FUTEX_BITSET_MATCH_ANY);
    }
    return TD_OK;
}
