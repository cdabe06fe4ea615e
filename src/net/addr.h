/* Internal network addresses: "host:port" parsing, name resolution and printing.
 *
 * Hosts are IPv4 or IPv6 literals or names (getaddrinfo). Text forms are "10.0.0.1:29500",
 * "node7:29500" and "[fe80::1]:29500"; net_format_hostport brackets an IPv6 literal so that
 * every message names an address the same way. */
#ifndef TDIST_NET_ADDR_H
#define TDIST_NET_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include <tdist/status.h>

typedef struct td_addr {
    struct sockaddr_storage ss;
    socklen_t len;
} td_addr;

/* Room for "[<ipv6>%<scope>]:65535". */
#define TD_ADDR_STRLEN 96

/* Splits "host:port", "[v6]:port", "host" or "[v6]" into a malloc'd host (brackets removed) and a
 * port (-1 when absent). A bare IPv6 literal with several colons is taken as a host with no port. */
td_status net_split_hostport(const char *s, char **host, int *port);

/* "host:port", with brackets around an IPv6 literal. */
void net_format_hostport(const char *host, int port, char *out, size_t size);

/* Resolves host (NULL or "" means the wildcard when passive, loopback otherwise) for TCP; *addrs is
 * a malloc'd array (free()) in getaddrinfo's order, IPv6 and IPv4 both. A name that does not
 * resolve fails with TD_ERR_NOT_FOUND; a temporary resolver failure with TD_ERR_IO. */
td_status net_resolve(const char *host, int port, bool passive, td_addr **addrs, size_t *n);

/* "1.2.3.4:5" or "[::1]:5". */
void addr_str(const td_addr *a, char *out, size_t size);
int addr_port(const td_addr *a);
bool addr_is_loopback(const td_addr *a);

#endif
