/* Parsing of environment variables, command-line flags and URL parameters.
 *
 * Every configuration value in tdist goes through these helpers, so a bad value anywhere produces
 * the same kind of message: the variable, what was expected, and what was found. */
#include "base/env.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"

const char *env_get_str(const char *name, const char *def)
{
    const char *v = getenv(name);
    return (v && *v) ? v : def;
}

const char *env_get_first(const char *const *names, const char **which)
{
    for (size_t i = 0; names[i]; i++) {
        const char *v = env_get_str(names[i], NULL);
        if (v) {
            if (which)
                *which = names[i];
            return v;
        }
    }
    if (which)
        *which = names[0];
    return NULL;
}

bool env_socket_ifname(char *out, size_t size, const char **which)
{
    static const char *const names[] = ENV_SOCKET_IFNAME_NAMES;
    for (size_t i = 0; names[i]; i++) {
        const char *v = env_get_str(names[i], NULL);
        if (!v || v[0] == '^')
            continue;
        if (v[0] == '=')
            v++;
        size_t n = strcspn(v, ",");
        if (n == 0 || n >= size)
            continue;
        memcpy(out, v, n);
        out[n] = '\0';
        if (which)
            *which = names[i];
        return true;
    }
    if (which)
        *which = names[0];
    return false;
}

td_status env_parse_int(const char *what, const char *s, int64_t min, int64_t max, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0')
        return error_fmt(TD_ERR_INVALID, "%s must be an integer, got '%s'", what, s);
    if (v < min || v > max)
        return error_fmt(TD_ERR_INVALID, "%s must be between %" PRId64 " and %" PRId64 ", got %lld", what,
                        min, max, v);
    *out = v;
    return TD_OK;
}

td_status env_parse_bool(const char *what, const char *s, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on", "y"};
    static const char *const no[] = {"0", "false", "no", "off", "n"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return TD_OK;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return TD_OK;
        }
    }
    return error_fmt(TD_ERR_INVALID, "%s must be a boolean (1/0, true/false, yes/no, on/off), got '%s'", what, s);
}

td_status env_parse_duration_ms(const char *what, const char *s, int64_t default_unit_ms, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || v < 0 || v != v)
        goto bad;
    double unit = (double)default_unit_ms;
    if (*end) {
        if (strcmp(end, "ms") == 0)
            unit = 1;
        else if (strcmp(end, "s") == 0)
            unit = 1000;
        else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0)
            unit = 60000;
        else if (strcmp(end, "h") == 0)
            unit = 3600000;
        else
            goto bad;
    }
    double ms = v * unit;
    if (ms > 9.2e18)
        goto bad;
    *out = (int64_t)ms;
    return TD_OK;
bad:
    return error_fmt(TD_ERR_INVALID, "%s must be a duration such as 500ms, 30s or 5m, got '%s'", what, s);
}

td_status env_parse_size(const char *what, const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    if (*s == '-')
        goto bad;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s)
        goto bad;
    unsigned shift = 0;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': shift = 10; break;
        case 'm': case 'M': shift = 20; break;
        case 'g': case 'G': shift = 30; break;
        default: goto bad;
        }
        end++;
        if (*end == 'i')
            end++;
        if (*end == 'B' || *end == 'b')
            end++;
        if (*end)
            goto bad;
    }
    if (shift && v > (UINT64_MAX >> shift))
        goto bad;
    *out = (uint64_t)v << shift;
    return TD_OK;
bad:
    return error_fmt(TD_ERR_INVALID, "%s must be a size such as 4096, 64K or 16M, got '%s'", what, s);
}

td_status env_get_int(const char *name, int64_t def, int64_t min, int64_t max, int64_t *out)
{
    const char *v = env_get_str(name, NULL);
    if (!v) {
        *out = def;
        return TD_OK;
    }
    return env_parse_int(name, v, min, max, out);
}

td_status env_get_bool(const char *name, bool def, bool *out)
{
    const char *v = env_get_str(name, NULL);
    if (!v) {
        *out = def;
        return TD_OK;
    }
    return env_parse_bool(name, v, out);
}

td_status env_get_duration_ms(const char *name, int64_t def_ms, int64_t default_unit_ms, int64_t *out)
{
    const char *v = env_get_str(name, NULL);
    if (!v) {
        *out = def_ms;
        return TD_OK;
    }
    return env_parse_duration_ms(name, v, default_unit_ms, out);
}

td_status env_get_enum(const char *name, const char *const *names, int def, int *out)
{
    const char *v = env_get_str(name, NULL);
    if (!v) {
        *out = def;
        return TD_OK;
    }
    int n = 0;
    for (; names[n]; n++) {
        if (strcasecmp(v, names[n]) == 0) {
            *out = n;
            return TD_OK;
        }
    }
    char choices[512] = "";
    size_t len = 0;
    for (int i = 0; i < n && len < sizeof choices; i++) {
        const char *sep = i == 0 ? "" : (i == n - 1 ? (n > 2 ? ", or " : " or ") : ", ");
        len += (size_t)snprintf(choices + len, sizeof choices - len, "%s%s", sep, names[i]);
    }
    return error_fmt(TD_ERR_INVALID, "The value of %s must be %s. Got '%s'.", name, choices, v);
}
