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

/* The same parsers on a string, for flags and URL parameters; `what` names it in errors. */
td_status env_parse_int(const char *what, const char *s, int64_t min, int64_t max, int64_t *out);
td_status env_parse_bool(const char *what, const char *s, bool *out);
td_status env_parse_duration_ms(const char *what, const char *s, int64_t default_unit_ms, int64_t *out);
/* A byte size: plain bytes or K, M, G suffixes (powers of 1024), e.g. "64M". */
td_status env_parse_size(const char *what, const char *s, uint64_t *out);

#endif
