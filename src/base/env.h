/* Internal environment-variable parsing with clear errors.
 *
 * Each helper leaves *out at the default when the variable is unset or empty, and returns
 * TD_ERR_INVALID with a message naming the variable and the bad value when it cannot be parsed:
 *   "TDIST_TIMEOUT_MS must be a duration such as 500ms, 30s or 5m, got 'abc'"
 * Variables are read with getenv and never written by the library (setenv is not thread-safe). */
#ifndef TDIST_BASE_ENV_H
#define TDIST_BASE_ENV_H

#include <stdbool.h>
#include <stdint.h>

#include <tdist/status.h>

/* Integer in [min, max]; decimal, or 0x hex. */
td_status env_get_int(const char *name, int64_t def, int64_t min, int64_t max, int64_t *out);
/* 1/0, true/false, yes/no, on/off (any case). */
td_status env_get_bool(const char *name, bool def, bool *out);
/* A duration in milliseconds: a plain number is taken in default_unit_ms units (1 for *_MS
 * variables, 1000 for seconds); suffixes ms, s, m, h override it. */
td_status env_get_duration_ms(const char *name, int64_t def_ms, int64_t default_unit_ms, int64_t *out);
/* One of names[] (NULL-terminated), matched case-insensitively; *out is its index. The error lists
 * the choices as PyTorch does: "The value of TDIST_DEBUG must be OFF, INFO, or DETAIL." */
td_status env_get_enum(const char *name, const char *const *names, int def, int *out);
/* The value, or def when unset or empty. */
const char *env_get_str(const char *name, const char *def);
/* A setting with several names, the first one winning (TDIST_DEBUG before PyTorch's
 * TORCH_DISTRIBUTED_DEBUG): the value of the first of names[] (NULL-terminated) that is set and
 * non-empty, or NULL. *which, if given, is that variable's name, or names[0] when none is set, so
 * an error message can name the variable the user actually set. */
const char *env_get_first(const char *const *names, const char **which);
/* PyTorch's names beside tdist's, TDIST_* first. */
#define ENV_DEBUG_NAMES {"TDIST_DEBUG", "TORCH_DISTRIBUTED_DEBUG", NULL}
#define ENV_SOCKET_IFNAME_NAMES {"TDIST_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", NULL}
/* The network interface the user named for tdist's sockets: TDIST_SOCKET_IFNAME, else
 * GLOO_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME. Of a comma-separated list the first name is taken;
 * NCCL's "=eth0" (exact) is read as "eth0", and an exclusion list ("^docker0,lo") names no
 * interface, so the next variable is looked at. Returns false when none names one; *which (if
 * given) is the variable the name came from, for error messages. */
bool env_socket_ifname(char *out, size_t size, const char **which);

/* The same parsers on a string, for flags and URL parameters; `what` names it in errors. */
td_status env_parse_int(const char *what, const char *s, int64_t min, int64_t max, int64_t *out);
td_status env_parse_bool(const char *what, const char *s, bool *out);
td_status env_parse_duration_ms(const char *what, const char *s, int64_t default_unit_ms, int64_t *out);
/* A byte size: plain bytes or K, M, G suffixes (powers of 1024), e.g. "64M". */
td_status env_parse_size(const char *what, const char *s, uint64_t *out);

#endif
