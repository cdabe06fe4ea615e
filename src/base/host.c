/* The host identity (base/host.h): the boot id and network namespace that make two processes able
 * to share memory and abstract UNIX sockets, refined by TDIST_HOST_ID. */
#include "base/host.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"

/* Keeps the identity one word: spaces and control characters become '_'. */
static void sanitize(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s <= ' ' || *s == 0x7f)
            *s = '_';
}

void host_identity(char *out, size_t size)
{
    out[0] = '\0';
    char boot[64] = "", ns[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (!f)
        return;
    bool ok = fgets(boot, sizeof boot, f) != NULL;
    fclose(f);
    ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    if (!ok || n <= 0)
        return;
    ns[n] = '\0';
    boot[strcspn(boot, "\n")] = '\0';
    sanitize(boot);
    sanitize(ns);
    char user[96] = "";
    const char *v = env_get_str("TDIST_HOST_ID", NULL);
    if (v) {
        snprintf(user, sizeof user, "%s", v);
        sanitize(user);
    }
    snprintf(out, size, "%s/%s%s%s", boot, ns, user[0] ? "/" : "", user);
}
