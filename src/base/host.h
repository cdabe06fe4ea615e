/* Internal: which ranks share a host.
 *
 * Two processes are on "the same host" when they can share memory and reach each other's abstract
 * UNIX-domain sockets: same boot (the kernel's random boot id) and same network namespace. The tcp
 * transport uses it to pick UNIX-domain sockets; the shm and auto backends to decide who shares
 * memory. TDIST_HOST_ID refines it: processes with different values count as different hosts even
 * on one machine (so that tests can simulate several hosts with real TCP between them), while
 * processes on different machines never count as one host, whatever the variable says. */
#ifndef TDIST_BASE_HOST_H
#define TDIST_BASE_HOST_H

#include <stddef.h>

#define TD_HOST_ID_MAX 192

/* "<boot id>/<netns>[/<TDIST_HOST_ID>]" into out (at least TD_HOST_ID_MAX bytes); no spaces, so
 * it can travel as one word. "" when the machine's identity cannot be read (then no two processes
 * count as one host). */
void host_identity(char *out, size_t size);

#endif
