/* Internal: device storages in mp messages (device_share.c), as message.c uses them. On the wire a
 * device storage is (3, nbytes, device type, index, memory handle, segment size, offset, pid,
 * counter fd, counter inode, counter slot, event handle or none, event_sync_required); an empty one
 * is (0, 0, device type, index). docs/protocols.md, "mp queue", has the entry. */
#ifndef TDIST_MP_DEVICE_SHARE_H
#define TDIST_MP_DEVICE_SHARE_H

#include <tdist/mp.h>

#define TD_SHM_DEVICE 3 /* the storage entry kind beside share.h's td_shm_kind */
#define DSHARE_ENTRY_LEN 13

/* torch's numbers: int64 slots per reference-counter file, and interprocess events a producer
 * keeps outstanding before it synchronizes its stream instead. */
#define DSHARE_COUNTER_SLOTS 10000
#define DSHARE_EVENT_BUDGET 1000

/* The entry for a device storage (a new value); takes one counter reference for the message. */
td_status dshare_export(td_storage *s, td_value **entry);
/* Gives back the counter reference of an export whose message was never sent. */
void dshare_abandon(const td_storage *s);
/* Rebuilds a storage from an entry (kind 3, or kind 0 with a device). A failure after the entry
 * parsed gives the message's counter reference back. */
td_status dshare_import(const td_value *entry, td_storage **out);
td_status dshare_import_empty(const td_value *entry, td_storage **out);
/* Gives back the counter reference of a well-formed kind-3 entry that will not be imported (a decode
 * that failed before reaching it); a malformed entry is left alone. */
void dshare_abandon_entry(const td_value *entry);

/* For tests: this process's producer-side state. */
typedef struct dshare_stats {
    size_t counter_files;      /* reference-counter files open now */
    size_t counter_files_made; /* made since the process started */
    size_t events;             /* interprocess events outstanding (at most DSHARE_EVENT_BUDGET) */
    size_t limbo;              /* blocks in limbo */
} dshare_stats;
void dshare_stats_get(dshare_stats *out);
/* For tests: the value of the storage's counter slot (messages in flight plus consumer storages),
 * or -1 when this process never sent it. */
int64_t dshare_slot_value(const td_storage *s);

#endif
