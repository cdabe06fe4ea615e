/* Internal: device storages in mp messages (device_share.c), as message.c uses them. On the wire a
 * device storage is (3, nbytes, device type, index, memory handle, segment size, offset, pid,
 * counter fd, counter inode, event handle or none); an empty one is (0, 0, device type, index). */
#ifndef TDIST_MP_DEVICE_SHARE_H
#define TDIST_MP_DEVICE_SHARE_H

#include <tdist/mp.h>

#define TD_SHM_DEVICE 3 /* the storage entry kind beside share.h's td_shm_kind */

/* The entry for a device storage (a new value); takes one counter reference for the message. */
td_status dshare_export(td_storage *s, td_value **entry);
/* Gives back the counter reference of an export whose message was never sent. */
void dshare_abandon(const td_storage *s);
/* Rebuilds a storage from an entry (kind 3, or kind 0 with a device). */
td_status dshare_import(const td_value *entry, td_storage **out);
td_status dshare_import_empty(const td_value *entry, td_storage **out);

#endif
