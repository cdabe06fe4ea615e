/* Address parsing, resolution and printing for the net layer (addr.h). Everything that names a
 * peer in a message goes through net_format_hostport or addr_str, so IPv6 literals always
 * appear bracketed and messages stay greppable. */
#include "net/addr.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

static bool parse_port(const char *s, int *port)
{
    if (!*s)
        return false;
    long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        v = v * 10 + (*p - '0');
        if (v > 65535)
            return false;
    }
    *port = (int)v;
    return true;
}

td_status net_split_hostport(const char *s, char **host, int *port)
{
    *host = NULL;
    *port = -1;
    if (!s)
        return error_fmt(TD_ERR_INVALID, "address is NULL");
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close)
            return error_fmt(TD_ERR_INVALID, "address '%s' has '[' without a matching ']'", s);
        if (close[1] == ':') {
            if (!parse_port(close + 2, port))
                return error_fmt(TD_ERR_INVALID, "address '%s' has an invalid port (expected 0 to 65535)", s);
        } else if (close[1] != '\0') {
            return error_fmt(TD_ERR_INVALID, "address '%s' has text after ']' (expected ':port')", s);
        }
        *host = alloc_strndup(s + 1, (size_t)(close - s - 1));
        return TD_OK;
    }
    const char *colon = strrchr(s, ':');
    if (colon && strchr(s, ':') != colon) {
        /* Several colons and no brackets: a bare IPv6 literal. */
        *host = alloc_strdup(s);
        return TD_OK;
    }
    if (colon) {
        if (!parse_port(colon + 1, port))
            return error_fmt(TD_ERR_INVALID, "address '%s' has an invalid port (expected 0 to 65535)", s);
        *host = alloc_strndup(s, (size_t)(colon - s));
        return TD_OK;
    }
    *host = alloc_strdup(s);
    return TD_OK;
}

void net_format_hostport(const char *host, int port, char *out, size_t size)
{
    if (!host)
        host = "";
    if (strchr(host, ':'))
        snprintf(out, size, "[%s]:%d", host, port);
    else
        snprintf(out, size, "%s:%d", host, port);
}

td_status net_resolve(const char *host, int port, bool passive, td_addr **addrs, size_t *n)
{
    *addrs = NULL;
    *n = 0;
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    const char *node = host && *host ? host : NULL;
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(node, service, &hints, &res);
    if (rc != 0) {
        td_status code = (rc == EAI_AGAIN || rc == EAI_SYSTEM || rc == EAI_MEMORY) ? TD_ERR_IO : TD_ERR_NOT_FOUND;
        return error_fmt(code, "cannot resolve host '%s': %s", node ? node : "", gai_strerror(rc));
    }
    size_t count = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next)
        if (ai->ai_addrlen <= sizeof(struct sockaddr_storage))
            count++;
    td_addr *list = TD_NEW_ARRAY(td_addr, count ? count : 1);
    size_t i = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_addrlen > sizeof(struct sockaddr_storage))
            continue;
        memcpy(&list[i].ss, ai->ai_addr, ai->ai_addrlen);
        list[i].len = ai->ai_addrlen;
        i++;
    }
    freeaddrinfo(res);
    if (count == 0) {
        free(list);
        return error_fmt(TD_ERR_NOT_FOUND, "cannot resolve host '%s': no TCP address", node ? node : "");
    }
    *addrs = list;
    *n = count;
    return TD_OK;
}

void addr_str(const td_addr *a, char *out, size_t size)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (a->ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&a->ss;
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
        snprintf(out, size, "%s:%d", ip, ntohs(in->sin_port));
    } else if (a->ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a->ss;
        inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
        snprintf(out, size, "[%s]:%d", ip, ntohs(in6->sin6_port));
    } else if (a->ss.ss_family == AF_UNIX) {
        snprintf(out, size, "local");
    } else {
        snprintf(out, size, "<family %d>", a->ss.ss_family);
    }
}

int addr_port(const td_addr *a)
{
    if (a->ss.ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)&a->ss)->sin_port);
    if (a->ss.ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)&a->ss)->sin6_port);
    return -1;
}

bool addr_is_loopback(const td_addr *a)
{
    if (a->ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&a->ss;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (a->ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a->ss;
        if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
            return true;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
            return in6->sin6_addr.s6_addr[12] == 127;
    }
    return false;
}
